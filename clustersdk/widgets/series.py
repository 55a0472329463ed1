"""Bounded chart series and the small counters a dashboard keeps per rank. No I/O."""

from __future__ import annotations

import bisect
import math

MAX_POINTS = 600  # per series; older points are thinned when it fills
RATE_WINDOW = 1.0  # seconds of steps that make one throughput point


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


class Band:
    """A band over the ranks: at each x, ``(min, mean, max)``; at most ``cap`` points.

    An x may come again with newer figures (more ranks logged that step): it replaces
    the point. When full, every other point of the older half is dropped, so the band
    covers the whole run and its newest part in full detail.

    >>> band = Band()
    >>> band.set(0, 1.0, 2.0, 3.0); band.set(1, 1.0, 1.5, 2.0); band.set(0, 0.5, 2.0, 3.0)
    >>> band.points()
    ([0.0, 1.0], [0.5, 1.0], [2.0, 1.5], [3.0, 2.0])
    """

    __slots__ = ("cap", "_points")

    def __init__(self, cap: int = MAX_POINTS):
        self.cap = max(cap, 8)
        self._points: dict[float, tuple[float, float, float]] = {}

    def __len__(self) -> int:
        return len(self._points)

    def set(self, x: float, lo: float, mean: float, hi: float) -> None:
        points = self._points
        if points and x < next(reversed(points)) and x not in points:
            self._points = points = dict(sorted({**points, x: (lo, mean, hi)}.items()))
        else:
            points[x] = (lo, mean, hi)
        if len(points) > self.cap:
            xs = list(points)
            half = len(xs) // 2
            keep = xs[:half:2] + xs[half:]
            self._points = {x: points[x] for x in keep}

    def truncate(self, x: float) -> None:
        """Forget the points at or after ``x``."""
        self._points = {k: v for k, v in self._points.items() if k < x}

    def points(self) -> tuple[list[float], list[float], list[float], list[float]]:
        """xs, mins, means, maxes."""
        xs = [float(x) for x in self._points]
        lo, mean, hi = (list(col) for col in zip(*self._points.values())) if xs else ([], [], [])
        return xs, lo, mean, hi

    def last(self) -> tuple[float, float] | None:
        """The newest x and its mean."""
        if not self._points:
            return None
        x = next(reversed(self._points))
        return float(x), self._points[x][1]


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
