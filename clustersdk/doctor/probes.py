"""What the doctor runs on each worker (through ``client.run``): facts and small tests.

Every function here is cheap and leaves nothing behind: sockets are closed,
marker files removed. The port probes are the ``nc -zv`` check of the guides,
done in Python: one worker per host listens on every port of its rendezvous
range, and one worker of each other host connects to each.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

from ..checkpoint_files import is_url
from ..checkpoint_files.remote import filesystem
from ..runtime.telemetry import memory_reader
from ..runtime.versions import nvml, versions

_listeners: dict[str, list[socket.socket]] = {}  # token -> sockets held open between calls
MARKER = ".clustersdk-doctor-{token}-{host}"


def _host(dask_worker: Any) -> str:
    agent = dask_worker.plugins.get("clustersdk-agent")
    slot = getattr(agent, "slot", None) or {}
    if slot.get("host"):
        return slot["host"]
    return dask_worker.address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")


def worker_facts(dask_worker: Any) -> dict[str, Any]:
    """Versions, GPUs (NVML), the rendezvous range and the time, of this worker."""
    from .. import network

    agent = dask_worker.plugins.get("clustersdk-agent")
    slot = getattr(agent, "slot", None) or {}
    return {
        "worker": dask_worker.address,
        "host": _host(dask_worker),
        "slot_kind": slot.get("kind"),
        "versions": versions(),
        "gpus": gpus(),
        "ports": network.format_ports(network.rendezvous_ports()),
        "time": time.time(),
        "tls": tls_files(getattr(dask_worker, "security", None)),
    }


def tls_files(security: Any) -> list[dict[str, Any]]:
    """The TLS files a process reads: modes, keys, certificate expiry (see pki.file_facts)."""
    from ..security.pki import file_facts
    from ..security.tls import security_files

    return file_facts(security_files(security))


def gpus() -> list[dict[str, Any]] | None:
    """Each GPU NVML sees on this host, with its health; None without NVML."""
    nv = nvml()
    if nv is None:
        return None
    out = []
    for index in range(nv.nvmlDeviceGetCount()):
        entry: dict[str, Any] = {"index": index}
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            name = nv.nvmlDeviceGetName(handle)
            memory = memory_reader(nv, handle)()  # as nvidia-smi counts it
            entry.update(
                name=name.decode() if isinstance(name, bytes) else name,
                memory_total=int(memory.total),
                memory_used=int(memory.used),
                temperature=int(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)),
            )
            try:
                entry["ecc_uncorrected"] = int(
                    nv.nvmlDeviceGetTotalEccErrors(
                        handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                    )
                )
            except Exception:  # ECC off or not supported (consumer GPUs)
                entry["ecc_uncorrected"] = None
        except Exception as e:  # a GPU that fell off the bus answers with errors
            entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    return out


# the checkpoint directory ---------------------------------------------------------------
def write_marker(path: str, token: str, dask_worker: Any = None) -> dict[str, Any]:
    """Write (1 MiB, fsynced) and stat a marker in ``path``: writable? how much room?
    Under a URL (``s3://...``): an object, and no free space to tell."""
    host = _host(dask_worker)
    marker = os.path.join(path, MARKER.format(token=token, host=host))
    if is_url(path):
        try:
            fs, where = filesystem(marker)
            fs.pipe_file(where, os.urandom(1 << 20))
        except Exception as e:  # noqa: BLE001 - the store's errors (and a missing package)
            return {"path": path, "error": f"{type(e).__name__}: {e}"}
        return {"path": path, "marker": marker}
    try:
        os.makedirs(path, exist_ok=True)
        with open(marker, "wb") as f:
            f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
        stat = os.statvfs(path)
    except OSError as e:
        return {"path": path, "error": f"{type(e).__name__}: {e.strerror or e}"}
    return {"path": path, "free": stat.f_bavail * stat.f_frsize, "marker": marker}


def unseen_markers(path: str, token: str, hosts: list[str]) -> list[str]:
    """The hosts whose marker this host can't see in ``path`` (not one shared filesystem)."""
    markers = {h: os.path.join(path, MARKER.format(token=token, host=h)) for h in hosts}
    if is_url(path):
        fs, _ = filesystem(path)
        fs.invalidate_cache()
        return [h for h, marker in markers.items() if not fs.exists(filesystem(marker)[1])]
    return [h for h, marker in markers.items() if not os.path.exists(marker)]


def remove_marker(marker: str) -> None:
    try:
        if is_url(marker):
            fs, where = filesystem(marker)
            fs.rm(where)
        else:
            os.remove(marker)
    except OSError:
        pass


# ports ------------------------------------------------------------------------------------
def listen(token: str, ports: tuple[int, int] | None) -> dict[str, Any]:
    """Listen on every port of the range (or one free port); keep them open for ``connect``."""
    candidates = range(ports[0], ports[1] + 1) if ports else [0]
    held, listening, busy = [], [], []
    for port in candidates:
        sock = socket.socket()
        try:
            sock.bind(("0.0.0.0", port))  # where rank 0's store listens
            sock.listen(64)
        except OSError:
            sock.close()
            busy.append(port)
            continue
        held.append(sock)
        listening.append(sock.getsockname()[1])
    _listeners[token] = held
    return {"listening": listening, "busy": busy, "size": len(candidates)}


async def connect(targets: dict[str, list[int]], timeout: float) -> dict[str, dict[int, str]]:
    """Try a TCP connection to each (host, port); the failures, as host -> port -> why."""
    limit = asyncio.Semaphore(64)

    async def one(host: str, port: int) -> tuple[str, int, str | None]:
        async with limit:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            except asyncio.TimeoutError:
                return host, port, "timed out"
            except OSError as e:
                return host, port, e.strerror or type(e).__name__
            writer.close()
            return host, port, None

    failures: dict[str, dict[int, str]] = {}
    for host, port, why in await asyncio.gather(
        *(one(h, p) for h, ps in targets.items() for p in ps)
    ):
        if why is not None:
            failures.setdefault(host, {})[port] = why
    return failures


def close_listeners(token: str) -> None:
    for sock in _listeners.pop(token, []):
        sock.close()
