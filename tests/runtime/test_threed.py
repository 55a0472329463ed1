"""3-D layouts (pipeline stages, each TP in its ``tp`` group and FSDP over ``dp``) on a
real 8-slot LocalCluster, and token-budget batches resumed at another world size.

One 3-D run of 10 steps (``mesh={"dp": 2, "tp": 2, "pp": 2}``, GPipe, checkpoints at
steps 5 and 10) is made once per module (:func:`threed`) and serves three ways: its
losses and parameters against one process, the uninterrupted run that a suspended and
resumed job must equal bitwise, and the checkpoint other layouts load. Every job shares
the module's cluster: eight ranks on two cores are slow, so the models are tiny, and
every test that needs the cluster (its eight workers take a while to start) is marked
``slow``; the launch-time checks need none.
"""

from __future__ import annotations

import pytest
import torch

import clustersdk as cs
from clustersdk import checkpoint_files as ckpt

from .. import workloads
from .. import workloads_parallel as W
from ..helpers import step_reached, wait_for, wait_idle

STEPS = 10
GLOBAL_BATCH = 16  # 8 per data-parallel rank at dp=2, as W.reference_lm(16) takes them
THREED = {"strategy": "fsdp", "mesh": {"dp": 2, "tp": 2, "pp": 2}}
LOSS_RTOL = 1e-5
PARAM_TOL = {"rtol": 1e-4, "atol": 2e-5}  # as tests/test_parallel.py: sharded sums, 10 steps


@pytest.fixture(scope="module")
def cluster8(tmp_path_factory):
    with cs.Cluster.local(workers=8, state_dir=str(tmp_path_factory.mktemp("state8"))) as c:
        yield c


@pytest.fixture
def idle8(cluster8):
    wait_idle(cluster8, timeout=60)
    yield cluster8
    for job in cluster8.jobs():  # a failed test may leave a job behind
        if not job.status.terminal:
            job.stop(wait=False)
    wait_idle(cluster8, timeout=60)


def launch_exact(cluster, *, world_size: int = 8, kwargs: dict | None = None, **options):
    job_kwargs = {"kind": "lm", "steps": STEPS, "global_batch": GLOBAL_BATCH, **(kwargs or {})}
    return cluster.launch(
        workloads.train_exact, kwargs=job_kwargs, world_size=world_size, **options
    )


def rows(job) -> dict[tuple[int, int], float]:
    """Every logged loss by (rank, step); a step logged twice by one rank fails. (Rows
    without one: a pipeline's first stages, which log only token budgets' padding.)"""
    out: dict[tuple[int, int], float] = {}
    for row in job.history():
        if "loss" not in row:
            continue
        key = (row["rank"], row["step"])
        assert key not in out, f"rank {key[0]} logged step {key[1]} twice"
        out[key] = row["loss"]
    return out


def mean_losses(job) -> list[float]:
    """Per step, the mean of the logged losses: the last stage's ranks, each its own
    data-parallel batch (TP peers log the same)."""
    steps: dict[int, list[float]] = {}
    for (_rank, step), loss in rows(job).items():
        steps.setdefault(step, []).append(loss)
    return [sum(v) / len(v) for _, v in sorted(steps.items())]


def assert_like_one_process(job, model: dict, reference: dict) -> None:
    losses = mean_losses(job)
    assert len(losses) == len(reference["losses"]) == STEPS
    for step, (got, want) in enumerate(zip(losses, reference["losses"])):
        assert abs(got - want) <= LOSS_RTOL * abs(want), (step, got, want)
    assert model.keys() == reference["model"].keys()
    for key, want in reference["model"].items():
        torch.testing.assert_close(model[key], want, **PARAM_TOL, msg=key)


def assert_bitwise(got: dict, want: dict) -> None:
    """Parameters, AdamW moments and step counts, hyperparameters: the same bits."""
    assert got["model"].keys() == want["model"].keys()
    for key, value in want["model"].items():
        assert torch.equal(got["model"][key], value), (key, (got["model"][key] - value).abs().max())
    assert got["optim"]["state"].keys() == want["optim"]["state"].keys() == want["model"].keys()
    for key, moments in want["optim"]["state"].items():
        assert moments.keys() == got["optim"]["state"][key].keys()
        for name, value in moments.items():
            assert torch.equal(got["optim"]["state"][key][name], value), (key, name)
    assert got["optim"]["param_groups"] == want["optim"]["param_groups"]


@pytest.fixture(scope="module")
def threed(cluster8, tmp_path_factory):
    """The 3-D run, once: (job, its result, its checkpoint_dir)."""
    root = str(tmp_path_factory.mktemp("threed"))
    job = launch_exact(cluster8, checkpoint_dir=root, checkpoint_every=5, keep=2, **THREED)
    out = job.wait(timeout=300)
    assert out["step"] == STEPS
    return job, out["state"], root


# --- equal to one process ---------------------------------------------------------------
@pytest.mark.slow
def test_three_d_on_eight_ranks_equals_one_process(threed):
    job, state, root = threed
    assert_like_one_process(job, state["model"], W.reference_lm(GLOBAL_BATCH))
    # the last stage's ranks (4-7: pp is the outermost dimension) log the loss
    assert {rank for rank, _ in rows(job)} == {4, 5, 6, 7}
    assert [step for step, _ in ckpt.committed(root)] == [5, 10]


@pytest.mark.slow
def test_three_d_with_accumulation_clipping_and_1f1b_equals_one_process(idle8):
    job = idle8.launch(
        W.train_lm, world_size=8, schedule="1f1b", grad_accum=2, clip_grad_norm=0.5, **THREED
    )
    out = job.wait(timeout=300)
    assert_like_one_process(job, out["model"], W.reference_lm(GLOBAL_BATCH, clip=0.5))


# --- suspend and resume at the same layout ------------------------------------------------
@pytest.mark.slow
def test_three_d_paused_suspended_and_resumed_is_bitwise_the_uninterrupted_run(
    idle8, threed, tmp_path
):
    want_job, want, _ = threed
    job = launch_exact(idle8, kwargs={"delay": 0.2}, checkpoint_dir=str(tmp_path), **THREED)
    wait_for(lambda: step_reached(job, 2), timeout=120)
    job.pause()
    assert job.status is cs.JobStatus.PAUSED
    job.resume()
    wait_for(lambda: step_reached(job, 4), timeout=120)
    job.suspend()
    assert job.status is cs.JobStatus.SUSPENDED
    job.resume()
    got = job.wait(timeout=300)
    assert got["step"] == STEPS
    assert_bitwise(got["state"], want)
    assert rows(job) == rows(want_job)


# --- checkpoints between layouts ----------------------------------------------------------
TARGETS = {
    "ddp2": {"world_size": 2, "strategy": "ddp"},
    "2d4": {"world_size": 4, "strategy": "fsdp", "mesh": {"dp": 2, "tp": 2}},
    "pp2": {"world_size": 2, "strategy": "pp"},
}


@pytest.mark.slow
@pytest.mark.parametrize("target", list(TARGETS))
def test_a_three_d_checkpoint_loads_bitwise_into_another_layout(idle8, threed, target):
    """``resume="auto"`` in the 3-D job's own checkpoint_dir: its newest checkpoint (step
    10), with nothing left to train; what the target gathers is what the 3-D job held."""
    _, want, root = threed
    job = launch_exact(idle8, checkpoint_dir=root, resume="auto", **TARGETS[target])
    got = job.wait(timeout=300)
    assert f"at step {STEPS}" in job.logs(0)
    assert_bitwise(got["state"], want)


@pytest.mark.slow
def test_a_ddp_checkpoint_loads_bitwise_into_three_d(idle8, tmp_path):
    root = str(tmp_path)
    want = launch_exact(
        idle8, world_size=2, strategy="ddp", checkpoint_dir=root, checkpoint_every=STEPS
    ).wait(timeout=300)
    job = launch_exact(idle8, checkpoint_dir=root, resume="auto", **THREED)
    got = job.wait(timeout=300)
    assert f"at step {STEPS}" in job.logs(0)
    assert_bitwise(got["state"], want["state"])


# --- checked at launch --------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, match",
    [
        (
            {"world_size": 4, "mesh": {"dp": 2, "tp": 2, "pp": 2}},
            r"mesh \{'dp': 2, 'tp': 2, 'pp': 2\} has 8 ranks \(2 x 2 x 2\) but world_size=4",
        ),
        (
            {"world_size": 8, "mesh": {"dp": 1, "tp": 2, "pp": 4}},
            "a pipeline of pp=4 stages needs at least 4 layers, but Transformer has 2",
        ),
        (
            {"world_size": 6, "mesh": {"dp": 1, "tp": 3, "pp": 2}},
            "n_heads=4 attention heads can't be split over tp=3 ranks",
        ),
        (
            {
                "world_size": 6,
                "mesh": {"dp": 1, "tp": 3, "pp": 2},
                "plan": {"layers.*.mlp.fc1": "colwise"},
            },
            r"layers.0.mlp.fc1 \(colwise\) splits a dimension of 128, which does not divide "
            "over tp=3 ranks",
        ),
        (
            {"world_size": 8, "mesh": {"dp": 2, "tp": 2, "pp": 2}, "split": ["layers.1", "norm"]},
            r"split=\['layers.1', 'norm'\] makes 3 stages, but the pipeline has pp=2 ranks",
        ),
        (
            {
                "world_size": 8,
                "mesh": {"dp": 2, "tp": 2, "pp": 2},
                "schedule": "1f1b",
                "microbatches": 1,
            },
            "schedule='1f1b' needs at least as many microbatches as stages: microbatches=1, pp=2",
        ),
        (
            {"world_size": 4, "mesh": {"dp": 2, "tp": 2}, "microbatches": 2},
            "microbatches= is an option of strategy='pp', not 'fsdp' .or of strategy='fsdp' "
            "with a mesh that has a 'pp' dimension",
        ),
        (
            {"world_size": 8, "strategy": "pp", "mesh": {"dp": 2, "tp": 2, "pp": 2}},
            "for pipeline stages over FSDP .3-D. use strategy='fsdp'",
        ),
    ],
    ids=["mesh", "stages", "heads", "plan-dim", "split", "1f1b", "option", "strategy"],
)
def test_bad_three_d_layouts_fail_at_launch_naming_the_values(options, match):
    """What ``cluster.launch`` builds first, before it asks for any slot (the model
    checks run on the meta device)."""
    options = {"strategy": "fsdp", "model": W.make_model, **options}
    with pytest.raises(cs.SpecError, match=match):
        cs.JobSpec(fn=W.train_lm, **options)


# --- token-budget batches -----------------------------------------------------------------
@pytest.mark.slow
def test_token_budget_batches_resume_at_another_world_size_without_repeats_or_gaps(idle8, tmp_path):
    root = str(tmp_path)
    one = idle8.launch(
        W.read_budget, kwargs={"steps": 4}, world_size=2, checkpoint_dir=root, checkpoint_every=4
    )
    first = one.wait(timeout=120)
    two = idle8.launch(W.read_budget, world_size=3, checkpoint_dir=root, resume="auto")
    rest = two.wait(timeout=120)
    assert "at step 4" in two.logs(0)
    ids = [i for rank in first + rest for step in rank for i in step]
    assert sorted(ids) == list(range(120))  # each sample once: none repeated, none skipped
    assert all(len(rank) == 4 for rank in first) and len({len(r) for r in rest}) == 1
    budget = 48
    history = one.history() + two.history()
    assert {(r["rank"], r["step"]) for r in two.history()} == {
        (rank, step) for rank in range(3) for step in range(4, 4 + len(rest[0]))
    }
    for row in history:  # each rank's padding and real tokens, per step
        assert 0 <= row["padding"] < 1 and 0 < row["tokens"] <= budget


@pytest.mark.slow
def test_token_budget_batches_through_a_pipeline_train_as_fsdp_on_the_same_batches(idle8):
    """Each step's batches have other shapes: the pipeline infers its stages' shapes
    again (the FSDP peers agreeing when) and trains as FSDP alone does on the same
    batches, each a multiple of the 4 pieces a step cuts it into (grad_accum x
    microbatches: 2 x 2 and 4 x 1)."""
    pipe = idle8.launch(
        W.train_budget, world_size=4, strategy="fsdp", mesh={"dp": 2, "pp": 2}, grad_accum=2
    )
    flat = idle8.launch(W.train_budget, world_size=2, strategy="fsdp", grad_accum=4)
    pipe_shapes, flat_shapes = pipe.wait(timeout=300), flat.wait(timeout=300)
    # ranks 0-1 are the first stage (dp 0, 1), 2-3 the last: each reads its dp rank's batches
    assert pipe_shapes == flat_shapes + flat_shapes
    assert len({shape for rank in flat_shapes for shape in rank}) > 4  # shapes do change
    assert all(rows % 4 == 0 for rank in flat_shapes for rows, _ in rank)
    got, want = rows(pipe), rows(flat)
    assert sorted(got) == [(rank, step) for rank in (2, 3) for step in range(6)]
    for (rank, step), loss in got.items():
        assert loss == pytest.approx(want[rank - 2, step], rel=LOSS_RTOL), (rank, step)
