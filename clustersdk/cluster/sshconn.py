"""SSH connections for :mod:`.ssh`, over paramiko: one per host, host keys checked.

- Host keys are checked against ``known_hosts``: an unknown key is refused
  (unless ``accept_new_hosts``, which adds it and says so, like OpenSSH's
  ``StrictHostKeyChecking=accept-new``) and a changed key always is, with a
  :class:`~clustersdk.errors.HostKeyError` that says how to check and fix it.
  There is no ``AutoAddPolicy``.
- Handshakes run at most ``max_concurrent`` at a time: sshd drops connections
  beyond ``MaxStartups`` (10 by default) that are not yet authenticated.
- Every failure is a :class:`~clustersdk.errors.StartError` naming the host and
  saying what to check.
"""

from __future__ import annotations

import base64
import dataclasses
import getpass
import hashlib
import logging
import os
import random
import shlex
import socket
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import paramiko

from ..errors import HostKeyError, StartError

if TYPE_CHECKING:
    from .sshproc import RemoteProcess

logger = logging.getLogger(__name__)
# Every failure becomes a StartError with advice; paramiko's transport thread would
# also print its traceback (to a notebook's stderr) unless told otherwise.
if logging.getLogger("paramiko.transport").level == logging.NOTSET:
    logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)
DROPPED_RETRIES = 4  # sshd over MaxStartups closes new connections before its banner

_known_hosts_lock = threading.Lock()  # accept_new_hosts appends from several threads


@dataclasses.dataclass(frozen=True)
class Target:
    """Where to log in: ``[user@]host[:port]``."""

    host: str
    port: int = 22
    user: str | None = None

    @classmethod
    def parse(cls, spec: str, *, user: str | None = None, port: int = 22) -> Target:
        """``"alice@node1:2222"``, ``"node1"`` or ``"[fe80::1]:22"``; the arguments are defaults."""
        if "@" in spec:
            user, spec = spec.rsplit("@", 1)
        if spec.startswith("["):
            host, _, rest = spec[1:].partition("]")
            if rest.startswith(":"):
                port = int(rest[1:])
        elif spec.count(":") == 1:
            host, raw = spec.split(":")
            port = int(raw)
        else:
            host = spec
        return cls(host=host, port=port, user=user)

    @property
    def label(self) -> str:
        """How messages name the host: as the user wrote it."""
        return self.host if self.port == 22 else f"{self.host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The host's name in a known_hosts file (``[host]:port`` off port 22)."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


@dataclasses.dataclass(frozen=True)
class Options:
    """How to connect; the defaults of ``Cluster.ssh``."""

    known_hosts: str = "~/.ssh/known_hosts"
    key_file: str | None = None  # else the agent and ~/.ssh/id_* keys
    connect_timeout: float = 10.0
    banner_timeout: float | None = None  # default: connect_timeout
    auth_timeout: float | None = None  # default: connect_timeout
    accept_new_hosts: bool = False
    allow_agent: bool = True
    keepalive: int = 15  # seconds: a dead host is noticed

    @property
    def known_hosts_path(self) -> str:
        return os.path.abspath(os.path.expanduser(self.known_hosts))


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...``, as ``ssh-keygen -lf`` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _UnknownHostKey(paramiko.MissingHostKeyPolicy):
    """Refuse a key known_hosts lacks (or add it, with accept_new_hosts, loudly)."""

    def __init__(self, target: Target, options: Options):
        self.target, self.options = target, options

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        path, t = self.options.known_hosts_path, self.target
        if self.options.accept_new_hosts:
            with _known_hosts_lock:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "a") as f:
                    f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            logger.warning(
                "clustersdk: accepted the new host key of %s (%s %s) into %s",
                t.label,
                key.get_name(),
                fingerprint(key),
                path,
            )
            return
        where = path if os.path.exists(path) else f"{path} (which does not exist)"
        raise HostKeyError(
            f"host {t.label}: its {key.get_name()} host key {fingerprint(key)} is not in "
            f"{where}, so it is refused. If you trust it (compare with `ssh-keygen -lf "
            f"/etc/ssh/ssh_host_{key.get_name().split('-')[-1]}_key.pub` run on the host), add "
            f"it with `ssh-keyscan -p {t.port} {t.host} >> {path}`, or pass "
            "accept_new_hosts=True to add unknown keys on first use",
            host=t.label,
        )


class Connection:
    """One authenticated SSH connection to one host."""

    def __init__(self, target: Target, options: Options, via: Connection | None = None):
        self.target, self.options, self.via = target, options, via
        self.client = paramiko.SSHClient()
        if os.path.exists(options.known_hosts_path):
            self.client.load_host_keys(options.known_hosts_path)
        self.client.set_missing_host_key_policy(_UnknownHostKey(target, options))
        try:
            self._connect()
        except BaseException:
            self.client.close()
            raise
        transport = self.client.get_transport()
        if transport is not None and options.keepalive:
            transport.set_keepalive(options.keepalive)

    def _connect(self) -> None:
        t, o = self.target, self.options
        sock = None
        if self.via is not None:
            try:
                sock = self.via.client.get_transport().open_channel(
                    "direct-tcpip", (t.host, t.port), ("127.0.0.1", 0), timeout=o.connect_timeout
                )
            except (paramiko.SSHException, OSError, EOFError) as e:
                raise StartError(
                    f"host {t.label}: the jump host {self.via.target.label} could not "
                    f"reach it ({type(e).__name__}: {e})",
                    host=t.label,
                ) from e
        user = t.user or getpass.getuser()
        try:
            self._login(user, sock)
        except HostKeyError:
            raise
        except Exception as e:  # noqa: BLE001 - every failure becomes advice naming the host
            raise _failure(t, o, user, e) from e

    def _login(self, user: str, sock: Any) -> None:
        t, o = self.target, self.options
        for attempt in range(DROPPED_RETRIES + 1):
            try:
                self.client.connect(
                    t.host,
                    port=t.port,
                    username=user,
                    key_filename=o.key_file,
                    timeout=o.connect_timeout,
                    banner_timeout=o.banner_timeout or o.connect_timeout,
                    auth_timeout=o.auth_timeout or o.connect_timeout,
                    allow_agent=o.allow_agent,
                    look_for_keys=o.key_file is None,
                    sock=sock,
                )
                return
            except paramiko.SSHException as e:
                # Closed before the banner (not timed out): sshd's MaxStartups is full for a
                # moment, even below it (it counts a connection until its child reports the
                # login). Try again shortly, unless tunnelled.
                dropped = "banner" in str(e) and _closed_early(e)
                if not dropped or sock is not None or attempt == DROPPED_RETRIES:
                    raise
                logger.debug(
                    "clustersdk: %s closed the connection before its banner; again (%d)",
                    t.label,
                    attempt + 1,
                )
                time.sleep(0.2 * (attempt + 1) + random.random() * 0.2)

    @property
    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def run(self, command: str, timeout: float) -> tuple[int, str, str]:
        """Run ``command``; its exit status, stdout and stderr (status -1: no status came)."""
        from .sshproc import RemoteProcess

        process = RemoteProcess(self, command)
        status = process.wait(timeout)
        return status, process.stdout_text(), process.stderr_text()

    def start(self, command: str) -> RemoteProcess:
        """Start ``command``; its output is read as it comes."""
        from .sshproc import RemoteProcess

        return RemoteProcess(self, command)

    def close(self) -> None:
        self.client.close()


def _failure(t: Target, o: Options, user: str, e: BaseException) -> StartError:
    """What a failed login means, for the user, naming the host."""
    if isinstance(e, paramiko.BadHostKeyException):
        return _changed_key(t, o, e)
    if isinstance(e, paramiko.AuthenticationException):
        keys = f"the key {o.key_file}" if o.key_file else "the agent's and ~/.ssh's keys"
        why = (
            f"authentication failed for user {user!r} with {keys} ({e}); check user= and "
            "key_file=, and that the public key is in that user's ~/.ssh/authorized_keys there"
        )
    elif isinstance(e, (socket.timeout, TimeoutError)):
        why = (
            f"no answer on port {t.port} within {o.connect_timeout:g} s (host down or "
            "unreachable, or a firewall drops SSH)"
        )
    elif isinstance(e, ConnectionRefusedError):
        why = f"connection refused on port {t.port}: is sshd running there, and on that port?"
    elif isinstance(e, paramiko.SSHException) and "banner" in str(e).lower():
        if _closed_early(e):
            why = (
                f"port {t.port} closed the connection before the SSH banner, "
                f"{DROPPED_RETRIES + 1} times: sshd's MaxStartups is full (lower "
                "max_concurrent=), or its address is refused there"
            )
        else:
            why = (
                f"port {t.port} accepted the connection but sent no SSH banner within "
                f"{o.banner_timeout or o.connect_timeout:g} s: is that an SSH server, and is "
                "it overloaded?"
            )
    elif isinstance(e, OSError):  # no route, unknown name, network unreachable
        why = f"cannot connect to port {t.port}: {e.strerror or e}"
    else:
        why = f"SSH failed: {type(e).__name__}: {e}"
    return StartError(f"host {t.label}: {why}", host=t.label)


def _closed_early(e: BaseException) -> bool:
    """The server closed or reset the connection (rather than staying silent)."""
    return isinstance(e.__context__, (EOFError, ConnectionError))


def _changed_key(t: Target, o: Options, e: paramiko.BadHostKeyException) -> HostKeyError:
    return HostKeyError(
        f"host {t.label}: its host key has CHANGED: it offered {e.key.get_name()} "
        f"{fingerprint(e.key)}, but {o.known_hosts_path} has {fingerprint(e.expected_key)}. "
        "Someone may be intercepting the connection; if the host was reinstalled and you "
        f"trust the new key, remove the old one with `ssh-keygen -R '{t.known_hosts_name}' -f "
        f"{o.known_hosts_path}` and add the new one",
        host=t.label,
    )


def connect_all(
    targets: Iterable[Target],
    options: Options,
    *,
    jump: Target | None = None,
    max_concurrent: int = 8,
) -> tuple[dict[Target, Connection], Connection | None]:
    """One connection per target, at most ``max_concurrent`` handshakes at once (through
    ``jump`` if given); the connections and the jump host's. If any fails, the others
    are closed and one StartError lists every host that failed."""
    targets = list(targets)
    via = Connection(jump, options) if jump is not None else None
    done: dict[Target, Connection] = {}
    errors: dict[Target, BaseException] = {}
    with ThreadPoolExecutor(
        max_workers=max(1, max_concurrent), thread_name_prefix="clustersdk-ssh-connect"
    ) as pool:
        futures = {t: pool.submit(Connection, t, options, via) for t in targets}
        for t, future in futures.items():
            try:
                done[t] = future.result()
            except BaseException as e:  # noqa: BLE001 - each host's failure is reported
                errors[t] = e
    if errors:
        for connection in done.values():
            connection.close()
        if via is not None:
            via.close()
        raise combine(errors)
    return done, via


def combine(errors: dict[Any, BaseException]) -> StartError:
    """One StartError for one or several hosts' failures (the first host's type wins)."""
    first = next(iter(errors.values()))
    if len(errors) == 1 and isinstance(first, StartError):
        return first
    lines = [
        str(e) if isinstance(e, StartError) else f"{t}: {type(e).__name__}: {e}"
        for t, e in errors.items()
    ]
    cls = type(first) if isinstance(first, StartError) else StartError
    host = getattr(first, "host", None)
    return cls(f"{len(errors)} hosts failed:\n  " + "\n  ".join(lines), host=host)


def quote_env(env: dict[str, str]) -> str:
    """``env A=1 B=2 `` for the front of a remote command ('' when empty)."""
    if not env:
        return ""
    return "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " "
