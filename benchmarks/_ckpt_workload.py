"""The training function ``checkpoint.py`` launches: a DDP MLP with AdamW, timed on rank 0.

One fixed synthetic batch per rank, so a step is only compute and the DDP
all-reduce. :func:`make_model` sizes the network; :func:`train` records when
each step starts, so that the time ``ctx.loop`` spends between two steps (the
control checks, and the checkpoint saved at a boundary before step ``s``) can
be read off as ``starts[s] - starts[s - 1]`` minus an ordinary step.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn


def make_model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def param_bytes(width: int, depth: int) -> int:
    return 4 * depth * (width * width + width)  # float32 weights and biases


def sized(model_mb: float) -> dict[str, int]:
    """:func:`train`'s model and batch: three square layers of about ``model_mb`` MB."""
    width = max(64, round(math.sqrt(model_mb * 1e6 / 4 / 3) / 64) * 64)
    return {"width": width, "depth": 3, "batch": 16}


def train(ctx: Any, width: int, depth: int, batch: int, steps: int) -> dict[str, Any]:
    """Rank 0 returns ``{"first": step, "starts": [perf_counter at the start of each step]}``."""
    torch.set_num_threads(1)  # one core per rank, as under torchrun
    model = ctx.prepare(make_model(width, depth))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ctx.register(optimizer=opt)
    gen = torch.Generator().manual_seed(ctx.rank)
    x, y = torch.randn(batch, width, generator=gen), torch.randn(batch, width, generator=gen)
    first, starts = ctx.step, []
    for _step, _ in ctx.loop(None, steps=steps):
        starts.append(time.perf_counter())
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ctx.log(loss=loss)
    return {"first": first, "starts": starts}
