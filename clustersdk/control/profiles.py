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

from typing import TYPE_CHECKING, Any

from ..errors import InvalidTransitionError, SpecError
from ..protocol import MAX_PROFILE_STEPS, Word, profile_word
from ..status import JobStatus
from . import events as ev

if TYPE_CHECKING:
    from .lifecycle import Lifecycle


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


# --- the lifecycle's rules (events ProfileRequested and Profiled) ---------------------------
def requested(job: Lifecycle, e: ev.ProfileRequested) -> None:
    """A profile of the next ``e.steps`` steps, asked of every rank with one control word."""
    job.profiles.check(e.steps)
    if job.status not in (JobStatus.RUNNING, JobStatus.PAUSED):
        raise InvalidTransitionError(
            f"job {job.name!r} is {job.status.name}; only a RUNNING or PAUSED job can be "
            "profiled")
    seq = job.profiles.request(e.steps, now=job._now, attempt=job.attempt,
                               world_size=job.world_size)
    job._out.append(ev.Journal({"profiles": job.profiles.entries}))
    job._ask(Word.PROFILE, profile_word(seq, e.steps))


def profiled(job: Lifecycle, e: ev.Profiled) -> None:
    """A rank wrote its trace; once every rank has, the profile is complete."""
    if job.profiles.entry(e.seq) is None:
        return
    complete = job.profiles.report(e.seq, e.rank, e.profile)
    job._out.append(ev.Journal({"profiles": job.profiles.entries}))
    if complete:
        job._out.append(ev.Publish({"kind": "profile", "seq": e.seq}))
