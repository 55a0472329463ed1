"""The lines a user reads: why a job waits, why it was preempted or reclaimed."""

from __future__ import annotations

from collections.abc import Sequence

from .config import PolicyConfig
from .model import Holding, Request


def duration(seconds: float) -> str:
    """``40 s``, ``12 min``, ``2.5 h``, ``3 days``."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 120 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _names(jobs: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(repr(j) for j in jobs[:most])
    return shown + (f" and {len(jobs) - most} more" if len(jobs) > most else "")


def _slots(n: int) -> str:
    return f"{n} slot" if n == 1 else f"{n} slots"


def limit(text: str, n: int) -> str:
    return f"waiting: {text}; it needs {_slots(n)}"


def head(n: int, start_by: float | None, ending: Sequence[str]) -> str:
    if start_by is None:
        return (
            f"waiting for {_slots(n)} to be free; no estimate of when (the jobs holding them "
            "gave no time_limit); slots are held for it as they free up"
        )
    verb = "ends" if len(ending) == 1 else "end"
    return (
        f"waiting for {_slots(n)} to be free, expected when {_names(ending)} {verb} "
        "(by time_limit); slots are reserved for it"
    )


def behind(first: Request, start_by: float | None, config: PolicyConfig) -> str:
    text = (
        f"waiting behind job {first.label!r} (priority {config.priority_name(first.priority)}, "
        f"{_slots(first.world_size)}), first in queue {first.queue!r}"
    )
    if start_by is None:
        return text + "; it may only start on slots that job cannot use"
    return (
        text + "; it may start sooner only on slots that job cannot use, or if its "
        "time_limit ends before that job's reserved start"
    )


def preempting(victims: Sequence[str], n: int, grace: float) -> str:
    return (
        f"starting soon: {_names(victims)} {'is' if len(victims) == 1 else 'are'} leaving to "
        f"free {_slots(n)} for it (within the {duration(grace)} preemption grace)"
    )


def victim(h: Holding, by: Request, how: str, config: PolicyConfig) -> str:
    req = h.request
    size = _slots(req.world_size)
    if req.min_world_size and req.min_world_size < req.world_size:
        size = f"{req.min_world_size} to {req.world_size} slots"
    who = f"job {by.label!r} (priority {config.priority_name(by.priority)})"
    if how == "suspend":
        return f"preempted by {who} at step {h.step}, will resume when {size} are free"
    return (
        f"stopped for {who} at step {h.step} (no checkpoint_dir, so it starts over), "
        f"will run again when {size} are free"
    )


def reclaimed(h: Holding, idle_for: float, timeout: float, how: str) -> str:
    what = "paused" if h.status == "paused" else "without a finished step"
    text = (
        f"{how} after {duration(idle_for)} {what} (idle timeout of queue "
        f"{h.request.queue!r}: {duration(timeout)}); its slots are free for others"
    )
    return text + ("; job.resume() brings it back" if how == "suspended" else "")


def overdue(h: Holding, grace: float) -> str:
    return (
        f"did not checkpoint within the {duration(grace)} preemption grace: stopped, it "
        "resumes from its newest committed checkpoint"
    )
