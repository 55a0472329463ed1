"""TensorBoard event files from ``ctx.log`` rows, per rank or averaged over ranks.

A row is what a rank logs at a step: ``{"rank", "step", "time", "scalars":
{name: float}}``. :class:`ScalarWriter` writes rows as TensorBoard scalar
events, with the row's step as ``global_step`` and its time as wall time:

- ``ScalarWriter(logdir, rank=r)`` writes to ``logdir/rank-r`` (one run per rank);
- ``ScalarWriter(logdir, rank=None)`` writes to ``logdir`` itself, for rows
  averaged over ranks by :func:`aggregate` (or, streaming, :class:`Aggregator`).

It uses the ``tensorboard`` package's own event-file writer and protobufs, so
that TensorBoard reads the files back exactly (``pip install tensorboard``).

>>> with ScalarWriter("runs/a", rank=0) as w:                           # doctest: +SKIP
...     w.write([{"rank": 0, "step": 1, "time": 1.7e9, "scalars": {"loss": 0.5}}])
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

Row = Mapping[str, Any]


class ScalarWriter:
    """Writes scalar rows to one TensorBoard run directory."""

    def __init__(self, logdir: str | os.PathLike, rank: int | None = None, flush_secs: float = 5.0):
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "tensorboard_dir= needs the tensorboard package: pip install tensorboard"
            ) from e
        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self.rank = rank
        self.logdir = os.fspath(logdir) if rank is None else os.path.join(logdir, f"rank-{rank}")
        self._writer = EventFileWriter(self.logdir, flush_secs=flush_secs)
        self._closed = False

    def write(self, rows: Iterable[Row]) -> None:
        """One scalar event per row and name (rows of other ranks are a mistake)."""
        for row in rows:
            if self.rank is not None and row.get("rank") not in (None, self.rank):
                raise ValueError(f"rank {self.rank}'s writer got a row of rank {row.get('rank')}")
            values = [
                self._summary.Value(tag=name, simple_value=float(value))
                for name, value in sorted(row["scalars"].items())
            ]
            if values:
                self._writer.add_event(
                    self._event(
                        wall_time=float(row["time"]),
                        step=int(row["step"]),
                        summary=self._summary(value=values),
                    )
                )

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (idempotent)."""
        if not self._closed:
            self._closed = True
            self._writer.close()

    def __enter__(self) -> ScalarWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def aggregate(rows: Iterable[Row], world_size: int | None = None) -> list[dict[str, Any]]:
    """Mean over ranks, per step, of the steps that every rank has reported.

    "Every rank" is ranks ``0..world_size-1``, or, without ``world_size``, every
    rank that appears in ``rows``. A rank that logs twice at one step counts
    once (its later values win). The result has ``rank=None``, the newest
    time of the step and, per name, the mean over the ranks that logged it;
    it is sorted by step.

    >>> aggregate([{"rank": 0, "step": 1, "time": 1.0, "scalars": {"loss": 1.0}},
    ...            {"rank": 1, "step": 1, "time": 2.0, "scalars": {"loss": 3.0}},
    ...            {"rank": 0, "step": 2, "time": 3.0, "scalars": {"loss": 0.5}}])
    [{'rank': None, 'step': 1, 'time': 2.0, 'scalars': {'loss': 2.0}}]
    """
    by_step = _by_step(rows)
    ranks = (
        set(range(world_size))
        if world_size is not None
        else {rank for per_rank in by_step.values() for rank in per_rank}
    )
    return [
        _mean(step, per_rank)
        for step, per_rank in sorted(by_step.items())
        if ranks and set(per_rank) >= ranks
    ]


class Aggregator:
    """:func:`aggregate` for rows that arrive in batches: holds a step until it is complete.

    >>> agg = Aggregator(world_size=2)
    >>> agg.add([{"rank": 0, "step": 0, "time": 1.0, "scalars": {"loss": 1.0}}])
    []
    >>> agg.add([{"rank": 1, "step": 0, "time": 1.5, "scalars": {"loss": 2.0}}])
    [{'rank': None, 'step': 0, 'time': 1.5, 'scalars': {'loss': 1.5}}]
    """

    def __init__(self, world_size: int):
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self._pending: dict[int, dict[int, Row]] = defaultdict(dict)

    def add(self, rows: Iterable[Row]) -> list[dict[str, Any]]:
        """Take new rows; return the steps they complete, in step order."""
        touched = set()
        for row in rows:
            self._pending[int(row["step"])][int(row["rank"])] = _merge(
                self._pending[int(row["step"])].get(int(row["rank"])), row
            )
            touched.add(int(row["step"]))
        done = sorted(s for s in touched if len(self._pending[s]) >= self.world_size)
        return [_mean(step, self._pending.pop(step)) for step in done]


def _by_step(rows: Iterable[Row]) -> dict[int, dict[int, Row]]:
    by_step: dict[int, dict[int, Row]] = defaultdict(dict)
    for row in rows:
        step, rank = int(row["step"]), int(row["rank"])
        by_step[step][rank] = _merge(by_step[step].get(rank), row)
    return by_step


def _merge(old: Row | None, new: Row) -> Row:
    if old is None:
        return new
    return {
        **new,
        "time": max(old["time"], new["time"]),
        "scalars": {**old["scalars"], **new["scalars"]},
    }


def _mean(step: int, per_rank: Mapping[int, Row]) -> dict[str, Any]:
    sums: dict[str, list[float]] = defaultdict(list)
    for row in per_rank.values():
        for name, value in row["scalars"].items():
            sums[name].append(float(value))
    return {
        "rank": None,
        "step": step,
        "time": max(r["time"] for r in per_rank.values()),
        "scalars": {name: sum(v) / len(v) for name, v in sorted(sums.items())},
    }


class JobBoard:
    """A job's TensorBoard runs: one per rank, plus the mean over ranks per step."""

    def __init__(self, logdir: str, world_size: int):
        self.logdir = logdir
        self._ranks: dict[int, ScalarWriter] = {}
        self._mean = ScalarWriter(logdir, rank=None)
        self._aggregator = Aggregator(world_size)

    def write(self, rows: Iterable[Row]) -> None:
        rows = list(rows)
        for row in rows:
            rank = int(row["rank"])
            if rank not in self._ranks:
                self._ranks[rank] = ScalarWriter(self.logdir, rank=rank)
            self._ranks[rank].write([row])
        self._mean.write(self._aggregator.add(rows))

    def close(self) -> None:
        for writer in (*self._ranks.values(), self._mean):
            writer.close()
