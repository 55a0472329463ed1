"""A Dask scheduler that dies and is started again at the same address, with the same
state directory: the queue comes back in its order, a suspended job resumes from its
checkpoint, an admin's scheduling settings are kept, and a job that was running when
the scheduler died is reported as such (not left RUNNING forever).

The scheduler and its workers are ``dask`` processes of their own, killed by process
group (SIGKILL for the scheduler: a crash, not a shutdown) and cleaned up always.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import clustersdk as cs

from . import workloads
from .helpers import free_port, step_reached, wait_for


class Processes:
    """``dask scheduler`` / ``dask worker`` processes, each in its own process group."""

    def __init__(self, home: Path):
        self.home, self.procs = home, []
        self.dask = str(Path(sys.executable).with_name("dask"))
        self.log = open(home / "dask.log", "a")

    def start(self, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [self.dask, *args],
            cwd=self.home,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for proc in reversed(self.procs):
            self.kill(proc, signal.SIGTERM)
        self.log.close()


@pytest.fixture
def dask_processes(tmp_path):
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.close()


def start_cluster(procs: Processes, address: str, port: int, workers: int = 2) -> tuple:
    scheduler = procs.start(
        "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"
    )
    nannies = [
        procs.start(
            "worker",
            address,
            "--nthreads",
            "1",
            "--host",
            "127.0.0.1",
            "--no-dashboard",
            "--name",
            f"w{i}",
        )
        for i in range(workers)
    ]
    from distributed import Client

    with Client(address, timeout=60) as client:
        client.wait_for_workers(workers, timeout=120)
    return scheduler, nannies


def test_a_restarted_scheduler_takes_over_the_queue_suspended_jobs_and_settings(
    dask_processes, tmp_path
):
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    state = str(tmp_path / "state")
    scheduler, nannies = start_cluster(dask_processes, address, port)
    first = cs.Cluster.connect(address, state_dir=state)
    try:
        suspended = first.launch(
            workloads.ticker,
            kwargs={"steps": 30, "sleep": 0.02},
            world_size=2,
            name="suspended",
            checkpoint_dir=str(tmp_path / "ck"),
        )
        wait_for(lambda: step_reached(suspended, 3), timeout=60)
        suspended.suspend()
        step = suspended.info()["checkpoint_step"]
        running = first.launch(workloads.spin, world_size=2, name="running")
        wait_for(lambda: running.status is cs.JobStatus.RUNNING, timeout=60)
        queued = [
            first.launch(
                workloads.count_to, kwargs={"steps": 3 + i}, world_size=1, name=f"queued-{i}"
            )
            for i in range(3)
        ]
        assert all(j.status is cs.JobStatus.QUEUED for j in queued)
        assert queued[0].pause() is None  # kept, journaled, for its first step
        first.configure_scheduling({"preemption-grace": 77})
        # the scheduler dies (and its workers with it)
        dask_processes.kill(scheduler)
        for nanny in nannies:
            dask_processes.kill(nanny)
    finally:
        first.close()

    start_cluster(dask_processes, address, port)
    second = cs.Cluster.connect(address, state_dir=state)
    try:
        # the queue, in its order: every queued job runs and returns what it returned before
        done = [cs.Job.attach(second, f"queued-{i}") for i in range(3)]
        # and the pause asked of one of them: held before its first step, then let go
        wait_for(lambda: done[0].status is cs.JobStatus.PAUSED, timeout=120)
        assert done[0].info()["paused_at"] == 0 and done[0].history() == []
        done[0].resume()
        assert [job.wait(timeout=120) for job in done] == ["done"] * 3
        # in their submission order (two start in one decision: their start times race)
        seqs = [job.info()["seq"] for job in done]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        # the suspended job resumes from its checkpoint
        again = cs.Job.attach(second, "suspended")
        assert again.status is cs.JobStatus.SUSPENDED
        again.resume()
        assert again.wait(timeout=120) == 30
        assert f"at step {step}" in again.logs(0)
        # the admin's settings stand
        assert second.configure_scheduling({})["preemption-grace"] == 77
        # the job the dead scheduler ran is over, saying why
        lost = cs.Job.attach(second, "running")
        assert lost.status is cs.JobStatus.FAILED
        assert (
            "the Dask scheduler stopped while the job was RUNNING"
            in lost.info()["error"]["message"]
        )
    finally:
        second.close()
