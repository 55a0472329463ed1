"""Diagnoses in a job's life: failures explained, non-finite losses, loss spikes, versions.

Pure; :class:`Anomalies` is the part of :class:`~.lifecycle.Lifecycle` that keeps them. Every diagnosis (see
:mod:`.diagnosis`) leaves as one :class:`~.events.Diagnosed` action: the
control plane keeps it as the job's newest (``job.diagnosis``), as a durable
event (``job.diagnoses()``), as a line of the job's log and of the
scheduler's, and publishes it to the dashboards.

- **A failure** (the cause :mod:`.faults` chose, when the job fails or
  restarts): its diagnosis, if it has one, goes into the error record
  (``JobFailedError`` shows it).
- **Started**: once every rank of a gang has started, the versions they
  reported are compared (a mismatch is diagnosed; the job goes on).
- **NonFinite** (a NaN or Inf loss or gradient norm at step *s*), by the
  job's ``on_nan``: ``"report"``: a diagnosis for the first such step of a
  gang start (again if the rows of an earlier one arrive later); ``"pause"``: every rank pauses before step *s* + 1 (the ranks
  themselves hold there, see :mod:`clustersdk.runtime.anomalies`; the plane
  mirrors the pause so that ``resume()`` works as usual); ``"fail"``: the job
  fails; ``"rollback"``: the job restarts from its newest checkpoint (never
  one taken after step *s*: the ranks act before saving) with *s* added to
  ``skip_steps``, so that step *s* draws and drops its batch. A rollback does
  not count against ``max_restarts`` (that budget is for lost workers), but
  at most ``max_rollbacks`` happen; a step that is non-finite again after its
  batch was dropped fails the job: the data was not the cause.
- **LossSpike**: a diagnosis; with ``on_spike="pause"`` a RUNNING job pauses.
"""

from __future__ import annotations

from typing import Any

from .. import diagnosis as dx
from ..protocol import Word
from ..status import JobStatus
from . import events as ev
from .view import JobView

MAX_ROLLBACKS = 3  # the default of clustersdk.diagnosis.max-rollbacks
KEPT = 100  # diagnoses a lifecycle keeps in memory (the journal keeps them all)
# STARTING too: a rank's first rows can come before the message that its gang started
LIVE = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.HUNG})


class Anomalies:
    """What one job's diagnosis rules remember (per gang start where it says so).

    >>> Anomalies(max_rollbacks=2).restart_label(1)
    'restart 1'
    """

    def __init__(self, max_rollbacks: int = MAX_ROLLBACKS):
        self.max_rollbacks = max_rollbacks
        self.entries: list[dx.Diagnosis] = []
        self.rollbacks = 0
        self.rollback_note = ""  # the reason of the restart under way, when a rollback
        self._attempt = -1
        self.versions: dict[int, dict[str, Any]] = {}
        self.nonfinite_steps: set[int] = set()
        self.reported: int | None = None  # the non-finite step "report" diagnosed
        self.spike_steps: set[int] = set()

    def _of(self, attempt: int) -> Anomalies:
        """This object, its per-gang-start memory emptied when ``attempt`` is a new one."""
        if attempt != self._attempt:
            self._attempt = attempt
            self.versions, self.nonfinite_steps, self.spike_steps = {}, set(), set()
            self.reported = None
        return self

    def restart_label(self, restarts: int) -> str:
        """How the reason of a job queued again names its restart (once)."""
        note, self.rollback_note = self.rollback_note, ""
        return note or f"restart {restarts}"

    def diagnosed(self, job: JobView, found: dx.Diagnosis) -> dx.Diagnosis:
        """Keep ``found`` (with its rank's worker and host, and the time) and send it out."""
        if found.rank is not None and 0 <= found.rank < len(job.ranks):
            slot = job.ranks[found.rank]
            found = found.at(worker=slot.worker, host=slot.host)
        found = found.at(time=job.now)
        self.entries = [*self.entries[-(KEPT - 1) :], found]
        job.emit(ev.Diagnosed(found.as_dict()))
        return found

    def on_failure(self, job: JobView, err: dict[str, Any]) -> dict[str, Any]:
        """``err`` (the cause of a failure or restart) with its diagnosis, when it has one."""
        if err.get("diagnosis") is not None:
            return err
        found = dx.diagnose(err)
        if found is None:
            return err
        return {**err, "diagnosis": self.diagnosed(job, found).as_dict()}

    # --- events ---------------------------------------------------------------------------
    def started(self, job: JobView, e: ev.Started) -> None:
        """Compare the versions of the gang's ranks once every one has started."""
        book = self._of(job.attempt)
        if e.versions is None or e.rank in book.versions:
            return
        book.versions[e.rank] = dict(e.versions)
        if len(book.versions) == job.world_size:
            hosts = {i: slot.host for i, slot in enumerate(job.ranks)}
            found = dx.version_mismatch(book.versions, hosts)
            if found is not None:
                self.diagnosed(job, found)

    def nonfinite(self, job: JobView, e: ev.NonFinite) -> None:
        book = self._of(job.attempt)
        policy = job.spec.on_nan
        # a short job's last rows may land after its end: a report is still its diagnosis
        late_report = policy == "report" and job.status is JobStatus.FINISHED
        if (job.status not in LIVE and not late_report) or e.step in book.nonfinite_steps:
            return
        book.nonfinite_steps.add(e.step)
        if policy == "report":
            # once a loss is NaN the next ones usually are too: say it once, unless the rows
            # of an earlier step come later (the ranks' rows arrive in any order)
            if book.reported is None or e.step < book.reported:
                book.reported = e.step
                self.diagnosed(job, dx.nonfinite(e.rank, e.step, e.values, policy))
        elif policy == "pause":
            self.diagnosed(job, dx.nonfinite(e.rank, e.step, e.values, policy))
            if job.status in (JobStatus.STARTING, JobStatus.RUNNING):
                job.pause()
        elif policy == "fail":
            self._fail(job, e, dx.nonfinite(e.rank, e.step, e.values, policy), "")
        else:
            self._rollback(job, e)

    def _rollback(self, job: JobView, e: ev.NonFinite) -> None:
        skipped = list(job.spec.skip_steps or [])
        found = dx.nonfinite(e.rank, e.step, e.values, "rollback")
        if e.step in skipped:
            self._fail(
                job,
                e,
                found,
                f"; step {e.step} is non-finite again although its batch "
                "was dropped: the data is not the cause",
            )
            return
        if self.rollbacks >= self.max_rollbacks:
            self._fail(
                job, e, found, f"; all {self.max_rollbacks} rollback(s) of the job are used up"
            )
            return
        self.rollbacks += 1
        resume = (
            f"checkpoint {job.checkpoint} (step {job.checkpoint_step})"
            if job.checkpoint
            else "the start (no checkpoint yet)"
        )
        note = (
            f"rollback {self.rollbacks} of {self.max_rollbacks} after a non-finite value at "
            f"step {e.step} on rank {e.rank}"
        )
        self.diagnosed(job, found)
        job.replace_spec(skip_steps=sorted({*skipped, e.step}))
        job.transition(
            JobStatus.RESTARTING,
            reason=f"{note}: the ranks stop, then it continues "
            f"from {resume} without step {e.step}'s batch",
        )
        self.rollback_note = note
        job.record(
            "rolled back", f"{note}; continues from {resume}", rank=e.rank, nonfinite_step=e.step
        )
        job.ask(Word.STOP, 1)

    def _fail(self, job: JobView, e: ev.NonFinite, found: dx.Diagnosis, why: str) -> None:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(e.values.items()))
        message = f"non-finite {shown} at step {e.step} (on_nan={job.spec.on_nan!r}){why}"
        found = self.diagnosed(job, found)
        job.fail(
            {**ev.error_record(e.rank, "NonFiniteLoss", message), "diagnosis": found.as_dict()}
        )

    def spike(self, job: JobView, e: ev.LossSpike) -> None:
        book = self._of(job.attempt)
        if job.status not in LIVE or e.step in book.spike_steps:
            return
        book.spike_steps.add(e.step)
        pause = job.spec.on_spike == "pause" and job.status is JobStatus.RUNNING
        self.diagnosed(
            job,
            dx.loss_spike(
                e.rank,
                e.step,
                e.value,
                e.median,
                e.mad,
                e.score,
                e.window,
                paused=pause,
                mean=e.mean,
                ranks=e.ranks,
                scale=e.scale,
            ),
        )
        if pause:
            job.pause()
