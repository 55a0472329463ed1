"""A standing cluster under the real Slurm of the bed (slurmbed.py): ``clustersdk cluster
up --slurm 2`` runs the scheduler here and keeps two worker jobs in Slurm's queue; a job
from another process runs on them; a worker job cancelled behind the cluster's back is
submitted again; ``down`` leaves ``squeue`` without any of the cluster's jobs and no
process of it behind."""

from __future__ import annotations

import functools
import json
import os
import signal

import psutil
import pytest

import clustersdk as cs
from clustersdk.standing.record import Paths, read_json

from .. import helpers as common
from .. import workloads
from ..helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NAME = "hpc"


cli = functools.partial(common.cli, timeout=240)  # a command on several hosts


def cluster_jobs(slurm) -> dict[str, tuple[str, str]]:
    """The cluster's jobs in Slurm's queue: name -> (id, state)."""
    out = slurm.sh("squeue", "-h", "-o", "%j %i %T").stdout.split("\n")
    rows = [line.split() for line in out if line.startswith(f"clustersdk-{NAME}-")]
    return {name: (job, state) for name, job, state in rows}


def supervisor(state: str) -> psutil.Process | None:
    found = read_json(Paths(state, NAME).host("localhost").pid_file)
    try:
        return psutil.Process(int(found["pid"])) if found else None
    except psutil.Error:
        return None


def test_up_under_slurm_runs_jobs_on_worker_jobs_and_down_empties_the_queue(slurm, tmp_path):
    state = str(tmp_path / "state")
    up = cli(state, "cluster", "up", NAME, "--slurm", "2", "--memory", "2GiB", "--json")
    boss = supervisor(state)
    pids = {boss.pid, *(p.pid for p in boss.children(recursive=True))} if boss else set()
    try:
        assert up.returncode == 0, up.stderr + slurm.logs()
        record = json.loads(up.stdout)
        assert record["kind"] == "slurm" and record["hosts"] == {"localhost": 0, "slurm": 2}
        jobs = cluster_jobs(slurm)
        assert sorted(jobs) == [f"clustersdk-{NAME}-w0", f"clustersdk-{NAME}-w1"], jobs
        assert all(s == "RUNNING" for _, s in jobs.values()), jobs
        # each job was given one of the bed's GPUs, and its worker owns it
        root = Paths(state, NAME).host("slurm-0").root
        with open(os.path.join(root, "job.sh")) as f:
            assert "#SBATCH --gres=gpu:1" in f.read()
        with cs.Cluster.connect(NAME, state_dir=state, timeout=30) as cluster:
            assert len(cluster.slots()) == 2
            job = cluster.launch(workloads.count_to, kwargs={"steps": 3}, world_size=2)
            assert job.wait(timeout=120) == "done"
            # a worker job cancelled behind the cluster's back: the keeper submits it again
            first, _ = jobs[f"clustersdk-{NAME}-w1"]
            slurm.sh("scancel", first)
            wait_for(
                lambda: (lambda j: j and j[0] != first and j[1] == "RUNNING")(
                    cluster_jobs(slurm).get(f"clustersdk-{NAME}-w1")
                ),
                timeout=60,
            )
            wait_for(lambda: len(cluster.slots()) == 2, timeout=60)
            again = cluster.launch(workloads.count_to, kwargs={"steps": 3}, world_size=2)
            assert again.wait(timeout=120) == "done"
        status = cli(state, "cluster", "status", NAME, "--json")
        assert status.returncode == 0, status.stderr
        seen = json.loads(status.stdout)
        workers = seen["hosts"]["slurm"]["processes"]
        assert set(workers) == {"worker-0", "worker-1"}, workers
        assert workers["worker-1"]["restarts"] >= 1 and workers["worker-1"]["job"] != first
        logs = cli(state, "cluster", "logs", NAME, "worker-1", "--host", "slurm")
        assert logs.returncode == 0 and logs.stdout, logs.stderr
        down = cli(state, "cluster", "down", NAME)
        assert down.returncode == 0, down.stderr
        assert cluster_jobs(slurm) == {}
        assert [p for p in pids if _alive(p)] == [] and of_cluster(state) == [], pids
        assert not os.path.exists(Paths(state, NAME).root)
    finally:
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        slurm.sh("scancel", "--full", "--user=root")


def of_cluster(state: str) -> list[str]:
    """Processes whose command line names the cluster's directories (the supervisors,
    the scheduler, the keeper, the worker jobs' supervisors and workers)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if state in line and _alive(p.pid):
            found.append(line)
    return found


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
