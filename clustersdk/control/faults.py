"""Faults: which of a failing job's errors is the one to report, and what a lost worker
does (restart within the budget, else fail).

Pure; :class:`Faults` is the part of :class:`~.lifecycle.Lifecycle` that handles
``Failed`` and ``GraceExpired`` and the losses the lifecycle hands it. When a
worker dies, its peers fail in their next collective (``Connection reset by
peer``, a gloo or NCCL error) and, on a loaded machine, their errors often
reach the scheduler before Dask's notice that the worker left. So a rank's
failure is **held back** until every rank of the gang is out, a worker of the
job is lost, or ``failure_grace`` passes:

- a lost worker (or a rank that could not be started) is then the cause; the
  held errors are its *consequences*, kept in the error record;
- otherwise the cause is the first error that is not a communication error
  (a rank that raised ``ValueError`` made its peers' collectives fail, not
  the reverse), else the first error;
- without restarts left the job fails either way, so the other ranks are told
  to stop at once; with restarts left they go on until the grace decides.

Every cause, and every restart, is also kept as a durable event of the job
(:class:`~.events.Record`).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import describe
from ..protocol import ExitStatus, Word
from ..status import JobStatus
from . import events as ev
from .anomalies import Anomalies
from .view import JobView

# a job whose failure is held back, and that restarts (not fails) after a lost worker
HOLDABLE = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.HUNG})

# what a rank raises when a peer (or the network) went away, rather than its own bug
_COMMUNICATION_TYPES = frozenset(
    {
        "DistBackendError",
        "DistNetworkError",
        "DistStoreError",
        "ConnectionResetError",
        "BrokenPipeError",
        "ConnectionAbortedError",
        "ConnectionRefusedError",
    }
)
_COMMUNICATION = re.compile(
    r"connection (reset|closed|refused|aborted)|broken pipe|\bgloo\b|\bnccl\b|"
    r"socket timeout|timed out|by peer|ProcessGroup|TCPStore",
    re.IGNORECASE,
)

MAX_CONSEQUENCES = 16  # errors kept beside the cause (a gang of 64 fails 63 times over)


def is_communication_error(err: dict[str, Any]) -> bool:
    """Whether ``err`` (a job error record) reads as a peer or the network failing."""
    return err.get("type") in _COMMUNICATION_TYPES or bool(
        _COMMUNICATION.search(str(err.get("message", "")))
    )


def restartable(job: JobView, err: dict[str, Any]) -> bool:
    """Whether ``err`` restarts its gang within the job's ``max_restarts``: a script's exit
    (torchrun's rule), or a function rank's process that died (a crash, a kill, an
    ``os._exit``: like a lost worker). An exception a function raised fails the job: it
    would raise again."""
    return job.spec.kind == "script" or err.get("type") == "RankExit"


def brief(err: dict[str, Any]) -> dict[str, Any]:
    """An error as a consequence: who, what, the first line of the message."""
    message = str(err.get("message", "")).strip().splitlines()
    return {
        "rank": err.get("rank"),
        "type": err.get("type"),
        "message": message[0][:500] if message else "",
    }


class Faults:
    """The cause held back for one gang start, its consequences, and the restart budget.

    >>> faults = Faults(failure_grace=3.0, restarts=0, anomalies=Anomalies())
    >>> faults.weigh({"type": "DistBackendError", "message": "Connection reset by peer"})
    True
    >>> faults.weigh({"type": "ValueError", "message": "bad batch"})  # the real cause
    True
    >>> faults.cause["type"], [c["type"] for c in faults.consequences]
    ('ValueError', ['DistBackendError'])
    """

    def __init__(self, failure_grace: float, restarts: int, anomalies: Anomalies):
        self.failure_grace = failure_grace
        self.restarts = restarts  # gang restarts used (max_restarts is the budget)
        self.anomalies = anomalies  # a cause's diagnosis, a rollback's restart label
        self.restart_paused = False  # it was PAUSED when it lost a worker
        self.restart_note: str | None = None  # why the next restart happens, when not a loss
        self.new_gang()

    def new_gang(self) -> None:
        self.cause: dict[str, Any] | None = None  # the error held back so far
        self.consequences: list[dict[str, Any]] = []  # the errors held back beside it

    # --- weighing errors ------------------------------------------------------------------
    def weigh(self, err: dict[str, Any]) -> bool:
        """Keep ``err`` as the cause or as a consequence; True when it is the cause now:
        the first error, or the first one that is not a communication error."""
        if self.cause is None:
            self.cause = err
            return True
        if is_communication_error(self.cause) and not is_communication_error(err):
            self.consequences.append(brief(self.cause))
            self.cause = err
            return True
        self.consequences.append(brief(err))
        return False

    def add_consequence(self, err: dict[str, Any]) -> None:
        self.consequences.append(brief(err))

    def take(self, err: dict[str, Any] | None = None) -> dict[str, Any]:
        """``err`` (by default the cause held back) with the errors held back beside it as
        its consequences; nothing is held back any more."""
        cause = self.cause if err is None else err
        assert cause is not None
        held = [brief(self.cause)] if self.cause is not None and self.cause is not cause else []
        consequences = (held + self.consequences)[:MAX_CONSEQUENCES]
        self.new_gang()
        return {**cause, "consequences": consequences} if consequences else cause

    def blame(self, loss: dict[str, Any]) -> dict[str, Any]:
        """A lost worker explains the cause held back (a communication error, or none):
        ``loss`` is the cause, the old one its only consequence."""
        consequences = [brief(self.cause)] if self.cause is not None else []
        self.new_gang()
        return {**loss, "consequences": consequences} if consequences else loss

    def note_restart(self, note: str) -> None:
        """Why the next restart happens (it is not a lost worker's)."""
        self.restart_note = note

    # --- events ---------------------------------------------------------------------------
    def failed(self, job: JobView, e: ev.Failed) -> None:
        # while RESTARTING, the other ranks fail for want of the lost one: not news
        if job.status.terminal or job.status is JobStatus.RESTARTING:
            return
        if job.status is JobStatus.STOPPING and (
            is_communication_error(e.error)
            or any(status is ExitStatus.LOST for status in job.exited.values())
            or job.held_ranks
        ):  # a held job's stop: its cause is chosen already
            self.add_consequence(e.error)  # a peer's broken link on the way out
            return
        if job.status not in HOLDABLE:  # SUSPENDING, STOPPING: the first error is the job's
            job.fail(e.error)
            return
        if self.cause is None:  # was it a peer's lost worker? wait and see
            self.cause = e.error
            job.emit(ev.StartTimer(self.failure_grace, ev.GraceExpired(job.attempt)))
            # it fails either way, or (a script, as torchrun; a rank's process that died)
            # one exit ends the whole gang: the others stop now
            if self.restarts >= job.spec.max_restarts or restartable(job, e.error):
                job.ask(Word.STOP, 1)
            return
        self.weigh(e.error)

    def grace_expired(self, job: JobView, e: ev.GraceExpired) -> bool:
        """No worker of the job was lost after all: the held-back failure is the job's
        (True when it failed the job)."""
        if (
            self.cause is not None
            and e.attempt == job.attempt
            and not job.status.terminal
            and job.status is not JobStatus.RESTARTING
            and job.status is not JobStatus.HELD
        ):  # a hold is ended by its owner
            self.fail_held(job)
            return True
        return False

    def fail_held(self, job: JobView) -> None:
        """The held-back failure is the job's: it fails, or it restarts within its budget
        when a rank's process ended without an exception of its own (a script's non-zero
        exit, as torchrun restarts its workers; a function rank's segfault, ``os._exit``,
        a kill)."""
        budget = job.spec.max_restarts
        assert self.cause is not None
        again = restartable(job, self.cause)
        if not again or job.status not in HOLDABLE or self.restarts >= budget:
            cause = self.take()
            if again and budget and job.status in HOLDABLE:
                cause = {
                    **cause,
                    "message": f"{cause.get('message')} (all {budget} restart(s) "
                    "of the job are used up)",
                }
            job.fail(cause)
            return
        cause = self.take()
        self.anomalies.on_failure(job, cause)
        self.restarts += 1
        self.restart_paused = job.status is JobStatus.PAUSED
        rank = cause.get("rank")
        message = f"{describe(cause)}; restart {self.restarts} of {budget}"
        job.transition(
            JobStatus.RESTARTING,
            restarts=self.restarts,
            reason=f"{message}: the other ranks stop first",
        )
        job.record(
            "restarted",
            message,
            rank=rank,
            attempt=job.attempt,
            exit_code=cause.get("exit_code"),
            signal=cause.get("signal"),
            error={k: cause.get(k) for k in ("type", "message", "traceback")},
            consequences=cause.get("consequences", []),
        )
        self.note_restart(f"restart {self.restarts} of {budget} after rank {rank} failed")
        job.ask(Word.STOP, 1)

    # --- a lost worker: restart within the budget, else fail ---------------------------------
    def lost(
        self,
        job: JobView,
        rank: int | None,
        exc_type: str,
        message: str,
        facts: dict[str, Any] | None = None,
    ) -> None:
        """Rank ``rank``'s worker is gone (or could not start it): restart the gang
        while the restart budget lasts, else fail the job."""
        budget = job.spec.max_restarts
        if job.status is JobStatus.RESTARTING:
            return  # another worker of the gang (a whole host went): part of the same restart
        if job.status in HOLDABLE and self.restarts < budget:
            # the peers of the lost rank failed for want of it: consequences, not causes
            cause = self.take(ev.error_record(rank, exc_type, message, facts=facts))
            self.anomalies.on_failure(job, cause)  # e.g. out of memory: worth knowing now
            self.restarts += 1
            self.restart_paused = job.status is JobStatus.PAUSED
            job.transition(
                JobStatus.RESTARTING,
                restarts=self.restarts,
                reason=(
                    f"{message}; restart {self.restarts} of {budget}: the other ranks stop first"
                ),
            )
            job.record(
                "restarted",
                f"{message}; restart {self.restarts} of {budget}",
                rank=rank,
                attempt=job.attempt,
                consequences=cause.get("consequences", []),
            )
            job.ask(Word.STOP, 1)
        elif not job.status.terminal:
            if budget and job.status in HOLDABLE:
                message += f" (all {budget} restart(s) of the job are used up)"
            job.fail(self.take(ev.error_record(rank, exc_type, message, facts=facts)))

    def restart(self, job: JobView) -> None:
        """Every rank of the leaving gang is out: queue again, first in line, to continue
        from the newest committed checkpoint (or from the start without one)."""
        resume = job.resume_point
        where = f"from checkpoint {resume}" if resume else "from the start (no checkpoint)"
        # why: a lost worker's restart N, a rollback (anomalies), the owner's restart (holds)
        note = self.restart_note or self.anomalies.restart_label(self.restarts)
        paused, self.restart_note, self.restart_paused = self.restart_paused, None, False
        job.requeue(f"{note}: {where}", front=True, paused=paused)
