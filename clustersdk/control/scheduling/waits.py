"""Why every queued job waits, without writing 10,000 lines on every event.

A pass looks at the jobs whose wait it may change; behind the head of a queue
that nothing in the pass could move, it skips the rest of the queue. Their waits
are worked out when read, from the state the pass ended in (so reading them all
costs what looking at them would have).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from .model import Request, Wait


class Waits(Mapping[str, Wait]):
    """job id -> :class:`Wait` for every job the decision leaves queued.

    Equal waits are one object (interned), so ``new[job] is not old[job]`` tells
    a change cheaply.
    """

    def __init__(
        self,
        seen: dict[str, Wait],
        skipped: Sequence[Sequence[Request]],
        resolve: Callable[[Request], Wait],
    ) -> None:
        self._seen = seen
        self._skipped = skipped  # tails of queues, copied when the pass ended
        self._resolve = resolve
        self._index: dict[str, Request] | None = None
        self._resolved: dict[str, Wait] = {}

    def _tail(self) -> dict[str, Request]:
        if self._index is None:
            self._index = {r.id: r for tail in self._skipped for r in tail}
        return self._index

    def __getitem__(self, job: str) -> Wait:
        wait = self._seen.get(job)
        if wait is not None:
            return wait
        wait = self._resolved.get(job)
        if wait is None:
            req = self._tail().get(job)
            if req is None:
                raise KeyError(job)
            wait = self._resolved[job] = self._resolve(req)
        return wait

    def __contains__(self, job: object) -> bool:
        return job in self._seen or job in self._tail()

    def __iter__(self) -> Iterator[str]:
        yield from self._seen
        for tail in self._skipped:
            for req in tail:
                yield req.id

    def __len__(self) -> int:
        return len(self._seen) + sum(len(tail) for tail in self._skipped)

    @property
    def looked_at(self) -> Mapping[str, Wait]:
        """The waits the pass worked out itself (the others were skipped)."""
        return self._seen
