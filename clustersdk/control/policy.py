"""Pure scheduling logic: gang allocation, priorities, quotas, preemption, backfill.

No Dask, torch or I/O: the scheduler plugin feeds it the state and carries out
what it returns, so every decision is testable in microseconds. The rules, and
the :class:`Scheduler` and :func:`decide` that keep them, live in
:mod:`clustersdk.control.scheduling`; this module is their front door.

``Pending``, ``schedule`` and ``wait_reason`` are the strict FIFO of before the
scheduler, kept while the plugin still calls them.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from .scheduling import (
    REST,
    Admission,
    ClusterState,
    Decision,
    FreeSlots,
    Holding,
    PolicyConfig,
    Preempt,
    QueueConfig,
    Request,
    Reservation,
    Scheduler,
    Slot,
    Start,
    Wait,
    admit,
    decide,
    pick_gang,
    rank_order,
)


@dataclasses.dataclass(frozen=True)
class Pending:
    job: str
    world_size: int


def schedule(queue: list[Pending], free: Iterable[Slot]) -> list[tuple[str, list[Slot]]]:
    """Strict FIFO gang scheduling: start queued jobs in order while the head fits.

    A job gets all its slots at once or none; a job that doesn't fit blocks the
    ones behind it, so a large job is never starved by a stream of small ones.
    """
    remaining = list(free)
    started: list[tuple[str, list[Slot]]] = []
    for pending in queue:
        gang = pick_gang(remaining, pending.world_size)
        if gang is None:
            break
        started.append((pending.job, gang))
        taken = set(gang)
        remaining = [s for s in remaining if s not in taken]
    return started


def wait_reason(world_size: int, free: int, total: int, ahead: int) -> str:
    """A one-line answer to "what is this queued job waiting for?"."""
    if ahead:
        return f"waiting behind {ahead} earlier job(s) in the queue ({free} of {total} slots free)"
    return f"waiting for {world_size} free slots ({free} of {total} free now)"


__all__ = [
    "Admission",
    "ClusterState",
    "Decision",
    "FreeSlots",
    "Holding",
    "Pending",
    "PolicyConfig",
    "Preempt",
    "QueueConfig",
    "REST",
    "Request",
    "Reservation",
    "Scheduler",
    "Slot",
    "Start",
    "Wait",
    "admit",
    "decide",
    "pick_gang",
    "rank_order",
    "schedule",
    "wait_reason",
]
