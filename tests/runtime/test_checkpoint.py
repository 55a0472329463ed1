"""Pause, checkpoint, suspend and resume on a real two-worker LocalCluster."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time

import pytest

import clustersdk as cs
from clustersdk import checkpoint_files as ckpt

from .. import workloads
from ..helpers import assert_same_run, losses, step_reached, wait_for


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory):
    job = cluster.launch(
        workloads.train_ckpt,
        kwargs={"steps": 60},
        world_size=2,
        checkpoint_dir=str(tmp_path_factory.mktemp("plain")),
    )
    return job.wait(timeout=120), losses(job)


def test_pause_and_suspend_resume_equal_the_uninterrupted_run_bitwise(
    idle, uninterrupted, tmp_path
):
    reference, reference_losses = uninterrupted
    rng = random.Random()
    pause_at, suspend_at = rng.randint(5, 20), rng.randint(30, 45)
    job = idle.launch(
        workloads.train_ckpt,
        kwargs={"steps": 60, "delay": 0.02},
        world_size=2,
        checkpoint_dir=str(tmp_path),
    )
    wait_for(lambda: step_reached(job, pause_at))
    paused_at = job.pause()
    assert job.status is cs.JobStatus.PAUSED
    last_step = lambda: max(r["step"] for r in job.history())  # noqa: E731
    wait_for(lambda: last_step() == paused_at - 1)
    time.sleep(0.3)
    assert last_step() == paused_at - 1  # and nobody runs ahead
    with pytest.raises(cs.InvalidTransitionError, match="is PAUSED"):
        job.pause()
    assert job.resume() is cs.JobStatus.RUNNING
    wait_for(lambda: step_reached(job, suspend_at))
    path = job.suspend()
    assert job.status is cs.JobStatus.SUSPENDED
    assert os.path.basename(path).startswith("step-") and ckpt.is_intact(path)
    assert [s["job"] for s in idle.slots()] == [None, None]  # the slots were given back
    job.resume()
    out = job.wait(timeout=120)
    assert_same_run(out, reference, exact=True)
    assert losses(job) == reference_losses


def test_async_checkpoints_hold_their_step_while_the_next_steps_run(idle, tmp_path):
    """An async save copies the tensors while the next step computes; the optimizer's
    step waits for the copy. Every checkpoint taken so, resumed, ends bitwise equal."""
    # the copy starts 50 ms late: an optimizer step that did not wait for it would
    # change the tensors before they are copied
    kwargs = {"steps": 40}
    reference = idle.launch(workloads.train_ckpt, kwargs=kwargs, world_size=2).wait(timeout=120)
    root = str(tmp_path / "a")
    idle.launch(
        workloads.prepared,
        args=((workloads.slow_staging, (0.05,)), workloads.train_ckpt),
        kwargs=kwargs,
        world_size=2,
        checkpoint_dir=root,
        checkpoint_every=3,
        keep=20,
    ).wait(timeout=120)
    saved = dict(ckpt.committed(root))
    assert sorted(saved) == list(range(3, 40, 3))
    for step in (9, 27):
        job = idle.launch(
            workloads.train_ckpt,
            kwargs=kwargs,
            world_size=2,
            checkpoint_dir=str(tmp_path / f"from-{step}"),
            resume=saved[step],
        )
        assert_same_run(job.wait(timeout=120), reference, exact=True)


def test_resume_at_another_world_size_keeps_the_run(idle, tmp_path):
    kwargs = {"steps": 48, "delay": 0.02, "dropout": 0.0}
    plain = idle.launch(workloads.train_ckpt, kwargs={**kwargs, "delay": 0}, world_size=2).wait(
        timeout=120
    )
    job = idle.launch(
        workloads.train_ckpt, kwargs=kwargs, world_size=2, checkpoint_dir=str(tmp_path)
    )
    wait_for(lambda: step_reached(job, 10))
    job.suspend()
    job.resume(world_size=1)
    wait_for(lambda: job.status is cs.JobStatus.RUNNING and step_reached(job, 30))
    first = job.suspend()
    job.resume(world_size=2)
    out = job.wait(timeout=120)
    assert ckpt.read_manifest(first)["world_size"] == 1
    assert_same_run(out, plain, exact=False)


def test_checkpoint_on_request_and_every_n_steps_keeps_the_last_k(idle, tmp_path):
    job = idle.launch(
        workloads.train_ckpt,
        kwargs={"steps": 40, "delay": 0.01},
        world_size=2,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=5,
        keep=2,
    )
    wait_for(lambda: step_reached(job, 12))
    path = job.checkpoint()
    assert ckpt.is_intact(path)
    job.wait(timeout=120)
    kept = [step for step, _ in ckpt.committed(str(tmp_path))]
    assert kept == [35, 40]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(ckpt.TMP_PREFIX)]
    assert job.info()["checkpoint"] == ckpt.step_dir(str(tmp_path), 40)


def test_resume_auto_continues_from_the_newest_checkpoint(idle, uninterrupted, tmp_path):
    reference, _ = uninterrupted
    job = idle.launch(
        workloads.train_ckpt,
        kwargs={"steps": 60, "delay": 0.02},
        world_size=2,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=10,
    )
    wait_for(lambda: ckpt.latest(str(tmp_path)) is not None)
    job.stop()
    again = idle.launch(
        workloads.train_ckpt,
        kwargs={"steps": 60},
        world_size=2,
        checkpoint_dir=str(tmp_path),
        resume="auto",
    )
    assert_same_run(again.wait(timeout=120), reference, exact=True)
    assert "resumed from" in again.logs(0)


@pytest.mark.parametrize("point", workloads.FAULT_POINTS)
def test_a_rank_killed_while_saving_leaves_the_previous_checkpoint_intact(idle, tmp_path, point):
    before = {s["worker"] for s in idle.slots()}
    job = idle.launch(
        workloads.prepared,
        # each rank's process is SIGKILLed when its second save reaches `point`
        args=((workloads.inject_fault, (point, 2)), workloads.train_ckpt),
        kwargs={"steps": 30, "delay": 0.01},
        world_size=2,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=5,
        async_checkpoint=False,
        timeout=10,
    )
    with pytest.raises(cs.JobFailedError, match="died of SIGKILL"):
        job.wait(timeout=120)
    assert {s["worker"] for s in idle.slots()} == before  # the ranks went, the workers stayed
    newest = ckpt.latest(str(tmp_path))
    expected_step = 10 if point == "committed" else 5
    assert newest == ckpt.step_dir(str(tmp_path), expected_step)
    # what the surviving checkpoint holds is exactly what a clean run saved at that step
    clean = tmp_path / "clean"
    idle.launch(
        workloads.train_ckpt,
        kwargs={"steps": expected_step},
        world_size=2,
        checkpoint_dir=str(clean),
        checkpoint_every=expected_step,
    ).wait(timeout=120)
    assert load_params(newest) == load_params(ckpt.latest(str(clean)))


def load_params(path: str) -> dict:
    import torch.distributed.checkpoint as dcp

    model = workloads.ckpt_model()
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=path, no_dist=True)  # in this process, without a group
    return {k: v.tolist() for k, v in state["model"].items()}


def test_full_disk_mid_run_keeps_training_and_the_previous_checkpoint(idle, tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)], check=True)
    try:
        job = idle.launch(
            workloads.train_ckpt,
            kwargs={"steps": 10_000, "delay": 0.005, "hidden": 1024},
            world_size=2,
            checkpoint_dir=str(mount),
            checkpoint_every=5,
            keep=3,
        )
        wait_for(lambda: job.info()["checkpoint_error"], timeout=60)
        assert "no space left" in job.info()["checkpoint_error"]
        assert job.status is cs.JobStatus.RUNNING
        with pytest.raises(cs.CheckpointError, match="no space left.*previous one is kept"):
            job.checkpoint()
        kept = ckpt.latest(str(mount))
        assert kept is not None and ckpt.is_intact(kept)
        job.stop()
        assert not [n for n in os.listdir(mount) if n.startswith(ckpt.TMP_PREFIX)]
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_prints_no_traceback_per_dcp_writer_thread():
    """The save fails as a whole with one line naming the full disk (the test above); DCP's
    extra writer threads would each print their ENOSPC traceback to the worker's stderr.
    In a process of its own, as a worker is (pytest hooks threads' exceptions itself)."""
    script = textwrap.dedent("""
        import errno, threading
        from clustersdk.runtime.checkpoint.storage import quiet_disk_full

        def _write_files_from_queue():  # named as DCP's writer threads are
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError:
                raise RuntimeError("unexpected pos") from None  # as DCP hides it

        def _other_thread():
            raise OSError(errno.ENOSPC, "No space left on device")

        quiet_disk_full()
        for target in (_write_files_from_queue, _other_thread):
            thread = threading.Thread(target=target)
            thread.start()
            thread.join()
        print("done")
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout == "done\n"
    assert "(_write_files_from_queue)" not in out.stderr and "unexpected pos" not in out.stderr
    assert "Exception in thread" in out.stderr and "(_other_thread)" in out.stderr  # as before


def test_unwritable_checkpoint_dir_fails_at_launch(idle, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    before = len(idle.jobs())
    with pytest.raises(cs.CheckpointError, match="is not writable"):
        idle.launch(workloads.train_ckpt, world_size=2, checkpoint_dir=str(blocker / "ckpt"))
    assert len(idle.jobs()) == before


def test_a_checkpoint_of_another_model_names_the_keys(idle, tmp_path):
    idle.launch(
        workloads.train_ckpt,
        kwargs={"steps": 5},
        world_size=2,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=5,
    ).wait(timeout=120)
    job = idle.launch(
        workloads.train_ckpt,
        kwargs={"steps": 10, "hidden": 32},
        world_size=2,
        checkpoint_dir=str(tmp_path),
        resume="auto",
    )
    with pytest.raises(cs.JobFailedError, match="raised CheckpointError") as info:
        job.wait(timeout=120)
    assert "does not match this job's model — shape mismatch" in info.value.message
    assert "model.0.weight: checkpoint (16, 8), model (32, 8)" in info.value.message


def test_actions_that_make_no_sense_name_the_state(idle, tmp_path):
    done = idle.launch(
        workloads.train_ckpt, kwargs={"steps": 2}, world_size=1, checkpoint_dir=str(tmp_path)
    )
    done.wait(timeout=60)
    for action in (done.pause, done.resume, done.suspend, done.checkpoint):
        with pytest.raises(cs.InvalidTransitionError, match="is FINISHED"):
            action()
    running = idle.launch(workloads.spin, world_size=1)
    wait_for(lambda: running.status is cs.JobStatus.RUNNING)
    with pytest.raises(cs.InvalidTransitionError, match="is RUNNING; only a PAUSED or SUSPENDED"):
        running.resume()
    with pytest.raises(cs.SpecError, match="has no checkpoint_dir"):
        running.suspend()
    running.stop()


def test_closing_the_cluster_keeps_a_suspended_job_resumable(tmp_path):
    ckpts = tmp_path / "ckpt"
    with cs.Cluster.local(workers=1, state_dir=str(tmp_path / "state")) as cluster:
        job = cluster.launch(
            workloads.train_ckpt,
            kwargs={"steps": 200, "delay": 0.01},
            world_size=1,
            checkpoint_dir=str(ckpts),
        )
        wait_for(lambda: step_reached(job, 3))
        path = job.suspend()
    with cs.Cluster.local(workers=1, state_dir=str(tmp_path / "state")) as cluster:
        again = cluster.launch(
            workloads.train_ckpt,
            kwargs={"steps": 200},
            world_size=1,
            checkpoint_dir=str(ckpts),
            resume="auto",
        )
        assert again.wait(timeout=120)["step"] == 200
        assert f"resumed from {path}" in again.logs(0)


def test_the_record_knows_the_loop_length_and_the_new_world_size(idle, tmp_path):
    job = idle.launch(
        workloads.train_ckpt,
        kwargs={"steps": 300, "delay": 0.01},
        world_size=2,
        checkpoint_dir=str(tmp_path),
    )
    wait_for(lambda: job.info()["total_steps"] == 300)
    job.suspend()
    job.resume(world_size=1)
    assert job.world_size == 1 and "world_size=1" in repr(job)
    job.stop()
