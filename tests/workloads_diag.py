"""Training functions of the diagnosis tests: poisoned data, a rank that eats its memory.

Pickled by value (tests/ is not on the workers' path): see test_diagnosis.py.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from .workloads import dataset, model

BATCH = 16  # per rank


def poisoned(sample: int | None, x: float | None = None, y_scale: float | None = None):
    """The regression data with one sample spoiled: its input set to ``x`` (NaN makes the
    loss NaN) or its target scaled by ``y_scale`` (a loss spike)."""
    data = dataset()
    inputs, targets = (t.clone() for t in data.tensors)
    if sample is not None and x is not None:
        inputs[sample] = x
    if sample is not None and y_scale is not None:
        targets[sample] *= y_scale
    return torch.utils.data.TensorDataset(inputs, targets)


def train_poisoned(
    ctx,
    steps: int = 14,
    sample: int | None = None,
    x: float | None = None,
    y_scale: float | None = None,
    lr: float = 0.05,
    delay: float = 0.0,
    batch: int = BATCH,
) -> dict:
    """train_mlp on poisoned data, with a checkpointable optimizer; the steps it ran."""
    net = ctx.prepare(model())
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    ctx.register(optimizer=opt)
    ran = []
    for step, (inputs, targets) in ctx.loop(
        ctx.shard(poisoned(sample, x, y_scale), batch_size=batch), steps=steps
    ):
        loss = nn.functional.mse_loss(net(inputs), targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.log(loss=loss)
        ran.append(step)
        time.sleep(delay)
    return {"steps": ran, "finite": all(torch.isfinite(p).all().item() for p in net.parameters())}


def hog(ctx, rank: int = 1, at_step: int = 3, chunk_mb: int = 32, steps: int = 10_000) -> None:
    """Plain training, except that rank ``rank`` holds on to ever more host memory from
    step ``at_step`` on (written, so that it is resident), until its worker is killed."""
    held = []
    for step, _ in ctx.loop(None, steps=steps):
        if ctx.rank == rank and step >= at_step:
            held.append(torch.ones(chunk_mb << 18))  # float32: 4 bytes each
        time.sleep(0.01)


def serve_on(ctx, port: int) -> None:
    """Rank 0 listens on ``port`` (a store of its own), then both train a little."""
    if ctx.rank == 0:
        import datetime

        import torch.distributed as dist

        dist.TCPStore(
            "127.0.0.1",
            port,
            1,
            True,
            timeout=datetime.timedelta(seconds=5),
            wait_for_workers=False,
        )
    for _ in ctx.loop(None, steps=5):
        pass


def rendezvous_ports(value: str | None) -> None:
    """On a worker (client.run): the ports rank 0's store may listen on (None: any)."""
    import dask.config

    dask.config.set({"clustersdk.rendezvous-ports": value})


def nan_at(ctx, step: int = 2, steps: int = 5) -> None:
    """Logs a loss of 1.0 at every step but ``step``'s, which is NaN."""
    for s, _ in ctx.loop(None, steps=steps):
        ctx.log(loss=float("nan") if s == step else 1.0)
