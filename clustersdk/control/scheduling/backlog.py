"""The queued jobs, kept sorted per queue, with what a pass asks of a whole queue at once.

A pass walks the queues merged in order; what it may skip depends on the smallest
job and the shortest ``time_limit`` left in a queue, so those are kept too.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Iterable, Iterator

from .model import Key, Request


class Backlog:
    """Queued requests by queue, each queue in ``Request.key`` order."""

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self.streams: dict[str, list[Request]] = {}  # queue -> its requests, in order
        self._keys: dict[str, list[Key]] = {}
        self._limits: dict[str, list[float]] = {}  # queue -> sorted time_limits
        self._sizes: dict[str, Counter[int]] = {}  # queue -> smallest sizes
        self.owners: dict[str, Counter[str]] = {}  # queue -> owner -> queued jobs
        self.by_id: dict[str, Request] = {}
        for req in requests:
            self.add(req)

    def __len__(self) -> int:
        return len(self.by_id)

    def __contains__(self, job: object) -> bool:
        return job in self.by_id

    def __iter__(self) -> Iterator[Request]:
        """Every request in queue order (all queues merged)."""
        return heapq.merge(*self.streams.values(), key=lambda r: r.key)

    def add(self, req: Request) -> None:
        q = req.queue
        keys = self._keys.setdefault(q, [])
        at = bisect.bisect_left(keys, req.key)
        keys.insert(at, req.key)
        self.streams.setdefault(q, []).insert(at, req)
        if req.time_limit is not None:
            bisect.insort(self._limits.setdefault(q, []), req.time_limit)
        self._sizes.setdefault(q, Counter())[req.smallest] += 1
        self.owners.setdefault(q, Counter())[req.owner] += 1
        self.by_id[req.id] = req

    def remove(self, job: str) -> Request:
        req = self.by_id.pop(job)
        q = req.queue
        at = bisect.bisect_left(self._keys[q], req.key)
        del self._keys[q][at], self.streams[q][at]
        if req.time_limit is not None:
            limits = self._limits[q]
            del limits[bisect.bisect_left(limits, req.time_limit)]
        sizes = self._sizes[q]
        sizes[req.smallest] -= 1
        if not sizes[req.smallest]:
            del sizes[req.smallest]
        owners = self.owners[q]
        owners[req.owner] -= 1
        if not owners[req.owner]:
            del owners[req.owner]
        if not self.streams[q]:
            del self.streams[q], self._keys[q], self._sizes[q], self.owners[q]
            self._limits.pop(q, None)
        return req

    def shortest_limit(self, queue: str) -> float | None:
        """The shortest time_limit of the queue's jobs (None: none gave one)."""
        limits = self._limits.get(queue)
        return limits[0] if limits else None

    def smallest(self, queue: str) -> int:
        """The fewest slots any of the queue's jobs can start on."""
        return min(self._sizes[queue])
