"""How numbers read on the dashboards: durations, scalars, bytes, the progress line,
and each rank's colour.

>>> fmt_duration(185)
'3 min 05 s'
>>> progress_text({"step": 420, "total": 1000, "rate": 312.0, "eta": 1.9, "elapsed": 4.1})
'step 420 / 1,000 · 312 steps/s · ETA 1.9 s · 4.1 s elapsed'
"""

from __future__ import annotations

import math
from typing import Any

#: One colour per rank (cycled), shared by the live charts and the static HTML.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def rank_color(rank: int) -> str:
    """The colour of rank ``rank``'s lines and dots."""
    return PALETTE[rank % len(PALETTE)]


def fmt_duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``; ``—`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def fmt_number(value: Any) -> str:
    """Scalars as a person reads them: 4 significant digits, no noise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4g}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def progress_text(p: dict[str, Any]) -> str:
    """``step 420 / 1,000 · 312 steps/s · ETA 2.0 s · 4.1 s elapsed``."""
    parts = [f"step {p['step']:,}" + (f" / {p['total']:,}" if p["total"] else "")]
    if p["rate"]:
        parts.append(f"{p['rate']:.3g} steps/s")
    if p["eta"] is not None:
        parts.append(f"ETA {fmt_duration(p['eta'])}")
    if p["elapsed"] is not None:
        parts.append(f"{fmt_duration(p['elapsed'])} elapsed")
    return " · ".join(parts)
