"""Cluster.slurm against a real slurmctld + slurmd + munged (slurmbed.py): workers are
Slurm jobs with a GPU each (--gres=gpu:1 on the bed's two fake GPUs)."""

from __future__ import annotations

import os

import pytest
import torch

import clustersdk as cs

from .. import workloads
from ..helpers import Statuses, assert_bitwise, step_reached, wait_for
from . import jobs

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster(slurm, tmp_path_factory):
    c = cs.Cluster.slurm(
        gpus_per_worker=1,
        maximum=3,
        memory="2GiB",
        idle_timeout=2,
        poll=0.3,
        log_directory=str(tmp_path_factory.mktemp("slurm-logs")),
        state_dir=str(tmp_path_factory.mktemp("slurm-state")),
    )
    try:
        yield c
    finally:
        c.close()


def running(slurm) -> list[str]:
    return [line for line in slurm.jobs() if " RUNNING " in f" {line} "]


def test_each_worker_job_asks_slurm_for_one_gpu(cluster):
    script = cluster.dask_cluster.job_script()
    assert "#SBATCH --gres=gpu:1" in script and "#SBATCH --cpus-per-task=1" in script
    assert cluster.slots() == []  # nothing is allocated before a launch asks for it


def test_a_slurm_cluster_is_tls_and_its_workers_read_a_private_directory(cluster):
    import stat

    assert cluster.scheduler_address.startswith("tls://")
    assert cluster.whoami()["role"] == "admin"
    script = cluster.dask_cluster.job_script()
    key = script.split("--tls-key ", 1)[1].split()[0]
    directory = os.path.dirname(key)
    assert f"--tls-cert {key}" in script and "--protocol tls://" in script
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    # what a worker job can read there: its own key, the CA certificate, the revocation list
    assert sorted(os.listdir(directory)) == ["ca.pem", "crl.pem", "worker.pem"]
    job = cluster.launch(workloads.count_to, kwargs={"steps": 3}, world_size=1)
    assert job.wait(timeout=180) == "done"
    assert all(s["worker"].startswith("tls://") for s in cluster.slots())


def test_a_two_rank_ddp_job_runs_on_two_slurm_allocations(cluster, slurm):
    job = cluster.launch(workloads.train_mlp, kwargs={"steps": 20}, world_size=2)
    wait_for(lambda: len(running(slurm)) == 2, timeout=120)  # squeue shows the allocation
    out = job.wait(timeout=180)
    reference = workloads.reference_mlp(2, steps=20)
    for key, value in reference.items():
        torch.testing.assert_close(out["params"][key], value, rtol=0, atol=1e-6)
    # Slurm gave each worker its own GPU of the node
    env = cluster.launch(jobs.slurm_env, world_size=2).wait(timeout=60)
    assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in env) == ["0", "1"]
    assert len({e["SLURM_JOB_ID"] for e in env}) == 2


def test_slurms_warning_before_the_walltime_moves_the_job_to_a_new_worker_job(
    cluster, slurm, tmp_path
):
    script = cluster.dask_cluster.job_script()
    assert "#SBATCH --signal=B:USR1@120" in script  # the batch shell alone: the worker (exec)
    assert "\nexec " in script
    kw = {"kind": "mlp", "steps": 20, "global_batch": 24}
    want = cluster.launch(workloads.train_exact, kwargs=kw, world_size=2).wait(timeout=180)
    job = cluster.launch(
        workloads.train_exact,
        kwargs={**kw, "delay": 0.3},
        world_size=2,
        checkpoint_dir=str(tmp_path),
    )
    seen = Statuses(job)
    wait_for(lambda: step_reached(job, 3), timeout=120)
    # the newest worker job's: dask-jobqueue names the next one as it was named (the case
    # where a forgotten job's name came back and no new job was submitted)
    names = {w: str(i["name"]) for w, i in cluster.client.scheduler_info()["workers"].items()}
    workers = [r["worker"] for r in job.info()["ranks"]]
    warned = max(workers, key=lambda w: int(names[w].rsplit("-", 1)[-1]))
    slurm_job = cluster.client.run(lambda: os.environ["SLURM_JOB_ID"], workers=[warned])[warned]
    # what Slurm sends 120 s before the walltime, sent now, by Slurm, to the same process
    sent = slurm.sh("scancel", "--batch", "--signal=USR1", slurm_job)
    assert sent.returncode == 0, sent.stderr

    got = job.wait(timeout=180)
    assert_bitwise(got, want, kw["steps"])
    assert seen.after("RUNNING")[:3] == ["RUNNING", "SUSPENDING", "QUEUED"]
    (moved,) = [e for e in job.events() if e["kind"] == "preempted"]
    assert "Slurm's warning that its walltime ends in 120 s" in moved["message"]
    assert job.restarts == 0 and job.goodput["lost_steps"] == 0
    assert warned not in {r["worker"] for r in job.info()["ranks"]}  # a new worker job's
    wait_for(lambda: not any(line.startswith(f"{slurm_job} ") for line in slurm.jobs()), 60)


def test_a_worker_slurm_cannot_place_keeps_the_job_queued_with_slurms_reason(cluster, slurm):
    job = cluster.launch(workloads.spin, world_size=3)  # the node has 2 GPUs: one job pends
    wait_for(lambda: "Resources" in job.reason, timeout=60)
    assert job.status is cs.JobStatus.QUEUED
    assert "Slurm has not started worker job(s)" in job.reason
    assert any(" PENDING Resources" in line for line in slurm.jobs())
    job.stop()
    # idle now: after idle_timeout the worker jobs are released
    wait_for(lambda: slurm.jobs() == [], timeout=60)
    wait_for(lambda: cluster.slots() == [], timeout=60)


def test_the_allocation_grows_again_and_close_leaves_nothing_in_squeue(cluster, slurm):
    job = cluster.launch(workloads.spin, world_size=1)
    wait_for(lambda: job.status is cs.JobStatus.RUNNING, timeout=120)
    assert len(running(slurm)) == 1
    job.stop()
    cluster.close()
    assert slurm.jobs() == []


def test_magic_cluster_slurm(slurm):
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "clustersdk")
    cluster = ip.run_line_magic("cluster", "slurm --gpus-per-worker 1 --partition debug")
    try:
        assert cluster.kind == "slurm" and cluster.slots() == []
        script = cluster.dask_cluster.job_script()
        assert "#SBATCH --gres=gpu:1" in script and "#SBATCH -p debug" in script
    finally:
        ip.run_line_magic("cluster", "close")
    assert "closed" in repr(cluster)
