"""A cluster's own certificate authority: its CA, the certificates it issues, revocation.

Made with ``cryptography`` when a cluster starts (an EC P-256 key pair costs about a
millisecond), and kept in one private directory (mode 0700) under the state
directory::

    ca.pem            the CA certificate: every process of the cluster trusts it, nothing else
    ca-key.pem        the CA's private key (0600): signs certificates and the revocation list
    crl.pem           the revocation list, signed by the CA (every listener checks it)
    scheduler.pem     the scheduler's certificate and key (0600)
    worker.pem        the workers' certificate and key (0600)
    users/NAME.pem    a person's credentials file (0600): their certificate, ca.pem, their key
    users.json        who holds credentials: role, serial number, file, expiry, revoked or not

A certificate names its holder in the subject's CN and its role in the OU
(:mod:`.identity`); the control plane takes every request's identity from it.

>>> ca = Authority.create(tmp / "tls", admin="alice")            # doctest: +SKIP
>>> path = ca.add_user("bob")                                    # doctest: +SKIP
>>> serial, crl = ca.remove_user("bob")                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ..errors import SpecError
from .identity import ADMIN, PEOPLE, ROLES, SCHEDULER, USER, WORKER

__all__ = ["Authority", "Credentials", "read_credentials", "private", "certificate_facts"]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$")  # a user name, also a file name
SKEW = datetime.timedelta(minutes=5)  # certificates start this early: clocks of hosts differ
_HEADER = (
    "# clustersdk credentials of {name!r} ({role}), valid until {until} UTC.\n"
    "# Private: whoever holds this file acts as {name!r} on the cluster.\n"
)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def private(path: str, text: str) -> None:
    """Write ``text`` to ``path``, readable by its owner alone (0600) from the first byte."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _public(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@dataclasses.dataclass(frozen=True)
class Credentials:
    """What a credentials file holds: the holder's certificate and key, and the CA's."""

    path: str
    name: str
    role: str
    serial: int
    not_after: datetime.datetime
    ca_pem: str

    @property
    def admin(self) -> bool:
        return self.role == ADMIN


def read_credentials(path: str) -> Credentials:
    """Parse a credentials file (:meth:`Authority.add_user`'s); a SpecError naming what
    is wrong with it."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SpecError(f"cannot read the credentials file {path}: {e.strerror or e}") from None
    try:
        certs = x509.load_pem_x509_certificates(data)
        serialization.load_pem_private_key(_block(data, b"PRIVATE KEY"), password=None)
    except ValueError as e:
        raise SpecError(
            f"{path} is not a clustersdk credentials file (a certificate, the "
            f"cluster's CA certificate and a key, in PEM): {e}"
        ) from None
    holder = next((c for c in certs if not _is_ca(c)), None)
    ca = next((c for c in certs if _is_ca(c)), None)
    if holder is None or ca is None:
        raise SpecError(
            f"{path} must hold its holder's certificate and the cluster's CA "
            "certificate; make it again with cluster.add_user()"
        )
    name, role = _subject(holder)
    return Credentials(path, name, role, holder.serial_number, holder.not_valid_after_utc, _pem(ca))


def _block(data: bytes, kind: bytes) -> bytes:
    """The first PEM block whose label ends with ``kind`` (e.g. ``EC PRIVATE KEY``)."""
    match = re.search(rb"-----BEGIN ([A-Z ]*" + kind + rb")-----.*?-----END \1-----", data, re.S)
    if match is None:
        raise ValueError(f"no {kind.decode()} block")
    return match.group(0)


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _subject(cert: x509.Certificate) -> tuple[str, str]:
    def first(oid: x509.ObjectIdentifier) -> str:
        values = cert.subject.get_attributes_for_oid(oid)
        return str(values[0].value) if values else ""

    return first(NameOID.COMMON_NAME), first(NameOID.ORGANIZATIONAL_UNIT_NAME)


def certificate_facts(path: str) -> list[dict[str, Any]]:
    """Every certificate in a PEM file: subject CN and OU, expiry (for the doctor)."""
    with open(path, "rb") as f:
        certs = x509.load_pem_x509_certificates(f.read())
    return [
        {
            "name": _subject(c)[0],
            "role": _subject(c)[1],
            "ca": _is_ca(c),
            "not_after": c.not_valid_after_utc.timestamp(),
        }
        for c in certs
    ]


def file_facts(paths: Any) -> list[dict[str, Any]]:
    """For the doctor: each existing file of ``paths`` (in-memory PEM text is skipped):
    its mode, whether it holds a private key, and the earliest expiry of its
    certificates (None: none)."""
    out = []
    for path in dict.fromkeys(p for p in paths if p and "\n" not in p):
        try:
            mode = os.stat(path).st_mode & 0o777
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        try:
            expiry = min(
                (c.not_valid_after_utc.timestamp() for c in x509.load_pem_x509_certificates(data)),
                default=None,
            )
        except ValueError:  # a key or a revocation list alone
            expiry = None
        out.append(
            {"path": path, "mode": mode, "key": b"PRIVATE KEY-----" in data, "not_after": expiry}
        )
    return out


def revoked_serials(crl_pem: str | bytes) -> frozenset[int]:
    """The serial numbers a revocation list names."""
    data = crl_pem.encode() if isinstance(crl_pem, str) else crl_pem
    crl = x509.load_pem_x509_crl(data)
    return frozenset(r.serial_number for r in crl)


class Authority:
    """A cluster's certificate authority, kept in ``directory`` (see the module's
    docstring for what lies there). The process that made it (the cluster's creator),
    or any process of the same account that can read the directory, issues and revokes
    credentials with it."""

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        with open(self._file("ca.pem"), "rb") as f:
            self.ca = x509.load_pem_x509_certificate(f.read())
        with open(self._file("ca-key.pem"), "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        self._key = key

    # --- making one ------------------------------------------------------------------
    @classmethod
    def create(
        cls, directory: str, *, admin: str, days: float = 30.0, cluster: str = "clustersdk"
    ) -> Authority:
        """A new CA in ``directory`` (made 0700; it must not exist yet), with certificates
        for the scheduler, the workers and ``admin`` (the creator), and an empty
        revocation list. Everything is valid for ``days``."""
        check_name(admin)
        if days <= 0:
            raise SpecError(
                f"certificates must be valid for a positive number of days, got {days!r}"
            )
        os.makedirs(os.path.dirname(os.path.abspath(directory)), mode=0o700, exist_ok=True)
        os.mkdir(directory, 0o700)
        os.chmod(directory, 0o700)
        os.mkdir(os.path.join(directory, "users"), 0o700)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster} CA"),
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "ca"),
            ]
        )
        start, end = _now() - SKEW, _now() + datetime.timedelta(days=days)
        ca = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        private(os.path.join(directory, "ca-key.pem"), _key_pem(key))
        _public(os.path.join(directory, "ca.pem"), _pem(ca))
        authority = cls(directory)
        authority._write_users({})
        authority._write_crl(set())
        for role in (SCHEDULER, WORKER):
            cert, key_pem = authority._issue(role, role)
            private(authority._file(f"{role}.pem"), _pem(cert) + key_pem)
        authority.add_user(admin, admin=True)
        return authority

    # --- where things are --------------------------------------------------------------
    def _file(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def ca_file(self) -> str:
        return self._file("ca.pem")

    @property
    def crl_file(self) -> str:
        return self._file("crl.pem")

    @property
    def scheduler_file(self) -> str:
        return self._file("scheduler.pem")

    @property
    def worker_file(self) -> str:
        return self._file("worker.pem")

    @property
    def ca_pem(self) -> str:
        return _pem(self.ca)

    def crl_pem(self) -> str:
        with open(self.crl_file) as f:
            return f.read()

    @property
    def expires(self) -> datetime.datetime:
        return self.ca.not_valid_after_utc

    def credentials_file(self, name: str) -> str:
        """Where ``name``'s credentials are (raises SpecError for an unknown name)."""
        entry = self.users().get(name)
        if entry is None or entry["revoked"]:
            raise SpecError(
                f"{name!r} has no credentials on this cluster; known: "
                f"{', '.join(self.active_users()) or 'none'}"
            )
        return entry["file"]

    # --- people ---------------------------------------------------------------------------
    def users(self) -> dict[str, dict[str, Any]]:
        """Name -> ``{"role", "serial" (hex), "file", "expires", "revoked"}``, every
        person ever issued credentials."""
        with open(self._file("users.json")) as f:
            return json.load(f)

    def active_users(self) -> list[str]:
        return sorted(n for n, e in self.users().items() if not e["revoked"])

    def add_user(self, name: str, *, admin: bool = False, path: str | None = None) -> str:
        """Issue credentials for ``name`` (an admin's with ``admin``); the file's path
        (``users/NAME.pem`` here unless ``path`` is given), written 0600. A name that
        already holds live credentials is refused: one certificate per person."""
        check_name(name)
        with self._locked():
            users = self.users()
            known = users.get(name)
            if known is not None and not known["revoked"]:
                raise SpecError(
                    f"{name!r} already has credentials ({known['file']}); "
                    f"remove_user({name!r}) first to issue new ones"
                )
            role = ADMIN if admin else USER
            cert, key_pem = self._issue(name, role)
            target = (
                os.path.abspath(os.path.expanduser(path))
                if path
                else self._file(os.path.join("users", f"{name}.pem"))
            )
            header = _HEADER.format(
                name=name, role=role, until=cert.not_valid_after_utc.strftime("%Y-%m-%d %H:%M")
            )
            private(target, header + _pem(cert) + self.ca_pem + key_pem)
            users[name] = {
                "role": role,
                "serial": format(cert.serial_number, "X"),
                "file": target,
                "expires": cert.not_valid_after_utc.timestamp(),
                "revoked": False,
            }
            self._write_users(users)
        return target

    def remove_user(self, name: str) -> tuple[int, str]:
        """Revoke ``name``'s certificate: its serial number and the new revocation list
        (which the caller hands to the control plane). Their file is deleted if it lies
        here."""
        with self._locked():
            users = self.users()
            entry = users.get(name)
            if entry is None or entry["revoked"]:
                raise SpecError(
                    f"{name!r} has no credentials on this cluster; known: "
                    f"{', '.join(self.active_users()) or 'none'}"
                )
            serial = int(entry["serial"], 16)
            entry["revoked"] = True
            self._write_users(users)
            revoked = {int(e["serial"], 16) for e in users.values() if e["revoked"]}
            crl = self._write_crl(revoked)
            if entry["file"].startswith(self._file("users") + os.sep):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(entry["file"])
        return serial, crl

    def worker_directory(self) -> str:
        """``workers/``: a private directory (0700) with what a worker needs alone (the CA
        certificate, the revocation list, the workers' certificate and key), for workers
        that read files of their own (Slurm's job scripts name it)."""
        directory = self._file("workers")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        for name in ("ca.pem", "crl.pem", "worker.pem"):
            with open(self._file(name)) as f:
                private(os.path.join(directory, name), f.read())
        return directory

    def remove(self) -> None:
        """Delete the directory: the cluster is gone, so are its keys."""
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- internals ---------------------------------------------------------------------
    def _issue(self, name: str, role: str) -> tuple[x509.Certificate, str]:
        if role not in ROLES:
            raise SpecError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, name),
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            ]
        )
        usage = [x509.ExtendedKeyUsageOID.CLIENT_AUTH]
        if role not in PEOPLE:  # the cluster's processes also listen
            usage.append(x509.ExtendedKeyUsageOID.SERVER_AUTH)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - SKEW)
            .not_valid_after(self.expires)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        return cert, _key_pem(key)

    def _write_crl(self, revoked: set[int]) -> str:
        # OpenSSL keeps every list it was given and uses the newest (by its last update,
        # in whole seconds): each new one must be at least a second younger.
        last = _now().replace(microsecond=0)
        if os.path.exists(self.crl_file):
            with open(self.crl_file, "rb") as f:
                previous = x509.load_pem_x509_crl(f.read()).last_update_utc
            last = max(last, previous + datetime.timedelta(seconds=1))
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.ca.subject)
            .last_update(last)
            .next_update(self.expires + SKEW)
        )
        for serial in sorted(revoked):
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(last).build()
            )
        pem = (
            builder.sign(self._key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
            .decode()
        )
        _public(self.crl_file, pem)
        if os.path.isdir(self._file("workers")):  # the workers' private copy too
            private(os.path.join(self._file("workers"), "crl.pem"), pem)
        return pem

    def _write_users(self, users: dict[str, dict[str, Any]]) -> None:
        private(self._file("users.json"), json.dumps(users, indent=1, sort_keys=True))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # the creator's kernel and `clustersdk cluster add-user` may both issue
        with open(self._file(".lock"), "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise SpecError(
            f"a user name must be 1-64 letters, digits or ._@+- (starting with a "
            f"letter or digit), got {name!r}"
        )
    return name
