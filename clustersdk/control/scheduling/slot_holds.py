"""What a pass holds for waiting jobs: slots set aside (not a HELD job: see control/holds.py)."""

from __future__ import annotations

import dataclasses

from .model import Request, Slot


class GiveUp(Exception):
    """Placing one arrival on a kept pass needs what only a whole pass does right."""


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
    kind: str  # "head", "preempting", or "claim" (freed slots a job is owed)
    guaranteed: bool = False  # its job fits its queue's guarantee (placed in round one)
