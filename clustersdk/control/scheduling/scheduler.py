"""The scheduler the control plane keeps: its state, the events that change it, decide().

The plugin reports what happens (a slot comes or goes, a job is submitted,
makes progress, pauses, checkpoints, releases its slots) and calls
:meth:`Scheduler.decide` after each event and on a timer. ``decide`` returns
what to do and applies it to its own state at once: a started job holds its
slots, a victim is marked as leaving. The plugin carries the decision out and
reports back with the same events (``released`` when a victim's ranks are gone).

>>> s = Scheduler(slots=[Slot(f"w{i}", "h", "cpu", -1) for i in range(2)])
>>> s.submit(Request("a", world_size=2))
>>> [start.job for start in s.decide(now=0.0).start]
['a']
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from ...errors import InvalidTransitionError, JobNotFoundError, SpecError
from .arrival import arrive, valid_until
from .backlog import Backlog
from .config import PolicyConfig
from .ledger import Ledger
from .model import ACTIVE, ClusterState, Decision, Holding, Request, Slot, Wait
from .planner import Pass


class Scheduler:
    """Inventory, queue and holdings, kept in the order decisions need them."""

    def __init__(
        self, config: PolicyConfig | Mapping[str, Any] | None = None, slots: Iterable[Slot] = ()
    ) -> None:
        self.config = config if isinstance(config, PolicyConfig) else PolicyConfig.from_dict(config)
        self.inventory: dict[str, Slot] = {}
        self._held: dict[str, str] = {}  # worker -> the job holding its slot
        self._ledger: Ledger | None = None  # counts of the holdings (None: to redo)
        self.claims: dict[str, frozenset[str]] = {}  # waiting job -> freed slots it is owed
        self._free: set[str] = set()  # workers in the inventory nobody holds
        self.backlog = Backlog()
        self.holdings: dict[str, Holding] = {}
        self.waits: Mapping[str, Wait] = {}  # the newest wait of every queued job
        self._intern: dict[Wait, Wait] = {}  # one object per distinct wait, kept
        # The last pass, while it still stands for the state: its decision had nothing to
        # carry out and only submissions (or progress) came since. See .arrival.
        self._base: Pass | None = None
        self._base_until = 0.0
        self._arrivals: list[Request] = []
        self._idle_at = -math.inf  # no idle timeout falls before (a bound)
        self.answered_by = ""  # how the last decision was made (for telling)
        self._seq = 0
        for slot in slots:
            self.add_slot(slot)

    # building from, and giving, a whole state ----------------------------------------
    @classmethod
    def from_state(cls, state: ClusterState) -> Scheduler:
        """A scheduler holding ``state`` (e.g. rebuilt from the journal after a restart)."""
        s = cls(state.config, state.slots)
        for h in state.holdings:
            s._hold(dataclasses.replace(h))
            s._seq = max(s._seq, h.request.seq)
        for req in state.queued:
            s.submit(req)
        s.claims = {job: frozenset(w) for job, w in state.claims.items()}
        return s

    def state(self) -> ClusterState:
        """A snapshot: what ``decide(state, now)`` would take (and the journal keeps)."""
        return ClusterState(
            slots=list(self.inventory.values()),
            queued=list(self.backlog),
            holdings=[dataclasses.replace(h) for h in self.holdings.values()],
            config=self.config,
            claims=dict(self.claims),
        )

    @property
    def settled(self) -> bool:
        """Whether the last pass still stands for the state: its decision had nothing to
        carry out and nothing but submissions and progress came since (a tick, or one
        arrival, is then answered from it; see :mod:`.arrival`)."""
        return self._base is not None

    @property
    def queued(self) -> Mapping[str, Request]:
        """The queued requests by job id."""
        return self.backlog.by_id

    def next_seq(self) -> int:
        """A submission number after every one seen (for ``Request.seq``)."""
        self._seq += 1
        return self._seq

    # events: inventory and configuration ----------------------------------------------
    def add_slot(self, slot: Slot) -> None:
        self._base = self._ledger = None  # a queue's "rest" guarantee depends on the total
        self.inventory[slot.worker] = slot
        if slot.worker not in self._held:
            self._free.add(slot.worker)

    def remove_slot(self, worker: str) -> str | None:
        """The worker left; returns the job that held its slot (the plugin deals with it)."""
        self._base = self._ledger = None
        self.inventory.pop(worker, None)
        self._free.discard(worker)
        return self._held.get(worker)

    def configure(self, config: PolicyConfig | Mapping[str, Any]) -> PolicyConfig:
        """An admin's new settings (a PolicyConfig, or changes merged into the current
        ones). Running jobs are never stopped by it: over a lowered quota they finish,
        or are preempted by the rules; a queue still in use can't be removed."""
        new = config if isinstance(config, PolicyConfig) else self.config.updated(config)
        using = set(self.backlog.streams) | {h.request.queue for h in self.holdings.values()}
        gone = sorted(q for q in using if q not in new.queues)
        if gone:
            raise SpecError(
                f"queue(s) {', '.join(repr(q) for q in gone)} still have jobs; let "
                "them finish (or stop them) before removing the queue"
            )
        self.config, self._base, self._ledger = new, None, None
        self._idle_at = -math.inf
        return new

    # events: jobs -------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """Queue a job (again, after a preemption: with its own ``seq``, so in its place)."""
        if req.id in self.backlog or req.id in self.holdings:
            raise InvalidTransitionError(
                f"job {req.id!r} is already "
                f"{'queued' if req.id in self.backlog else 'holding slots'}"
            )
        self.backlog.add(req)
        self._arrivals.append(req)
        self._seq = max(self._seq, req.seq)

    def cancel(self, job: str) -> Request:
        """Take a queued job off the queue (stopped before it started)."""
        if job not in self.backlog:
            raise JobNotFoundError(f"no queued job {job!r}")
        self._base = None
        self.claims.pop(job, None)
        return self.backlog.remove(job)

    def progress(
        self,
        job: str,
        now: float,
        step: int | None = None,
        steps_since_checkpoint: int | None = None,
    ) -> None:
        """Its ranks finished a step (telemetry: the step and the time)."""
        h = self._holding(job)
        h.last_progress = now
        if step is not None:
            if h.steps_since_checkpoint is not None:
                h.steps_since_checkpoint += max(0, step - h.step)
            h.step = step
        if steps_since_checkpoint is not None:
            h.steps_since_checkpoint = steps_since_checkpoint

    def checkpointed(
        self, job: str, now: float, step: int | None = None, state_bytes: int | None = None
    ) -> None:
        """A checkpoint of it was committed."""
        h = self._holding(job)
        h.checkpoint_at, h.steps_since_checkpoint = now, 0
        if step is not None:
            h.step = step
        if state_bytes is not None:
            h.state_bytes = state_bytes

    def paused(self, job: str, now: float) -> None:
        h = self._holding(job)
        if h.status == "running":
            h.status, h.paused_since = "paused", now

    def resumed(self, job: str, now: float) -> None:
        h = self._holding(job)
        if h.status == "paused":
            h.status, h.paused_since, h.last_progress = "running", None, now

    def suspending(self, job: str, now: float) -> None:
        """The user asked it to suspend (it will not come back to the queue by itself)."""
        h = self._holding(job)
        if h.status in ACTIVE:
            h.status, h.requeue = "suspending", False
            self._base = None
            if self._ledger is not None:
                self._ledger.leave(h)

    def released(self, job: str, now: float, requeue: bool | None = None) -> Request | None:
        """Its ranks are gone and its slots free (it finished, failed, stopped, suspended).
        A job the policy preempted goes back in the queue in its old place
        (``requeue=None``); the request queued again is returned."""
        h = self.holdings.pop(job, None)
        if h is None:
            raise JobNotFoundError(f"job {job!r} holds no slots")
        self._base = None
        if self._ledger is not None:
            self._ledger.release(h)
        for slot in h.slots:
            if self._held.get(slot.worker) == job:
                del self._held[slot.worker]
                if slot.worker in self.inventory:
                    self._free.add(slot.worker)
        owed = h.preempted_for
        if owed is not None and owed in self.backlog:  # the slots it left are that job's
            self.claims[owed] = self.claims.get(owed, frozenset()) | {s.worker for s in h.slots}
        if requeue if requeue is not None else h.requeue:
            self.submit(h.request)
            return h.request
        return None

    # deciding -------------------------------------------------------------------------------
    def decide(self, now: float) -> Decision:
        """What to do now, applied to this scheduler's state."""
        if len(self._intern) > 4 * len(self.backlog) + 1024:
            self._intern = {}  # estimates and reasons age: forget the ones no job has
        arrivals, self._arrivals = self._arrivals, []
        decision = None
        if self._base is not None and self._base.now <= now < self._base_until:
            if not arrivals:  # nothing happened that a pass would see: the same decision
                decision = Decision(
                    waiting=self.waits, reservations=list(self._base.decision.reservations)
                )
                self.answered_by = "the last pass"
            elif len(arrivals) == 1:
                decision = arrive(self._base, arrivals[0], now, self._base_until)
                self.answered_by = "the last pass and the arrival"
        if decision is None:
            self.answered_by = "a whole pass"
            free = [self.inventory[w] for w in self._free]
            if self._ledger is None:
                self._ledger = Ledger(self.config, len(self.inventory), self.holdings.values())
            self._base = Pass(
                self.config,
                self.inventory,
                self.backlog,
                self.holdings,
                now,
                self._intern,
                free,
                self._ledger,
                self.claims,
                self._idle_at,
            )
            decision = self._base.run()
            self._idle_at = self._base.idle_until
            self._base_until = valid_until(self._base)
        self._apply(decision, now)
        if decision:  # it changed what the pass saw: the next decision needs a new pass
            self._base = None
        return decision

    def _apply(self, decision: Decision, now: float) -> None:
        for start in decision.start:
            self._hold(Holding(self.cancel(start.job), start.slots, started_at=now))
        for p in decision.preempt:
            h = self.holdings[p.job]
            if p.overdue:
                h.status = "stopping"
                continue
            h.status = "suspending" if p.how == "suspend" else "stopping"
            h.preempted_for, h.interrupted_at, h.requeue = p.for_job, now, True
            self._leave(h)
        for p in decision.reclaim:
            h = self.holdings[p.job]
            h.status = "suspending" if p.how == "suspend" else "stopping"
            h.preempted_for, h.interrupted_at, h.requeue = None, now, False
            self._leave(h)
        self.waits = decision.waiting
        if self.claims:  # a claim lasts while its job waits for its victims
            held = {r.job: r for r in decision.reservations}
            self.claims = {
                job: frozenset(s.worker for s in held[job].slots)
                for job in self.claims
                if job in held and getattr(decision.waiting.get(job), "kind", "") == "preempting"
            }

    def _leave(self, h: Holding) -> None:
        if self._ledger is not None:
            self._ledger.leave(h)

    def _hold(self, h: Holding) -> None:
        self.holdings[h.id] = h
        queue = self.config.queues.get(h.request.queue)
        if queue is not None and queue.idle_timeout is not None:
            since = h.last_progress if h.last_progress is not None else h.started_at
            self._idle_at = min(self._idle_at, since + queue.idle_timeout)
        if self._ledger is not None:
            self._ledger.hold(h)
        for slot in h.slots:
            self._held[slot.worker] = h.id
            self._free.discard(slot.worker)

    def _holding(self, job: str) -> Holding:
        h = self.holdings.get(job)
        if h is None:
            raise JobNotFoundError(f"job {job!r} holds no slots")
        return h


def decide(state: ClusterState, now: float) -> Decision:
    """One decision from a whole state, nothing kept: what the plugin carries out.

    >>> from clustersdk.control.scheduling import PolicyConfig
    >>> state = ClusterState([Slot("w0", "h", "cpu", -1)], [Request("a", 1)], [],
    ...                      PolicyConfig.from_dict({}))
    >>> decide(state, now=0.0).start[0].job
    'a'
    """
    return Pass(
        state.config,
        {s.worker: s for s in state.slots},
        Backlog(state.queued),
        {h.id: h for h in state.holdings},
        now,
        claims=state.claims,
    ).run()
