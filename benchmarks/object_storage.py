"""What a checkpoint in object storage costs, against a plain upload of as many bytes.

One process saves a state dict of ``--mb`` MiB (tensors of 1 MiB to 16 MiB) through
clustersdk's :class:`ObjectStorage` (DCP's fsspec writer, two threads) and commits it
(the manifest, the clean-up of the step), side by side with a plain ``s3fs`` upload of
the same bytes as two objects written by two threads; and loads it back through the
storage's reader against a plain download. Rounds interleave the two so that noise hits
both alike; medians and their ratios are printed.

The server is moto's S3 API server, started here on 127.0.0.1, unless
``AWS_ENDPOINT_URL`` (and credentials) already name one: then ``--bucket`` there.

    python benchmarks/object_storage.py                    # 5 rounds of 64 MiB
    python benchmarks/object_storage.py --repeats 1 --mb 4 --json out.json   # smoke run
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
import warnings
from typing import Any

TARGET_SAVE_RATIO = 0.5  # save + commit MB/s over a plain two-thread upload's


def start_server() -> subprocess.Popen | None:
    if os.environ.get("AWS_ENDPOINT_URL"):
        return None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("moto's server did not start")


def state(mb: int) -> dict[str, Any]:
    import torch

    sizes, total, i = [1, 4, 16], 0, 0
    out = {}
    while total < mb:
        n = min(sizes[i % 3], mb - total)
        out[f"t{i}"] = torch.randn(n << 18)  # n MiB of float32
        total, i = total + n, i + 1
    return out


def one_round(fs: Any, root: str, tensors: dict[str, Any], step: int) -> dict[str, float]:
    import torch
    import torch.distributed.checkpoint as dcp

    from clustersdk import checkpoint_files as files
    from clustersdk.runtime.checkpoint.storage import storage

    place = storage(root)
    tmp = place.workdir(root, step, uuid.uuid4().hex[:8])
    t0 = time.perf_counter()
    dcp.save(tensors, storage_writer=place.writer(tmp), no_dist=True)
    t1 = time.perf_counter()
    place.commit(tmp, files.step_dir(root, step), step, 1)
    files.retain(root, 2)
    t2 = time.perf_counter()
    blob = b"".join(t.numpy().tobytes() for t in tensors.values())
    half = len(blob) // 2
    base = f"{root.removeprefix('s3://')}/plain-{step}"
    t3 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(
            pool.map(
                lambda kv: fs.pipe_file(*kv),
                [(f"{base}/a", blob[:half]), (f"{base}/b", blob[half:])],
            )
        )
    t4 = time.perf_counter()
    back = {k: torch.empty_like(v) for k, v in tensors.items()}
    path = files.step_dir(root, step)
    t5 = time.perf_counter()
    dcp.load(back, storage_reader=storage(path).reader(path), no_dist=True)
    t6 = time.perf_counter()
    fs.cat_file(f"{base}/a"), fs.cat_file(f"{base}/b")
    t7 = time.perf_counter()
    fs.rm(base, recursive=True)
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    return {
        "save": t1 - t0,
        "commit": t2 - t1,
        "upload": t4 - t3,
        "load": t6 - t5,
        "download": t7 - t6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--bucket", default="clustersdk-bench")
    parser.add_argument("--json", help="write the medians here")
    args = parser.parse_args()
    server = start_server()
    try:
        import fsspec

        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        fs = fsspec.filesystem("s3")
        if not fs.exists(args.bucket):
            fs.mkdir(args.bucket)
        root = f"s3://{args.bucket}/bench-{uuid.uuid4().hex[:6]}"
        tensors = state(args.mb)
        rounds = [one_round(fs, root, tensors, step) for step in range(1, args.repeats + 1)]
        fs.rm(root.removeprefix("s3://"), recursive=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    mb = args.mb
    save_rate = mb / (med["save"] + med["commit"])
    upload_rate = mb / med["upload"]
    ratio = save_rate / upload_rate
    print(f"{mb} MiB, {args.repeats} round(s), medians")
    print(
        f"  save (DCP, ObjectStorage)   {med['save'] * 1e3:8.1f} ms  "
        f"+ commit {med['commit'] * 1e3:.1f} ms  = {save_rate:7.1f} MiB/s"
    )
    print(
        f"  plain upload (2 threads)    {med['upload'] * 1e3:8.1f} ms  = {upload_rate:7.1f} MiB/s"
    )
    print(f"  ratio save/upload           {ratio:8.2f}  (target >= {TARGET_SAVE_RATIO})")
    print(
        f"  load (DCP, ObjectStorage)   {med['load'] * 1e3:8.1f} ms;  plain download "
        f"{med['download'] * 1e3:.1f} ms  (ratio {med['download'] / med['load']:.2f})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians_s": med, "save_over_upload": ratio, "mb": mb}, f, indent=1)


if __name__ == "__main__":
    main()
