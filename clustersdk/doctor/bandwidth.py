"""The all-reduce sweep between two workers, on the cluster's own backend.

Each pair gets its own process group, built directly (``ProcessGroupGloo`` /
``ProcessGroupNCCL`` over a fresh ``TCPStore``), never the default group: a
worker that hosts a job's rank keeps its group untouched. Gloo binds to the
worker's own address, NCCL to its GPU. Timing follows nccl-tests: a warm-up,
then ``iters`` back-to-back all-reduces of the same buffer, averaged.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

_stores: dict[str, Any] = {}  # token -> rank 0's store, between open_store and sweep


def iterations(size: int) -> int:
    """Enough repeats for a stable time on small sizes, few on large ones (as -n does)."""
    return max(2, min(20, (64 << 20) // max(size, 1)))


def open_store(token: str, timeout: float, port: int | None = None) -> int:
    """Rank 0's store on ``port`` (one the port check found reachable), else in the
    rendezvous range; its port."""
    from ..runtime import process_group

    store = (
        process_group.store_on(port, 2, timeout) if port else process_group.open_store(2, timeout)
    )
    _stores[token] = store
    return store.port


async def sweep(
    token: str,
    master: tuple[str, int],
    first: str,
    sizes: list[int],
    backend: str,
    timeout: float,
    dask_worker: Any = None,
) -> list[tuple[int, float]]:
    """On both workers at once: rank 0 is ``first``; (bytes, seconds) per size."""
    rank = 0 if dask_worker.address == first else 1
    host = dask_worker.address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    store = _stores.pop(token, None) if rank == 0 else None
    loop = asyncio.get_running_loop()  # the work runs in a thread: the event loop stays free
    return await loop.run_in_executor(
        None, _sweep, store, master, rank, host, sizes, backend, timeout
    )


def _group(store: Any, rank: int, host: str, backend: str, timeout: float) -> Any:
    import torch.distributed as dist

    prefixed = dist.PrefixStore("clustersdk-doctor", store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = datetime.timedelta(seconds=timeout)
        return dist.ProcessGroupNCCL(prefixed, rank, 2, options)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = datetime.timedelta(seconds=timeout)
    return dist.ProcessGroupGloo(prefixed, rank, 2, options)


def _sweep(
    store: Any,
    master: tuple[str, int],
    rank: int,
    host: str,
    sizes: list[int],
    backend: str,
    timeout: float,
) -> list[tuple[int, float]]:
    import torch

    from ..runtime import process_group

    if store is None:
        store = process_group.join_store(master[0], master[1], 2, timeout)
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    group = _group(store, rank, host, backend, timeout)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    try:
        for size in sizes:
            buffer = torch.ones(max(size // 4, 1), dtype=torch.float32, device=device)
            group.allreduce([buffer]).wait()  # warm-up: connections, buffers
            sync()
            group.allreduce([torch.ones(1, device=device)]).wait()  # start together
            sync()
            n = iterations(size)
            t0 = time.perf_counter()
            for _ in range(n):
                group.allreduce([buffer]).wait()
            sync()
            rows.append((size, (time.perf_counter() - t0) / n))
            del buffer
    finally:
        if hasattr(group, "shutdown"):
            group.shutdown()
        del group
    return rows
