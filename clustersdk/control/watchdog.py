"""The control plane's hang watchdog: the Dask side of :mod:`.hangs`.

Once a second it asks each running job's :class:`~.hangs.Watch` for a verdict
and feeds ``HangDetected`` (or ``Progressed``) to the job's lifecycle. It
collects stacks from every rank's worker (the agent answers from the worker's
event loop, so a stuck training thread still shows where it is; a worker that
does not answer within :data:`STACK_TIMEOUT` is reported as frozen, with what
``/proc`` says of its process when it runs on this host), and restarts the
worker of a rank that never stopped (through its nanny, which kills the
process even when it is stopped by SIGSTOP).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from .. import config
from ..protocol import WorkerOp, op
from . import events as ev
from . import hangs

if TYPE_CHECKING:
    from .plugin import ControlPlane, Run

logger = logging.getLogger(__name__)

STACK_TIMEOUT = 3.0  # seconds a worker has to say where its rank is


def check(plane: ControlPlane) -> None:
    """One look at every running or hung job (the plane's tick)."""
    now = time.time()
    grace = float(config.get("hang-stop-grace"))
    for run in list(plane.runs.values()):
        status = run.machine.status
        if not hangs.worth_watching(status):
            continue
        idle = run.watch.verdict(now, run.machine.spec.hang_timeout)
        if idle is not None and status.name == "RUNNING":
            timeout = run.watch.timeout(run.machine.spec.hang_timeout)
            plane.feed(run, ev.HangDetected(idle, timeout, run.watch.where(now), grace))


def heard(plane: ControlPlane, run: Run, rank: int, beacon: dict[str, Any] | None) -> None:
    """A rank said where it is (with every message it sends)."""
    if not beacon or beacon.get("step") is None:
        return
    now = time.time()
    ticks = beacon.get("ticks")
    run.watch.heard(rank, int(beacon["step"]), str(beacon.get("phase", "step")), now,
                    None if ticks is None else int(ticks))
    if run.machine.status.name == "HUNG" and run.watch.verdict(
            now, run.machine.spec.hang_timeout) is None:
        plane.feed(run, ev.Progressed())


async def stacks(plane: ControlPlane, run: Run, all_threads: bool = False) -> dict[str, Any]:
    """Where every rank of ``run`` is now: rank -> its stack, step and phase, or why its
    worker could not say."""
    ranks = run.machine.ranks
    answers = await asyncio.gather(*(
        _ask(plane, run.id, slot.worker, all_threads) for slot in ranks), return_exceptions=True)
    out: dict[str, Any] = {}
    for rank, (slot, answer) in enumerate(zip(ranks, answers)):
        entry: dict[str, Any] = {"rank": rank, "worker": slot.worker, "host": slot.host,
                                 "time": time.time()}
        if isinstance(answer, dict):
            entry.update(answer, answered=True)
        elif answer is None:
            entry.update(answered=True, text="(the rank has exited)")
        else:
            entry.update(answered=False, text=(
                f"worker {slot.worker} did not answer within {STACK_TIMEOUT:.0f} s: its process "
                f"is frozen (stopped, e.g. by SIGSTOP, or stuck outside Python) or gone"
                f"{_process_note(plane, slot.worker)}"))
        entry.setdefault("phase", (run.watch.beacons.get(rank).phase
                                   if rank in run.watch.beacons else None))
        out[str(rank)] = entry
    return out


async def _ask(plane: ControlPlane, job: str, worker: str, all_threads: bool) -> Any:
    return await asyncio.wait_for(op(plane.scheduler.rpc(worker), WorkerOp.STACKS)(
        job=job, all_threads=all_threads), STACK_TIMEOUT)


def _process_note(plane: ControlPlane, worker: str) -> str:
    """What /proc says of the worker's process, when it runs on this host."""
    state = plane.scheduler.workers.get(worker)
    pid = getattr(state, "pid", None)
    if not pid or not os.path.exists(f"/proc/{pid}/stat") or not _local(worker):
        return ""
    try:
        with open(f"/proc/{pid}/stat") as f:
            code = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip() or "-"
    except OSError:
        return ""
    names = {"T": "stopped (SIGSTOP)", "t": "stopped by a tracer", "D": "in uninterruptible I/O",
             "S": "sleeping", "R": "running", "Z": "a zombie"}
    return f"; on this host, process {pid} is {names.get(code, code)} (wchan {wchan})"


def _local(worker: str) -> bool:
    import socket

    host = worker.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    try:
        mine = {"127.0.0.1", "::1", "localhost", socket.gethostname(),
                socket.gethostbyname(socket.gethostname())}
    except OSError:
        mine = {"127.0.0.1", "::1", "localhost"}
    return host in mine


async def keep_stacks(plane: ControlPlane, run: Run) -> None:
    """Collect the stacks of a job found hung and keep them in its record."""
    try:
        found = await stacks(plane, run)
    except Exception:  # the watchdog must not hurt the job
        logger.exception("clustersdk: collecting the stacks of job %s failed", run.id)
        return
    plane.journal.update(run.id, stacks=found)


async def restart_worker(plane: ControlPlane, worker: str, reason: str) -> None:
    """End a stuck rank by restarting its worker process (its nanny kills it); without a
    nanny, take the worker out of the cluster."""
    logger.warning("clustersdk: restarting worker %s: %s", worker, reason)
    try:
        await plane.scheduler.restart_workers([worker], timeout=30, wait_for_workers=False,
                                              on_error="raise",
                                              stimulus_id=f"clustersdk-hung-{time.time()}")
    except Exception as e:  # noqa: BLE001 - no nanny, or it did not make it in time
        logger.warning("clustersdk: could not restart worker %s (%s); removing it", worker, e)
        await plane.scheduler.remove_worker(worker, stimulus_id=f"clustersdk-hung-{time.time()}",
                                            close=True)
