"""The lifecycle rules of a shared cluster: a job preempted, or reclaimed when idle.

Pure; :class:`Sharing` is the part of :class:`~.lifecycle.Lifecycle` that handles
``Preempted``, ``Reclaimed`` and ``Grow``. The scheduling policy (:mod:`.scheduling`) decides who
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

from ..protocol import ExitStatus, Word
from ..status import JobStatus
from . import events as ev
from .view import JobView

LEAVABLE = frozenset({JobStatus.RUNNING, JobStatus.PAUSED})


class Sharing:
    """Why one job is leaving its slots for others, and where it comes back."""

    def __init__(self) -> None:
        self.preempted = False  # leaving for another job: queues again when out
        self.preempt_reason = ""  # ... and why (its reason while QUEUED again)
        self.leave_reason = ""  # why it was reclaimed (kept once it is out)
        self.grow_to: int | None = None  # leaving to come back at this world size

    def stopped_by_user(self) -> None:
        """The user's stop or suspend wins over a preemption: the job won't queue again."""
        self.preempted = False

    def comes_back(self, job: JobView) -> bool:
        """Whether the job, every rank out, is a preempted one that queues again."""
        return (
            self.preempted
            and bool(job.exited)
            and all(s in (ExitStatus.SUSPENDED, ExitStatus.STOPPED) for s in job.exited.values())
        )

    # --- events ---------------------------------------------------------------------------
    def preempt(self, job: JobView, e: ev.Preempted) -> None:
        if e.overdue:
            if job.status is JobStatus.SUSPENDING and self.preempted:
                job.transition(JobStatus.STOPPING, reason=e.reason)
                self.preempt_reason = e.reason
                job.ask(Word.STOP, 1)
            return
        if job.status not in LEAVABLE:
            return  # already leaving, or gone: nothing to ask
        self.preempted, self.preempt_reason = True, e.reason
        job.record("preempted", e.reason, how=e.how)
        self._leave(job, e.how, e.reason)

    def reclaim(self, job: JobView, e: ev.Reclaimed) -> None:
        if job.status not in LEAVABLE:
            return
        self.leave_reason = e.reason
        job.record("reclaimed", e.reason, how=e.how)
        self._leave(job, e.how, e.reason)

    def _leave(self, job: JobView, how: str, reason: str) -> None:
        """Suspend (a checkpoint at the next step boundary) or, without a checkpoint_dir,
        stop."""
        if how == "suspend" and job.spec.checkpoint_dir:
            job.transition(JobStatus.SUSPENDING, reason=reason)
            job.ask(Word.SUSPEND, 1)
        else:
            job.transition(JobStatus.STOPPING, reason=reason)
            job.ask(Word.STOP, 1)

    def grow(self, job: JobView, e: ev.Grow) -> None:
        """Back to the asked world size: suspend (a checkpoint at the next step boundary),
        then queue again at ``e.world_size``, resharding from that checkpoint."""
        if (
            job.status is not JobStatus.RUNNING
            or not job.spec.checkpoint_dir
            or e.world_size <= job.world_size
        ):
            return
        self.preempted, self.grow_to = True, e.world_size
        self.preempt_reason = f"growing from {job.world_size} back to {e.world_size} ranks"
        job.record(
            "resized",
            f"{self.preempt_reason}: slots are free again; it checkpoints and continues from there",
            world_size=e.world_size,
            was=job.world_size,
        )
        job.transition(JobStatus.SUSPENDING, reason=self.preempt_reason)
        job.ask(Word.SUSPEND, 1)

    def requeue(self, job: JobView) -> None:
        """Every rank of a preempted job is out: queue it again, to continue from its newest
        committed checkpoint (the one its suspend just wrote), or from the start."""
        grow_to, self.grow_to, self.preempted = self.grow_to, None, False
        job.requeue(self.preempt_reason, world_size=grow_to)
