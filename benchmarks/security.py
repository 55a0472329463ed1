"""What mutual TLS costs: a TLS cluster against a plain one, side by side in one run.

Both are ``Cluster.local`` clusters of 2 CPU slots on this machine, one started with
``security="auto"`` (the default: a new CA, mutual TLS everywhere), one with
``security=False``. Measured, rounds interleaved (each round runs both, in
alternating order) so that machine noise hits both alike:

- cluster start: ``Cluster.local(...)`` to ready slots (``--starts`` of each);
- warm launch to first step and steps/s of the DDP workload of ``launch.py``
  (``_workload.py``: MLP 256→512→512→10, batch 64 per rank, gloo);
- one control-plane call (``cluster.jobs()``) and a new connection
  (``Cluster.connect``: the TLS handshake, with the user's credentials).

Targets: warm launch to first step within 20 ms of plain, steps/s within 2%.

    python benchmarks/security.py                        # 3 starts, 7 rounds of 300 steps
    python benchmarks/security.py --starts 1 --repeats 1 --steps 30   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")

import _workload  # noqa: E402
import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(_workload)

WORLD_SIZE = 2
WAYS = ("tls", "plain")
TARGET_FIRST_STEP_DELTA_S = 0.020  # TLS warm launch-to-first-step minus plain's
TARGET_STEPS_RATIO = 0.98  # TLS steps/s relative to plain's
CALLS = 50  # control-plane calls timed per round


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3, help="cluster starts of each (3)")
    parser.add_argument("--repeats", type=int, default=7, help="timed launches of each (7)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per launch (300)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure here")
    args = parser.parse_args(argv)
    for name in ("starts", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.steps <= _workload.WARMUP_STEPS:
        parser.error(f"--steps must exceed the {_workload.WARMUP_STEPS} warm-up steps")
    return args


def start(way: str, state: str) -> tuple[Any, float]:
    import clustersdk as cs

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cs.InsecureClusterWarning)  # plain on purpose here
        cluster = cs.Cluster.local(
            workers=WORLD_SIZE, state_dir=state, security="auto" if way == "tls" else False
        )
    cluster.slots()  # the control plane answers: ready
    return cluster, time.perf_counter() - t0


def launch(cluster: Any, steps: int) -> tuple[float, float]:
    t0 = time.time()
    job = cluster.launch(
        _workload.train_clustersdk, args=(steps,), world_size=WORLD_SIZE, strategy="ddp"
    )
    result = job.wait()
    return result["first_step"] - t0, result["steps_per_s"]


def call_time(cluster: Any) -> float:
    """The median of one ``cluster.jobs()`` round trip, seconds."""
    times = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        cluster.job_records()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def connect_time(cluster: Any) -> float:
    """A new client's connection (for TLS: a handshake with the creator's credentials)."""
    import clustersdk as cs

    t0 = time.perf_counter()
    with cs.Cluster.connect(
        cluster.scheduler_address, state_dir=cluster.state_dir, credentials=cluster.credentials
    ):
        return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        way: {"start_s": [], "first_step_s": [], "steps_per_s": [], "call_s": [], "connect_s": []}
        for way in WAYS
    }
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.starts):  # cold starts, alternating which goes first
            for way in WAYS if i % 2 == 0 else WAYS[::-1]:
                cluster, took = start(way, os.path.join(tmp, f"{way}-{i}"))
                cluster.close()
                out[way]["start_s"].append(took)
            print(
                f"start {i + 1}/{args.starts}: "
                + "  ".join(f"{w} {out[w]['start_s'][-1]:.2f} s" for w in WAYS),
                file=sys.stderr,
                flush=True,
            )
        clusters = {way: start(way, os.path.join(tmp, way))[0] for way in WAYS}
        try:
            for cluster in clusters.values():
                launch(cluster, args.steps)  # untimed: "warm" means a job has run before
            for i in range(args.repeats):
                for way in WAYS if i % 2 == 0 else WAYS[::-1]:
                    first, rate = launch(clusters[way], args.steps)
                    out[way]["first_step_s"].append(first)
                    out[way]["steps_per_s"].append(rate)
                    out[way]["call_s"].append(call_time(clusters[way]))
                    out[way]["connect_s"].append(connect_time(clusters[way]))
                print(
                    f"round {i + 1}/{args.repeats}: "
                    + "  ".join(
                        f"{w} {out[w]['first_step_s'][-1] * 1e3:.1f} ms "
                        f"{out[w]['steps_per_s'][-1]:.0f}/s"
                        for w in WAYS
                    ),
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            for cluster in clusters.values():
                cluster.close()
    return out


def summary(out: dict[str, Any]) -> dict[str, Any]:
    med = {
        way: {k: statistics.median(v) for k, v in figures.items()} for way, figures in out.items()
    }
    # paired per round: the same round's noise divides out
    ratios = [t / p for t, p in zip(out["tls"]["steps_per_s"], out["plain"]["steps_per_s"])]
    deltas = [t - p for t, p in zip(out["tls"]["first_step_s"], out["plain"]["first_step_s"])]
    return {
        "medians": med,
        "steps_ratio_paired": statistics.median(ratios),
        "first_step_delta_paired_s": statistics.median(deltas),
        "steps_ratio": med["tls"]["steps_per_s"] / med["plain"]["steps_per_s"],
        "first_step_delta_s": med["tls"]["first_step_s"] - med["plain"]["first_step_s"],
        "start_delta_s": med["tls"]["start_s"] - med["plain"]["start_s"],
    }


def render(s: dict[str, Any]) -> str:
    med = s["medians"]
    rows = [
        ("cluster start (s)", "start_s", 1, "{:.2f}"),
        ("warm launch to first step (ms)", "first_step_s", 1e3, "{:.1f}"),
        ("steps/s", "steps_per_s", 1, "{:.1f}"),
        ("one control-plane call (ms)", "call_s", 1e3, "{:.2f}"),
        ("a new connection (ms)", "connect_s", 1e3, "{:.1f}"),
    ]
    lines = [f"{'median':<32}{'TLS':>10}{'plain':>10}"]
    for label, key, scale, fmt in rows:
        lines.append(
            f"{label:<32}{fmt.format(med['tls'][key] * scale):>10}"
            f"{fmt.format(med['plain'][key] * scale):>10}"
        )
    lines.append(
        f"TLS steps/s vs plain: {s['steps_ratio']:.4f} (paired per round: "
        f"{s['steps_ratio_paired']:.4f})"
    )
    lines.append(
        f"TLS first step minus plain: {s['first_step_delta_s'] * 1e3:+.1f} ms (paired: "
        f"{s['first_step_delta_paired_s'] * 1e3:+.1f} ms); start: "
        f"{s['start_delta_s']:+.2f} s"
    )
    return "\n".join(lines)


def check_targets(s: dict[str, Any]) -> dict[str, bool]:
    met = {
        "first_step": s["first_step_delta_paired_s"] <= TARGET_FIRST_STEP_DELTA_S,
        "steps_per_s": s["steps_ratio_paired"] >= TARGET_STEPS_RATIO,
    }
    verdict = {True: "MET", False: "NOT MET"}
    print(
        f"target: TLS warm launch to first step within {TARGET_FIRST_STEP_DELTA_S * 1e3:.0f} "
        f"ms of plain: {s['first_step_delta_paired_s'] * 1e3:+.1f} ms -> "
        f"{verdict[met['first_step']]}"
    )
    print(
        f"target: TLS steps/s >= {TARGET_STEPS_RATIO} x plain: "
        f"{s['steps_ratio_paired']:.4f} x -> {verdict[met['steps_per_s']]}"
    )
    return met


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = run(args)
    s = summary(out)
    print(
        f"\n{WORLD_SIZE} ranks, gloo on CPU, {args.steps} steps; {args.starts} starts and "
        f"{args.repeats} launches of each\n"
    )
    print(render(s))
    print()
    met = check_targets(s)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": out, **s, "targets_met": met}, f, indent=2)


if __name__ == "__main__":
    main()
