"""The control plane at 64 to 4,096 ranks: simulated ranks against the real scheduler.

A real Dask scheduler (its own process) runs the real clustersdk control plane;
this process is the kernel (``Cluster.connect``, ``cluster.launch``, a
subscribed job handle, ``job.pause()``...). The ranks are simulated by
``_scale_ranks.py`` processes, each hosting many fake workers that speak the
real worker-side protocol (``WorkerOp`` handlers of the real agent,
``Op.WORKER_READY``, ``Op.RANK_EVENT`` batches from the real agent's batching
and beacon code) with each training step replaced by a wait of ``--step``
seconds that logs a loss: see that module for what is real and what is not.

Per world size it measures, for one job of N ranks (``--job-size k``: N/k jobs
of k ranks instead):

- the scheduler process's CPU (fraction of one core, from its own CPU times)
  and its event loop's lag p99 (a 20 ms sleep's overrun) over ``--steady``
  seconds of steady state; its RSS;
- metric rows logged by the ranks against rows in the journal (none may be
  lost, each (rank, step) once), and the journal's growth per hour;
- launch to every rank started (the job's ``started`` time), ``job.pause()``
  fan-out (request to each rank holding the pause word: p50, p99) and to
  every rank paused, ``job.stop()`` to every rank out;
- the subscribed kernel's chart delay (row logged to row received) p95 and
  the bytes per second it receives;
- the latency of ``job.steps(last=1000)`` (``history_1000_s``: the last 1,000 steps as a
  chart or a user reads them, one row per step with each scalar's mean, min and max
  over the ranks), ``job.history(last_steps=1000, rank=0)`` (one rank's rows),
  ``job.history(last_steps=1000)`` (every rank's rows: N x 1,000 of them,
  ``history_1000_all_ranks_s``) and ``job.info()``. Before the steady state, the
  ranks run ``--history-steps`` fast steps, so that the journal holds that many
  steps, and the steady state starts once the journal holds all their rows.

The simulated ranks share this machine's cores with the scheduler: they run
256 to a process (``--procs`` to choose), and the scheduler's CPU is its own
process's. The load average is printed with the figures.

    python benchmarks/scale.py                      # 64, 256, 1024 and 4096 ranks
    python benchmarks/scale.py --ranks 1024 --json  # one size; JSON on the last line
    python benchmarks/scale.py --ranks 256 --steady 5 --history-steps 50   # CI's size
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "error")

import msgpack  # noqa: E402
import psutil  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZES = (64, 256, 1024, 4096)
# fake workers per _scale_ranks.py process: a real rank receives its control words on
# its own host; one process takes them one after another (at 1,024 in one process the
# pause fan-out p99 was the simulation's 0.37 s, in four 0.23 s, same scheduler CPU)
RANKS_PER_PROCESS = 256
KEYS = (
    "ranks",
    "scheduler_cpu",
    "loop_lag_p99_s",
    "rows_sent",
    "rows_journaled",
    "launch_all_started_s",
    "pause_fanout_p99_s",
    "stop_all_out_s",
    "chart_delay_p95_s",
    "history_1000_s",
    "scheduler_rss_mb",
)


def simulated(ctx: Any) -> None:
    """The job's function: never run (the simulated ranks step by themselves), only shipped."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ranks",
        type=int,
        action="append",
        help=f"world size to run (repeatable; default {', '.join(map(str, SIZES))})",
    )
    parser.add_argument(
        "--job-size",
        type=int,
        default=0,
        help="ranks per job: many small jobs instead of one (default: one job)",
    )
    parser.add_argument("--step", type=float, default=0.5, help="seconds per step (default 0.5)")
    parser.add_argument(
        "--steady", type=float, default=20.0, help="seconds of steady state measured (default 20)"
    )
    parser.add_argument(
        "--history-steps",
        type=int,
        default=1000,
        help="fast steps run first, so that the journal holds them (default 1000)",
    )
    parser.add_argument(
        "--fast-step",
        type=float,
        default=0.02,
        help="seconds per step of those first steps (default 0.02)",
    )
    parser.add_argument(
        "--metrics-interval",
        type=float,
        default=None,
        help="launch(metrics_interval=) (default: the control plane's default)",
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=0,
        help=f"simulated-rank processes (default: one per {RANKS_PER_PROCESS} ranks)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness of the simulated-rank processes (default 0: on a machine "
        "that others load, a lower priority starves them)",
    )
    parser.add_argument(
        "--profile",
        metavar="PATH",
        help="cProfile the scheduler during the steady state; stats to PATH.N",
    )
    parser.add_argument(
        "--profile-launch",
        metavar="PATH",
        help="cProfile the scheduler from launch to every rank started",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per world size on the last lines"
    )
    args = parser.parse_args(argv)
    args.ranks = args.ranks or list(SIZES)
    for n in args.ranks:
        if n < 1:
            parser.error(f"--ranks must be positive, got {n}")
        if args.job_size and n % args.job_size:
            parser.error(f"--job-size {args.job_size} does not divide --ranks {n}")
    if args.step <= 0 or args.steady <= 0:
        parser.error("--step and --steady must be positive")
    return args


# --- processes -----------------------------------------------------------------------------
def _env() -> dict[str, str]:
    env = dict(os.environ)
    path = [ROOT, os.path.join(ROOT, "extension")]
    env["PYTHONPATH"] = os.pathsep.join(
        path + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    return env


def _spawn(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, text=True, env=env, cwd=HERE
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("ready "):
        proc.kill()
        raise RuntimeError(f"{args[0]} did not start (it said {line!r})")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # never block its prints
    return proc, line.split()[1]


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- figures -------------------------------------------------------------------------------
def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Kernel:
    """What a subscribed notebook receives: chart delays and bytes."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.bytes = 0
        self.messages = 0
        self.lock = threading.Lock()
        self.counting = False

    def __call__(self, msg: dict[str, Any]) -> None:
        if not self.counting:
            return
        now = time.time()
        size = len(msgpack.packb(msg, default=str))
        with self.lock:
            self.bytes += size
            self.messages += 1
            if msg.get("kind") == "metrics":
                self.delays.extend(now - row["time"] for row in msg.get("rows") or ())
            elif msg.get("kind") == "steps":  # per-step bands: the oldest row each new point has
                self.delays.extend(now - point["oldest"] for point in msg.get("steps") or ())

    def take(self) -> tuple[list[float], int, int]:
        with self.lock:
            out = (self.delays, self.bytes, self.messages)
            self.delays, self.bytes, self.messages = [], 0, 0
        return out


def journal_counts(path: str, jobs: list[str], distinct: bool = True) -> tuple[int, int, int]:
    """Rows of ``jobs`` in the journal, distinct (job, rank, step) among them (0 unless
    ``distinct``), and its size."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)
    try:
        marks = ",".join("?" for _ in jobs)
        unique = "COUNT(DISTINCT job || ':' || rank || ':' || step)" if distinct else "0"
        rows, distinct_rows = db.execute(
            f"SELECT COUNT(*), {unique} FROM metrics WHERE job IN ({marks})", jobs
        ).fetchone()
        return int(rows), int(distinct_rows), journal_bytes(db)
    finally:
        db.close()


def journal_bytes(db: sqlite3.Connection) -> int:
    (pages,), (size,) = (
        db.execute("PRAGMA page_count").fetchone(),
        db.execute("PRAGMA page_size").fetchone(),
    )
    return int(pages) * int(size)


def journal_size(path: str) -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)
    try:
        return journal_bytes(db)
    finally:
        db.close()


def timed(fn: Any, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --- one world size --------------------------------------------------------------------------
def run_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    from distributed.core import rpc

    from clustersdk import Cluster
    from clustersdk.status import JobStatus

    tmp = tempfile.mkdtemp(prefix=f"scale{n}-")
    env = _env()
    procs: list[subprocess.Popen] = []
    hosts: list[Any] = []
    cluster = None
    try:
        sched, address = _spawn([os.path.join(HERE, "_scale_scheduler.py")], env)
        procs.append(sched)
        cluster = Cluster.connect(address, state_dir=tmp)
        sproc = psutil.Process(sched.pid)
        probe = rpc(address)
        count = args.procs or max(1, math.ceil(n / RANKS_PER_PROCESS))
        per = [n // count + (i < n % count) for i in range(count)]
        rank_env = dict(env, SCALE_FIRST_STEP="0", SCALE_NICE=str(args.nice))
        first = 0
        for k in per:
            proc, stats = _spawn(
                [
                    os.path.join(HERE, "_scale_ranks.py"),
                    address,
                    str(k),
                    str(first),
                    str(args.step),
                    str(args.history_steps),
                    str(args.fast_step),
                ],
                rank_env,
            )
            procs.append(proc)
            hosts.append(rpc(stats))
            first += k
        _wait(lambda: len(cluster.slots()) >= n, f"{n} slots", 120)

        def host_stats(reset: bool = False) -> list[dict[str, Any]]:
            return [cluster.sync(h.scale_stats, reset=reset) for h in hosts]

        # launch ---------------------------------------------------------------------
        size = args.job_size or n
        kernel = Kernel()
        options = (
            {} if args.metrics_interval is None else {"metrics_interval": args.metrics_interval}
        )
        if args.profile_launch:
            cluster.sync(probe.scale_profile, path=None)
        t0 = time.time()
        jobs = [
            cluster.launch(simulated, world_size=size, name=f"scale-{n}-{i}", **options)
            for i in range(n // size)
        ]
        watched = jobs[0]
        watched.on_event(kernel)
        _wait(lambda: _running(jobs), "every rank started", 600)
        launch_all_started = max(j.info()["started"] for j in jobs) - t0
        if args.profile_launch:
            cluster.sync(probe.scale_profile, path=f"{args.profile_launch}.{n}")

        # fast steps, so that history holds --history-steps steps --------------------------
        if args.history_steps:
            _wait(
                lambda: sum(s["logged_rows"] for s in host_stats()) >= n * args.history_steps,
                f"{args.history_steps} fast steps",
                1800,
            )
            # steady state begins once the journal holds every row logged so far: the
            # fast steps outrun what one process of simulated ranks ships, and their
            # backlog would count as chart delay and loop lag of the steady state
            logged = sum(s["logged_rows"] for s in host_stats())
            journal_path = os.path.join(tmp, "journal.sqlite")
            _wait(
                lambda: (
                    journal_counts(journal_path, [j.id for j in jobs], distinct=False)[0] >= logged
                ),
                "the fast steps' rows journaled",
                600,
            )
        time.sleep(max(3 * args.step, 2.0))

        # steady state ----------------------------------------------------------------
        if args.profile:
            cluster.sync(probe.scale_profile, path=None)
        cluster.sync(probe.scale_probe, reset=True)
        journal = os.path.join(tmp, "journal.sqlite")
        size0, cpu0 = journal_size(journal), sproc.cpu_times()
        rows0 = sum(s["logged_rows"] for s in host_stats(reset=True))
        kernel.take()
        kernel.counting = True
        w0 = time.monotonic()
        time.sleep(args.steady)
        wall = time.monotonic() - w0
        cpu1 = sproc.cpu_times()
        rss = sproc.memory_info().rss
        probed = cluster.sync(probe.scale_probe, reset=True)
        lags = probed["lags"]
        gc_figures = {
            k: probed[k] for k in ("gc_seconds", "gc_full", "gc_full_max_s", "gc_objects")
        }
        if os.environ.get("SCALE_SHOW_STUCK"):
            for where, count in probed["stuck"].items():
                print(f"loop stuck x{count} at:\n{where}", file=sys.stderr)
        kernel.counting = False
        delays, kbytes, kmessages = kernel.take()
        steady_hosts = host_stats()
        rows1 = sum(s["logged_rows"] for s in steady_hosts)
        host_lags = [x for s in steady_hosts for x in s["lags"]]
        size1 = journal_size(journal)
        if args.profile:
            cluster.sync(probe.scale_profile, path=f"{args.profile}.{n}")
        cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall
        load = os.getloadavg()
        intervals = sorted({i for s in host_stats() for i in s["intervals"]})

        # queries -------------------------------------------------------------------
        history_1000 = (
            timed(lambda: watched.steps(last=1000)) if hasattr(watched, "steps") else None
        )
        history_rank0 = (
            timed(lambda: watched.history(last_steps=1000, rank=0))
            if hasattr(watched, "steps")
            else None
        )
        history_all = (
            timed(lambda: watched.history(last_steps=1000), repeats=1)
            if hasattr(watched, "steps")
            else timed(lambda: watched.history(), repeats=1)
        )
        info = timed(lambda: watched.info())

        # pause, resume --------------------------------------------------------------
        host_stats(reset=True)
        t0 = time.time()
        _all(cluster, [j.id for j in jobs], "pause", timeout=300)
        pause_all = time.time() - t0
        stats = host_stats(reset=True)
        fanout = [t - t0 for s in stats for _, _, t in s["events"].get("pause", ())]
        paused = sum(len(s["events"].get("paused", ())) for s in stats)
        t0 = time.time()
        _all(cluster, [j.id for j in jobs], "resume")
        _wait(
            lambda: sum(len(s["events"].get("resume", ())) for s in host_stats()) >= n,
            "every rank resumed",
            120,
        )
        resume_fanout = [
            t - t0 for s in host_stats(reset=True) for _, _, t in s["events"].get("resume", ())
        ]
        time.sleep(2 * args.step)

        # stop -------------------------------------------------------------------------
        t0 = time.time()
        _all(cluster, [j.id for j in jobs], "stop")
        _wait(
            lambda: all(JobStatus[j.info()["status"]].terminal for j in jobs), "every rank out", 600
        )
        stop_all_out = max(j.info()["ended"] for j in jobs) - t0
        stats = host_stats()
        rows_sent = sum(s["logged_rows"] for s in stats)
        rows_journaled, distinct, _ = journal_counts(journal, [j.id for j in jobs])
        result = {
            "ranks": n,
            "jobs": len(jobs),
            "job_size": size,
            "step_s": args.step,
            "metrics_interval": intervals[-1] if intervals else None,
            "scheduler_cpu": round(cpu, 3),
            "loop_lag_p99_s": _round(quantile(lags, 0.99)),
            "loop_lag_max_s": _round(max(lags, default=None)),
            "loop_lag_p50_s": _round(quantile(lags, 0.5)),
            "ranks_loop_lag_p99_s": _round(quantile(host_lags, 0.99)),
            "rank_processes": len(hosts),
            **{k: _round(v) if isinstance(v, float) else v for k, v in gc_figures.items()},
            "rows_sent": rows_sent,
            "rows_journaled": rows_journaled,
            "rows_distinct": distinct,
            "rows_per_s": round((rows1 - rows0) / wall, 1),
            "journal_mb_per_hour": round((size1 - size0) / wall * 3600 / 1e6, 1),
            "launch_all_started_s": _round(launch_all_started),
            "pause_fanout_p50_s": _round(quantile(fanout, 0.5)),
            "pause_fanout_p99_s": _round(quantile(fanout, 0.99)),
            "pause_all_s": _round(pause_all),
            "paused_ranks": paused,
            "resume_fanout_p99_s": _round(quantile(resume_fanout, 0.99)),
            "stop_all_out_s": _round(stop_all_out),
            "chart_delay_p95_s": _round(quantile(delays, 0.95)),
            "kernel_bytes_per_s": round(kbytes / wall),
            "kernel_messages_per_s": round(kmessages / wall, 1),
            "history_1000_s": _round(history_1000),
            "history_1000_rank0_s": _round(history_rank0),
            "history_1000_all_ranks_s": _round(history_all),
            "info_s": _round(info),
            "scheduler_rss_mb": round(rss / 2**20, 1),
            "load_average": [round(x, 2) for x in load],
        }
        return result
    finally:
        if cluster is not None:
            cluster.close()
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def _all(cluster: Any, jobs: list[str], action: str, **kwargs: Any) -> None:
    """``action`` on every job at once (one job: just that one)."""
    import asyncio

    async def every() -> None:
        await asyncio.gather(*(getattr(cluster.control, action)(job, **kwargs) for job in jobs))

    cluster.sync(every)


def _running(jobs: list[Any]) -> bool:
    """Whether every job is RUNNING; a job that ended instead is an error, said at once."""
    from clustersdk.status import JobStatus

    infos = [j.info() for j in jobs]
    for info in infos:
        if JobStatus[info["status"]].terminal:
            raise RuntimeError(
                f"job {info['name']} ended {info['status']} before it ran: {info.get('error')}"
            )
    return all(info["status"] == "RUNNING" for info in infos)


def _wait(predicate: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(0.2)


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        ("ranks", "ranks"),
        ("jobs", "jobs"),
        ("metrics interval s", "metrics_interval"),
        ("scheduler CPU (cores)", "scheduler_cpu"),
        ("loop lag p99 s", "loop_lag_p99_s"),
        ("rows/s", "rows_per_s"),
        ("rows sent", "rows_sent"),
        ("rows journaled", "rows_journaled"),
        ("journal MB/hour", "journal_mb_per_hour"),
        ("launch -> all started s", "launch_all_started_s"),
        ("pause fan-out p50 s", "pause_fanout_p50_s"),
        ("pause fan-out p99 s", "pause_fanout_p99_s"),
        ("pause -> all paused s", "pause_all_s"),
        ("stop -> all out s", "stop_all_out_s"),
        ("chart delay p95 s", "chart_delay_p95_s"),
        ("kernel KB/s", "kernel_bytes_per_s"),
        ("steps(last=1000) s", "history_1000_s"),
        ("history(last_steps=1000, rank=0) s", "history_1000_rank0_s"),
        ("history(last_steps=1000) s", "history_1000_all_ranks_s"),
        ("info() s", "info_s"),
        ("scheduler RSS MB", "scheduler_rss_mb"),
        ("load average (1 min)", "load_average"),
    ]
    out = []
    for title, key in rows:
        cells = []
        for r in results:
            v = r.get(key)
            if key == "kernel_bytes_per_s" and v is not None:
                v = round(v / 1000, 1)
            if key == "load_average" and v:
                v = v[0]
            cells.append("-" if v is None else str(v))
        out.append(f"{title:<38}" + "".join(f"{c:>14}" for c in cells))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    for n in args.ranks:
        print(
            f"--- {n} simulated ranks"
            + (f" in jobs of {args.job_size}" if args.job_size else "")
            + f" (load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )
        results.append(run_size(n, args))
        lost = results[-1]["rows_sent"] - results[-1]["rows_journaled"]
        print(f"    rows lost: {lost}; scheduler CPU {results[-1]['scheduler_cpu']}", flush=True)
    print(table(results))
    if args.json:
        for r in results:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
