"""A standing cluster under Slurm: its scheduler here, its workers as Slurm jobs.

``clustersdk cluster up team --slurm N`` runs the scheduler on the host that ran it
(a login or service node, under that host's supervisor as ``--local`` does) and keeps
``N`` Slurm jobs of workers running. One more process of that supervisor, the
*keeper* (``python -m clustersdk.standing.slurm keep ROOT``), submits them:

- each job (``clustersdk-team-w0``...) asks for ``gpus_per_job`` GPUs (``--gres``;
  0: a CPU job), CPUs, memory, a partition, an account and a time limit, and runs a
  supervisor of its own in the foreground over its plan: one worker per GPU the job
  was given (Slurm's ``CUDA_VISIBLE_DEVICES``), restarted if it dies;
- a job that ends (a time limit, a node lost, an admin's ``scancel``) is submitted again
  after a short wait; one that keeps ending soon after it started is given up on,
  saying so (:class:`~.supervisor.Restarts`, as for any supervised process);
- SIGTERM (``clustersdk cluster down``) cancels every job of the cluster and waits
  until ``squeue`` has none of them.

Each job's directory (``hosts/slurm-K/``: its plan, its TLS files, its logs) is under
the state directory, which the compute nodes must see (a shared home, as for
``checkpoint_dir``). What the keeper sees of each job is in ``run/slurm.json`` of the
scheduler host's directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from ..errors import SpecError, StartError
from ..protocol import ENV_RESTART
from .host import alive, tail_events
from .record import HostPaths, HostPlan, Paths, Process, read_json, write_json
from .supervisor import Restarts

POLL_S = 2.0  # how often the keeper reads squeue
QUICK_S = 60.0  # a job that ends sooner than this after it ran failed "as it started"
CANCEL_WAIT_S = 60.0  # what down waits for squeue to forget the cluster's jobs
DEFAULTS: dict[str, Any] = {  # what --slurm's job options are unless given
    "gpus_per_job": 1,
    "cpus_per_job": 1,
    "memory": None,
    "partition": None,
    "account": None,
    "walltime": None,
    "sbatch_options": [],
    "python": None,
}
LABEL = "slurm"  # the cluster's "host" of worker jobs, in its record and its status
# squeue's states of a job that is still the cluster's (COMPLETING: not yet gone)
QUEUED = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
)


def job_name(cluster: str, index: int) -> str:
    return f"clustersdk-{cluster}-w{index}"


def job_root(paths: Paths, index: int) -> str:
    return paths.host(f"slurm-{index}").root


# --- up: the plan -------------------------------------------------------------------------------
def check_options(options: dict[str, Any]) -> None:
    """Refuse what Slurm would: the counts must be whole numbers."""
    for key, low in (("jobs", 1), ("gpus_per_job", 0), ("cpus_per_job", 1)):
        value = options.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpecError(f"--slurm: {key.replace('_', '-')} must be an int of at least {low}")


def plan(
    paths: Paths,
    options: dict[str, Any],
    python: str,
    address: str,
    scheduler: Process,
    files: dict[str, bytes],
) -> dict[str, int]:
    """Write each worker job's directory (its plan, its TLS files, its job script) and the
    keeper's plan; the workers of each "host" (the record's ``hosts``)."""
    check_options(options)
    per_job = max(1, options["gpus_per_job"])
    workers = []
    for k in range(options["jobs"]):
        root = HostPaths(job_root(paths, k))
        for directory in (root.root, root.tls, root.logs, root.run):
            os.makedirs(directory, mode=0o700, exist_ok=True)
        for name, data in files.items():
            _write(os.path.join(root.tls, name), data)
        processes = [
            _worker(
                python,
                root.tls,
                address,
                f"{paths.name}-{k * per_job + i}",
                k * per_job + i,
                i if options["gpus_per_job"] else None,
                options.get("memory_limit"),
            )
            for i in range(per_job)
        ]
        plan = HostPlan(paths.name, processes, quick_s=QUICK_S)
        write_json(root.plan, plan.as_dict())
        script = os.path.join(root.root, "job.sh")
        _write(script, job_script(paths.name, k, root, python, options).encode(), mode=0o700)
        workers.append({"name": job_name(paths.name, k), "root": root.root, "script": script})
    here = paths.host("localhost")
    keeper = {
        "cluster": paths.name,
        "user": getpass.getuser(),
        "poll": float(options.get("poll") or POLL_S),
        "quick_s": QUICK_S,
        "workers": workers,
    }
    write_json(os.path.join(here.root, "slurm.json"), keeper)
    keep = Process("slurm-jobs", [python, "-m", "clustersdk.standing.slurm", "keep", here.root])
    write_json(here.plan, HostPlan(paths.name, [scheduler, keep]).as_dict())
    return {"localhost": 0, LABEL: options["jobs"] * per_job}


def _worker(
    python: str,
    tls: str,
    address: str,
    name: str,
    index: int,
    gpu: int | None,
    memory_limit: str | None,
) -> Process:
    argv = [python, "-m", "clustersdk.standing.serve", "worker", address, "--tls", tls]
    argv += ["--name", name]
    if gpu is not None:
        argv += ["--gpu", f"job:{gpu}"]  # the i-th of the GPUs Slurm gave the job
    if memory_limit:
        argv += ["--memory-limit", memory_limit]
    return Process(f"worker-{index}", argv)


def job_script(cluster: str, index: int, root: HostPaths, python: str, options: dict) -> str:
    """The batch script of worker job ``index``: its directives, then its supervisor."""
    directives = [
        f"--job-name={job_name(cluster, index)}",
        f"--output={root.logs}/slurm-%j.out",
        "--ntasks=1",
        f"--cpus-per-task={options['cpus_per_job']}",
    ]
    if options["gpus_per_job"]:
        directives.append(f"--gres=gpu:{options['gpus_per_job']}")
    for key, flag in (
        ("memory", "--mem"),
        ("partition", "--partition"),
        ("account", "--account"),
        ("walltime", "--time"),
    ):
        if options.get(key):
            directives.append(
                f"{flag}={_slurm_memory(options[key]) if key == 'memory' else options[key]}"
            )
    directives += list(options.get("sbatch_options") or [])
    lines = ["#!/bin/sh", *(f"#SBATCH {d}" for d in directives)]
    lines.append(
        f"exec {shlex.quote(python)} -m clustersdk.standing.supervisor {shlex.quote(root.root)}"
    )
    return "\n".join(lines) + "\n"


def test_submit(script: str) -> None:
    """``sbatch --test-only``: a partition, account or GRES Slurm does not have fails
    ``up`` at once, in sbatch's own words."""
    if shutil.which("sbatch") is None:
        raise StartError("--slurm: sbatch is not on the PATH (is this a Slurm login node?)")
    done = _slurm(["sbatch", "--test-only", script])
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise StartError(
            f"--slurm: Slurm refuses the worker job: {why[-1] if why else done.returncode}"
        )


def _slurm_memory(size: str) -> str:
    """'4GiB' -> '4G' (Slurm's units are powers of 1024 with one letter)."""
    text = str(size).strip().upper().replace(" ", "")
    for suffix in ("IB", "B"):
        if text.endswith(suffix) and len(text) > len(suffix) and text[-len(suffix) - 1].isalpha():
            return text[: -len(suffix)]
    return text


def _write(path: str, data: bytes, mode: int = 0o600) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# --- the keeper ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Job:
    """One worker job as the keeper keeps it."""

    name: str
    script: str
    restarts: Restarts
    id: str | None = None  # the job Slurm runs now (or last ran)
    state: str = "submitting"  # squeue's, or submitting, restarting, given up, cancelled
    reason: str = ""
    running_since: float | None = None
    submit_at: float | None = 0.0  # when to submit it (again); None: not to be submitted
    submits: int = 0
    last: str = ""


class Keeper:
    """Keeps a standing cluster's worker jobs in Slurm's queue until told to stop."""

    def __init__(self, root: str, plan: dict[str, Any]):
        self.paths = HostPaths(root)
        self.user = plan["user"]
        self.poll = float(plan.get("poll", POLL_S))
        self.quick_s = float(plan.get("quick_s", QUICK_S))
        self.jobs = [
            Job(w["name"], w["script"], Restarts(max_quick_failures=5, quick_s=self.quick_s))
            for w in plan["workers"]
        ]
        self.stopping = False
        self.status_file = os.path.join(self.paths.run, "slurm.json")

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._stop)
        self.say(f"keeping {len(self.jobs)} worker job(s) in Slurm's queue")
        try:
            while not self.stopping:
                self.tend(time.time())
                deadline = time.monotonic() + self.poll
                while not self.stopping and time.monotonic() < deadline:
                    time.sleep(0.1)
        finally:
            self.cancel()

    def _stop(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def tend(self, now: float) -> None:
        """One look at the queue: follow each job; submit those that are due."""
        queue = self.queue()
        if queue is None:
            return  # slurmctld does not answer: nothing is known, nothing is resubmitted
        for job in self.jobs:
            found = queue.get(job.name)
            if found is not None:
                job.id, job.state, job.reason = found
                if job.state == "RUNNING" and job.running_since is None:
                    job.running_since = now
                    self.say(f"{job.name}: job {job.id} runs")
                continue
            if job.id is not None and job.state in QUEUED:
                self._ended(job, now)
            if job.submit_at is not None and now >= job.submit_at and not self.stopping:
                self._submit(job)
        self._write_status()

    def _ended(self, job: Job, now: float) -> None:
        uptime = now - job.running_since if job.running_since is not None else 0.0
        job.last = (
            f"job {job.id} left the queue after {uptime:.0f} s running ({job.state} last seen)"
        )
        job.running_since = None
        wait = job.restarts.ended(uptime)
        if wait is None:
            job.state, job.submit_at = "given up", None
            self.say(
                f"{job.name}: given up: {job.last}; it ended {job.restarts.quick} times in a row, "
                f"each within {self.quick_s:.0f} s (its output: {os.path.dirname(job.script)}/logs)"
            )
            return
        job.state, job.submit_at = "restarting", now + wait
        self.say(f"{job.name}: {job.last}; submitted again in {wait:g} s")

    def _submit(self, job: Job) -> None:
        env = {k: v for k, v in os.environ.items() if k != ENV_RESTART}
        done = _slurm(["sbatch", "--parsable", job.script], env=env)
        job.submits += 1
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip()
            job.id, job.running_since = None, None
            job.last = f"sbatch failed: {why}"
            wait = job.restarts.ended(0.0)
            job.state, job.submit_at = (
                ("given up", None) if wait is None else ("restarting", time.time() + (wait or 0))
            )
            self.say(f"{job.name}: {job.last}")
            return
        job.id = done.stdout.strip().split(";")[0]
        job.state, job.submit_at, job.reason = "PENDING", None, ""
        self.say(f"{job.name}: submitted as job {job.id}")

    def queue(self) -> dict[str, tuple[str, str, str]] | None:
        """The cluster's jobs in Slurm's queue: name -> (id, state, reason)."""
        done = _slurm(["squeue", "-h", "-u", self.user, "-o", "%i|%j|%T|%r"])
        if done.returncode != 0:
            return None
        names = {job.name for job in self.jobs}
        out: dict[str, tuple[str, str, str]] = {}
        for line in done.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 4 and parts[1] in names and parts[2] in QUEUED:
                out[parts[1]] = (parts[0], parts[2], parts[3])
        return out

    def cancel(self) -> None:
        """Cancel every job of the cluster and wait until the queue has none of them."""
        cancel_jobs(self.user, [job.name for job in self.jobs])
        for job in self.jobs:
            job.state, job.submit_at = "cancelled", None
        self._write_status()
        self.say("every worker job cancelled")

    def say(self, text: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} slurm-jobs: {text}", flush=True)

    def _write_status(self) -> None:
        write_json(
            self.status_file,
            {
                "keeper": os.getpid(),
                "time": time.time(),
                "jobs": {
                    job.name: {
                        "id": job.id,
                        "state": job.state,
                        "reason": job.reason,
                        "submits": job.submits,
                        "restarts": job.restarts.count,
                        "last": job.last,
                    }
                    for job in self.jobs
                },
            },
        )


def cancel_jobs(user: str, names: list[str], wait: float = CANCEL_WAIT_S) -> list[str]:
    """``scancel`` the jobs named ``names`` of ``user``; those still queued after ``wait``."""
    if not names or shutil.which("scancel") is None:
        return []
    left = list(names)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        for name in left:
            _slurm(["scancel", "--user", user, "--name", name])
        done = _slurm(["squeue", "-h", "-u", user, "-o", "%j"])
        if done.returncode != 0:
            return left  # slurmctld does not answer: what it will do is unknown
        queued = set(done.stdout.split())
        left = [name for name in left if name in queued]
        if not left:
            return []
        time.sleep(0.5)
    return left


def _slurm(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, 1, "", str(e))


# --- status, logs, down: the worker jobs as one "host" ----------------------------------------
class SlurmJobs:
    """A standing cluster's worker jobs, as ``status``, ``logs`` and ``down`` see a host."""

    label = LABEL
    address = ""

    def __init__(self, paths: Paths, options: dict[str, Any]):
        self.paths, self.options = paths, options
        self.root = paths.host("localhost").root  # where the keeper keeps its plan and status

    def _keeper(self) -> dict[str, Any]:
        return read_json(os.path.join(self.root, "slurm.json")) or {"workers": []}

    def prepare(self, slots: int | None, listen: bool) -> dict[str, Any]:
        raise NotImplementedError("the worker jobs' directories are written by plan()")

    def put(self, name: str, data: bytes) -> None:
        raise NotImplementedError("the worker jobs' files are written by plan()")

    def start(self) -> dict[str, Any]:
        return {"pid": None}  # the keeper, on the scheduler's host, submits the jobs

    def stop(self, remove: bool) -> dict[str, Any]:
        """The jobs the keeper did not cancel (it was gone), cancelled; their directories."""
        plan = self._keeper()
        left = cancel_jobs(
            plan.get("user") or getpass.getuser(), [w["name"] for w in plan["workers"]]
        )
        if remove:
            for w in plan["workers"]:
                shutil.rmtree(w["root"], ignore_errors=True)
        return {"left": [f"Slurm job {name}" for name in left]}

    def state(self) -> dict[str, Any]:
        """Each worker as its job's supervisor says, with its job's state in Slurm."""
        plan = self._keeper()
        seen = (read_json(os.path.join(self.root, "run", "slurm.json")) or {}).get("jobs", {})
        # what a job's own supervisor wrote is news only while the job runs
        processes: dict[str, Any] = {}
        events: list[dict[str, Any]] = []
        for w in plan["workers"]:
            job = seen.get(w["name"], {})
            paths = HostPaths(w["root"])
            inside = (read_json(paths.status) or {}).get("processes", {})
            names = [p["name"] for p in (read_json(paths.plan) or {}).get("processes", [])]
            for name in names:
                process = dict(inside.get(name) or {})
                if job.get("state") != "RUNNING" or not process:
                    process["state"] = _job_state(job)
                else:
                    process["state"] = f"{process.get('state')} in job {job.get('id')}"
                process.update(
                    job=job.get("id"), job_state=job.get("state"), job_reason=job.get("reason")
                )
                process["restarts"] = int(process.get("restarts") or 0) + int(
                    job.get("restarts") or 0
                )
                if job.get("last") and not process.get("last"):
                    process["last"] = job["last"]
                processes[name] = process
            events += tail_events(paths, 5)
        keeper = (read_json(os.path.join(self.root, "run", "slurm.json")) or {}).get("keeper")
        return {
            "supervisor": keeper if keeper and alive(int(keeper)) else None,  # the keeper
            "processes": processes,
            "events": events[-20:],
        }

    def read(self, name: str) -> str:
        """``logs/worker-K.log`` of the job that runs worker K."""
        for w in self._keeper()["workers"]:
            path = os.path.join(w["root"], name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    return f.read()
        raise FileNotFoundError(name)

    def close(self) -> None:
        pass


def _job_state(job: dict[str, Any]) -> str:
    state = job.get("state") or "submitting"
    if state in ("given up", "restarting", "cancelled", "submitting"):
        return state
    return (
        "running" if state == "RUNNING" else f"queued ({state.lower()}: {job.get('reason') or '-'})"
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "keep":
        raise SystemExit("usage: python -m clustersdk.standing.slurm keep HOST_ROOT")
    root = os.path.abspath(args[1])
    plan = read_json(os.path.join(root, "slurm.json"))
    if plan is None:
        raise SystemExit(f"no Slurm plan at {root}/slurm.json")
    Keeper(root, plan).run()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
