"""The rules of a job's life, as a pure state machine: events in, actions out.

No Dask, torch or I/O: :class:`Lifecycle` takes the :mod:`.events` the
control plane hears and returns the actions it must carry out, so every rule
below is tested in microseconds (tests/control/test_lifecycle.py).

The rules, by event:

- **Allocated** (a whole gang): STARTING; start every rank.
- **Started**: RUNNING once every rank is inside the user's function.
- **Paused / Resumed**: PAUSED once every rank waits at the same step.
- **Exited**: the rank's slot is free; once every rank is out the job ends
  FINISHED (STOPPED after a stop, SUSPENDED after a suspend whose every rank
  checkpointed, QUEUED again first in line when RESTARTING).
- **Failed** (a rank raised): the failure is *held back* for ``failure_grace``
  seconds (or until every rank is out), because a rank usually sees a dead
  peer (connection reset) before Dask says the peer's worker left: if a worker
  is lost meanwhile, that is the cause (the job restarts, or fails naming it,
  with the peers' errors as consequences); else the job FAILS with the first
  error that is not a peer's communication error (see :mod:`.faults`).
- **WorkerLost / StartFailed**: within the restart budget (``max_restarts``)
  a STARTING, RUNNING or PAUSED job goes RESTARTING: the other ranks stop,
  then it queues first in line to continue from its newest committed
  checkpoint (from the start without one; a PAUSED job comes back paused).
  Otherwise, or in any other state, the job fails naming the worker.
- **ProfileRequested**: a RUNNING or PAUSED job's ranks profile the next
  ``steps`` steps from one agreed step boundary (a PAUSED job's: from its
  resume); **Profiled**: a rank's trace and summary, journaled with the
  request under ``profiles``; once every rank reported, a ``profile`` message.
- **RunRequested / UpdateRequested** (``job.run``, ``job.update``): kept in the job's
  :class:`~.live.LiveBook` and pulled by the ranks at their next agreed boundary; a
  new gang starts with every change so far (see :mod:`.live`).
- Requests (stop, pause, resume, checkpoint, suspend, profile) check the state first
  and raise :class:`~clustersdk.errors.InvalidTransitionError` (or
  ``SpecError``) before changing anything.

Rules of their own live beside this module, as functions of a ``Lifecycle``:
:mod:`.faults` (held failures, lost workers, restarts, durable events),
:mod:`.hangs` (HUNG), :mod:`.sharing` (preemption, idle reclaim, growing back),
:mod:`.profiles` (``job.profile``), :mod:`.holds` (HELD: ``on_error="hold"``) and
:mod:`.breakpoints` (``ctx.breakpoint()`` and its console).

Slots: every rank of an allocated gang is freed exactly once (:class:`FreeSlot`,
on its exit, its worker's loss or its failed start), and a job is released
(:class:`Release`) exactly once, when it is terminal and holds no slot.
Events of an earlier gang start (``attempt``) are ignored.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import InvalidTransitionError, SpecError
from ..layout import Layout
from ..protocol import ExitStatus, WireSpec, Word, no_words
from ..status import TRANSITIONS, JobStatus, check_transition
from . import events as ev
from . import anomalies, breakpoints, faults, hangs, holds, live, profiles, sharing
from .breakpoints import Sessions
from .faults import error
from .live import LiveBook
from .profiles import ProfileBook


class Lifecycle:
    """One job that is not released yet: its state and the rules of its life.

    >>> from clustersdk.control import events as ev
    >>> job = Lifecycle(WireSpec(id="j", name="j", world_size=1), failure_grace=3.0)
    >>> [type(a).__name__ for a in job.handle(ev.Allocated((ev.RankSlot("w", "h", "cpu"),)), 0.0)]
    ['Journal', 'Publish', 'StartGang']
    >>> job.status
    <JobStatus.STARTING: 'starting'>
    """

    def __init__(self, spec: WireSpec, *, failure_grace: float,
                 status: JobStatus = JobStatus.QUEUED, restarts: int = 0,
                 checkpoint: str | None = None, checkpoint_step: int | None = None):
        self.spec = spec
        self.status = status
        self.failure_grace = failure_grace
        self.restarts = restarts
        self.checkpoint, self.checkpoint_step = checkpoint, checkpoint_step  # newest committed
        self.checkpoint_seq = 0          # newest CHECKPOINT request committed
        self.checkpoint_failed_seq = -1  # newest CHECKPOINT request that failed
        self.restart_paused = False      # it was PAUSED when it lost a worker
        self.hang_grace = 10.0           # how long a hung gang may take to stop
        self.grow_to: int | None = None  # leaving to come back at this world size
        self.preempted = False           # leaving for another job: queues again when out
        self.preempt_reason = ""         # ... and why (its reason while QUEUED again)
        self.leave_reason = ""           # why it was reclaimed (kept once it is out)
        self.profiles = ProfileBook()    # job.profile requests and the ranks' reports
        self.breaks = Sessions(spec.attempt)  # ctx.breakpoint() sessions and their console
        self.restart_note: str | None = None  # why the next restart happens, when not a loss
        self.live = LiveBook()           # job.run / job.update requests and the ranks' reports
        self.anomalies = anomalies.AnomalyBook()  # diagnoses, rollbacks (see anomalies.py)
        self.released = False
        self._out: list[ev.Action] = []
        self._now = 0.0
        self._reset_ranks()

    def _reset_ranks(self) -> None:
        self.ranks: tuple[ev.RankSlot, ...] = ()
        self.held: set[int] = set()          # ranks whose slot is still the job's
        self.started: set[int] = set()
        self.exited: dict[int, ExitStatus] = {}
        self.paused: dict[int, int] = {}     # rank -> step it waits before
        self.words = no_words()
        self.held_failure: dict[str, Any] | None = None  # the cause so far (see faults.py)
        self.consequences: list[dict[str, Any]] = []     # the errors held back beside it
        self.result: bytes | None = None
        self.holds = holds.HoldBook()  # the ranks held under on_error="hold"

    # --- properties ------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def attempt(self) -> int:
        return self.spec.attempt

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    # --- the one entry point ----------------------------------------------------------
    def handle(self, event: ev.Event, now: float) -> list[ev.Action]:
        """Apply ``event`` (at time ``now``); return the actions, in order.

        Requests that make no sense in the current state raise before anything
        changes. A released job, or a rank event of another attempt, yields nothing.
        """
        if self.released:
            return []
        if isinstance(event, ev.RankEventBase) and event.attempt != self.attempt:
            return []
        self._out, self._now = [], now
        _DISPATCH[type(event)](self, event)
        return self._out

    # --- the gang ----------------------------------------------------------------------
    def _allocated(self, e: ev.Allocated) -> None:
        asked = self.spec.asked_world_size or self.world_size
        n = len(e.ranks)
        if n != self.world_size:  # the policy started it on fewer (min_world_size), or all again
            faults.record(self, "resized", f"started on {n} of the {asked} ranks asked for "
                          "(min_world_size allows it)" if n < asked else
                          f"back on all {asked} ranks asked for", world_size=n,
                          was=self.world_size, asked=asked)
            self.spec = self.spec.replace(world_size=n, asked_world_size=asked if n < asked else None)
            self._out.append(ev.Journal({"spec": self.spec.as_dict()}))
        self.ranks = e.ranks
        self.held = set(range(len(e.ranks)))
        ranks = [{"rank": i, "worker": r.worker, "host": r.host, "device": r.device}
                 for i, r in enumerate(e.ranks)]
        self._transition(JobStatus.STARTING, ranks=ranks, reason="")
        live.gang_started(self)  # the changes of job.update so far reach the new gang
        self._out.append(ev.StartGang(self.attempt, tuple(self.words)))

    def _started(self, e: ev.Started) -> None:
        self.started.add(e.rank)
        anomalies.started(self, e)
        if self.status is JobStatus.STARTING and len(self.started) == self.world_size:
            self._transition(JobStatus.RUNNING, started=self._now, reason="")

    def _paused(self, e: ev.Paused) -> None:
        self.paused[e.rank] = e.step
        if self.status is JobStatus.RUNNING and len(self.paused) == self.world_size:
            self._transition(JobStatus.PAUSED, paused_at=max(self.paused.values()))

    def _resumed(self, e: ev.Resumed) -> None:
        self.paused.pop(e.rank, None)

    def _loop_started(self, e: ev.LoopStarted) -> None:
        self._out.append(ev.Journal({"total_steps": e.total_steps}))
        self._out.append(ev.Publish({"kind": "progress", "total_steps": e.total_steps}))

    def _restored(self, e: ev.Restored) -> None:
        # the history goes on from the checkpoint's step: rows logged after it
        # (by a run that died before its next checkpoint) are replaced
        self._out.append(ev.TruncateHistory(e.step))

    def _checkpoint_committed(self, e: ev.CheckpointCommitted) -> None:
        self.checkpoint_seq = max(self.checkpoint_seq, e.seq)
        self.checkpoint, self.checkpoint_step = e.path, e.step
        self._out.append(ev.Journal({"checkpoint": e.path, "checkpoint_step": e.step,
                                     "checkpoint_error": None}))
        self._out.append(ev.Publish({"kind": "checkpoint", "path": e.path, "step": e.step}))

    def _checkpoint_failed(self, e: ev.CheckpointFailed) -> None:
        self.checkpoint_failed_seq = max(self.checkpoint_failed_seq, e.seq)
        self._out.append(ev.Journal({"checkpoint_error": f"step {e.step}: {e.message}"}))
        self._out.append(ev.Publish({"kind": "checkpoint_failed", "step": e.step,
                                     "message": e.message}))

    def _exited(self, e: ev.Exited) -> None:
        self.exited[e.rank] = e.status
        if e.rank == 0 and e.result is not None:
            self.result = e.result
        self._free(e.rank)
        self._maybe_done()

    def _start_failed(self, e: ev.StartFailed) -> None:
        if e.rank >= len(self.ranks):
            return  # not a rank of this gang
        self._free(e.rank)  # it never reports an exit; the ranks that did start will
        self.exited.setdefault(e.rank, ExitStatus.NOT_STARTED)
        if self.status is not JobStatus.RESTARTING:
            worker = self.ranks[e.rank].worker
            self._lost(e.rank, e.exc_type, f"could not start rank {e.rank} on worker {worker}: "
                                           f"{e.message}")
        self._maybe_done()

    def _worker_lost(self, e: ev.WorkerLost) -> None:
        if e.rank not in self.held:
            return
        self.exited[e.rank] = ExitStatus.LOST
        self._free(e.rank)
        self._lost(e.rank, "WorkerLost",
                   f"worker {e.worker} (host {e.host}) of rank {e.rank} left the cluster",
                   facts=e.facts)
        self._maybe_done()

    def _grace_expired(self, e: ev.GraceExpired) -> None:
        """No worker of the job was lost after all: the held-back failure is the job's."""
        if (self.held_failure is not None and e.attempt == self.attempt
                and not self.status.terminal and self.status is not JobStatus.RESTARTING
                and self.status is not JobStatus.HELD):  # a hold is ended by its owner
            faults.fail_held(self)
            self._maybe_done()

    # --- requests -------------------------------------------------------------------------
    def _stop(self, e: ev.StopRequested) -> None:
        if self.status.terminal:
            raise InvalidTransitionError(
                f"job {self.name!r} is {self.status.name}; there is nothing to stop")
        if self.status in (JobStatus.QUEUED, JobStatus.SUSPENDED):
            if self.status is JobStatus.QUEUED:
                self._out.append(ev.Dequeue())
            self._finish(JobStatus.STOPPED, reason=f"stopped while {self.status.name}")
        elif self.status is not JobStatus.STOPPING:  # a RESTARTING job then stops for good
            self.preempted = False  # the user's stop wins over a preemption
            hung = self.status is JobStatus.HUNG
            held = self.status is JobStatus.HELD
            self._transition(JobStatus.STOPPING, reason="stop requested")
            self._ask(Word.STOP, 1)
            if hung:
                hangs.stopping(self)
            if held:
                holds.stopping(self)

    def _pause(self, e: ev.PauseRequested) -> None:
        check_transition(self.name, self.status, JobStatus.PAUSED)
        if self.words[Word.PAUSE] <= self.words[Word.RESUME]:
            self.paused.clear()
            self._ask(Word.PAUSE, self.words[Word.RESUME] + 1)

    def _pause_withdrawn(self, e: ev.PauseWithdrawn) -> None:
        if self.status is JobStatus.RUNNING:
            self._ask(Word.RESUME, self.words[Word.PAUSE])

    def _resume(self, e: ev.ResumeRequested) -> None:
        if self.status is JobStatus.PAUSED:
            if e.world_size not in (None, self.world_size):
                raise SpecError(
                    f"job {self.name!r} is PAUSED and keeps its process group of "
                    f"{self.world_size} ranks; to resume at world_size={e.world_size}, suspend "
                    "it first")
            self._transition(JobStatus.RUNNING, reason="")
            self._ask(Word.RESUME, self.words[Word.PAUSE])
            breakpoints.resumed(self)  # a breakpoint's sessions continue too
        elif self.status is JobStatus.SUSPENDED:
            ws = self.world_size if e.world_size is None else e.world_size
            if isinstance(ws, bool) or not isinstance(ws, int) or ws <= 0:
                raise SpecError(f"world_size must be a positive int, got {ws!r}")
            Layout.resolve(self.spec.strategy, self.spec.mesh, ws)  # a mesh that fits ws
            self._reset_ranks()
            self.spec = self.spec.replace(world_size=ws, resume=self.checkpoint,
                                          attempt=self.attempt + 1, asked_world_size=None)
            self._out.append(ev.Journal({"spec": self.spec.as_dict()}))
            self._transition(JobStatus.QUEUED, reason="")
            self._out.append(ev.Enqueue())
        else:
            raise InvalidTransitionError(
                f"job {self.name!r} is {self.status.name}; only a PAUSED or SUSPENDED job can be "
                "resumed")

    def _checkpoint(self, e: ev.CheckpointRequested) -> None:
        self._need_checkpoint_dir("checkpoint")
        if self.status not in (JobStatus.RUNNING, JobStatus.PAUSED):
            raise InvalidTransitionError(
                f"job {self.name!r} is {self.status.name}; a checkpoint needs a RUNNING or "
                "PAUSED job")
        self._ask(Word.CHECKPOINT, self.words[Word.CHECKPOINT] + 1)

    def _suspend(self, e: ev.SuspendRequested) -> None:
        self._need_checkpoint_dir("suspend")
        check_transition(self.name, self.status, JobStatus.SUSPENDING)
        self._transition(JobStatus.SUSPENDING, reason="suspend requested")
        self._ask(Word.SUSPEND, 1)

    def _closing(self, e: ev.SchedulerClosing) -> None:
        # a SUSPENDED job keeps its record and checkpoint (resume="auto" finds it), and
        # so does a QUEUED one: a scheduler restarted at the same address takes both over
        if self.status is JobStatus.QUEUED:
            self._out.append(ev.Journal({"reason": (
                "the scheduler shut down before the job started; a scheduler restarted at "
                "the same address with the same state directory queues it again")}))
        elif JobStatus.FAILED in TRANSITIONS[self.status]:
            self._finish(JobStatus.FAILED, error=error(
                None, "SchedulerClosed", "the Dask scheduler shut down while the job was active"))

    def _need_checkpoint_dir(self, action: str) -> None:
        if not self.spec.checkpoint_dir:
            raise SpecError(f"job {self.name!r} has no checkpoint_dir, so it cannot {action}; "
                            "launch it with checkpoint_dir=...")

    # --- the rules behind them ---------------------------------------------------------------
    def _lost(self, rank: int | None, exc_type: str, message: str,
              facts: dict[str, Any] | None = None) -> None:
        if self.status is JobStatus.HELD:
            holds.lost(self, rank, exc_type, message, facts)
            return
        faults.lost(self, rank, exc_type, message, facts)

    def _maybe_done(self) -> None:
        if len(self.exited) < self.world_size:
            return
        if self.status is JobStatus.RESTARTING:
            faults.restart(self)
            return
        if self.preempted and self.exited and all(
                s in (ExitStatus.SUSPENDED, ExitStatus.STOPPED) for s in self.exited.values()):
            sharing.requeue(self)
            return
        if self.held_failure is not None and not self.status.terminal:
            faults.fail_held(self)  # every rank is out and no worker was lost
        if self.status is JobStatus.SUSPENDING and all(
                s is ExitStatus.SUSPENDED for s in self.exited.values()):
            self._transition(JobStatus.SUSPENDED,
                             reason=self.leave_reason or "suspended: resume() to continue")
            self._out.append(ev.CloseBoard())
            return  # stays, with its payload, for resume()
        if not self.status.terminal:
            final = JobStatus.STOPPED if self.status is JobStatus.STOPPING else JobStatus.FINISHED
            self._finish(final, reason=self.leave_reason if final is JobStatus.STOPPED else "")
        self._release()

    def _fail(self, err: dict[str, Any]) -> None:
        """The job fails with ``err``; the other ranks are told to stop and will exit."""
        err = anomalies.on_failure(self, err)  # with its diagnosis, when it has one
        rank = "" if err.get("rank") is None else f"rank {err['rank']}: "
        faults.record(self, "failed", f"{rank}{err.get('type')}: {err.get('message')}",
                      rank=err.get("rank"), consequences=err.get("consequences", []))
        self._finish(JobStatus.FAILED, error=err, reason="")
        self._ask(Word.STOP, 1)

    def _finish(self, status: JobStatus, **fields: Any) -> None:
        self._transition(status, ended=self._now, **fields)
        self._release()

    def _release(self) -> None:
        """Once terminal and holding no slot (nobody will report an exit): over."""
        if self.released or self.held or not self.status.terminal:
            return
        self.released = True
        self._out.append(ev.CloseBoard())
        self._out.append(ev.Release(self.result))

    def _free(self, rank: int) -> None:
        if rank in self.held:
            self.held.discard(rank)
            self._out.append(ev.FreeSlot(self.ranks[rank].worker))

    def _ask(self, word: Word, value: int) -> None:
        """Raise one control word and send the vector to every rank still running."""
        self.words[word] = max(self.words[word], value)
        workers = tuple(r.worker for i, r in enumerate(self.ranks) if i not in self.exited)
        if workers:
            self._out.append(ev.SendControl(tuple(self.words), self.attempt, workers))

    def _transition(self, status: JobStatus, **fields: Any) -> None:
        check_transition(self.name, self.status, status)
        self.status = status
        self._out.append(ev.Journal({"status": status.name, **fields}))
        self._out.append(ev.Publish(ev.status_message(status.name, self.attempt)))


_DISPATCH: dict[type, Callable[[Lifecycle, Any], None]] = {
    ev.Allocated: Lifecycle._allocated,
    ev.Started: Lifecycle._started,
    ev.Paused: Lifecycle._paused,
    ev.Resumed: Lifecycle._resumed,
    ev.LoopStarted: Lifecycle._loop_started,
    ev.Restored: Lifecycle._restored,
    ev.CheckpointCommitted: Lifecycle._checkpoint_committed,
    ev.CheckpointFailed: Lifecycle._checkpoint_failed,
    ev.Failed: faults.failed,
    ev.Exited: Lifecycle._exited,
    ev.StartFailed: Lifecycle._start_failed,
    ev.Profiled: profiles.profiled,
    ev.ProfileRequested: profiles.requested,
    ev.WorkerLost: Lifecycle._worker_lost,
    ev.GraceExpired: Lifecycle._grace_expired,
    ev.StopRequested: Lifecycle._stop,
    ev.PauseRequested: Lifecycle._pause,
    ev.PauseWithdrawn: Lifecycle._pause_withdrawn,
    ev.ResumeRequested: Lifecycle._resume,
    ev.CheckpointRequested: Lifecycle._checkpoint,
    ev.SuspendRequested: Lifecycle._suspend,
    ev.SchedulerClosing: Lifecycle._closing,
    ev.HangDetected: hangs.detected,
    ev.Progressed: hangs.progressed,
    ev.StopOverdue: hangs.overdue,
    ev.Preempted: sharing.preempted,
    ev.Reclaimed: sharing.reclaimed,
    ev.Grow: sharing.grow,
    ev.Held: holds.held,
    ev.HoldExpired: holds.expired,
    ev.RestartRequested: holds.restart,
    ev.BreakpointHit: breakpoints.hit,
    ev.ConsoleOutput: breakpoints.output,
    ev.RunRequested: live.run_requested,
    ev.Ran: live.ran,
    ev.UpdateRequested: live.update_requested,
    ev.Updated: live.updated,
    ev.Tunable: live.tunable,
    ev.NonFinite: anomalies.nonfinite,
    ev.LossSpike: anomalies.spike,
}
