"""Goodput: the share of a job's wall time that became committed training, and where
the rest went.

Pure. The job's wall time runs from its first allocation (waiting in the queue
before it ever started is not counted) to its end, or now. Every second of it
lands in exactly one bucket, so the buckets add up to the wall time:

``productive``
    steps that stand: each step's time (boundary to boundary, less time paused
    and checkpointing) as rank 0 measured it (:mod:`clustersdk.runtime.phases`).
``checkpoint``
    the ranks blocked by checkpoint saves inside steps.
``lost``
    steps that a restart threw away: done after the checkpoint the job went back to.
``startup``
    on its slots but not in a step: from the allocation to the first step
    (processes, process group, model, restore) and after the last one (the exit,
    a preemption's checkpoint and hand-over).
``hung``
    no step finished for ``hang_timeout``.
``queued``
    back in the queue after it had started (a preemption, a lost worker, a notice).
``paused``
    paused, suspended, or held for a post-mortem.

A job that never calls ``ctx.loop`` has no step times: its time on slots is
all ``startup`` and its ``goodput`` is None.

>>> g = Goodput()
>>> g.status("STARTING", 100.0); g.status("RUNNING", 102.0)
>>> g.steps([[0, 0, 0, 0, 0.0, 0, 1.0], [1, 0, 0, 0, 0.5, 0, 1.5], [2, 0, 0, 0, 0, 0, 1.0]])
>>> g.rollback(2)                     # a restart from the checkpoint before step 2
>>> g.status("QUEUED", 106.0); g.status("STARTING", 108.0); g.status("RUNNING", 109.0)
>>> g.status("FINISHED", 110.0)
>>> s = g.summary(110.0)
>>> s["seconds"]
{'productive': 2.0, 'checkpoint': 0.5, 'lost': 1.0, 'startup': 4.5, 'hung': 0.0, 'queued': 2.0, 'paused': 0.0}
>>> s["wall"], s["goodput"], s["steps"], s["lost_steps"]
(10.0, 0.2, 2, 1)
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

from ..protocol import PHASES
from .scheduling.reasons import duration

BUCKETS = ("productive", "checkpoint", "lost", "startup", "hung", "queued", "paused")
#: How each bucket reads, in the CLI, the dashboards and the docs.
LABELS = {
    "productive": "steps that stand",
    "checkpoint": "checkpoint stalls",
    "lost": "lost",
    "startup": "start-up and exit",
    "hung": "hung",
    "queued": "queued again",
    "paused": "paused",
}
# where a status's wall time goes (the rest of the time on slots is split by step times)
_ON_SLOTS = frozenset({"STARTING", "RUNNING", "SUSPENDING", "STOPPING", "RESTARTING"})
_BY_STATUS = {"HUNG": "hung", "QUEUED": "queued", "PAUSED": "paused", "SUSPENDED": "paused"}
_BY_STATUS["HELD"] = "paused"
_ENDED = frozenset({"FINISHED", "FAILED", "STOPPED"})
_CHECKPOINT = 1 + PHASES.index("checkpoint")  # in a [step, *PHASES] row
_TOTAL = 1 + PHASES.index("total")


class Goodput:
    """One job's goodput, fed its status changes (scheduler clock) and rank 0's step
    phases, and told when a restart rolls the steps back."""

    def __init__(self, saved: dict[str, Any] | None = None):
        saved = saved or {}
        carry = saved.get("carry") or {}
        self.on_slots = float(carry.get("on_slots", 0.0))  # time in the _ON_SLOTS states
        self.by_status = {b: float(carry.get(b, 0.0)) for b in ("hung", "queued", "paused")}
        self.work = float(carry.get("work", 0.0))  # step time of the steps that stand
        self.checkpoint = float(carry.get("checkpoint", 0.0))
        self.lost = float(carry.get("lost", 0.0))
        self.lost_steps = int(saved.get("lost_steps", 0))
        self.standing = int(saved.get("steps", 0))  # steps that stand
        self.state: str | None = carry.get("state")
        self.since: float | None = carry.get("since")  # when self.state began
        # each standing step's time, from self.first on (what a rollback takes back)
        self.first: int | None = None
        self.times = array("d")
        self.rolled_to: int | None = None  # the step the newest rollback went back to
        self.heard: float | None = None  # when rank 0's newest step times came

    def status(self, status: str, now: float) -> None:
        """The job entered ``status`` at ``now``."""
        if self.state is None and status not in _ON_SLOTS:
            return  # not started yet: waiting is not wall time
        self._close(now)
        self.state = status
        self.since = now

    def _close(self, now: float) -> None:
        if self.state is None or self.since is None or self.state in _ENDED:
            return
        spent = max(0.0, now - self.since)
        if self.state in _ON_SLOTS:
            self.on_slots += spent
        elif self.state in _BY_STATUS:
            self.by_status[_BY_STATUS[self.state]] += spent
        self.since = now

    def steps(self, rows: list[list[float]], now: float | None = None) -> None:
        """Rank 0's ``[step, *PHASES]`` rows, heard at ``now``."""
        if now is not None:
            self.heard = now
        for row in rows:
            step, total, saving = int(row[0]), float(row[_TOTAL]), float(row[_CHECKPOINT])
            work = max(0.0, total - saving)
            self.checkpoint += saving
            if self.first is None:
                self.first = step
            index = step - self.first
            if index < 0:  # before the oldest kept: a replay of a step we no longer hold
                self.lost += work
                self.lost_steps += 1
                continue
            if index < len(self.times):  # done again: the first time was thrown away
                self._lose(self.times[index], 1)
                self.work -= self.times[index]
                self.times[index] = work
            else:
                self.times.extend([0.0] * (index - len(self.times)))
                self.times.append(work)
                self.standing += 1
            self.work += work

    def late(self, rows: list[list[float]]) -> None:
        """Rank 0's rows of an earlier gang, arriving after its rollback: the steps up to
        where it went back to stand, the others were thrown away."""
        for row in rows:
            if self.rolled_to is not None and int(row[0]) < self.rolled_to:
                self.steps([row])
                continue
            self.checkpoint += float(row[_CHECKPOINT])
            self._lose(max(0.0, float(row[_TOTAL]) - float(row[_CHECKPOINT])), 1)

    def discard(self, rows: list[list[float]]) -> None:
        """Rank 0's rows of steps counted as standing that a restart threw away (the
        scheduler that counted them is gone, with the step times it held)."""
        for row in rows:
            work = max(0.0, float(row[_TOTAL]) - float(row[_CHECKPOINT]))
            self.work -= work
            self.standing -= 1
            self._lose(work, 1)

    def rollback(self, step: int) -> None:
        """The job goes on from ``step`` (its checkpoint holds the steps before it):
        that step and those after it are lost."""
        self.rolled_to = step
        if self.first is None:
            return
        keep = max(0, step - self.first)
        dropped = self.times[keep:]
        if dropped:
            taken = sum(dropped)
            self._lose(taken, len(dropped))
            self.standing -= len(dropped)
            self.work -= taken
            del self.times[keep:]

    def _lose(self, seconds: float, steps: int) -> None:
        self.lost += seconds
        self.lost_steps += steps

    def summary(self, now: float) -> dict[str, Any]:
        """The buckets (seconds, adding up to ``wall``), ``goodput`` (productive over wall,
        None before a step time arrived), the steps that stand and those thrown away, and
        what a restarted scheduler's :class:`Goodput` goes on from (``carry``)."""
        on_slots = self.on_slots
        if self.state in _ON_SLOTS and self.since is not None:
            # running: up to the newest step times, not into the step under way (its
            # time is not known yet: it would pass for start-up until it is)
            if self.state == "RUNNING" and self.heard is not None and self.heard > self.since:
                now = self.heard
            on_slots += max(0.0, now - self.since)
        by_status = dict(self.by_status)
        if self.state in _BY_STATUS and self.since is not None:
            by_status[_BY_STATUS[self.state]] += max(0.0, now - self.since)
        # step times come from the rank's clock, on-slot time from the scheduler's: a
        # few milliseconds apart; the steps' own share is never more than the time there
        in_steps = self.work + self.checkpoint + self.lost
        scale = min(1.0, on_slots / in_steps) if in_steps > 0 else 1.0
        seconds = {
            "productive": self.work * scale,
            "checkpoint": self.checkpoint * scale,
            "lost": self.lost * scale,
            "startup": max(0.0, on_slots - in_steps),
            **by_status,
        }
        seconds = {b: round(seconds[b], 3) for b in BUCKETS}
        wall = round(sum(seconds.values()), 3)
        measured = in_steps > 0
        return {
            "goodput": round(seconds["productive"] / wall, 4) if wall > 0 and measured else None,
            "wall": wall,
            "seconds": seconds,
            "steps": self.standing,
            "lost_steps": self.lost_steps,
            "carry": {
                "on_slots": self.on_slots,
                **self.by_status,
                "work": self.work,
                "checkpoint": self.checkpoint,
                "lost": self.lost,
                "state": self.state,
                "since": self.since,
            },
        }


def overall(summaries: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """Many jobs' goodput as one (a cluster's): their buckets summed, and the steps that
    stand over the wall time of the jobs that measured steps.

    >>> overall([{"goodput": 0.5, "wall": 4.0, "lost_steps": 1,
    ...           "seconds": {"productive": 2.0, "lost": 2.0}}, None])["goodput"]
    0.5
    """
    seconds = dict.fromkeys(BUCKETS, 0.0)
    measured = lost_steps = 0.0
    for summary in summaries:
        if not summary:
            continue
        for bucket, value in (summary.get("seconds") or {}).items():
            seconds[bucket] = seconds.get(bucket, 0.0) + value
        if summary.get("goodput") is not None:
            measured += summary.get("wall") or 0.0
        lost_steps += summary.get("lost_steps") or 0
    return {
        "goodput": round(seconds["productive"] / measured, 4) if measured else None,
        "wall": round(sum(seconds.values()), 3),
        "seconds": {b: round(v, 3) for b, v in seconds.items()},
        "lost_steps": int(lost_steps),
    }


def describe(summary: dict[str, Any] | None) -> str:
    """One line: ``goodput 73% of 6.6 s · lost 0.9 s (8 steps) · start-up and exit 0.9 s``
    (the buckets other than the steps that stand, largest first, those over 0.05 s).

    >>> describe({"goodput": 0.5, "wall": 10.0, "lost_steps": 3,
    ...           "seconds": {"productive": 5.0, "lost": 4.0, "startup": 1.0, "hung": 0.0}})
    'goodput 50% of 10.0 s · lost 4.0 s (3 steps) · start-up and exit 1.0 s'
    """
    if not summary or not summary.get("wall"):
        return ""
    ratio = summary.get("goodput")
    head = "goodput " + ("unmeasured (no ctx.loop steps)" if ratio is None else f"{ratio:.0%}")
    parts = [f"{head} of {_seconds(summary['wall'])}"]
    seconds = summary.get("seconds") or {}
    rest = sorted(
        ((v, b) for b, v in seconds.items() if b != "productive" and v >= 0.05), reverse=True
    )
    for value, bucket in rest:
        steps = summary.get("lost_steps") if bucket == "lost" else None
        parts.append(f"{LABELS[bucket]} {_seconds(value)}" + (f" ({steps} steps)" if steps else ""))
    return " · ".join(parts)


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 100 else duration(value)
