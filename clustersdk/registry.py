"""A small on-disk registry of the clusters this machine's SDK created or connected to.

Every :class:`~clustersdk.Cluster` writes one JSON file when it comes up and
removes it when it closes::

    <state_dir>/clusters/<scheduler address, made safe>-<pid>.json
    {"address": "tls://127.0.0.1:40123", "kind": "local", "local": true,
     "pid": 4242, "host": "node1", "created": 1767225600.0}

The Jupyter server extension reads it to find schedulers without being told.
An entry is *local* when its scheduler lives and dies with the process that
wrote it (``Cluster.local``): once that pid is gone, :func:`entries` drops the
entry and deletes its file. An entry for a cluster that was only connected to
stays until its process closes it, since the jobs on it outlive the kernel.

>>> path = register("tls://10.0.0.5:8786", kind="connect", local=False)  # doctest: +SKIP
>>> [e["address"] for e in entries()]                                    # doctest: +SKIP
['tls://10.0.0.5:8786']
>>> unregister(path)                                                     # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
import time
from typing import Any

from . import config

__all__ = [
    "authority",
    "clusters_dir",
    "credentials",
    "entries",
    "register",
    "resolve",
    "unregister",
]

logger = logging.getLogger(__name__)


def clusters_dir(state_dir: str | os.PathLike | None = None) -> str:
    """``<state_dir>/clusters``: where the entries live."""
    return os.path.join(config.state_dir(state_dir), "clusters")


def safe_name(address: str) -> str:
    """A file-name-safe form of an address: ``tls://1.2.3.4:8786`` -> ``tls-1.2.3.4-8786``."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", address).strip("-") or "cluster"


def register(
    address: str,
    *,
    kind: str,
    local: bool,
    state_dir: str | os.PathLike | None = None,
    pid: int | None = None,
    credentials: str | None = None,
    authority: str | None = None,
    name: str | None = None,
) -> str | None:
    """Record that this process uses the scheduler at ``address``; return the entry's path.
    A TLS cluster's entry also names the ``credentials`` file this process connects
    with and, for its creator, its certificate ``authority``'s directory: other
    processes of this account (the server extension, the CLI) find them there. A
    standing cluster's entry (``kind="standing"``) has its ``name``, by which
    ``Cluster.connect`` finds it; it stays until ``clustersdk cluster down``.

    Best effort: a registry that cannot be written (read-only home, full disk)
    is logged and ``None`` is returned, since the cluster itself works without it.
    """
    pid = os.getpid() if pid is None else pid
    entry = {
        "address": address,
        "kind": kind,
        "local": bool(local),
        "pid": pid,
        "host": socket.gethostname(),
        "created": time.time(),
    }
    if credentials:
        entry["credentials"] = credentials
    if authority:
        entry["authority"] = authority
    if name:
        entry["name"] = name
    directory = clusters_dir(state_dir)
    file = f"standing-{name}.json" if name else f"{safe_name(address)}-{pid}.json"
    path = os.path.join(directory, file)
    try:
        os.makedirs(directory, exist_ok=True)
        _write_atomic(path, entry)
    except OSError as e:
        logger.warning("could not register cluster %s in %s: %s", address, directory, e)
        return None
    return path


def unregister(path: str | None) -> None:
    """Remove an entry made by :func:`register` (``None`` or a missing file is fine)."""
    if path is None:
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        logger.warning("could not remove cluster registry entry %s: %s", path, e)


def entries(state_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The live entries, oldest first, one per scheduler address.

    Local entries whose process has died are removed from disk on the way;
    unreadable files are skipped.
    """
    directory = clusters_dir(state_dir)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    found: dict[str, dict[str, Any]] = {}
    for name in names:
        path = os.path.join(directory, name)
        entry = _read(path)
        if entry is None:
            continue
        if (
            entry.get("local")
            and entry.get("host") == socket.gethostname()
            and not pid_alive(int(entry.get("pid", 0)))
        ):
            unregister(path)
            continue
        entry["path"] = path
        known = found.get(entry["address"])
        if known is None or entry.get("created", 0) < known.get("created", 0):
            found[entry["address"]] = entry
    return sorted(found.values(), key=lambda e: e.get("created", 0))


def resolve(target: str, state_dir: str | os.PathLike | None = None) -> str:
    """The scheduler address ``target`` names: a standing cluster's name (this account's
    registry has it), or an address already (``tls://host:port``, ``host:port``).

    >>> resolve("tls://10.0.0.5:8786")
    'tls://10.0.0.5:8786'
    """
    if "://" in target or ":" in target:
        return target
    for entry in entries(state_dir):
        if entry.get("name") == target:
            return str(entry["address"])
    standing = sorted(e["name"] for e in entries(state_dir) if e.get("name"))
    raise KeyError(
        f"no cluster named {target!r} in this account's registry ({clusters_dir(state_dir)}); "
        f"standing clusters here: {', '.join(standing) or 'none'} (clustersdk cluster up "
        f"{target} --local N starts one); or give an address, tls://HOST:PORT"
    )


def credentials(address: str, state_dir: str | os.PathLike | None = None) -> str | None:
    """The credentials file an entry for ``address`` names (one this account can read)."""
    for entry in entries(state_dir):
        path = entry.get("credentials")
        if entry["address"] == address and path and os.access(path, os.R_OK):
            return path
    return None


def authority(address: str, state_dir: str | os.PathLike | None = None) -> str | None:
    """The certificate authority's directory of the cluster at ``address``, where this
    account created it."""
    for entry in entries(state_dir):
        path = entry.get("authority")
        if entry["address"] == address and path and os.path.exists(os.path.join(path, "ca.pem")):
            return path
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("address"), str):
        return None
    return entry


def _write_atomic(path: str, entry: dict[str, Any]) -> None:
    # A reader never sees half a file: write aside, then rename over.
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
