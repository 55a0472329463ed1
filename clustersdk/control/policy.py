"""Pure scheduling logic: gang allocation, priorities, quotas, preemption, backfill.

No Dask, torch or I/O: the scheduler plugin feeds it the state and carries out
what it returns, so every decision is testable in microseconds. The rules, and
the :class:`Scheduler` and :func:`decide` that keep them, live in
:mod:`clustersdk.control.scheduling`; this module is their front door.
"""

from __future__ import annotations

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

__all__ = [
    "Admission",
    "ClusterState",
    "Decision",
    "FreeSlots",
    "Holding",
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
]
