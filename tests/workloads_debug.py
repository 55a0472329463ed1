"""Training functions of the hold and breakpoint tests (pickled by value: the test modules
register this module with cloudpickle, as conftest does for workloads.py)."""

from __future__ import annotations

import os

import torch
from torch import nn

from .workloads import dataset, model


def raise_at(
    ctx,
    rank: int = 1,
    step: int = 5,
    steps: int = 1000,
    marker: str | None = None,
    delay: float = 0.0,
) -> dict:
    """DDP training in which ``rank`` raises at ``step`` (once, with ``marker``: a file
    made when it does), with a long string and a tensor holding NaN among its locals."""
    import time

    net = ctx.prepare(model())
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    ctx.register(optimizer=opt)
    for s, (x, y) in ctx.loop(ctx.shard(dataset(), batch_size=8), steps=steps):
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.log(loss=loss)
        time.sleep(delay)
        if ctx.rank == rank and s == step and not (marker and os.path.exists(marker)):
            if marker:
                open(marker, "w").close()
            secret = "x" * 10_000  # noqa: F841 - a local the post-mortem cuts
            bad = torch.full((4, 4), float("nan"))  # noqa: F841 - shown with nan=True
            raise ValueError(f"bad batch at step {s} on rank {ctx.rank}")
    params = {k.removeprefix("module."): v.detach().clone() for k, v in net.state_dict().items()}
    return {"step": ctx.step, "params": params, "optim": opt.state_dict()}


def look_at_failure(ctx) -> dict:
    """What ``job.run`` sees on a held rank: the exception it is held for and the live
    locals of the frame that raised it."""
    tb = ctx.error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    local = tb.tb_frame.f_locals
    return {
        "error": type(ctx.error).__name__,
        "nans": int(torch.isnan(local["bad"]).sum()),
        "step": local["s"],
        "secret": len(local["secret"]),
        "params": sum(p.numel() for p in ctx.model.parameters()),
    }


def break_at(ctx, steps: int = 12, at: tuple = (3,), ranks: tuple = (0,)) -> dict:
    """DDP training with ``ctx.breakpoint(ranks)`` at the steps ``at``: locals ``x``
    (a float made from the step) and ``y`` (set on the line after the breakpoint)."""
    net = ctx.prepare(model())
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    seen = []
    for s, (xb, yb) in ctx.loop(ctx.shard(dataset(), batch_size=8), steps=steps):
        loss = nn.functional.mse_loss(net(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.log(loss=loss)
        if s in at:
            x = s * 7 + 0.5  # noqa: F841 - what `p x` shows
            ctx.breakpoint(ranks=list(ranks))
            y = x * 2  # noqa: F841 - what `n` then `p y` shows
            seen.append(s)
    return {"steps": ctx.step, "breaks": seen}


def break_always(ctx, steps: int = 200) -> int:
    """A breakpoint at every step: a job launched without debug=True never stops at one."""
    for _s, _ in ctx.loop(None, steps=steps):
        ctx.breakpoint()
    return ctx.step


def break_badly(ctx) -> None:
    """A breakpoint naming a rank the job does not have."""
    ctx.breakpoint(ranks=[ctx.world_size + 3])
