"""One scheduling pass over the whole queue, in order: the rules of the package docstring.

A :class:`Pass` is built from the inventory, the queue (sorted) and the holdings,
runs once, and leaves a :class:`~.model.Decision`. It never touches its inputs;
the :class:`~.scheduler.Scheduler` applies what it decides.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Iterable, Mapping, Sequence

from . import reasons
from .backlog import Backlog
from .config import PolicyConfig
from .gangs import FreeSlots, rank_order
from .model import ACTIVE, Decision, Holding, Preempt, Request, Reservation, Slot, Start, Wait
from .quota import Block, Usage
from .victims import Victims, choose, may_preempt
from .waits import Waits


@dataclasses.dataclass(eq=False)
class Hold:
    """Slots held for a waiting job: ``free`` ones now (nobody else takes them) and
    busy ones it counts on (``future``; ``every_busy``: any busy slot, no estimate)."""

    req: Request
    n: int
    free: dict[str, Slot]
    future: frozenset[str]
    every_busy: bool
    start_by: float | None
    kind: str          # "head" or "preempting"


class Pass:
    """Decide, once, for every queued job of ``backlog``, in order."""

    def __init__(self, config: PolicyConfig, inventory: Mapping[str, Slot], backlog: Backlog,
                 holdings: Mapping[str, Holding], now: float,
                 intern: dict[Wait, Wait] | None = None) -> None:
        self.config, self.now, self.inventory = config, now, inventory
        self.backlog, self.holdings = backlog, holdings
        self.intern = {} if intern is None else intern  # one object per distinct Wait
        self.grace = config.preemption_grace
        self.usage = Usage(config, len(inventory))
        self.incoming: dict[str, list[Holding]] = {}   # waiting job -> victims leaving for it
        held: set[str] = set()
        for h in holdings.values():
            held.update(s.worker for s in h.slots)
            # a victim leaving for a waiting job counts against limits until it is gone, but
            # its queue no longer borrows those slots: they are the waiting job's
            promised = h.status not in ACTIVE and h.preempted_for in backlog
            if promised:
                self.incoming.setdefault(h.preempted_for, []).append(h)
            self.usage.add(h.request.queue, h.request.owner, h.size, promise=promised)
        self.free = FreeSlots(s for w, s in inventory.items() if w not in held)
        self.decision = Decision()
        self.waiting: dict[str, Wait] = {}
        self.skipped: list[list[Request]] = []     # tails of queues nothing could change
        self.holds: list[Hold] = []
        self.open_holds: list[Hold] = []           # holds that still have free slots
        self.held_by: dict[str, Hold] = {}         # worker of a held free slot -> its hold
        self.heads: dict[str, Hold] = {}           # queue -> the hold of its first blocked job
        self.victims = Victims(holdings.values(), now, config)  # .taken: victims, reclaimed
        self.promised = {h.id for hs in self.incoming.values() for h in hs}  # slots go to a job
        self._awaited = {}                         # queue -> its jobs with victims leaving
        for job in self.incoming:
            queue = backlog.by_id[job].queue
            self._awaited[queue] = self._awaited.get(queue, 0) + 1
        self._releases: list[tuple[float, Holding]] | None = None
        self._failed: set[tuple] = set()              # preemption searches that found nothing
        # Jobs that wait alike, in a state nothing changed since, wait alike again: the
        # wait of a job that only waits is kept per kind of job, with the versions of the
        # parts of the state it read (slots and holds, victims, its queue's and owner's use).
        self.slots_version = 0
        self._memo: dict[tuple, tuple[tuple, Wait]] = {}
        self._cohorts = len({q.cohort for q in config.queues.values()})

    # the pass ---------------------------------------------------------------------
    def run(self) -> Decision:
        self._overdue()
        self._reclaim_idle()
        # A guarantee is a promise and borrowing is best effort: the jobs that fit their
        # queue's guarantee go first, then (in order again) those that would borrow. A queue
        # keeps its own order: after its first borrower, the rest of it waits for round two.
        later = self._walk({q: 0 for q in self.backlog.streams}, guaranteed=True)
        self._walk(later, guaranteed=False)
        self.decision.reservations = [
            Reservation(h.req.id, tuple(rank_order(h.free.values())), h.start_by) for h in self.holds]
        self.decision.waiting = Waits(self.waiting, self.skipped, self._resolve)
        return self.decision

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
            if self._settled(q, req):
                self.skipped.append(stream[i:])
                heapq.heappop(heap)
                continue
            self._visit(req)
            if i + 1 < len(stream):
                heapq.heapreplace(heap, (stream[i + 1].key, q, i + 1))
            else:
                heapq.heappop(heap)
        return stopped

    def _settled(self, queue: str, req: Request) -> bool:
        """Whether nothing in this pass can move the rest of the queue (from ``req``, the
        highest priority left in it): its head is placed, no job of it awaits victims,
        too few slots are free for its smallest job even by backfill, and no job of it
        may preempt (behind a head without estimate nobody may; else by the bounds)."""
        head = self.heads.get(queue)
        if head is None or self._awaited.get(queue):
            return False
        room = self.free.usable
        shortest = self.backlog.shortest_limit(queue)
        if shortest is not None:
            room += sum(len(h.free) for h in self.open_holds
                        if h.start_by is not None and self.now + shortest <= h.start_by)
        if room >= self.backlog.smallest(queue):
            return False
        return head.every_busy or not self.victims.may_move(
            queue, req.priority, self.backlog.owners[queue], self.usage)

    def _resolve(self, req: Request) -> Wait:
        """The wait of a job the pass skipped: a limit holds it, or it is behind its head."""
        n = req.world_size
        if req.smallest > len(self.inventory):
            return self._make("limit", reasons.limit(
                f"the cluster has {len(self.inventory)} slots now", n))
        blk = self.usage.block(req, n, self.free.usable)
        if blk is not None:
            return self._make("limit", reasons.limit(blk.text, n))
        head = self.heads[req.queue]
        return self._make("behind", reasons.behind(req, head.req, head.start_by, self.config),
                          blocked_by=head.req.id)

    def _overdue(self) -> None:
        for h in self.holdings.values():
            if (h.status == "suspending" and h.interrupted_at is not None
                    and self.now - h.interrupted_at > self.grace):
                self.decision.preempt.append(Preempt(h.id, "stop", h.preempted_for,
                                                     reasons.overdue(h, self.grace), overdue=True))

    def _reclaim_idle(self) -> None:
        for h in self.holdings.values():
            queue = self.config.queues.get(h.request.queue)
            timeout = queue.idle_timeout if queue else None
            if timeout is None or h.status not in ACTIVE:
                continue
            since = h.paused_since if h.status == "paused" else None
            if since is None:
                since = h.last_progress if h.last_progress is not None else h.started_at
            if self.now - since <= timeout:
                continue
            how = "suspend" if h.request.has_checkpoint_dir else "stop"
            if how == "stop" and not h.request.preemptible:
                continue  # stopping would lose its work, and it said it may not be preempted
            text = reasons.reclaimed(h, self.now - since, timeout, how + "ed")
            self.decision.reclaim.append(Preempt(h.id, how, None, text))
            self.victims.take(h)

    def _visit(self, req: Request) -> None:
        if req.id in self.incoming:
            self._awaited[req.queue] -= 1
            return self._place(req)
        limit = req.time_limit
        fits = -1 if limit is None else sum(  # which held slots it may backfill: a nested set
            1 for h in self.open_holds
            if h.free and h.start_by is not None and self.now + limit <= h.start_by)
        # the owner matters only at its cap, or with jobs of its own it may preempt
        cap, owner = self.config.per_user_cap, req.owner
        mine = ((cap is not None and self.usage.owner[owner] + req.world_size > cap)
                or self.victims.below(owner, req.priority))
        # what it reads of its queue's and owner's use is the limit it meets (more use only
        # makes a wait longer; less use, or a borrower less, bumps usage.version)
        usage = self.usage
        blk = usage.block(req, req.world_size, self.free.usable)
        key = (req.queue, owner if mine else None, req.priority, req.world_size,
               req.min_world_size, req.preemptible, fits, blk and blk.text,
               usage.within_guarantee(req, req.world_size))
        state = (self.slots_version, self.victims.version, usage.version,
                 usage.idle_version if self._cohorts > 1 else -1)
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
            return self._wait(req, "limit", reasons.limit(
                f"the cluster has {len(self.inventory)} slots now", n))
        extra = self._pool(req, n)
        blk = self.usage.block(req, n, self.free.usable + len(extra))
        if blk is None:
            gang = self._gang(n, extra)
            if gang:
                self._recount(inc)
                return self._start(req, gang)
        if self._preempt_for(req, n, inc):
            return
        self._recount(inc)
        if req.smallest < n and self._start_smaller(req):
            return
        blk = self.usage.block(req, n, self.free.usable + len(extra))
        if blk is not None:
            return self._wait(req, "limit", reasons.limit(blk.text, n))
        self._blocked(req, n)

    # starting -------------------------------------------------------------------------
    def _pool(self, req: Request, n: int) -> list[Slot]:
        """Held free slots that ``req`` may use: it ends before the hold's job starts."""
        self.open_holds = [h for h in self.open_holds if h.free]
        out: list[Slot] = []
        for h in self.open_holds:
            if self._may_use(req, n, h):
                out.extend(h.free.values())
        return out

    def _may_use(self, req: Request, n: int, hold: Hold) -> bool:
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
        self._take(gang)
        self.usage.add(req.queue, req.owner, len(gang))
        self.decision.start.append(Start(req.id, tuple(gang)))

    def _take(self, slots: Iterable[Slot]) -> None:
        self.slots_version += 1
        for slot in slots:
            hold = self.held_by.pop(slot.worker, None)
            if hold is not None:
                del hold.free[slot.worker]
            else:
                self.free.discard(slot)

    def _start_smaller(self, req: Request) -> bool:
        extra = self._pool(req, req.smallest)
        room = self.free.usable + len(extra)
        for m in range(min(req.world_size - 1, room), req.smallest - 1, -1):
            if self.usage.block(req, m, room) is None:
                gang = self._gang(m, extra)
                if gang:
                    self._start(req, gang)
                    return True
        return False

    # preempting ----------------------------------------------------------------------
    def _preempt_for(self, req: Request, n: int, inc: list[Holding]) -> bool:
        respected = [h for h in self.heads.values() if not self._may_use(req, n, h)]
        if any(h.every_busy for h in respected):
            return False  # a head without an estimate counts on every busy slot
        extra = self._pool(req, n)
        inc_slots = [s for h in inc for s in h.slots if s.worker in self.inventory]
        room = self.free.usable + len(extra) + len(inc_slots)
        if not inc:
            blk = self.usage.block(req, n, room)
            if self.victims.bound(req, n, self.usage, blk and blk.kind) + room < n or (
                    blk is not None and blk.kind in ("unknown-queue", "lending")):
                return False
            key = (req.queue, req.owner, req.priority, n, tuple(id(h) for h in respected),
                   len(extra), self.usage.version)
            if key in self._failed:
                return False
        blocked = frozenset().union(*(h.future for h in respected))
        inc_freed, inc_mine = _freed(inc, req.owner)  # what its leaving victims give back

        def eligible(v: Holding, freed: Mapping[str, int]) -> bool:
            return (v.id not in self.victims.taken and not any(s.worker in blocked for s in v.slots)
                    and may_preempt(req, n, v, self.usage, freed))

        def slots_of(chosen: list[Holding]) -> list[Slot]:
            return extra + inc_slots + [s for v in chosen for s in v.slots
                                        if s.worker in self.inventory]

        def fits(chosen: list[Holding], freed: Mapping[str, int]) -> bool:
            pool = slots_of(chosen)
            room = self.free.usable + len(pool)
            if room < n:
                return False
            owner = inc_mine + sum(v.size for v in chosen if v.request.owner == req.owner)
            back = dict(inc_freed)
            for q, k in freed.items():
                back[q] = back.get(q, 0) + k
            if self.usage.block(req, n, room, back, owner) is not None:
                return False
            with self.free.including(pool):
                return self.free.pick(n) is not None

        if inc and fits([], {}):
            victims: list[Holding] | None = []
        else:
            victims = choose(self.victims.ordered(req, n, self.usage), eligible, fits)
        if victims is None:
            if not inc:
                self._failed.add(key)
            return False
        self._preempt(req, victims)
        with self.free.including(slots_of(victims)):
            gang = self.free.pick(n)
        leaving = inc + victims
        times = [h.interrupted_at + self.grace for h in inc if h.interrupted_at is not None]
        start_by = max(times + [self.now + self.grace] * bool(victims) + [self.now])
        busy = {s.worker for h in leaving for s in h.slots}
        self.promised.update(h.id for h in leaving)
        self._hold(req, n, [s for s in gang if s.worker not in busy],
                   frozenset(s.worker for s in gang if s.worker in busy), False, start_by,
                   "preempting")
        self._wait(req, "preempting", reasons.preempting([h.id for h in leaving], n, self.grace),
                   start_by)
        return True

    def _preempt(self, req: Request, victims: list[Holding]) -> None:
        for v in victims:
            how = "suspend" if v.request.has_checkpoint_dir else "stop"
            self.decision.preempt.append(
                Preempt(v.id, how, req.id, reasons.victim(v, req, how, self.config)))
            self.victims.take(v)
            # still holding until it leaves, but no longer borrowing: the slots are req's
            self.usage.add(v.request.queue, v.request.owner, -v.size)
            self.usage.add(v.request.queue, v.request.owner, v.size, promise=True)

    # waiting ------------------------------------------------------------------------
    def _blocked(self, req: Request, n: int) -> None:
        """No room and no victims: first in its queue, it gets a reservation; behind
        that one, it waits (and may only backfill, see ``_may_use``)."""
        head = self.heads.get(req.queue)
        if head is not None:
            return self._wait(req, "behind", reasons.behind(req, head.req, head.start_by,
                                                            self.config),
                              blocked_by=head.req.id)
        found = self._shadow(req, n)
        if found is None:
            hold = self._hold(req, n, list(self.free), frozenset(), True, None, "head")
            text = reasons.head(n, None, [])
        else:
            start_by, gang, ending = found
            hold = self._hold(req, n, [s for s in gang if s in self.free],
                              frozenset(s.worker for s in gang if s not in self.free), False,
                              start_by, "head")
            text = reasons.head(n, start_by, ending)
        self.heads[req.queue] = hold
        self._wait(req, "head", text, hold.start_by)

    def _shadow(self, req: Request, n: int) -> tuple[float, list[Slot], list[str]] | None:
        """When ``n`` slots first form a gang for ``req`` as running jobs end by their
        time limits (and leaving ones within the grace), and which slots."""
        respected = [h for h in self.heads.values() if not self._may_use(req, n, h)]
        if any(h.every_busy for h in respected):
            return None
        blocked = frozenset().union(*(h.future for h in respected))
        pool = self._pool(req, n)
        owner: dict[str, str] = {}
        for t, h in self._release_order():
            if h.id in self.promised:
                continue
            slots = [s for s in h.slots if s.worker in self.inventory and s.worker not in blocked]
            pool.extend(slots)
            owner.update((s.worker, h.id) for s in slots)
            if self.free.usable + len(pool) >= n:
                with self.free.including(pool):
                    gang = self.free.pick(n)
                if gang:
                    ending = sorted({owner[s.worker] for s in gang if s.worker in owner})
                    return max(t, self.now), gang, ending
        return None

    def _release_order(self) -> list[tuple[float, Holding]]:
        if self._releases is None:
            out = []
            for h in self.holdings.values():
                if h.status not in ACTIVE or h.id in self.victims.taken:
                    t = (h.interrupted_at if h.interrupted_at is not None else self.now) + self.grace
                elif h.ends_at is not None:
                    t = h.ends_at
                else:
                    continue  # no estimate: it never ends, as far as a plan can tell
                out.append((max(t, self.now), h))
            out.sort(key=lambda th: (th[0], th[1].id))
            self._releases = out
        return self._releases

    def _hold(self, req: Request, n: int, free: list[Slot], future: frozenset[str],
              every_busy: bool, start_by: float | None, kind: str) -> Hold:
        if free or kind == "head":  # a head is news for its queue even without free slots
            self._take(free)
        hold = Hold(req, n, {s.worker: s for s in free}, future, every_busy, start_by, kind)
        self.held_by.update((s.worker, hold) for s in free)
        self.holds.append(hold)
        if free:
            self.open_holds.append(hold)
        self.usage.add(req.queue, req.owner, n, promise=True)
        return hold

    def _wait(self, req: Request, kind: str, text: str, estimated_start: float | None = None,
              blocked_by: str | None = None) -> None:
        self.waiting[req.id] = self._make(kind, text, estimated_start, blocked_by)

    def _make(self, kind: str, text: str, estimated_start: float | None = None,
              blocked_by: str | None = None) -> Wait:
        wait = Wait(kind, text, estimated_start, blocked_by)
        return self.intern.setdefault(wait, wait)

    def _recount(self, inc: list[Holding]) -> None:
        """Victims whose job did not wait for them after all hold their slots like any job."""
        for h in inc:
            self.promised.discard(h.id)
            self.usage.add(h.request.queue, h.request.owner, -h.size, promise=True)
            self.usage.add(h.request.queue, h.request.owner, h.size)


def _freed(victims: Iterable[Holding], owner: str) -> tuple[dict[str, int], int]:
    """Slots the victims give back, per queue and (``mine``) of ``owner``."""
    by_queue: dict[str, int] = {}
    mine = 0
    for h in victims:
        by_queue[h.request.queue] = by_queue.get(h.request.queue, 0) + h.size
        mine += h.size if h.request.owner == owner else 0
    return by_queue, mine


__all__ = ["Block", "Hold", "Pass"]
