"""Faults: which of a failing job's errors is the one to report, and what a lost worker
does (restart within the budget, else fail).

Pure, a part of :class:`~.lifecycle.Lifecycle` (its ``Failed`` and
``GraceExpired`` events). When a worker dies, its peers fail in their next
collective (``Connection reset by peer``, a gloo or NCCL error) and, on a
loaded machine, their errors often reach the scheduler before Dask's notice
that the worker left. So a rank's failure is **held back** until every rank
of the gang is out, a worker of the job is lost, or ``failure_grace`` passes:

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
from typing import TYPE_CHECKING, Any

from ..protocol import ExitStatus, Word
from ..status import JobStatus
from . import anomalies
from . import events as ev

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

# a job whose failure is held back, and that restarts (not fails) after a lost worker
HOLDABLE = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.HUNG})

# what a rank raises when a peer (or the network) went away, rather than its own bug
_COMMUNICATION_TYPES = frozenset({"DistBackendError", "DistNetworkError", "DistStoreError",
                                  "ConnectionResetError", "BrokenPipeError",
                                  "ConnectionAbortedError", "ConnectionRefusedError"})
_COMMUNICATION = re.compile(
    r"connection (reset|closed|refused|aborted)|broken pipe|\bgloo\b|\bnccl\b|"
    r"socket timeout|timed out|by peer|ProcessGroup|TCPStore", re.IGNORECASE)

MAX_CONSEQUENCES = 16  # errors kept beside the cause (a gang of 64 fails 63 times over)


def is_communication_error(err: dict[str, Any]) -> bool:
    """Whether ``err`` (a job error record) reads as a peer or the network failing."""
    return (err.get("type") in _COMMUNICATION_TYPES
            or bool(_COMMUNICATION.search(str(err.get("message", "")))))


def brief(err: dict[str, Any]) -> dict[str, Any]:
    """An error as a consequence: who, what, the first line of the message."""
    message = str(err.get("message", "")).strip().splitlines()
    return {"rank": err.get("rank"), "type": err.get("type"),
            "message": message[0][:500] if message else ""}


def failed(job: Lifecycle, e: ev.Failed) -> None:
    # while RESTARTING, the other ranks fail for want of the lost one: not news
    if job.status.terminal or job.status is JobStatus.RESTARTING:
        return
    if job.status is JobStatus.HELD:  # a peer of a held rank failed outright: weighed alike
        from .holds import weigh

        weigh(job, e.rank, e.error)
        return
    if job.status is JobStatus.STOPPING and (is_communication_error(e.error) or any(
            status is ExitStatus.LOST for status in job.exited.values())
            or job.holds.ranks):  # a held job's stop: its cause is chosen already
        job.consequences.append(brief(e.error))  # a peer's broken link on the way out
        return
    if job.status not in HOLDABLE:  # SUSPENDING, STOPPING: the first error is the job's
        job._fail(e.error)
        return
    if job.held_failure is None:  # was it a peer's lost worker? wait and see
        job.held_failure = e.error
        job._out.append(ev.StartTimer(job.failure_grace, ev.GraceExpired(job.attempt)))
        if job.restarts >= job.spec.max_restarts:
            job._ask(Word.STOP, 1)  # it fails either way: the others stop now
        return
    if is_communication_error(job.held_failure) and not is_communication_error(e.error):
        job.consequences.append(brief(job.held_failure))  # this one is the cause
        job.held_failure = e.error
    else:
        job.consequences.append(brief(e.error))


def caused(err: dict[str, Any], job: Lifecycle) -> dict[str, Any]:
    """``err`` with the errors it caused (held back meanwhile) as its consequences."""
    held = ([brief(job.held_failure)] if job.held_failure is not None
            and job.held_failure is not err else [])
    consequences = (held + job.consequences)[:MAX_CONSEQUENCES]
    return {**err, "consequences": consequences} if consequences else err


def fail_held(job: Lifecycle) -> None:
    """No worker of the job was lost after all: the held-back failure is the job's."""
    err = job.held_failure
    assert err is not None
    job._fail(caused(err, job))


# --- a lost worker: restart within the budget, else fail -------------------------------------
def error(rank: int | None, exc_type: str, message: str, traceback: str = "",
          facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A job's error record (``JobFailedError.from_record`` reads it); ``facts`` of a lost
    worker (how its process ended) are what its diagnosis rests on."""
    err = {"rank": rank, "type": exc_type, "message": message, "traceback": traceback}
    return {**err, "facts": {"worker": facts}} if facts else err


def lost(job: Lifecycle, rank: int | None, exc_type: str, message: str,
         facts: dict[str, Any] | None = None) -> None:
    """Rank ``rank``'s worker is gone (or could not start it): restart the gang
    while the restart budget lasts, else fail the job."""
    budget = job.spec.max_restarts
    if job.status is JobStatus.RESTARTING:
        return  # another worker of the gang (a whole host went): part of the same restart
    if job.status in HOLDABLE and job.restarts < budget:
        # the peers of the lost rank failed for want of it: consequences, not causes
        cause = caused(error(rank, exc_type, message, facts=facts), job)
        job.held_failure, job.consequences = None, []
        anomalies.on_failure(job, cause)  # e.g. out of memory: worth knowing before it recurs
        job.restarts += 1
        job.restart_paused = job.status is JobStatus.PAUSED
        job._transition(JobStatus.RESTARTING, restarts=job.restarts, reason=(
            f"{message}; restart {job.restarts} of {budget}: the other ranks stop first"))
        record(job, "restarted", f"{message}; restart {job.restarts} of {budget}",
               rank=rank, attempt=job.attempt, consequences=cause.get("consequences", []))
        job._ask(Word.STOP, 1)
    elif not job.status.terminal:
        if budget and job.status in HOLDABLE:
            message += f" (all {budget} restart(s) of the job are used up)"
        cause = caused(error(rank, exc_type, message, facts=facts), job)
        job.held_failure, job.consequences = None, []
        job._fail(cause)


def restart(job: Lifecycle) -> None:
    """Every rank of the lost gang is out: queue again, first in line, to continue
    from the newest committed checkpoint (or from the start without one)."""
    resume = job.checkpoint or job.spec.resume
    # the history goes on from where the new run begins (its Restored event trims
    # it again if an explicit resume= loads an older step)
    job._out.append(ev.TruncateHistory(job.checkpoint_step if job.checkpoint else 0))
    job._reset_ranks()
    job.spec = job.spec.replace(resume=resume, attempt=job.attempt + 1)
    if job.restart_paused:
        job.words[Word.PAUSE] = 1
    where = f"from checkpoint {resume}" if resume else "from the start (no checkpoint)"
    # why: a lost worker's restart N, a rollback (anomalies), the owner's restart (holds)
    note = job.restart_note or job.anomalies.restart_label(job.restarts)
    job.restart_note = None
    job._out.append(ev.Journal({"spec": job.spec.as_dict()}))
    job._transition(JobStatus.QUEUED, reason=f"{note}: {where}")
    job._out.append(ev.Enqueue(front=True))


def record(job: Lifecycle, kind: str, message: str, **data: Any) -> None:
    """A durable event of the job (``job.events()``): a restart, a failure, a change of
    world size, a preemption; the control plane stamps it with the time and step."""
    job._out.append(ev.Record(kind, message, data))
