"""The straggler view as HTML: a :class:`~.phases.PhaseView` drawn as small SVGs. Pure.

One band chart per phase (the mean over ranks, inside the min/max band), the
slowest rank named, and either one line per rank (up to 8 ranks) or a
rank x step heatmap of the step's total (more ranks). Shown in the live
dashboard (an ``ipywidgets.HTML``) and in the static summary alike.
"""

from __future__ import annotations

from markupsafe import escape

from ..protocol import PHASES
from .format import rank_color
from .phases import PhaseView

WIDTH, HEIGHT = 180, 56
BAND_COLOR = "#2563eb"
_LABELS = {
    "data": "data wait",
    "compute": "compute (fwd+bwd)",
    "optimizer": "optimizer",
    "checkpoint": "checkpoint stall",
    "sync": "sync (waiting for peers)",
    "total": "step total",
}


def phases_html(view: PhaseView) -> str:
    """The whole straggler view; empty before the first phase row."""
    if not len(view):
        return ""
    slow = view.slowest()
    head = f"Step phases, {view.world_size} rank{'s' if view.world_size != 1 else ''}"
    if slow is not None and view.world_size > 1:
        head += (
            f" · slowest: <b>rank {slow['rank']}</b> "
            f"({_ms(slow['seconds'])} of own work per step, {slow['ratio']:.2f}x the median)"
        )
    charts = "".join(_band_svg(view, phase) for phase in PHASES)
    detail = {
        "heatmap": _heatmap_svg,
        "lines": lambda v: _lines_svg(v, "total"),
        "bands": lambda v: "",
    }[view.mode](view)
    return (
        f"<div class='clustersdk-phases' style='font-size:12px'><div>{head}</div>"
        f"<div style='display:flex;flex-wrap:wrap;gap:6px'>{charts}</div>{detail}</div>"
    )


def _band_svg(view: PhaseView, phase: str) -> str:
    band = view.band(phase)
    xs, lo, mid, hi = band["steps"], band["min"], band["mean"], band["max"]
    if not xs:
        return ""
    x0, x1 = xs[0], xs[-1]
    top = max(hi) or 1.0
    sx = (WIDTH - 4) / ((x1 - x0) or 1)

    def pt(x: float, y: float) -> str:
        return f"{2 + (x - x0) * sx:.1f},{HEIGHT - 2 - y / top * (HEIGHT - 4):.1f}"

    area = " ".join(
        [pt(x, y) for x, y in zip(xs, hi)] + [pt(x, y) for x, y in zip(reversed(xs), reversed(lo))]
    )
    line = " ".join(pt(x, y) for x, y in zip(xs, mid))
    return (
        f"<div><div style='color:#6b7280'>{escape(_LABELS[phase])} · max {_ms(top)}</div>"
        f"<svg width='{WIDTH}' height='{HEIGHT}' style='background:#f9fafb'>"
        f"<polygon points='{area}' fill='{BAND_COLOR}' fill-opacity='0.2'/>"
        f"<polyline points='{line}' fill='none' stroke='{BAND_COLOR}' stroke-width='1.2'/>"
        "</svg></div>"
    )


def _lines_svg(view: PhaseView, phase: str) -> str:
    lines = view.lines(phase)
    values = [y for _, ys in lines.values() for y in ys]
    if not values:
        return ""
    steps = [x for xs, _ in lines.values() for x in xs]
    x0, x1, top = min(steps), max(steps), max(values) or 1.0
    width, height = 3 * WIDTH, 2 * HEIGHT
    sx = (width - 4) / ((x1 - x0) or 1)
    out = []
    for rank, (xs, ys) in lines.items():
        points = " ".join(
            f"{2 + (x - x0) * sx:.1f},{height - 2 - y / top * (height - 4):.1f}"
            for x, y in zip(xs, ys)
        )
        out.append(
            f"<polyline points='{points}' fill='none' stroke='{rank_color(rank)}' "
            f"stroke-width='1'><title>rank {rank}</title></polyline>"
        )
    return (
        f"<div style='color:#6b7280'>{escape(_LABELS[phase])} by rank</div>"
        f"<svg width='{width}' height='{height}' style='background:#f9fafb'>"
        + "".join(out)
        + "</svg>"
    )


def _heatmap_svg(view: PhaseView, phase: str = "total") -> str:
    grid = view.heatmap(phase)
    values = [v for row in grid["values"] for v in row if v is not None]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    cell_w, cell_h = 6, max(2, min(8, 320 // max(len(grid["ranks"]), 1)))
    slow = view.slowest()
    cells = []
    for rank, row in zip(grid["ranks"], grid["values"]):
        for col, value in enumerate(row):
            if value is None:
                continue
            heat = (value - lo) / ((hi - lo) or 1.0)
            cells.append(
                f"<rect x='{30 + col * cell_w}' y='{rank * cell_h}' width='{cell_w}' "
                f"height='{cell_h}' fill='rgb({int(255 * heat)},{int(80 + 100 * (1 - heat))},"
                f"{int(255 * (1 - heat))})'><title>rank {rank}, from step "
                f"{grid['steps'][col]}: {_ms(value)}</title></rect>"
            )
    if slow is not None:
        cells.append(
            f"<text x='0' y='{(slow['rank'] + 1) * cell_h}' font-size='9' "
            f"fill='#dc2626'>&#9654;{slow['rank']}</text>"
        )
    width = 30 + cell_w * max(len(r) for r in grid["values"])
    height = cell_h * len(grid["ranks"])
    return (
        f"<div style='color:#6b7280'>{escape(_LABELS[phase])}, rank (rows) by step "
        f"(columns): {_ms(lo)} to {_ms(hi)}</div>"
        f"<svg width='{width}' height='{height}'>" + "".join(cells) + "</svg>"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"
