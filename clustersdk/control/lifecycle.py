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
  :class:`~.live.LiveRequests` and pulled by the ranks at their next agreed boundary; a
  new gang starts with every change so far (see :mod:`.live`).
- Requests (stop, pause, resume, checkpoint, suspend, profile) check the state first
  and raise :class:`~clustersdk.errors.InvalidTransitionError` (or
  ``SpecError``) before changing anything.
- **Early requests**: a job that is QUEUED or STARTING has no rank at a step boundary
  yet, and what is asked then is kept for its first one. A pause raises the PAUSE word,
  which the gang starts with (or gets, STARTING): every rank waits before its first
  step, and the job goes RUNNING, then PAUSED (``resume`` lets it go, also before it
  started). A checkpoint, ``job.run`` or ``job.update`` is taken at the first boundary
  likewise (an update checked without the ranks' reports, which its ranks then check).
  A suspend of a QUEUED job holds it out of the queue, SUSPENDED with nothing to save
  (``resume`` queues it again); of a STARTING job, it checkpoints at the first boundary
  and gives the slots back. A stop of a QUEUED job dequeues it, STOPPED; of a STARTING
  one, its ranks leave at the first boundary. A script job's ranks accept pause and
  checkpoint only once they opted in, so those wait until it runs.
  Requests not carried out yet are the job's :attr:`Lifecycle.pending` (journaled
  under ``pending``: ``job.info()`` shows them, and a restarted scheduler that takes a
  queued job over asks them again); a new gang (a restart, a preemption's requeue, a
  resume) is asked them again too.

Each concern with rules of its own is an object beside this module that owns its
state (as h11 keeps one small state machine per party): :class:`~.faults.Faults`
(held failures, lost workers, restarts), :class:`~.hangs.Hangs` (HUNG),
:class:`~.holds.Holds` (HELD: ``on_error="hold"``), :class:`~.breakpoints.Breakpoints`
(``ctx.breakpoint()`` and its console), :class:`~.anomalies.Anomalies` (diagnoses,
non-finite losses, spikes), :class:`~.live.LiveRequests` (``job.run``, ``job.update``),
:class:`~.profiling.Profiles` (``job.profile``) and :class:`~.sharing.Sharing`
(preemption, idle reclaim, growing back). The lifecycle composes them: it routes
each event to its handler, hands it the job as a :class:`~.view.JobView` (the facts,
read-only, and a few commands), and is the only writer of the job's status, spec,
gang and control words.

Slots: every rank of an allocated gang is freed exactly once (:class:`FreeSlot`,
on its exit, its worker's loss or its failed start), and a job is released
(:class:`Release`) exactly once, when it is terminal and holds no slot.
Events of an earlier gang start (``attempt``) are ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import EXIT_TYPES, InvalidTransitionError, SpecError, describe
from ..layout import Layout
from ..options import check_world_size
from ..protocol import ExitStatus, WireSpec, Word, no_words
from ..status import EARLY, TRANSITIONS, JobStatus, check_transition
from . import events as ev
from .anomalies import MAX_ROLLBACKS, Anomalies
from .breakpoints import Breakpoints
from .faults import Faults
from .hangs import Hangs
from .holds import Holds
from .live import LiveRequests
from .profiling import Profiles
from .sharing import Sharing


@dataclasses.dataclass
class Gang:
    """One gang start of a job: where its ranks run and what each has said."""

    ranks: tuple[ev.RankSlot, ...] = ()
    held: set[int] = dataclasses.field(default_factory=set)  # ranks whose slot is the job's
    started: set[int] = dataclasses.field(default_factory=set)
    exited: dict[int, ExitStatus] = dataclasses.field(default_factory=dict)
    paused: dict[int, int] = dataclasses.field(default_factory=dict)  # rank -> step it waits at
    pause_asked: int = 0  # the PAUSE word of the owner's newest pause (not a hold's)
    pause_taken: int = 0  # the PAUSE word the job was PAUSED at
    words: list[int] = dataclasses.field(default_factory=no_words)
    result: bytes | None = None  # rank 0's pickled return value
    accepts: dict[int, frozenset[str]] = dataclasses.field(default_factory=dict)  # script ranks


#: What a script job's ranks always accept: signals (see clustersdk.runtime.scripts).
SIGNALLED = ("stop", "suspend")
#: What a script job's ranks may opt into at their step boundaries (clustersdk.script).
STEP_CONTROLS = ("pause", "checkpoint")
#: Requests only a training function's ranks can carry out, and what each is called.
FUNCTION_ONLY: dict[type, str] = {
    ev.RunRequested: "job.run",
    ev.UpdateRequested: "job.update",
    ev.ProfileRequested: "job.profile",
}


class Lifecycle:
    """One job that is not released yet: its state and the rules of its life.

    >>> from clustersdk.control import events as ev
    >>> job = Lifecycle(WireSpec(id="j", name="j", world_size=1), failure_grace=3.0)
    >>> [type(a).__name__ for a in job.handle(ev.Allocated((ev.RankSlot("w", "h", "cpu"),)), 0.0)]
    ['Journal', 'Publish', 'StartGang']
    >>> job.status
    <JobStatus.STARTING: 'starting'>
    """

    def __init__(
        self,
        spec: WireSpec,
        *,
        failure_grace: float,
        max_rollbacks: int = MAX_ROLLBACKS,
        status: JobStatus = JobStatus.QUEUED,
        restarts: int = 0,
        checkpoint: str | None = None,
        checkpoint_step: int | None = None,
        pending: Sequence[Mapping[str, Any]] | None = None,
    ):
        self._spec = spec
        self._status = status
        self._checkpoint, self._checkpoint_step = checkpoint, checkpoint_step  # newest committed
        self.checkpoint_seq = 0  # newest CHECKPOINT request committed
        self.checkpoint_failed_seq = -1  # newest CHECKPOINT request that failed
        self.released = False
        self.gang = Gang()
        self._out: list[ev.Action] = []
        self._now = 0.0
        # the concerns, each with its own state (see the module's docstring)
        self.anomalies = Anomalies(max_rollbacks)
        self.faults = Faults(failure_grace, restarts, self.anomalies)
        self.hangs = Hangs()
        self.holds = Holds(self.faults, self.hangs)
        self.breakpoints = Breakpoints(spec.attempt)
        self.live = LiveRequests()
        self.profiles = Profiles()
        self.sharing = Sharing()
        self._dispatch: dict[type, Callable[[Any], None]] = {
            ev.Allocated: self._allocated,
            ev.Started: self._started,
            ev.Paused: self._paused,
            ev.Resumed: self._resumed,
            ev.LoopStarted: self._loop_started,
            ev.Restored: self._restored,
            ev.CheckpointCommitted: self._checkpoint_committed,
            ev.CheckpointFailed: self._checkpoint_failed,
            ev.Failed: self._failed,
            ev.Exited: self._exited,
            ev.Controls: self._controls,
            ev.StartFailed: self._start_failed,
            ev.WorkerLost: self._worker_lost,
            ev.GraceExpired: self._grace_expired,
            ev.StopRequested: self._stop,
            ev.PauseRequested: self._pause,
            ev.PauseWithdrawn: self._pause_withdrawn,
            ev.ResumeRequested: self._resume,
            ev.CheckpointRequested: self._checkpoint_requested,
            ev.SuspendRequested: self._suspend,
            ev.SchedulerClosing: self._closing,
            ev.Profiled: self._to(self.profiles.profiled),
            ev.ProfileRequested: self._to(self.profiles.requested),
            ev.HangDetected: self._to(self.hangs.detected),
            ev.Progressed: self._to(self.hangs.progressed),
            ev.StopOverdue: self._to(self.hangs.overdue),
            ev.Preempted: self._to(self.sharing.preempt),
            ev.Reclaimed: self._to(self.sharing.reclaim),
            ev.Grow: self._to(self.sharing.grow),
            ev.Held: self._to(self.holds.held),
            ev.HoldExpired: self._to(self.holds.expired),
            ev.RestartRequested: self._to(self.holds.restart),
            ev.BreakpointHit: self._to(self.breakpoints.hit),
            ev.ConsoleOutput: self._to(self.breakpoints.output),
            ev.RunRequested: self._to(self.live.run_requested),
            ev.Ran: self._to(self.live.ran),
            ev.UpdateRequested: self._to(self.live.update_requested),
            ev.Updated: self._to(self.live.updated),
            ev.Tunable: self._to(self.live.tunable),
            ev.NonFinite: self._to(self.anomalies.nonfinite),
            ev.LossSpike: self._to(self.anomalies.spike),
        }
        self._ask_again(pending or ())  # what an earlier scheduler had kept for it
        self._journaled_pending = self.pending

    def _to(self, handler: Callable[[Lifecycle, Any], None]) -> Callable[[Any], None]:
        return lambda event: handler(self, event)

    # --- the facts (a JobView) ---------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._spec.id

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def spec(self) -> WireSpec:
        return self._spec

    @property
    def status(self) -> JobStatus:
        return self._status

    @property
    def attempt(self) -> int:
        return self._spec.attempt

    @property
    def world_size(self) -> int:
        return self._spec.world_size

    @property
    def now(self) -> float:
        return self._now

    @property
    def ranks(self) -> tuple[ev.RankSlot, ...]:
        return self.gang.ranks

    @property
    def held(self) -> frozenset[int]:
        """The ranks of the gang whose slot is still the job's."""
        return frozenset(self.gang.held)

    @property
    def exited(self) -> Mapping[int, ExitStatus]:
        return self.gang.exited

    @property
    def words(self) -> Sequence[int]:
        return tuple(self.gang.words)

    @property
    def checkpoint(self) -> str | None:
        return self._checkpoint

    @property
    def checkpoint_step(self) -> int | None:
        return self._checkpoint_step

    @property
    def resume_point(self) -> str | None:
        return self._checkpoint or self._spec.resume

    @property
    def held_ranks(self) -> list[int]:
        return self.holds.ranks

    @property
    def controls(self) -> frozenset[str]:
        """What the ranks of a script job accept: stop and suspend (signals), and what every
        rank opted into at its step boundaries; a function job's accept everything."""
        if self._spec.kind != "script":
            return frozenset(SIGNALLED + STEP_CONTROLS)
        accepts = self.gang.accepts
        opted = (
            frozenset.intersection(*accepts.values())
            if len(accepts) == self.world_size
            else frozenset()
        )
        return frozenset(SIGNALLED) | (opted & frozenset(STEP_CONTROLS))

    @property
    def restarts(self) -> int:
        """Gang restarts used (of ``spec.max_restarts``)."""
        return self.faults.restarts

    @property
    def pause_pending(self) -> bool:
        """A pause was asked (``job.pause()``, not a hold's) and the job has not been PAUSED
        at it, nor resumed, yet."""
        gang = self.gang
        return not self._status.terminal and gang.pause_asked > max(
            gang.words[Word.RESUME], gang.pause_taken
        )

    @property
    def checkpoint_pending(self) -> int:
        """The CHECKPOINT request not committed (nor failed) yet; 0: none."""
        seq = self.gang.words[Word.CHECKPOINT]
        done = max(self.checkpoint_seq, self.checkpoint_failed_seq)
        return seq if seq > done and not self._status.terminal else 0

    @property
    def pending(self) -> list[dict[str, Any]]:
        """The requests accepted and not carried out by the ranks yet, oldest kind first:
        ``{"op": "pause"}``, ``{"op": "checkpoint", "seq": n}``, and job.update's and
        job.run's (see :meth:`.live.LiveRequests.waiting`)."""
        if self._status.terminal:
            return []
        out: list[dict[str, Any]] = []
        if self.pause_pending:
            out.append({"op": "pause"})
        if self.checkpoint_pending:
            out.append({"op": "checkpoint", "seq": self.checkpoint_pending})
        return out + self.live.waiting(self.attempt)

    # --- the one entry point --------------------------------------------------------------
    def handle(self, event: ev.Event, now: float) -> list[ev.Action]:
        """Apply ``event`` (at time ``now``); return the actions, in order.

        Requests that make no sense in the current state raise before anything
        changes. A released job, or a rank event of another attempt, yields nothing.
        """
        if self.released:
            return []
        if isinstance(event, ev.RankEventBase) and event.attempt != self.attempt:
            return []
        if type(event) in FUNCTION_ONLY and self._spec.kind == "script":
            raise SpecError(
                f"job {self.name!r} runs {self._spec.fn} as a script: "
                f"{FUNCTION_ONLY[type(event)]} needs a training function's ranks "
                "(cluster.launch)"
            )
        self._out, self._now = [], now
        self._dispatch[type(event)](event)
        self._note_pending()
        return self._out

    def _note_pending(self) -> None:
        """Journal :attr:`pending` when it changed (``job.info()`` shows it; a restarted
        scheduler asks it again), with the event's own record change when it has one."""
        pending = self.pending
        if pending == self._journaled_pending:
            return
        self._journaled_pending = pending
        for i in reversed(range(len(self._out))):
            action = self._out[i]
            if isinstance(action, ev.Journal):
                self._out[i] = ev.Journal({**action.fields, "pending": pending})
                return
        self._out.append(ev.Journal({"pending": pending}))

    # --- the commands (a JobView) ------------------------------------------------------------
    def transition(self, status: JobStatus, **fields: Any) -> None:
        check_transition(self.name, self._status, status)
        self._status = status
        self._out.append(ev.Journal({"status": status.name, **fields}))
        self._out.append(ev.Publish(ev.status_message(status.name, self.attempt)))

    def ask(self, word: Word, value: int) -> None:
        words = self.gang.words
        words[word] = max(words[word], value)
        workers = tuple(
            r.worker for i, r in enumerate(self.gang.ranks) if i not in self.gang.exited
        )
        if workers:
            self._out.append(ev.SendControl(tuple(words), self.attempt, workers))

    def pause(self) -> None:
        words = self.gang.words
        if words[Word.PAUSE] <= words[Word.RESUME]:
            self.gang.paused.clear()
            self.ask(Word.PAUSE, words[Word.RESUME] + 1)

    def emit(self, *actions: ev.Action) -> None:
        self._out.extend(actions)

    def record(self, kind: str, message: str, **data: Any) -> None:
        self._out.append(ev.Record(kind, message, data))

    def fail(self, err: dict[str, Any]) -> None:
        err = self.anomalies.on_failure(self, err)  # with its diagnosis, when it has one
        rank = "" if err.get("rank") is None else f"rank {err['rank']}: "
        what = (  # a process that died: "rank 1 (host h, CPU) died of SIGSEGV (signal 11)"
            describe(err)
            if err.get("type") in EXIT_TYPES
            else f"{rank}{err.get('type')}: {err.get('message')}"
        )
        self.record(
            "failed",
            what,
            rank=err.get("rank"),
            consequences=err.get("consequences", []),
        )
        self._finish(JobStatus.FAILED, error=err, reason="")
        self.ask(Word.STOP, 1)

    def lose(
        self, rank: int | None, exc_type: str, message: str, facts: dict[str, Any] | None = None
    ) -> None:
        if self._status is JobStatus.HELD:
            self.holds.lost(self, rank, exc_type, message, facts)
        else:
            self.faults.lost(self, rank, exc_type, message, facts)

    def end_ranks(self, ranks: Sequence[int], status: ExitStatus) -> None:
        for rank in ranks:
            self.gang.exited[rank] = status
            self._free(rank)
        self._maybe_done()

    def replace_spec(self, **changes: Any) -> None:
        self._spec = self._spec.replace(**changes)
        self._out.append(ev.Journal({"spec": self._spec.as_dict()}))

    def requeue(
        self,
        reason: str,
        *,
        front: bool = False,
        paused: bool = False,
        world_size: int | None = None,
    ) -> None:
        resume = self.resume_point
        # the history goes on from where the new run begins (its Restored event trims
        # it again if an explicit resume= loads an older step; a checkpoint of unknown step
        # leaves it whole)
        step = self._checkpoint_step if self._checkpoint else 0
        if step is not None:
            self._out.append(ev.TruncateHistory(step))
        paused = paused or self.pause_pending  # asked before the gang reached a boundary
        checkpoint = self.checkpoint_pending
        self._new_gang()
        changes: dict[str, Any] = {"resume": resume, "attempt": self.attempt + 1}
        if world_size:
            changes.update(world_size=world_size, asked_world_size=None)
        self.replace_spec(**changes)
        self._carry(paused, checkpoint)
        self.transition(JobStatus.QUEUED, reason=reason)
        self._out.append(ev.Enqueue(front=front))

    # --- the gang ----------------------------------------------------------------------
    def _new_gang(self) -> None:
        self.gang = Gang()
        self.faults.new_gang()
        self.holds.new_gang()

    def _carry(self, paused: bool, checkpoint: int) -> None:
        """The new gang starts with the old one's pause and checkpoint not carried out
        (its job.run and job.update requests: see :meth:`.live.LiveRequests.gang_started`)."""
        if paused:
            self.gang.words[Word.PAUSE] = self.gang.pause_asked = 1
        self.gang.words[Word.CHECKPOINT] = checkpoint

    def _ask_again(self, pending: Sequence[Mapping[str, Any]]) -> None:
        """The requests a job's record kept (:attr:`pending`), asked of its next gang: a
        restarted scheduler took it over. A job.run's function was kept in memory only."""
        ops = {p.get("op") for p in pending}
        self._carry("pause" in ops and self._status is JobStatus.QUEUED, int("checkpoint" in ops))
        for p in pending:
            if p.get("op") == "update" and p.get("changes"):
                self.gang.words[Word.UPDATE] = self.live.ask_update(
                    dict(p["changes"]), now=self._now, attempt=self.attempt
                )

    def _allocated(self, e: ev.Allocated) -> None:
        asked = self._spec.asked_world_size or self.world_size
        n = len(e.ranks)
        if n != self.world_size:  # the policy started it on fewer (min_world_size), or all again
            self.record(
                "resized",
                f"started on {n} of the {asked} ranks asked for (min_world_size allows it)"
                if n < asked
                else f"back on all {asked} ranks asked for",
                world_size=n,
                was=self.world_size,
                asked=asked,
            )
            self.replace_spec(world_size=n, asked_world_size=asked if n < asked else None)
        gang = self.gang
        gang.ranks = e.ranks
        gang.held = set(range(len(e.ranks)))
        ranks = [
            {"rank": i, "worker": r.worker, "host": r.host, "device": r.device}
            for i, r in enumerate(e.ranks)
        ]
        controls = {"controls": list(SIGNALLED)} if self._spec.kind == "script" else {}
        self.transition(JobStatus.STARTING, ranks=ranks, reason="", **controls)
        # job.update's changes so far go along, and the job.run requests no rank took
        run, update = self.live.gang_started(self.attempt, n)
        gang.words[Word.RUN] = max(gang.words[Word.RUN], run)
        gang.words[Word.UPDATE] = max(gang.words[Word.UPDATE], update)
        self._out.append(ev.StartGang(self.attempt, tuple(gang.words)))

    def _started(self, e: ev.Started) -> None:
        self.gang.started.add(e.rank)
        self.anomalies.started(self, e)
        if self._status is JobStatus.STARTING and len(self.gang.started) == self.world_size:
            self.transition(JobStatus.RUNNING, started=self._now, reason="")
            self.breakpoints.started(self)  # a breakpoint a rank reached already
            self._maybe_paused()  # a pause asked early: its ranks may all wait already

    def _controls(self, e: ev.Controls) -> None:
        before = self.controls
        self.gang.accepts[e.rank] = frozenset(e.accepts)
        if self.controls != before:
            controls = sorted(self.controls)
            self._out.append(ev.Journal({"controls": controls}))
            self._out.append(ev.Publish({"kind": "controls", "controls": controls}))

    def _paused(self, e: ev.Paused) -> None:
        self.gang.paused[e.rank] = e.step
        self._maybe_paused()

    def _maybe_paused(self) -> None:
        gang = self.gang
        if self._status is JobStatus.RUNNING and len(gang.paused) == self.world_size:
            gang.pause_taken = gang.words[Word.PAUSE]
            self.transition(JobStatus.PAUSED, paused_at=max(gang.paused.values()))

    def _resumed(self, e: ev.Resumed) -> None:
        self.gang.paused.pop(e.rank, None)

    def _loop_started(self, e: ev.LoopStarted) -> None:
        self._out.append(ev.Journal({"total_steps": e.total_steps}))
        self._out.append(ev.Publish({"kind": "progress", "total_steps": e.total_steps}))

    def _restored(self, e: ev.Restored) -> None:
        # the history goes on from the checkpoint's step: rows logged after it
        # (by a run that died before its next checkpoint) are replaced
        self._out.append(ev.TruncateHistory(e.step))

    def _checkpoint_committed(self, e: ev.CheckpointCommitted) -> None:
        self.checkpoint_seq = max(self.checkpoint_seq, e.seq)
        self._checkpoint, self._checkpoint_step = e.path, e.step
        self._out.append(
            ev.Journal({"checkpoint": e.path, "checkpoint_step": e.step, "checkpoint_error": None})
        )
        self._out.append(ev.Publish({"kind": "checkpoint", "path": e.path, "step": e.step}))

    def _checkpoint_failed(self, e: ev.CheckpointFailed) -> None:
        self.checkpoint_failed_seq = max(self.checkpoint_failed_seq, e.seq)
        self._out.append(ev.Journal({"checkpoint_error": f"step {e.step}: {e.message}"}))
        self._out.append(
            ev.Publish({"kind": "checkpoint_failed", "step": e.step, "message": e.message})
        )

    def _failed(self, e: ev.Failed) -> None:
        if self._status is JobStatus.HELD:  # a peer of a held rank failed outright
            self.holds.failed(self, e)
        else:
            self.faults.failed(self, e)

    def _exited(self, e: ev.Exited) -> None:
        self.gang.exited[e.rank] = e.status
        if e.rank == 0 and e.result is not None:
            self.gang.result = e.result
        self._free(e.rank)
        self._maybe_done()

    def _start_failed(self, e: ev.StartFailed) -> None:
        if e.rank >= len(self.gang.ranks):
            return  # not a rank of this gang
        self._free(e.rank)  # it never reports an exit; the ranks that did start will
        self.gang.exited.setdefault(e.rank, ExitStatus.NOT_STARTED)
        if self._status is not JobStatus.RESTARTING:
            worker = self.gang.ranks[e.rank].worker
            self.lose(
                e.rank, e.exc_type, f"could not start rank {e.rank} on worker {worker}: {e.message}"
            )
        self._maybe_done()

    def _worker_lost(self, e: ev.WorkerLost) -> None:
        if e.rank not in self.gang.held:
            return
        self.gang.exited[e.rank] = ExitStatus.LOST
        self._free(e.rank)
        self.lose(
            e.rank,
            "WorkerLost",
            f"worker {e.worker} (host {e.host}) of rank {e.rank} left the cluster",
            facts=e.facts,
        )
        self._maybe_done()

    def _grace_expired(self, e: ev.GraceExpired) -> None:
        """No worker of the job was lost after all: the held-back failure is the job's."""
        if self.faults.grace_expired(self, e):
            self._maybe_done()

    # --- requests -------------------------------------------------------------------------
    def _stop(self, e: ev.StopRequested) -> None:
        status = self._status
        if status.terminal:
            raise InvalidTransitionError(
                f"job {self.name!r} is {status.name}; there is nothing to stop"
            )
        if status in (JobStatus.QUEUED, JobStatus.SUSPENDED):
            if status is JobStatus.QUEUED:
                self._out.append(ev.Dequeue())
            self._finish(JobStatus.STOPPED, reason=f"stopped while {status.name}")
        elif status is not JobStatus.STOPPING:  # a RESTARTING job then stops for good
            self.sharing.stopped_by_user()  # the user's stop wins over a preemption
            self.transition(JobStatus.STOPPING, reason="stop requested")
            self.ask(Word.STOP, 1)
            if status is JobStatus.HUNG:
                self.hangs.stopping(self)
            elif status is JobStatus.HELD:
                self.holds.stopping(self)

    def _pause(self, e: ev.PauseRequested) -> None:
        if self._status not in EARLY:  # an early one: PAUSED once its ranks wait at step one
            check_transition(self.name, self._status, JobStatus.PAUSED)
        self._need_control("pause")
        self.pause()
        self.gang.pause_asked = self.gang.words[Word.PAUSE]

    def _pause_withdrawn(self, e: ev.PauseWithdrawn) -> None:
        if self._status in (JobStatus.STARTING, JobStatus.RUNNING) and self.pause_pending:
            self.ask(Word.RESUME, self.gang.words[Word.PAUSE])

    def _resume(self, e: ev.ResumeRequested) -> None:
        if self._status is JobStatus.PAUSED:
            self._same_world_size(e.world_size)
            self.transition(JobStatus.RUNNING, reason="")
            self.ask(Word.RESUME, self.gang.words[Word.PAUSE])
            self.breakpoints.resumed(self)  # a breakpoint's sessions continue too
        elif self._status is JobStatus.SUSPENDED:
            ws = check_world_size(self.world_size if e.world_size is None else e.world_size)
            Layout.resolve(self._spec.strategy, self._spec.mesh, ws)  # a mesh that fits ws
            checkpoint = self.checkpoint_pending  # asked while QUEUED, before its suspend
            self._new_gang()
            self.replace_spec(
                world_size=ws,
                resume=self.resume_point,  # suspended while QUEUED: as it was (spec.resume)
                attempt=self.attempt + 1,
                asked_world_size=None,
            )
            self._carry(False, checkpoint)  # the resume lets a pending pause go
            self.transition(JobStatus.QUEUED, reason="")
            self._out.append(ev.Enqueue())
        elif self.pause_pending and self._status in (*EARLY, JobStatus.RUNNING):
            # a pause not in force yet (asked before the job reached a step boundary)
            self._same_world_size(e.world_size)
            self.ask(Word.RESUME, self.gang.words[Word.PAUSE])
        else:
            raise InvalidTransitionError(
                f"job {self.name!r} is {self._status.name}; only a PAUSED or SUSPENDED job can "
                "be resumed (or one whose pause is still pending)"
            )

    def _same_world_size(self, world_size: int | None) -> None:
        if world_size not in (None, self.world_size):
            raise SpecError(
                f"job {self.name!r} is {self._status.name} and keeps its process group of "
                f"{self.world_size} ranks; to resume at world_size={world_size}, suspend "
                "it first"
            )

    def _checkpoint_requested(self, e: ev.CheckpointRequested) -> None:
        if self._spec.kind == "script":  # the script saves where it likes (its own format)
            self._need_control("checkpoint")
            if self._status is JobStatus.PAUSED:  # its code runs on after a boundary
                raise InvalidTransitionError(
                    f"job {self.name!r} is PAUSED inside its script's step boundary, and a "
                    "script saves after the boundary returns: resume it first (or suspend it, "
                    "which saves and frees the slots)"
                )
        else:
            self._need_checkpoint_dir("checkpoint")
        if self._status not in (*EARLY, JobStatus.RUNNING, JobStatus.PAUSED):
            raise InvalidTransitionError(
                f"job {self.name!r} is {self._status.name}; a checkpoint needs a QUEUED, "
                "STARTING, RUNNING or PAUSED job"
            )
        # numbered on from every request so far: a new gang's words start at 0 again
        done = max(self.checkpoint_seq, self.checkpoint_failed_seq)
        self.ask(Word.CHECKPOINT, max(self.gang.words[Word.CHECKPOINT], done) + 1)

    def _suspend(self, e: ev.SuspendRequested) -> None:
        if self._spec.kind != "script":  # a script saves on SIGTERM, where it likes
            self._need_checkpoint_dir("suspend")
        if self._status is JobStatus.QUEUED:  # nothing ran since its last checkpoint
            self._out.append(ev.Dequeue())
            self.gang.words[Word.RESUME] = self.gang.words[Word.PAUSE]  # resume lets it go
            self.transition(
                JobStatus.SUSPENDED, reason="suspended while QUEUED: resume() to queue it again"
            )
            return
        check_transition(self.name, self._status, JobStatus.SUSPENDING)
        self.transition(JobStatus.SUSPENDING, reason="suspend requested")
        self.ask(Word.SUSPEND, 1)

    def _closing(self, e: ev.SchedulerClosing) -> None:
        # a SUSPENDED job keeps its record and checkpoint (resume="auto" finds it), and
        # so does a QUEUED one: a scheduler restarted at the same address takes both over
        if self._status is JobStatus.QUEUED:
            self._out.append(
                ev.Journal(
                    {
                        "reason": (
                            "the scheduler shut down before the job started; a scheduler restarted at "
                            "the same address with the same state directory queues it again"
                        )
                    }
                )
            )
        elif JobStatus.FAILED in TRANSITIONS[self._status]:
            self._finish(
                JobStatus.FAILED,
                error=ev.error_record(
                    None, "SchedulerClosed", "the Dask scheduler shut down while the job was active"
                ),
            )

    def _need_control(self, action: str) -> None:
        """A script job's ranks must have opted into ``action`` at their step boundaries."""
        if action in self.controls:
            return
        if self._status in EARLY:
            raise InvalidTransitionError(
                f"job {self.name!r} is {self._status.name} and runs {self._spec.fn} as a "
                f"script, whose ranks accept {action} requests only once each has opted in "
                "at its first clustersdk.script.step(): ask again when it is RUNNING"
            )
        if self._status in (JobStatus.RUNNING, JobStatus.PAUSED):
            raise InvalidTransitionError(
                f"job {self.name!r} runs {self._spec.fn} as a script that does not accept "
                f"{action} requests: every rank must call clustersdk.script.step()"
                + (" with saves=True (and save when it says so)" if action == "checkpoint" else "")
                + " (or use ClusterSDKCallback in a Hugging Face Trainer)"
            )

    def _need_checkpoint_dir(self, action: str) -> None:
        if not self._spec.checkpoint_dir:
            raise SpecError(
                f"job {self.name!r} has no checkpoint_dir, so it cannot {action}; "
                "launch it with checkpoint_dir=..."
            )

    # --- how a gang ends -------------------------------------------------------------------
    def _maybe_done(self) -> None:
        exited = self.gang.exited
        if len(exited) < self.world_size:
            return
        if self._status is JobStatus.RESTARTING:
            self.faults.restart(self)
            return
        if self.sharing.comes_back(self):
            self.sharing.requeue(self)
            return
        if self.faults.cause is not None and not self._status.terminal:
            self.faults.fail_held(self)  # every rank is out and no worker was lost
            # a script's exit, within max_restarts (fail_held changed the status: mypy keeps
            # its narrowing across the call)
            if self._status is JobStatus.RESTARTING:  # type: ignore[comparison-overlap]
                self.faults.restart(self)
                return
        if self._status is JobStatus.SUSPENDING and all(
            s is ExitStatus.SUSPENDED for s in exited.values()
        ):
            self.transition(
                JobStatus.SUSPENDED,
                reason=self.sharing.leave_reason or "suspended: resume() to continue",
            )
            self._out.append(ev.CloseBoard())
            return  # stays, with its payload, for resume()
        if not self._status.terminal:
            final = JobStatus.STOPPED if self._status is JobStatus.STOPPING else JobStatus.FINISHED
            self._finish(
                final, reason=self.sharing.leave_reason if final is JobStatus.STOPPED else ""
            )
        self._release()

    def _finish(self, status: JobStatus, **fields: Any) -> None:
        self.transition(status, ended=self._now, **fields)
        self._release()

    def _release(self) -> None:
        """Once terminal and holding no slot (nobody will report an exit): over."""
        if self.released or self.gang.held or not self._status.terminal:
            return
        self.released = True
        self._out.append(ev.CloseBoard())
        self._out.append(ev.Release(self.gang.result))

    def _free(self, rank: int) -> None:
        if rank in self.gang.held:
            self.gang.held.discard(rank)
            self._out.append(ev.FreeSlot(self.gang.ranks[rank].worker))
