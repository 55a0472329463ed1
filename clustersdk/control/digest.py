"""Per-step summaries of what a job's ranks log, and what kernels get of a big job.

Pure (no Dask, no I/O). The control plane gives every job a :class:`Digest`,
fed with the rows, samples, phases and lines the ranks ship:

- :class:`StepBands` keeps, per step, each scalar's count, sum, min and max over
  the ranks: the journal's ``steps`` table (``job.steps()``: a loss curve of
  1,000 steps reads 1,000 rows, not a million) and what a chart draws;
- a job of more than ``aggregate_above`` ranks is published to kernels as one
  :class:`~clustersdk.protocol.StepsMessage` per tick: per step a min / mean /
  max band of each scalar, per tick one band of each system reading, per step
  the phases' bands and the slowest rank, and the log lines, instead of every
  rank's rows (a chart needs one point per pixel: 1,024 lines of one loss
  are a band anyway). Its per-rank rows are journaled all the same.

>>> bands = StepBands()
>>> bands.add([{"rank": 0, "step": 3, "time": 1.0, "scalars": {"loss": 2.0}},
...            {"rank": 1, "step": 3, "time": 1.5, "scalars": {"loss": 4.0}}])
>>> [(s["step"], s["ranks"], s["scalars"]["loss"]) for s in bands.take()]
[(3, 2, [2, 6.0, 2.0, 4.0])]
>>> bands.take()
[]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from ..protocol import PHASES, PhaseBand, StepBand, StepsMessage, SystemBand

KEEP_STEPS = 2048  # steps whose summary stays in memory (older ones are read back if needed)
Stats = list  # [count, sum, min, max] of one scalar at one step


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _band(stats: Stats) -> list[float]:
    count, total, lo, hi = stats
    return [lo, total / count, hi]


class StepBands:
    """Each step's count, sum, min and max of every scalar over the ranks that logged it.

    Non-finite values are left out of the figures (they are reported on their own).
    ``restore(step)`` gives back the summary of a step no longer kept in memory
    (a very late row), in the form :meth:`take` hands out.
    """

    def __init__(
        self, keep: int = KEEP_STEPS, restore: Callable[[int], dict[str, Any] | None] | None = None
    ):
        self.keep, self.restore = keep, restore
        self._steps: dict[int, list[Any]] = {}  # step -> [time, ranks, {name: Stats}]
        self._changed: dict[int, float] = {}  # step -> its oldest row since the last take
        self._dropped = -1  # the newest step no longer kept

    def add(self, rows: Iterable[dict[str, Any]]) -> None:
        steps, changed = self._steps, self._changed
        for row in rows:
            step, t = row["step"], row["time"]
            entry = steps.get(step)
            if entry is None:
                entry = steps[step] = self._reopen(step)
            if t > entry[0]:
                entry[0] = t
            entry[1] += 1
            figures = entry[2]
            for name, value in row["scalars"].items():
                if not _finite(value):
                    continue
                stats = figures.get(name)
                if stats is None:
                    figures[name] = [1, value, value, value]
                else:
                    stats[0] += 1
                    stats[1] += value
                    if value < stats[2]:
                        stats[2] = value
                    if value > stats[3]:
                        stats[3] = value
            oldest = changed.get(step)
            if oldest is None or t < oldest:
                changed[step] = t
        while len(steps) > self.keep:  # the oldest kept (steps come in order, nearly)
            first = next(iter(steps))
            self._dropped = max(self._dropped, first)
            del steps[first]

    def _reopen(self, step: int) -> list[Any]:
        if step <= self._dropped and self.restore is not None:
            kept = self.restore(step)
            if kept is not None:
                return [
                    kept["time"],
                    kept["ranks"],
                    {k: list(v) for k, v in kept["scalars"].items()},
                ]
        return [0.0, 0, {}]

    def take(self) -> list[dict[str, Any]]:
        """The summaries of the steps that changed since the last call, in step order:
        step, time (its newest row), oldest (its oldest row since the last call), ranks
        and per scalar ``[count, sum, min, max]``."""
        out = []
        for step in sorted(self._changed):
            entry = self._steps.get(step)
            if entry is not None:
                out.append(
                    {
                        "step": step,
                        "time": entry[0],
                        "oldest": self._changed[step],
                        "ranks": entry[1],
                        "scalars": {k: list(v) for k, v in entry[2].items()},
                    }
                )
        self._changed.clear()
        return out

    def truncate(self, step: int) -> None:
        """Forget steps at or after ``step`` (a resume replays them)."""
        for s in [s for s in self._steps if s >= step]:
            del self._steps[s]
        for s in [s for s in self._changed if s >= step]:
            del self._changed[s]
        self._dropped = min(self._dropped, step - 1)


class SystemBands:
    """Each numeric reading's min, mean and max over the samples of one tick."""

    def __init__(self) -> None:
        self._fields: dict[str, Stats] = {}
        self._source: str | None = None
        self._time = 0.0
        self._ranks: set[int] = set()

    def add(self, samples: Iterable[dict[str, Any]]) -> None:
        for s in samples:
            self._time = max(self._time, s["time"])
            self._ranks.add(s["rank"])
            for name, value in s["sample"].items():
                if name == "source":
                    self._source = value
                elif _finite(value):
                    stats = self._fields.get(name)
                    if stats is None:
                        self._fields[name] = [1, value, value, value]
                    else:
                        stats[0] += 1
                        stats[1] += value
                        stats[2] = min(stats[2], value)
                        stats[3] = max(stats[3], value)

    def take(self) -> SystemBand | None:
        if not self._fields:
            return None
        band: SystemBand = {
            "time": self._time,
            "source": self._source or "psutil",
            "ranks": len(self._ranks),
            "fields": {k: _band(v) for k, v in self._fields.items()},
        }
        self.__init__()  # type: ignore[misc]
        return band


_WORK = [PHASES.index(p) for p in ("data", "compute", "optimizer", "checkpoint")]


class PhaseBands:
    """Per step, each phase's min, mean and max over the ranks, and the slowest rank: the
    one whose own work (data, compute, optimizer, checkpoint: not the wait for the
    others) took longest."""

    def __init__(self, keep: int = KEEP_STEPS):
        self.keep = keep
        # step -> [ranks, sums, mins, maxs, slowest rank, its own work]
        self._steps: dict[int, list[Any]] = {}
        self._changed: set[int] = set()

    def add(self, rank: int, rows: Iterable[Iterable[float]]) -> None:
        for row in rows:
            step, *values = row
            step = int(step)
            work = sum(values[i] for i in _WORK)
            entry = self._steps.get(step)
            if entry is None:
                entry = self._steps[step] = [
                    0,
                    [0.0] * len(PHASES),
                    list(values),
                    list(values),
                    rank,
                    work,
                ]
            else:
                entry[2] = [min(a, b) for a, b in zip(entry[2], values)]
                entry[3] = [max(a, b) for a, b in zip(entry[3], values)]
                if work > entry[5]:
                    entry[4], entry[5] = rank, work
            entry[0] += 1
            entry[1] = [a + b for a, b in zip(entry[1], values)]
            self._changed.add(step)
        while len(self._steps) > self.keep:
            del self._steps[next(iter(self._steps))]

    def take(self) -> list[PhaseBand]:
        out: list[PhaseBand] = []
        for step in sorted(self._changed):
            entry = self._steps.get(step)
            if entry is not None:
                ranks, sums, mins, maxs, slowest, work = entry
                out.append(
                    {
                        "step": step,
                        "ranks": ranks,
                        "min": list(mins),
                        "mean": [v / ranks for v in sums],
                        "max": list(maxs),
                        "slowest": slowest,
                        "slowest_work": work,
                    }
                )
        self._changed.clear()
        return out

    def truncate(self, step: int) -> None:
        for s in [s for s in self._steps if s >= step]:
            del self._steps[s]
        self._changed = {s for s in self._changed if s < step}


class Digest:
    """One job's :class:`StepBands` and, for a job of more than ``aggregate_above`` ranks,
    what its next :class:`~clustersdk.protocol.StepsMessage` carries.

    >>> d = Digest(world_size=64, aggregate_above=32)
    >>> d.add(0, rows=[{"rank": 0, "step": 0, "time": 1.0, "scalars": {"loss": 2.0}}],
    ...       logs=[(0, 1.0, "stdout", "hi")])
    >>> msg = d.message()
    >>> msg["steps"][0]["scalars"], msg["logs"]
    ({'loss': [2.0, 2.0, 2.0]}, [(0, 1.0, 'stdout', 'hi')])
    """

    def __init__(
        self,
        world_size: int,
        aggregate_above: int,
        attempt: int = 0,
        restore: Callable[[int], dict[str, Any] | None] | None = None,
    ):
        self.aggregated = world_size > aggregate_above
        self.attempt = attempt
        self.bands = StepBands(restore=restore)
        self.system = SystemBands()
        self.phases = PhaseBands()
        self.logs: list[Any] = []
        self._summaries: list[dict[str, Any]] = []  # taken from bands, not journaled yet

    def add(
        self,
        rank: int,
        rows: list[dict[str, Any]] = (),
        logs: list[Any] = (),  # type: ignore[assignment]
        system: list[dict[str, Any]] = (),
        phases: list[list[float]] = (),
    ) -> None:  # type: ignore[assignment]
        if rows:
            self.bands.add(rows)
        if self.aggregated:
            self.logs.extend(logs)
            if system:
                self.system.add(system)
            if phases:
                self.phases.add(rank, phases)

    def summaries(self) -> list[dict[str, Any]]:
        """The step summaries that changed (for the journal), in step order."""
        out = self._summaries + self.bands.take()
        self._summaries = []
        return out

    def message(self) -> StepsMessage | None:
        """What kernels get of an aggregated job since the last call (None: nothing new).
        The summaries it draws from are kept for :meth:`summaries`."""
        if not self.aggregated:
            return None
        taken = self.bands.take()
        self._summaries.extend(taken)
        steps: list[StepBand] = [
            {
                "step": s["step"],
                "time": s["time"],
                "oldest": s["oldest"],
                "ranks": s["ranks"],
                "scalars": {k: _band(v) for k, v in s["scalars"].items() if v[0]},
            }
            for s in taken
        ]
        system, phases, logs = self.system.take(), self.phases.take(), self.logs
        self.logs = []
        if not (steps or system or phases or logs):
            return None
        return {
            "kind": "steps",
            "attempt": self.attempt,
            "steps": steps,
            "system": system,
            "phases": phases,
            "logs": logs,
        }

    def truncate(self, step: int) -> None:
        self.bands.truncate(step)
        self.phases.truncate(step)
        self._summaries = [s for s in self._summaries if s["step"] < step]
