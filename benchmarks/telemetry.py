"""What live dashboards cost training: steps/s with telemetry and an open dashboard
against without, and the delay from ``ctx.log`` on a rank to the plot model; what
the always-on phase timing costs; and what ``job.profile`` costs while it captures.

The 2-rank DDP workload of ``launch.py`` (``_workload.py``, which logs the
loss every step) runs on one warm local cluster, in interleaved rounds:

* **off**: no system sampling on the workers, no dashboard in this process;
* **on**: sampling at the configured rate and a :class:`JobDashboard` open,
  pushing every update to its bqplot models as it would to a browser.

Medians are printed with their ratio, and the per-row delay from ``ctx.log``
to the loss chart's model (``Lines.y``), split at the kernel's receipt.

Then, on the same cluster, with sampling off and no dashboard:

* **phase timing off / on** (``clustersdk.phase-timing`` on the workers),
  interleaved rounds, medians and their ratio (target >= 0.99); and the
  same comparison in this process (one rank, no cluster: the rank-side cost
  alone, free of the scheduler's and the other rank's noise);
* **profiling**: one run that profiles ``--profile-steps`` steps in its
  middle; rank 0 timestamps every step, and the median step time while
  capturing is compared with the median of as many steps just before and
  just after it, plus the time the capture's end (stopping the profiler,
  writing the trace) adds to the step after it.

    python benchmarks/telemetry.py                      # 3 rounds of 1500 steps
    python benchmarks/telemetry.py --repeats 1 --steps 200 --json out.json   # smoke run
    python benchmarks/telemetry.py --only phases,profile                    # skip the dashboard
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

import _workload  # noqa: E402
import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(_workload)

TARGET_RATIO = 0.99  # steps/s with dashboards / without
TARGET_P95_MS = 250.0  # ctx.log -> plot model
TARGET_PHASE_RATIO = 0.99  # steps/s with phase timing / without
PARTS = ("dashboard", "phases", "profile")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of off/on (default 3)")
    parser.add_argument("--steps", type=int, default=1500, help="steps per run (default 1500)")
    parser.add_argument(
        "--metrics-interval",
        type=float,
        default=None,
        help="seconds between metric shipments from each rank "
        "(default: the configured clustersdk.metrics-interval)",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=50,
        help="steps job.profile captures in the profiling run (default 50)",
    )
    parser.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"comma-separated parts to run, of {','.join(PARTS)} (default all)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(args.only) - set(PARTS))
    if unknown or not args.only:
        parser.error(f"--only takes parts of {','.join(PARTS)}, got {args.only!r}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.steps <= _workload.WARMUP_STEPS:
        parser.error(
            f"--steps must exceed the {_workload.WARMUP_STEPS} warm-up steps, got {args.steps}"
        )
    return args


def _set_sampling(interval: float) -> None:
    """Run on every worker: how often ranks started from now on sample the system."""
    import dask.config

    dask.config.set({"clustersdk.telemetry-interval": interval})


def _set_phase_timing(on: bool) -> None:
    """Run on every worker: whether ranks started from now on time their steps' phases."""
    import dask.config

    dask.config.set({"clustersdk.phase-timing": on})


def train_timestamped(ctx: Any, steps: int) -> dict[str, Any]:
    """The workload's loop, with rank 0 noting ``perf_counter`` at the end of every step."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    model = ctx.prepare(_workload.make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ends = []
    for _step, (x, y) in ctx.loop(_workload.make_batches(ctx.rank), steps=steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ctx.log(loss=loss)
        ends.append(time.perf_counter())
    return {"ends": ends}


def in_process(steps: int, block: int = 10) -> dict[bool, list[float]]:
    """Step durations of the workload's loop under a one-rank TrainContext in this process,
    with phase timing switched on and off every ``block`` steps of the same loop: both
    sides see the same machine, even a busy one."""
    import torch
    from torch import nn

    from clustersdk.runtime.context import TrainContext

    torch.set_num_threads(1)
    ctx = TrainContext(
        job="bench",
        name="bench",
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        strategy="ddp",
    )
    model = ctx.prepare(_workload.make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    clock = ctx._phases
    out: dict[bool, list[float]] = {False: [], True: []}
    last = time.perf_counter()
    for step, (x, y) in ctx.loop(_workload.make_batches(0), steps=steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ctx.log(loss=loss)
        now = time.perf_counter()
        if step >= _workload.WARMUP_STEPS:
            out[clock.enabled].append(now - last)
        last = now
        if step % block == block - 1:  # from the next step on
            clock.enabled = not clock.enabled
            clock.bind()
        if step % 100 == 0:
            ctx.drain_rows(), ctx.drain_phases()
    return out


def phase_round(cluster: Any, on: bool, steps: int) -> float:
    cluster.client.run(_set_phase_timing, on)
    job = cluster.launch(
        _workload.train_clustersdk,
        kwargs={"steps": steps},
        world_size=2,
        name=f"phases-{'on' if on else 'off'}-{time.time_ns()}",
    )
    return job.wait(timeout=600)["steps_per_s"]


def profile_run(cluster: Any, steps: int, capture: int) -> dict[str, Any]:
    """One run profiled in its middle: step times while capturing against before."""
    cluster.client.run(_set_phase_timing, True)
    job = cluster.launch(
        train_timestamped, kwargs={"steps": steps}, world_size=2, name=f"profiled-{time.time_ns()}"
    )
    start = max(steps // 3, _workload.WARMUP_STEPS + 5)
    while not any(r["step"] >= start for r in job.history(since=0)[-4:]):
        time.sleep(0.05)
    profile = job.profile(steps=capture, timeout=300)
    ends = job.wait(timeout=600)["ends"]
    durations = [b - a for a, b in zip(ends, ends[1:])]  # durations[i]: step i + 1
    first = profile.ranks[0]["first_step"]
    during = durations[first - 1 : first - 1 + capture]
    # the step after the capture pays for stopping the profiler and writing the trace
    after = durations[first - 1 + capture] if first + capture < len(ends) else float("nan")
    # the baseline: as many steps just before the capture and just after that step (the
    # machine's load drifts; neighbours share it)
    lo = max(first - 1 - capture, _workload.WARMUP_STEPS)
    around = durations[lo : first - 1] + durations[first + capture : first + 2 * capture]
    base = statistics.median(around)
    return {
        "first_step": first,
        "steps": capture,
        "step_ms_around": 1e3 * base,
        "step_ms_while_capturing": 1e3 * statistics.median(during),
        "ratio": base / statistics.median(during),
        "end_of_capture_ms": 1e3 * (after - base),
        "trace_mb": os.path.getsize(profile.traces[0]) / 1e6,
        "comm_share": profile.ranks[0]["communication_s"] / profile.ranks[0]["wall_s"],
    }


def run_once(cluster: Any, mode: str, steps: int, metrics_interval: float | None) -> dict[str, Any]:
    from clustersdk import config
    from clustersdk.widgets.job import JobDashboard

    on = mode == "on"
    cluster.client.run(_set_sampling, float(config.get("telemetry-interval")) if on else 1e9)
    job = cluster.launch(
        _workload.train_clustersdk,
        kwargs={"steps": steps},
        world_size=2,
        name=f"telemetry-{mode}-{time.time_ns()}",
        metrics_interval=metrics_interval,
    )
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
    phases: dict[bool, list[float]] = {False: [], True: []}
    local: dict[bool, list[float]] = {False: [], True: []}  # step durations
    summary: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="clustersdk-bench-") as state,
        cs.Cluster.local(workers=2, state_dir=state) as cluster,
    ):
        run_once(
            cluster, "on", _workload.WARMUP_STEPS + 20, args.metrics_interval
        )  # warm both paths
        for i in range(args.repeats if "dashboard" in args.only else 0):
            for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
                results[mode].append(run_once(cluster, mode, args.steps, args.metrics_interval))
                print(
                    f"  round {i + 1} {mode:>3}: {results[mode][-1]['steps_per_s']:8.1f} steps/s",
                    flush=True,
                )
        cluster.client.run(_set_sampling, 1e9)  # the next parts measure the ranks alone
        for i in range(args.repeats if "phases" in args.only else 0):
            for on in (False, True) if i % 2 == 0 else (True, False):
                phases[on].append(phase_round(cluster, on, args.steps))
                print(
                    f"  round {i + 1} phase timing {'on' if on else 'off':>3}: "
                    f"{phases[on][-1]:8.1f} steps/s",
                    flush=True,
                )
            for on, durations in in_process(10 * args.steps).items():
                local[on] += durations
        if "profile" in args.only:
            capture = min(args.profile_steps, max(args.steps // 4, 1))
            summary["profile"] = profile_run(cluster, max(args.steps, 4 * capture + 40), capture)
    if "dashboard" in args.only:
        summary.update(_dashboard_summary(args, results, cs.config.get("metrics-interval")))
    if "phases" in args.only:
        p_off, p_on = statistics.median(phases[False]), statistics.median(phases[True])
        l_off = 1 / statistics.median(local[False])
        l_on = 1 / statistics.median(local[True])
        summary.update(
            phase_steps_per_s_off=p_off,
            phase_steps_per_s_on=p_on,
            phase_ratio=p_on / p_off,
            phase_in_process_ratio=l_on / l_off,
            phase_cost_us_per_step=1e6 * (1 / l_on - 1 / l_off),
        )
        print(f"\nphase timing, 2 ranks, {args.steps} steps, {args.repeats} round(s), no sampling")
        print(f"  steps/s without phase timing            {p_off:9.1f}")
        print(f"  steps/s with phase timing               {p_on:9.1f}")
        print(
            f"  ratio                                   {p_on / p_off:9.3f}   "
            f"(target >= {TARGET_PHASE_RATIO})"
        )
        print("  in process, 1 rank, on and off in alternate blocks of 10 steps of one loop:")
        print(f"    steps/s off / on                      {l_off:9.1f} / {l_on:.1f}")
        print(
            f"    ratio                                 {l_on / l_off:9.3f}   "
            f"({summary['phase_cost_us_per_step']:+.1f} us per step)"
        )
    if "profile" in args.only:
        p = summary["profile"]
        print(f"\njob.profile(steps={p['steps']}) from step {p['first_step']}, rank 0")
        print(
            f"  step time around the capture            {p['step_ms_around']:9.3f} ms"
            "   (as many steps before and after it)"
        )
        print(f"  step time while capturing               {p['step_ms_while_capturing']:9.3f} ms")
        print(f"  steps/s while capturing / around        {p['ratio']:9.3f}")
        print(
            f"  end of capture (stop, write trace)      {p['end_of_capture_ms']:9.1f} ms once"
            f"   (trace {p['trace_mb']:.1f} MB; communication {100 * p['comm_share']:.0f}% "
            "of the captured time)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


def _dashboard_summary(
    args: argparse.Namespace, results: dict[str, list[dict[str, Any]]], default_interval: float
) -> dict[str, Any]:
    off = statistics.median(r["steps_per_s"] for r in results["off"])
    on = statistics.median(r["steps_per_s"] for r in results["on"])
    delays = [d for r in results["on"] for d in r["delays"]]
    received = [d for r in results["on"] for d in r["received"]]
    summary = {
        "steps_per_s_off": off,
        "steps_per_s_on": on,
        "ratio": on / off,
        "delay_p50_ms": _pct(delays, 0.5),
        "delay_p95_ms": _pct(delays, 0.95),
        "received_p50_ms": _pct(received, 0.5),
        "received_p95_ms": _pct(received, 0.95),
        "rows": len(delays),
        "metrics_interval": args.metrics_interval,
    }
    mi = args.metrics_interval or default_interval
    print(
        f"\n2 ranks, {args.steps} steps, {args.repeats} round(s), ranks ship metrics every {mi} s"
    )
    print(f"  steps/s without telemetry or dashboard  {off:9.1f}")
    print(f"  steps/s with telemetry and a dashboard  {on:9.1f}")
    print(f"  ratio                                   {on / off:9.3f}   (target >= {TARGET_RATIO})")
    print(
        f"  ctx.log -> plot model, p50 / p95        {summary['delay_p50_ms']:5.0f} / "
        f"{summary['delay_p95_ms']:.0f} ms   (target p95 <= {TARGET_P95_MS:.0f} ms)"
    )
    print(
        f"    of which ctx.log -> kernel, p50 / p95 {summary['received_p50_ms']:5.0f} / "
        f"{summary['received_p95_ms']:.0f} ms   (the ranks' metrics interval)"
    )
    return summary


if __name__ == "__main__":
    sys.exit(main())
