"""What the scheduler keeps counted between passes, so a pass need not count it again.

Slots held per queue and owner, the jobs that may be preempted, the jobs that are
leaving: kept as jobs start, leave and go, and copied by each pass (which changes
its copy only).
"""

from __future__ import annotations

from typing import Iterable

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
        for h in holdings:
            self.hold(h)

    def hold(self, h: Holding) -> None:
        self.usage.add(h.request, h.size)
        self.candidates.add(h)
        if h.status not in ACTIVE:
            self.leaving[h.id] = h

    def leave(self, h: Holding) -> None:
        """``h`` was asked to leave (its status is no longer running or paused)."""
        self.candidates.remove(h)
        self.leaving[h.id] = h

    def release(self, h: Holding) -> None:
        self.usage.add(h.request, -h.size)
        self.candidates.remove(h)
        self.leaving.pop(h.id, None)
