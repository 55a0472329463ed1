"""Training functions for the epoch, evaluation, data and misuse tests."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset

N, D = 240, 4


def samples(n: int = N) -> TensorDataset:
    """Sample ``i`` is ``(i, x_i, y_i)``: the id lets a test see which samples a step had."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, D, generator=g)
    return TensorDataset(torch.arange(n), x, x.sum(1, keepdim=True))


class Stream(IterableDataset):
    """The same samples as :func:`samples`, as a stream without a length."""

    def __init__(self, n: int = N):
        self.n = n

    def __iter__(self):
        ids, x, y = samples(self.n).tensors
        return iter(zip(ids, x, y))


def hf_stream(n: int = N):
    import datasets

    ids, x, y = samples(n).tensors
    rows = [{"id": int(i), "x": xi.tolist(), "y": yi.tolist()} for i, xi, yi in zip(ids, x, y)]
    return datasets.IterableDataset.from_generator(lambda: iter(rows)).with_format("torch")


def source(kind: str, path: str | None):
    if kind == "map":
        return samples()
    if kind == "parquet":
        return path
    if kind == "stream":
        return Stream()
    return hf_stream()


def columns(batch):
    """(ids, x, y) of a batch from any of the sources."""
    if isinstance(batch, dict):
        return batch["id"], batch["x"].float(), batch["y"].float()
    return batch


def train_epochs(
    ctx,
    kind: str = "map",
    path: str | None = None,
    epochs: int = 3,
    batch_size: int = 8,
    delay: float = 0.0,
    evaluate: bool = True,
) -> dict:
    """SGD on a linear model for ``epochs``; every step logs its epoch and the sum of its
    global batch's sample ids (reduced over the ranks), every epoch's end an evaluation."""
    torch.manual_seed(0)
    net = ctx.prepare(nn.Linear(D, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    ctx.register(optimizer=opt)
    loader = ctx.shard(source(kind, path), batch_size=batch_size)
    planned = epochs * len(loader) if kind in ("map", "parquet") else None  # as scripts do
    for _step, batch in ctx.loop(loader, epochs=epochs):
        ids, x, y = columns(batch)
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.log(loss=loss, epoch=ctx.epoch)
        ctx.log(ids=float(ids.sum()), reduce="sum")  # the same row: one per step
        if evaluate and ctx.epoch_end:
            with torch.no_grad():
                for _ids, vx, vy in ctx.evaluate(samples(48), batch_size=4):
                    ctx.log(val_loss=nn.functional.mse_loss(net(vx), vy), reduce="mean")
        if delay:
            time.sleep(delay)
    params = {k.removeprefix("module."): v.detach().clone() for k, v in net.state_dict().items()}
    return {"planned": planned, "step": ctx.step, "epoch": ctx.epoch, "params": params}


def three_ranks_report(ctx, batches: int = 5) -> dict:
    """Each rank logs rank-specific values, reduced over the ranks: in an evaluation (over
    the pass), at once (max), and plain values in several calls of one step."""
    data = [torch.tensor(float(i)) for i in range(batches)]
    for step, _ in ctx.loop(None, steps=2):
        ctx.log(mine=float(ctx.rank))
        ctx.log(top=float(ctx.rank * 10 + step), reduce="max")
        for value in ctx.evaluate(data):
            ctx.log(score=value + ctx.rank, nothing=None, reduce="mean")
            ctx.log(total=value, reduce="sum")
            if ctx.rank == 0:  # a name the other ranks never log
                ctx.log(only0=7.0, reduce="mean")
        ctx.log(also=1.0)
    return {"step": ctx.step}


def long_evaluation(ctx, batches: int = 400, sleep: float = 0.02) -> dict:
    """Three steps; step 1 evaluates slowly, so that a pause or a stop reaches it there."""
    done = 0
    for step, _ in ctx.loop(None, steps=3):
        if step == 1:
            print(f"rank {ctx.rank} evaluating", flush=True)
            for _ in ctx.evaluate(range(batches)):
                time.sleep(sleep)
                done += 1
                ctx.log(seen=1.0, reduce="sum")
    return {"step": ctx.step, "evaluated": done, "stopped": ctx.stopped}


def optimizer_before_prepare(ctx, when: str = "before", steps: int = 8) -> dict:
    """The optimizer built before ctx.prepare ("before"), after it ("after"), or built and
    stepped before it ("stepped"); "stale-scheduler": a scheduler on a discarded optimizer."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=0.01) if when != "after" else None
    if when == "stepped":
        net(torch.ones(1, D)).sum().backward()
        opt.step()
        opt.zero_grad()
    sched = torch.optim.lr_scheduler.StepLR(opt, 2) if opt is not None else None
    initial = {k: v.detach().clone() for k, v in net.state_dict().items()}
    net = ctx.prepare(net)
    if when in ("after", "stale-scheduler"):
        opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    if sched is None:
        sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    ctx.register(optimizer=opt, scheduler=sched)
    losses = []
    for _step, (_ids, x, y) in ctx.loop(ctx.shard(samples(), batch_size=8), steps=steps):
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "state": ctx.full_state_dict(opt), "initial": initial}
