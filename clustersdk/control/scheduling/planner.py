"""One scheduling pass over the whole queue, in order: the rules of the package docstring.

A :class:`Pass` is built from the inventory, the backlog and the holdings, runs
once, and leaves a :class:`~.model.Decision`. It never touches its inputs; the
:class:`~.scheduler.Scheduler` applies what it decides. Preempting is in
:mod:`.preemption`, a queue's head and its reservation in :mod:`.heads`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence

from . import reasons
from .backlog import Backlog
from .config import PolicyConfig
from .gangs import FreeSlots, rank_order
from .heads import blocked
from .ledger import Ledger
from .model import (
    ACTIVE,
    Decision,
    Holding,
    How,
    Key,
    Preempt,
    Request,
    Reservation,
    Slot,
    Start,
    Wait,
)
from .preemption import preempt_for
from .quota import Block
from .slot_holds import GiveUp, Hold
from .waits import Waits


class Pass:
    """Decide, once, for every queued job of ``backlog``, in order."""

    def __init__(
        self,
        config: PolicyConfig,
        inventory: Mapping[str, Slot],
        backlog: Backlog,
        holdings: Mapping[str, Holding],
        now: float,
        intern: dict[Wait, Wait] | None = None,
        free: Iterable[Slot] | None = None,
        ledger: Ledger | None = None,
        claims: Mapping[str, Iterable[str]] | None = None,
        idle_at: float = -math.inf,
    ) -> None:
        """``free`` and ``ledger``, when the caller keeps them, save counting the holdings;
        ``claims`` (job -> workers) are the freed slots of victims a waiting job is owed;
        ``idle_at``: no job can pass an idle timeout before then (a bound kept by the
        caller from the previous pass's ``idle_until``)."""
        self.config, self.now, self.inventory = config, now, inventory
        self.backlog, self.holdings = backlog, holdings
        self.intern = {} if intern is None else intern  # one object per distinct Wait
        self.grace = config.preemption_grace
        if ledger is None:
            ledger = Ledger(config, len(inventory), holdings.values())
        self.ledger = ledger  # read only: its release order
        self.usage = ledger.usage.copy()
        self.victims = ledger.candidates.copy(now)  # .taken: victims, reclaimed
        self.leaving = sorted(ledger.leaving.values(), key=lambda h: h.id)  # same either way
        if free is None:  # the slots of the inventory no holding has
            held = {s.worker for h in holdings.values() for s in h.slots}
            free = (s for w, s in inventory.items() if w not in held)
        self.free = FreeSlots(free)
        self.decision = Decision()
        self.waiting: dict[str, Wait] = {}
        self.skipped: list[list[Request]] = []  # tails of queues nothing could change
        self.holds: list[Hold] = []
        self.open_holds: list[Hold] = []  # holds that still have free slots
        self.held_by: dict[str, Hold] = {}  # worker of a held free slot -> its hold
        self.heads: dict[str, Hold] = {}  # queue -> the hold of its first blocked job
        self.incoming = self._incoming()  # waiting job -> victims leaving for it
        self.promised = {h.id for hs in self.incoming.values() for h in hs}  # slots go to a job
        self.claims: dict[str, Hold] = {}  # waiting job -> the freed slots it is owed
        for job, workers in (claims or {}).items():
            self._claim(job, workers)
        self._awaited: dict[str, int] = {}  # queue -> its jobs that victims left for
        for job in set(self.incoming) | set(self.claims):
            queue = backlog.by_id[job].queue
            self._awaited[queue] = self._awaited.get(queue, 0) + 1
        self.reclaimed: list[Holding] = []  # asked to leave for idleness, this pass
        self.idle_until = idle_at  # the next idle timeout, at the earliest
        self.failed: set[tuple[object, ...]] = set()  # preemption searches that found nothing
        # Jobs that wait alike, in a state nothing changed since, wait alike again: the
        # wait of a job that only waits is kept per kind of job, with the versions of the
        # parts of the state it read (slots and holds, victims, its queue's and owner's use).
        self.slots_version = 0
        self.changes = 0  # bumps with every change a later job may see
        self._memo: dict[tuple[object, ...], tuple[tuple[int, int, int, int], Wait]] = {}
        self._behind: dict[int, Wait] = {}
        self._cohorts = len({q.cohort for q in config.queues.values()})
        # (round, key) of the last job that changed it
        self.last_change: tuple[int, Key] | tuple[()] = ()
        self.stopped_at: dict[str, Key] = {}  # queue -> key of the borrower ending round one
        self.fast = False  # placing one arrival: give up rather than search

    def _incoming(self) -> dict[str, list[Holding]]:
        """Victims leaving for a waiting job: they count against limits until they are
        gone, but their queues no longer borrow those slots (they are the waiting job's)."""
        incoming: dict[str, list[Holding]] = {}
        for h in self.leaving:
            if h.preempted_for is not None and h.preempted_for in self.backlog:
                incoming.setdefault(h.preempted_for, []).append(h)
                self.usage.add(h.request, -h.size)
                self.usage.add(h.request, h.size, promise=True)
        return incoming

    # the pass ---------------------------------------------------------------------
    def run(self) -> Decision:
        self._overdue()
        self._reclaim_idle()
        # A guarantee is a promise and borrowing is best effort: the jobs that fit their
        # queue's guarantee go first, then (in order again) those that would borrow. A queue
        # keeps its own order: after its first borrower, the rest of it waits for round two.
        later = self._walk({q: 0 for q in self.backlog.streams}, guaranteed=True)
        self.stopped_at = {q: self.backlog.streams[q][i].key for q, i in later.items()}
        self._walk(later, guaranteed=False)
        return self.finish()

    def finish(self) -> Decision:
        """The decision, with the reservations and waits as they stand now."""
        self.decision.reservations = [
            Reservation(h.req.id, tuple(rank_order(h.free.values())), h.start_by)
            for h in self.holds
        ]
        self.decision.waiting = Waits(self.waiting, self.skipped, self._resolve)
        return self.decision

    def signature(self) -> int:
        """Changes whenever placing a job changed the state the next job sees."""
        return self.changes

    def _walk(self, starts: dict[str, int], guaranteed: bool) -> dict[str, int]:
        """Visit the queues' jobs merged in order, from ``starts`` (queue -> index);
        returns where each queue's first borrower stopped it (round one only)."""
        streams = self.backlog.streams
        heap = [(streams[q][i].key, q, i) for q, i in starts.items()]
        heapq.heapify(heap)
        stopped: dict[str, int] = {}
        while heap:
            _, q, i = heap[0]
            stream = streams[q]
            req = stream[i]
            if guaranteed and not self.usage.within_guarantee(req, req.world_size):
                stopped[q] = i
                heapq.heappop(heap)
                continue
            if self.settled(q, req):
                self.skipped.append(stream[i:])
                heapq.heappop(heap)
                continue
            before = self.signature()
            self.visit(req)
            if self.signature() != before:
                self.last_change = (1 if guaranteed else 2, req.key)
            if i + 1 < len(stream):
                heapq.heapreplace(heap, (stream[i + 1].key, q, i + 1))
            else:
                heapq.heappop(heap)
        return stopped

    def settled(self, queue: str, req: Request) -> bool:
        """Whether nothing in this pass can move the rest of the queue (from ``req``, the
        highest priority left in it): its head is placed, no job of it awaits victims,
        too few slots are free for its smallest job even by backfill, and no job of it
        may preempt (behind a head without estimate nobody may; else by the bounds)."""
        head = self.heads.get(queue)
        at_limit = self.usage.queue[queue] + self.backlog.smallest(queue) > self.usage.limit(queue)
        if (head is None and not at_limit) or self._awaited.get(queue):
            return False  # without a head, its first job short of slots would become one
        room = self.free.usable + sum(
            len(h.free) for h in self.claims.values() if h.req.priority < req.priority
        )
        shortest = self.backlog.shortest_limit(queue)
        if shortest is not None:
            room += sum(
                len(h.free)
                for h in self.open_holds
                if h.start_by is not None and self.now + shortest <= h.start_by
            )
        if room >= self.backlog.smallest(queue) and not at_limit:
            return False
        return (head is not None and head.every_busy) or not self.victims.may_move(
            queue, req.priority, self.backlog.owners[queue], self.usage
        )

    def _resolve(self, req: Request) -> Wait:
        """The wait of a job the pass skipped: a limit holds it, or it is behind its head."""
        n = req.world_size
        if req.smallest > len(self.inventory):
            return self._make(
                "limit", reasons.limit(f"the cluster has {len(self.inventory)} slots now", n)
            )
        blk = self.usage.block(req, n, self.free.usable)
        if blk is not None:
            return self._make("limit", reasons.limit(blk.text, n))
        head = self.heads.get(req.queue)
        if head is None:  # its queue is at its limit: every job of it meets it
            return self._make("limit", reasons.limit(f"queue {req.queue!r} is at its limit", n))
        return self.behind(head)

    def behind(self, head: Hold) -> Wait:
        """The wait of every job behind ``head`` (one text per head)."""
        wait = self._behind.get(id(head))
        if wait is None:
            text = reasons.behind(head.req, head.start_by, self.config)
            wait = self._behind[id(head)] = self._make("behind", text, blocked_by=head.req.id)
        return wait

    def _overdue(self) -> None:
        for h in self.leaving:
            if (
                h.status == "suspending"
                and h.interrupted_at is not None
                and self.now - h.interrupted_at > self.grace
            ):
                self.decision.preempt.append(
                    Preempt(
                        h.id, "stop", h.preempted_for, reasons.overdue(h, self.grace), overdue=True
                    )
                )

    def _reclaim_idle(self) -> None:
        if self.now < self.idle_until:
            return  # nobody can be idle for long enough yet (progress only puts it off)
        self.idle_until = math.inf
        if all(q.idle_timeout is None for q in self.config.queues.values()):
            return
        for h in self.holdings.values():
            queue = self.config.queues.get(h.request.queue)
            timeout = queue.idle_timeout if queue else None
            if timeout is None or h.status not in ACTIVE:
                continue
            since = h.paused_since if h.status == "paused" else None
            if since is None:
                since = h.last_progress if h.last_progress is not None else h.started_at
            if self.now - since <= timeout:
                self.idle_until = min(self.idle_until, since + timeout)
                continue
            how: How = "suspend" if h.request.has_checkpoint_dir else "stop"
            if how == "stop" and not h.request.preemptible:
                continue  # stopping would lose its work, and it said it may not be preempted
            text = reasons.reclaimed(h, self.now - since, timeout, how + "ed")
            self.decision.reclaim.append(Preempt(h.id, how, None, text))
            self.victims.take(h)
            self.reclaimed.append(h)

    def visit(self, req: Request) -> None:
        if req.id in self.incoming or req.id in self.claims:
            self._awaited[req.queue] -= 1
            self._place(req)
            return self._unclaim(req)
        limit = req.time_limit
        fits = (
            -1
            if limit is None
            else sum(  # which held slots it may backfill: a nested set
                1
                for h in self.open_holds
                if h.free and h.start_by is not None and self.now + limit <= h.start_by
            )
        )
        # the owner matters only at its cap, or with jobs of its own it may preempt
        cap, owner = self.config.per_user_cap, req.owner
        mine = (
            cap is not None and self.usage.owner[owner] + req.world_size > cap
        ) or self.victims.below(owner, req.priority)
        # what it reads of its queue's and owner's use is the limit it meets (more use only
        # makes a wait longer; less use, or a borrower less, bumps usage.version)
        usage = self.usage
        blk = usage.block(req, req.world_size, self.free.usable)
        key = (
            req.queue,
            owner if mine else None,
            req.priority,
            req.world_size,
            req.min_world_size,
            req.preemptible,
            fits,
            blk and blk.text,
            usage.within_guarantee(req, req.world_size),
        )
        state = (
            self.slots_version,
            self.victims.version,
            usage.version,
            usage.idle_version if self._cohorts > 1 else -1,
        )
        seen = self._memo.get(key)
        if seen is not None and seen[0] == state:
            self.waiting[req.id] = seen[1]
            return
        self._place(req)
        wait = self.waiting.get(req.id)
        if wait is not None and wait.kind in ("limit", "behind"):  # it changed nothing
            self._memo[key] = (state, wait)

    def _place(self, req: Request) -> None:
        n = req.world_size
        inc = self.incoming.pop(req.id, [])
        if req.smallest > len(self.inventory):
            self._recount(inc)
            return self.wait(
                req, "limit", reasons.limit(f"the cluster has {len(self.inventory)} slots now", n)
            )
        extra = self.pool(req, n, starting=True)
        blk = self.usage.block(req, n, self.free.usable + len(extra))
        if blk is None:
            gang = self._gang(n, extra)
            if gang:
                self._recount(inc)
                return self._start(req, gang)
        if preempt_for(self, req, n, inc):
            return
        self._recount(inc)
        if req.smallest < n and self._start_smaller(req):
            return
        blk = self.usage.block(req, n, self.free.usable + len(extra))
        if blk is not None:
            return self.wait(req, "limit", reasons.limit(blk.text, n))
        blocked(self, req, n)

    # starting -------------------------------------------------------------------------
    def pool(self, req: Request, n: int, starting: bool = False) -> list[Slot]:
        """Held free slots that ``req`` may use: it ends before the hold's job starts;
        or (``starting``: to start now, not to plan with) the claim of a lower priority."""
        self.open_holds = [h for h in self.open_holds if h.free]
        out: list[Slot] = []
        for h in self.open_holds:
            if self.may_use(req, n, h) or (
                starting and h.kind == "claim" and h.req.priority < req.priority
            ):
                out.extend(h.free.values())
        return out

    def may_use(self, req: Request, n: int, hold: Hold) -> bool:
        if hold.req.id == req.id:
            return True
        limit = req.time_limit
        return limit is not None and hold.start_by is not None and self.now + limit <= hold.start_by

    def _gang(self, n: int, extra: Sequence[Slot]) -> list[Slot] | None:
        if not extra:
            return self.free.pick(n)
        with self.free.including(extra):
            return self.free.pick(n)

    def _start(self, req: Request, gang: Sequence[Slot]) -> None:
        if self.fast:  # a start can change the waits of jobs after it (their limits)
            raise GiveUp("a start")
        self._take(gang)
        self.usage.add(req, len(gang))
        self.decision.start.append(Start(req.id, tuple(gang)))

    def _take(self, slots: Iterable[Slot]) -> None:
        self.slots_version += 1
        self.changes += 1
        for slot in slots:
            hold = self.held_by.pop(slot.worker, None)
            if hold is not None:
                del hold.free[slot.worker]
            else:
                self.free.discard(slot)

    def _start_smaller(self, req: Request) -> bool:
        extra = self.pool(req, req.smallest, starting=True)
        room = self.free.usable + len(extra)
        for m in range(min(req.world_size - 1, room), req.smallest - 1, -1):
            if self.usage.block(req, m, room) is None:
                gang = self._gang(m, extra)
                if gang:
                    self._start(req, gang)
                    return True
        return False

    def hold(
        self,
        req: Request,
        n: int,
        free: list[Slot],
        future: frozenset[str],
        every_busy: bool,
        start_by: float | None,
        kind: str,
    ) -> Hold:
        if free or kind == "head":  # a head is news for its queue even without free slots
            self._take(free)
        self.changes += 1
        guaranteed = self.usage.within_guarantee(req, n)
        hold = Hold(
            req, n, {s.worker: s for s in free}, future, every_busy, start_by, kind, guaranteed
        )
        self.held_by.update((s.worker, hold) for s in free)
        self.holds.append(hold)
        if free:
            self.open_holds.append(hold)
        self.usage.add(req, n, promise=True)
        return hold

    def wait(
        self,
        req: Request,
        kind: str,
        text: str,
        estimated_start: float | None = None,
        blocked_by: str | None = None,
    ) -> None:
        self.waiting[req.id] = self._make(kind, text, estimated_start, blocked_by)

    def _make(
        self,
        kind: str,
        text: str,
        estimated_start: float | None = None,
        blocked_by: str | None = None,
    ) -> Wait:
        wait = Wait(kind, text, estimated_start, blocked_by)
        return self.intern.setdefault(wait, wait)

    def _claim(self, job: str, workers: Iterable[str]) -> None:
        """Hold the freed slots a waiting job's victims left: theirs, nobody else's."""
        req = self.backlog.by_id.get(job)
        slots = [self.inventory[w] for w in workers if w in self.inventory]
        slots = [s for s in slots if s in self.free]
        if req is None or not slots:
            return
        self.free.take(slots)
        hold = Hold(
            req, len(slots), {s.worker: s for s in slots}, frozenset(), False, None, "claim"
        )
        self.held_by.update((s.worker, hold) for s in slots)
        self.open_holds.append(hold)
        self.claims[job] = hold

    def _unclaim(self, req: Request) -> None:
        """What a claimant did not take back goes to whoever comes next."""
        hold = self.claims.get(req.id)
        if hold is not None and hold.free:
            self.slots_version += 1
            self.changes += 1
            for worker, slot in list(hold.free.items()):
                del self.held_by[worker], hold.free[worker]
                self.free.add(slot)

    def _recount(self, inc: list[Holding]) -> None:
        """Victims whose job did not wait for them after all hold their slots like any job."""
        self.changes += bool(inc)
        for h in inc:
            self.promised.discard(h.id)
            self.usage.add(h.request, -h.size, promise=True)
            self.usage.add(h.request, h.size)


__all__ = ["Block", "GiveUp", "Hold", "Pass"]
