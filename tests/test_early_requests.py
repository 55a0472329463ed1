"""Requests asked before a job's first step, on a real three-worker LocalCluster: a pause,
checkpoint, suspend, stop, job.run or job.update of a STARTING job (right after launch,
as a notebook cell does) or of a QUEUED one (behind a job that fills the cluster) is
kept and taken at the job's first step boundary. The rules without a cluster:
``tests/control/test_lifecycle.py`` and ``tests/control/test_live.py``."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

import clustersdk as cs

from . import workloads
from .helpers import wait_for, wait_idle

S = cs.JobStatus
DELAY = 1.0  # seconds each rank's start is held back: the job stays STARTING that long


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three CPU slots: a two-rank job, and one slot short of a second."""
    c = cs.Cluster.local(workers=3, state_dir=str(tmp_path_factory.mktemp("state")))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def slow(idle):
    """The cluster, its workers starting each rank ``DELAY`` s late."""
    idle.client.run(workloads.slow_start, DELAY)
    try:
        yield idle
    finally:
        idle.client.run(workloads.slow_start, None)


@pytest.fixture
def full(idle):
    """The cluster with two of its three slots taken by a job that runs until stopped
    (``idle`` stops it after the test)."""
    filler = idle.launch(workloads.ticker, world_size=2, name="filler")
    wait_for(lambda: filler.status is S.RUNNING, timeout=60)
    return idle


def starting(cluster, fn=workloads.train_mlp, **options):
    job = cluster.launch(fn, world_size=2, **options)
    wait_for(lambda: job.status is S.STARTING, timeout=10)
    return job


def assert_reference(out: dict, steps: int, lr: float = 0.05) -> None:
    """Rank 0's parameters are those of the uninterrupted single-process run."""
    reference = workloads.reference_mlp(world_size=2, steps=steps, lr=lr)
    for key, expected in reference.items():
        torch.testing.assert_close(out["params"][key], expected, rtol=0, atol=1e-6)


# --- a STARTING job -----------------------------------------------------------------------
def test_a_pause_at_launch_holds_every_rank_before_step_one_and_resume_lets_it_go(slow):
    job = starting(slow, kwargs={"steps": 10}, name="early-pause")
    assert job.pause(timeout=30) == 0  # the step every rank waits before
    assert job.status is S.PAUSED and not job.info()["pending"]
    time.sleep(0.3)
    assert job.history() == []  # no rank ran a step
    assert job.resume() is S.RUNNING
    assert_reference(job.wait(timeout=60), steps=10)  # as if it had never paused


def test_a_checkpoint_at_launch_is_taken_at_the_first_boundary(slow, tmp_path):
    job = starting(slow, kwargs={"steps": 5}, checkpoint_dir=str(tmp_path), name="early-ckpt")
    path = job.checkpoint(timeout=30)
    assert os.path.isdir(path) and job.info()["checkpoint_step"] == 0
    assert_reference(job.wait(timeout=60), steps=5)


def test_a_suspend_at_launch_checkpoints_before_step_one_and_gives_the_slots_back(slow, tmp_path):
    job = starting(slow, kwargs={"steps": 6}, checkpoint_dir=str(tmp_path), name="early-susp")
    assert os.path.isdir(job.suspend(timeout=30))
    record = job.info()
    assert (record["status"], record["checkpoint_step"]) == ("SUSPENDED", 0)
    assert job.history() == []
    wait_idle(slow)
    assert job.resume() in (S.QUEUED, S.STARTING)
    assert_reference(job.wait(timeout=60), steps=6)


def test_a_stop_at_launch_ends_the_job_before_its_first_step(slow):
    # its code after the loop reads the last step's loss: it must not run on no step
    job = starting(slow, workloads.final_loss, name="early-stop")
    assert job.stop(timeout=30) is S.STOPPED
    assert job.history() == [] and job.info()["error"] is None


def test_run_and_update_at_launch_happen_before_step_one(slow):
    job = starting(slow, kwargs={"steps": 8}, name="early-live")
    ran: list = []
    runner = threading.Thread(target=lambda: ran.append(job.run(lambda ctx: ctx.step, timeout=30)))
    runner.start()  # both asked while the job is STARTING
    assert job.update(lr=0.02, timeout=30) == 0
    runner.join()
    assert ran == [{0: 0, 1: 0}]
    assert_reference(job.wait(timeout=60), steps=8, lr=0.02)  # as if launched with lr=0.02


# --- a QUEUED job ---------------------------------------------------------------------------
def test_a_queued_jobs_pause_checkpoint_and_update_wait_for_its_first_step(full, tmp_path):
    job = full.launch(
        workloads.train_mlp,
        kwargs={"steps": 10},
        world_size=2,
        checkpoint_dir=str(tmp_path),
        name="queued",
    )
    assert job.status is S.QUEUED
    # each answers at once: waiting would hold the kernel until the cluster has room
    assert job.pause() is None and job.checkpoint() is None and job.update(lr=0.02) is None
    pending = job.info()["pending"]
    assert [p["op"] for p in pending] == ["pause", "checkpoint", "update"]
    assert pending[2]["changes"] == {"lr": 0.02} and job.status is S.QUEUED
    next(j for j in full.jobs() if j.name == "filler").stop(timeout=60)
    wait_for(lambda: job.status is S.PAUSED, timeout=60)  # held before its first step
    record = job.info()
    assert (record["paused_at"], record["checkpoint_step"], list(record["pending"])) == (0, 0, [])
    assert [(u["step"], u["changes"]["lr"][1]) for u in job.updates()] == [(0, 0.02)]
    assert job.history() == []
    job.resume()
    assert_reference(job.wait(timeout=60), steps=10, lr=0.02)


def test_a_queued_job_is_suspended_resumed_and_stopped_without_running(full, tmp_path):
    job = full.launch(workloads.train_mlp, world_size=2, checkpoint_dir=str(tmp_path))
    assert job.status is S.QUEUED
    assert job.suspend() is None  # nothing to save: held out of the queue
    assert job.status is S.SUSPENDED
    assert job.resume() is S.QUEUED
    assert job.stop() is S.STOPPED  # removed from the queue
    record = job.info()
    assert not record["ranks"] and record["started"] is None and job.history() == []


# --- what stays refused ---------------------------------------------------------------------
def test_a_finished_job_still_refuses_a_pause(idle):
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 2}, world_size=2, name="done")
    job.wait(timeout=60)
    with pytest.raises(cs.InvalidTransitionError, match="job 'done' is FINISHED; it cannot pause"):
        job.pause()
    with pytest.raises(cs.InvalidTransitionError, match="job 'done' is FINISHED; it cannot resume"):
        job.resume()
