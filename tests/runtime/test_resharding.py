"""Checkpoints move between layouts: what one strategy and world size saves, another loads.

A source job trains 6 steps and checkpoints; a target job of another layout
resumes from that checkpoint and, with nothing left to train, gathers its
state. Parameters and optimizer state (AdamW moments, step counts, learning
rates) must be bitwise equal to what the source held: DCP moves bytes, it
does no arithmetic.
"""

from __future__ import annotations

import pytest
import torch

from clustersdk import checkpoint_files as ckpt

from .. import workloads_parallel as W

STEPS = 6
# name -> launch options of the source job
SOURCES = {
    "fsdp2": {"world_size": 2, "strategy": "fsdp"},
    "ddp2": {"world_size": 2, "strategy": "ddp"},
    "tp2": {"world_size": 2, "strategy": "tp"},
    "pp2": {"world_size": 2, "strategy": "pp"},
    "ep2": {"world_size": 2, "strategy": "ep"},
}
MOE = {"ep2": {"n_experts": 4}}


@pytest.fixture(scope="module")
def saved(cluster4, tmp_path_factory):
    """Each source trained and checkpointed once: name -> (checkpoint path, full state)."""
    out = {}
    for name, options in SOURCES.items():
        root = tmp_path_factory.mktemp(name)
        job = cluster4.launch(
            W.train_lm,
            kwargs={"steps": STEPS, **MOE.get(name, {})},
            checkpoint_dir=str(root),
            checkpoint_every=STEPS,
            **options,
        )
        state = job.wait(timeout=120)
        out[name] = (ckpt.latest(str(root)), state)
    return out


def assert_bitwise_equal(got: dict, want: dict) -> None:
    assert got["model"].keys() == want["model"].keys()
    for key, value in want["model"].items():
        assert torch.equal(got["model"][key], value), key
    state, expected = got["optim"]["state"], want["optim"]["state"]
    assert state.keys() == expected.keys() == want["model"].keys()
    for key, moments in expected.items():
        assert moments.keys() == state[key].keys()
        for name, value in moments.items():
            assert torch.equal(state[key][name], value), (key, name)
    assert got["optim"]["param_groups"] == want["optim"]["param_groups"]


@pytest.mark.parametrize(
    "source, target",
    [
        ("fsdp2", {"world_size": 1, "strategy": "fsdp"}),
        ("fsdp2", {"world_size": 4, "strategy": "fsdp"}),
        ("tp2", {"world_size": 4, "strategy": "fsdp", "mesh": {"dp": 2, "tp": 2}}),
        ("ddp2", {"world_size": 2, "strategy": "fsdp"}),
        ("fsdp2", {"world_size": 2, "strategy": "ddp"}),
        ("pp2", {"world_size": 2, "strategy": "tp"}),
        ("ep2", {"world_size": 1, "strategy": "ddp"}),
    ],
    ids=[
        "fsdp2-fsdp1",
        "fsdp2-fsdp4",
        "tp2-2d4",
        "ddp2-fsdp2",
        "fsdp2-ddp2",
        "pp2-tp2",
        "ep2-ddp1",
    ],
)
def test_a_checkpoint_loads_bitwise_into_another_layout(idle4, saved, tmp_path, source, target):
    path, want = saved[source]
    job = idle4.launch(
        W.train_lm,
        kwargs={"steps": STEPS, **MOE.get(source, {})},
        checkpoint_dir=str(tmp_path),
        resume=path,
        **target,
    )
    got = job.wait(timeout=120)
    assert f"resumed from {path} at step {STEPS}" in job.logs(0)
    assert_bitwise_equal(got, want)


def test_a_pipeline_resumes_from_a_pipeline_checkpoint_and_trains_on(idle4, saved, tmp_path):
    path, _ = saved["pp2"]
    job = idle4.launch(
        W.train_lm,
        kwargs={"steps": STEPS + 4},
        world_size=2,
        strategy="pp",
        schedule="1f1b",
        microbatches=2,
        checkpoint_dir=str(tmp_path),
        resume=path,
    )
    job.wait(timeout=120)
    assert [r["step"] for r in job.history()] == list(range(STEPS, STEPS + 4))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_checkpoints_hold_the_training_options_scaler_and_schedule(saved):
    import json

    import torch.distributed.checkpoint as dcp

    path, _ = saved["fsdp2"]
    keys = set(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
    assert {
        "extra.training.options",
        "extra.training.scaler",
        "extra.scheduler.last_epoch",
        "extra.scheduler.lr_lambdas.0.warmup",
        "extra.data.consumed",
    } <= keys
    state = {"extra": {"training": {"options": "", "scaler": b""}}}
    dcp.load(state, checkpoint_id=path, no_dist=True)
    options = json.loads(state["extra"]["training"]["options"])
    assert (options["precision"], options["grad_accum"], options["clip_grad_norm"]) == (
        "fp32",
        1,
        None,
    )
