"""Gangs: which free slots a job gets, and in which rank order.

:func:`pick_gang` is the rule, over a plain list; :class:`FreeSlots` keeps the free
slots indexed by host so that the same answer comes without sorting the cluster
(a property test holds the two equal).
"""

from __future__ import annotations

import bisect
import contextlib
from collections import Counter
from collections.abc import Iterable, Iterator

from .model import Slot


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


class _Host:
    __slots__ = ("slots", "keys", "uuids", "usable")

    def __init__(self) -> None:
        self.slots: list[Slot] = []  # in rank order
        self.keys: list[tuple[int, str]] = []  # (index, worker), for bisect
        self.uuids: Counter[str] = Counter()
        self.usable = 0  # distinct devices

    def distinct(self, n: int) -> list[Slot]:
        seen: set[str] = set()
        out: list[Slot] = []
        for slot in self.slots:
            if slot.uuid:
                if slot.uuid in seen:
                    continue
                seen.add(slot.uuid)
            out.append(slot)
            if len(out) == n:
                break
        return out


class FreeSlots:
    """The free slots, by host and by how many distinct devices each host has free.

    ``pick(n)`` answers like ``pick_gang(free_slots, n)`` (given that a GPU's UUID
    belongs to one host) in time that grows with the hosts it looks at, not with
    the cluster: best fit looks at the hosts with exactly enough free devices first.

    >>> free = FreeSlots([Slot("w0", "a", "cuda", 0, "g0"), Slot("w1", "a", "cuda", 1, "g1")])
    >>> [s.worker for s in free.pick(2)], free.pick(3)
    (['w0', 'w1'], None)
    """

    def __init__(self, slots: Iterable[Slot] = ()) -> None:
        self._hosts: dict[str, _Host] = {}
        self._buckets: dict[int, set[str]] = {}  # distinct free devices -> hosts
        self._workers: dict[str, Slot] = {}
        self.usable = 0  # distinct devices over all hosts
        for slot in slots:
            self.add(slot)

    def __len__(self) -> int:
        return len(self._workers)

    def __contains__(self, slot: object) -> bool:
        return isinstance(slot, Slot) and self._workers.get(slot.worker) == slot

    def __iter__(self) -> Iterator[Slot]:
        return iter(list(self._workers.values()))

    def add(self, slot: Slot) -> None:
        if slot.worker in self._workers:
            return
        self._workers[slot.worker] = slot
        host = self._hosts.get(slot.host)
        if host is None:
            host = self._hosts[slot.host] = _Host()
        key = (slot.index, slot.worker)
        at = bisect.bisect_left(host.keys, key)
        host.keys.insert(at, key)
        host.slots.insert(at, slot)
        if not slot.uuid or not host.uuids[slot.uuid]:
            self._rebucket(slot.host, host, +1)
        if slot.uuid:
            host.uuids[slot.uuid] += 1

    def discard(self, slot: Slot) -> None:
        if self._workers.get(slot.worker) != slot:
            return
        del self._workers[slot.worker]
        host = self._hosts[slot.host]
        at = bisect.bisect_left(host.keys, (slot.index, slot.worker))
        del host.keys[at], host.slots[at]
        if slot.uuid:
            host.uuids[slot.uuid] -= 1
            if host.uuids[slot.uuid]:
                return  # another free slot still stands for this device
            del host.uuids[slot.uuid]
        self._rebucket(slot.host, host, -1)
        if not host.slots:
            del self._hosts[slot.host]

    def _rebucket(self, name: str, host: _Host, delta: int) -> None:
        if host.usable:
            bucket = self._buckets[host.usable]
            bucket.discard(name)
            if not bucket:
                del self._buckets[host.usable]
        host.usable += delta
        self.usable += delta
        if host.usable:
            self._buckets.setdefault(host.usable, set()).add(name)

    def pick(self, n: int) -> list[Slot] | None:
        """The gang ``pick_gang`` would choose from these slots, or None."""
        if n > self.usable:
            return None
        if not self._buckets:
            return [] if n <= 0 else None
        for count in range(n, max(self._buckets) + 1):
            hosts = self._buckets.get(count)
            if hosts:
                return self._hosts[min(hosts)].distinct(n)
        chosen: list[Slot] = []
        for count in sorted(self._buckets, reverse=True):
            for name in sorted(self._buckets[count]):
                chosen.extend(self._hosts[name].distinct(n - len(chosen)))
                if len(chosen) == n:
                    return rank_order(chosen)
        return None  # unreachable while usable counts are right

    def take(self, slots: Iterable[Slot]) -> None:
        for slot in slots:
            self.discard(slot)

    @contextlib.contextmanager
    def including(self, extra: Iterable[Slot]) -> Iterator[FreeSlots]:
        """These slots counted as free for the duration of the block (a what-if)."""
        added = [s for s in extra if s.worker not in self._workers]
        for slot in added:
            self.add(slot)
        try:
            yield self
        finally:
            for slot in added:
                self.discard(slot)
