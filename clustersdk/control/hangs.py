"""Hangs: a job whose ranks stop finishing steps, found by the control plane.

Pure. Every rank reports where it is (its step and phase: ``data``, ``step``
(forward, backward, optimizer: the user's code), ``control`` (the ranks
agreeing at a step boundary), ``checkpoint``, ``evaluate``, ``paused``) with
each message it sends and at least once a second (:mod:`clustersdk.runtime.agent`).
:class:`Watch` keeps that per job; :meth:`Watch.verdict` says whether the job
is hung: no rank has finished a step (or an evaluation batch) for ``hang_timeout`` seconds (default:
max(60 s, 20x the slowest of the recent steps)), not counting time in a
checkpoint or a pause, nor while every rank is outside ``ctx.loop`` (before
it or after it: a function that never calls it is not watched). A deadlocked collective, a stuck data loader and a
frozen process (SIGSTOP) all look alike here: no step ends; ``job.stacks()``
tells them apart.

The lifecycle's side (:class:`Hangs`):
RUNNING becomes HUNG (its reason says for how long and where each rank is,
its stacks are collected), then the job's ``on_hang`` applies: ``"report"``
keeps waiting, ``"restart"`` restarts the gang from its newest checkpoint
(counting against ``max_restarts``), ``"fail"`` fails it. A hung rank may
never reach the step boundary where a stop would end it: once a hung job is
stopping or restarting, ranks still out after ``grace`` seconds are ended by
killing their processes (:class:`~.events.EndRank`), their slots freed.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from ..protocol import ExitStatus
from ..status import JobStatus
from . import events as ev
from .view import JobView

MIN_DEFAULT = 60.0  # the default hang_timeout is never shorter ...
STEP_FACTOR = 20.0  # ... and at least this many times the slowest recent step
RECENT_STEPS = 50  # steps that define "recent"
EXEMPT = frozenset({"checkpoint", "paused"})  # phases whose time is not waiting
OUTSIDE = frozenset({"setup", "done"})  # before or after ctx.loop: no steps to count
# the states in which ranks that did not get out in time are ended
LEAVING = frozenset({JobStatus.STOPPING, JobStatus.RESTARTING, JobStatus.FAILED})


@dataclasses.dataclass
class Beacon:
    step: int
    phase: str
    time: float  # when it was heard
    ticks: int = 0  # steps and evaluation batches the rank has done


class Watch:
    """Where each rank of one job is, and when a step last finished."""

    def __init__(self, now: float):
        self.beacons: dict[int, Beacon] = {}
        self.advanced_at = now  # a step finished, or the gang (re)started
        self.best = -1  # the furthest step any rank reported
        self.durations: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self.exempt_since: float | None = None
        # how many ranks' newest beacon is in an EXEMPT or an OUTSIDE phase: kept as beacons
        # come, so that each beacon costs the same at 4,096 ranks as at 2
        self._exempt = self._outside = 0

    def reset(self, now: float) -> None:
        """A new gang start (or a resume): nothing to compare with yet."""
        self.__init__(now)  # type: ignore[misc]  # (unsound in general; here: every field anew)

    def heard(self, rank: int, step: int, phase: str, now: float, ticks: int | None = None) -> None:
        """A rank's beacon; progress is a step (or an evaluation batch, in ``ticks``)
        finished by any rank."""
        done = step if ticks is None else ticks
        old = self.beacons.get(rank)
        if old is not None:
            self._exempt -= old.phase in EXEMPT
            self._outside -= old.phase in OUTSIDE
        self._exempt += phase in EXEMPT
        self._outside += phase in OUTSIDE
        self.beacons[rank] = Beacon(step, phase, now, done)
        if done > self.best:
            if self.best >= 0:
                self.durations.append((now - self.advanced_at) / (done - self.best))
            self.best, self.advanced_at = done, now
        # a save or a pause is not waiting; nor is the user's own code around ctx.loop
        # (a job that never calls ctx.loop has no steps to watch)
        exempt = self._exempt > 0 or self._outside == len(self.beacons)
        if exempt and self.exempt_since is None:
            self.exempt_since = now
        elif not exempt and self.exempt_since is not None:
            self.advanced_at += now - self.exempt_since  # the save or pause was no waiting
            self.exempt_since = None

    def timeout(self, hang_timeout: float | None) -> float:
        if hang_timeout is not None:
            return hang_timeout
        slowest = max(self.durations, default=0.0)
        return max(MIN_DEFAULT, STEP_FACTOR * slowest)

    def idle_for(self, now: float) -> float:
        if self.exempt_since is not None:
            return self.exempt_since - self.advanced_at
        return now - self.advanced_at

    def verdict(self, now: float, hang_timeout: float | None) -> float | None:
        """Seconds without a finished step when that is a hang, else None."""
        idle = self.idle_for(now)
        return idle if idle > self.timeout(hang_timeout) else None

    def where(self, now: float) -> str:
        """``rank 0 at step 12, phase control (heard 0.4 s ago), rank 1 ...``."""
        parts = []
        for rank in sorted(self.beacons):
            b = self.beacons[rank]
            parts.append(
                f"rank {rank} at step {b.step}, phase {b.phase} (heard {now - b.time:.1f} s ago)"
            )
        return ", ".join(parts) or "no rank has reported yet"


class Hangs:
    """The lifecycle's side of hangs: HUNG, ``on_hang``, and ranks that never stop.

    ``grace`` is how long the ranks of a leaving hung (or held) gang may take to get
    out before their workers are restarted (the plane's ``hang-stop-grace``).
    """

    def __init__(self, grace: float = 10.0):
        self.grace = grace

    def detected(self, job: JobView, e: ev.HangDetected) -> None:
        if job.status is not JobStatus.RUNNING:
            return
        message = (
            f"hung: no rank has finished a step for {e.idle_for:.0f} s (hang_timeout "
            f"{e.timeout:.0f} s); {e.where}; job.stacks() shows where each rank is"
        )
        self.grace = e.grace
        job.transition(JobStatus.HUNG, reason=message)
        job.record("hung", message, idle_for=round(e.idle_for, 3))
        job.emit(ev.CollectStacks())
        policy = job.spec.on_hang
        if policy == "restart":
            job.lose(None, "Hang", message)
        elif policy == "fail":
            job.fail(ev.error_record(None, "Hang", message))
        # leaving: ranks that never get out are ended (lose/fail changed the status: mypy
        # keeps its narrowing across those calls)
        if job.status is not JobStatus.HUNG:  # type: ignore[comparison-overlap]
            self.stopping(job)

    def progressed(self, job: JobView, e: ev.Progressed) -> None:
        if job.status is JobStatus.HUNG:
            job.transition(JobStatus.RUNNING, reason="")
            job.record("recovered", "a step finished again: running")

    def stopping(self, job: JobView) -> None:
        """A hung (or held) gang is leaving: the ranks that never reach a boundary are
        ended after the grace."""
        job.emit(ev.StartTimer(self.grace, ev.StopOverdue(job.attempt, self.grace)))

    def overdue(self, job: JobView, e: ev.StopOverdue) -> None:
        """Ranks of the hung gang still out: kill their processes, free their slots."""
        if e.attempt != job.attempt or job.status not in LEAVING:
            return  # an earlier gang's, or the job came back to life and goes on
        stuck = [rank for rank in range(len(job.ranks)) if rank not in job.exited]
        for rank in stuck:
            job.emit(
                ev.EndRank(
                    job.ranks[rank].worker,
                    job.attempt,
                    f"rank {rank} of job {job.name!r} hung and did not stop",
                )
            )
        if stuck:
            job.record(
                "ended",
                f"rank(s) {', '.join(map(str, stuck))} did not stop within "
                f"{e.grace:.0f} s: their processes are killed",
                ranks=stuck,
            )
        job.end_ranks(stuck, ExitStatus.LOST)


def worth_watching(status: JobStatus) -> bool:
    return status in (JobStatus.RUNNING, JobStatus.HUNG)


def summary(watch: Watch, now: float) -> dict[str, Any]:
    return {
        "idle_for": round(watch.idle_for(now), 3),
        "ranks": {r: dataclasses.asdict(b) for r, b in watch.beacons.items()},
    }
