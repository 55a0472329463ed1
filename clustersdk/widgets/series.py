"""Bounded chart series and the small counters a dashboard keeps per rank. No I/O."""

from __future__ import annotations

import bisect
import math

MAX_POINTS = 600        # per series; older points are thinned when it fills
RATE_WINDOW = 1.0       # seconds of steps that make one throughput point


class Series:
    """At most ``cap`` (x, y) points covering the whole run, evenly thinned.

    When full, every other stored point is dropped and from then on only one
    new point in ``stride`` is stored; the newest point is always shown, so
    the line reaches the present. A point with a smaller x than the last one
    (a job resumed from an older checkpoint) drops the points it rewinds over.
    """

    __slots__ = ("cap", "xs", "ys", "stride", "_count", "_tail")

    def __init__(self, cap: int = MAX_POINTS):
        self.cap = max(cap, 4)
        self.xs: list[float] = []
        self.ys: list[float] = []
        self.stride = 1
        self._count = 0
        self._tail: tuple[float, float] | None = None

    def __len__(self) -> int:
        return len(self.xs) + (self._tail is not None)

    def append(self, x: float, y: float) -> None:
        if self.xs and x < self.xs[-1]:
            cut = bisect.bisect_left(self.xs, x)
            del self.xs[cut:], self.ys[cut:]
        if self._tail is not None and x < self._tail[0]:
            self._tail = None
        index, self._count = self._count, self._count + 1
        if index % self.stride:
            self._tail = (x, y)
            return
        self.xs.append(x)
        self.ys.append(y)
        self._tail = None
        if len(self.xs) > self.cap:
            self.xs, self.ys = self.xs[::2], self.ys[::2]
            self.stride *= 2

    def truncate(self, x: float) -> None:
        """Forget the points at or after ``x``."""
        cut = bisect.bisect_left(self.xs, x)
        del self.xs[cut:], self.ys[cut:]
        if self._tail is not None and self._tail[0] >= x:
            self._tail = None

    def points(self) -> tuple[list[float], list[float]]:
        if self._tail is None:
            return list(self.xs), list(self.ys)
        return [*self.xs, self._tail[0]], [*self.ys, self._tail[1]]

    def last(self) -> tuple[float, float] | None:
        if self._tail is not None:
            return self._tail
        return (self.xs[-1], self.ys[-1]) if self.xs else None


class RateMeter:
    """Steps per second over windows of at least ``window`` seconds."""

    __slots__ = ("window", "_step", "_time")

    def __init__(self, window: float = RATE_WINDOW):
        self.window = window
        self._step: int | None = None
        self._time = 0.0

    def add(self, step: int, t: float) -> float | None:
        """The rate of the window this row closes, or ``None`` if none closes."""
        if self._step is None or step < self._step:
            self._step, self._time = step, t
            return None
        if t - self._time < self.window:
            return None
        rate = (step - self._step) / (t - self._time)
        self._step, self._time = step, t
        return rate


class Cutoff:
    """Drops what was already read from the journal when it arrives again as an event.

    Records per rank the newest time seen on load, and how many items had that
    time (one ``print`` of several lines gives them all the same time).
    """

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, int]] = {}

    def load(self, rank: int, t: float) -> None:
        last, n = self._last.get(rank, (-math.inf, 0))
        if t > last:
            self._last[rank] = (t, 1)
        elif t == last:
            self._last[rank] = (t, n + 1)

    def fresh(self, rank: int, t: float) -> bool:
        entry = self._last.get(rank)
        if entry is None:
            return True
        last, n = entry
        if t > last:
            del self._last[rank]  # events come in order: from here on all is new
            return True
        if t == last and n > 0:
            self._last[rank] = (last, n - 1)
            return False
        return t == last
