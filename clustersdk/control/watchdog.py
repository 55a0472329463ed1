"""The control plane's hang watchdog: the Dask side of :mod:`.hangs`.

Once a second it asks each running job's :class:`~.hangs.Watch` for a verdict
and feeds ``HangDetected`` (or ``Progressed``) to the job's lifecycle. It
collects stacks from every rank's worker (the agent answers from the worker's
event loop, so a stuck training thread still shows where it is; a worker that
does not answer within :data:`STACK_TIMEOUT` is reported as frozen, with what
``/proc`` says of its process when it runs on this host). The plane restarts the
worker of a rank that never stopped (through its nanny, which kills the process
even when it is stopped by SIGSTOP).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

from .. import config
from ..protocol import WorkerOp
from ..status import JobStatus
from . import events as ev
from . import hangs
from .plane import Plane, Run

logger = logging.getLogger(__name__)

STACK_TIMEOUT = 3.0  # seconds a worker has to say where its rank is


class Watchdog:
    """The hang watch of one control plane."""

    def __init__(self, plane: Plane):
        self.plane = plane

    def check(self) -> None:
        """One look at every running or hung job (the plane's tick)."""
        now = time.time()
        grace = float(config.get("hang-stop-grace"))
        for run in list(self.plane.runs.values()):
            status, spec = run.machine.status, run.machine.spec
            if not hangs.worth_watching(status):
                continue
            idle = run.watch.verdict(now, spec.hang_timeout)
            if idle is not None and status is JobStatus.RUNNING:
                timeout = run.watch.timeout(spec.hang_timeout)
                self.plane.feed(run, ev.HangDetected(idle, timeout, run.watch.where(now), grace))

    def heard(self, run: Run, rank: int, beacon: dict[str, Any] | None) -> None:
        """A rank said where it is (with every message it sends)."""
        if not beacon or beacon.get("step") is None:
            return
        now = time.time()
        ticks = beacon.get("ticks")
        run.watch.heard(
            rank,
            int(beacon["step"]),
            str(beacon.get("phase", "step")),
            now,
            None if ticks is None else int(ticks),
        )
        if (
            run.machine.status is JobStatus.HUNG
            and run.watch.verdict(now, run.machine.spec.hang_timeout) is None
        ):
            self.plane.feed(run, ev.Progressed())

    async def stacks(self, run: Run, all_threads: bool = False) -> dict[str, Any]:
        """Where every rank of ``run`` is now: rank -> its stack, step and phase, or why its
        worker could not say."""
        ranks = run.machine.ranks
        answers = await asyncio.gather(
            *(
                asyncio.wait_for(
                    self.plane.call_worker(
                        slot.worker, WorkerOp.STACKS, job=run.id, all_threads=all_threads
                    ),
                    STACK_TIMEOUT,
                )
                for slot in ranks
            ),
            return_exceptions=True,
        )
        out: dict[str, Any] = {}
        for rank, (slot, answer) in enumerate(zip(ranks, answers)):
            entry: dict[str, Any] = {
                "rank": rank,
                "worker": slot.worker,
                "host": slot.host,
                "time": time.time(),
            }
            if isinstance(answer, dict):
                entry.update(answer, answered=True)
            elif answer is None:
                entry.update(answered=True, text="(the rank has exited)")
            else:
                entry.update(
                    answered=False,
                    text=(
                        f"worker {slot.worker} did not answer within {STACK_TIMEOUT:.0f} s: its "
                        f"process is frozen (stopped, e.g. by SIGSTOP, or stuck outside Python) or "
                        f"gone{self._process_note(slot.worker)}"
                    ),
                )
            beacon = run.watch.beacons.get(rank)
            entry.setdefault("phase", beacon.phase if beacon is not None else None)
            out[str(rank)] = entry
        return out

    async def keep_stacks(self, run: Run) -> None:
        """Collect the stacks of a job found hung and keep them in its record."""
        try:
            found = await self.stacks(run)
        except Exception:  # the watchdog must not hurt the job
            logger.exception("clustersdk: collecting the stacks of job %s failed", run.id)
            return
        self.plane.journal.update(run.id, stacks=found)

    def _process_note(self, worker: str) -> str:
        """What /proc says of the worker's process, when it runs on this host."""
        pid = self.plane.worker_pid(worker)
        if not pid or not os.path.exists(f"/proc/{pid}/stat") or not _local(worker):
            return ""
        try:
            with open(f"/proc/{pid}/stat") as f:
                code = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read().strip() or "-"
        except OSError:
            return ""
        names = {
            "T": "stopped (SIGSTOP)",
            "t": "stopped by a tracer",
            "D": "in uninterruptible I/O",
            "S": "sleeping",
            "R": "running",
            "Z": "a zombie",
        }
        return f"; on this host, process {pid} is {names.get(code, code)} (wchan {wchan})"


def _local(worker: str) -> bool:
    host = worker.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    try:
        mine = {
            "127.0.0.1",
            "::1",
            "localhost",
            socket.gethostname(),
            socket.gethostbyname(socket.gethostname()),
        }
    except OSError:
        mine = {"127.0.0.1", "::1", "localhost"}
    return host in mine
