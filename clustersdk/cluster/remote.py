"""What ``Cluster.ssh`` runs on each host: a scheduler, or the host's workers.

It runs as a file (see :func:`command`), not with ``-m``: ``-m`` would import
the clustersdk package, and torch with it, just to start Dask servers.
Protocol, as JSON lines (logs go to stderr):

- ``workers``: prints ``{"pid", "pgid"}``, then the host's ``{"facts"}``
  (versions, visible GPUs), imports distributed and waits for one line on
  stdin, ``{"scheduler": ADDRESS, "slots": [CUDA_VISIBLE_DEVICES, ...], "bind_cpus":
  BOOL}``; starts a Nanny per slot (with ``bind_cpus``, each given a disjoint share of
  the cores this launcher may use: ``clustersdk/cpus.py``) and prints
  ``{"ready": [worker addresses]}``.
- ``scheduler``: prints ``{"pid", "pgid"}``, starts a scheduler and prints
  ``{"ready": ADDRESS}``.

With ``--security`` (the paths of the host's TLS files, as JSON) every server it
starts listens on ``tls://`` and checks the cluster's revocation list.

It leads its own process group. When its stdin closes (``cluster.close()``, or
the SSH connection dying with the notebook), on SIGHUP or SIGINT, or when its
servers end, it closes them and then kills its whole process group: nothing
it started outlives it. A SIGTERM (the host shutting down) lets the
workers' jobs checkpoint and move first (``clustersdk.runtime.nannies``); a second
one stops it at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

HARD_STOP_S = 20.0  # after a stop request, the group is killed at the latest this much later
# Finds the installed clustersdk without importing it, and runs this file.
_BOOT = (
    "import importlib.util as u, os, runpy, sys; s = u.find_spec('clustersdk'); "
    "s or sys.exit('clustersdk: No module named clustersdk in ' + sys.executable); "
    "sys.argv[0] = os.path.join(s.submodule_search_locations[0], 'cluster', 'remote.py'); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def command(python: str, mode: str, args: list[str]) -> str:
    """The shell command that runs ``mode`` with ``python`` on a host."""
    return " ".join([shlex.quote(python), "-c", shlex.quote(_BOOT), mode, *map(shlex.quote, args)])


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def facts() -> dict[str, Any]:
    """Versions (from package metadata: nothing heavy is imported) and visible GPUs."""
    import importlib.metadata as metadata
    import platform
    import socket

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    n = gpu_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = (
        [v.strip() for v in visible.split(",") if v.strip()][:n]
        if visible is not None
        else [str(i) for i in range(n)]
    )
    return {
        "python": platform.python_version(),
        "clustersdk": version("clustersdk"),
        "torch": version("torch"),
        "distributed": version("distributed"),
        "gpus": ids,
        "hostname": socket.gethostname(),
        "executable": sys.executable,
    }


def gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no nvidia-ml-py, or no driver: the driver's own list, if any
        try:
            return len(os.listdir("/proc/driver/nvidia/gpus"))
        except OSError:
            return 0


def listen_host(given: str | None) -> str | None:
    """The address to listen on: ``given``, else the one this SSH session came in on
    (``SSH_CONNECTION``), which the notebook's machine could reach; a host name might
    resolve to 127.0.1.1 here (Debian's /etc/hosts) and be reachable by nobody."""
    if given:
        return given
    parts = os.environ.get("SSH_CONNECTION", "").split()
    return parts[2] if len(parts) == 4 else None


def _kill_group() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.killpg(os.getpgid(0), signal.SIGKILL)


class Control:
    """stdin: the first line is the go message, its end is a stop request; signals stop too."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.stop = asyncio.Event()
        self.go: asyncio.Future = loop.create_future()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        threading.Thread(target=self._read, daemon=True, name="clustersdk-stdin").start()

    def _read(self) -> None:
        try:
            line = sys.stdin.buffer.readline()
            if line.strip():
                self.loop.call_soon_threadsafe(self._set_go, line)
            while sys.stdin.buffer.read(4096):
                pass
        except OSError:
            pass
        self.loop.call_soon_threadsafe(self.stop.set)

    def _set_go(self, line: bytes) -> None:
        if not self.go.done():
            self.go.set_result(json.loads(line))

    async def until_stopped(
        self, *finished: Any, leaving: Callable[[], bool] = lambda: False
    ) -> None:
        """Until a stop request, or one of the servers ends by itself (not while they are
        ``leaving()`` on SIGTERM, one by one); then a hard deadline."""
        tasks = [asyncio.ensure_future(self.stop.wait())] + [
            asyncio.ensure_future(f) for f in finished
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if leaving():
            await self.stop.wait()
        self.stop.set()
        timer = threading.Timer(HARD_STOP_S, _kill_group)
        timer.daemon = True
        timer.start()
        for task in tasks:
            task.cancel()


def security(args: argparse.Namespace) -> dict[str, Any]:
    """The ``security`` and ``protocol`` of the servers this launcher starts."""
    files = json.loads(args.security or "{}")
    if not files:
        return {}
    from clustersdk.security.tls import ClusterSecurity  # light: no torch

    return {"security": ClusterSecurity(**files), "protocol": "tls"}


async def run_scheduler(args: argparse.Namespace, control: Control) -> None:
    from distributed import Scheduler

    host = None if args.interface else listen_host(args.host)
    scheduler = Scheduler(
        host=host,
        port=args.port,
        interface=args.interface,
        dashboard=False,
        dashboard_address=f"{host or ''}:{args.dashboard_port}",
        **security(args),
    )
    await scheduler
    emit({"ready": scheduler.address})
    await control.until_stopped(scheduler.finished())
    await asyncio.wait_for(scheduler.close(), HARD_STOP_S / 2)


async def run_workers(args: argparse.Namespace, control: Control) -> None:
    from distributed import Nanny

    stopped = asyncio.ensure_future(control.stop.wait())
    await asyncio.wait([control.go, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not control.go.done():
        return  # stopped before it was told to start
    go = control.go.result()
    host = None if args.interface else listen_host(args.host)
    tls = security(args)
    envs = [{"CUDA_VISIBLE_DEVICES": device} for device in go["slots"]]
    cpus = _cpus_module()
    if go.get("bind_cpus", True):
        for env, share in zip(envs, cpus.shares(len(envs)) or []):
            env[cpus.ENV] = share
    else:
        for env in envs:
            env[cpus.ENV] = cpus.OFF
    nannies = [
        Nanny(
            go["scheduler"],
            nthreads=1,
            name=f"{args.name}-{i}",
            host=host,
            interface=args.interface,
            env=envs[i],
            dashboard=False,
            silence_logs=logging.WARNING,
            **tls,
        )
        for i in range(len(envs))
    ]
    await asyncio.gather(*(nanny.start() for nanny in nannies))
    from clustersdk.runtime.nannies import NannySignals  # light: no torch

    signals = NannySignals(nannies, stop=control.stop.set)  # SIGTERM: the workers leave first
    emit({"ready": [nanny.worker_address for nanny in nannies]})
    await control.until_stopped(
        *(nanny.finished() for nanny in nannies), leaving=lambda: signals.leaving
    )
    await asyncio.wait_for(
        asyncio.gather(*(n.close(timeout=5) for n in nannies), return_exceptions=True),
        HARD_STOP_S / 2,
    )


def _cpus_module() -> Any:
    """``clustersdk.cpus``, loaded from its file (this file runs without the package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpus.py")
    spec = importlib.util.spec_from_file_location("clustersdk_cpus", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


async def _serve(args: argparse.Namespace) -> None:
    control = Control(asyncio.get_running_loop())
    await (run_scheduler if args.mode == "scheduler" else run_workers)(args, control)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clustersdk.cluster.remote")
    parser.add_argument("mode", choices=("scheduler", "workers"))
    parser.add_argument("--host", default=None, help="address to listen on")
    parser.add_argument("--interface", default=None, help="or the interface to listen on")
    parser.add_argument("--port", type=int, default=0, help="scheduler: its port")
    parser.add_argument("--dashboard-port", type=int, default=0, help="scheduler: HTTP port")
    parser.add_argument("--name", default="worker", help="workers: name prefix")
    parser.add_argument("--config", default="{}", help="dask config to set, JSON")
    parser.add_argument("--security", default="", help="TLS files (paths), JSON")
    args = parser.parse_args(argv)
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    emit({"pid": os.getpid(), "pgid": os.getpgid(0)})
    try:
        if args.mode == "workers":
            emit({"facts": facts()})
        import dask.config
        import distributed  # noqa: F401  (while the notebook gathers every host's facts)

        dask.config.set(json.loads(args.config))  # before any Nanny: they pass it on
        asyncio.run(_serve(args))
    finally:
        # every process this one started; the nannies' workers lead process groups of
        # their own (cpus.leave_starter) and exit as the pipe from their nanny closes
        _kill_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
