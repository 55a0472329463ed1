"""The training functions job.run and job.update are tried on, the functions job.run
sends, and a single-process reference of the training loop."""

from __future__ import annotations

import time

import torch
from torch import nn

from . import workloads as W


def grad_norm(model: nn.Module) -> torch.Tensor:
    return torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))


def probe(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss of the model as it is now on this rank's last batch (no gradients)."""
    with torch.no_grad():
        return nn.functional.mse_loss(model(x), y)


def train_live(
    ctx,
    steps: int = 60,
    batch_size: int = 8,
    lr: float = 0.05,
    delay: float = 0.0,
    switch_at: int | None = None,
    new_lr: float | None = None,
    scale_at: int | None = None,
    new_scale: float | None = None,
    train_step: bool = False,
) -> dict:
    """DDP regression with SGD and momentum. Every step logs its loss, the gradient's norm
    and a probe (the loss of the stepped model on the rank's batch), and exposes the batch;
    gradients stay until the next step (zeroed at its start). ``ctx.hparams["scale"]``
    (1 without hparams) scales the loss. ``switch_at``/``scale_at``: the reference that
    changes lr / scale itself at that step on every rank. ``train_step``: through
    ``ctx.train_step`` (grad_accum, clip_grad_norm apply)."""
    net = ctx.prepare(W.model(), loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    ctx.register(optimizer=opt)
    for step, (x, y) in ctx.loop(ctx.shard(W.dataset(), batch_size=batch_size), steps=steps):
        if step == switch_at:
            for group in opt.param_groups:
                group["lr"] = new_lr
        if step == scale_at:
            ctx.hparams["scale"] = new_scale
        scale = ctx.hparams.get("scale", 1.0)
        if train_step:
            loss = ctx.train_step(opt, x, y * scale)
            norm = torch.tensor(0.0)
        else:
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y) * scale
            loss.backward()
            opt.step()
            norm = grad_norm(net)
        ctx.expose(batch=(x, y))
        ctx.log(
            loss=loss,
            grad_norm=norm,
            probe=probe(net, x, y),
            lr=opt.param_groups[0]["lr"],
            accum=ctx.options["grad_accum"],
            clip=ctx.options["clip_grad_norm"] or 0.0,
        )
        if delay:
            time.sleep(delay)
    params = {k.removeprefix("module."): v.detach().clone() for k, v in net.state_dict().items()}
    return {
        "params": params,
        "optim": opt.state_dict(),
        "step": ctx.step,
        "hparams": dict(ctx.hparams),
        "lr": opt.param_groups[0]["lr"],
    }


def reference_live(
    world_size: int,
    steps: int = 60,
    batch_size: int = 8,
    lr: float = 0.05,
    switch_at: int | None = None,
    new_lr: float | None = None,
) -> dict:
    """One process, the same global batches as ``train_live`` on ``world_size`` ranks."""
    data, net = W.dataset(), W.model()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    g = batch_size * world_size
    per_epoch = W.N // g
    for step in range(steps):
        if step == switch_at:
            for group in opt.param_groups:
                group["lr"] = new_lr
        epoch, b = divmod(step, per_epoch)
        perm = torch.randperm(W.N, generator=torch.Generator().manual_seed(epoch)).tolist()
        x, y = data[perm[b * g : (b + 1) * g]]
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


# --- what job.run sends ----------------------------------------------------------------------
def stats(ctx) -> dict:
    """What the training function logged at its last step, computed again from the live
    model: the gradient's norm and the probe on the exposed batch."""
    x, y = ctx.exposed["batch"]
    return {
        "step": ctx.step,
        "grad_norm": float(grad_norm(ctx.model)),
        "probe": float(probe(ctx.model, x, y)),
    }


def rank_sum(ctx) -> int:
    """A collective inside job.run: every rank must run it at the same boundary."""
    import torch.distributed as dist

    total = torch.tensor([ctx.rank])
    dist.all_reduce(total)
    return int(total)


def boom_on_1(ctx) -> int:
    if ctx.rank == 1:
        raise ValueError(f"boom on rank {ctx.rank} at step {ctx.step}")
    return ctx.rank


def nap(ctx) -> int:
    time.sleep(3.0)
    return ctx.rank
