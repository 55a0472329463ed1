"""Per-rank line charts on bqplot (a pure ipywidgets library: its JupyterLab 4
extension ships prebuilt in the wheel, nothing to build).

Only this module knows bqplot; the dashboards hand it points per rank. The charts set
their scales themselves (:func:`axis_range`), never bqplot's fit to the data: a lone
point, or a throughput steady to four digits, would fill the chart with a sliver of an
axis (33.815 to 33.820) that makes noise look like a collapse.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from .format import rank_color

MAX_LEGEND = 8  # more ranks than this: colours only, the legend would hide the lines
MARKER_COLOR = "#7c3aed"  # job.update's changes on the loss chart
BAND_COLOR = "#2563eb"  # a big job's band over its ranks, and its mean
ALL_RANKS = -1  # the line of a band's mean: lines[ALL_RANKS]
MIN_SPAN = 0.1  # a y axis spans at least +-10% of its values' level
THROUGHPUT = re.compile(r"(throughput|per_s|per_sec|per_second|/s)\)?$", re.IGNORECASE)


def _bqplot():
    try:
        import bqplot
    except ImportError as e:  # pragma: no cover - the widgets extra brings it
        raise ImportError(
            "the clustersdk dashboards draw with bqplot: pip install 'clustersdk[widgets]'"
        ) from e
    return bqplot


class LineChart:
    """A titled figure with one line per rank; ``lines[rank]`` is that rank's bqplot ``Lines``
    (a lone point is drawn as a dot, a line from the second on). A throughput's y axis
    (:func:`is_throughput` of the title) starts at 0, as does one with ``y_min=0``.

    >>> chart = LineChart("Loss", x_label="step")      # doctest: +SKIP
    >>> chart.set(0, [0, 1, 2], [2.3, 1.9, 1.5])        # doctest: +SKIP
    """

    def __init__(
        self,
        title: str,
        *,
        x_label: str,
        y_label: str = "",
        x_min: float | None = None,
        y_min: float | None = None,
        y_max: float | None = None,
        x_format: str = "~g",
        height: str = "230px",
        legend: bool = True,
    ):
        import ipywidgets

        bq = _bqplot()
        self.title = title
        self.legend = legend  # colours are the same in every chart: one legend is enough
        self.x_scale = bq.LinearScale(min=x_min)
        self.y_scale = bq.LinearScale(min=y_min, max=y_max)
        self.x_min, self.y_min, self.y_max = x_min, y_min, y_max
        self.zero = is_throughput(title)  # a throughput's axis starts at 0
        axes = [
            bq.Axis(
                scale=self.x_scale,
                label=x_label,
                grid_lines="none",
                tick_format=x_format,
                label_offset="28px",
            ),
            bq.Axis(
                scale=self.y_scale,
                side="left",
                label=y_label,
                grid_lines="dashed",
                tick_format=".3~g",
                label_offset="40px",
            ),
        ]
        self.x_axis, self.y_axis = axes
        self.lines: dict[int, Any] = {}
        self.band: Any = None  # min to max over the ranks (a big job), if any
        self.rules: Any = None  # vertical rules at given x (job.update's changes), if any
        self.markers: Any = None  # rings at points to point out (loss spikes), if any
        self.figure = bq.Figure(
            title=title,
            marks=[],
            axes=axes,
            animation_duration=0,
            fig_margin={"top": 34, "bottom": 40, "left": 56, "right": 14},
            legend_location="top-right",
            legend_style={"stroke-width": 0},
            title_style={"font-size": "13px", "font-weight": "600"},
            layout=ipywidgets.Layout(width="auto", height=height, min_width="0", overflow="hidden"),
        )

    def retitle(self, title: str) -> None:
        """Show another metric under ``title`` (a throughput's axis starts at 0)."""
        self.title = self.figure.title = title
        self.zero = is_throughput(title)
        self._update_axes()

    def set(self, rank: int, xs: Sequence[float], ys: Sequence[float]) -> None:
        """Replace rank ``rank``'s points (its line is made on first use; one point is a dot)."""
        if not len(xs):
            return
        x = np.asarray(xs, dtype=np.float64)
        y = np.asarray(ys, dtype=np.float64)
        marker = "circle" if len(x) < 2 else None  # a line needs two points
        line = self.lines.get(rank)
        if line is None:
            self._add(rank, x, y, marker)
        else:
            with line.hold_sync():
                line.x, line.y = x, y
                if line.marker != marker:
                    line.marker = marker
        self._update_axes()

    def set_band(
        self, xs: Sequence[float], lo: Sequence[float], mean: Sequence[float], hi: Sequence[float]
    ) -> None:
        """A big job's band: its ranks' min to max shaded, their mean as a line
        (``lines[ALL_RANKS]``)."""
        if not len(xs):
            return
        x = np.asarray(xs, dtype=np.float64)
        y = np.asarray([lo, hi], dtype=np.float64)
        if self.band is None:
            bq = _bqplot()
            self.band = bq.Lines(
                x=x,
                y=y,
                scales={"x": self.x_scale, "y": self.y_scale},
                fill="between",
                colors=[BAND_COLOR, BAND_COLOR],
                fill_colors=[BAND_COLOR],
                fill_opacities=[0.18],
                stroke_width=0.5,
                display_legend=False,
                enable_hover=False,
            )
            self._show_marks()
        else:
            with self.band.hold_sync():
                self.band.x, self.band.y = x, y
        self.set(ALL_RANKS, xs, mean)

    def _update_axes(self) -> None:
        """Both scales' ranges (:func:`axis_range`) and a few round ticks on each (d3's
        defaults crowd a 340 x 230 px chart)."""
        y_min = 0.0 if self.zero and self.y_min is None else self.y_min
        for scale, axis, attr, lo, hi, count in (
            (self.x_scale, self.x_axis, "x", self.x_min, None, 6),
            (self.y_scale, self.y_axis, "y", y_min, self.y_max, 4),
        ):
            values = [np.ravel(getattr(line, attr)) for line in self.lines.values()]
            if self.band is not None:
                values.append(np.ravel(getattr(self.band, attr)))
            data = np.concatenate(values) if values else np.empty(0)
            finite = data[np.isfinite(data)]
            if not len(finite):
                continue
            low, high = axis_range(float(finite.min()), float(finite.max()), start=lo, end=hi)
            if (scale.min, scale.max) != (low, high):
                with scale.hold_sync():
                    scale.min, scale.max = low, high
            ticks = nice_ticks(low, high, count)
            current = axis.tick_values
            if current is None or list(current) != ticks:
                axis.tick_values = np.asarray(ticks)

    def _add(self, rank: int, x: np.ndarray, y: np.ndarray, marker: str | None) -> None:
        bq = _bqplot()
        line = bq.Lines(
            x=x,
            y=y,
            scales={"x": self.x_scale, "y": self.y_scale},
            colors=[BAND_COLOR if rank == ALL_RANKS else rank_color(rank)],
            labels=["mean of all ranks" if rank == ALL_RANKS else f"rank {rank}"],
            stroke_width=1.6,
            marker=marker,
            marker_size=24,
            enable_hover=False,
        )
        self.lines[rank] = line
        show_legend = self.legend and len(self.lines) <= MAX_LEGEND
        for mark in self.lines.values():
            mark.display_legend = show_legend
        self._show_marks()

    def mark(self, xs: Sequence[float], labels: Sequence[str]) -> None:
        """Dashed vertical rules at ``xs`` across the whole height (hover: ``labels``)."""
        bq = _bqplot()
        if not xs:
            return
        x = np.asarray([[v, v] for v in xs], dtype=np.float64)
        y = np.asarray([[0.0, 1.0]] * len(xs), dtype=np.float64)
        if self.rules is None:
            self.rules = bq.Lines(
                x=x,
                y=y,
                scales={"x": self.x_scale, "y": bq.LinearScale(min=0.0, max=1.0)},
                colors=[MARKER_COLOR],
                line_style="dashed",
                stroke_width=1.2,
                labels=list(labels),
                display_legend=False,
                enable_hover=True,
            )
            self._show_marks()
        else:
            with self.rules.hold_sync():
                self.rules.x, self.rules.y, self.rules.labels = x, y, list(labels)

    def set_markers(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        """Red rings at these points (e.g. the steps of loss spikes); none: no marks."""
        if not len(xs) and self.markers is None:
            return
        bq = _bqplot()
        x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
        if self.markers is None:
            self.markers = bq.Scatter(
                x=x,
                y=y,
                scales={"x": self.x_scale, "y": self.y_scale},
                marker="circle",
                colors=["#dc2626"],
                fill=False,
                stroke="#dc2626",
                default_size=64,
                labels=["loss spike"],
                enable_hover=False,
            )
            self._show_marks()
        else:
            with self.markers.hold_sync():
                self.markers.x, self.markers.y = x, y

    def _show_marks(self) -> None:
        marks = [self.lines[r] for r in sorted(self.lines)]
        band = [self.band] if self.band is not None else []
        self.figure.marks = band + marks + [m for m in (self.rules, self.markers) if m is not None]

    def clear(self) -> None:
        """Drop the lines and rings (another metric is shown next); the rules stay."""
        self.lines = {}
        self.band = None
        self.markers = None
        self._show_marks()


def is_throughput(title: str) -> bool:
    """Whether a chart's title names a throughput, whose axis starts at 0.

    >>> [is_throughput(t) for t in ("Throughput (steps/s)", "tokens_per_s", "loss", "lr")]
    [True, True, False, False]
    """
    return bool(THROUGHPUT.search(title.strip()))


def axis_range(
    lo: float, hi: float, *, start: float | None = None, end: float | None = None
) -> tuple[float, float]:
    """The range of an axis that shows values from ``lo`` to ``hi``: never a sliver.

    ``start`` and ``end`` are fixed ends (a throughput starts at 0, a percentage ends at
    100); an axis that starts at ``start`` ends at ``hi`` (``start + 1`` when all values
    are there). A free axis is the values' range, but at least +-10% of their level (the
    largest magnitude) around its middle, and -1 to 1 when all values are 0.

    >>> axis_range(33.815, 33.82, start=0.0)  # a steady throughput
    (0.0, 33.82)
    >>> axis_range(5.0, 5.0)  # one point, or a flat line
    (4.5, 5.5)
    >>> axis_range(0.0, 0.0), axis_range(0.2, 2.5), axis_range(10.0, 40.0, start=0.0, end=100.0)
    ((-1.0, 1.0), (0.2, 2.5), (0.0, 100.0))
    """
    if start is not None or end is not None:
        low = min(lo, start) if start is not None else lo
        high = max(hi, end) if end is not None else hi
        if high <= low:  # one fixed end, and every value at it
            low, high = (low, low + 1.0) if start is not None else (high - 1.0, high)
        return low, high
    half = MIN_SPAN * max(abs(lo), abs(hi)) or 1.0
    if hi - lo >= 2 * half:
        return lo, hi
    middle = (lo + hi) / 2
    return middle - half, middle + half


def nice_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    """About ``count`` round values (steps of 1, 2 or 5 times a power of ten) in [lo, hi].

    >>> nice_ticks(0.0, 100.0)
    [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    >>> nice_ticks(0.012, 1.13)
    [0.2, 0.4, 0.6, 0.8, 1.0]
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / count
    power = 10.0 ** math.floor(math.log10(raw))
    ratio = raw / power  # rounded the way d3 does: nearest of 1, 2, 5, 10 on a log scale
    step = power * (10 if ratio >= 7.07 else 5 if ratio >= 3.16 else 2 if ratio >= 1.41 else 1)
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]
