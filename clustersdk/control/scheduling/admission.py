"""Launch-time checks: refuse, before any slot is taken, a job that can never run.

>>> config = PolicyConfig.from_dict({"queues": {"small": {"guaranteed": 2, "borrowing-limit": 2}}})
>>> admit(config, world_size=4, queue="small", priority="high")
Admission(queue='small', priority=100, priority_name='high')
>>> admit(config, world_size=5, queue="small")
Traceback (most recent call last):
...
clustersdk.errors.CapacityError: world_size=5 can never fit queue 'small': it may hold at most 4 slots (2 guaranteed + 2 borrowing limit); ask for at most 4 ranks or use another queue
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from ...errors import CapacityError, SpecError
from .config import REST, PolicyConfig
from .reasons import duration


@dataclasses.dataclass(frozen=True)
class Admission:
    """What a launch resolved to: the queue and the priority as an int (and its name)."""

    queue: str
    priority: int
    priority_name: str


def resolve_queue(config: PolicyConfig, queue: str | None) -> str:
    """The queue's name (None: the default queue); SpecError if there is no such queue."""
    if queue is None:
        return config.default_queue
    if not isinstance(queue, str) or queue not in config.queues:
        known = ", ".join(repr(q) for q in config.queues)
        raise SpecError(
            f"unknown queue {queue!r}; the queues are {known} (clustersdk.scheduling.queues)"
        )
    return queue


def admit(
    config: PolicyConfig,
    *,
    world_size: int,
    queue: str | None = None,
    priority: int | str | None = None,
    preemptible: bool = True,
    time_limit: float | None = None,
    min_world_size: int | None = None,
    total_slots: int | None = None,
) -> Admission:
    """Resolve the queue and priority of a launch and refuse one that can never run.

    SpecError: an unknown queue or priority class, a bad ``preemptible``,
    ``time_limit`` or ``min_world_size``, ``preemptible=False`` below the priority
    that may refuse preemption. CapacityError: more ranks than the queue's quota
    plus borrowing limit, the per-user cap, or (not preemptible, so not borrowing)
    the queue's guarantee. ``total_slots`` (the cluster's size) resolves a
    ``guaranteed: rest`` queue; without it, those checks wait for the scheduler.
    """
    q = resolve_queue(config, queue)
    prio = config.priority(priority)
    if not isinstance(preemptible, bool):
        raise SpecError(f"preemptible must be True or False, got {preemptible!r}")
    _check_time_limit(config, time_limit)
    smallest = _smallest(world_size, min_world_size)
    floor = config.non_preemptible_min_priority
    if not preemptible and prio < floor:
        raise SpecError(
            f"preemptible=False needs priority {config.priority_name(floor)} ({floor}) or higher, "
            f"got {config.priority_name(prio)} ({prio}): a lower-priority job that can't be "
            "preempted would hold its slots against every job above it; drop preemptible=False "
            "or raise the priority"
        )
    if total_slots is not None and smallest > total_slots:
        raise CapacityError(
            f"world_size={smallest} is more than this cluster's {total_slots} "
            "slots; add workers or ask for fewer ranks"
        )
    queue_config = config.queues[q]
    if queue_config.guaranteed != REST or total_slots is not None:
        guaranteed = config.guaranteed(q, total_slots or 0)
        limit = config.limit(q, total_slots or 0)
        if smallest > limit:
            raise CapacityError(
                f"world_size={smallest} can never fit queue {q!r}: it may hold at most "
                f"{int(limit)} slots ({guaranteed} guaranteed + {queue_config.borrowing_limit} "
                f"borrowing limit); ask for at most {int(limit)} ranks or use another queue"
            )
        reach = _reach(config, q, total_slots) if total_slots is not None else math.inf
        if smallest > reach:
            raise CapacityError(
                f"world_size={smallest} can never fit queue {q!r}: it can hold at most {reach} "
                f"slots, those the queues of other cohorts than {queue_config.cohort!r} do not "
                "guarantee (a queue never borrows the idle guarantee of another cohort)"
            )
        if not preemptible and smallest > guaranteed:
            raise CapacityError(
                f"world_size={smallest} can never fit queue {q!r} without borrowing, and a job "
                f"with preemptible=False never borrows (a lender takes borrowed slots back by "
                f"preemption): the queue guarantees {guaranteed} slots"
            )
    cap = config.per_user_cap
    if cap is not None and smallest > cap:
        raise CapacityError(
            f"world_size={smallest} is more than the per-user cap of {cap} slots "
            "(clustersdk.scheduling.per-user-cap)"
        )
    return Admission(q, prio, config.priority_name(prio))


def _reach(config: PolicyConfig, queue: str, total: int) -> int:
    """The most slots ``queue`` can ever hold on ``total``: all but what queues of other
    cohorts guarantee (those it never borrows; when they use them, they are not free)."""
    cohort = config.queues[queue].cohort
    others = sum(
        config.guaranteed(q, total) for q, c in config.queues.items() if c.cohort != cohort
    )
    return max(0, total - others)


def _check_time_limit(config: PolicyConfig, time_limit: float | None) -> None:
    if time_limit is None:
        return
    if (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, numbers.Real)
        or math.isnan(time_limit)
        or time_limit <= 0
    ):
        raise SpecError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    if time_limit > config.max_time_limit:
        raise SpecError(
            f"time_limit={time_limit!r} s ({duration(time_limit)}) is more than the "
            f"{duration(config.max_time_limit)} this cluster accepts "
            "(clustersdk.scheduling.max-time-limit); leave it out if you have no estimate"
        )


def _smallest(world_size: int, min_world_size: int | None) -> int:
    for name, value in (("world_size", world_size), ("min_world_size", min_world_size)):
        if value is None and name == "min_world_size":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise SpecError(f"{name} must be an int of at least 1, got {value!r}")
    if min_world_size is not None and min_world_size > world_size:
        raise SpecError(f"min_world_size={min_world_size} is more than world_size={world_size}")
    return int(min_world_size or world_size)
