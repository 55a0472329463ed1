"""One scheduling pass over the whole queue, in order: the rules of the package docstring.

A :class:`Pass` is built from the inventory, the queue (sorted) and the holdings,
runs once, and leaves a :class:`~.model.Decision`. It never touches its inputs;
the :class:`~.scheduler.Scheduler` applies what it decides.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence

from . import reasons
from .config import PolicyConfig
from .gangs import FreeSlots, rank_order
from .model import ACTIVE, Decision, Holding, Preempt, Request, Reservation, Slot, Start, Wait
from .quota import Block, Usage
from .victims import choose, may_preempt, victim_key


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
    """Decide, once, for every queued job in order (``queue`` sorted by ``Request.key``)."""

    def __init__(self, config: PolicyConfig, inventory: Mapping[str, Slot],
                 queue: Sequence[Request], holdings: Mapping[str, Holding], now: float) -> None:
        self.config, self.now, self.inventory = config, now, inventory
        self.queue, self.holdings = queue, holdings
        self.grace = config.preemption_grace
        self.usage = Usage(config, len(inventory))
        self.incoming: dict[str, list[Holding]] = {}   # waiting job -> victims leaving for it
        waiting = {r.id for r in queue}
        held: set[str] = set()
        for h in holdings.values():
            held.update(s.worker for s in h.slots)
            if h.status not in ACTIVE and h.preempted_for in waiting:
                self.incoming.setdefault(h.preempted_for, []).append(h)  # counted by its job
            else:
                self.usage.add(h.request.queue, h.request.owner, h.size)
        self.free = FreeSlots(s for w, s in inventory.items() if w not in held)
        self.decision = Decision()
        self.holds: list[Hold] = []
        self.open_holds: list[Hold] = []           # holds that still have free slots
        self.held_by: dict[str, Hold] = {}         # worker of a held free slot -> its hold
        self.heads: dict[str, Hold] = {}           # queue -> the hold of its first blocked job
        self.taken: set[str] = set()               # holdings leaving: victims, reclaimed, overdue
        self.promised = {h.id for hs in self.incoming.values() for h in hs}  # slots go to a job
        self._victims: list[Holding] | None = None
        self._releases: list[tuple[float, Holding]] | None = None
        self._failed: set[tuple] = set()              # preemption searches that found nothing
        self._lowest: float | None = None

    # the pass ---------------------------------------------------------------------
    def run(self) -> Decision:
        self._overdue()
        self._reclaim_idle()
        # A guarantee is a promise and borrowing is best effort: the jobs that fit their
        # queue's guarantee go first, then (in order again) those that would borrow. A queue
        # keeps its own order: after its first borrower, the rest of it waits for phase two.
        borrowers: list[Request] = []
        deferred: set[str] = set()
        for req in self.queue:
            if req.queue in deferred or not self.usage.within_guarantee(req, req.world_size):
                deferred.add(req.queue)
                borrowers.append(req)
            else:
                self._place(req)
        for req in borrowers:
            self._place(req)
        self.decision.reservations = [
            Reservation(h.req.id, tuple(rank_order(h.free.values())), h.start_by) for h in self.holds]
        return self.decision

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
            self.taken.add(h.id)

    def _place(self, req: Request) -> None:
        n = req.world_size
        inc = self.incoming.pop(req.id, [])
        if req.smallest > len(self.inventory):
            self._recount(inc)
            return self._wait(req, "limit", reasons.limit(
                f"the cluster has {len(self.inventory)} slots now", n))
        extra = self._pool(req, n)
        back = _freed(inc, req.owner, sign=-1)  # its victims still hold their slots
        blk = self.usage.block(req, n, self.free.usable + len(extra), back[0], back[1])
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
        key = (req.queue, req.owner, req.priority, n, req.time_limit, self.usage.version)
        if not inc and (key in self._failed or not self._could_preempt(req)):
            return False
        respected = [h for h in self.heads.values() if not self._may_use(req, n, h)]
        if any(h.every_busy for h in respected):
            return False  # a head without an estimate counts on every busy slot
        blocked = frozenset().union(*(h.future for h in respected))
        extra = self._pool(req, n)
        inc_slots = [s for h in inc for s in h.slots if s.worker in self.inventory]

        def eligible(v: Holding, freed: Mapping[str, int]) -> bool:
            return (v.id not in self.taken and not any(s.worker in blocked for s in v.slots)
                    and may_preempt(req, n, v, self.usage, freed))

        def slots_of(chosen: list[Holding]) -> list[Slot]:
            return extra + inc_slots + [s for v in chosen for s in v.slots
                                        if s.worker in self.inventory]

        def fits(chosen: list[Holding], freed: Mapping[str, int]) -> bool:
            pool = slots_of(chosen)
            room = self.free.usable + len(pool)
            if room < n:
                return False
            owner = sum(v.size for v in chosen if v.request.owner == req.owner)
            if self.usage.block(req, n, room, freed, owner) is not None:
                return False
            with self.free.including(pool):
                return self.free.pick(n) is not None

        victims = [] if inc and fits([], {}) else choose(self._candidates(req, n), eligible, fits)
        if victims is None:
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
        self._wait(req, "preempting", reasons.preempting([h.id for h in leaving], n, start_by,
                                                         self.now), start_by)
        return True

    def _preempt(self, req: Request, victims: list[Holding]) -> None:
        for v in victims:
            how = "suspend" if v.request.has_checkpoint_dir else "stop"
            self.decision.preempt.append(
                Preempt(v.id, how, req.id, reasons.victim(v, req, how, self.config)))
            self.taken.add(v.id)
            self.usage.add(v.request.queue, v.request.owner, -v.size)  # they are req's now

    def _could_preempt(self, req: Request) -> bool:
        """A quick bound: some candidate has a lower priority, or some queue borrows."""
        if self._lowest is None:
            self._lowest = min((h.request.priority for h in self.holdings.values()
                                if h.status in ACTIVE and h.request.preemptible), default=None)
            if self._lowest is None:
                self._lowest = float("inf")
        return self._lowest < req.priority or any(
            self.usage.borrowing(q) for q in self.usage.held if q != req.queue)

    def _candidates(self, req: Request, n: int) -> list[Holding]:
        """Possible victims, least work lost first; a queue reclaiming its guarantee
        takes from borrowing queues before its own lower priorities."""
        if self._victims is None:
            self._victims = sorted(
                (h for h in self.holdings.values()
                 if h.status in ACTIVE and h.request.preemptible and h.id not in self.taken),
                key=lambda h: victim_key(h, self.now, self.config))
        order = [v for v in self._victims if v.id not in self.taken]
        if not self.usage.within_guarantee(req, n):
            return order
        first = [v for v in order if v.request.queue != req.queue
                 and self.usage.borrowing(v.request.queue)]
        chosen = {v.id for v in first}
        return first + [v for v in order if v.id not in chosen]

    # waiting ------------------------------------------------------------------------
    def _blocked(self, req: Request, n: int) -> None:
        """No room and no victims: first in its queue, it gets a reservation; behind
        that one, it waits (and may only backfill, see ``_may_use``)."""
        head = self.heads.get(req.queue)
        if head is not None:
            return self._wait(req, "behind", reasons.behind(req, head.req, head.start_by,
                                                            self.now, self.config),
                              blocked_by=head.req.id)
        found = self._shadow(req, n)
        if found is None:
            hold = self._hold(req, n, list(self.free), frozenset(), True, None, "head")
            text = reasons.head(n, None, self.now, [])
        else:
            start_by, gang, ending = found
            hold = self._hold(req, n, [s for s in gang if s in self.free],
                              frozenset(s.worker for s in gang if s not in self.free), False,
                              start_by, "head")
            text = reasons.head(n, start_by, self.now, ending)
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
                if h.status not in ACTIVE or h.id in self.taken:
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
        self.decision.waiting[req.id] = Wait(req.id, kind, text, estimated_start, blocked_by)

    def _recount(self, inc: list[Holding]) -> None:
        """Victims whose job did not wait for them after all hold their slots like any job."""
        for h in inc:
            self.promised.discard(h.id)
            self.usage.add(h.request.queue, h.request.owner, h.size)


def _freed(victims: Iterable[Holding], owner: str, sign: int = 1) -> tuple[dict[str, int], int]:
    by_queue: dict[str, int] = {}
    mine = 0
    for h in victims:
        by_queue[h.request.queue] = by_queue.get(h.request.queue, 0) + sign * h.size
        mine += sign * h.size if h.request.owner == owner else 0
    return by_queue, mine


__all__ = ["Block", "Hold", "Pass"]
