"""job.run and job.update on real local clusters (the rank's parts in one process:
``tests/runtime/test_live.py``)."""

from __future__ import annotations

import threading
import time

import cloudpickle
import dask.config
import pytest
import torch

import clustersdk as cs
from clustersdk import checkpoint_files as ckpt
from clustersdk.control.plugin import PLUGIN_NAME

from . import workloads_live as L
from .helpers import assert_same_run, losses, step_reached, wait_for

cloudpickle.register_pickle_by_value(L)  # the workers do not have tests/ on their path


def rows_at(job, step: int) -> dict[int, dict]:
    return {r["rank"]: r for r in job.history() if r["step"] == step}


# --- job.run ---------------------------------------------------------------------------------
def test_run_sees_what_each_rank_computed_and_leaves_a_paused_job_paused(idle):
    job = idle.launch(L.train_live, kwargs={"steps": 500, "delay": 0.02}, world_size=2)
    wait_for(lambda: step_reached(job, 3), timeout=60)
    at = job.run(lambda ctx: ctx.step)  # a running job: both ranks at one boundary
    assert sorted(at) == [0, 1] and at[0] == at[1] >= 3
    paused_at = job.pause()
    out = job.run(L.stats)
    logged = rows_at(job, paused_at - 1)  # what each rank computed in its last step
    for rank in (0, 1):
        assert out[rank]["step"] == paused_at
        assert out[rank]["grad_norm"] == logged[rank]["grad_norm"]
        assert out[rank]["probe"] == logged[rank]["probe"]
    assert out[0]["probe"] != out[1]["probe"]  # each rank's own batch
    assert job.run(L.stats, ranks=[1]).keys() == {1}
    assert job.run(L.rank_sum) == {0: 1, 1: 1}  # a collective on every rank
    assert job.run(lambda ctx: ctx.registered["optimizer"].param_groups[0]["lr"]) == {
        0: 0.05,
        1: 0.05,
    }
    assert job.status is cs.JobStatus.PAUSED and job.info()["paused_at"] == paused_at
    assert max(r["step"] for r in job.history()) == paused_at - 1  # nobody ran ahead
    job.stop()


def test_a_run_that_raises_leaves_the_job_paused_and_its_run_bitwise_the_same(idle4):
    kwargs = {"steps": 40}
    plain = idle4.launch(L.train_live, kwargs=kwargs, world_size=3).wait(timeout=120)
    job = idle4.launch(L.train_live, kwargs={**kwargs, "delay": 0.03}, world_size=3)
    wait_for(lambda: step_reached(job, 5), timeout=60)
    paused_at = job.pause()
    with pytest.raises(cs.RunError) as info:
        job.run(L.boom_on_1)
    err = info.value
    assert err.results == {0: 0, 2: 2} and list(err.errors) == [1]
    assert err.errors[1]["type"] == "ValueError"
    assert err.errors[1]["message"] == f"boom on rank 1 at step {paused_at}"
    assert "in boom_on_1" in err.errors[1]["traceback"]
    assert f"rank 1: ValueError: boom on rank 1 at step {paused_at}" in str(err)
    assert "Remote traceback (rank 1)" in str(err)
    assert job.status is cs.JobStatus.PAUSED and job.info()["paused_at"] == paused_at
    job.resume()
    out = job.wait(timeout=120)
    assert_same_run(out, plain, exact=True)


def test_bad_runs_are_clear_errors_and_the_job_keeps_its_state_and_step(idle):
    job = idle.launch(L.train_live, kwargs={"steps": 500, "delay": 0.02}, world_size=2)
    wait_for(lambda: step_reached(job, 2), timeout=60)
    paused_at = job.pause()
    lock = threading.Lock()
    with pytest.raises(cs.SpecError, match=r"job.run: the function .* can't be pickled"):
        job.run(lambda ctx: lock.locked())
    with pytest.raises(cs.SpecError, match=r"name distinct ranks from 0 to 1 \(job '.*' has 2\)"):
        job.run(L.stats, ranks=[2])
    with pytest.raises(
        cs.RunError,
        match="rank 0: UnpicklableResult: the function returned a lock, which can't be pickled",
    ):
        job.run(lambda ctx: threading.Lock())
    with dask.config.set({"clustersdk.run-result-limit": "1 KiB"}):
        with pytest.raises(
            cs.RunError,
            match=r"ResultTooLarge: the result is [\d.]+ kiB "
            r"pickled, over the limit of 1.00 kiB",
        ):
            job.run(lambda ctx: bytes(10_000))
    started = time.monotonic()
    with pytest.raises(cs.RunError) as info:
        job.run(L.nap, timeout=0.5)
    assert time.monotonic() - started < 2.5  # the call returned at its timeout
    assert {e["type"] for e in info.value.errors.values()} == {"Timeout"}
    assert "the rank goes on training once it returns" in str(info.value)
    assert job.status is cs.JobStatus.PAUSED
    assert wait_for(lambda: job.run(lambda ctx: ctx.rank, timeout=10)) == {0: 0, 1: 1}
    assert job.status is cs.JobStatus.PAUSED and job.info()["paused_at"] == paused_at
    job.stop()
    with pytest.raises(
        cs.InvalidTransitionError, match="job.run needs a RUNNING, PAUSED or HELD job"
    ):
        job.run(L.stats)


# --- job.update -----------------------------------------------------------------------------
def test_update_lr_while_running_equals_a_loop_that_changes_it_at_that_step(idle):
    pytest.importorskip("ipywidgets")
    from clustersdk.widgets.job import JobDashboard

    job = idle.launch(L.train_live, kwargs={"steps": 60, "delay": 0.03}, world_size=2)
    wait_for(lambda: step_reached(job, 10), timeout=60)
    step = job.update(lr=0.02)
    assert 10 <= step < 60
    out = job.wait(timeout=120)
    want = idle.launch(
        L.train_live, kwargs={"steps": 60, "switch_at": step, "new_lr": 0.02}, world_size=2
    ).wait(timeout=120)
    for key, value in want["params"].items():
        assert torch.equal(out["params"][key], value), key
    reference = L.reference_live(2, steps=60, switch_at=step, new_lr=0.02)
    for key, value in reference.items():
        torch.testing.assert_close(out["params"][key], value, rtol=0, atol=1e-6)
    lrs = {r["step"]: r["lr"] for r in job.history() if r["rank"] == 1}
    assert lrs[step - 1] == 0.05 and lrs[step] == 0.02
    [row] = job.updates()
    assert (row["step"], row["changes"]) == (step, {"lr": [0.05, 0.02]})
    [event] = [e for e in job.events() if e["kind"] == "updated"]
    assert event["message"] == f"lr 0.05 → 0.02 (before step {step})"
    dash = JobDashboard(job)  # the loss chart marks the change at its step
    try:
        rules = dash.charts["loss"].rules.x.reshape(-1, 2)  # one [x, x] per change
        assert rules.tolist() == [[step, step]]
        assert dash.charts["loss"].rules.labels == [f"step {step}: lr 0.05 → 0.02"]
    finally:
        dash.close()


def test_update_of_a_paused_job_applies_before_its_next_step_on_every_rank(idle4):
    kwargs = {"steps": 60}
    job = idle4.launch(
        L.train_live, kwargs={**kwargs, "delay": 0.03}, world_size=3, hparams={"scale": 1.0}
    )
    wait_for(lambda: step_reached(job, 20), timeout=60)
    paused_at = job.pause()
    assert job.update(lr=0.02, scale=0.5) == paused_at
    assert job.run(
        lambda ctx: (ctx.registered["optimizer"].param_groups[0]["lr"], ctx.hparams["scale"])
    ) == {r: (0.02, 0.5) for r in range(3)}
    job.resume()
    out = job.wait(timeout=120)
    reference = idle4.launch(
        L.train_live,
        world_size=3,
        hparams={"scale": 1.0},
        kwargs={
            **kwargs,
            "switch_at": paused_at,
            "new_lr": 0.02,
            "scale_at": paused_at,
            "new_scale": 0.5,
        },
    )
    assert_same_run(out, reference.wait(timeout=120), exact=True)
    assert {r: losses(job, r) for r in range(3)} == {r: losses(reference, r) for r in range(3)}
    assert out["hparams"] == {"scale": 0.5}


def test_bad_updates_are_refused_before_any_rank_sees_them(idle):
    job = idle.launch(
        L.train_live, kwargs={"steps": 500, "delay": 0.02}, world_size=2, hparams={"scale": 1.0}
    )
    wait_for(lambda: step_reached(job, 2), timeout=60)
    paused_at = job.pause()
    bad = [
        (
            {"momentum": 0.5},
            r"job.update\(momentum=...\): unknown key; it changes lr, "
            r"weight_decay, betas, .* and the job's hparams \(scale\)",
        ),
        ({"lr": -0.1}, r"job.update\(lr=-0.1\): lr must be a finite number >= 0"),
        ({"lr": "fast"}, r"job.update\(lr='fast'\): lr must be a finite number"),
        ({"scale": "big"}, r"ctx.hparams\['scale'\] is a float \(launched as 1.0\)"),
        ({"betas": (0.9, 0.99)}, r"optimizer 'optimizer' \(SGD\) has no 'betas'"),
        ({"lr": {3: 0.1}}, r"group 3 does not exist; optimizer 'optimizer' \(SGD\) has 1"),
        ({"grad_accum": 2}, r"through ctx.micro_batches or ctx.train_step"),
        ({"checkpoint_every": 5}, r"the job has no checkpoint_dir"),
    ]
    for changes, message in bad:
        with pytest.raises(cs.SpecError, match=message):
            job.update(**changes)
    assert job.status is cs.JobStatus.PAUSED and job.info()["paused_at"] == paused_at
    assert job.updates() == [] and job.run(lambda ctx: ctx.hparams) == {
        0: {"scale": 1.0},
        1: {"scale": 1.0},
    }
    job.stop()
    with pytest.raises(cs.InvalidTransitionError, match="job.update needs a RUNNING or PAUSED"):
        job.update(lr=0.1)


def test_a_pipeline_takes_a_new_lr_on_every_stage_but_no_new_grad_accum(idle):
    from . import workloads_parallel as WP

    job = idle.launch(WP.train_lm, kwargs={"steps": 100_000}, world_size=2, strategy="pp")
    wait_for(lambda: step_reached(job, 2), timeout=60)
    paused_at = job.pause()
    with pytest.raises(
        cs.SpecError,
        match="under strategy='pp' the pipeline schedule cuts each batch into its micro-batches",
    ):
        job.update(grad_accum=2)
    assert job.update(lr=5e-3) == paused_at
    bases = job.run(lambda ctx: (ctx.stage_index, set(ctx.registered["scheduler"].base_lrs)))
    assert bases == {0: (0, {5e-3}), 1: (1, {5e-3})}  # the schedule's base, on each stage
    assert job.status is cs.JobStatus.PAUSED and job.info()["paused_at"] == paused_at
    job.stop()


def test_training_options_change_at_a_step_boundary_and_stay_in_the_spec(idle, tmp_path):
    job = idle.launch(
        L.train_live,
        kwargs={"steps": 40, "delay": 0.03, "train_step": True},
        world_size=2,
        clip_grad_norm=10.0,
        checkpoint_dir=str(tmp_path),
        keep=20,
    )
    wait_for(lambda: step_reached(job, 5), timeout=60)
    paused_at = job.pause()
    with pytest.raises(
        cs.SpecError,
        match="grad_accum must divide the batch of each rank, and rank 0's is 8 samples",
    ):
        job.update(grad_accum=3)
    assert (
        job.update(grad_accum=2, clip_grad_norm=0.5, checkpoint_every=7, metrics_interval=0.1)
        == paused_at
    )
    assert (job.spec.grad_accum, job.spec.clip_grad_norm) == (2, 0.5)  # the handle knows
    job.resume()
    job.wait(timeout=120)
    for rank in (0, 1):
        rows = {r["step"]: r for r in job.history() if r["rank"] == rank}
        assert {(rows[s]["accum"], rows[s]["clip"]) for s in range(paused_at)} == {(1, 10.0)}
        assert {(rows[s]["accum"], rows[s]["clip"]) for s in range(paused_at, 40)} == {(2, 0.5)}
    spec = job.spec
    assert (spec.grad_accum, spec.clip_grad_norm, spec.checkpoint_every, spec.metrics_interval) == (
        2,
        0.5,
        7,
        0.1,
    )
    saved = [step for step, _ in ckpt.committed(str(tmp_path))]
    assert [s for s in saved if s % 7 == 0 and s > paused_at] == [
        s for s in range(paused_at + 1, 41) if s % 7 == 0
    ]


def test_an_update_survives_a_suspend_and_a_resume_at_another_world_size(idle, tmp_path):
    kwargs = {"steps": 60}
    job = idle.launch(
        L.train_live,
        kwargs={**kwargs, "delay": 0.03},
        world_size=2,
        checkpoint_dir=str(tmp_path),
        hparams={"scale": 1.0},
    )
    wait_for(lambda: step_reached(job, 10), timeout=60)
    step = job.update(lr=0.02, scale=0.5)
    wait_for(lambda: step_reached(job, step + 10), timeout=60)
    job.suspend()
    job.resume(world_size=1)
    out = job.wait(timeout=120)
    want = idle.launch(
        L.train_live,
        kwargs={**kwargs, "switch_at": step, "new_lr": 0.02, "scale_at": step, "new_scale": 0.5},
        world_size=2,
        hparams={"scale": 1.0},
    ).wait(timeout=120)
    assert_same_run(out, want, exact=False)
    assert (out["lr"], out["hparams"]) == (0.02, {"scale": 0.5})
    assert [u["step"] for u in job.updates()] == [step]  # the resume repeated nothing


def test_an_update_that_a_suspend_overtakes_is_applied_once_by_the_resumed_gang(idle, tmp_path):
    """Asked together, the suspend wins at the boundary (it is checked first): the update
    is not in the checkpoint, so the resumed gang applies it before its first step."""
    kwargs = {"steps": 24}
    job = idle.launch(
        L.train_live, kwargs={**kwargs, "delay": 0.25}, world_size=2, checkpoint_dir=str(tmp_path)
    )
    wait_for(lambda: step_reached(job, 4), timeout=60)
    answer: list = []
    asking = threading.Thread(target=lambda: answer.append(job.update(lr=0.02)))
    asking.start()
    plane = idle.dask_cluster.scheduler.plugins[PLUGIN_NAME]  # in this process: Cluster.local
    wait_for(lambda: plane.runs[job.id].machine.live.updates)  # asked: now overtake it
    job.suspend()
    asking.join(timeout=60)
    job.resume()
    out = job.wait(timeout=120)
    [row] = job.updates()
    assert answer in ([row["step"]], [None])  # None: it left RUNNING before the ranks applied it
    want = idle.launch(
        L.train_live, kwargs={**kwargs, "switch_at": row["step"], "new_lr": 0.02}, world_size=2
    ).wait(timeout=120)
    assert_same_run(out, want, exact=True)
    assert out["lr"] == 0.02


# --- the magic -------------------------------------------------------------------------------
def test_job_run_cell_magic_and_update_line_magic(idle, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clustersdk")
    shell.user_ns.update(cluster=idle, factor=10)
    try:
        job = idle.launch(
            L.train_live,
            kwargs={"steps": 500, "delay": 0.02},
            world_size=2,
            name="magic-live",
            hparams={"scale": 1.0},
        )
        wait_for(lambda: step_reached(job, 2), timeout=60)
        paused_at = job.pause()
        result = shell.run_cell(
            "%%job run magic-live\nstep = ctx.step\nstep * factor + ctx.rank", store_history=False
        )
        assert result.result == {0: paused_at * 10, 1: paused_at * 10 + 1}
        result = shell.run_cell(
            "%%job run magic-live --ranks 1\nctx.hparams['scale']", store_history=False
        )
        assert result.result == {1: 1.0}
        assert shell.run_cell("%job update magic-live lr=0.01 scale=2", store_history=False).success
        assert f"job 'magic-live': updated before step {paused_at}" in capsys.readouterr().out
        assert job.updates()[0]["changes"] == {"lr": [0.05, 0.01], "scale": [1.0, 2.0]}
        result = shell.run_cell("%%job run magic-live\n1 / 0", store_history=False)
        assert isinstance(result.error_in_exec, Exception)
        shown = capsys.readouterr()
        assert "rank 1: ZeroDivisionError: division by zero" in shown.out + shown.err
        result = shell.run_cell("%job update magic-live", store_history=False)
        assert not result.success
        assert "needs changes" in capsys.readouterr().err
        # a fork starts from a checkpoint: this job keeps none, so none is made
        result = shell.run_cell("%job fork magic-live lr=0.02", store_history=False)
        assert not result.success
        assert "has no checkpoint_dir: a fork starts from one" in capsys.readouterr().err
        job.stop()
    finally:
        shell.user_ns.pop("cluster", None)


# --- the dashboard --------------------------------------------------------------------------
def test_the_dashboard_model_keeps_each_change_once_in_step_order():
    from clustersdk.widgets.model import JobView

    record = {
        "name": "a",
        "status": "RUNNING",
        "spec": {"world_size": 2},
        "events": [
            {"kind": "restarted", "step": 3, "message": "worker lost"},
            {"kind": "updated", "seq": 4, "step": 30, "changes": {"warmup": [10, 20]}},
        ],
    }
    view = JobView.from_record(record)
    view.take_dirty()
    view.apply({"kind": "updated", "seq": 2, "step": 12, "changes": {"lr": [0.01, 0.001]}})
    view.apply({"kind": "updated", "seq": 4, "step": 30, "changes": {"warmup": [10, 20]}})
    assert "updates" in view.take_dirty()
    assert view.update_marks() == [(12, "lr 0.01 → 0.001"), (30, "warmup 10 → 20")]
