"""Training features and strategy helpers that need no process group."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import clustersdk as cs
from clustersdk import models
from clustersdk.errors import SpecError
from clustersdk.runtime import training
from clustersdk.runtime.strategies import fsdp, pipeline, tensor


def test_warmup_cosine_rises_then_decays_to_the_floor_and_resumes():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = cs.warmup_cosine(opt, warmup=4, total=12, min_ratio=0.1)
    lrs = []
    for _ in range(13):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert lrs[4] == pytest.approx(2.0) and lrs[8] == pytest.approx(0.2 + 1.8 * 0.5)
    assert lrs[12] == pytest.approx(0.2)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    again = cs.warmup_cosine(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0), 4, 12, 0.1)
    again.load_state_dict(sched.state_dict())
    assert again.get_last_lr() == sched.get_last_lr()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"warmup": -1, "total": 5}, "warmup must be a non-negative int"),
        ({"warmup": 5, "total": 5}, "total must be an int greater than warmup=5"),
        ({"warmup": 1, "total": 5, "min_ratio": 2}, r"min_ratio must be within \[0, 1\]"),
    ],
)
def test_warmup_cosine_names_bad_arguments(kwargs, match):
    with pytest.raises(SpecError, match=match):
        cs.warmup_cosine(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), **kwargs)


def test_clipping_in_one_process_matches_torch():
    torch.manual_seed(0)
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    (a(torch.randn(4, 8)) ** 2).sum().backward()
    for p, q in zip(a.parameters(), b.parameters()):
        q.grad = p.grad.clone()
    norm = training.clip_grad_norm_(a.parameters(), 0.1, replicated=1)
    expected = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.1)
    torch.testing.assert_close(norm, expected)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_micro_batches_must_divide_the_batch():
    x, y = torch.zeros(6, 2), torch.zeros(6)
    assert [len(p[0]) for p in training.split((x, y), 3)] == [2, 2, 2]
    with pytest.raises(SpecError, match="grad_accum=4 must divide this rank's batch of 6"):
        training.split((x, y), 4)


def test_fp16_needs_cuda_on_the_rank_too():
    with pytest.raises(SpecError, match="precision='fp16' needs CUDA .* this rank runs on cpu"):
        training.Precision("fp16", torch.device("cpu"))
    with training.Precision("bf16", torch.device("cpu")).autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_fsdp_blocks_are_the_layers_innermost_first_or_what_the_policy_says():
    net = models.Transformer(n_layers=3)
    assert fsdp.blocks(net) == [net.layers[2], net.layers[1], net.layers[0]]
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    assert fsdp.blocks(seq) == [seq[2], seq[0]]
    assert fsdp.blocks(net, policy=nn.LayerNorm)[0] is net.norm
    assert fsdp.blocks(net, policy=lambda m: m is net.head) == [net.head]


@pytest.mark.parametrize(
    "layers, stages, expected",
    [
        (4, 2, [["embed", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "head"]]),
        (3, 2, [["embed", "layers.0", "layers.1"], ["layers.2", "norm", "head"]]),
        (2, 2, [["embed", "layers.0"], ["layers.1", "norm", "head"]]),
    ],
)
def test_pipeline_spreads_the_layers_evenly(layers, stages, expected):
    assert pipeline.stage_names(models.Transformer(n_layers=layers), stages) == expected


def test_pipeline_stages_keep_parameter_names_and_compose_to_the_model():
    net = models.Transformer(n_layers=4)
    names = pipeline.stage_names(net, 2, split=["layers.3"])
    assert names[1] == ["layers.3", "norm", "head"]
    stages = [pipeline.Stage(net, n) for n in names]
    assert set(stages[0].state_dict()) | set(stages[1].state_dict()) == set(net.state_dict())
    x, _ = models.SyntheticText(n=2)[[0, 1]]
    assert torch.equal(stages[1](stages[0](x)), net(x))


def test_pipeline_refuses_what_it_cannot_split():
    with pytest.raises(SpecError, match="build this rank's stage yourself"):
        pipeline.stage_names(nn.Linear(2, 2), 2)
    with pytest.raises(SpecError, match="needs at least 3 layers, but Sequential has 2"):
        pipeline.stage_names(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), 3)


def test_tensor_plan_checks_names_and_divisibility():
    net = models.Transformer()
    tensor.check(net, net.tp_plan(2), 2)
    with pytest.raises(
        SpecError,
        match=r"layers.0.mlp.fc1 \(colwise\) splits a dimension of 128, "
        "which does not divide over tp=3",
    ):
        tensor.check(net, {"layers.*.mlp.fc1": "colwise"}, 3)
    with pytest.raises(SpecError, match="use 'colwise', 'rowwise' or a ParallelStyle"):
        tensor.plan_for(net, {"head": "diagonal"}, 2)
