"""ctx.shard of streams and Parquet files: the same global batches at any world size, and
a saved position that a resume at another world size continues exactly."""

from __future__ import annotations

import itertools
import os
import threading

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

from clustersdk.runtime.data import ShardedLoader, make_loader
from clustersdk.runtime.parquet import ParquetLoader
from clustersdk.runtime.streams import StreamLoader

CPU = torch.device("cpu")


def write_parquet(root, sizes=(70, 45, 90), row_group=16) -> str:
    """Files of rows ``id`` (unique across files) and ``pair`` (a list of two numbers)."""
    os.makedirs(root, exist_ok=True)
    start = 0
    for i, n in enumerate(sizes):
        ids = np.arange(start, start + n, dtype=np.int64)
        table = pa.table(
            {"id": ids, "pair": [[int(v), -int(v)] for v in ids], "name": [f"row{v}" for v in ids]}
        )
        pq.write_table(table, os.path.join(root, f"part-{i}.parquet"), row_group_size=row_group)
        start += n
    return str(root)


class Counting(IterableDataset):
    """0..n-1, one tensor at a time; counts how often it was iterated."""

    def __init__(self, n: int = 90):
        self.n, self.passes = n, 0

    def __iter__(self):
        self.passes += 1
        return iter(torch.arange(self.n).split(1))


def hf_stream(n: int = 90):
    return datasets.IterableDataset.from_generator(lambda: ({"id": i} for i in range(n)))


def ids(batch) -> list[int]:
    if isinstance(batch, dict):
        batch = batch["id"]
    return torch.as_tensor(batch).flatten().tolist()


def run(make, world_size: int, state=None, steps=None, **options):
    """Every rank's loader; each step's batches concatenated in rank order, until the
    epoch ends (or ``steps``); and rank 0's position afterwards."""
    batch_size = options.pop("global_batch", 12) // world_size
    loaders = [
        make_loader(make(), batch_size, r, world_size, CPU, **options) for r in range(world_size)
    ]
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
    iters = [iter(loader) for loader in loaders]
    steps_seen = []
    for _ in itertools.count() if steps is None else range(steps):
        try:
            batches = [ids(next(it)) for it in iters]
        except StopIteration:
            break
        steps_seen.append(list(itertools.chain(*batches)))
    for it in iters:
        it.close()
    return steps_seen, loaders[0].state_dict(), loaders


SOURCES = {
    "parquet": lambda root: lambda: write_parquet(root),
    "stream": lambda root: Counting,
    "hf-stream": lambda root: hf_stream,
}


@pytest.mark.parametrize("kind", sorted(SOURCES))
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_a_resume_at_any_world_size_continues_the_global_stream_exactly(tmp_path, kind, world_size):
    make = SOURCES[kind](tmp_path)
    full, _, loaders = run(make, 2)
    assert len(full) >= 6 and all(len(step) == 12 for step in full)
    flat = list(itertools.chain(*full))
    assert len(set(flat)) == len(flat)  # no sample twice in an epoch
    part, state, _ = run(make, 2, steps=4)
    assert part == full[:4]
    rest, end, _ = run(make, world_size, state=state)
    assert part + rest == full
    assert end["epoch"] == 1 and end["consumed"] == 0


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_epochs_differ_and_resume_mid_second_epoch(tmp_path, kind):
    make = SOURCES[kind](tmp_path)
    source = make()
    loader = make_loader(source, 6, 0, 2, CPU)
    first, second = [ids(b) for b in loader], [ids(b) for b in loader]
    assert len(first) == len(second) and loader.epoch == 2
    if kind == "parquet":  # shuffled per epoch (streams keep their own order)
        assert first != second and sorted(sum(first, [])) != sum(first, [])
    again = make_loader(make(), 6, 0, 2, CPU)
    list(again)
    it = iter(again)
    taken = [ids(next(it)) for _ in range(2)]
    state = again.state_dict()
    it.close()
    resumed = make_loader(make(), 6, 0, 2, CPU)
    resumed.load_state_dict(state)
    assert taken + [ids(b) for b in resumed] == second


def test_a_fresh_parquet_run_at_another_world_size_sees_the_same_batches_with_the_same_lanes(
    tmp_path,
):
    make = SOURCES["parquet"](tmp_path)
    two, _, _ = run(make, 2, lanes=4)
    four, _, _ = run(make, 4)  # lanes default to the world size: 4
    one, _, _ = run(make, 1, lanes=4)
    assert two == four == one


def test_parquet_ranks_read_only_their_lanes_row_groups(tmp_path, monkeypatch):
    root = write_parquet(tmp_path, sizes=(64, 64, 64, 64), row_group=16)
    reads: dict[int, list] = {0: [], 1: []}
    original = ParquetLoader._read

    def read(self, unit, seed):
        reads[self.rank].append(unit)
        return original(self, unit, seed)

    monkeypatch.setattr(ParquetLoader, "_read", read)
    for rank in (0, 1):
        list(ParquetLoader(root, 8, rank, 2, CPU, prefetch=0))
    assert reads[0] and reads[1] and not set(reads[0]) & set(reads[1])
    assert sorted(reads[0] + reads[1]) == list(range(16))  # every row group read once


def test_parquet_batches_are_tensors_columns_and_collate(tmp_path):
    root = write_parquet(tmp_path)
    batch = next(iter(ParquetLoader(root, 4, 0, 1, CPU, shuffle=False)))
    assert batch["id"].dtype == torch.int64 and batch["id"].tolist() == [0, 1, 2, 3]
    assert batch["pair"].shape == (4, 2) and batch["pair"][:, 1].tolist() == [0, -1, -2, -3]
    assert batch["name"] == ["row0", "row1", "row2", "row3"]
    only = next(iter(ParquetLoader(root, 4, 0, 1, CPU, shuffle=False, columns=["id"])))
    assert set(only) == {"id"}
    tables = next(iter(ParquetLoader(root, 4, 0, 1, CPU, collate_fn=lambda t: t.num_rows)))
    assert tables == 4
    import pyarrow.dataset as pads

    from_dataset = ParquetLoader(pads.dataset(root, format="parquet"), 4, 0, 1, CPU, shuffle=False)
    assert ids(next(iter(from_dataset))) == [0, 1, 2, 3]
    from_glob = ParquetLoader(os.path.join(root, "part-[12].parquet"), 4, 0, 1, CPU, shuffle=False)
    assert ids(next(iter(from_glob))) == [70, 71, 72, 73] and len(from_glob) == (45 + 90) // 4


def test_parquet_resume_on_changed_files_is_refused(tmp_path):
    root = write_parquet(tmp_path / "a")
    state = ParquetLoader(root, 4, 0, 1, CPU).state_dict()
    other = ParquetLoader(write_parquet(tmp_path / "b", sizes=(70, 45, 91)), 4, 0, 1, CPU)
    with pytest.raises(ValueError, match="not those of the checkpoint"):
        other.load_state_dict(state)


def test_a_replayed_stream_skips_what_was_taken_and_a_resumable_one_reads_on(tmp_path):
    stream = Counting(60)
    loader = StreamLoader(stream, 6, 0, 1, CPU)
    it = iter(loader)
    [next(it) for _ in range(3)]
    state = loader.state_dict()
    it.close()
    again = Counting(60)
    resumed = StreamLoader(again, 6, 0, 1, CPU)
    resumed.load_state_dict(state)
    assert ids(next(iter(resumed))) == list(range(18, 24))
    hf = StreamLoader(hf_stream(), 6, 0, 1, CPU)
    assert hf.resumable and not loader.resumable
    it = iter(hf)
    [next(it) for _ in range(3)]
    assert '"shard_example_idx": 18' in hf.state_dict()["stream"]  # the dataset's own position


def test_prefetch_reads_ahead_in_a_thread_and_stops_with_the_iterator(tmp_path):
    root = write_parquet(tmp_path)
    seen = []
    loader = ParquetLoader(
        root,
        4,
        0,
        1,
        CPU,
        prefetch=3,
        collate_fn=lambda t: seen.append(threading.current_thread().name) or t,
    )
    it = iter(loader)
    next(it)
    assert seen and all(name.startswith("clustersdk-parquet") for name in seen)
    assert "clustersdk-parquet-rank0" in {t.name for t in threading.enumerate()}
    it.close()
    assert "clustersdk-parquet-rank0" not in {t.name for t in threading.enumerate()}
    assert loader.consumed == 4  # what was read ahead is not part of the position


def test_an_error_in_the_reading_thread_reaches_the_loop():
    class Broken(IterableDataset):
        def __iter__(self):
            yield torch.tensor([1])
            raise OSError("disk gone")

    it = iter(StreamLoader(Broken(), 1, 0, 1, CPU))
    next(it)
    with pytest.raises(OSError, match="disk gone"):
        next(it)


def test_hugging_face_map_style_datasets_go_through_the_map_style_loader():
    ds = datasets.Dataset.from_dict({"id": list(range(40))}).with_format("torch")
    loader = make_loader(ds, 4, 1, 2, CPU, shuffle=False)
    assert isinstance(loader, ShardedLoader) and len(loader) == 5
    assert ids(next(iter(loader))) == [4, 5, 6, 7]


def test_stream_lengths_and_misuse_name_the_problem():
    with pytest.raises(TypeError, match="has no length: loop with steps=, or with epochs="):
        len(StreamLoader(Counting(), 4, 0, 1, CPU))
    sized = TensorDataset(torch.arange(10))
    assert len(make_loader(sized, 2, 0, 1, CPU)) == 5
    with pytest.raises(ValueError, match="can't shuffle a stream"):
        make_loader(Counting(), 4, 0, 1, CPU, shuffle=True)
    with pytest.raises(ValueError, match="no such Parquet file or directory: /nowhere"):
        make_loader("/nowhere", 4, 0, 1, CPU)
    with pytest.raises(ValueError, match="prefetch must be a non-negative int"):
        make_loader(Counting(), 4, 0, 1, CPU, prefetch=-1)
