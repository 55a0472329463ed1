"""How ``clustersdk cluster up|down|status`` reaches each host of a standing cluster.

One interface, two backends: :class:`Here` calls :mod:`.host`'s functions in this
process (a ``--local`` cluster); :class:`OverSSH` runs ``python -m
clustersdk.standing.host ...`` on the host over SSH and writes files over SFTP (an
``--ssh`` cluster; paramiko, ``pip install 'clustersdk[ssh]'``). Either way a host's
directory holds only what its processes need: the CA's private key never leaves the
machine that ran ``up``.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any, Protocol

from ..errors import StartError
from . import host as here
from .record import write_json

REMOTE_TIMEOUT = 120.0  # seconds a command on a host may take (stop waits up to 40 s)


class Host(Protocol):
    """What ``up``/``down``/``status`` do on one host."""

    label: str  # the host as ``up`` was given it (an SSH host's label; "localhost")
    address: str  # where its processes listen (and rank 0's store, if it runs rank 0)
    root: str  # its directory of the cluster (may start with ~)

    def prepare(self, slots: int | None, listen: bool) -> dict[str, Any]: ...
    def put(self, name: str, data: bytes) -> None: ...
    def start(self) -> dict[str, Any]: ...
    def stop(self, remove: bool) -> dict[str, Any]: ...
    def state(self) -> dict[str, Any]: ...
    def read(self, name: str) -> str: ...
    def close(self) -> None: ...


class Here:
    """This machine."""

    def __init__(self, root: str, address: str, label: str = "localhost"):
        self.root, self.address, self.label = root, address, label

    def prepare(self, slots: int | None, listen: bool) -> dict[str, Any]:
        found = here.prepare(self.root, slots, self.address if listen else None)
        self.root = found["root"]
        return found

    def put(self, name: str, data: bytes) -> None:
        path = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if name.endswith(".json"):
            write_json(path, json.loads(data))
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def start(self) -> dict[str, Any]:
        return here.start(self.root)

    def stop(self, remove: bool) -> dict[str, Any]:
        return here.stop(self.root, remove)

    def state(self) -> dict[str, Any]:
        return here.state(self.root)

    def read(self, name: str) -> str:
        with open(os.path.join(self.root, name), errors="replace") as f:
            return f.read()

    def close(self) -> None:
        pass


class OverSSH:
    """A host reached over SSH (its connection made by :func:`connect`)."""

    def __init__(self, connection: Any, root: str, python: str):
        self.connection, self.root, self.python = connection, root, python
        self.label = connection.target.label
        self.address = connection.target.host

    def _call(self, *args: str) -> dict[str, Any]:
        command = " ".join(
            [shlex.quote(self.python), "-m", "clustersdk.standing.host", *map(shlex.quote, args)]
        )
        status, out, err = self.connection.run(command, REMOTE_TIMEOUT)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if status != 0 or not lines:
            why = err.strip().splitlines()[-1] if err.strip() else f"exit status {status}"
            if "No module named clustersdk" in err:
                why = f"{self.python} has no clustersdk: install it there, or give --python"
            raise StartError(f"host {self.label}: `{args[0]}` failed: {why}", host=self.label)
        return json.loads(lines[-1])

    def prepare(self, slots: int | None, listen: bool) -> dict[str, Any]:
        args = ["prepare", self.root] + (["--slots", str(slots)] if slots else [])
        if listen:
            args += ["--listen", self.address]
        found = self._call(*args)
        self.root = found["root"]
        return found

    def put(self, name: str, data: bytes) -> None:
        sftp = self.connection.client.open_sftp()
        try:
            path = f"{self.root}/{name}"
            with sftp.open(path, "wb") as remote:
                remote.chmod(0o600)  # from its first byte: keys are in some of these
                remote.write(data)
        except (OSError, EOFError) as e:
            raise StartError(
                f"host {self.label}: could not write {name} over SFTP ({e}): does its sshd "
                "offer the sftp subsystem?",
                host=self.label,
            ) from e
        finally:
            sftp.close()

    def start(self) -> dict[str, Any]:
        return self._call("start", self.root, "--python", self.python)

    def stop(self, remove: bool) -> dict[str, Any]:
        return self._call("stop", self.root, *(["--remove"] if remove else []))

    def state(self) -> dict[str, Any]:
        return self._call("state", self.root)

    def read(self, name: str) -> str:
        sftp = self.connection.client.open_sftp()
        try:
            with sftp.open(f"{self.root}/{name}", "rb") as f:
                return f.read().decode(errors="replace")
        finally:
            sftp.close()

    def close(self) -> None:
        self.connection.close()


def connect(hosts: list[str], options: dict[str, Any], name: str) -> list[OverSSH]:
    """Each host of an SSH cluster, connected (``options``: what ``up`` was given)."""
    try:
        from ..cluster import sshconn
    except ImportError as e:
        raise ImportError(f"--ssh needs paramiko ({e}): pip install 'clustersdk[ssh]'") from e
    user, port = options.get("user"), int(options.get("port") or 22)
    targets = [sshconn.Target.parse(h, user=user, port=port) for h in hosts]
    ssh_options = sshconn.Options(
        known_hosts=options.get("known_hosts") or "~/.ssh/known_hosts",
        key_file=options.get("key_file"),
        connect_timeout=float(options.get("connect_timeout") or 10),
        banner_timeout=None,
        accept_new_hosts=bool(options.get("accept_new_hosts")),
    )
    jump = options.get("jump_host")
    via = sshconn.Target.parse(jump, user=user) if jump else None
    connections, _ = sshconn.connect_all(targets, ssh_options, jump=via)
    remote = options.get("remote_dir") or "~/.clustersdk"
    python = options.get("python") or "python3"
    return [
        OverSSH(connections[t], f"{remote}/standing/{name}/hosts/{t.host}", python) for t in targets
    ]
