"""Preemption victims: who may be preempted for whom, and who loses the least work.

Order of preference (the first loses the least): a job that is paused or idle
(no step for longer than the preemption grace), then the least work at risk in
GPU-seconds (see :func:`work_at_risk`), then the lowest priority, then the
youngest. A set of victims is chosen greedily in that order until the waiting
job fits, then pruned: a victim whose slots turn out not to be needed is spared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .config import PolicyConfig
from .model import ACTIVE, Holding, Request
from .quota import Usage


def is_idle(h: Holding, now: float, grace: float) -> bool:
    """Paused, or no finished step for longer than ``grace`` seconds."""
    if h.status == "paused":
        return True
    last = h.last_progress if h.last_progress is not None else h.started_at
    return now - last > grace


def work_at_risk(h: Holding, now: float, config: PolicyConfig) -> float:
    """GPU-seconds that preempting ``h`` costs.

    Without a checkpoint_dir it is stopped: everything since it started is lost.
    With one, a just-in-time checkpoint saves its work: nothing if its newest
    committed checkpoint is of the current step, else the time to write its state
    (``state_bytes`` at the configured checkpoint bandwidth), or, when the size is
    unknown, the time since its newest checkpoint (what a failed save would lose).
    """
    if not h.request.has_checkpoint_dir:
        return max(0.0, now - h.started_at) * h.size
    if h.steps_since_checkpoint == 0:
        return 0.0
    if h.state_bytes is not None:
        return h.state_bytes / config.checkpoint_bandwidth * h.size
    since = h.checkpoint_at if h.checkpoint_at is not None else h.started_at
    return max(0.0, now - since) * h.size


def victim_key(h: Holding, now: float, config: PolicyConfig) -> tuple[bool, float, int, float, str]:
    """Sort key: the first victim loses the least."""
    idle = is_idle(h, now, config.preemption_grace)
    return (not idle, work_at_risk(h, now, config), h.request.priority, -h.started_at, h.id)


def may_preempt(req: Request, n: int, v: Holding, usage: Usage, freed: Mapping[str, int]) -> bool:
    """Whether ``req`` (asking for ``n`` slots) may preempt ``v``, given the slots
    ``freed`` (queue -> slots) by the victims chosen before it.

    Within its queue a job preempts lower priorities, and among its owner's jobs too
    when it fits its own queue's guarantee. It reclaims from a queue that borrows past
    its guarantee: whatever the priority when its own queue stays within its
    guarantee, else lower priorities only. Never a job that said ``preemptible=False``.
    Each rule keeps the victim, once back in the queue, behind the job it made room for
    (a borrower never preempts a job that fits its guarantee: that one would come first
    and take its slots back).
    """
    if not v.request.preemptible or v.status not in ACTIVE:
        return False
    other = v.request
    lower = other.priority < req.priority
    if other.queue == req.queue:
        return lower
    within = usage.within_guarantee(req, n, freed.get(req.queue, 0))
    if usage.borrowing(other.queue, freed.get(other.queue, 0)):
        return lower or within
    return lower and within and bool(req.owner) and other.owner == req.owner


class Victims:
    """The holdings one pass may preempt: least work lost first (sorted when first
    needed), with their slots counted per queue, owner and priority so that most
    searches that cannot succeed are told so without looking at any job."""

    def __init__(self, holdings: Iterable[Holding], now: float, config: PolicyConfig) -> None:
        self.now, self.config = now, config
        self.all = {h.id: h for h in holdings if h.status in ACTIVE and h.request.preemptible}
        self.taken: set[str] = set()
        self.version = 0  # bumps when a candidate leaves
        self._sorted: list[Holding] | None = None
        self._below_cache: tuple[tuple[int, int], set[str]] | None = None  # key, owners
        self.by_queue: dict[str, dict[int, int]] = {}  # queue -> priority -> slots
        self.by_owner: dict[str, dict[int, int]] = {}
        for h in self.all.values():
            self._count(h, +1)

    def copy(self, now: float) -> Victims:
        """A fresh pool for one pass at ``now``, from this kept one."""
        new = Victims((), now, self.config)
        new.all = dict(self.all)
        new.by_queue = {k: dict(row) for k, row in self.by_queue.items()}
        new.by_owner = {k: dict(row) for k, row in self.by_owner.items()}
        return new

    def add(self, h: Holding) -> None:
        """A kept pool: ``h`` holds slots now (a candidate if it may be preempted)."""
        if h.status in ACTIVE and h.request.preemptible and h.id not in self.all:
            self.all[h.id] = h
            self._count(h, +1)

    def remove(self, h: Holding) -> None:
        """A kept pool: ``h`` leaves or is gone."""
        if self.all.pop(h.id, None) is not None:
            self._count(h, -1)

    def _count(self, h: Holding, sign: int) -> None:
        for table, key in ((self.by_queue, h.request.queue), (self.by_owner, h.request.owner)):
            row = table.setdefault(key, {})
            row[h.request.priority] = row.get(h.request.priority, 0) + sign * h.size

    def take(self, h: Holding) -> None:
        """``h`` leaves (a victim, or reclaimed): no longer a candidate."""
        if h.id not in self.taken:
            self.taken.add(h.id)
            self.version += 1
            if h.status in ACTIVE and h.request.preemptible:
                self._count(h, -1)

    def below(self, owner: str, priority: int) -> bool:
        """Whether ``owner`` has candidates of a lower priority than ``priority``."""
        return any(n for p, n in self.by_owner.get(owner, {}).items() if p < priority)

    def may_move(self, queue: str, priority: int, owners: Mapping[str, int], usage: Usage) -> bool:
        """Whether some job of ``queue`` at ``priority`` or lower, owned by one of
        ``owners``, might find a victim (a cheap over-estimate of :func:`may_preempt`)."""

        def below(row: Mapping[int, int]) -> bool:
            return any(n for p, n in row.items() if p < priority)

        if below(self.by_queue.get(queue, {})):
            return True
        within = usage.queue[queue] < usage.guaranteed(queue)
        if within:
            lower = self._owners_below(priority)
            small, big = (lower, owners) if len(lower) < len(owners) else (owners, lower)
            if any(o in big for o in small):
                return True
        return any(
            (within and any(row.values())) or below(row)
            for q, row in self.by_queue.items()
            if q != queue and usage.borrowing(q)
        )

    def _owners_below(self, priority: int) -> set[str]:
        key = (priority, self.version)
        if self._below_cache is None or self._below_cache[0] != key:
            self._below_cache = (
                key,
                {
                    o
                    for o, row in self.by_owner.items()
                    if any(n for p, n in row.items() if p < priority)
                },
            )
        return self._below_cache[1]

    def bound(self, req: Request, n: int, usage: Usage, limit: str | None = None) -> int:
        """At most this many slots could be freed for ``req`` by the rules of
        :func:`may_preempt` (``limit``: the kind of quota block victims must lift)."""
        p = req.priority

        def below(row: Mapping[int, int]) -> int:
            return sum(v for q, v in row.items() if q < p)

        within = usage.within_guarantee(req, n)
        mine = below(self.by_owner.get(req.owner, {})) if req.owner and within else 0
        same = below(self.by_queue.get(req.queue, {}))
        if limit == "user-cap":  # only the owner's own jobs lift its cap
            return sum(self.by_owner.get(req.owner, {}).values())
        if limit in ("queue-limit", "no-borrow"):
            return same + mine
        lent = sum(
            sum(row.values()) if within else below(row)
            for q, row in self.by_queue.items()
            if q != req.queue and usage.borrowing(q)
        )
        return same + mine + lent

    def ordered(self, req: Request, n: int, usage: Usage) -> list[Holding]:
        """Candidates for ``req``, least work lost first; a queue reclaiming its
        guarantee takes from borrowing queues before its own lower priorities."""
        if self._sorted is None:
            self._sorted = sorted(
                self.all.values(), key=lambda h: victim_key(h, self.now, self.config)
            )
        order = [v for v in self._sorted if v.id not in self.taken]
        if not usage.within_guarantee(req, n):
            return order
        first = [
            v for v in order if v.request.queue != req.queue and usage.borrowing(v.request.queue)
        ]
        chosen = {v.id for v in first}
        return first + [v for v in order if v.id not in chosen]


def choose(
    candidates: Iterable[Holding],
    eligible: Callable[[Holding, Mapping[str, int]], bool],
    fits: Callable[[list[Holding], Mapping[str, int]], object],
) -> tuple[list[Holding] | None, bool]:
    """The victims, taken in order while ``eligible`` until ``fits`` (truthy), then pruned,
    or None when even all eligible candidates would not make room; and whether any
    candidate was eligible at all."""
    chosen: list[Holding] = []
    freed: dict[str, int] = {}
    for v in candidates:
        if not eligible(v, freed):
            continue
        chosen.append(v)
        freed[v.request.queue] = freed.get(v.request.queue, 0) + v.size
        if fits(chosen, freed):
            break
    else:
        return None, bool(chosen)
    for v in reversed(chosen[:-1]):  # the costliest first: spare it if the others suffice
        trial = [c for c in chosen if c is not v]
        trial_freed = _still_eligible(trial, eligible)
        if trial_freed is not None and fits(trial, trial_freed):
            chosen, freed = trial, trial_freed
    return chosen, True


def _still_eligible(
    victims: list[Holding], eligible: Callable[[Holding, Mapping[str, int]], bool]
) -> dict[str, int] | None:
    """The slots freed per queue by ``victims``, or None if one of them is no longer
    eligible once the others before it are gone (e.g. its queue stopped borrowing)."""
    freed: dict[str, int] = {}
    for v in victims:
        if not eligible(v, freed):
            return None
        freed[v.request.queue] = freed.get(v.request.queue, 0) + v.size
    return freed
