"""What the scheduler keeps counted between passes, so a pass need not count it again.

Slots held per queue and owner, the jobs that may be preempted, the jobs that are
leaving, and when each is expected to free its slots: kept as jobs start, leave
and go, and copied (or only read) by each pass.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from .config import PolicyConfig
from .model import ACTIVE, Holding
from .quota import Usage
from .victims import Victims


class Ledger:
    """Usage, candidates and leaving jobs of a set of holdings, kept up to date."""

    def __init__(self, config: PolicyConfig, total: int, holdings: Iterable[Holding] = ()) -> None:
        self.usage = Usage(config, total)
        self.candidates = Victims((), 0.0, config)
        self.leaving: dict[str, Holding] = {}
        self.grace = config.preemption_grace
        # (time, job) by when each job is expected to free its slots: a running one by its
        # time_limit, a leaving one by the grace; those without an estimate are not here
        self.releases: list[tuple[float, str]] = []
        self._filed: dict[str, tuple[float, str]] = {}
        for h in holdings:
            self.hold(h)

    def hold(self, h: Holding) -> None:
        self.usage.add(h.request, h.size)
        self.candidates.add(h)
        if h.status not in ACTIVE:
            self.leaving[h.id] = h
        self._file(h)

    def leave(self, h: Holding) -> None:
        """``h`` was asked to leave (its status is no longer running or paused)."""
        self.candidates.remove(h)
        self.leaving[h.id] = h
        self._file(h)

    def release(self, h: Holding) -> None:
        self.usage.add(h.request, -h.size)
        self.candidates.remove(h)
        self.leaving.pop(h.id, None)
        self._unfile(h.id)

    def _file(self, h: Holding) -> None:
        self._unfile(h.id)
        if h.status in ACTIVE:
            t = h.ends_at
        else:
            t = None if h.interrupted_at is None else h.interrupted_at + self.grace
        if t is not None:
            key = self._filed[h.id] = (t, h.id)
            bisect.insort(self.releases, key)

    def _unfile(self, job: str) -> None:
        key = self._filed.pop(job, None)
        if key is not None:
            del self.releases[bisect.bisect_left(self.releases, key)]
