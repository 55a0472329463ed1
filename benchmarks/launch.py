"""Launch overhead and training speed: torchrun vs notebook_launcher vs warm clustersdk.

The same 2-rank gloo DDP workload (``_workload.py``) runs under each launcher.
Each round runs all three back to back, in an order that rotates from round to
round, so that machine noise and any warming-up hit them alike. Steps/s ratios
are the median of the rounds' paired ratios (clustersdk's run against the other
launcher's run of the same round); the target compares clustersdk with the
faster of torchrun and notebook_launcher.

    python benchmarks/launch.py                        # 7 rounds of 500 steps
    python benchmarks/launch.py --repeats 1 --steps 30 # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

# Before distributed is imported anywhere (here or in the worker processes, which
# inherit the environment): its INFO logging would bury the table.
os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")

import _workload  # noqa: E402
import cloudpickle  # noqa: E402

# Dask workers can't import benchmarks/, so ship the workload's code with the job.
cloudpickle.register_pickle_by_value(_workload)

WORLD_SIZE = 2
WAYS = ("torchrun", "notebook_launcher", "clustersdk (warm)")
TARGET_FIRST_STEP_S = 0.06  # clustersdk warm launch-to-first-step
TARGET_STEPS_RATIO = 0.98  # clustersdk steps/s relative to the faster other launcher's

Timing = tuple[float, float]  # (seconds from launch to step 0 done, steps/s)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument(
        "--steps", type=int, default=500, help="training steps per run (default 500)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the medians here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.steps <= _workload.WARMUP_STEPS:
        parser.error(
            f"--steps must exceed the {_workload.WARMUP_STEPS} warm-up steps, got {args.steps}"
        )
    return args


def _read_timings(path: str, t0: float) -> Timing:
    with open(path) as f:
        timings = json.load(f)
    os.remove(path)  # a stale file must never pass for the next run's result
    return timings["first_step"] - t0, timings["steps_per_s"]


def time_torchrun(steps: int, tmp: str) -> Timing:
    out = os.path.join(tmp, "torchrun.json")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={WORLD_SIZE}",
        "--standalone",
        _workload.__file__,
        out,
        str(steps),
    ]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
    return _read_timings(out, t0)


def time_notebook_launcher(steps: int, tmp: str) -> Timing:
    from accelerate import notebook_launcher

    out = os.path.join(tmp, "notebook.json")
    port = str(_free_port())  # a fixed port could still be held by the previous run's store
    t0 = time.time()
    with contextlib.redirect_stdout(io.StringIO()):  # "Launching training on 2 CPUs."
        notebook_launcher(
            _workload.train_from_env, args=(steps, out), num_processes=WORLD_SIZE, use_port=port
        )
    return _read_timings(out, t0)


def time_clustersdk(cluster: Any, steps: int) -> Timing:
    t0 = time.time()
    job = cluster.launch(
        _workload.train_clustersdk, args=(steps,), world_size=WORLD_SIZE, strategy="ddp"
    )
    result = job.wait()
    return result["first_step"] - t0, result["steps_per_s"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rounds(repeats: int, steps: int) -> dict[str, list[Timing]]:
    """Round i runs every way once; the clustersdk cluster is started and warmed first."""
    import accelerate  # noqa: F401  (a notebook has it imported before it launches)

    import clustersdk as cs

    results: dict[str, list[Timing]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        with cs.Cluster.local(workers=WORLD_SIZE, state_dir=os.path.join(tmp, "state")) as cluster:
            time_clustersdk(cluster, steps)  # untimed: "warm" means a job has run before
            runners: dict[str, Callable[[], Timing]] = {
                "torchrun": lambda: time_torchrun(steps, tmp),
                "notebook_launcher": lambda: time_notebook_launcher(steps, tmp),
                "clustersdk (warm)": lambda: time_clustersdk(cluster, steps),
            }
            for i in range(repeats):
                order = list(WAYS[i % len(WAYS) :] + WAYS[: i % len(WAYS)])
                for way in order:
                    results[way].append(runners[way]())
                line = "  ".join(
                    f"{w} {t[-1][0]:.3f}s {t[-1][1]:.0f}/s" for w, t in results.items()
                )
                print(f"round {i + 1}/{repeats}: {line}", file=sys.stderr, flush=True)
    return results


def medians(results: dict[str, list[Timing]]) -> dict[str, dict[str, float]]:
    return {
        way: {
            "first_step_s": statistics.median(t[0] for t in runs),
            "steps_per_s": statistics.median(t[1] for t in runs),
        }
        for way, runs in results.items()
    }


def paired_ratios(results: dict[str, list[Timing]]) -> dict[str, float]:
    """clustersdk's steps/s over each other launcher's: the median of the rounds' ratios."""
    ours = [t[1] for t in results["clustersdk (warm)"]]
    return {
        way: statistics.median(a / b[1] for a, b in zip(ours, results[way]))
        for way in WAYS
        if way != "clustersdk (warm)"
    }


def render(med: dict[str, dict[str, float]]) -> str:
    """The table, with first-step speed-ups and steps/s ratios (of the medians)."""
    base, nbl = med["torchrun"], med["notebook_launcher"]
    lines = [
        f"{'':<19}{'':>15}{'':>9}{'first-step speed-up':>28}{'steps/s ratio':>15}",
        f"{'way':<19}{'first step (s)':>15}{'steps/s':>9}"
        f"{'vs torchrun':>13}{'vs notebook':>15}{'vs torchrun':>15}",
    ]
    for way, m in med.items():
        lines.append(
            f"{way:<19}{m['first_step_s']:>15.3f}{m['steps_per_s']:>9.1f}"
            f"{base['first_step_s'] / m['first_step_s']:>12.1f}x"
            f"{nbl['first_step_s'] / m['first_step_s']:>14.1f}x"
            f"{m['steps_per_s'] / base['steps_per_s']:>15.3f}"
        )
    return "\n".join(lines)


def check_targets(med: dict[str, dict[str, float]], paired: dict[str, float]) -> dict[str, bool]:
    cs_m = med["clustersdk (warm)"]
    faster = max(paired, key=lambda way: med[way]["steps_per_s"])
    ratio = paired[faster]
    for way, r in paired.items():
        print(f"clustersdk steps/s / {way}'s, median of paired rounds: {r:.3f}")
    met = {
        "first_step": cs_m["first_step_s"] <= TARGET_FIRST_STEP_S,
        "steps_per_s": ratio >= TARGET_STEPS_RATIO,
    }
    verdict = {True: "MET", False: "NOT MET"}
    print(
        f"target: clustersdk warm launch-to-first-step <= {TARGET_FIRST_STEP_S} s: "
        f"{cs_m['first_step_s']:.3f} s -> {verdict[met['first_step']]}"
    )
    print(
        f"target: clustersdk steps/s >= {TARGET_STEPS_RATIO} x the faster other launcher "
        f"({faster}): "
        f"{ratio:.3f} x -> {verdict[met['steps_per_s']]}"
    )
    return met


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = run_rounds(args.repeats, args.steps)
    med = medians(results)
    paired = paired_ratios(results)
    print(
        f"\n{WORLD_SIZE} ranks, gloo on CPU, 1 torch thread per rank, {args.steps} steps, "
        f"median of {args.repeats}\n"
    )
    print(render(med))
    print()
    met = check_targets(med, paired)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "steps": args.steps,
                    "repeats": args.repeats,
                    "medians": med,
                    "paired_ratios": paired,
                    "runs": results,
                    "targets_met": met,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
