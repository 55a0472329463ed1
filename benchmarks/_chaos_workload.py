"""The job ``chaos.py`` soaks: the exactness tests' DDP MLP, with a hook that makes a rank raise.

A copy of ``tests/workloads.py::train_exact`` (``kind="mlp"``) with dropout 0:
AdamW and a step LR schedule, ``ctx.shard`` over a TensorDataset, so that a run
resumed from any checkpoint at the same world size ends bitwise equal to the
uninterrupted one. ``raise_marker`` names a file the soak writes
(``{"rank": r, "step": s}``): that rank removes it and raises at step ``s`` or
the first step after, once.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
from torch import nn

N, D_IN, D_OUT = 512, 8, 2


class InjectedFault(RuntimeError):
    """What a rank raises when the soak asks it to."""


def dataset(seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D_IN, generator=g)
    w = torch.randn(D_IN, D_OUT, generator=g)
    return torch.utils.data.TensorDataset(x, x @ w + 0.1 * torch.randn(N, D_OUT, generator=g))


def model(hidden: int = 16) -> nn.Module:
    torch.manual_seed(99)
    return nn.Sequential(nn.Linear(D_IN, hidden), nn.Tanh(), nn.Linear(hidden, D_OUT))


def maybe_raise(marker: str | None, rank: int, step: int) -> None:
    """Raise once if ``marker`` asks this rank to at this step (or an earlier one)."""
    if not marker or not os.path.exists(marker):
        return
    try:
        with open(marker) as f:
            order = json.load(f)
    except (OSError, ValueError):  # being written right now: next step
        return
    if order.get("rank") == rank and step >= order.get("step", 0):
        os.remove(marker)
        raise InjectedFault(f"chaos: rank {rank} raises at step {step}")


def train(
    ctx: Any,
    steps: int = 200,
    global_batch: int = 24,
    delay: float = 0.0,
    raise_marker: str | None = None,
) -> dict[str, Any]:
    """Rank 0 returns the whole state (model, optimizer) and the step reached."""
    torch.set_num_threads(1)
    net = ctx.prepare(model(), loss_fn=nn.functional.mse_loss)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=25, gamma=0.9)
    ctx.register(optimizer=opt, scheduler=sched)
    batch_size = global_batch // ctx.dp_size
    for step, (x, y) in ctx.loop(ctx.shard(dataset(), batch_size=batch_size), steps=steps):
        maybe_raise(raise_marker, ctx.rank, step)
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        ctx.log(loss=loss)
        if delay:
            time.sleep(delay)
    return {"state": ctx.full_state_dict(opt), "step": ctx.step}
