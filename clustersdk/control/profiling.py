"""The profile requests of one job and what its ranks reported (pure; :class:`Profiles` is
the part of :class:`~.lifecycle.Lifecycle` that keeps them).

Each ``job.profile(steps=N)`` is an entry: ``seq``, ``steps``, when it was
asked, the gang start (``attempt``) and world size it was asked of, the
ranks' reports (their trace path and summary, see
:mod:`clustersdk.runtime.profiling`) and whether every rank has reported
(``complete``). The list is journaled whole under the job's ``profiles``.

>>> book = Profiles()
>>> book.request(5, now=0.0, attempt=0, world_size=1)
1
>>> book.report(1, 0, {"path": "/p/rank0.pt.trace.json"})
True
"""

from __future__ import annotations

from typing import Any, TypedDict

from ..errors import InvalidTransitionError, SpecError
from ..protocol import MAX_PROFILE_STEPS, Word, profile_word
from ..status import JobStatus
from . import events as ev
from .view import JobView


class ProfileEntry(TypedDict):
    """One ``job.profile`` request and its ranks' reports (journaled as it is)."""

    seq: int
    steps: int
    requested: float
    attempt: int
    world_size: int
    complete: bool
    ranks: list[dict[str, Any]]  # a report per rank (its "rank", trace path and summary)


class Profiles:
    """One job's ``job.profile`` requests and its ranks' reports."""

    def __init__(self) -> None:
        self.seq = 0  # the newest request
        self.entries: list[ProfileEntry] = []

    @staticmethod
    def check(steps: Any) -> None:
        if (
            isinstance(steps, bool)
            or not isinstance(steps, int)
            or not 1 <= steps <= MAX_PROFILE_STEPS
        ):
            raise SpecError(
                f"job.profile(steps={steps!r}): steps must be an int from 1 to "
                f"{MAX_PROFILE_STEPS} (the steps to capture, from the next one)"
            )

    def request(self, steps: Any, *, now: float, attempt: int, world_size: int) -> int:
        """A new request for ``steps`` steps (checked); its sequence number."""
        self.check(steps)
        self.seq += 1
        self.entries.append(
            {
                "seq": self.seq,
                "steps": steps,
                "requested": now,
                "attempt": attempt,
                "world_size": world_size,
                "complete": False,
                "ranks": [],
            }
        )
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

    def entry(self, seq: int) -> ProfileEntry | None:
        return next((p for p in self.entries if p["seq"] == seq), None)

    # --- events ---------------------------------------------------------------------------
    def requested(self, job: JobView, e: ev.ProfileRequested) -> None:
        """A profile of the next ``e.steps`` steps, asked of every rank with one control
        word."""
        self.check(e.steps)
        if job.status not in (JobStatus.RUNNING, JobStatus.PAUSED):
            raise InvalidTransitionError(
                f"job {job.name!r} is {job.status.name}; only a RUNNING or PAUSED job can be "
                "profiled"
            )
        seq = self.request(e.steps, now=job.now, attempt=job.attempt, world_size=job.world_size)
        job.emit(ev.Journal({"profiles": self.entries}))
        job.ask(Word.PROFILE, profile_word(seq, e.steps))

    def profiled(self, job: JobView, e: ev.Profiled) -> None:
        """A rank wrote its trace; once every rank has, the profile is complete."""
        if self.entry(e.seq) is None:
            return
        complete = self.report(e.seq, e.rank, e.profile)
        job.emit(ev.Journal({"profiles": self.entries}))
        if complete:
            job.emit(ev.Publish({"kind": "profile", "seq": e.seq}))
