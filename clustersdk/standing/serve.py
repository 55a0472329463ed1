"""The processes of a standing cluster: its scheduler, and a nanny per slot.

What a host's supervisor (:mod:`.supervisor`) runs, and what a systemd unit or a
Kubernetes container runs::

    python -m clustersdk.standing.serve scheduler --tls DIR --state DIR --host H --port P
    python -m clustersdk.standing.serve worker ADDRESS --tls DIR --name team-0 [--gpu 0]

The scheduler has clustersdk's control plane from its first moment (its journal in
``--state``), and the plugins every worker and nanny must run are registered on it
before any of them connects, so a worker that comes (or comes back) is a clustersdk
worker at once. Both listen on ``tls://`` with the cluster's certificates in ``--tls``
(``ca.pem``, ``crl.pem`` and the role's ``scheduler.pem`` or ``worker.pem``), and check
its revocation list.

A worker's SIGTERM (systemd's stop, a Kubernetes eviction) lets its job
checkpoint and move before the nanny closes (:mod:`clustersdk.runtime.nannies`); SIGINT,
or a second SIGTERM, closes it at once.

A process restarted by its supervisor finds what happened to its predecessor in
``CLUSTERSDK_RESTART``: the scheduler journals it as a cluster event as it starts; a
worker's agent sends it with its slot (the control plane journals it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any

from ..protocol import ENV_RESTART

logger = logging.getLogger(__name__)


async def install(scheduler: Any, state_dir: str) -> None:
    """The control plane on ``scheduler``, and the plugins every worker and nanny that
    joins gets from it (what ``Cluster`` registers through a client, done in place)."""
    from distributed.protocol.pickle import dumps

    from ..cluster.base import cluster_plugins

    plane, workers, nannies = cluster_plugins(state_dir)
    await scheduler.register_scheduler_plugin(plane, idempotent=True)
    for plugin in workers:
        await scheduler.register_worker_plugin(None, dumps(plugin), plugin.name, idempotent=True)
    for plugin in nannies:
        await scheduler.register_nanny_plugin(None, dumps(plugin), plugin.name, idempotent=True)


async def run_scheduler(tls: str, state_dir: str, host: str, port: int) -> None:
    import dask.config
    from distributed import Scheduler

    from ..cluster.local import http_routes
    from ..control.plugin import PLUGIN_NAME
    from ..security.tls import ClusterSecurity

    security = ClusterSecurity.in_directory(tls, "scheduler")
    with dask.config.set(http_routes(True)):
        scheduler = Scheduler(
            host=host,
            port=port,
            protocol="tls",
            security=security,
            dashboard=False,
            dashboard_address=":0",
        )
        await scheduler
    _stop_on_signals(scheduler)
    await install(scheduler, state_dir)
    restart = os.environ.get(ENV_RESTART)
    if restart:  # a supervisor started it again: what ended its predecessor goes on record
        scheduler.plugins[PLUGIN_NAME].restarted("scheduler", scheduler.address, restart)
    print(json.dumps({"ready": scheduler.address}), flush=True)
    await scheduler.finished()


async def run_worker(
    address: str,
    tls: str,
    name: str,
    host: str | None,
    gpu: str | None,
    cpus: str | None,
    memory_limit: str | None,
) -> None:
    import dask.config
    from distributed import Nanny

    from .. import cpus as cpu_shares
    from ..cluster.local import worker_config
    from ..runtime.nannies import NannySignals
    from ..security.tls import ClusterSecurity

    env = {"CUDA_VISIBLE_DEVICES": _device(gpu)}
    if cpus:
        env[cpu_shares.ENV] = cpus
    security = ClusterSecurity.in_directory(tls, "worker")
    options: dict[str, Any] = {}
    if memory_limit:
        options["memory_limit"] = memory_limit
    with dask.config.set(worker_config()):
        nanny = Nanny(
            address,
            nthreads=1,
            name=name,
            host=host,
            security=security,
            env=env,
            dashboard=False,
            **options,
        )
        await nanny
    # SIGTERM (systemd, Kubernetes): the worker's job moves first; SIGINT: at once
    NannySignals([nanny], stop=lambda: asyncio.ensure_future(nanny.close()))
    await nanny.finished()


def _device(gpu: str | None) -> str:
    """The worker's CUDA_VISIBLE_DEVICES: ``--gpu 3``, or ``--gpu job:1`` (the second of
    the GPUs a Slurm job was given, in its CUDA_VISIBLE_DEVICES); none: no GPU."""
    if gpu is None:
        return ""
    if not gpu.startswith("job:"):
        return gpu
    given = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    index = int(gpu[4:])
    if index >= len(given):
        raise SystemExit(
            f"--gpu {gpu}: the job was given {len(given)} GPU(s) (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r})"
        )
    return given[index].strip()


def _stop_on_signals(server: Any) -> None:
    """SIGTERM/SIGINT close ``server`` (a scheduler) gracefully."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(server.close()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m clustersdk.standing.serve")
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("scheduler", help="a scheduler with clustersdk's control plane")
    s.add_argument("--tls", required=True, help="the directory of the cluster's TLS files")
    s.add_argument("--state", required=True, help="where the control plane keeps its journal")
    s.add_argument("--host", default="")
    s.add_argument("--port", type=int, required=True)
    w = sub.add_parser("worker", help="a nanny and its worker, one slot")
    w.add_argument("scheduler", help="the scheduler's address, tls://HOST:PORT")
    w.add_argument("--tls", required=True, help="the directory of the cluster's TLS files")
    w.add_argument("--name", required=True)
    w.add_argument("--host", default=None, help="the address to listen on")
    w.add_argument(
        "--gpu",
        default=None,
        help="the GPU it owns (CUDA_VISIBLE_DEVICES), or job:I: the I-th its Slurm job was given",
    )
    w.add_argument("--cpus", default=None, help="its share of the host's CPUs, e.g. 0-3")
    w.add_argument("--memory-limit", default=None, help="e.g. '16 GiB'")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if args.role == "scheduler":
        asyncio.run(run_scheduler(args.tls, args.state, args.host, args.port))
    else:
        asyncio.run(
            run_worker(
                args.scheduler,
                args.tls,
                args.name,
                args.host,
                args.gpu,
                args.cpus,
                args.memory_limit,
            )
        )


if __name__ == "__main__":
    main()
