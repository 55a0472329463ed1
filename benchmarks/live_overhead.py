"""What ``job.run`` / ``job.update`` cost a job that never uses them: steps/s with the live
hooks against the same loop with them taken out; and how long a call takes when used.

The 2-rank DDP workload of ``launch.py`` (``_workload.py``, default launch options)
runs on one warm local cluster, in interleaved rounds:

* **with hooks**: the shipped build (every agreed control vector is compared with
  what the rank did; after its first step each rank reports what job.update may
  change);
* **without**: the same build with those hooks patched to no-ops in the workers
  (``Live.due`` answers False, ``Live.first_step`` does nothing), i.e. a build with
  the feature taken out.

Medians are printed with their ratio (the issue's target: within 0.5%). Separate
rounds swing by 10% on a loaded 2-core machine, so the same comparison follows with
the hooks on and off at alternate steps of one loop, each step with them paired with
the one before: as a 2-rank job of the cluster, and in this process (one rank, no
cluster: the rank-side cost alone). Then the hook's own time per control check, and,
once, the latency of a ``job.run`` and a ``job.update`` on a running and on a paused job.

    python benchmarks/live_overhead.py                      # 5 rounds of 1500 steps
    python benchmarks/live_overhead.py --repeats 1 --steps 100 --json out.json   # smoke run
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

TARGET_RATIO = 0.995  # steps/s with the hooks / without


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds of with/without (default 5)")
    parser.add_argument("--steps", type=int, default=1500, help="steps per run (default 1500)")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.steps <= _workload.WARMUP_STEPS:
        parser.error(
            f"--steps must exceed the {_workload.WARMUP_STEPS} warm-up steps, got {args.steps}"
        )
    return args


def set_hooks(on: bool) -> None:
    """Run on every worker: the live hooks of ranks started from now on, or no-ops."""
    from clustersdk.runtime import live

    original = live.__dict__.setdefault("_original_hooks", (live.Live.due, live.Live.first_step))
    if on:
        live.Live.due, live.Live.first_step = original
    else:
        live.Live.due = lambda self, words: False
        live.Live.first_step = lambda self, *args: None


def cluster_round(cluster: Any, on: bool, steps: int) -> float:
    cluster.client.run(set_hooks, on)
    job = cluster.launch(
        _workload.train_clustersdk,
        kwargs={"steps": steps},
        world_size=2,
        name=f"live-{'on' if on else 'off'}-{time.time_ns()}",
    )
    return job.wait(timeout=600)["steps_per_s"]


class _Inert:
    """The hooks taken out: a rank with nothing to ask and nothing to report."""

    phase = None  # never running a job.run function

    def due(self, words: list[int]) -> bool:
        return False

    def first_step(self, *args: Any) -> None:
        pass


def alternate(ctx: Any, steps: int, standalone: bool = False) -> dict[str, Any]:
    """The workload's loop with the live hooks swapped in and out at every step (every
    rank alike: the same steps are with them): each step with them is paired with the one
    before it, without (the machine's load drifts slowly; neighbours share it). Medians of
    the step time off and on, and of the paired difference."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    model = ctx.prepare(_workload.make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx.register(optimizer=opt)
    live, inert = ctx._live, _Inert()
    ctx._live = inert
    durations: list[tuple[bool, float]] = []
    last = time.perf_counter()
    for step, (x, y) in ctx.loop(_workload.make_batches(ctx.rank), steps=steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ctx.log(loss=loss)
        now = time.perf_counter()
        durations.append((ctx._live is live, now - last))
        ctx._live = inert if ctx._live is live else live
        if standalone and step % 100 == 0:  # no agent drains this context's buffers
            ctx.drain_rows(), ctx.drain_phases()
        last = time.perf_counter()  # the drain is no step's
    ctx._live = live
    pairs = [
        (off, on) for (a, off), (b, on) in zip(durations[::2], durations[1::2]) if not a and b
    ][_workload.WARMUP_STEPS :]
    off_s = statistics.median(p[0] for p in pairs)
    cost_s = statistics.median(on - off for off, on in pairs)
    return {
        "off_s": off_s,
        "on_s": statistics.median(p[1] for p in pairs),
        "cost_s": cost_s,
        "ratio": off_s / (off_s + cost_s),
    }  # steps/s with the hooks / without


def show_alternate(title: str, unit: str, timings: dict[str, Any]) -> None:
    """Print what :func:`alternate` measured."""
    print(f"  {title}, hooks on and off at alternate steps of one {unit}:")
    print(
        f"    step time off / on                    {1e3 * timings['off_s']:9.3f} / "
        f"{1e3 * timings['on_s']:.3f} ms"
    )
    print(
        f"    ratio (median paired difference)      {timings['ratio']:9.4f}   "
        f"({1e6 * timings['cost_s']:+.2f} us per step)"
    )


def in_process(steps: int) -> dict[str, Any]:
    """:func:`alternate` under a one-rank TrainContext in this process: the rank-side cost
    alone, free of the scheduler's and the other rank's noise."""
    import torch

    from clustersdk.runtime.context import TrainContext

    ctx = TrainContext(
        job="bench",
        name="bench",
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        strategy="ddp",
    )
    return alternate(ctx, steps, standalone=True)


def cluster_paired(cluster: Any, steps: int) -> dict[str, Any]:
    """:func:`alternate` as a 2-rank job of the cluster (rank 0's timings)."""
    cluster.client.run(set_hooks, True)
    job = cluster.launch(
        alternate, kwargs={"steps": steps}, world_size=2, name=f"live-paired-{time.time_ns()}"
    )
    return job.wait(timeout=900)


def hook_cost(calls: int = 200_000) -> float:
    """Seconds one look at the agreed words costs a rank (what each control check adds)."""
    import torch

    from clustersdk.protocol import no_words
    from clustersdk.runtime.context import TrainContext

    ctx = TrainContext(
        job="bench",
        name="bench",
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        strategy="ddp",
    )
    words, due = no_words(), ctx._live.due
    t0 = time.perf_counter()
    for _ in range(calls):
        due(words)
    return (time.perf_counter() - t0) / calls


def latencies(cluster: Any) -> dict[str, float]:
    """Seconds for one job.run and one job.update, on a running and on a paused job."""
    cluster.client.run(set_hooks, True)
    job = cluster.launch(
        _workload.train_clustersdk,
        kwargs={"steps": 1_000_000},
        world_size=2,
        name=f"live-latency-{time.time_ns()}",
    )
    while not any(r["step"] >= _workload.WARMUP_STEPS for r in job.history()[-4:]):
        time.sleep(0.05)
    out = {}
    for state in ("running", "paused"):
        if state == "paused":
            job.pause()
        t0 = time.perf_counter()
        job.run(lambda ctx: ctx.step)
        out[f"run_{state}_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        job.update(metrics_interval=0.2 if state == "running" else 0.25)
        out[f"update_{state}_s"] = time.perf_counter() - t0
    job.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import clustersdk as cs

    rates: dict[bool, list[float]] = {False: [], True: []}
    with (
        tempfile.TemporaryDirectory(prefix="clustersdk-bench-") as state,
        cs.Cluster.local(workers=2, state_dir=state) as cluster,
    ):
        cluster_round(cluster, True, _workload.WARMUP_STEPS + 20)  # warm both paths
        cluster_round(cluster, False, _workload.WARMUP_STEPS + 20)
        for i in range(args.repeats):
            for on in (False, True) if i % 2 == 0 else (True, False):
                rates[on].append(cluster_round(cluster, on, args.steps))
                print(
                    f"  round {i + 1} {'with' if on else 'without':>7} hooks: "
                    f"{rates[on][-1]:8.1f} steps/s",
                    flush=True,
                )
        together = cluster_paired(cluster, 4 * args.steps)
        lat = latencies(cluster)
    local = in_process(10 * args.steps)
    per_call = hook_cost()
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    paired = statistics.median(b / a for a, b in zip(rates[False], rates[True]))
    summary = {
        "steps_per_s_without": off,
        "steps_per_s_with": on,
        "ratio": on / off,
        "paired_ratio": paired,
        "in_process_ratio": local["ratio"],
        "cost_us_per_step": 1e6 * local["cost_s"],
        "cluster_paired_ratio": together["ratio"],
        "cluster_paired_cost_us_per_step": 1e6 * together["cost_s"],
        "hook_ns_per_check": 1e9 * per_call,
        "hook_share_of_a_step": per_call / local["off_s"],
        **lat,
        "rounds": {"without": rates[False], "with": rates[True]},
    }
    print(f"\n2 ranks, {args.steps} steps, {args.repeats} round(s), default launch options")
    print(f"  steps/s without the live hooks          {off:9.1f}")
    print(f"  steps/s with them (shipped)             {on:9.1f}")
    print(f"  ratio                                   {on / off:9.4f}   (target >= {TARGET_RATIO})")
    print(
        f"  median of each round's ratio            {paired:9.4f}   (rounds ran "
        f"{min(rates[False] + rates[True]):.0f}-{max(rates[False] + rates[True]):.0f} steps/s)"
    )
    show_alternate("on the cluster, 2 ranks", "job", together)
    show_alternate("in process, 1 rank", "loop", local)
    print(
        f"  the hook alone: {summary['hook_ns_per_check']:.0f} ns per control check (at most "
        f"one a step): {100 * summary['hook_share_of_a_step']:.4f}% of a step"
    )
    print("  one call, 2 ranks (to its answer):")
    for key in ("run_running_s", "run_paused_s", "update_running_s", "update_paused_s"):
        print(f"    {key.removesuffix('_s').replace('_', ' '):<36}{1e3 * lat[key]:9.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
