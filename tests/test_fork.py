"""job.fork on four local slots (issue 43): a running job's state goes on in a new job
while the job goes on too. Without changes the fork is bitwise the job from there; with
the learning rate halved its losses part from the first step after; at world size 1 it
finishes; the job itself is untouched, bitwise the run nobody forked."""

from __future__ import annotations

import pytest

from clustersdk.errors import InvalidTransitionError, SpecError

from . import workloads
from .helpers import assert_bitwise, cli, rows, step_reached, wait_for

KW = {"kind": "mlp", "steps": 20, "global_batch": 24}


def test_forks_go_on_from_the_jobs_state_and_leave_the_job_untouched(idle4, tmp_path):
    want = idle4.launch(workloads.train_exact, kwargs=KW, world_size=2)
    want_state, want_rows = want.wait(timeout=120), rows(want)
    job = idle4.launch(
        workloads.train_exact,
        kwargs={**KW, "delay": 0.1},
        world_size=2,
        name="trunk",
        checkpoint_dir=str(tmp_path / "trunk"),
    )
    wait_for(lambda: step_reached(job, 4), timeout=60)

    same = job.fork("same")  # at its next step boundary
    at = same.spec.forked_at
    assert 4 <= at < KW["steps"] and same.parent.id == job.id
    assert same.spec.checkpoint_dir == str(tmp_path / "trunk") + "-forks/same"
    half = job.fork("half", at=at, hparams={"lr": 0.005})  # the same checkpoint, lr halved
    alone = job.fork("alone", at=at, world_size=1)

    assert_bitwise(job.wait(timeout=120), want_state, KW["steps"])
    assert rows(job) == want_rows  # forking took a checkpoint, and nothing else
    assert_bitwise(same.wait(timeout=120), want_state, KW["steps"])
    assert rows(same) == {k: v for k, v in want_rows.items() if k[1] >= at}

    assert half.wait(timeout=120)["step"] == KW["steps"]
    halved = rows(half)
    assert halved[(0, at)] == want_rows[(0, at)]  # the loss before its first update...
    assert all(halved[(0, s)] != want_rows[(0, s)] for s in range(at + 1, KW["steps"]))
    assert [u["changes"] for u in half.updates()] == [{"lr": [0.01, 0.005]}]

    assert alone.wait(timeout=120)["step"] == KW["steps"]
    assert alone.world_size == 1
    assert [f.name for f in job.forks()] == ["same", "half", "alone"]
    forked = [e for e in job.events() if e["kind"] == "forked"]
    assert [e["message"] for e in forked][0] == f"forked as 'same' at step {at}"


def test_a_fork_is_refused_with_a_reason_and_nothing_changes(idle4, tmp_path):
    plain = idle4.launch(workloads.ticker, kwargs={"steps": 1_000_000}, world_size=1)
    try:
        wait_for(lambda: step_reached(plain, 1), timeout=60)
        with pytest.raises(SpecError, match="has no checkpoint_dir: a fork starts from one"):
            plain.fork()
    finally:
        plain.stop()
    job = idle4.launch(
        workloads.ticker,
        kwargs={"steps": 1_000_000},
        world_size=1,
        checkpoint_dir=str(tmp_path / "ticks"),
    )
    try:
        wait_for(lambda: step_reached(job, 1), timeout=60)
        with pytest.raises(SpecError, match="lr"):
            job.fork(hparams={"lr": -1.0})
        with pytest.raises(SpecError, match="no checkpoint that resumes at step 7; its"):
            job.fork(at=7)
        assert job.forks() == [] and job.info()["checkpoint"] is None
        said = cli(
            idle4.state_dir, "fork", job.name, "--name", "by-cli", "--set", "lr=0.005",
            "--cluster", idle4.scheduler_address,
        )  # fmt: skip
        assert said.returncode == 0, said.stderr
        (fork,) = job.forks()
        assert said.stdout.startswith(f"forked job {job.name!r} at step {fork.spec.forked_at} ")
        assert "as 'by-cli'" in said.stdout and "1 rank(s), lr=0.005)" in said.stdout
        fork.stop()
    finally:
        job.stop()
    with pytest.raises(InvalidTransitionError, match="its function is no longer kept"):
        job.fork(at=0)
