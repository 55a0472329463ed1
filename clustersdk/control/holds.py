"""Holds: a job whose rank raised under ``on_error="hold"`` waits, failed but alive, for
its owner to look inside (pure; :class:`Holds` is the part of
:class:`~.lifecycle.Lifecycle` that keeps them).

A rank that raises under hold does not tear down: it reports ``Held`` (its error
record and its failing frames with their locals, rendered safely by
:mod:`clustersdk.runtime.holds`) and waits, keeping the exception, its frames,
its process group and its slot, until it is told to stop. The rules:

- **Held** (the first one): RUNNING, PAUSED, HUNG or STARTING become HELD; the other
  ranks are asked to pause (those that reach a step boundary wait there; a peer
  stuck in a collective with the held rank stays there until the job's ``timeout``,
  then raises a communication error, which holds too, as a consequence); a durable
  event; a timer of ``hold_timeout``. The cause is chosen as :mod:`.faults` does:
  the first error that is not a communication error (``held_failure``), the others
  are its ``consequences``. Every held rank's frames are journaled (``held``), so
  ``job.debug(rank)`` shows them after the job ended too.
- **StopRequested** on a HELD job (``job.stop()``): the ranks are told to stop; once
  out, the job ends **FAILED** with the original error (it did fail; the stop only
  ends the wait) and a durable event says the hold was ended by the stop.
- **RestartRequested** (``job.restart()``): HELD -> RESTARTING, then
  QUEUED first in line to continue from the newest committed checkpoint (as a
  restart after a lost worker, :meth:`.Faults.restart`). It does not count against
  ``max_restarts`` (the owner asked for it, as for a resume); a job without a
  committed checkpoint is refused, nothing changed.
- **HoldExpired** (``hold_timeout`` passed): the job FAILS with the original error.
- **WorkerLost** while HELD: a worker of a held rank whose error is the cause takes
  the post-mortem with it: the job fails with that error; otherwise the hold goes on,
  the loss kept as a consequence. When the cause is only a communication error the
  lost worker explains it: the job fails naming the worker.
- Ranks that never get out (stuck in a collective) are ended as a hung gang's are
  (:meth:`.Hangs.stopping`: their workers are restarted after ``hang-stop-grace``),
  so a stop frees every slot within a bounded time.
- A ``Held`` that comes while the job is leaving (stopping, suspending, restarting,
  or told to stop already) is an ordinary failure (:meth:`.Faults.failed`), and the
  rank, which waits, is told to stop.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidTransitionError, SpecError
from ..protocol import Word
from ..status import JobStatus
from . import events as ev
from .faults import Faults, brief, is_communication_error
from .hangs import Hangs
from .view import JobView

# the states a rank's failure can hold a job from
HOLD_FROM = frozenset(
    {JobStatus.STARTING, JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.HUNG, JobStatus.HELD}
)


class HoldBook:
    """The held ranks of one gang start: each one's error, frames and step.

    >>> book = HoldBook()
    >>> book.keep(1, {"type": "ValueError"}, [], step=12, now=5.0)
    >>> book.record()["ranks"]["1"]["step"]
    12
    """

    def __init__(self) -> None:
        self.ranks: dict[int, dict[str, Any]] = {}
        self.cause: int | None = None  # the rank whose error is the job's
        self.since: float | None = None  # when the job became HELD
        self.ended: str = ""  # how the hold ended, once it did

    def keep(
        self,
        rank: int,
        error: dict[str, Any],
        frames: list[dict[str, Any]],
        step: int | None,
        now: float,
    ) -> None:
        self.ranks[rank] = {
            "rank": rank,
            "error": error,
            "frames": frames,
            "step": step,
            "time": now,
        }

    def record(self) -> dict[str, Any]:
        """What the journal keeps (the job record's ``held``)."""
        return {
            "cause": self.cause,
            "since": self.since,
            "ended": self.ended,
            "ranks": {str(rank): entry for rank, entry in sorted(self.ranks.items())},
        }


class Holds:
    """The HELD rules of one job. The cause of a hold is weighed as :class:`.Faults`
    weighs a failure (and kept there); the held ranks' frames are kept here."""

    def __init__(self, faults: Faults, hangs: Hangs):
        self.faults = faults
        self.hangs = hangs  # ranks that never get out of a hold are ended as a hung gang's
        self.book = HoldBook()

    def new_gang(self) -> None:
        self.book = HoldBook()

    @property
    def ranks(self) -> list[int]:
        return sorted(self.book.ranks)

    def reason(self, job: JobView) -> str:
        """``held: rank 1 raised ValueError at step 12: boom; job.debug(1) shows ...``."""
        rank = self.book.cause
        err = self.faults.cause or {}
        step = self.book.ranks.get(rank, {}).get("step") if rank is not None else None
        at = f" at step {step}" if step is not None else ""
        message = brief(err)["message"][:200]
        return (
            f"held: rank {rank} raised {err.get('type')}{at}: {message}; job.debug({rank}) "
            f"shows its stack, job.run(fn, ranks=[{rank}]) inspects it; job.stop() or "
            "job.restart() ends the hold (it fails by itself after "
            f"hold_timeout={job.spec.hold_timeout:g} s)"
        )

    # --- events ---------------------------------------------------------------------------
    def held(self, job: JobView, e: ev.Held) -> None:
        """A rank raised under hold and waits."""
        if job.status not in HOLD_FROM or job.words[Word.STOP]:
            # leaving already: an ordinary failure; the rank waits, so tell it to go
            self.faults.failed(job, ev.Failed(e.rank, e.attempt, e.error))
            job.ask(Word.STOP, 1)
            return
        book = self.book
        book.keep(e.rank, e.error, e.frames, e.step, job.now)
        if self.faults.cause is not None and book.cause is None:  # a plain failure came first
            book.cause = self.faults.cause.get("rank")
        self.weigh(job, e.rank, e.error)
        job.emit(ev.Journal({"held": book.record()}))
        if job.status is JobStatus.HELD:
            return
        book.since = job.now
        job.transition(JobStatus.HELD, reason=self.reason(job))
        err = self.faults.cause or e.error
        job.record(
            "held",
            f"rank {book.cause} raised {err.get('type')}: "
            f"{brief(err)['message']}; the job is HELD for job.debug / job.run",
            rank=book.cause,
        )
        job.pause()  # the others wait at their boundary
        job.emit(ev.StartTimer(job.spec.hold_timeout, ev.HoldExpired(job.attempt)))

    def failed(self, job: JobView, e: ev.Failed) -> None:
        """A peer of a held rank failed outright: weighed alike."""
        self.weigh(job, e.rank, e.error)

    def weigh(self, job: JobView, rank: int, err: dict[str, Any]) -> None:
        """The cause so far and its consequences: the first error that is not a
        communication error is the cause."""
        first = self.faults.cause is None
        if self.faults.weigh(err):
            self.book.cause = rank
            if not first and job.status is JobStatus.HELD:  # the reason names the real cause
                job.emit(ev.Journal({"reason": self.reason(job), "held": self.book.record()}))

    def stopping(self, job: JobView) -> None:
        """``job.stop()`` of a HELD job (the lifecycle has asked the ranks to stop)."""
        self._end(job, "job.stop(): the job ends FAILED with the error it was held for")
        self.hangs.stopping(job)  # a peer stuck in a collective is ended after the grace

    def restart(self, job: JobView, e: ev.RestartRequested) -> None:
        """``job.restart()``: leave the hold for the newest checkpoint."""
        if job.status is not JobStatus.HELD:
            raise InvalidTransitionError(
                f"job {job.name!r} is {job.status.name}; only a HELD job can be restarted from "
                "its checkpoint (launch with on_error='hold')"
            )
        resume = job.resume_point
        if not resume:
            raise SpecError(
                f"job {job.name!r} has no committed checkpoint to restart from (it needs "
                "checkpoint_dir= and a checkpoint taken before it failed); job.stop() ends the "
                "hold"
            )
        self._end(job, f"job.restart(): it continues from {resume}")
        self.faults.new_gang()  # nothing held back: the restart is the owner's choice
        self.faults.note_restart("restarted from its checkpoint (job.restart())")
        job.transition(
            JobStatus.RESTARTING,
            reason=(f"restart from checkpoint {resume}, asked while HELD: the ranks stop first"),
        )
        job.ask(Word.STOP, 1)
        self.hangs.stopping(job)

    def expired(self, job: JobView, e: ev.HoldExpired) -> None:
        """The hold lasted ``hold_timeout``: the job fails with the error it was held for."""
        if e.attempt != job.attempt or job.status is not JobStatus.HELD:
            return
        self._end(job, f"hold_timeout: nobody ended it within {job.spec.hold_timeout:g} s")
        self.faults.fail_held(job)
        self.hangs.stopping(job)

    def lost(
        self,
        job: JobView,
        rank: int | None,
        exc_type: str,
        message: str,
        facts: dict[str, Any] | None = None,
    ) -> None:
        """A worker of a HELD job left the cluster (its rank's slot is freed already);
        ``facts``: how its process ended, when its nanny said."""
        cause = self.faults.cause
        loss = ev.error_record(rank, exc_type, message, facts=facts)
        if cause is None or is_communication_error(cause):
            # the lost worker explains the broken links: it is the cause
            self._end(job, f"{message}: the job fails naming it")
            job.fail(self.faults.blame(loss))
        elif rank == self.book.cause:
            self._end(job, f"{message}: the held rank's frames are gone with it")
            self.faults.add_consequence(loss)
            self.faults.fail_held(job)
        else:
            self.faults.add_consequence(loss)
            return
        self.hangs.stopping(job)

    def _end(self, job: JobView, how: str) -> None:
        """The hold is over: say how, durably and in the journaled record."""
        book = self.book
        book.ended = how
        held_for = job.now - book.since if book.since is not None else 0.0
        job.record("released", f"the hold ended after {held_for:.0f} s: {how}", rank=book.cause)
        job.emit(ev.Journal({"held": book.record()}))
