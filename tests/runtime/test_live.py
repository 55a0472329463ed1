"""``job.run`` and ``job.update`` on a rank, in one process (:mod:`clustersdk.runtime.live`,
:mod:`clustersdk.runtime.tuning`): what a function sees and what its failures become, what
an update changes, and ``ctx.hparams`` in checkpoints. End to end, on clusters:
``tests/test_live.py``."""

from __future__ import annotations

import cloudpickle
import pytest
import torch

import clustersdk as cs
from clustersdk.runtime import live as rank_live
from clustersdk.runtime import tuning
from clustersdk.runtime.context import TrainContext


def _context(**hparams) -> TrainContext:
    from clustersdk.protocol import WireSpec

    spec = WireSpec(id="t", name="t", world_size=1, hparams=hparams or None)
    return TrainContext(
        job="t",
        name="t",
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        strategy="none",
        spec=spec,
    )


def tunables(ctx: TrainContext) -> tuning.Tunables:
    """What job.update's optimizer keys change on ``ctx``'s rank."""
    return tuning.Tunables(rank=ctx.rank, stateful=ctx.stateful, hparams=ctx.hparams)


def test_lr_under_a_scheduler_sets_its_base_and_keeps_its_factor():
    ctx = _context()
    net = ctx.prepare(torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    sched = cs.warmup_cosine(opt, warmup=4, total=20)
    ctx.register(optimizer=opt, scheduler=sched)
    for _ in range(2):
        opt.step()
        sched.step()
    factor = opt.param_groups[0]["lr"] / 1.0
    [change] = tuning.plan(tunables(ctx), {"lr": 0.1}, None)
    assert (change.key, change.old, change.new) == ("lr", 1.0, 0.1)
    change.apply()
    assert sched.base_lrs == [0.1] and opt.param_groups[0]["lr"] == pytest.approx(0.1 * factor)
    opt.step()
    sched.step()  # the schedule goes on from the new base
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * sched.lr_lambdas[0](3))
    assert tuning.plan(tunables(ctx), {"lr": 0.1}, None) == []  # already in place: nothing to do


def test_hparams_live_in_the_checkpoint_and_are_restored_in_place():
    ctx = _context(warmup=10)
    held = ctx.hparams
    state = ctx.stateful[rank_live.HPARAMS_KEY].state_dict()
    held["warmup"] = 99
    ctx.stateful[rank_live.HPARAMS_KEY].load_state_dict(state)
    assert ctx.hparams is held and held == {"warmup": 10}
    assert "clustersdk_hparams" not in ctx.registered  # not the user's


def test_a_function_is_called_and_its_failures_come_back_as_errors():
    ctx = _context()
    assert (
        cloudpickle.loads(
            rank_live.call(cloudpickle.dumps(lambda c: c.rank + 1), ctx, 1000)["result"]
        )
        == 1
    )
    err = rank_live.call(cloudpickle.dumps(lambda c: [][1]), ctx, 1000)["error"]
    assert err["type"] == "IndexError" and "rank_live" not in err["traceback"]
    assert (
        rank_live.call(cloudpickle.dumps(lambda c: "x" * 5000), ctx, 1000)["error"]["type"]
        == "ResultTooLarge"
    )
    exit_ = rank_live.call(cloudpickle.dumps(lambda c: exit(3)), ctx, 1000)["error"]
    assert exit_["type"] == "SystemExit"  # a function's exit() does not end the rank


def test_ctx_exposes_the_model_what_was_registered_and_what_the_function_exposed():
    ctx = _context()
    assert ctx.model is None and dict(ctx.registered) == {}
    net = ctx.prepare(torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctx.register(optimizer=opt)
    assert ctx.model is net and dict(ctx.registered) == {"model": net, "optimizer": opt}
    ctx.expose(batch=1, loss=2.0)
    ctx.expose(batch=3)
    assert dict(ctx.exposed) == {"batch": 3, "loss": 2.0}
    with pytest.raises(TypeError):
        ctx.registered["x"] = 1  # read-only
