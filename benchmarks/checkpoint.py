"""Pause, checkpoint and resume costs of a 2-rank clustersdk job on a warm local cluster.

Each round measures, on the DDP MLP of ``_ckpt_workload.py`` (1 torch thread per rank):

* **pause**: ``job.pause()`` from request to every rank stopped, for steps of
  tens of ms and for fast steps of a few ms, against the step time read off
  rank 0's history;
* **blocked**: how long the loop stands still at a ``checkpoint_every``
  boundary (the interval ending there minus the median interval), async save
  against sync save of the same ~50 MB model with its AdamW state, and how much
  longer the step after the boundary takes (it runs beside an async save's writes);
* **throughput**: one checkpoint's bytes over the sync save's time, against a
  plain sequential write of as many bytes (8 MiB chunks, fsync) to fresh files
  in the same directory;
* **resume**: ``job.suspend()``, then ``job.resume()`` to the first step
  logged after it, at 2 ranks and at 1.

Rounds interleave the measurements so that machine noise hits all alike;
medians are printed with the targets.

    python benchmarks/checkpoint.py                               # 5 rounds
    python benchmarks/checkpoint.py --repeats 1 --model-mb 8 --json out.json   # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")

import _ckpt_workload as work  # noqa: E402
import cloudpickle  # noqa: E402
from _polling import wait_for  # noqa: E402

cloudpickle.register_pickle_by_value(work)  # Dask workers can't import benchmarks/

WORLD_SIZE = 2
PAUSE_WORKLOADS = {  # name -> model and batch; step times measured, not assumed
    "realistic (1024x3)": {"width": 1024, "depth": 3, "batch": 32},
    "fast (256x2)": {"width": 256, "depth": 2, "batch": 32},
}
PAUSES_PER_JOB = 3
PAUSE_WARMUP_STEPS = 30
EVERY = 10  # checkpoint_every in the blocked-time runs
SAVES = 3  # timed boundaries per run: steps EVERY, 2*EVERY, ..., SAVES*EVERY
WARMUP = 3  # first step intervals left out of the medians
CHUNK = 8 << 20  # plain-write chunk
TARGET_PAUSE_SLACK_S = 0.050  # pause latency <= 1 step + this
TARGET_BLOCKED_RATIO = 0.10  # async blocked time / sync blocked time
TARGET_THROUGHPUT_RATIO = 0.50  # save MB/s / plain sequential write MB/s
VERDICT = {True: "MET", False: "NOT MET"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    parser.add_argument(
        "--model-mb",
        type=float,
        default=50.0,
        help="parameters of the checkpointed model in MB (default 50)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if not 0.1 <= args.model_mb <= 400:
        parser.error(f"--model-mb must be between 0.1 and 400, got {args.model_mb}")
    return args


# --- helpers -----------------------------------------------------------------------------
@contextlib.contextmanager
def stopped_after(job: Any) -> Iterator[Any]:
    """The job, stopped on the way out however the measurement ended."""
    try:
        yield job
    finally:
        if not job.status.terminal:
            job.stop(timeout=120)


def rank0_steps(job: Any) -> dict[int, float]:
    return {r["step"]: r["time"] for r in job.history() if r["rank"] == 0}


# --- measurements ------------------------------------------------------------------------
def time_pauses(cluster: Any, workload: dict[str, int]) -> dict[str, Any]:
    job = cluster.launch(work.train, kwargs={**workload, "steps": 10**9}, world_size=WORLD_SIZE)
    with stopped_after(job):
        wait_for(lambda: max(rank0_steps(job), default=-1) >= PAUSE_WARMUP_STEPS, "warm-up steps")
        latencies = []
        for _ in range(PAUSES_PER_JOB):
            time.sleep(random.uniform(0.3, 0.6))  # a random phase against the step boundaries
            t0 = time.perf_counter()
            job.pause()
            latencies.append(time.perf_counter() - t0)
            job.resume()
        steps = rank0_steps(job)
    diffs = [steps[s + 1] - steps[s] for s in steps if s >= WARMUP and s + 1 in steps]
    return {"latencies_s": latencies, "step_s": statistics.median(diffs)}


def time_saves(cluster: Any, model: dict[str, int], is_async: bool, root: str) -> dict[str, Any]:
    """One run with a checkpoint every EVERY steps, none deleted; rank 0's loop times."""
    from clustersdk import checkpoint_files as ckpt

    directory = tempfile.mkdtemp(prefix="ckpt-", dir=root)
    job = cluster.launch(
        work.train,
        kwargs={**model, "steps": EVERY * (SAVES + 1)},
        world_size=WORLD_SIZE,
        checkpoint_dir=directory,
        checkpoint_every=EVERY,
        async_checkpoint=is_async,
        keep=SAVES + 1,
    )
    with stopped_after(job):
        out = job.wait(timeout=600)
    gaps = [0.0] + [b - a for a, b in zip(out["starts"], out["starts"][1:])]  # gaps[s] ends at s
    boundaries = [s for s in range(WARMUP, len(gaps)) if s % EVERY == 0]
    step = statistics.median(g for s, g in enumerate(gaps) if s >= WARMUP and s % EVERY)
    manifest = ckpt.read_manifest(ckpt.latest(directory))
    return {
        "dir": directory,
        "step_s": step,
        "gaps_s": gaps,
        "blocked_s": statistics.median(gaps[b] - step for b in boundaries),
        # the step after a boundary runs beside an async save's writes
        "next_step_extra_s": statistics.median(gaps[b + 1] - step for b in boundaries),
        "nbytes": sum(manifest["files"].values()),
    }


def time_plain_write(directory: str, nbytes: int, index: int) -> float:
    """One fresh file, kept until the round ends, as each checkpoint writes fresh files
    while the older ones are kept. (Rewriting one file deleted after each write measured
    the disk reusing the blocks it just freed: 60 ms for 151 MB here, after a first write
    of 344 ms, where fresh files take ~390 ms.)"""
    path = os.path.join(directory, f"plain-write-{index}.bin")
    chunk = memoryview(os.urandom(CHUNK))
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for left in range(nbytes, 0, -CHUNK):
            f.write(chunk[: min(left, CHUNK)])
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def time_resumes(cluster: Any, model: dict[str, int], root: str) -> dict[str, float]:
    """Suspend, then resume to the first step logged after, at 2 ranks and then at 1."""
    job = cluster.launch(
        work.train,
        kwargs={**model, "steps": 10**9},
        world_size=WORLD_SIZE,
        checkpoint_dir=tempfile.mkdtemp(prefix="resume-", dir=root),
        keep=1,
    )
    out = {}
    with stopped_after(job):
        wait_for(job.history, "logged step")
        for world_size in (WORLD_SIZE, 1):  # each suspend follows a step logged after resume
            job.suspend()
            t0 = time.time()
            job.resume(world_size=world_size)
            first = wait_for(
                lambda t0=t0: [r["time"] for r in job.history() if r["time"] > t0],
                "step after resume",
            )
            out[f"{WORLD_SIZE}->{world_size}"] = min(first) - t0
    return out


# --- rounds, medians, table ----------------------------------------------------------------
def run_round(cluster: Any, model: dict[str, int], root: str, i: int) -> dict[str, Any]:
    r: dict[str, Any] = {
        "pause": {name: time_pauses(cluster, w) for name, w in PAUSE_WORKLOADS.items()}
    }
    modes = (True, False) if i % 2 == 0 else (False, True)  # alternate which goes first
    for is_async in modes:
        r["async" if is_async else "sync"] = time_saves(cluster, model, is_async, root)
    sync = r["sync"]  # as many plain writes as timed saves, to its directory
    r["plain_write_s"] = statistics.median(
        time_plain_write(sync["dir"], sync["nbytes"], k) for k in range(SAVES)
    )  # removed with the dir
    for mode in ("async", "sync"):
        shutil.rmtree(r[mode].pop("dir"))
    r["resume"] = time_resumes(cluster, model, root)
    return r


def summary(r: dict[str, Any]) -> str:
    pauses = " ".join(
        f"{1e3 * statistics.median(p['latencies_s']):.0f}" for p in r["pause"].values()
    )
    resumes = " ".join(f"{s:.2f}" for s in r["resume"].values())
    return (
        f"pause {pauses} ms  blocked async {1e3 * r['async']['blocked_s']:.0f} ms, sync "
        f"{1e3 * r['sync']['blocked_s']:.0f} ms  resume {resumes} s"
    )


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    med = statistics.median
    pause = {}
    for name in PAUSE_WORKLOADS:
        latencies = [x for r in rounds for x in r["pause"][name]["latencies_s"]]
        pause[name] = {
            "latency_s": med(latencies),
            "max_s": max(latencies),
            "step_s": med([r["pause"][name]["step_s"] for r in rounds]),
        }
    saves = {
        mode: {
            key: med([r[mode][key] for r in rounds])
            for key in ("step_s", "blocked_s", "next_step_extra_s", "nbytes")
        }
        for mode in ("async", "sync")
    }
    return {
        "pause": pause,
        "saves": saves,
        "checkpoint_mb": saves["sync"]["nbytes"] / 1e6,
        "save_mb_s": med([r["sync"]["nbytes"] / r["sync"]["blocked_s"] / 1e6 for r in rounds]),
        "plain_mb_s": med([r["sync"]["nbytes"] / r["plain_write_s"] / 1e6 for r in rounds]),
        "resume_s": {k: med([r["resume"][k] for r in rounds]) for k in rounds[0]["resume"]},
    }


def render(m: dict[str, Any], model: dict[str, int]) -> str:
    lines = [
        f"{'pause latency':<22}{'step (ms)':>10}{'pause (ms)':>12}{'in steps':>10}"
        f"{'max (ms)':>10}{'1 step + 50 ms':>16}"
    ]
    for name, p in m["pause"].items():
        lines.append(
            f"{name:<22}{1e3 * p['step_s']:>10.1f}{1e3 * p['latency_s']:>12.1f}"
            f"{p['latency_s'] / p['step_s']:>10.1f}{1e3 * p['max_s']:>10.1f}"
            f"{1e3 * (p['step_s'] + TARGET_PAUSE_SLACK_S):>16.1f}"
        )
    params = work.param_bytes(model["width"], model["depth"]) / 1e6
    lines += [
        "",
        f"checkpoint of {m['checkpoint_mb']:.1f} MB ({params:.1f} MB of parameters + "
        f"AdamW state, {model['width']}x{model['depth']}), every {EVERY} steps",
        f"{'save':<22}{'step (ms)':>10}{'blocked/save (ms)':>19}{'next step + (ms)':>18}",
    ]
    for mode, s in m["saves"].items():
        lines.append(
            f"{mode:<22}{1e3 * s['step_s']:>10.1f}{1e3 * s['blocked_s']:>19.1f}"
            f"{1e3 * s['next_step_extra_s']:>18.1f}"
        )
    a, s = m["saves"]["async"], m["saves"]["sync"]
    both = (a["blocked_s"] + a["next_step_extra_s"]) / (s["blocked_s"] + s["next_step_extra_s"])
    lines += [
        f"{'async / sync':<22}{'':>10}{a['blocked_s'] / s['blocked_s']:>19.3f}"
        f"{both:>18.3f}  (blocked + next step)",
        "",
        f"{'save throughput':<22}{'MB/s':>10}{'ratio':>12}",
        f"{'sync save':<22}{m['save_mb_s']:>10.0f}{m['save_mb_s'] / m['plain_mb_s']:>12.2f}",
        f"{'plain write + fsync':<22}{m['plain_mb_s']:>10.0f}{1:>12.2f}",
        "",
        f"{'resume to first step':<22}{'(s)':>10}",
    ]
    for key, seconds in m["resume_s"].items():
        lines.append(f"{'ranks ' + key.replace('->', ' -> '):<22}{seconds:>10.3f}")
    return "\n".join(lines)


def check_targets(m: dict[str, Any]) -> dict[str, bool]:
    met = {}

    def target(key: str, what: str, value: str, ok: bool) -> None:
        met[key] = ok
        print(f"target: {what}: {value} -> {VERDICT[ok]}")

    for name, p in m["pause"].items():
        limit = p["step_s"] + TARGET_PAUSE_SLACK_S
        target(
            f"pause {name}",
            f"pause latency <= 1 step + {1e3 * TARGET_PAUSE_SLACK_S:.0f} ms, {name}",
            f"{1e3 * p['latency_s']:.1f} ms vs {1e3 * limit:.1f} ms",
            p["latency_s"] <= limit,
        )
    ratio = m["saves"]["async"]["blocked_s"] / m["saves"]["sync"]["blocked_s"]
    target(
        "blocked",
        f"loop blocked by an async save <= {TARGET_BLOCKED_RATIO:.0%} of a sync save",
        f"{ratio:.1%}",
        ratio <= TARGET_BLOCKED_RATIO,
    )
    ratio = m["save_mb_s"] / m["plain_mb_s"]
    target(
        "throughput",
        f"save throughput >= {TARGET_THROUGHPUT_RATIO:.0%} of a plain sequential write",
        f"{ratio:.1%}",
        ratio >= TARGET_THROUGHPUT_RATIO,
    )
    return met


def main(argv: list[str] | None = None) -> None:
    import clustersdk as cs

    args = parse_args(argv)
    model = work.sized(args.model_mb)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        with cs.Cluster.local(workers=WORLD_SIZE, state_dir=os.path.join(tmp, "state")) as cluster:
            for i in range(args.repeats):
                rounds.append(run_round(cluster, model, tmp, i))
                print(
                    f"round {i + 1}/{args.repeats}: {summary(rounds[-1])}",
                    file=sys.stderr,
                    flush=True,
                )
    m = medians(rounds)
    print(f"\n{WORLD_SIZE} ranks, gloo on CPU, 1 torch thread per rank, median of {args.repeats}\n")
    print(render(m, model))
    print()
    met = check_targets(m)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "repeats": args.repeats,
                    "model": model,
                    "medians": m,
                    "runs": rounds,
                    "targets_met": met,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
