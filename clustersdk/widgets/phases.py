"""The straggler view: where each step's time went, across ranks. No widgets, no I/O.

A :class:`PhaseView` keeps the phase rows of the newest steps
(``[step, *PHASES]`` per rank, see :mod:`clustersdk.runtime.phases`) and
answers what a dashboard draws, in a form that reads at 64 ranks as well as
at 2: per phase, one aggregated line (the mean over ranks) inside a min/max
band; the slowest rank named; and, past :data:`LINES_UP_TO` ranks, a rank x
step heatmap instead of one line per rank. A job of more ranks than the
control plane sends rows of (``clustersdk.dashboard.aggregate-above``) comes
as per-step bands (:meth:`PhaseView.add_bands`): the bands and the slowest
rank, without a heatmap (mode ``"bands"``).

>>> view = PhaseView(world_size=2)
>>> view.add(0, [[0, 0.1, 1.0, 0.2, 0.0, 0.0, 1.3]])
>>> view.add(1, [[0, 0.1, 2.0, 0.2, 0.0, 0.0, 2.3]])
>>> view.band("compute")
{'steps': [0], 'min': [1.0], 'mean': [1.5], 'max': [2.0]}
>>> view.slowest()["rank"]
1
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from ..protocol import PHASES

KEEP_STEPS = 600  # the newest steps kept
LINES_UP_TO = 8  # ranks drawn as lines; more: a heatmap
HEATMAP_COLUMNS = 60  # step bins of the heatmap
WINDOW = 50  # steps the slowest rank is judged on
_WORK = ("data", "compute", "optimizer", "checkpoint")  # what a rank does itself (not sync)


class PhaseView:
    """Phase rows of the newest :data:`KEEP_STEPS` steps, by step and rank."""

    def __init__(self, world_size: int, keep: int = KEEP_STEPS):
        self.world_size = world_size
        self.keep = keep
        self._steps: collections.OrderedDict[int, dict[int, tuple[float, ...]]] = (
            collections.OrderedDict()
        )
        self._bands: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._bands) if self._bands else len(self._steps)

    def add_bands(self, bands: Iterable[dict[str, Any]]) -> None:
        """Per-step bands over the ranks (:class:`~clustersdk.protocol.PhaseBand`)."""
        for band in bands:
            self._bands[int(band["step"])] = band
        if any(a > b for a, b in zip(self._bands, list(self._bands)[1:])):
            self._bands = collections.OrderedDict(sorted(self._bands.items()))
        while len(self._bands) > self.keep:
            self._bands.popitem(last=False)

    # feeding -------------------------------------------------------------------------------
    def add(self, rank: int, rows: Iterable[Iterable[float]]) -> None:
        """``[step, *PHASES]`` rows of ``rank`` (as a metrics message carries them)."""
        resort = False
        for row in rows:
            step, *values = row
            step = int(step)
            if step not in self._steps:
                newest = next(reversed(self._steps), None)
                if newest is not None and step < newest:
                    if step <= newest - self.keep:
                        continue  # older than anything kept
                    resort = True
                self._steps[step] = {}
            self._steps[step][rank] = tuple(float(v) for v in values)
        if resort:
            self._steps = collections.OrderedDict(sorted(self._steps.items()))
        while len(self._steps) > self.keep:
            self._steps.popitem(last=False)

    def load(self, rows: Iterable[dict[str, Any]]) -> None:
        """Rows as :meth:`Job.phases` returns them."""
        by_rank: dict[int, list[list[float]]] = {}
        for r in rows:
            by_rank.setdefault(r["rank"], []).append([r["step"], *(r[p] for p in PHASES)])
        for rank, rows_ in by_rank.items():
            self.add(rank, rows_)

    def roll_back(self, step: int) -> None:
        """Forget steps at or after ``step`` (a resume replays them)."""
        for s in [s for s in self._steps if s >= step]:
            del self._steps[s]
        for s in [s for s in self._bands if s >= step]:
            del self._bands[s]

    def drop_ranks(self, world_size: int) -> None:
        """A resume at a smaller world size: ranks past it are gone."""
        self.world_size = world_size
        for ranks in self._steps.values():
            for rank in [r for r in ranks if r >= world_size]:
                del ranks[rank]

    # what a dashboard draws ----------------------------------------------------------------
    @property
    def mode(self) -> str:
        """``"lines"`` (one line per rank) up to :data:`LINES_UP_TO` ranks, else ``"heatmap"``;
        ``"bands"`` when only bands over the ranks came."""
        if self._bands:
            return "bands"
        return "lines" if self.world_size <= LINES_UP_TO else "heatmap"

    def band(self, phase: str) -> dict[str, list[float]]:
        """Per step, the mean of ``phase`` over the ranks that reported, and its min and max."""
        i = PHASES.index(phase)
        out: dict[str, list[float]] = {"steps": [], "min": [], "mean": [], "max": []}
        for step, band in self._bands.items():
            out["steps"].append(step)
            for key in ("min", "mean", "max"):
                out[key].append(band[key][i])
        for step, ranks in self._steps.items():
            if not ranks:
                continue
            values = [v[i] for v in ranks.values()]
            out["steps"].append(step)
            out["min"].append(min(values))
            out["mean"].append(sum(values) / len(values))
            out["max"].append(max(values))
        return out

    def lines(self, phase: str) -> dict[int, tuple[list[int], list[float]]]:
        """One line per rank (what ``mode == "lines"`` draws)."""
        i = PHASES.index(phase)
        out: dict[int, tuple[list[int], list[float]]] = {}
        for step, ranks in self._steps.items():
            for rank, values in ranks.items():
                xs, ys = out.setdefault(rank, ([], []))
                xs.append(step)
                ys.append(values[i])
        return dict(sorted(out.items()))

    def heatmap(self, phase: str = "total", columns: int = HEATMAP_COLUMNS) -> dict[str, Any]:
        """``phase`` by rank (rows) and step bin (columns; each the mean of its steps).

        ``values[rank][column]`` is None where a rank reported nothing in that bin.
        """
        i = PHASES.index(phase)
        steps = list(self._steps)
        if not steps:
            return {"ranks": list(range(self.world_size)), "steps": [], "values": []}
        per = max(1, -(-len(steps) // columns))
        bins = [steps[j : j + per] for j in range(0, len(steps), per)]
        values = []
        for rank in range(self.world_size):
            row = []
            for chunk in bins:
                got = [self._steps[s][rank][i] for s in chunk if rank in self._steps[s]]
                row.append(sum(got) / len(got) if got else None)
            values.append(row)
        return {
            "ranks": list(range(self.world_size)),
            "steps": [c[0] for c in bins],
            "values": values,
        }

    def slowest(self, window: int = WINDOW) -> dict[str, Any] | None:
        """The rank whose own work (data, compute, optimizer, checkpoint: not the wait for
        the others) took longest per step over the newest ``window`` steps, and by how much
        it exceeds the median rank."""
        if self._bands:  # the rank slowest most often, its own work against the mean's
            recent = list(self._bands.values())[-window:]
            counts = collections.Counter(b["slowest"] for b in recent)
            rank = max(counts, key=lambda r: (counts[r], -r))
            mine = [b["slowest_work"] for b in recent if b["slowest"] == rank]
            work_i = [PHASES.index(p) for p in _WORK]
            typical = sum(sum(b["mean"][i] for i in work_i) for b in recent) / len(recent)
            seconds = sum(mine) / len(mine)
            return {
                "rank": rank,
                "seconds": seconds,
                "median": typical,
                "ratio": seconds / typical if typical > 0 else 1.0,
            }
        work = [PHASES.index(p) for p in _WORK]
        totals: dict[int, list[float]] = {}
        for ranks in list(self._steps.values())[-window:]:
            for rank, values in ranks.items():
                totals.setdefault(rank, []).append(sum(values[i] for i in work))
        if not totals:
            return None
        means = {rank: sum(v) / len(v) for rank, v in totals.items()}
        rank = max(means, key=lambda r: (means[r], -r))
        ordered = sorted(means.values())
        median = ordered[len(ordered) // 2]
        return {
            "rank": rank,
            "seconds": means[rank],
            "median": median,
            "ratio": means[rank] / median if median > 0 else 1.0,
        }

    def summary(self) -> dict[str, dict[str, float]]:
        """Per phase, the median over kept steps of the mean, min and max across ranks."""
        out = {}
        for phase in PHASES:
            band = self.band(phase)
            out[phase] = {k: _median(band[k]) for k in ("min", "mean", "max")}
        return out


def _median(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
