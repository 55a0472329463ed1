"""Steps lost to a preemption, with and without its notice, side by side in one run.

The same checkpointed 2-rank DDP job (``_chaos_workload.train``: bitwise
reproducible from any checkpoint) runs on a ``Cluster.local`` with a spare slot,
``--repeats`` times per way, and at step ``--at`` one of its workers is taken:

* **notice**: SIGTERM to the worker process, as a Kubernetes eviction, ``scancel``
  or a systemd stop sends it: clustersdk checkpoints the job at the next step
  boundary and moves it to the spare slot before the worker leaves;
* **no notice**: SIGKILL of the same worker, which is what a tool that does not act
  on the notice gets (torchrun's agent forwards the SIGTERM and its workers die):
  the job restarts from its newest periodic checkpoint (``--every`` steps).

For each run it reads the job's goodput (:attr:`clustersdk.Job.goodput`): the steps
lost, the seconds lost, and the goodput itself; every run must end bitwise equal to
an uninterrupted run of the same job (computed first). It prints the medians of both
ways and their ratio.

    python benchmarks/preemption.py                      # 3 runs each way
    python benchmarks/preemption.py --repeats 1 --steps 120 --every 50 --at 90 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")

import _chaos_checks as checks  # noqa: E402
import _chaos_workload as work  # noqa: E402
import cloudpickle  # noqa: E402

import clustersdk as cs  # noqa: E402

cloudpickle.register_pickle_by_value(work)  # Dask workers can't import benchmarks/

WAYS = {"notice": signal.SIGTERM, "no notice": signal.SIGKILL}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="runs per way")
    p.add_argument("--steps", type=int, default=200, help="steps of the job")
    p.add_argument("--every", type=int, default=50, help="steps between periodic checkpoints")
    p.add_argument("--at", type=int, default=140, help="the step at which the worker is taken")
    p.add_argument("--delay", type=float, default=0.02, help="seconds of sleep in each step")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if not 0 < args.at < args.steps:
        p.error("--at must be a step of the job (0 < at < steps)")
    return args


def step_of(job: cs.Job) -> int:
    return max((r["step"] for r in job.history(last_steps=1)), default=-1)


def one_run(cluster: cs.Cluster, args: argparse.Namespace, how: signal.Signals) -> dict[str, Any]:
    """Launch, take a worker at step ``--at``, wait; the job's goodput and end state."""
    with tempfile.TemporaryDirectory(prefix="clustersdk-preempt-") as root:
        job = cluster.launch(
            work.train,
            kwargs={"steps": args.steps, "delay": args.delay},
            world_size=2,
            checkpoint_dir=root,
            checkpoint_every=args.every,
            max_restarts=2,
        )
        deadline = time.monotonic() + 300
        while step_of(job) < args.at:
            if time.monotonic() > deadline or job.status.terminal:
                raise SystemExit(f"the job did not reach step {args.at}: {job.status}")
            time.sleep(0.01)
        worker = [s["worker"] for s in cluster.slots() if s["job"] == job.id][1]
        taken_at = step_of(job)
        pid = cluster.client.run(os.getpid, workers=[worker])[worker]
        os.kill(pid, how)
        state = job.wait(timeout=300)
        goodput = job.goodput
        restarts = job.restarts
    # the nanny starts the worker again: the next run finds every slot
    deadline = time.monotonic() + 60
    while len(cluster.slots()) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"state": state, "taken_at": taken_at, "goodput": goodput, "restarts": restarts}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    results: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    problems: list[str] = []
    with cs.Cluster.local(n_workers=3, dashboard=False) as cluster:
        want = cluster.launch(
            work.train, kwargs={"steps": args.steps, "delay": 0.0}, world_size=2
        ).wait(timeout=300)
        for i in range(args.repeats):
            for way, how in WAYS.items():
                run = one_run(cluster, args, how)
                problems += [
                    f"{way} run {i}: {p}" for p in checks.bitwise_problems(run.pop("state"), want)
                ]
                g = run["goodput"]
                print(
                    f"{way:>10} run {i}: taken at step {run['taken_at']}, "
                    f"lost {g['lost_steps']} steps ({g['seconds']['lost']:.2f} s), "
                    f"goodput {g['goodput']:.1%} of {g['wall']:.1f} s, restarts {run['restarts']}",
                    flush=True,
                )
                results[way].append(run)

    def median(way: str, pick) -> float:
        return statistics.median(pick(r["goodput"]) for r in results[way])

    summary = {
        way: {
            "lost_steps": median(way, lambda g: g["lost_steps"]),
            "lost_s": median(way, lambda g: g["seconds"]["lost"]),
            "goodput": median(way, lambda g: g["goodput"]),
            "wall_s": median(way, lambda g: g["wall"]),
        }
        for way in WAYS
    }
    print(
        f"\npreemption at step ~{args.at}, periodic checkpoints every {args.every} steps, "
        f"{args.repeats} run(s) each (medians)"
    )
    print(f"{'':>10}  {'lost steps':>10}  {'lost s':>7}  {'goodput':>8}  {'wall s':>7}")
    for way, s in summary.items():
        print(
            f"{way:>10}  {s['lost_steps']:>10.0f}  {s['lost_s']:>7.2f}  "
            f"{s['goodput']:>8.1%}  {s['wall_s']:>7.1f}"
        )
    saved = summary["no notice"]["lost_steps"] - summary["notice"]["lost_steps"]
    print(f"the notice saved {saved:.0f} steps of work per preemption")
    print("bitwise    " + ("ok" if not problems else "FAILED"))
    for p in problems:
        print("  " + p)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "medians": summary, "problems": problems}, f, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
