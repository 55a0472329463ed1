"""Script jobs against torchrun: the same unmodified DDP script (``_ddp_script.py``) at 3
ranks through ``torchrun --nproc-per-node 3`` and through ``cluster.launch_script`` on a
warm local cluster, rounds interleaved; plus what ``clustersdk.script`` costs a step.

Printed: time from launch to the script's first line and total wall time (medians, with
ratios), whether the final parameters agree (<= 1e-6), and whether each rank's lines
are in ``job.logs``; then the per-call cost of ``clustersdk.script.log`` and ``.step``.

    python benchmarks/scripts.py                         # 3 repeats of 200 steps
    python benchmarks/scripts.py --repeats 1 --steps 20  # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "_ddp_script.py")
WORLD_SIZE = 3
TOLERANCE = 1e-6

Run = dict[str, Any]  # first_line_s, total_s, params (path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per way (default 3)")
    parser.add_argument("--steps", type=int, default=200, help="steps per run (default 200)")
    parser.add_argument(
        "--calls", type=int, default=20000, help="clustersdk.script calls timed (default 20000)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps < 1:
        parser.error("--repeats and --steps must be at least 1")
    return args


def time_torchrun(steps: int, out: str) -> Run:
    """torchrun from its start to its first line and to its exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={WORLD_SIZE}",
            "--standalone",
            SCRIPT,
            "--steps",
            str(steps),
            "--out",
            out,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    first = None
    lines = []
    for line in proc.stdout:
        if first is None:
            first = time.perf_counter() - t0
        lines.append(line)
    proc.wait()
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited with {proc.returncode}")
    return {"first_line_s": first, "total_s": total, "params": out}


def time_launch_script(cluster: Any, steps: int, out: str, name: str) -> Run:
    """launch_script from the call to the first log line (as the rank's agent read it) and
    to the job's end; every rank's lines must be in its log."""
    t0_wall, t0 = time.time(), time.perf_counter()
    job = cluster.launch_script(
        SCRIPT, ["--steps", str(steps), "--out", out], world_size=WORLD_SIZE, name=name
    )
    assert job.wait(timeout=600) == 0
    total = time.perf_counter() - t0
    lines = job.log_lines()
    first = min(line["time"] for line in lines) - t0_wall
    per_rank = {r: [line["text"] for line in lines if line["rank"] == r] for r in range(WORLD_SIZE)}
    logged = all(
        any(re.match(rf"rank {r} step {steps - 1} loss", t) for t in per_rank[r])
        and per_rank[r][0] == f"rank {r} of {WORLD_SIZE} up"
        for r in per_rank
    )
    return {"first_line_s": first, "total_s": total, "params": out, "logs_complete": logged}


def max_difference(a: str, b: str) -> float:
    import torch

    pa, pb = torch.load(a), torch.load(b)
    return max(float((pa[k] - pb[k]).abs().max()) for k in pa)


def overhead(calls: int) -> dict[str, float]:
    """Microseconds per clustersdk.script.log / .step call, in a process given a rank's
    socket (this one reads it), and per call outside a job."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "control.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)

        def drain() -> None:
            peer, _ = server.accept()
            peer.sendall(json.dumps({"words": [0] * 10}).encode() + b"\n")
            while peer.recv(1 << 16):
                pass

        threading.Thread(target=drain, daemon=True).start()
        code = f"""
import json, time
from clustersdk import script
n = {calls}
script.log(step=0, loss=1.0)
t = time.perf_counter()
for i in range(n):
    script.log(step=i, loss=0.5)
log_us = (time.perf_counter() - t) / n * 1e6
t = time.perf_counter()
for i in range(n):
    script.step(i)
step_us = (time.perf_counter() - t) / n * 1e6
print(json.dumps({{"log_us": log_us, "step_us": step_us}}))
"""
        inside = json.loads(
            subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "CLUSTERSDK_CONTROL": path},
            ).stdout.splitlines()[-1]
        )
        outside = json.loads(
            subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "CLUSTERSDK_CONTROL": ""},
            ).stdout.splitlines()[-1]
        )
        server.close()
    return {
        "log_us": inside["log_us"],
        "step_us": inside["step_us"],
        "log_us_outside": outside["log_us"],
        "step_us_outside": outside["step_us"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import clustersdk as cs

    runs: dict[str, list[Run]] = {"torchrun": [], "launch_script": []}
    diffs, complete = [], []
    with (
        tempfile.TemporaryDirectory() as tmp,
        cs.Cluster.local(workers=WORLD_SIZE, state_dir=os.path.join(tmp, "state")) as c,
    ):
        time_launch_script(c, 2, os.path.join(tmp, "warm.pt"), "warm-up")  # untimed
        for i in range(args.repeats):
            theirs = time_torchrun(args.steps, os.path.join(tmp, f"torchrun-{i}.pt"))
            ours = time_launch_script(
                c, args.steps, os.path.join(tmp, f"ours-{i}.pt"), f"bench-{i}"
            )
            runs["torchrun"].append(theirs)
            runs["launch_script"].append(ours)
            diffs.append(max_difference(theirs["params"], ours["params"]))
            complete.append(ours["logs_complete"])
            print(
                f"round {i + 1}/{args.repeats}: torchrun first line "
                f"{theirs['first_line_s']:.2f} s, total {theirs['total_s']:.2f} s; "
                f"launch_script {ours['first_line_s']:.2f} s, {ours['total_s']:.2f} s; "
                f"max |param diff| {diffs[-1]:.2e}",
                file=sys.stderr,
                flush=True,
            )
    med = {
        way: {k: statistics.median(r[k] for r in rs) for k in ("first_line_s", "total_s")}
        for way, rs in runs.items()
    }
    cost = overhead(args.calls)
    base, ours = med["torchrun"], med["launch_script"]
    print(
        f"\n{WORLD_SIZE} ranks, gloo on CPU, {args.steps} steps of an MLP 256-512-512-10, "
        f"median of {args.repeats}\n"
    )
    print(f"{'way':<16}{'launch -> first line (s)':>26}{'total (s)':>12}")
    for way, m in med.items():
        print(f"{way:<16}{m['first_line_s']:>26.3f}{m['total_s']:>12.3f}")
    print(
        f"{'ratio':<16}{ours['first_line_s'] / base['first_line_s']:>26.3f}"
        f"{ours['total_s'] / base['total_s']:>12.3f}   (launch_script / torchrun)"
    )
    print(
        f"\nfinal parameters, max |difference| over {args.repeats} run(s): {max(diffs):.2e} "
        f"({'<=' if max(diffs) <= TOLERANCE else '>'} {TOLERANCE:g})"
    )
    print(f"every rank's lines in job.logs: {all(complete)}")
    print(
        f"clustersdk.script in a job: log {cost['log_us']:.1f} us, step {cost['step_us']:.2f} "
        f"us per call; outside a job: log {cost['log_us_outside']:.2f} us, step "
        f"{cost['step_us_outside']:.2f} us"
    )
    result = {
        "steps": args.steps,
        "repeats": args.repeats,
        "medians": med,
        "max_param_diff": max(diffs),
        "logs_complete": all(complete),
        "overhead": cost,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if max(diffs) > TOLERANCE or not all(complete):
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
