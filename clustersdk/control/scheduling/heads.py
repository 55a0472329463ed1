"""A queue's head: the reservation EASY backfill keeps for the first blocked job.

The head's gang is the one that forms first as running jobs end by their
``time_limit`` (and leaving ones within the grace); its free slots are held for
it, and jobs behind it may take them only if they end before that start. Without
an estimate, the head holds every slot as it frees up.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING

from . import reasons
from .model import Holding, Request, Slot
from .slot_holds import GiveUp

if TYPE_CHECKING:
    from .planner import Pass


def blocked(p: Pass, req: Request, n: int) -> None:
    """No room and no victims: first in its queue, it gets a reservation; behind
    that one, it waits (and may only backfill, see ``Pass.may_use``)."""
    head = p.heads.get(req.queue)
    if head is not None:
        p.waiting[req.id] = p.behind(head)
        return
    if p.fast:
        raise GiveUp("a new head")
    found = shadow(p, req, n)
    if found is None:
        hold = p.hold(req, n, list(p.free), frozenset(), True, None, "head")
        text = reasons.head(n, None, [])
    else:
        start_by, gang, ending = found
        hold = p.hold(
            req,
            n,
            [s for s in gang if s in p.free],
            frozenset(s.worker for s in gang if s not in p.free),
            False,
            start_by,
            "head",
        )
        text = reasons.head(n, start_by, ending)
    p.heads[req.queue] = hold
    p.wait(req, "head", text, hold.start_by)


def shadow(p: Pass, req: Request, n: int) -> tuple[float, list[Slot], list[str]] | None:
    """When ``n`` slots first form a gang for ``req`` as running jobs end by their
    time limits (and leaving ones within the grace), and which slots."""
    respected = [h for h in p.heads.values() if not p.may_use(req, n, h)]
    if any(h.every_busy for h in respected):
        return None
    blocked = frozenset().union(*(h.future for h in respected))
    pool = p.pool(req, n)
    owner: dict[str, str] = {}
    for t, h in release_order(p):
        if h.id in p.promised:
            continue
        slots = [s for s in h.slots if s.worker in p.inventory and s.worker not in blocked]
        pool.extend(slots)
        owner.update((s.worker, h.request.label) for s in slots)
        if p.free.usable + len(pool) >= n:
            with p.free.including(pool):
                gang = p.free.pick(n)
            if gang:
                ending = sorted({owner[s.worker] for s in gang if s.worker in owner})
                return t, gang, ending
    return None


def release_order(p: Pass) -> Iterator[tuple[float, Holding]]:
    """Holdings by when they free their slots, by estimate (those without one never do):
    a running job by its time_limit, a leaving one by the preemption grace, one asked to
    leave in this pass from now. A time in the past (an overdue estimate) stays as it
    is, so that the plan does not drift with the clock; the estimated start it gives is
    then "any moment now"."""
    asked = sorted((p.now + p.grace, h.id) for h in p.reclaimed)
    again = {job for _, job in asked}
    filed = ((t, job) for t, job in p.ledger.releases if job not in again)
    for t, job in heapq.merge(filed, asked):
        yield t, p.holdings[job]
