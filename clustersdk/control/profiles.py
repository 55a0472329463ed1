"""The profile requests of one job and what its ranks reported (pure; kept by the lifecycle).

Each ``job.profile(steps=N)`` is an entry: ``seq``, ``steps``, when it was
asked, the gang start (``attempt``) and world size it was asked of, the
ranks' reports (their trace path and summary, see
:mod:`clustersdk.runtime.profiling`) and whether every rank has reported
(``complete``). The list is journaled whole under the job's ``profiles``.

>>> book = ProfileBook()
>>> book.request(5, now=0.0, attempt=0, world_size=1)
1
>>> book.report(1, 0, {"path": "/p/rank0.pt.trace.json"})
True
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecError
from ..protocol import MAX_PROFILE_STEPS


class ProfileBook:
    def __init__(self) -> None:
        self.seq = 0  # the newest request
        self.entries: list[dict[str, Any]] = []

    @staticmethod
    def check(steps: Any) -> None:
        if (isinstance(steps, bool) or not isinstance(steps, int)
                or not 1 <= steps <= MAX_PROFILE_STEPS):
            raise SpecError(f"job.profile(steps={steps!r}): steps must be an int from 1 to "
                            f"{MAX_PROFILE_STEPS} (the steps to capture, from the next one)")

    def request(self, steps: Any, *, now: float, attempt: int, world_size: int) -> int:
        """A new request for ``steps`` steps (checked); its sequence number."""
        self.check(steps)
        self.seq += 1
        self.entries.append({"seq": self.seq, "steps": steps, "requested": now,
                             "attempt": attempt, "world_size": world_size,
                             "complete": False, "ranks": []})
        return self.seq

    def report(self, seq: int, rank: int, profile: dict[str, Any]) -> bool:
        """Rank ``rank``'s report for request ``seq``; True once it completes the request."""
        entry = self.entry(seq)
        if entry is None or entry["complete"]:
            return False
        others = [r for r in entry["ranks"] if r.get("rank") != rank]
        entry["ranks"] = sorted([*others, {**profile, "rank": rank}], key=lambda r: r["rank"])
        entry["complete"] = len(entry["ranks"]) >= entry["world_size"]
        return entry["complete"]

    def entry(self, seq: int) -> dict[str, Any] | None:
        return next((p for p in self.entries if p["seq"] == seq), None)
