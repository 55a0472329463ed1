"""Scheduling decision time on a big shared cluster: 10,000 queued jobs, 1,000 nodes x 8 GPUs.

Mixed priorities (low/normal/high), five queues with guarantees and borrowing,
a per-user cap, time_limit estimates on half the jobs, checkpoints on most. It
times, as medians over repeats (a fresh, identical scheduler each repeat):

- full pass, empty cluster: the first decision for 10,000 queued jobs (it starts
  the ones that fill the cluster and plans the rest);
- full pass, from a whole state: 10,000 queued on a cluster that is already full,
  decided from scratch (``decide(state)``: indexes built too);
- full pass, kept scheduler: a whole ``Scheduler.decide()`` pass on that state;
- a timer tick: ``decide()`` again with nothing new;
- one arrival: ``submit`` + ``decide()``, jobs of every priority and size;
- one completion: ``released`` of a running job + ``decide()`` (its victims then
  leave, untimed, before the next event).

It also times a fixed Python loop before and after, and prints the load: figures
from a busy machine read slower than from an idle one.

Targets: a full pass under 1 s, one arrival or completion under 10 ms.

Then, live on ``Cluster.local(workers=4)`` (``--preemption N`` times, 0 to skip):
a low-priority 4-rank DDP job with a checkpoint_dir runs; a high-priority 2-rank
job arrives. It prints the time from the high job's launch to its first step
next to what it should take (one step of the low job + its checkpoint time,
measured in the same run by an explicit ``job.checkpoint()``), and the ratio.

    python benchmarks/scheduler.py                 # 5 repeats, 200 events each
    python benchmarks/scheduler.py --repeats 1 --events 20 --queued 2000 --nodes 200
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clustersdk.control.scheduling import (  # noqa: E402
    PolicyConfig,
    Request,
    Scheduler,
    Slot,
    decide,
)

TARGET_FULL_S = 1.0
TARGET_EVENT_S = 0.010
SIZES = [(1, 30), (2, 20), (4, 20), (8, 20), (16, 7), (32, 3)]
PRIORITIES = [(0, 30), (50, 50), (100, 20)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh schedulers timed (default 5)")
    parser.add_argument(
        "--events",
        type=int,
        default=200,
        help="arrivals and completions timed per repeat (default 200)",
    )
    parser.add_argument("--queued", type=int, default=10_000, help="queued jobs (default 10000)")
    parser.add_argument("--nodes", type=int, default=1_000, help="nodes of 8 GPUs (default 1000)")
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() once the cluster is built, as a long-lived scheduler "
        "process may do: a full collection then skips the jobs kept",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the medians here")
    parser.add_argument(
        "--preemption",
        type=int,
        default=3,
        help="live preemptions timed on a local 4-slot cluster (default 3)",
    )
    args = parser.parse_args(argv)
    if min(args.repeats, args.events, args.queued, args.nodes) < 1:
        parser.error("--repeats, --events, --queued and --nodes must be at least 1")
    return args


def cluster_config(total: int) -> PolicyConfig:
    share = total // 8
    return PolicyConfig.from_dict(
        {
            "queues": {
                "prod": {"guaranteed": 3 * share, "borrowing-limit": 2 * share},
                "research": {
                    "guaranteed": 2 * share,
                    "borrowing-limit": 3 * share,
                    "idle-timeout": 3600,
                },
                "dev": {"guaranteed": share, "borrowing-limit": share, "idle-timeout": 1800},
                "batch": {"guaranteed": 0},
            },
            "per-user-cap": max(64, total // 16),
        }
    )


def random_request(rng: random.Random, i: int, now: float) -> Request:
    size = rng.choices([s for s, _ in SIZES], [w for _, w in SIZES])[0]
    return Request(
        id=f"j{i}",
        world_size=size,
        owner=f"user{rng.randrange(200)}",
        queue=rng.choice(["prod", "research", "dev", "batch", "default"]),
        priority=rng.choices([p for p, _ in PRIORITIES], [w for _, w in PRIORITIES])[0],
        seq=i,
        submitted_at=now,
        preemptible=rng.random() < 0.9,
        min_world_size=max(1, size // 2) if size > 1 and rng.random() < 0.1 else None,
        time_limit=rng.uniform(600, 86_400) if rng.random() < 0.5 else None,
        has_checkpoint_dir=rng.random() < 0.7,
    )


def build(args: argparse.Namespace, seed: int) -> tuple[Scheduler, random.Random, int, float]:
    """A full cluster with ``args.queued`` jobs waiting, settled: the last decision had
    nothing to do (victims gone, preemptors started)."""
    rng = random.Random(seed)
    slots = cluster(args)
    s = Scheduler(cluster_config(len(slots)), slots)
    i = 0
    while True:  # fill the cluster: what starts runs, the rest stays queued
        for _ in range(max(64, len(slots) // 8)):
            s.submit(random_request(rng, i, 0.0))
            i += 1
        s.decide(0.0)
        free = len(slots) - sum(h.size for h in s.holdings.values())
        if len(s.queued) >= args.queued or free == 0:
            break
    while len(s.queued) < args.queued:
        s.submit(random_request(rng, i, 0.0))
        i += 1
    for h in s.holdings.values():  # running jobs have made progress and checkpoints
        h.last_progress = 50.0
        h.step = rng.randrange(1, 10_000)
        if h.request.has_checkpoint_dir:
            h.checkpoint_at, h.steps_since_checkpoint = rng.uniform(0, 50), rng.randrange(50)
            h.state_bytes = rng.randrange(10**8, 10**11)
    now = 60.0
    while settle(s, now):
        now += 1.0
    return s, rng, i, now


def cluster(args: argparse.Namespace) -> list[Slot]:
    return [
        Slot(f"tcp://n{n}:{9000 + g}", f"n{n:04d}", "cuda", g, f"GPU-{n}-{g}")
        for n in range(args.nodes)
        for g in range(8)
    ]


def fill(args: argparse.Namespace, seed: int) -> float:
    """The first decision for ``args.queued`` jobs on the empty cluster (most starts)."""
    rng = random.Random(seed)
    slots = cluster(args)
    s = Scheduler(cluster_config(len(slots)), slots)
    for i in range(args.queued):
        s.submit(random_request(rng, i, 0.0))
    return timed(lambda: s.decide(0.0))


def settle(s: Scheduler, now: float) -> bool:
    """Victims leave, then a decision; whether it had anything to do."""
    for victim in [h.id for h in s.holdings.values() if h.status in ("suspending", "stopping")]:
        s.released(victim, now)
    return bool(s.decide(now))


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_repeat(args: argparse.Namespace, seed: int) -> dict[str, list[float]]:
    s, rng, i, now = build(args, seed)
    state = s.state()
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    times: dict[str, list[float]] = {k: [] for k in LABELS}
    times["fill"].append(fill(args, seed))
    times["cold"].append(timed(lambda: decide(state, now)))
    s.configure(s.config)  # the same settings: forces a whole pass on the kept scheduler
    times["warm"].append(timed(lambda: s.decide(now)))
    times["tick"].append(timed(lambda: s.decide(now)))
    kept = 0
    for _ in range(args.events):
        now += 1.0
        job = rng.choice(sorted(s.holdings))
        times["completion"].append(
            timed(lambda job=job, now=now: (s.released(job, now, requeue=False), s.decide(now)))
        )
        now += 0.5
        settle(s, now)  # untimed: the victims it preempted leave
        for _ in range(2):
            now += 0.5
            req = random_request(rng, i, now)
            i += 1
            times["arrival"].append(timed(lambda req=req, now=now: (s.submit(req), s.decide(now))))
            kept += s.answered_by != "a whole pass"
    times["kept"] = [kept / (2 * args.events)]
    if args.gc_freeze:
        gc.unfreeze()
    return times


LABELS = {
    "fill": "full pass, empty cluster",
    "cold": "full pass, from a whole state",
    "warm": "full pass, kept scheduler",
    "tick": "timer tick, nothing new",
    "arrival": "one arrival",
    "completion": "one completion",
}
TARGETS = {
    "fill": TARGET_FULL_S,
    "cold": TARGET_FULL_S,
    "warm": TARGET_FULL_S,
    "tick": TARGET_EVENT_S,
    "arrival": TARGET_EVENT_S,
    "completion": TARGET_EVENT_S,
}


def reference_ms() -> float:
    """A fixed pure-Python workload (this machine's speed and load, to read the rest by)."""

    def work():
        total = 0
        for k in range(1_000_000):
            total += k
        return total

    return statistics.median(timed(work) for _ in range(3)) * 1e3


# --- live: a preemption on a local cluster -------------------------------------------------
def low_job(ctx, steps: int = 100_000, width: int = 256):
    """The victim: a DDP MLP with AdamW (a real state to save), a step every ~20 ms."""
    import torch

    net = ctx.prepare(
        torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
        )
    )
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    ctx.register(optimizer=opt)
    x, y = torch.randn(64, width), torch.randn(64, 1)
    for _step, _ in ctx.loop(None, steps=steps):
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.log(loss=loss)
        time.sleep(0.02)


def high_job(ctx, steps: int = 3):
    for step, _ in ctx.loop(None, steps=steps):
        ctx.log(value=float(step))
    return "done"


def first_row_time(job) -> float | None:
    rows = job.history()
    return min(r["time"] for r in rows) if rows else None


def preemption(repeats: int) -> dict[str, float]:
    """Median seconds: the high job's arrival to its first step, one low step, one save."""
    import tempfile

    import clustersdk as cs

    waits, steps, saves = [], [], []
    with (
        tempfile.TemporaryDirectory() as tmp,
        cs.Cluster.local(workers=4, state_dir=f"{tmp}/state") as c,
    ):
        for i in range(repeats):
            low = c.launch(
                low_job,
                world_size=4,
                name=f"low-{i}",
                priority="low",
                checkpoint_dir=f"{tmp}/ck-{i}",
            )
            deadline = time.monotonic() + 120
            while len(low.history()) < 40 and time.monotonic() < deadline:
                time.sleep(0.1)
            t0 = time.monotonic()
            low.checkpoint()
            saves.append(time.monotonic() - t0)
            times = sorted(r["time"] for r in low.history() if r["rank"] == 0)
            steps.append(statistics.median(b - a for a, b in zip(times, times[1:])))
            arrived = time.time()
            high = c.launch(high_job, world_size=2, name=f"high-{i}", priority="high")
            high.wait(timeout=120)
            waits.append(first_row_time(high) - arrived)
            low.stop()
        while any(s["job"] for s in c.slots()) and time.monotonic() < deadline + 60:
            time.sleep(0.1)  # every rank out before the cluster closes
    return {
        "arrival_to_first_step": statistics.median(waits),
        "low_step": statistics.median(steps),
        "checkpoint": statistics.median(saves),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    before = reference_ms()
    runs = [one_repeat(args, seed) for seed in range(args.repeats)]
    after = reference_ms()
    every = {k: [t for run in runs for t in run[k]] for k in LABELS}
    medians = {k: statistics.median(v) for k, v in every.items()}
    p90 = {k: statistics.quantiles(v, n=10)[-1] if len(v) > 1 else v[0] for k, v in every.items()}
    kept = statistics.median(run["kept"][0] for run in runs)
    print(
        f"{args.queued} queued jobs, {args.nodes} nodes x 8 GPUs, {args.repeats} repeat(s), "
        f"{args.events} completions and {2 * args.events} arrivals each"
        + (", gc.freeze() after building" if args.gc_freeze else "")
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"machine: {os.cpu_count()} CPUs, load {load:.1f}; a 1M-step Python loop took "
        f"{before:.0f} ms before and {after:.0f} ms after"
    )
    print(f"{'':32} {'median':>10} {'p90':>10} {'target':>10}  met")
    met = {}
    for k, label in LABELS.items():
        met[k] = medians[k] < TARGETS[k]
        print(
            f"{label:32} {medians[k] * 1e3:8.2f}ms {p90[k] * 1e3:8.2f}ms "
            f"{TARGETS[k] * 1e3:8.0f}ms  {'yes' if met[k] else 'NO'}"
        )
    print(f"arrivals answered on the kept pass: {kept:.0%} (the others took a whole pass)")
    live = preemption(args.preemption) if args.preemption > 0 else None
    if live is not None:
        bound = live["low_step"] + live["checkpoint"]
        print(
            f"preemption, live on 4 local CPU slots ({args.preemption} run(s), medians): a "
            f"high-priority 2-rank job's first step came {live['arrival_to_first_step']:.3f} s "
            f"after its launch; one step of the 4-rank victim {live['low_step']:.3f} s + its "
            f"checkpoint {live['checkpoint']:.3f} s = {bound:.3f} s; "
            f"ratio {live['arrival_to_first_step'] / bound:.2f}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "medians_s": medians,
                    "p90_s": p90,
                    "targets_met": met,
                    "kept_share": kept,
                    "reference_loop_ms": [before, after],
                    "preemption_s": live,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
