"""TCPStore and process-group bring-up and teardown for one rank.

We create the ``TCPStore`` ourselves and pass ``store=``: after one ``tcp://``
init times out, every later ``tcp://`` init in that process fails, and a warm
worker must be able to host many jobs in a row.
"""

from __future__ import annotations

import datetime
import gc
import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def open_store(world_size: int, timeout: float) -> dist.TCPStore:
    """Rank 0's store on a free port (``store.port`` tells which)."""
    return dist.TCPStore(
        "0.0.0.0", 0, world_size, is_master=True,
        timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False,
    )


def join_store(host: str, port: int, world_size: int, timeout: float) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, is_master=False,
                         timeout=datetime.timedelta(seconds=timeout))


def rank_device(kind: str) -> torch.device:
    """The worker owns one GPU, visible as cuda:0; otherwise the CPU."""
    if kind == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def set_env(rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
    })


def init(store: dist.Store, rank: int, world_size: int, device: torch.device, timeout: float):
    """Init the default group (NCCL on CUDA, gloo on CPU); return two gloo groups.

    The first carries control words, the second checkpoint planning (DCP's
    async save runs collectives in a background thread, which must never meet
    the training collectives on one group).
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout),
        device_id=device if device.type == "cuda" else None,
    )
    return dist.new_group(backend="gloo"), dist.new_group(backend="gloo")


def teardown() -> None:
    """Destroy every group so that the next job starts clean on this worker."""
    gc.collect()  # drop DDP reducers and their pending work before the groups go
    if dist.is_initialized():
        dist.destroy_process_group()
    else:
        # An init that failed (a peer never came) has counted its group already: the
        # next job's groups would be named "1", "2"... here and "0", "1"... on fresh
        # workers, and wait for each other's keys forever. destroy_process_group()
        # resets the counter; without a default group there is nothing to destroy.
        world = getattr(dist.distributed_c10d, "_world", None)
        if world is not None and hasattr(world, "group_count"):
            world.group_count = 0


def device_mesh(device: torch.device, names: tuple[str, ...], shape: tuple[int, ...]
                ) -> DeviceMesh:
    """The job's ``DeviceMesh`` (one sub-group per dimension; all ranks must call it)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, shape, mesh_dim_names=names)
