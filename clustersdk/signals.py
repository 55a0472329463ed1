"""What the logged scalars say on their own: non-finite values and loss spikes.

Pure (no Dask, torch or I/O), shared by the ranks (which check their own step
when ``on_nan`` is not ``"report"``) and the control plane (which checks the
rows it receives otherwise, and watches every rank's loss for spikes).

*Watched* scalars are the losses (``loss``, ``*_loss``, ``loss_*``) and
``grad_norm``: a NaN or Inf there means the training diverged; other names
(a count, an accuracy) are the user's business.

A *spike* is a loss far above its recent scale. Two tests, over the last
``window`` finite losses: its robust z-score, ``0.6745 * (x - median) / MAD``
(the modified z-score of Iglewicz and Hoaglin; the median and the median
absolute deviation ignore the spikes themselves), passes ``threshold``; and it
is ``ratio`` times the window's *scale*, the highest of those losses: the level
ordinary steps have recently reached, noise included. The second test is what
keeps a converging loss quiet: near zero, a mini-batch with a few hard samples
costs 10 to 40 times the median (and a MAD near zero makes any z-score huge), but
at most 3.6 times the highest of the 50 steps before it (measured on the demo's
spirals classifier over twelve seeds, 2,000 steps each: no spike reported, where
a bar of 1.25 times the median reported up to 20 per run). A real spike, the loss
jumping tenfold above everything the last steps reached, is found at any point
of a run; a second one within ``window`` steps must clear the first. One spike is
reported once: the next one needs a loss back under the bar first.

The loss judged is the job's, not one rank's: each step's mean over the ranks
that log a loss (:class:`StepMeans`), i.e. the loss of the global batch. One
rank's loss on its slice of a batch is noisier and heavy-tailed (a hard slice of
8 samples may cost 7x the median). A rank whose slice pulls the mean up far
enough still makes the mean a spike, and the diagnosis names the rank with the
highest loss of that step.

>>> d = SpikeDetector(window=50, min_steps=20)
>>> [d.add(step, 1.0 + 0.01 * (step % 7)) for step in range(30)][-1] is None
True
>>> d.add(30, 20.0).step  # 18 times the highest of the last 30 (1.06)
30
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
from collections.abc import Iterable, Mapping
from typing import Any

MAX_SCORE = 1e6  # a MAD of zero makes any rise infinite; keep it a number JSON can carry


def watched(name: str) -> bool:
    """Whether a NaN or Inf in scalar ``name`` means the training diverged.

    >>> [watched(n) for n in ("loss", "val_loss", "loss_mlm", "grad_norm", "accuracy")]
    [True, True, True, True, False]
    """
    return name in ("loss", "grad_norm") or name.endswith("_loss") or name.startswith("loss_")


def nonfinite_values(scalars: Mapping[str, Any]) -> dict[str, float]:
    """The watched scalars of a row that are NaN or Inf.

    >>> nonfinite_values({"loss": float("nan"), "lr": float("inf"), "grad_norm": 1.0})
    {'loss': nan}
    """
    return {
        k: float(v)
        for k, v in scalars.items()
        if watched(k)
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and not math.isfinite(v)
    }


def first_nonfinite(rows: Iterable[Mapping[str, Any]]) -> tuple[int, int, dict[str, float]] | None:
    """``(rank, step, values)`` of the first row with a non-finite watched scalar."""
    for row in rows:
        bad = nonfinite_values(row.get("scalars") or {})
        if bad:
            return int(row["rank"]), int(row["step"]), bad
    return None


@dataclasses.dataclass(frozen=True)
class Spike:
    step: int
    value: float
    median: float
    mad: float
    score: float
    scale: float  # the highest loss of the window, which ``value`` is ``ratio`` times or more


class SpikeDetector:
    """A job's recent losses, and whether the newest is a spike (the defaults are those of
    ``clustersdk.diagnosis.spike-*`` in clustersdk.yaml)."""

    def __init__(
        self, window: int = 50, min_steps: int = 20, threshold: float = 10.0, ratio: float = 10.0
    ):
        if not (
            isinstance(window, int) and isinstance(min_steps, int) and 3 <= min_steps <= window
        ):
            raise ValueError(
                f"spike detection needs 3 <= min_steps <= window, got "
                f"min_steps={min_steps!r}, window={window!r}"
            )
        if not (threshold > 0 and ratio >= 1):
            raise ValueError(
                f"spike threshold must be > 0 and ratio >= 1, got "
                f"threshold={threshold!r}, ratio={ratio!r}"
            )
        self.window, self.min_steps = window, min_steps
        self.threshold, self.ratio = float(threshold), float(ratio)
        self.values: collections.deque[float] = collections.deque(maxlen=window)
        self.last_step: int | None = None
        self.inside = False  # the last value was a spike: the next must come down first

    def add(self, step: int, value: float) -> Spike | None:
        """Take the loss of ``step``; the spike it is, if it is one."""
        if self.last_step is not None and step <= self.last_step:
            self.values.clear()  # replayed steps (a restart): start over
            self.inside = False
        self.last_step = step
        if not math.isfinite(value):
            return None  # non-finite values are reported on their own
        spike = self.judge(step, value)
        self.values.append(value)
        was, self.inside = self.inside, spike is not None
        return None if was else spike

    def judge(self, step: int, value: float) -> Spike | None:
        """Whether ``value`` is a spike against the window (the window unchanged)."""
        if len(self.values) < self.min_steps:
            return None
        ordered = sorted(self.values)
        median = _median(ordered)
        rise = value - median
        if rise <= 0:
            return None
        scale = ordered[-1]
        if value < self.ratio * scale:
            return None
        mad = _median(sorted(abs(v - median) for v in ordered))
        score = MAX_SCORE if mad == 0 else min(0.6745 * rise / mad, MAX_SCORE)
        if score < self.threshold:
            return None
        return Spike(step, value, median, mad, score, scale)


@dataclasses.dataclass(frozen=True)
class StepLoss:
    """The mean loss of ``step`` over the ``ranks`` that logged one; ``worst`` is the rank
    with the highest, ``worst_value`` its loss."""

    step: int
    mean: float
    ranks: int
    worst: int
    worst_value: float


class StepMeans:
    """Every rank's loss of each step, given as rows come (each rank's in step order, the
    ranks' in any order), handed out per step once it is complete: once every rank that
    logs a loss has logged that step or a later one. Until all ``world_size`` ranks have
    logged one, a step waits until another is ``patience`` steps ahead (a rank that has
    logged nothing by then logs no loss: a pipeline's first stages).

    >>> m = StepMeans(world_size=2)
    >>> m.add(0, 5, 1.0), m.add(0, 6, 1.0)
    ([], [])
    >>> [(s.step, s.mean, s.worst) for s in m.add(1, 5, 3.0) + m.add(1, 6, 1.0)]
    [(5, 2.0, 1), (6, 1.0, 0)]
    """

    def __init__(self, world_size: int, patience: int = 50) -> None:
        self.world_size, self.patience = world_size, patience
        self.newest: dict[int, int] = {}  # rank -> its newest step with a loss
        self.pending: dict[int, dict[int, float]] = {}  # step -> rank -> loss
        # kept as rows come, so that a row costs the same at 4,096 ranks as at 2 (taking
        # min(newest.values()) for every row made a step cost the world size squared)
        self._at: collections.Counter[int] = collections.Counter()  # step -> ranks newest there
        self._lows: list[int] = []  # a heap of the steps in _at (stale ones dropped lazily)
        self._waiting: list[int] = []  # a heap of the steps in pending
        self._high = -1  # max(newest.values())

    def add(self, rank: int, step: int, value: float) -> list[StepLoss]:
        old = self.newest.get(rank)
        if old is not None and step < old:  # replayed steps (a restart): start over
            self.__init__(self.world_size, self.patience)  # type: ignore[misc]
            old = None
        if old is not None:
            self._at[old] -= 1
            if not self._at[old]:
                del self._at[old]
        if not self._at[step]:
            heapq.heappush(self._lows, step)
        self._at[step] += 1
        self.newest[rank] = step
        self._high = max(self._high, step)
        if step not in self.pending:
            self.pending[step] = {}
            heapq.heappush(self._waiting, step)
        self.pending[step][rank] = value
        if len(self.newest) >= self.world_size:
            lows = self._lows
            while lows[0] not in self._at:  # a step no rank's newest is any more
                heapq.heappop(lows)
            done = lows[0]
        else:
            done = self._high - self.patience
        out = []
        while self._waiting and self._waiting[0] <= done:
            s = heapq.heappop(self._waiting)
            losses = self.pending.pop(s)
            finite = {r: v for r, v in losses.items() if math.isfinite(v)}
            if not finite:
                continue  # non-finite values are reported on their own
            worst = max(finite, key=lambda r: (finite[r], -r))
            out.append(
                StepLoss(s, sum(finite.values()) / len(finite), len(finite), worst, finite[worst])
            )
        return out


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    return (ordered[n // 2] + ordered[(n - 1) // 2]) / 2
