"""Chaos soak: a checkpointed DDP job on a warm local cluster, under injected faults.

The soak (default) runs ``_chaos_workload.train`` on ``--world-size`` ranks of a
``--workers``-worker ``Cluster.local`` (one spare by default, so a lost worker is
replaced at once while the nanny brings it back) and, at steps a seeded RNG
picks, injects, one at a time and each after the cluster has healed from the
last (the job is paused while it heals, so that it still has steps to run):

* **kill**: SIGKILL of a rank's worker process: the job restarts (``max_restarts``)
  from its newest checkpoint;
* **stop**: SIGSTOP of a rank's worker for ``--stop-seconds`` (shorter than the
  job's ``hang_timeout``, policy ``on_hang="report"``), then SIGCONT: the job
  stalls and goes on, with no restart;
* **raise**: a rank raises once (the marker file of ``_chaos_workload``): the job
  FAILS with that rank's error (a rank's exception is a bug, never restarted),
  and the soak launches it again with ``resume="auto"``, as a user would.

* **fill**: the checkpoint disk (a ``--disk-mb`` tmpfs mounted for the soak, which
  needs root; without it, fills are left out and the output says so) is filled up
  until a checkpoint fails with "no space left", then freed: the job trains on
  meanwhile, keeps its previous checkpoint and commits the next one.

Then it checks that the job finished; that every step 0..end is in the history
exactly once per rank; that the final parameters and optimizer state are
bitwise equal to an uninterrupted run of the same job (computed first, in the
same run); that every restart event names the worker that was killed; that no
process beyond the workers and their nannies, no staging checkpoint directory,
no rank or extra thread and no extra listening port (compared with the workers
after one ordinary checkpointed job) is left; and prints recovery times
(failure -> first step logged after; for a fill: disk freed -> next checkpoint).

``--sigkill-runs N`` instead runs the job N times in a row, SIGKILLing one
rank's worker once per run (one kill per run, not N kills in one job).

    python benchmarks/chaos.py --minutes 10 --kills 12 --stops 4 --raises 2 --fills 3
    python benchmarks/chaos.py --sigkill-runs 20
    python benchmarks/chaos.py --steps 60 --kills 1 --stops 1 --raises 1 --fills 0 --json out.json
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")

import _chaos_checks as checks  # noqa: E402
import _chaos_workload as work  # noqa: E402
import _polling as polling  # noqa: E402
import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(work)  # Dask workers can't import benchmarks/
cloudpickle.register_pickle_by_value(checks)

GLOBAL_BATCH = 24
TARGET_RECOVERY_S = 3.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--world-size", type=int, default=3, help="ranks (default 3: one spare)")
    p.add_argument("--steps", type=int, default=300, help="steps of the job (default 300)")
    p.add_argument("--minutes", type=float, help="size the job to run about this long instead")
    p.add_argument("--delay", type=float, default=0.05, help="sleep per step, s (default 0.05)")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--stops", type=int, default=2)
    p.add_argument("--raises", type=int, default=1)
    p.add_argument("--fills", type=int, default=1, help="checkpoint disk full, then freed")
    p.add_argument("--disk-mb", type=int, default=32, help="size of the checkpoint tmpfs")
    p.add_argument("--stop-seconds", type=float, default=3.0)
    p.add_argument("--hang-timeout", type=float, default=30.0)
    p.add_argument("--sigkill-runs", type=int, default=0, help="N runs with one kill each")
    p.add_argument(
        "--torchrun-runs",
        type=int,
        default=3,
        help="with --sigkill-runs: torchrun --max-restarts runs killed alike (default 3)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    a = p.parse_args(argv)
    if not 1 <= a.world_size <= a.workers:
        p.error(f"--world-size must be between 1 and --workers ({a.workers}), got {a.world_size}")
    if GLOBAL_BATCH % a.world_size:
        p.error(f"--world-size must divide {GLOBAL_BATCH}, got {a.world_size}")
    if min(a.kills, a.stops, a.raises, a.fills, a.sigkill_runs) < 0:
        p.error("event counts must be 0 or more")
    if a.stop_seconds >= a.hang_timeout:
        p.error("--stop-seconds must be shorter than --hang-timeout (the job must not be HUNG)")
    return a


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 180.0) -> Any:
    return polling.wait_for(predicate, what, timeout)  # a soak's events take longer


def healed(cluster: Any, workers: int) -> None:
    wait_for(lambda: len(cluster.slots()) == workers, f"{workers} workers back", timeout=120)


def top_step(job: Any) -> int:
    return max((r["step"] for r in job.history()), default=-1)


def worker_of(job: Any, rank: int) -> str:
    return next(r["worker"] for r in job.info()["ranks"] if r["rank"] == rank)


def first_row_after(job: Any, t: float) -> float | None:
    return min((r["time"] for r in job.history() if r["time"] > t), default=None)


def launch(cluster: Any, args: argparse.Namespace, steps: int, root: str, **options: Any) -> Any:
    kwargs = {
        "steps": steps,
        "global_batch": GLOBAL_BATCH,
        "delay": args.delay,
        "raise_marker": root.rstrip("/") + "-raise.json",
    }
    return cluster.launch(
        work.train,
        kwargs=kwargs,
        world_size=args.world_size,
        timeout=30,
        checkpoint_dir=root,
        checkpoint_every=args.checkpoint_every,
        max_restarts=10**6,
        hang_timeout=args.hang_timeout,
        **options,
    )


def reference(
    cluster: Any, args: argparse.Namespace, steps: int, root: str | None = None
) -> dict[str, Any]:
    """The uninterrupted run (delay 0: the same numbers); with ``root``, checkpointed
    like the soak's job, so that the workers then hold what an ordinary job leaves."""
    kwargs = {"steps": steps, "global_batch": GLOBAL_BATCH}
    options = {"checkpoint_dir": root, "checkpoint_every": args.checkpoint_every} if root else {}
    return cluster.launch(work.train, kwargs=kwargs, world_size=args.world_size, **options).wait(
        timeout=900
    )


def size_steps(cluster: Any, args: argparse.Namespace) -> int:
    if args.minutes is None:
        return args.steps
    probe = cluster.launch(
        work.train,
        kwargs={"steps": 40, "delay": args.delay, "global_batch": GLOBAL_BATCH},
        world_size=args.world_size,
    )
    probe.wait(timeout=300)
    times = sorted(r["time"] for r in probe.history() if r["rank"] == 0)
    per_step = statistics.median(b - a for a, b in zip(times[10:], times[11:]))
    return max(40, int(args.minutes * 60 * 0.8 / per_step))  # room for the recoveries


# --- injections -----------------------------------------------------------------------------
def kill(cluster: Any, job: Any, rank: int) -> dict[str, Any]:
    worker = worker_of(job, rank)
    pid = cluster.client.run(os.getpid, workers=[worker])[worker]
    t = time.time()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: worker not in [s["worker"] for s in cluster.slots()], "worker removed")
    return {"kind": "kill", "rank": rank, "worker": worker, "time": t}


def stop(cluster: Any, job: Any, rank: int, seconds: float) -> dict[str, Any]:
    worker = worker_of(job, rank)
    pid = cluster.client.run(os.getpid, workers=[worker])[worker]
    t = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    return {"kind": "stop", "rank": rank, "worker": worker, "time": t, "cont": time.time()}


def make_raise(job: Any, rank: int, root: str) -> dict[str, Any]:
    marker = root.rstrip("/") + "-raise.json"
    with open(marker + ".part", "w") as f:
        json.dump({"rank": rank, "step": top_step(job) + 3}, f)
    os.replace(marker + ".part", marker)
    try:
        job.wait(timeout=180)
        return {"kind": "raise", "rank": rank, "time": None, "error": "the job did not fail"}
    except Exception as exc:  # JobFailedError: what we asked for
        failed = [e for e in job.events() if e["kind"] == "failed"]
        return {
            "kind": "raise",
            "rank": rank,
            "time": failed[-1]["time"] if failed else None,
            "error": str(exc).splitlines()[0][:200],
        }


def fill(job: Any, root: str) -> dict[str, Any]:
    """Fill the checkpoint disk until a checkpoint fails for want of space, then free
    it and wait for the next one to commit."""
    t = time.time()
    filler = os.path.join(os.path.dirname(root), "filler")
    with open(filler, "wb", buffering=0) as f:
        # megabytes, then pages: a small model's checkpoint fits in the last megabyte left
        for chunk in (1 << 20, 1 << 12):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
    wait_for(
        lambda: job.status.terminal or job.info()["checkpoint_error"],
        "a checkpoint failing for want of space",
    )
    failed = (
        job.info()["checkpoint_error"] or f"no checkpoint failed: the job ended {job.status.name}"
    )
    before = job.info()["checkpoint_step"]
    freed = time.time()
    os.remove(filler)
    wait_for(
        lambda: (
            job.status.terminal
            or (job.info()["checkpoint_step"] != before and not job.info()["checkpoint_error"])
        ),
        "the next checkpoint after the disk was freed",
    )
    committed = time.time()
    return {
        "kind": "fill",
        "time": t,
        "freed": freed,
        "committed": committed,
        "error": failed[:200],
    }


def mount_disk(path: str, megabytes: int) -> str | None:
    """A size-limited tmpfs at ``path`` (None and a note when it can't be: not root)."""
    os.makedirs(path, exist_ok=True)
    run = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", path],
        capture_output=True,
        text=True,
    )
    if run.returncode:
        print(
            f"disk-full injection: not covered ({run.stderr.strip() or 'mount failed'}; "
            "it needs root)"
        )
        return None
    return path


def footprint(cluster: Any) -> dict[str, Any]:
    return cluster.client.run(checks.worker_footprint)


def settled(problems: Callable[[], list[str]], seconds: float = 10.0) -> list[str]:
    """``problems()`` once it is empty, or as it still is after ``seconds``: a rank's thread
    ends a moment after the job does (its last report is on its way back), and that
    is not a leak; one still there seconds later is."""
    deadline = time.monotonic() + seconds
    while (found := problems()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return found


# --- the soak ----------------------------------------------------------------------------------
def soak(cluster: Any, args: argparse.Namespace, root: str, scratch: str) -> dict[str, Any]:
    rng = random.Random(args.seed)
    steps = size_steps(cluster, args)
    want = reference(cluster, args, steps, os.path.join(scratch, "reference"))
    baseline = footprint(cluster)
    kinds = (
        ["kill"] * args.kills
        + ["stop"] * args.stops
        + ["raise"] * args.raises
        + ["fill"] * args.fills
    )
    rng.shuffle(kinds)
    lo, hi = args.checkpoint_every + 2, max(args.checkpoint_every + 3, steps - 15)
    triggers = sorted(rng.randrange(lo, hi) for _ in kinds)
    pids = cluster.client.run(os.getpid)
    jobs = [launch(cluster, args, steps, root)]
    done: list[dict[str, Any]] = []
    for trigger, kind in zip(triggers, kinds):
        job = jobs[-1]
        wait_for(
            lambda job=job, trigger=trigger: (
                job.status.terminal or (job.status.name == "RUNNING" and top_step(job) >= trigger)
            ),
            f"step {trigger}",
            600,
        )
        if job.status.terminal or top_step(job) > steps - 8:
            print(f"  the job ended before the {kind} at step {trigger}: skipped")
            continue
        job.pause()  # while the nanny brings the last killed worker back: steps left to run
        healed(cluster, args.workers)
        job.resume()
        rank, at = rng.randrange(args.world_size), top_step(job)
        if kind == "kill":
            event = kill(cluster, job, rank)
        elif kind == "stop":
            event = stop(cluster, job, rank, args.stop_seconds)
        elif kind == "fill":
            event = fill(job, root)
        else:
            event = make_raise(job, rank, root)
            jobs.append(launch(cluster, args, steps, root, resume="auto"))
        event.update(job=len(jobs) - 1 if kind != "raise" else len(jobs) - 2, step=at)
        what = "" if kind == "fill" else f" rank {rank}"
        print(
            f"  {kind:5}{what} at step {event['step']}"
            + (f" ({event['worker']})" if "worker" in event else f": {event.get('error')}")
        )
        done.append(event)
    got = jobs[-1].wait(timeout=1800)
    healed(cluster, args.workers)
    return {
        "steps": steps,
        "got": got,
        "want": want,
        "jobs": jobs,
        "events": done,
        "pids_before": pids,
        "root": root,
        "footprint": baseline,
    }


def verdict(cluster: Any, args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    jobs, events = run["jobs"], run["events"]
    problems: dict[str, list[str]] = {}
    problems["finished"] = [] if jobs[-1].status.name == "FINISHED" else [jobs[-1].status.name]
    rows = checks.committed_rows([j.history() for j in jobs])
    problems["history"] = checks.history_problems(rows, args.world_size, run["steps"])
    problems["bitwise"] = checks.bitwise_problems(run["got"], run["want"])
    problems["reasons"] = []
    for index, job in enumerate(jobs):
        killed = [e["worker"] for e in events if e["kind"] == "kill" and e["job"] == index]
        problems["reasons"] += checks.reason_problems(job.events(), killed)
    for e in events:
        if e["kind"] == "raise" and f"rank {e['rank']}" not in e.get("error", ""):
            problems["reasons"].append(f"the failure does not name rank {e['rank']}: {e}")
    problems["processes"] = checks.leftover_processes(cluster.client.run(checks.cluster_processes))
    problems["dirs"] = checks.leftover_dirs(run["root"])
    problems["threads/ports"] = settled(
        lambda: checks.footprint_problems(run["footprint"], footprint(cluster))
    )
    recovery: dict[str, list[float]] = {"kill": [], "stop": [], "raise": [], "fill": []}
    for e in events:
        if e["kind"] == "fill":  # the disk freed -> the next checkpoint committed
            recovery["fill"].append(e["committed"] - e["freed"])
            continue
        after = jobs[e["job"] + 1] if e["kind"] == "raise" else jobs[e["job"]]
        start = e.get("cont") or e["time"]
        first = first_row_after(after, start) if start else None
        if first is not None:
            recovery[e["kind"]].append(first - start)
    return {"problems": problems, "recovery_s": recovery}


def sigkill_runs(cluster: Any, args: argparse.Namespace, base: str) -> dict[str, Any]:
    rng = random.Random(args.seed)
    steps = args.steps
    want = reference(cluster, args, steps)
    results = []
    for i in range(args.sigkill_runs):
        healed(cluster, args.workers)
        root = tempfile.mkdtemp(prefix=f"run{i}-", dir=base)
        job = launch(cluster, args, steps, root)
        trigger = rng.randrange(args.checkpoint_every + 2, steps - 10)
        wait_for(
            lambda job=job, trigger=trigger: (
                top_step(job) >= trigger and job.status.name == "RUNNING"
            ),
            "steps",
        )
        event = kill(cluster, job, rng.randrange(args.world_size))
        got = job.wait(timeout=600)
        first = first_row_after(job, event["time"])
        bad = (
            checks.bitwise_problems(got, want)
            + checks.reason_problems(job.events(), [event["worker"]])
            + checks.history_problems(job.history(), args.world_size, steps)
            + checks.leftover_dirs(root)
        )
        restart = next((e["time"] for e in job.events() if e["kind"] == "restarted"), None)
        results.append(
            {
                "ok": not bad,
                "problems": bad,
                "recovery_s": None if first is None else first - event["time"],
                "restart_event_s": None if restart is None else restart - event["time"],
            }
        )
        print(
            f"  run {i + 1:2}: kill of rank {event['rank']} at step {trigger}: "
            f"{'ok' if not bad else bad}; restart event after "
            f"{results[-1]['restart_event_s'] or float('nan'):.2f} s, first step after "
            f"{results[-1]['recovery_s'] or float('nan'):.2f} s"
        )
    healed(cluster, args.workers)
    return {
        "runs": results,
        "processes": checks.leftover_processes(cluster.client.run(checks.cluster_processes)),
    }


def torchrun_runs(args: argparse.Namespace, base: str) -> list[dict[str, Any]]:
    """The same workload, checkpoint interval and kill under ``torchrun --max-restarts 3``."""
    import _torchrun_chaos as tr

    rng = random.Random(args.seed + 1)
    out = []
    for i in range(args.torchrun_runs):
        trigger = rng.randrange(args.checkpoint_every + 2, args.steps - 10)
        r = tr.time_kill(
            base,
            args.world_size,
            args.steps,
            args.delay,
            args.checkpoint_every,
            trigger,
            victim=rng.randrange(args.world_size),
        )
        out.append(r)
        state = "finished" if r["finished"] else "HUNG" if r["hung"] else f"exit {r['rc']}"
        print(
            f"  torchrun run {i + 1}: kill at step {trigger}: {state}, first step after "
            f"{r['recovery_s'] or float('nan'):.2f} s"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import clustersdk as cs

    base = tempfile.mkdtemp(prefix="chaos-")
    try:
        return _run(cs, args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)  # checkpoints and state of every run


def _run(cs, args: argparse.Namespace, base: str) -> int:
    with cs.Cluster.local(workers=args.workers, state_dir=os.path.join(base, "state")) as cluster:
        if args.sigkill_runs:
            out = sigkill_runs(cluster, args, base)
            runs = out["runs"]
            ok = sum(r["ok"] for r in runs)
            times = [r["recovery_s"] for r in runs if r["recovery_s"] is not None]
            print(
                f"SIGKILL x{len(runs)}: {ok}/{len(runs)} bitwise equal with the killed worker "
                f"named and every step once; leftover processes: {out['processes'] or 'none'}"
            )
            print(
                f"failure -> first step after: {checks.summary(times)} "
                f"(target median <= {TARGET_RECOVERY_S} s: "
                f"{'MET' if times and statistics.median(times) <= TARGET_RECOVERY_S else 'NOT MET'})"
            )
            detect = [r["restart_event_s"] for r in runs if r["restart_event_s"] is not None]
            print(f"failure -> restart event (the lost worker named): {checks.summary(detect)}")
            theirs = torchrun_runs(args, base)
            t_times = [r["recovery_s"] for r in theirs if r["recovery_s"] is not None]
            print(
                f"torchrun --max-restarts 3: {sum(r['finished'] for r in theirs)}/{len(theirs)} "
                f"finished, {sum(r['hung'] for r in theirs)} hung; failure -> first step after: "
                f"{checks.summary(t_times)}"
            )
            if times and t_times:
                print(
                    f"ratio clustersdk/torchrun (median recovery): "
                    f"{statistics.median(times) / statistics.median(t_times):.3f}"
                )
            result = {
                "sigkill_runs": runs,
                "ok": ok,
                "processes": out["processes"],
                "torchrun_runs": theirs,
                "median_recovery_s": statistics.median(times) if times else None,
            }
            passed = ok == len(runs) and not out["processes"]
        else:
            print(f"soak: {args.world_size} ranks on {args.workers} workers, seed {args.seed}")
            disk = mount_disk(os.path.join(base, "disk"), args.disk_mb) if args.fills else None
            if disk is None:
                args.fills = 0
            try:
                run = soak(cluster, args, os.path.join(disk or base, "ckpt"), base)
                v = verdict(cluster, args, run)
            finally:
                if disk is not None:
                    subprocess.run(["umount", "-l", disk], check=False)
            for name, problems in v["problems"].items():
                print(f"{name:10} {'ok' if not problems else 'FAILED: ' + '; '.join(problems)}")
            for kind, seconds in v["recovery_s"].items():
                print(f"recovery after {kind:5}: {checks.summary(seconds)}")
            result = {"steps": run["steps"], "events": run["events"], **v}
            passed = not any(v["problems"].values())
    print("PASSED" if passed else "FAILED")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
