"""TCPStore and process-group bring-up and teardown for one rank.

We create the ``TCPStore`` ourselves and pass ``store=``: after one ``tcp://``
init times out, every later ``tcp://`` init in that process fails, and a warm
worker must be able to host many jobs in a row.
"""

from __future__ import annotations

import datetime
import errno
import gc
import os
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
    """The worker owns one GPU, visible as cuda:0; otherwise the CPU.

    On a GPU the peak-memory counters start again: a warm worker has run other jobs, and
    a failing rank's diagnosis (CUDA out of memory) must report this job's peak.
    """
    if kind == "cuda":
        torch.cuda.set_device(0)
        torch.cuda.reset_peak_memory_stats(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


# what the previous job on this worker changed in os.environ: name -> value before it
_saved_env: dict[str, str | None] = {}


def set_env(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    env: dict[str, str] | None = None,
) -> None:
    """The rank's environment: torch's variables, the job's ``env`` and, unless set,
    the socket interface towards rank 0 (see :mod:`clustersdk.network`; for a
    loopback ``master_addr``, the loopback interface).

    Whatever the previous job on this worker set is undone first, so that one
    job's ``NCCL_DEBUG`` or interface never leaks into the next.
    """
    for name, value in _saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _saved_env.clear()
    wanted = dict(env or {})
    # gloo and NCCL authenticate no peer: they listen only on the interface towards rank 0
    # (a local cluster's: loopback, not whatever the host name resolves to)
    missing = [v for v in network.IFNAME_VARIABLES if v not in wanted and v not in os.environ]
    interface = network.interface_towards(master_addr) if missing else None
    if interface is not None:
        wanted.update(dict.fromkeys(missing, interface))
    for name, value in wanted.items():
        _saved_env[name] = os.environ.get(name)
        os.environ[name] = value
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
    )


def child_environ(master_addr: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a job's child process (a script rank) started by this worker:
    the worker's own, less what a function job on it set (:func:`set_env`), with the
    job's ``env`` and, unless set, the socket interface towards rank 0. ``os.environ``
    is left alone."""
    out = dict(os.environ)
    for name, value in _saved_env.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        out.pop(name, None)
    wanted = dict(env or {})
    # as set_env: gloo and NCCL listen only on the interface towards rank 0 (loopback too)
    missing = [v for v in network.IFNAME_VARIABLES if v not in wanted and v not in out]
    interface = network.interface_towards(master_addr) if missing else None
    if interface is not None:
        wanted.update(dict.fromkeys(missing, interface))
    out.update(wanted)
    return out


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


def teardown() -> None:
    """Destroy every group, and give the job's cached GPU memory back, so that the next
    job starts clean on this worker."""
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
    _forget_meshes()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # The job's cached blocks go back to the device: an idle worker would otherwise
        # keep its last job's memory, which nvidia-smi, the dashboards and every other
        # process on the GPU see as used.
        torch.cuda.empty_cache()


def _forget_meshes() -> None:
    """Empty torch's DTensor caches, which hold on to the job's ``DeviceMesh`` and so to
    its groups: a destroyed gloo group lives on while referenced, and its thread wakes
    100 times a second in the next job's steps. (Private torch caches: each is looked
    up, and one that a torch version lacks is skipped; the next job fills them again.)"""
    try:
        from torch.distributed.tensor import DTensor, _collective_utils, _redistribute
    except ImportError:
        return
    propagator = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    caches = [
        getattr(propagator, "propagate_op_sharding", None),
        getattr(propagator, "_propagate_tensor_meta_cached", None),
        getattr(_redistribute, "_gen_transform_infos", None),
        getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None),
    ]
    for cache in caches:
        if hasattr(cache, "cache_clear"):
            cache.cache_clear()
    clear_planners = getattr(_redistribute, "clear_redistribute_planner_cache", None)
    if callable(clear_planners):
        clear_planners()
    gc.collect()


def device_mesh(device: torch.device, names: tuple[str, ...], shape: tuple[int, ...]) -> DeviceMesh:
    """The job's ``DeviceMesh`` (one sub-group per dimension; all ranks must call it)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, shape, mesh_dim_names=names)
