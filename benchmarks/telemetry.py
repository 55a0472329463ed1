"""What live dashboards cost training: steps/s with telemetry and an open dashboard
against without, and the delay from ``ctx.log`` on a rank to the plot model.

The 2-rank DDP workload of ``launch.py`` (``_workload.py``, which logs the
loss every step) runs on one warm local cluster, in interleaved rounds:

* **off**: no system sampling on the workers, no dashboard in this process;
* **on**: sampling at the configured rate and a :class:`JobDashboard` open,
  pushing every update to its bqplot models as it would to a browser.

Medians are printed with their ratio, and the per-row delay from ``ctx.log``
to the loss chart's model (``Lines.y``), split at the kernel's receipt.

    python benchmarks/telemetry.py                      # 3 rounds of 1500 steps
    python benchmarks/telemetry.py --repeats 1 --steps 200 --json out.json   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")

import cloudpickle  # noqa: E402

import _workload  # noqa: E402

cloudpickle.register_pickle_by_value(_workload)

TARGET_RATIO = 0.99       # steps/s with dashboards / without
TARGET_P95_MS = 250.0     # ctx.log -> plot model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of off/on (default 3)")
    parser.add_argument("--steps", type=int, default=1500, help="steps per run (default 1500)")
    parser.add_argument("--metrics-interval", type=float, default=None,
                        help="seconds between metric shipments from each rank "
                             "(default: the configured clustersdk.metrics-interval)")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.steps <= _workload.WARMUP_STEPS:
        parser.error(f"--steps must exceed the {_workload.WARMUP_STEPS} warm-up steps, got {args.steps}")
    return args


def _set_sampling(interval: float) -> None:
    """Run on every worker: how often ranks started from now on sample the system."""
    import dask.config

    dask.config.set({"clustersdk.telemetry-interval": interval})


def run_once(cluster: Any, mode: str, steps: int, metrics_interval: float | None) -> dict[str, Any]:
    from clustersdk import config
    from clustersdk.widgets.job import JobDashboard

    on = mode == "on"
    cluster.client.run(_set_sampling, float(config.get("telemetry-interval")) if on else 1e9)
    job = cluster.launch(_workload.train_clustersdk, kwargs={"steps": steps}, world_size=2,
                         name=f"telemetry-{mode}-{time.time_ns()}", metrics_interval=metrics_interval)
    dash = JobDashboard(job) if on else None
    result = job.wait(timeout=600)
    out: dict[str, Any] = {"steps_per_s": result["steps_per_s"]}
    if dash is not None:
        time.sleep(0.5)  # the last batch reaches the charts
        dash.close()
        out["delays"] = list(dash.delays)
        out["received"] = list(dash.received)
        out["points"] = {rank: len(line.y) for rank, line in dash.charts["loss"].lines.items()}
    return out


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)] * 1000 if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import clustersdk as cs

    results: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="clustersdk-bench-") as state, \
            cs.Cluster.local(workers=2, state_dir=state) as cluster:
        run_once(cluster, "on", _workload.WARMUP_STEPS + 20, args.metrics_interval)  # warm both paths
        for i in range(args.repeats):
            for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                results[mode].append(run_once(cluster, mode, args.steps, args.metrics_interval))
                print(f"  round {i + 1} {mode:>3}: {results[mode][-1]['steps_per_s']:8.1f} steps/s",
                      flush=True)
    off = statistics.median(r["steps_per_s"] for r in results["off"])
    on = statistics.median(r["steps_per_s"] for r in results["on"])
    delays = [d for r in results["on"] for d in r["delays"]]
    received = [d for r in results["on"] for d in r["received"]]
    summary = {
        "steps_per_s_off": off, "steps_per_s_on": on, "ratio": on / off,
        "delay_p50_ms": _pct(delays, 0.5), "delay_p95_ms": _pct(delays, 0.95),
        "received_p50_ms": _pct(received, 0.5), "received_p95_ms": _pct(received, 0.95),
        "rows": len(delays), "metrics_interval": args.metrics_interval,
    }
    mi = args.metrics_interval or cs.config.get("metrics-interval")
    print(f"\n2 ranks, {args.steps} steps, {args.repeats} round(s), ranks ship metrics every {mi} s")
    print(f"  steps/s without telemetry or dashboard  {off:9.1f}")
    print(f"  steps/s with telemetry and a dashboard  {on:9.1f}")
    print(f"  ratio                                   {on / off:9.3f}   (target >= {TARGET_RATIO})")
    print(f"  ctx.log -> plot model, p50 / p95        {summary['delay_p50_ms']:5.0f} / "
          f"{summary['delay_p95_ms']:.0f} ms   (target p95 <= {TARGET_P95_MS:.0f} ms)")
    print(f"    of which ctx.log -> kernel, p50 / p95 {summary['received_p50_ms']:5.0f} / "
          f"{summary['received_p95_ms']:.0f} ms   (the ranks' metrics interval)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
