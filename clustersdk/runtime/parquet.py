"""``ctx.shard`` of Parquet files: read by row group, each rank only what it needs.

The units of reading are the files' row groups (``pip install
'clustersdk[data]'`` for pyarrow). They are dealt, once and for good, to
``lanes`` streams (``lanes=``, by default the job's data-parallel size when
the loader is first made; kept in checkpoints): each unit goes to the lane with the fewest rows
so far, so lanes differ by at most one row group. Global batch ``b`` is rows
``[b*L, (b+1)*L)`` of every lane, lane after lane (``L = G / lanes``, ``G``
the global batch), and rank ``r`` takes its ``r``-th slice of those ``G``
rows. With as many lanes as ranks, rank ``r`` reads lane ``r`` alone: each
row group is read by one rank. At another world size (a resume) the batches
stay the same; a rank then reads the lanes its slice spans. (Two fresh runs
see the same batches if they have the same global batch and lanes.)

``shuffle=True`` (the default) permutes each lane's row groups, and the rows
inside each row group, per epoch and seed: deterministic, so the position is
one number, the global batches taken this epoch. An epoch is as many global
batches as the shortest lane fills; what the other lanes hold beyond that
(less than one row group each) is left out of that epoch.

Batches are dicts of column name to tensor (numbers; lists of numbers of one
length become 2-D tensors) or list (anything else), or whatever
``collate_fn(table)`` makes of this rank's rows as a ``pyarrow.Table``.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import SpecError
from .streams import Prefetcher, split_global_batch, to_device


def arrow() -> Any:
    """``pyarrow.dataset``, with an install hint when it is missing."""
    try:
        import pyarrow.dataset as pads
    except ImportError as e:  # pragma: no cover - pyarrow is in the test extra
        raise SpecError(
            "ctx.shard of Parquet files needs pyarrow: pip install 'clustersdk[data]'"
        ) from e
    return pads


def is_parquet(source: Any) -> bool:
    """Paths (files, directories, globs, a list of them) or a ``pyarrow.dataset.Dataset``."""
    if isinstance(source, (str, os.PathLike)):
        return True
    if (
        isinstance(source, (list, tuple))
        and source
        and all(isinstance(s, (str, os.PathLike)) for s in source)
    ):
        return True
    module = type(source).__module__ or ""
    return module.startswith("pyarrow") and hasattr(source, "get_fragments")


class ParquetLoader:
    """Iterates one epoch of this rank's batches per ``iter()``, moved to ``device``."""

    def __init__(
        self,
        source: Any,
        batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device,
        shuffle: bool | None = None,
        seed: int = 0,
        collate_fn: Callable | None = None,
        prefetch: int = 2,
        columns: list[str] | None = None,
        lanes: int | None = None,
    ):
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise SpecError(f"prefetch must be a non-negative int (batches), got {prefetch!r}")
        self.units, self.files = _units(source)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.device = device
        self.shuffle = True if shuffle is None else bool(shuffle)
        self.seed = seed
        self.collate_fn = collate_fn or table_to_batch
        self.prefetch = prefetch
        self.columns = columns
        self.epoch = 0
        self.consumed = 0  # samples of the current epoch taken by all ranks together
        if lanes is not None and (
            isinstance(lanes, bool)
            or not isinstance(lanes, int)
            or lanes < 1
            or self.global_batch % lanes
        ):
            raise SpecError(
                f"lanes must be a positive int that divides the global batch of "
                f"{self.global_batch}, got {lanes!r}"
            )
        self.lanes = lanes or world_size
        self._deal()
        if len(self) == 0:
            raise ValueError(
                f"the Parquet files hold {sum(u[2] - u[1] for u in self.units)} rows in "
                f"{len(self.units)} row groups: not one global batch of {self.global_batch} "
                f"over {self.lanes} lanes"
            )

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def _deal(self) -> None:
        """Units to lanes, by rows (fixed for every epoch: the epoch length is too)."""
        units = list(self.units)
        while len(units) < self.lanes:  # fewer row groups than lanes: split the largest
            i = max(range(len(units)), key=lambda k: units[k][2] - units[k][1])
            frag, start, stop = units[i]
            mid = (start + stop) // 2
            if mid == start:
                break
            units[i : i + 1] = [(frag, start, mid), (frag, mid, stop)]
        self._lane_units: list[list[int]] = [[] for _ in range(self.lanes)]
        rows = [0] * self.lanes
        for index, (_frag, start, stop) in enumerate(units):
            lane = min(range(self.lanes), key=lambda k: (rows[k], k))
            self._lane_units[lane].append(index)
            rows[lane] += stop - start
        self._dealt = units
        self._lane_rows = rows

    @property
    def per_lane(self) -> int:
        return self.global_batch // self.lanes

    def __len__(self) -> int:
        """Global batches per epoch: as many as the shortest lane fills."""
        return min(self._lane_rows) // self.per_lane

    def end_of_epoch(self) -> bool:
        return self.consumed >= len(self) * self.global_batch

    def __iter__(self) -> Iterator[Any]:
        if self.end_of_epoch():  # saved right at an epoch's end
            self.epoch, self.consumed = self.epoch + 1, 0
        reader = Prefetcher(
            self._batches(self.epoch, self.consumed // self.global_batch),
            self.prefetch,
            name=f"clustersdk-parquet-rank{self.rank}",
        )
        try:
            for batch in reader:
                self.consumed += self.global_batch
                yield to_device(batch, self.device)
        finally:
            reader.close()
        self.epoch, self.consumed = self.epoch + 1, 0

    def _batches(self, epoch: int, start: int) -> Iterator[Any]:
        """This rank's batches of ``epoch`` from global batch ``start`` on."""
        L, B, r = self.per_lane, self.batch_size, self.rank
        spans = []  # (lane, lo, hi): the rows of each lane's L that are this rank's
        for lane in range(self.lanes):
            lo, hi = max(r * B, lane * L) - lane * L, min((r + 1) * B, (lane + 1) * L) - lane * L
            if lo < hi:
                spans.append((lane, lo, hi))
        readers = {
            lane: _Lane(self._order(lane, epoch), self._read, start * L) for lane, _lo, _hi in spans
        }
        for _ in range(start, len(self)):
            parts = [readers[lane].take(L).slice(lo, hi - lo) for lane, lo, hi in spans]
            table = parts[0] if len(parts) == 1 else _concat(parts)
            yield self.collate_fn(table)

    def _order(self, lane: int, epoch: int) -> list[tuple[int, int]]:
        """(unit index, row-permutation seed) of ``lane``'s units in ``epoch``'s order."""
        units = self._lane_units[lane]
        if not self.shuffle:
            return [(u, -1) for u in units]
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 1009 + lane)
        perm = torch.randperm(len(units), generator=g).tolist()
        return [(units[i], (self.seed * 1_000_003 + epoch) * 1_000_033 + units[i]) for i in perm]

    def _read(self, unit: int, row_seed: int) -> Any:
        frag, start, stop = self._dealt[unit]
        table = frag.to_table(columns=self.columns).slice(start, stop - start)
        if row_seed >= 0:
            g = torch.Generator().manual_seed(row_seed)
            table = table.take(torch.randperm(table.num_rows, generator=g).numpy())
        return table

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "global_batch": self.global_batch,
            "lanes": self.lanes,
            "files": self.files,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off, with its global batch and lanes."""
        if state.get("files", self.files) != self.files:
            raise ValueError(
                "the Parquet files are not those of the checkpoint (their paths, row "
                "groups or row counts changed); resume on the same files"
            )
        self.epoch, self.consumed, self.seed = (
            int(state["epoch"]),
            int(state["consumed"]),
            int(state["seed"]),
        )
        self.batch_size = split_global_batch(int(state["global_batch"]), self.world_size)
        self.lanes = int(state.get("lanes", self.lanes))
        self._deal()


class _Lane:
    """One lane's rows, in order, from ``offset`` on; reads a unit when it gets to it."""

    def __init__(self, order: list[tuple[int, int]], read: Callable[[int, int], Any], offset: int):
        self.order, self.read = order, read
        self.next_unit = 0
        self.table: Any = None
        self.pos = 0
        self._skip(offset)

    def _skip(self, rows: int) -> None:
        while rows > 0:
            self._load()
            n = min(rows, self.table.num_rows - self.pos)
            self.pos += n
            rows -= n

    def _load(self) -> None:
        if self.table is None or self.pos >= self.table.num_rows:
            unit, seed = self.order[self.next_unit]
            self.next_unit += 1
            self.table, self.pos = self.read(unit, seed), 0

    def take(self, n: int) -> Any:
        parts = []
        while n > 0:
            self._load()
            k = min(n, self.table.num_rows - self.pos)
            parts.append(self.table.slice(self.pos, k))
            self.pos += k
            n -= k
        return parts[0] if len(parts) == 1 else _concat(parts)


def _units(source: Any) -> tuple[list[tuple[Any, int, int]], str]:
    """Every row group as (fragment, first row, end row), in path order; and their fingerprint."""
    pads = arrow()
    if isinstance(source, (str, os.PathLike)) or isinstance(source, (list, tuple)):
        given = [os.fspath(s) for s in (source if isinstance(source, (list, tuple)) else [source])]
        paths, missing = [], []
        for path in given:
            matches = sorted(glob.glob(path)) if any(c in path for c in "*?[") else [path]
            paths += [p for p in matches if os.path.exists(p)]
            missing += [path] if not matches or not os.path.exists(matches[0]) else []
        if missing:
            raise SpecError(f"ctx.shard: no such Parquet file or directory: {', '.join(missing)}")
        # a directory is searched (recursively, partitions too); several paths are files
        source = pads.dataset(paths[0] if len(paths) == 1 else paths, format="parquet")
    units, names = [], []
    for fragment in sorted(source.get_fragments(), key=lambda f: f.path):
        for piece in fragment.split_by_row_group():
            group = piece.row_groups[0]
            units.append((piece, 0, group.num_rows))
            names.append(f"{fragment.path}#{group.id}:{group.num_rows}")
    if not units:
        raise SpecError("ctx.shard: the Parquet dataset has no row groups (no files?)")
    return units, hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def _concat(tables: list[Any]) -> Any:
    import pyarrow as pa

    return pa.concat_tables(tables)


def table_to_batch(table: Any) -> dict[str, Any]:
    """Columns of numbers as tensors (equal-length lists of numbers as 2-D), others as lists."""
    import numpy as np
    import pyarrow as pa

    out: dict[str, Any] = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        kind = column.type
        if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            if column.null_count == 0:
                out[name] = torch.from_numpy(np.array(column.to_numpy(zero_copy_only=False)))
                continue
        if (
            pa.types.is_list(kind)
            or pa.types.is_fixed_size_list(kind)
            or pa.types.is_large_list(kind)
        ) and column.null_count == 0:
            inner = kind.value_type
            lengths = (
                set(column.value_lengths().to_pylist())
                if not pa.types.is_fixed_size_list(kind)
                else {kind.list_size}
            )
            if len(lengths) == 1 and (pa.types.is_integer(inner) or pa.types.is_floating(inner)):
                flat = np.array(column.flatten().to_numpy(zero_copy_only=False))
                out[name] = torch.from_numpy(flat.reshape(len(column), -1))
                continue
        out[name] = column.to_pylist()
    return out
