"""``ctx.log``: one row per rank and step, scalars reduced across ranks on request.

Every ``ctx.log`` call of a step merges into that step's row (a later value
of the same name wins), so that a training loss and the evaluation logged
after it at the same step make one row. The row is shipped once the step is
over: the periodic drain (on the worker's event loop) never takes the row of
the step still running; a drain on the rank's own thread (its exit, a
failure, an event it reports) does, except while the ranks agree on control
words in the middle of a step (a pause during an evaluation).

``reduce=`` (``"mean"``, ``"sum"``, ``"max"``, ``"min"``) combines a scalar
over all ranks: outside an evaluation at once (two small collectives: every
rank must log the same call at the same point), inside
:meth:`TrainContext.evaluate` over the whole pass (the mean of every call on
every rank), reduced once when the pass ends. A rank may log ``None`` for a
name (a pipeline stage without the loss): it takes part, adding nothing.
"""

from __future__ import annotations

import collections
import contextlib
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from ..errors import SpecError

RESERVED = frozenset({"seq", "rank", "step", "time"})  # fields of every metrics row
REDUCTIONS = ("mean", "sum", "max", "min")
_IDENTITY = {"max": float("-inf"), "min": float("inf")}


class Metrics:
    """One rank's logged rows: the open row of the current step, and the closed ones."""

    def __init__(self, rank: int, world_size: int, group: Any):
        self.rank, self.world_size, self.group = rank, world_size, group
        self._rows: collections.deque = collections.deque()
        self._open: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._owner = threading.get_ident()  # the rank's thread: the context is made there
        self._holding = 0
        self.evaluation: Evaluation | None = None

    # logging ---------------------------------------------------------------------------
    def log(self, step: int, scalars: dict[str, Any], reduce: str | None = None) -> None:
        if reduce is not None and reduce not in REDUCTIONS:
            raise SpecError(f"ctx.log(reduce={reduce!r}): expected one of {REDUCTIONS} or None")
        row = _checked(scalars)
        if reduce is None:
            if row:
                self.merge(step, row)
            return
        evaluation = self.evaluation or Evaluation()
        evaluation.add(row, reduce, names=scalars)
        if evaluation is not self.evaluation:  # outside an evaluation: reduce now
            self.finish(step, evaluation)

    def merge(self, step: int, row: dict[str, Any]) -> None:
        """Add ``row``'s scalars to the open row of ``step`` (closing an older one)."""
        with self._lock:
            if self._open is not None and self._open["step"] != step:
                self._close()
            if self._open is None:
                self._open = {"rank": self.rank, "step": step, "time": time.time(), "scalars": {}}
            self._open["scalars"].update(row)

    def scalars_of(self, step: int) -> dict[str, Any]:
        """What has been logged so far in the open row of ``step`` (tensors as logged)."""
        with self._lock:
            if self._open is None or self._open["step"] != step:
                return {}
            return dict(self._open["scalars"])

    # the step boundary -----------------------------------------------------------------
    def end_step(self) -> None:
        """The loop moves on: the step's row is complete."""
        with self._lock:
            self._close()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Keep the open row out of drains (the step is not over while ranks agree)."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1

    def drain(self) -> list[dict[str, Any]]:
        """Closed rows since the last drain, as plain numbers."""
        with self._lock:
            if (
                self._open is not None
                and not self._holding
                and threading.get_ident() == self._owner
            ):
                self._close()
            rows = list(self._rows)
            self._rows.clear()
        for row in rows:
            row["scalars"] = {
                k: (v.item() if isinstance(v, torch.Tensor) else v)
                for k, v in row["scalars"].items()
            }
        return rows

    def _close(self) -> None:
        if self._open is not None:
            if self._open["scalars"]:
                self._rows.append(self._open)
            self._open = None

    # evaluation ------------------------------------------------------------------------
    @contextlib.contextmanager
    def evaluating(self) -> Iterator[Evaluation]:
        if self.evaluation is not None:
            raise SpecError("ctx.evaluate is already running: an evaluation can't nest another")
        self.evaluation = Evaluation()
        try:
            yield self.evaluation
        finally:
            self.evaluation = None

    def finish(self, step: int, evaluation: Evaluation) -> dict[str, float]:
        """Reduce what the pass accumulated over the ranks and log it at ``step``."""
        row = {
            k: v
            for k, v in evaluation.reduce(self.world_size, self.group).items()
            if not math.isnan(v)
        }  # logged by no rank at all
        if row:
            self.merge(step, row)
        return row


class Evaluation:
    """Sums, counts and extremes of the scalars logged with ``reduce=`` during one pass."""

    def __init__(self) -> None:
        self.ops: dict[str, str] = {}
        self.totals: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, row: dict[str, Any], op: str, names: Any = ()) -> None:
        """Add ``row``'s values; ``names`` (``row``'s and those logged as None) take part."""
        for name in (*names, *row):
            known = self.ops.setdefault(name, op)
            if known != op:
                raise SpecError(
                    f"ctx.log({name}=..., reduce={op!r}) in an evaluation that logs "
                    f"{name} with reduce={known!r}: one reduction per name"
                )
        for name, value in row.items():
            value = _number(value)
            if op in ("max", "min"):
                pick = max if op == "max" else min
                self.totals[name] = pick(self.totals.get(name, _IDENTITY[op]), value)
            else:
                self.totals[name] = self.totals.get(name, 0.0) + value
            self.counts[name] = self.counts.get(name, 0) + 1

    def reduce(self, world_size: int, group: Any) -> dict[str, float]:
        """Every rank's figures combined (collectives on ``group`` when there are peers)."""
        ops = dict(self.ops)
        if world_size > 1:  # a rank may have logged a name the others did not
            everyone: list[Any] = [None] * world_size
            dist.all_gather_object(everyone, sorted(ops.items()), group=group)
            for part in everyone:
                for name, op in part:
                    if ops.setdefault(name, op) != op:
                        raise SpecError(
                            f"ranks log {name} with different reductions ({ops[name]!r} and {op!r})"
                        )
        names = sorted(ops)
        if not names:
            return {}
        summed = [n for n in names if ops[n] in ("mean", "sum")]
        # one SUM for the totals and every name's count, one MAX, one MIN
        flat = [self.totals.get(n, 0.0) for n in summed] + [
            float(self.counts.get(n, 0)) for n in names
        ]
        sums = self._all_reduce(flat, "sum", world_size, group)
        totals, counts = dict(zip(summed, sums)), dict(zip(names, sums[len(summed) :]))
        for kind in ("max", "min"):
            chosen = [n for n in names if ops[n] == kind]
            if chosen:
                extremes = [self.totals.get(n, _IDENTITY[kind]) for n in chosen]
                totals.update(zip(chosen, self._all_reduce(extremes, kind, world_size, group)))
        out: dict[str, float] = {}
        for name in names:
            if not counts[name]:
                out[name] = math.nan  # no rank logged a value
            elif ops[name] == "mean":
                out[name] = totals[name] / counts[name]
            else:
                out[name] = totals[name]
        return out

    @staticmethod
    def _all_reduce(values: list[float], op: str, world_size: int, group: Any) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        if world_size > 1:
            dist.all_reduce(tensor, op=_OPS[op], group=group)
        return tensor.tolist()


_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


def _number(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def _checked(scalars: dict[str, Any]) -> dict[str, Any]:
    """The loggable scalars: numbers or one-element tensors (detached); None left out."""
    row = {}
    for key, value in scalars.items():
        if value is None:
            continue
        if key in RESERVED:
            raise SpecError(
                f"ctx.log({key}=...): {key!r} is recorded with every row already; pick another name"
            )
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise SpecError(
                    f"ctx.log({key}=...) needs a number or a one-element tensor, got a tensor "
                    f"of shape {tuple(value.shape)}"
                )
            value = value.detach()
            if value.device.type == "cpu":
                value = value.item()
        elif not isinstance(value, (int, float)):
            raise SpecError(f"ctx.log({key}=...) needs a number, got {type(value).__name__}")
        row[key] = value
    return row
