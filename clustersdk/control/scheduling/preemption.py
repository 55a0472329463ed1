"""Preempting for a waiting job: which victims, the gang their slots make, the hold.

A job may preempt only when the victims' slots, with the free ones it may use,
make a whole gang within its limits (see :mod:`.victims` for who may be a victim
and in which order). Its victims' slots and the free part of its gang are held
for it until they are all its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from . import reasons
from .model import Holding, How, Preempt, Request, Slot
from .slot_holds import GiveUp
from .victims import choose, may_preempt

if TYPE_CHECKING:
    from .planner import Pass


def preempt_for(p: Pass, req: Request, n: int, inc: list[Holding]) -> bool:
    """Make room for ``req`` by preemption if the rules allow it (``inc``: the victims
    already leaving for it); True when it now waits for its victims."""
    # the slots a head counts on are off limits: its own queue's head's, and a head's
    # that fits its guarantee (a borrowing head does not stop another queue's preemptions)
    respected = [
        h
        for h in p.heads.values()
        if (h.req.queue == req.queue or h.guaranteed) and not p.may_use(req, n, h)
    ]
    if any(h.every_busy for h in respected):
        return False  # a head without an estimate counts on every busy slot
    extra = p.pool(req, n)
    inc_slots = [s for h in inc for s in h.slots if s.worker in p.inventory]
    room = p.free.usable + len(extra) + len(inc_slots)
    if not inc:
        blk = p.usage.block(req, n, room)
        if p.victims.bound(req, n, p.usage, blk.kind if blk else None) + room < n or (
            blk is not None and blk.kind in ("unknown-queue", "lending")
        ):
            return False
        heads = tuple(id(h) for h in respected)
        key = (req.queue, req.owner, req.priority, n, heads, len(extra), p.usage.version)
        # whether anyone at all may be its victim does not depend on its size
        none = (
            req.queue,
            req.owner,
            req.priority,
            p.usage.within_guarantee(req, n),
            heads,
            p.victims.version,
            p.usage.version,
        )
        if key in p.failed or none in p.failed:
            return False
    blocked = frozenset().union(*(h.future for h in respected))
    inc_freed, inc_mine = _freed(inc, req.owner)  # what its leaving victims give back

    def eligible(v: Holding, freed: Mapping[str, int]) -> bool:
        return (
            v.id not in p.victims.taken
            and may_preempt(req, n, v, p.usage, freed)
            and not (blocked and any(s.worker in blocked for s in v.slots))
        )

    def slots_of(chosen: list[Holding]) -> list[Slot]:
        return extra + inc_slots + [s for v in chosen for s in v.slots if s.worker in p.inventory]

    def fits(chosen: list[Holding], freed: Mapping[str, int]) -> list[Slot] | None:
        pool = slots_of(chosen)
        room = p.free.usable + len(pool)
        if room < n:
            return None
        owner = inc_mine + sum(v.size for v in chosen if v.request.owner == req.owner)
        back = dict(inc_freed)
        for q, k in freed.items():
            back[q] = back.get(q, 0) + k
        if p.usage.block(req, n, room, back, owner) is not None:
            return None
        with p.free.including(pool):
            return p.free.pick(n)

    gang = fits([], {}) if inc else None
    if gang:
        victims: list[Holding] | None = []
    else:
        if p.fast:
            raise GiveUp("a preemption search")
        victims, anyone = choose(p.victims.ordered(req, n, p.usage), eligible, fits)
    if victims is None:
        if not inc:
            p.failed.add(key if anyone else none)
        return False
    preempt(p, req, victims)
    if victims:
        with p.free.including(slots_of(victims)):
            gang = p.free.pick(n)
    assert gang is not None  # fits() found a gang in these very slots
    _hold_for(p, req, n, inc + victims, gang, new=bool(victims))
    return True


def _hold_for(
    p: Pass, req: Request, n: int, leaving: list[Holding], gang: list[Slot], new: bool
) -> None:
    """Hold the gang for ``req``: its free slots now, the leaving victims' as they go."""
    times = [h.interrupted_at + p.grace for h in leaving if h.interrupted_at is not None]
    start_by = max(times + [p.now + p.grace] * new, default=p.now + p.grace)
    busy = {s.worker for h in leaving for s in h.slots}
    p.promised.update(h.id for h in leaving)
    p.hold(
        req,
        n,
        [s for s in gang if s.worker not in busy],
        frozenset(s.worker for s in gang if s.worker in busy),
        False,
        start_by,
        "preempting",
    )
    p.wait(
        req,
        "preempting",
        reasons.preempting([h.request.label for h in leaving], n, p.grace),
        start_by,
    )


def preempt(p: Pass, req: Request, victims: list[Holding]) -> None:
    """Ask ``victims`` to leave for ``req``."""
    p.changes += bool(victims)
    for v in victims:
        how: How = "suspend" if v.request.has_checkpoint_dir else "stop"
        p.decision.preempt.append(Preempt(v.id, how, req.id, reasons.victim(v, req, how, p.config)))
        p.victims.take(v)
        # still holding until it leaves, but no longer borrowing: the slots are req's
        p.usage.add(v.request, -v.size)
        p.usage.add(v.request, v.size, promise=True)


def _freed(victims: Iterable[Holding], owner: str) -> tuple[dict[str, int], int]:
    """Slots the victims give back, per queue and (``mine``) of ``owner``."""
    by_queue: dict[str, int] = {}
    mine = 0
    for h in victims:
        by_queue[h.request.queue] = by_queue.get(h.request.queue, 0) + h.size
        mine += h.size if h.request.owner == owner else 0
    return by_queue, mine
