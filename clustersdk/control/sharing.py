"""The lifecycle rules of a shared cluster: a job preempted, or reclaimed when idle.

Pure, a part of :class:`~.lifecycle.Lifecycle` (its ``Preempted`` and
``Reclaimed`` events). The scheduling policy (:mod:`.scheduling`) decides who
leaves; these rules say what leaving means for the job:

- **Preempted, suspend**: SUSPENDING (a checkpoint at the next step boundary);
  once every rank is out it queues again by itself (QUEUED, to resume from that
  checkpoint), its ``reason`` saying by whom and when it will resume.
- **Preempted, stop** (no checkpoint_dir, or a suspend past the preemption
  grace): STOPPING; once every rank is out it queues again, to continue from
  its newest committed checkpoint (from the start without one).
- **Reclaimed** (idle): suspended (SUSPENDED; ``job.resume()`` brings it back)
  or, without a checkpoint_dir, stopped for good.

A preemption never uses the job's restart budget. A user's stop or suspend
during a preemption wins: the job then does not queue again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol import Word
from ..status import JobStatus
from . import events as ev
from . import faults

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

LEAVABLE = frozenset({JobStatus.RUNNING, JobStatus.PAUSED})


def preempted(job: Lifecycle, e: ev.Preempted) -> None:
    if e.overdue:
        if job.status is JobStatus.SUSPENDING and job.preempted:
            job._transition(JobStatus.STOPPING, reason=e.reason)
            job.preempt_reason = e.reason
            job._ask(Word.STOP, 1)
        return
    if job.status not in LEAVABLE:
        return  # already leaving, or gone: nothing to ask
    job.preempted, job.preempt_reason = True, e.reason
    faults.record(job, "preempted", e.reason, how=e.how)
    _leave(job, e.how, e.reason)


def reclaimed(job: Lifecycle, e: ev.Reclaimed) -> None:
    if job.status not in LEAVABLE:
        return
    job.leave_reason = e.reason
    faults.record(job, "reclaimed", e.reason, how=e.how)
    _leave(job, e.how, e.reason)


def _leave(job: Lifecycle, how: str, reason: str) -> None:
    """Suspend (a checkpoint at the next step boundary) or, without a checkpoint_dir, stop."""
    if how == "suspend" and job.spec.checkpoint_dir:
        job._transition(JobStatus.SUSPENDING, reason=reason)
        job._ask(Word.SUSPEND, 1)
    else:
        job._transition(JobStatus.STOPPING, reason=reason)
        job._ask(Word.STOP, 1)


def grow(job: Lifecycle, e: ev.Grow) -> None:
    """Back to the asked world size: suspend (a checkpoint at the next step boundary),
    then queue again at ``e.world_size``, resharding from that checkpoint."""
    if job.status is not JobStatus.RUNNING or not job.spec.checkpoint_dir \
            or e.world_size <= job.world_size:
        return
    job.preempted, job.grow_to = True, e.world_size
    job.preempt_reason = f"growing from {job.world_size} back to {e.world_size} ranks"
    faults.record(job, "resized", f"{job.preempt_reason}: slots are free again; it "
                  "checkpoints and continues from there", world_size=e.world_size,
                  was=job.world_size)
    job._transition(JobStatus.SUSPENDING, reason=job.preempt_reason)
    job._ask(Word.SUSPEND, 1)


def requeue(job: Lifecycle) -> None:
    """Every rank of a preempted job is out: queue it again, to continue from its newest
    committed checkpoint (the one its suspend just wrote), or from the start."""
    resume = job.checkpoint or job.spec.resume
    job._out.append(ev.TruncateHistory(job.checkpoint_step if job.checkpoint else 0))
    job._reset_ranks()
    job.preempted = False
    job.spec = job.spec.replace(resume=resume, attempt=job.attempt + 1)
    if job.grow_to:
        job.spec = job.spec.replace(world_size=job.grow_to, asked_world_size=None)
        job.grow_to = None
    job._out.append(ev.Journal({"spec": job.spec.as_dict()}))
    job._transition(JobStatus.QUEUED, reason=job.preempt_reason)
    job._out.append(ev.Enqueue())
