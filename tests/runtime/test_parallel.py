"""Model-parallel strategies and training features on a real LocalCluster.

Every strategy must train exactly as one process does on the same global
batches (``workloads_parallel.reference_lm``): losses within 1e-5 relative
and the gathered parameters alike. 2-rank jobs share the module's 4-slot
cluster with the two 4-rank cases (FSDP on 4, 2-D FSDP over TP).
"""

from __future__ import annotations

import time

import pytest
import torch

import clustersdk as cs

from .. import workloads_parallel as W

LOSS_RTOL = 1e-5
# Sharded matmuls add in another order; ten AdamW steps keep that near float eps.
PARAM_TOL = {"rtol": 1e-4, "atol": 2e-5}


def mean_losses(job) -> list[float]:
    """Per step, the mean over ranks of the logged loss (the global batch's loss: every
    data-parallel rank's batch has the same size; TP peers log the same value)."""
    steps: dict[int, list[float]] = {}
    for row in job.history():
        steps.setdefault(row["step"], []).append(row["loss"])
    return [sum(v) / len(v) for _, v in sorted(steps.items())]


def assert_matches_reference(
    job, out: dict, reference: dict, loss_rtol: float = LOSS_RTOL, params: dict = PARAM_TOL
) -> None:
    losses = mean_losses(job)
    assert len(losses) == len(reference["losses"])
    for step, (got, want) in enumerate(zip(losses, reference["losses"])):
        assert abs(got - want) <= loss_rtol * abs(want), (step, got, want)
    assert out["model"].keys() == reference["model"].keys()
    for key, want in reference["model"].items():
        torch.testing.assert_close(out["model"][key], want, **params, msg=key)


# strategy, launch options, model options, data-parallel ranks (the global batch is 8 x this)
STRATEGIES = {
    "ddp": ({"strategy": "ddp"}, {}, 2),
    "fsdp": ({"strategy": "fsdp"}, {}, 2),
    "tp": ({"strategy": "tp"}, {}, 1),
    "pp-gpipe": ({"strategy": "pp"}, {}, 1),
    "pp-1f1b": ({"strategy": "pp", "schedule": "1f1b", "microbatches": 4}, {}, 1),
    "ep": ({"strategy": "ep"}, {"n_experts": 4}, 2),
}
FEATURES = {"grad_accum": 2, "clip_grad_norm": 0.5}


@pytest.mark.parametrize("features", [False, True], ids=["plain", "accum+clip"])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_two_ranks_equal_one_process(idle4, name, features):
    options, model, dp = STRATEGIES[name]
    extra = FEATURES if features else {}
    job = idle4.launch(W.train_lm, kwargs=model, world_size=2, **options, **extra)
    out = job.wait(timeout=120)
    reference = W.reference_lm(8 * dp, clip=extra.get("clip_grad_norm"), **model)
    assert_matches_reference(job, out, reference)
    if options["strategy"] == "pp":  # the last stage reports the loss, once per step
        assert sorted((r["rank"], r["step"]) for r in job.history()) == [(1, s) for s in range(10)]


def test_fsdp_on_four_ranks_equals_one_process(idle4):
    job = idle4.launch(W.train_lm, world_size=4, strategy="fsdp")
    assert_matches_reference(job, job.wait(timeout=120), W.reference_lm(32))


def test_fsdp_over_tp_on_a_2x2_mesh_equals_one_process(idle4):
    job = idle4.launch(
        W.train_lm,
        kwargs={"launch_model": True},
        world_size=4,
        strategy="fsdp",
        mesh={"dp": 2, "tp": -1},
        model=W.make_model,
        **FEATURES,
    )
    out = job.wait(timeout=120)
    assert_matches_reference(job, out, W.reference_lm(16, clip=0.5))
    assert job.spec.mesh == {"dp": 2, "tp": -1}


def gloo_threads() -> int:
    """This process's gloo threads (each group has a connection loop and two workers)."""
    import glob

    count = 0
    for comm in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(comm) as f:
                count += f.read().startswith(("gloo", "pt_gloo"))
        except OSError:  # the thread ended meanwhile
            pass
    return count


def test_a_finished_job_leaves_no_group_threads_on_its_workers(idle4):
    """A destroyed group lives on while torch's DTensor caches hold the job's mesh: its
    connection loop woke 100 times a second during every later job on the worker."""
    job = idle4.launch(W.train_lm, world_size=4, strategy="fsdp", mesh={"dp": 2, "tp": 2})
    job.wait(timeout=120)
    deadline = time.monotonic() + 20
    while (left := idle4.client.run(gloo_threads)) and any(left.values()):
        assert time.monotonic() < deadline, f"gloo threads left on the workers: {left}"
        time.sleep(0.2)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_bf16_autocast_follows_a_bf16_reference(idle4, name):
    options, model, dp = STRATEGIES[name]
    job = idle4.launch(W.train_lm, kwargs=model, world_size=2, precision="bf16", **options)
    out = job.wait(timeout=120)
    bf16, fp32 = (W.reference_lm(8 * dp, precision=p, **model) for p in ("bf16", "fp32"))
    # bf16 rounding differs with the batch split (and TP's partial sums): compare loosely ...
    assert_matches_reference(job, out, bf16, loss_rtol=1e-3, params={"rtol": 0, "atol": 5e-2})
    # ... and make sure it is bf16: far from the fp32 run, where fp32 layouts agree to 1e-7
    off_fp32 = max(abs(a - b) / b for a, b in zip(mean_losses(job), fp32["losses"]))
    assert off_fp32 > 1e-5


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_inner_micro_batches_do_not_reduce_gradients(idle4, strategy):
    seen = idle4.launch(W.probe_accumulation, world_size=2, strategy=strategy, grad_accum=2).wait(
        timeout=120
    )
    (inner0, last0), (inner1, last1) = seen
    if strategy == "ddp":  # local gradients differ until the last micro-batch all-reduces
        assert inner0[1] != inner1[1]
        assert last0[1] == last1[1]
    else:  # FSDP reduce-scatters nothing until then: no sharded gradient exists
        assert inner0[0] == inner1[0] == 0
        assert last0[0] == last1[0] > 0


@pytest.mark.parametrize(
    "options, match",
    [
        (
            {"world_size": 2, "strategy": "fsdp", "mesh": {"dp": 2, "tp": 2}},
            r"mesh \{'dp': 2, 'tp': 2\} has 4 ranks \(2 x 2\) but world_size=2",
        ),
        (
            {"world_size": 4, "strategy": "pp", "model": W.make_model},
            "a pipeline of pp=4 stages needs at least 4 layers, but Transformer has 2",
        ),
        (
            {
                "world_size": 2,
                "strategy": "tp",
                "model": torch.nn.Sequential(torch.nn.Linear(4, 4)),
            },
            "tensor parallelism needs a plan, but Sequential has no tp_plan",
        ),
        (
            {
                "world_size": 2,
                "strategy": "tp",
                "model": W.make_model,
                "plan": {"layers.*.mlp.fcx": "colwise"},
            },
            r"plan entry 'layers.\*.mlp.fcx' matches no module of Transformer",
        ),
        (
            {"world_size": 2, "strategy": "ddp", "precision": "fp16"},
            "precision='fp16' needs a CUDA GPU on every rank .* slots are cpu",
        ),
        (
            {"world_size": 2, "strategy": "ddp", "microbatches": 4},
            "microbatches= is an option of strategy='pp', not 'ddp'",
        ),
    ],
    ids=["mesh", "stages", "no-plan", "bad-plan", "fp16-cpu", "option"],
)
def test_bad_layouts_fail_at_launch_naming_the_values(idle4, options, match):
    before = len(idle4.jobs())
    with pytest.raises(cs.SpecError, match=match):
        idle4.launch(W.train_lm, **options)
    assert len(idle4.jobs()) == before  # refused before any slot was taken


def test_options_that_the_training_function_ignores_fail_loudly(idle4):
    job = idle4.launch(
        W.train_own_loop, world_size=2, strategy="ddp", precision="bf16", clip_grad_norm=1.0
    )
    with pytest.raises(cs.JobFailedError, match="SpecError") as info:
        job.wait(timeout=60)
    assert "precision='bf16' takes effect through ctx.autocast" in info.value.message


@pytest.mark.gpu
def test_fp16_with_grad_scaler_on_gpus(tmp_path):
    n = min(torch.cuda.device_count(), 2)
    with cs.Cluster.local(state_dir=str(tmp_path)) as cluster:
        job = cluster.launch(
            W.train_lm,
            world_size=n,
            strategy="fsdp",
            precision="fp16",
            checkpoint_dir=str(tmp_path / "ckpt"),
            checkpoint_every=10,
        )
        out = job.wait(timeout=300)
        losses = mean_losses(job)  # while the cluster is up: the history is on its scheduler
    reference = W.reference_lm(8 * n)
    assert len(losses) == len(reference["losses"])  # every step logged once
    assert all(abs(a - b) < 2e-2 * b for a, b in zip(losses, reference["losses"]))
    assert out["model"].keys() == reference["model"].keys()
