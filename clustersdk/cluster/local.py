"""``Cluster.local``: one Dask worker per GPU (or N CPU slots) on this machine."""

from __future__ import annotations

import functools
import logging
import warnings
from typing import TYPE_CHECKING, Any

import dask.config

from ..errors import SpecError

if TYPE_CHECKING:
    from .base import Cluster


def local(
    cls: type[Cluster],
    workers: int | None = None,
    *,
    n_workers: int | None = None,
    gpus: bool | None = None,
    state_dir: str | None = None,
    dashboard: bool = True,
    silence_logs: int | bool = logging.WARNING,
    memory_limit: str | int | None = None,
    security: Any = "auto",
    bind_cpus: bool | None = None,
) -> Cluster:
    """Start a local Dask cluster whose workers each own one GPU or one CPU slot.

    ``n_workers`` is ``workers`` as Dask's ``LocalCluster`` spells it (give one of them).
    ``gpus=None`` uses GPUs when there are any. With GPUs, worker ``i`` sees only
    GPU ``i`` (``CUDA_VISIBLE_DEVICES``), so two ranks never share a device.
    Every worker has one thread, and when it starts, a zygote that imports torch: each
    rank is a process forked from it (a crash ends that rank alone). Dask's own
    log lines below ``silence_logs`` are hidden (``False`` shows them all).
    ``memory_limit`` (bytes, or ``"4 GiB"``) is each worker's: its nanny restarts a
    worker that passes 95% of it (``distributed.worker.memory.terminate``), and the
    job's diagnosis says so; by default Dask's share of the machine's memory.

    ``security="auto"`` (the default) makes the cluster its own certificate authority:
    every connection is mutual TLS and you are its admin (``cluster.add_user``
    gives others credentials); a ``distributed.Security`` uses your own PKI;
    ``False`` listens on plain tcp:// (warned about, and reported by ``doctor``).

    ``bind_cpus`` (default: ``clustersdk.bind-cpus``, true) gives each worker a disjoint
    share of this machine's cores, whole physical cores in order, when it has at
    least as many CPUs as workers (``clustersdk.cpus``); ``cluster.slots()`` shows each
    worker's share. With fewer CPUs, a job with more ranks than CPUs runs each rank on
    one core, round robin; ``bind_cpus=False`` binds neither.

    ``dashboard=True`` (the default) serves Dask's dashboard on a free port of 127.0.0.1:
    ``cluster.dashboard_link`` is its URL (plain HTTP, read-only, seen by anyone on this
    machine); it needs bokeh (``pip install 'clustersdk[dashboard]'``), without which the
    cluster starts without it, with a warning that says so. ``dashboard=False`` serves none.

    In a script, call it under ``if __name__ == "__main__":`` (the workers
    import the script again); without the guard this fails at once, saying so.

    >>> cluster = Cluster.local(workers=2)   # doctest: +SKIP
    """
    from .guard import check_main_guard

    check_main_guard("Cluster.local")
    import torch
    from distributed import Client, Nanny, Scheduler

    if n_workers is not None:
        if workers is not None:
            raise SpecError(
                f"give workers= or n_workers= (the same thing, as Dask spells it), "
                f"not both: got workers={workers!r} and n_workers={n_workers!r}"
            )
        workers = n_workers
    n_gpus = torch.cuda.device_count() if gpus is not False else 0
    if gpus and not n_gpus:
        raise SpecError("gpus=True but this machine has no CUDA device visible to torch")
    if workers is None:
        workers = n_gpus or 2
    if isinstance(workers, bool) or not isinstance(workers, int) or workers <= 0:
        raise SpecError(f"workers must be a positive int, got {workers!r}")
    limit = _memory_limit(memory_limit)
    if n_gpus and workers > n_gpus:
        raise SpecError(
            f"workers={workers} but this machine has {n_gpus} GPU(s): one worker per GPU"
        )

    from .. import config
    from ..security.tls import cluster_security

    prepared = cluster_security(security, state_dir=config.state_dir(state_dir), kind="local")
    tls = {"protocol": prepared.protocol}
    scheduler = {
        "cls": Scheduler,
        "options": {
            "host": "127.0.0.1",
            "port": 0,
            "dashboard": dashboard and _bokeh(),
            "dashboard_address": "127.0.0.1:0",  # Dask's HTTP routes; the Bokeh UI only with dashboard=True
            **tls,
            "security": prepared.scheduler,
        },
    }
    from .. import cpus

    bind = config.get("bind-cpus", True) if bind_cpus is None else bind_cpus
    shares = cpus.shares(workers) if bind else None
    specs = {}
    for i in range(workers):
        env = {"CUDA_VISIBLE_DEVICES": str(i) if n_gpus else ""}
        if shares:
            env[cpus.ENV] = shares[i]
        elif not bind:
            env[cpus.ENV] = cpus.OFF
        specs[f"slot-{i}"] = {
            "cls": Nanny,
            "options": {
                "nthreads": 1,
                "env": env,
                "host": "127.0.0.1",
                "name": f"slot-{i}",
                "dashboard": False,
                "silence_logs": silence_logs,
                **({"memory_limit": limit} if limit is not None else {}),
                **tls,
                "security": prepared.worker,
            },
        }
    try:
        with dask.config.set({**worker_config(), **http_routes(prepared.enabled)}):
            dask_cluster = _slots_class()(
                workers=specs,
                scheduler=scheduler,
                name="clustersdk-local",
                silence_logs=silence_logs,
                security=prepared.client,
            )
    except BaseException:
        prepared.close()
        raise
    try:
        client = Client(dask_cluster)
        return cls(
            client,
            kind="local",
            dask_cluster=dask_cluster,
            state_dir=state_dir,
            silence_logs=silence_logs,
            security=prepared,
        )
    except BaseException:
        dask_cluster.close()
        prepared.close()
        raise


def _memory_limit(value: str | int | None) -> int | None:
    """``memory_limit`` in bytes (None: Dask's default), or a SpecError naming it."""
    if value is None:
        return None
    from dask.utils import parse_bytes

    try:
        limit = (
            value if isinstance(value, int) and not isinstance(value, bool) else parse_bytes(value)
        )
    except (TypeError, ValueError):
        limit = None
    if not isinstance(limit, int) or limit <= 0:
        raise SpecError(
            f"memory_limit must be a positive number of bytes or a size such as "
            f"'4 GiB', got {value!r}"
        )
    return limit


def _bokeh() -> bool:
    """Whether Dask's dashboard can be served here; without bokeh, a warning says so
    (shown once, as Python shows a warning)."""
    try:
        import distributed.dashboard.scheduler  # noqa: F401 - what Dask's scheduler imports
    except ImportError as e:
        warnings.warn(
            f"no Dask dashboard for this local cluster: it needs bokeh ({e}); "
            "pip install 'clustersdk[dashboard]', or pass dashboard=False",
            stacklevel=3,
        )
        return False
    return True


@functools.cache
def _slots_class() -> type:
    from distributed import SpecCluster
    from distributed.deploy.cluster import Cluster as DaskCluster

    class Slots(SpecCluster):
        """A SpecCluster of nannies that keeps a slot whose worker died.

        SpecCluster closes a worker's nanny when its worker is not back within
        ``distributed.deploy.lost-worker-timeout`` (15 s), the right thing for
        deployers that cannot restart a worker; but a nanny restarts its own, and
        on a loaded machine that takes longer (15-48 s measured), so the slot
        would be gone for good and a job with restarts left would fail.
        """

        def _update_worker_status(self, op: str, msg: Any) -> None:
            if op == "remove":
                DaskCluster._update_worker_status(self, op, msg)
            else:
                super()._update_worker_status(op, msg)

    return Slots


def http_routes(tls: bool) -> dict[str, Any]:
    """Dask's HTTP routes for a cluster: on a TLS cluster, health checks only (Dask's HTTP
    server is plain and unauthenticated; its info pages show logs and call stacks)."""
    if not tls:
        return {}
    health = ["distributed.http.health"]
    return {"distributed.scheduler.http.routes": health, "distributed.worker.http.routes": health}


# Dask timers that wake a worker's event loop many times a second: each wake-up takes a
# core from the ranks on a busy host (measured when ranks were the worker's threads, when
# it also took their GIL). The
# ranks are not Dask tasks (Dask's profiler samples only tasks, and on a TLS cluster no
# dashboard shows its profiles or the system monitor's disk figures), and nothing here
# needs to hear of a blocked event loop within 20 ms. Measured with benchmarks/parallel.py
# (FSDP on 2 ranks of 2 cores): the profiler and a 0.5 s system monitor cost about 8%.
QUIET_TIMERS = {
    "distributed.admin.tick.interval": "500ms",  # Dask's default: 20 ms
    "distributed.worker.profile.enabled": False,  # sampled every 10 ms
    "distributed.worker.profile.interval": "100ms",  # if a user turns it back on
    "distributed.admin.system-monitor.interval": "2s",  # 0.5 s
    "distributed.admin.system-monitor.disk": False,  # True
    "distributed.worker.memory.monitor-interval": "250ms",  # 100 ms
}


def worker_config() -> dict[str, Any]:
    """The Dask config of a cluster's nanny and workers (local and SSH): quieter timers,
    and no pre-spawn MALLOC_TRIM_THRESHOLD_=65536 (it costs about 25% of training
    steps/s)."""
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    return {**QUIET_TIMERS, "distributed.nanny.pre-spawn-environ": environ}
