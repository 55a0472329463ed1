"""examples/mingpt, the minGPT trainer ported to clustersdk: at 2 ranks under DDP and FSDP
(its optimizer is built before ctx.prepare, as minGPT does), and suspended at 2 ranks and
resumed at 1 with its epochs, evaluations and step count where they were."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

import clustersdk as cs
from clustersdk.cluster import shipping
from clustersdk.runtime import shipping as worker_shipping

from .helpers import wait_for

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "mingpt")
MODULES = ("main", "model", "trainer", "char_dataset")


@pytest.fixture(scope="module")
def mingpt():
    """The example's modules, imported here as its script does. The workers can't import
    them (they are not on their path): every launch ships the directory."""
    sys.path.insert(0, EXAMPLE)
    try:
        import main
    finally:
        sys.path.remove(EXAMPLE)
    yield main
    for name in MODULES:
        sys.modules.pop(name, None)
    for package in shipping._packed.values():  # what the local workers unpacked
        shutil.rmtree(os.path.join(worker_shipping.cache_dir(), package.digest), ignore_errors=True)


def config(mingpt, epochs: int = 2):
    from char_dataset import DataConfig
    from model import GPTConfig
    from trainer import TrainerConfig

    small = GPTConfig(
        n_layer=2, n_head=2, n_embd=32, embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0
    )  # no dropout: one rank and two draw masks differently
    return mingpt.Config(
        gpt=small,
        data=DataConfig(block_size=16, truncate=0.25),
        trainer=TrainerConfig(max_epochs=epochs, batch_size=8, log_every=1000),
    )


def rows(job) -> dict[int, dict]:
    """Rank 0's row of every step, its loss replaced by the mean of the ranks' (each rank's
    is the loss of its part of the global batch: their mean is the whole batch's)."""
    history = job.history()
    out = {r["step"]: dict(r) for r in history if r["rank"] == 0}
    assert len(out) == len([r for r in history if r["rank"] == 0]), "a step logged twice"
    for step, row in out.items():
        losses = [r["loss"] for r in history if r["step"] == step]
        row["loss"] = sum(losses) / len(losses)
    return out


@pytest.fixture(scope="module")
def runs(cluster, mingpt):
    """Two epochs at 2 ranks under each strategy: strategy -> (result, rows)."""
    out = {}
    for strategy in ("ddp", "fsdp"):
        job = cluster.launch(
            mingpt.train,
            kwargs={"cfg": config(mingpt)},
            world_size=2,
            strategy=strategy,
            working_dir=EXAMPLE,
        )
        out[strategy] = (job.wait(timeout=180), rows(job))
    return out


def test_ddp_and_fsdp_train_alike_with_an_optimizer_built_before_prepare(idle, runs):
    (ddp, ddp_rows), (fsdp, fsdp_rows) = runs["ddp"], runs["fsdp"]
    per_epoch = ddp["steps"] // 2
    assert ddp["steps"] == fsdp["steps"] == 2 * per_epoch and ddp["epochs"] == 2
    assert sorted(ddp_rows) == list(range(ddp["steps"]))
    for step, row in ddp_rows.items():
        assert row["epoch"] == step // per_epoch
        assert fsdp_rows[step]["loss"] == pytest.approx(row["loss"], rel=1e-4), step
    evaluated = [s for s, r in ddp_rows.items() if "eval_loss" in r]
    assert evaluated == [per_epoch - 1, 2 * per_epoch - 1]
    assert ddp_rows[evaluated[-1]]["eval_loss"] < ddp_rows[evaluated[0]]["eval_loss"]
    assert ddp_rows[ddp["steps"] - 1]["loss"] < 0.9 * ddp_rows[0]["loss"]  # it learns
    for key, value in ddp["state"]["model"].items():  # FSDP's gathered state: the same model
        torch.testing.assert_close(fsdp["state"]["model"][key], value, rtol=1e-3, atol=1e-4)


def test_fsdp_suspended_at_two_and_resumed_at_one_keeps_epochs_and_steps(
    idle, mingpt, runs, tmp_path
):
    reference, reference_rows = runs["fsdp"]
    job = idle.launch(
        mingpt.train,
        kwargs={"cfg": config(mingpt)},
        world_size=2,
        strategy="fsdp",
        working_dir=EXAMPLE,
        checkpoint_dir=str(tmp_path),
    )
    wait_for(lambda: job.history(), timeout=120)
    paused_at = job.pause()
    assert 0 < paused_at < reference["steps"] // 2  # suspended in the first epoch
    job.suspend()
    assert job.status is cs.JobStatus.SUSPENDED
    job.resume(world_size=1)
    out = job.wait(timeout=180)
    assert (out["steps"], out["epochs"]) == (reference["steps"], reference["epochs"])
    got = rows(job)
    assert sorted(got) == sorted(reference_rows)
    for step, row in got.items():
        want = reference_rows[step]
        assert (row["epoch"], "eval_loss" in row) == (want["epoch"], "eval_loss" in want), step
        assert row["loss"] == pytest.approx(want["loss"], rel=1e-4), step
