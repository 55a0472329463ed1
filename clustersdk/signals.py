"""What the logged scalars say on their own: non-finite values and loss spikes.

Pure (no Dask, torch or I/O), shared by the ranks (which check their own step
when ``on_nan`` is not ``"report"``) and the control plane (which checks the
rows it receives otherwise, and watches every rank's loss for spikes).

*Watched* scalars are the losses (``loss``, ``*_loss``, ``loss_*``) and
``grad_norm``: a NaN or Inf there means the training diverged; other names
(a count, an accuracy) are the user's business.

A *spike* is a loss far above its recent scale, judged once ``min_steps`` finite losses
have come (the warm-up) against the last ``window`` (50) of them: their *median*, the
level of the loss, and their *MAD* (median absolute deviation). A loss is a spike when it
clears three bars:

1. ``ratio`` (10) times the median: a tenfold jump;
2. a rise over the median of ``reach`` (6) times the highest *rise* of the last ``memory``
   (500) steps, a step's rise being how far it went over the median of the window before
   it, in medians (light noise: under 1, so bar 1 decides; a hard batch near
   convergence: 10 to 40);
3. a robust z-score, ``0.6745 * (x - median) / MAD``, of ``threshold`` (10): what decides
   for a loss that is negative, or whose median is 0.

The second bar keeps a converging loss quiet, and no window of 50 steps could do its
work: near zero a loss is heavy-tailed, and a batch with a few hard samples comes every
few hundred steps at 10 to 40 times the median, up to 7.7 times the highest of the 50
steps before it (tutorial 02's regression with seed 1, step 1913: the very figures of a
real spike once reported missed, 20 and 7.6). A rise is measured against its own window,
so the early fast drop of a loss raises no bar: its steps were near their median when
logged. A spike's rise enters the memory too: the same jump again (a bad sample that
recurs every epoch) is no news for ``memory`` steps; and the ``window`` steps after a
spike, where an unstable optimizer's loss bounces, are its own.

Measured on the demo's classifier (12 seeds at 128 and 6 at 64 samples per step, 3,000
steps each), tutorials 02 and 07 and ``train_mlp``: no spike in ordinary training, where
no rise came to 4.1 times the highest of the 500 steps before it (4.7 as an instability
set in; the bar is 6). Reported are the instabilities of AdamW at a constant learning
rate near a loss of 1e-3, past the 2,000th step: the loss 100 to 1,000 times its median
for dozens of steps (seeds 9 and 10 at 128 samples; every 6,000 to 9,000 steps of
tutorial 01's 50,000-step playground), real spikes which the advice fits. What can pass
for one: noise so heavy-tailed that a batch costs 6 times more over the median than any
of the 500 before it (log-normal noise with Student-t(3) tails: 1.5 a run of 3,000 steps,
where the earlier bar, 10x the highest loss of the window, made 2.5).

The loss judged is the job's, not one rank's: each step's mean over the ranks
that log a loss (:class:`StepMeans`), i.e. the loss of the global batch. One
rank's loss on its slice of a batch is noisier and heavy-tailed (a hard slice of
8 samples may cost 7x the median). A rank whose slice pulls the mean up far
enough still makes the mean a spike, and the diagnosis names the rank with the
highest loss of that step.

>>> d = SpikeDetector(window=50, min_steps=20)
>>> [d.add(step, 1.0 + 0.01 * (step % 7)) for step in range(30)][-1] is None
True
>>> d.add(30, 20.0).step  # 19x the median; ordinary steps: at most 1.03x theirs
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
    scale: float  # the highest the last ``memory`` steps went, at today's median


class SpikeDetector:
    """A job's recent losses, and whether the newest is a spike (the defaults are those of
    ``clustersdk.diagnosis.spike-*`` in clustersdk.yaml)."""

    def __init__(
        self,
        window: int = 50,
        min_steps: int = 20,
        threshold: float = 10.0,
        ratio: float = 10.0,
        reach: float = 6.0,
        memory: int = 500,
    ):
        if not (
            isinstance(window, int) and isinstance(min_steps, int) and 3 <= min_steps <= window
        ):
            raise ValueError(
                f"spike detection needs 3 <= min_steps <= window, got "
                f"min_steps={min_steps!r}, window={window!r}"
            )
        if not (threshold > 0 and ratio >= 1 and reach >= 1):
            raise ValueError(
                f"spike threshold must be > 0, ratio and reach >= 1, got "
                f"threshold={threshold!r}, ratio={ratio!r}, reach={reach!r}"
            )
        if not (isinstance(memory, int) and memory >= 1):
            raise ValueError(f"spike memory must be a number of steps >= 1, got {memory!r}")
        self.window, self.min_steps, self.memory = window, min_steps, memory
        self.threshold, self.ratio, self.reach = float(threshold), float(ratio), float(reach)
        self.values: collections.deque[float] = collections.deque(maxlen=window)
        self.rises = SlidingMax(memory)  # each step's rise over the median before it
        self.last_step: int | None = None
        self.quiet_until = -1  # the steps up to this one belong to the last spike reported

    def add(self, step: int, value: float) -> Spike | None:
        """Take the loss of ``step``; the spike it is, if it is one."""
        if self.last_step is not None and step <= self.last_step:
            self.values.clear()  # replayed steps (a restart): start over
            self.rises = SlidingMax(self.memory)
            self.quiet_until = -1
        self.last_step = step
        if not math.isfinite(value):
            return None  # non-finite values are reported on their own
        spike = None
        if len(self.values) >= self.min_steps:
            ordered = sorted(self.values)
            spike = self._judge(step, value, ordered)
            median = _median(ordered)
            if median > 0:  # a spike's rise too: a jump as high again is no news
                self.rises.add(value / median - 1)
        self.values.append(value)
        if spike is None or step <= self.quiet_until:
            return None
        self.quiet_until = step + self.window  # the steps that bounce after it are its own
        return spike

    def _judge(self, step: int, value: float, ordered: list[float]) -> Spike | None:
        median = _median(ordered)
        rise = value - median
        if rise <= 0:
            return None
        highest = max(self.rises.max() or 0.0, 0.0)  # in medians
        scale = median * (1 + highest)  # where the last steps went, at today's median
        if median > 0 and (value < self.ratio * median or rise < self.reach * highest * median):
            return None
        mad = _median(sorted(abs(v - median) for v in ordered))
        score = MAX_SCORE if mad == 0 else min(0.6745 * rise / mad, MAX_SCORE)
        if score < self.threshold:
            return None
        return Spike(step, value, median, mad, score, scale)


class SlidingMax:
    """The highest of the last ``size`` values added, kept in O(1) per value (a deque of
    the values that a newer one has not outdone).

    >>> m = SlidingMax(3)
    >>> [(m.add(v), m.max())[1] for v in (5.0, 1.0, 2.0, 1.0, 0.5)]
    [5.0, 5.0, 5.0, 2.0, 2.0]
    """

    def __init__(self, size: int) -> None:
        self.size, self.count = size, 0
        self._best: collections.deque[tuple[int, float]] = collections.deque()

    def add(self, value: float) -> None:
        best = self._best
        while best and best[-1][1] <= value:
            best.pop()
        best.append((self.count, value))
        self.count += 1
        if best[0][0] <= self.count - 1 - self.size:
            best.popleft()

    def max(self) -> float | None:
        return self._best[0][1] if self._best else None


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
