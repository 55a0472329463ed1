"""TCPStore and process-group bring-up for one rank.

We create the ``TCPStore`` ourselves and pass ``store=``: after one ``tcp://``
init times out, every later ``tcp://`` init in that process fails. Rank 0's worker
holds the job's store (:func:`open_store`); every rank's process joins it
(:func:`join_store`). Nothing is torn down: a rank's process ends with its job, and
its groups, its CUDA memory and torch's caches with it.
"""

from __future__ import annotations

import datetime
import errno
import random
import socket
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .. import network

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def open_store(world_size: int, timeout: float, host: str = "") -> dist.TCPStore:
    """Rank 0's store on a free port (``store.port`` tells which), inside the
    ``clustersdk.rendezvous-ports`` range when one is set, listening on ``host`` (the
    worker's own address; "": every interface). torch's store authenticates nobody:
    it listens only where the cluster's hosts reach it."""
    ports = network.rendezvous_ports()
    if ports is None:
        return store_on(0, world_size, timeout, host)
    low, high = ports
    candidates = list(range(low, high + 1))
    start = random.randrange(len(candidates))  # concurrent jobs rarely try the same port first
    for port in candidates[start:] + candidates[:start]:
        try:
            return store_on(port, world_size, timeout, host)
        except OSError as e:
            if e.errno != errno.EADDRINUSE and "EADDRINUSE" not in str(e):
                raise
    raise RuntimeError(
        f"every port of the rendezvous range {low}-{high} is in use on this host; "
        "widen clustersdk.rendezvous-ports"
    )


def store_on(port: int, world_size: int, timeout: float, host: str = "") -> dist.TCPStore:
    """A master store on ``host``:``port`` (0: any free port). torch's own store binds
    every interface, whatever its host name says: the socket is bound here and handed
    to it (``master_listen_fd``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        port = sock.getsockname()[1]
        return dist.TCPStore(
            host or "0.0.0.0",
            port,
            world_size,
            is_master=True,
            timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
            master_listen_fd=sock.detach(),  # the store owns (and closes) it from now on
        )
    finally:
        sock.close()  # a no-op once detached


def join_store(host: str, port: int, world_size: int, timeout: float) -> dist.TCPStore:
    return dist.TCPStore(
        host, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout)
    )


def rank_device(kind: str) -> torch.device:
    """The worker owns one GPU, visible as cuda:0; otherwise the CPU."""
    if kind == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def init(
    store: dist.Store,
    rank: int,
    world_size: int,
    device: torch.device,
    timeout: float,
    checkpoints: bool = True,
) -> tuple[Any, Any]:
    """Init the default group (NCCL on CUDA, gloo on CPU); return the control group and
    the checkpoint group, both gloo.

    Each gloo group keeps a connection thread that wakes 100 times a second, and two
    workers: a rank's step feels every one of them on busy cores, so a job has no
    more than it needs.

    - **control** (the control words, ``job.update``'s agreement, evaluation's
      reductions): a group of its own, with the job's ``timeout``, as the default
      group: a peer that waits at a step boundary for a rank that will not come (held
      under ``on_error="hold"``, or running a long ``job.run`` alone) gives up as it
      would in a training collective, not after gloo's 30 minutes, and its error says
      it timed out. (On the default group, an overlapped check and a training
      collective that both wait for the same missing rank fail together, and the
      second says only "pair closure".)
    - **checkpoint** planning: DCP's async save runs collectives in a background
      thread, which must never meet the training collectives on one group. It keeps
      gloo's default timeout: a rank may wait there while another writes a large
      shard. None for a job that saves no checkpoints (``checkpoints=False``, the same
      on every rank).
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    limit = datetime.timedelta(seconds=timeout)
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=limit,
        device_id=device if device.type == "cuda" else None,
    )
    control = dist.new_group(backend="gloo", timeout=limit)
    return control, dist.new_group(backend="gloo") if checkpoints else None


def device_mesh(device: torch.device, names: tuple[str, ...], shape: tuple[int, ...]) -> DeviceMesh:
    """The job's ``DeviceMesh`` (one sub-group per dimension; all ranks must call it)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, shape, mesh_dim_names=names)
