"""Quotas: slots held per queue and per owner, and whether a job may take n more.

A queue holds at most its guaranteed slots plus its borrowing limit. Past its
guarantee it borrows: idle guaranteed slots of queues in its cohort, or slots no
queue guarantees, never the idle guarantee of a queue outside its cohort. A job
that cannot be preempted does not borrow (a lender gets its slots back by
preemption): the jobs of a queue that cannot be preempted hold at most its
guarantee together. An owner holds at most the per-user cap.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping

from .config import PolicyConfig
from .model import Request


@dataclasses.dataclass(frozen=True)
class Block:
    """A limit that keeps a job from starting now; ``text`` says which and by how much."""

    kind: str  # unknown-queue | queue-limit | user-cap | no-borrow | lending
    text: str


class Usage:
    """Slots held or promised (to a reservation) per queue and per owner.

    Limits count both; whether a queue *borrows* (and so may be reclaimed from)
    counts only the slots it holds.
    """

    def __init__(self, config: PolicyConfig, total: int) -> None:
        self.config = config
        self.total = total
        self.queue: dict[str, int] = defaultdict(int)
        self.owner: dict[str, int] = defaultdict(int)
        self.held: dict[str, int] = defaultdict(int)  # per queue, without promises
        self.firm: dict[str, int] = defaultdict(int)  # per queue, of jobs that can't be preempted
        self._g = {q: config.guaranteed(q, total) for q in config.queues}
        self._limit = {q: config.limit(q, total) for q in config.queues}
        self._cohort = {q: c.cohort for q, c in config.queues.items()}
        self._idle_by_cohort: dict[str, int] = defaultdict(int)
        for q, g in self._g.items():
            self._idle_by_cohort[self._cohort[q]] += g
        self._idle_total = sum(self._g.values())
        # bumps when a queue starts or stops borrowing, or holds fewer slots: a preemption
        # search that found nothing may find something after that
        self.version = 0
        self.idle_version = 0  # bumps when an idle guarantee (what lending protects) changes

    def copy(self) -> Usage:
        """An independent copy (a pass changes its own)."""
        new = copy.copy(self)
        for name in ("queue", "owner", "held", "firm", "_idle_by_cohort"):
            setattr(new, name, defaultdict(int, getattr(self, name)))
        return new

    def guaranteed(self, queue: str) -> int:
        return self._g.get(queue, 0)

    def limit(self, queue: str) -> float:
        return self._limit.get(queue, 0)

    def idle(self, queue: str) -> int:
        return max(0, self.guaranteed(queue) - self.queue[queue])

    def borrowing(self, queue: str, freed: int = 0) -> bool:
        """Whether the queue holds more than its guarantee (after ``freed`` slots leave)."""
        return self.held[queue] - freed > self.guaranteed(queue)

    def add(self, req: Request, n: int, promise: bool = False) -> None:
        """Count ``n`` more slots (negative: fewer) for the job's queue and owner; a
        ``promise`` is a reservation's: it counts against limits, not as borrowing."""
        queue = req.queue
        was_idle, was_borrowing = self.idle(queue), self.borrowing(queue)
        self.queue[queue] += n
        self.owner[req.owner] += n
        if not req.preemptible:
            self.firm[queue] += n
        if not promise:
            self.held[queue] += n
        if queue in self._g:
            delta = self.idle(queue) - was_idle
            self._idle_by_cohort[self._cohort[queue]] += delta
            self._idle_total += delta
            self.idle_version += bool(delta)
        if n < 0 or self.borrowing(queue) != was_borrowing:
            self.version += 1

    def protected_from(self, queue: str, freed: Mapping[str, int] | None = None) -> int:
        """Idle guaranteed slots of queues that do not lend to ``queue`` (other cohorts)."""
        cohort = self._cohort.get(queue)
        protected = self._idle_total - (self._idle_by_cohort[cohort] if cohort else 0)
        for other, n in (freed or {}).items():
            if other in self._g and self._cohort[other] != cohort:
                protected += max(0, self._g[other] - self.queue[other] + n) - self.idle(other)
        return protected

    def within_guarantee(self, req: Request, n: int, freed: int = 0) -> bool:
        return self.queue[req.queue] - freed + n <= self.guaranteed(req.queue)

    def block(
        self,
        req: Request,
        n: int,
        free: int,
        freed: Mapping[str, int] | None = None,
        freed_owner: int = 0,
    ) -> Block | None:
        """Why ``req`` may not take ``n`` slots now (None: it may), ``free`` of them being
        free, with the slots of ``freed`` (queue -> slots) victims counted as returned."""
        q, config = req.queue, self.config
        if q not in self._g:
            return Block(
                "unknown-queue",
                f"queue {q!r} is not configured any more (queues: {', '.join(config.queues)})",
            )
        back = (freed or {}).get(q, 0)
        used, g, limit = self.queue[q] - back, self._g[q], self._limit[q]
        if used + n > limit:
            borrow = config.queues[q].borrowing_limit
            return Block(
                "queue-limit",
                f"queue {q!r} is at its limit of {_int(limit)} slots "
                f"({g} guaranteed + {borrow} borrowing)",
            )
        cap = config.per_user_cap
        if cap is not None and self.owner[req.owner] - freed_owner + n > cap:
            return Block("user-cap", f"user {req.owner!r} is at the per-user cap of {cap} slots")
        if not req.preemptible and self.firm[q] + n > g:
            return Block(
                "no-borrow",
                f"it cannot be preempted, so it may not borrow: the jobs "
                f"of queue {q!r} that cannot be preempted may hold at most "
                f"its {g} guaranteed slots",
            )
        if used + n <= g or not req.preemptible:  # the latter within the guarantee (firm)
            return None
        protected = self.protected_from(q, freed)
        if protected and n <= free < n + protected:
            return Block(
                "lending",
                f"free slots are held for the guarantees of queues outside "
                f"cohort {self._cohort[q]!r}, which do not lend to queue "
                f"{q!r}",
            )
        return None


def _int(value: float) -> str:
    return "unlimited" if math.isinf(value) else str(int(value))
