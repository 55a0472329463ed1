"""Pure scheduling logic: gang allocation and rank order. No Dask, torch or I/O.

The scheduler plugin feeds it the queue and the slot inventory and carries out
what it returns, so every decision here is testable in microseconds.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable


@dataclasses.dataclass(frozen=True)
class Slot:
    """One GPU (or one CPU slot) owned by one Dask worker."""

    worker: str          # the worker's address
    host: str
    kind: str            # "cuda" or "cpu"
    index: int           # device index on the host (-1 for a CPU slot)
    uuid: str = ""       # the physical GPU's UUID; two slots with one UUID share a GPU


@dataclasses.dataclass(frozen=True)
class Pending:
    job: str
    world_size: int


def rank_order(slots: Iterable[Slot]) -> list[Slot]:
    """Ranks are assigned by host, then device, so neighbours share a host."""
    return sorted(slots, key=lambda s: (s.host, s.index, s.worker))


def pick_gang(free: Iterable[Slot], n: int) -> list[Slot] | None:
    """``n`` free slots on distinct physical devices, in rank order, or None.

    The gang goes on as few hosts as the free slots allow (intra-host links are
    the fast ones): the fullest hosts first, and when one host can hold it
    all, the one with the fewest free slots that does (best fit, so that big
    holes stay open for big jobs).
    """
    by_host: dict[str, list[Slot]] = {}
    devices: set[str] = set()
    for slot in rank_order(free):
        if slot.uuid and slot.uuid in devices:
            continue  # NCCL refuses two ranks on one GPU ("Duplicate GPU detected")
        if slot.uuid:
            devices.add(slot.uuid)
        by_host.setdefault(slot.host, []).append(slot)
    fits = [slots for slots in by_host.values() if len(slots) >= n]
    if fits:
        return min(fits, key=len)[:n]
    chosen: list[Slot] = []
    for slots in sorted(by_host.values(), key=len, reverse=True):
        chosen.extend(slots[: n - len(chosen)])
        if len(chosen) == n:
            return rank_order(chosen)
    return None


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
