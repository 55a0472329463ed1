"""Dask's ``distributed.Security`` for a cluster, its users, and revocation lists.

- :class:`ClusterSecurity` is a ``Security`` whose listeners also check the cluster's
  revocation list (``VERIFY_CRL_CHECK_LEAF``): a revoked certificate fails the TLS
  handshake, before Dask reads a byte.
- :func:`cluster_security` turns a constructor's ``security=`` into what the
  scheduler, the workers and the creator's client use.
- :func:`credentials_security` is a user's ``Security`` from a credentials file.
- :func:`apply_crl` loads a new revocation list into a running Dask server's
  listeners (the control plane pushes it to every worker and nanny).
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import secrets
import shutil
import ssl
import tempfile
import time
import warnings
from typing import Any

from distributed import Security

from .. import config
from ..errors import SpecError
from .pki import Authority, private, read_credentials

__all__ = [
    "ClusterSecurity",
    "InsecureClusterWarning",
    "Prepared",
    "apply_crl",
    "cluster_only",
    "cluster_security",
    "credentials_security",
    "creator_name",
    "own_subject",
    "tls_root",
]

logger = logging.getLogger(__name__)


class InsecureClusterWarning(UserWarning):
    """A cluster started with ``security=False``: plain ``tcp://``, no identities."""


class ClusterSecurity(Security):
    """A ``distributed.Security`` whose listeners refuse certificates that
    ``tls_crl_file`` (the cluster's revocation list) names."""

    # no __slots__ of its own: Security checks its keywords against ``self.__slots__``
    def __init__(self, *, tls_crl_file: str | None = None, **kwargs: Any):
        super().__init__(require_encryption=True, **kwargs)
        self.tls_crl_file = tls_crl_file

    def get_listen_args(self, role: str) -> dict[str, Any]:
        args = super().get_listen_args(role)
        if self.tls_crl_file:
            add_crl(args["ssl_context"], self.tls_crl_file)
        return args

    @classmethod
    def in_directory(
        cls, directory: str, *roles: str, client: str | None = None
    ) -> ClusterSecurity:
        """The security of a cluster process whose files lie in ``directory`` (an
        :class:`~.pki.Authority`'s, or the copy a remote host got): ``ca.pem``,
        ``crl.pem`` and ``ROLE.pem`` for each of ``roles`` (``scheduler``, ``worker``);
        ``client`` is the credentials file its own client connections present."""
        files: dict[str, Any] = {
            "tls_ca_file": os.path.join(directory, "ca.pem"),
            "tls_crl_file": os.path.join(directory, "crl.pem"),
        }
        for role in roles:
            path = os.path.join(directory, f"{role}.pem")
            files[f"tls_{role}_cert"] = files[f"tls_{role}_key"] = path
        if client:
            files["tls_client_cert"] = files["tls_client_key"] = client
        return cls(**files)


def add_crl(context: ssl.SSLContext, path: str) -> None:
    """Make ``context`` check leaf certificates against the revocation list in ``path``
    (OpenSSL keeps every list it was given and uses the newest)."""
    context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    context.load_verify_locations(cafile=path)


def apply_crl(server: Any, crl_pem: str) -> int:
    """Load ``crl_pem`` into every TLS listener of the Dask ``server`` (a scheduler,
    worker or nanny), and into its revocation file if it has one (a process that
    starts again there reads it); how many listeners took it."""
    security = getattr(server, "security", None)
    path = getattr(security, "tls_crl_file", None)
    if path and os.path.isdir(os.path.dirname(path)) and _read(path) != crl_pem:
        private(path, crl_pem)  # as the host's other TLS files: its owner's alone
    loaded = 0
    fd, tmp = tempfile.mkstemp(suffix=".crl.pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(crl_pem)
        for listener in getattr(server, "listeners", ()):
            context = getattr(listener, "server_args", {}).get("ssl_options")
            if isinstance(context, ssl.SSLContext):
                add_crl(context, tmp)
                loaded += 1
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)
    return loaded


def own_subject(security: Any, role: str) -> tuple[str, str] | None:
    """(CN, OU) of the certificate ``security`` presents as ``role`` (None: none): with a
    PKI that is not clustersdk's, a peer with the same certificate is the cluster."""
    path = getattr(security, f"tls_{role}_cert", None) if security is not None else None
    if not path:
        return None
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    if "\n" in path:
        data = path.encode()
    else:
        with open(path, "rb") as f:
            data = f.read()
    cert = x509.load_pem_x509_certificate(_first_certificate(data))
    values = [
        cert.subject.get_attributes_for_oid(oid)
        for oid in (NameOID.COMMON_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME)
    ]
    cn, ou = (str(v[0].value) if v else "" for v in values)
    return cn, ou


def _first_certificate(data: bytes) -> bytes:
    start = data.index(b"-----BEGIN CERTIFICATE-----")
    end = data.index(b"-----END CERTIFICATE-----", start) + len(b"-----END CERTIFICATE-----")
    return data[start:end]


def cluster_only(server: Any, role: str, handler: Any) -> Any:
    """``handler`` of a worker or nanny (``role``), callable only by the cluster's own
    processes when ``server`` listens on TLS: a person's certificate gets an
    :class:`~clustersdk.errors.AccessDeniedError` (the control plane alone sends these)."""
    from ..errors import AccessDeniedError
    from .identity import Identity

    own = own_subject(getattr(server, "security", None), role)

    def guarded(comm: Any, **kwargs: Any) -> Any:
        if str(getattr(server, "address", "")).startswith("tls://"):
            info = getattr(comm, "extra_info", None) or {}
            who = Identity.from_peercert(info.get("peercert"), own)
            if not who.cluster:
                raise AccessDeniedError(
                    f"{who.describe()} may not call {handler.__name__!r} on a {role}: only the "
                    "control plane does",
                    None,
                    None,
                    who.name,
                    handler.__name__,
                )
        return handler(**kwargs)

    guarded.__name__ = getattr(handler, "__name__", "handler")
    return guarded


def security_files(security: Any) -> list[str]:
    """The files a ``Security`` reads (certificates, keys, the revocation list)."""
    if security is None:
        return []
    names = (
        "tls_ca_file",
        "tls_crl_file",
        *(f"tls_{r}_{k}" for r in ("client", "scheduler", "worker") for k in ("cert", "key")),
    )
    return [v for v in (getattr(security, n, None) for n in names) if isinstance(v, str) and v]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def credentials_security(path: str) -> Security:
    """A user's ``Security`` from a credentials file: their certificate and key, and
    the cluster's CA (the only one trusted). A file others can read is used, with a
    warning (``doctor`` reports it too)."""
    creds = read_credentials(path)
    if os.stat(creds.path).st_mode & 0o077:
        logger.warning(
            "clustersdk: %s can be read by other users of this machine; whoever "
            "reads it acts as %r: chmod 600 %s",
            creds.path,
            creds.name,
            creds.path,
        )
    return Security(
        require_encryption=True,
        tls_ca_file=creds.ca_pem,
        tls_client_cert=creds.path,
        tls_client_key=creds.path,
    )


def creator_name() -> str:
    """The name a new cluster's admin certificate carries: ``clustersdk.security.user``,
    else the login name."""
    name = config.get("security.user")
    if name:
        return str(name)
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container uid with no passwd entry and no $USER
        return f"uid{os.getuid()}"


def tls_root(state_dir: str) -> str:
    """Where clusters keep their authorities: ``<state_dir>/tls`` (0700)."""
    return os.path.join(state_dir, "tls")


class Prepared:
    """What a constructor's ``security=`` became: the ``Security`` of the scheduler, of
    the workers and of the creator's client (all None for ``security=False``), and the
    cluster's :class:`~.pki.Authority` when clustersdk made one (``"auto"``)."""

    def __init__(
        self,
        *,
        scheduler: Security | None = None,
        worker: Security | None = None,
        client: Security | None = None,
        authority: Authority | None = None,
        credentials: str | None = None,
    ):
        self.scheduler, self.worker, self.client = scheduler, worker, client
        self.authority, self.credentials = authority, credentials

    @property
    def enabled(self) -> bool:
        return self.client is not None

    @property
    def protocol(self) -> str:
        return "tls" if self.enabled else "tcp"

    def close(self) -> None:
        """The cluster is gone: delete its authority's keys."""
        if self.authority is not None:
            self.authority.remove()


_warned = False


def cluster_security(security: Any, *, state_dir: str, kind: str) -> Prepared:
    """``security=`` of ``Cluster.local/ssh/slurm``: ``"auto"`` (a new authority under
    ``<state_dir>/tls``, the creator its admin), a ``distributed.Security`` of your own
    PKI (every role's files in it), or ``False`` (plain tcp, warned about once)."""
    if security is False:
        _warn_insecure(kind)
        return Prepared()
    if isinstance(security, Security):
        return Prepared(scheduler=security, worker=security, client=security)
    if security != "auto":
        raise SpecError(
            f"security must be 'auto', a distributed.Security or False, got {security!r}"
        )
    root = tls_root(state_dir)
    os.makedirs(root, mode=0o700, exist_ok=True)
    os.chmod(root, 0o700)
    _remove_stale(root)
    directory = os.path.join(root, f"{os.getpid()}-{secrets.token_hex(4)}")
    authority = Authority.create(
        directory, admin=creator_name(), days=float(config.get("security.days"))
    )
    admin = authority.credentials_file(creator_name())
    return Prepared(
        scheduler=ClusterSecurity.in_directory(directory, "scheduler"),
        worker=ClusterSecurity.in_directory(directory, "worker"),
        client=ClusterSecurity.in_directory(directory, client=admin),
        authority=authority,
        credentials=admin,
    )


def _warn_insecure(kind: str) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"\n\n    !!! Cluster.{kind}(security=False): this cluster listens on plain tcp://, "
        "unencrypted and unauthenticated.\n    !!! Anyone who can reach its ports can run "
        "code on every worker and stop or change any job.\n    !!! Use it only on a machine "
        "and network you alone use; `doctor` reports it.\n",
        InsecureClusterWarning,
        stacklevel=4,
    )


def _remove_stale(root: str) -> None:
    """Authorities of clusters whose creating process died without closing them, a day
    on (a process of another host may share this state directory)."""
    for name in os.listdir(root):
        pid, _, _ = name.partition("-")
        path = os.path.join(root, name)
        try:
            old = time.time() - os.stat(path).st_mtime > 86400
        except OSError:
            continue
        if old and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True
