"""Parquet input for one rank of two: clustersdk's ParquetLoader against Hugging Face
``datasets`` streaming the same files (``split_dataset_by_node``, batched ``iter``),
each under a simulated training step, in one run.

Prints the seconds per epoch (median of ``--repeats``) of

- ``datasets``: streaming Parquet, split by node, read in batches on the training thread;
- ``clustersdk, prefetch=0``: row groups read on the training thread;
- ``clustersdk, prefetch=2``: read by a background thread while the step runs;

and the ratios. With a step about as long as reading a batch, prefetching
should take the epoch close to the longer of the two instead of their sum.

    .venv/bin/python benchmarks/data.py            # --repeats 1 --rows 50000: a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from clustersdk.runtime.parquet import ParquetLoader

RANK, WORLD = 0, 2


def write(root: str, rows: int, files: int, columns: int) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(files):
        n = rows // files
        table = pa.table({f"c{j}": rng.standard_normal(n) for j in range(columns)})
        path = os.path.join(root, f"part-{i:03d}.parquet")
        pq.write_table(table, path, row_group_size=4096)
        paths.append(path)
    return paths


def epoch_ours(root: str, batch: int, step: float, prefetch: int) -> tuple[float, int]:
    loader = ParquetLoader(
        root, batch, RANK, WORLD, torch.device("cpu"), shuffle=False, prefetch=prefetch
    )
    t, n = time.perf_counter(), 0
    for b in loader:
        torch.stack([b[k] for k in b], 1).sum()  # touch the batch
        time.sleep(step)  # the step: a GPU would compute while the CPU is free
        n += 1
    return time.perf_counter() - t, n


def epoch_hf(paths: list[str], batch: int, step: float) -> tuple[float, int]:
    import datasets
    from datasets.distributed import split_dataset_by_node

    ds = datasets.load_dataset("parquet", data_files=paths, split="train", streaming=True)
    ds = split_dataset_by_node(ds, rank=RANK, world_size=WORLD).with_format("numpy")
    t, n = time.perf_counter(), 0
    # its fast path: batches formatted at once (per-example torch formatting is ~100x slower)
    for b in ds.iter(batch_size=batch, drop_last_batch=True):
        torch.stack([torch.from_numpy(b[k]) for k in b], 1).sum()
        time.sleep(step)
        n += 1
    return time.perf_counter() - t, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--columns", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256, help="per rank")
    parser.add_argument(
        "--step",
        type=float,
        default=None,
        help="seconds per simulated step (default: the time to read a batch)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        paths = write(root, args.rows, args.files, args.columns)
        read, n = epoch_ours(root, args.batch, 0.0, 0)  # warm the page cache; time reading alone
        step = args.step if args.step is not None else read / n
        runs: dict[str, list[float]] = {"datasets": [], "prefetch=0": [], "prefetch=2": []}
        counts = {}
        for _ in range(args.repeats):
            for name, run in (
                ("datasets", lambda: epoch_hf(paths, args.batch, step)),
                ("prefetch=0", lambda: epoch_ours(root, args.batch, step, 0)),
                ("prefetch=2", lambda: epoch_ours(root, args.batch, step, 2)),
            ):
                seconds, counts[name] = run()
                runs[name].append(seconds / counts[name])
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(
        f"rank {RANK} of {WORLD}: {args.rows} rows x {args.columns} float64 columns in "
        f"{args.files} files; batch {args.batch}; reading alone {1e3 * read / n:.2f} ms/batch; "
        f"simulated step {1e3 * step:.2f} ms"
    )
    for name, value in med.items():
        print(f"  {name:<11} {1e3 * value:7.2f} ms per step ({counts[name]} steps per epoch)")
    print(
        f"prefetch=2 / prefetch=0: {med['prefetch=2'] / med['prefetch=0']:.2f} (target <= 0.75: "
        "reading overlaps the step)"
    )
    print(f"prefetch=2 / datasets:   {med['prefetch=2'] / med['datasets']:.2f}")


if __name__ == "__main__":
    main()
