"""The reference transformer, its mixture of experts and the synthetic data."""

from __future__ import annotations

import pytest
import torch

from clustersdk import SpecError, models


def test_same_config_same_weights_and_the_global_rng_is_left_alone():
    torch.manual_seed(7)
    before = torch.rand(3)
    torch.manual_seed(7)
    a, b = models.Transformer(n_layers=2), models.Transformer(n_layers=2)
    assert torch.equal(torch.rand(3), before)
    for (key, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), key
    assert not torch.equal(a.head.weight, models.Transformer(seed=1).head.weight)


def test_forward_is_the_chain_of_its_children():
    net = models.Transformer(n_layers=3)
    x, _ = models.SyntheticText(n=4)[[0, 1]]
    h = x
    for name in net.pipeline_chain():
        h = net.get_submodule(name)(h)
    assert torch.equal(h, net(x))
    assert net.pipeline_chain() == ["embed", "layers.0", "layers.1", "layers.2", "norm", "head"]


def test_a_small_model_learns_the_synthetic_text():
    data = models.SyntheticText(n=256, seed=3)
    net = models.Transformer(n_layers=2)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    x, y = data[list(range(64))]
    first = models.lm_loss(net(x), y).item()
    for _ in range(60):
        loss = models.lm_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < 0.5 * first


def test_moe_routes_each_token_to_one_expert():
    torch.manual_seed(0)
    moe = models.MoE(d_model=8, hidden=16, n_experts=4)
    x = torch.randn(2, 5, 8)
    gate, expert = moe.router(x.reshape(-1, 8)).softmax(-1).max(-1)
    by_token = torch.stack(
        [
            torch.nn.functional.gelu(t @ moe.w1[e]) @ moe.w2[e] * g
            for t, e, g in zip(x.reshape(-1, 8), expert, gate)
        ]
    ).reshape(x.shape)
    torch.testing.assert_close(moe(x), by_token)


def test_tp_plan_refuses_what_it_cannot_split():
    assert models.Transformer().tp_plan(2)["layers.*.attn.o"] == "rowwise"
    with pytest.raises(SpecError, match="n_heads=4 attention heads can't be split over tp=8"):
        models.Transformer().tp_plan(8)
    with pytest.raises(SpecError, match="no tensor-parallel plan for mixture-of-experts"):
        models.Transformer(n_experts=2).tp_plan(2)


def test_bad_config_is_named():
    with pytest.raises(SpecError, match="d_model=30 must be a multiple of n_heads=4"):
        models.TransformerConfig(d_model=30)
