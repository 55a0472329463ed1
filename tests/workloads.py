"""Training functions the tests launch, and their single-process references."""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import torch
from torch import nn

from clustersdk.checkpoint_files import is_url
from clustersdk.runtime.checkpoint import storage
from clustersdk.runtime.checkpoint.storage import FileStorage, ObjectStorage, Writer

N, D_IN, D_OUT = 512, 8, 2


def dataset(seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D_IN, generator=g)
    w = torch.randn(D_IN, D_OUT, generator=g)
    return torch.utils.data.TensorDataset(x, x @ w + 0.1 * torch.randn(N, D_OUT, generator=g))


def model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(D_IN, 16), nn.Tanh(), nn.Linear(16, D_OUT))


def train_mlp(ctx, steps: int = 20, batch_size: int = 16, lr: float = 0.05) -> dict:
    """Plain DDP regression; rank 0 returns its final parameters and losses."""
    net = ctx.prepare(model())
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    ctx.register(optimizer=opt)
    losses = []
    for _step, (x, y) in ctx.loop(ctx.shard(dataset(), batch_size=batch_size), steps=steps):
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.log(loss=loss)
        losses.append(loss.item())
    params = {k.removeprefix("module."): v.detach().clone() for k, v in net.state_dict().items()}
    return {"params": params, "losses": losses, "rank": ctx.rank}


def reference_mlp(world_size: int, steps: int = 20, batch_size: int = 16, lr: float = 0.05) -> dict:
    """One process, the same global batches: what DDP on ``world_size`` ranks must equal."""
    data = dataset()
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    G = batch_size * world_size
    per_epoch = N // G
    for step in range(steps):
        epoch, b = divmod(step, per_epoch)
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(epoch)).tolist()
        x, y = data[perm[b * G : (b + 1) * G]]
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def fail_at(ctx, rank: int = 1, step: int = 3) -> None:
    """DDP training where one rank raises at one step; the others are mid-collective."""
    net = ctx.prepare(model())
    for s, (x, y) in ctx.loop(ctx.shard(dataset(), batch_size=8), steps=50):
        if ctx.rank == rank and s == step:
            raise ValueError(f"boom at step {s} on rank {ctx.rank}")
        nn.functional.mse_loss(net(x), y).backward()


def spin(ctx, steps: int = 1_000_000, sleep: float = 0.01) -> dict:
    """Runs until stopped; returns the step each rank stopped at."""
    print(f"rank {ctx.rank} starting on {ctx.device}")
    logging.getLogger("workload").warning("rank %d says hello through logging", ctx.rank)
    for step, _ in ctx.loop(None, steps=steps):
        time.sleep(sleep)
        ctx.log(value=float(step))
    return {"stopped_at": ctx.step, "stopped": ctx.stopped}


def chatty(ctx) -> str:
    print(f"hello from rank {ctx.rank} of {ctx.world_size}")
    print("partial line without newline", end="")
    logging.getLogger("workload").warning("a warning from rank %d", ctx.rank)
    return "done"


def ckpt_model(hidden: int = 16, dropout: float = 0.1) -> nn.Module:
    torch.manual_seed(99)
    return nn.Sequential(
        nn.Linear(D_IN, hidden), nn.Tanh(), nn.Dropout(dropout), nn.Linear(hidden, D_OUT)
    )


def train_ckpt(
    ctx,
    steps: int = 60,
    delay: float = 0.0,
    hidden: int = 16,
    dropout: float = 0.1,
    batch_size: int = 16,
) -> dict:
    """AdamW + LR schedule + dropout: resuming is exact only if every piece of state is restored."""
    net = ctx.prepare(ckpt_model(hidden, dropout))
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5)
    ctx.register(optimizer=opt, scheduler=sched)
    for _step, (x, y) in ctx.loop(ctx.shard(dataset(), batch_size=batch_size), steps=steps):
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        ctx.log(loss=loss)
        if delay:
            time.sleep(delay)
    params = {k.removeprefix("module."): v.detach().clone() for k, v in net.state_dict().items()}
    return {"params": params, "optim": opt.state_dict(), "step": ctx.step}


def break_start_once(dask_worker) -> None:
    """Make this worker refuse the next rank it is asked to start (as a worker that
    died but was not yet removed would), then behave again."""
    original = dask_worker.handlers["clustersdk_start_rank"]

    def refuse(**kwargs):
        dask_worker.handlers["clustersdk_start_rank"] = original
        raise OSError("injected: this worker could not start the rank")

    dask_worker.handlers["clustersdk_start_rank"] = refuse


def prepared(ctx, prepare: tuple, fn, *args, **kwargs):
    """``fn(ctx, *args, **kwargs)`` after ``prepare`` (``(callable, args)``) ran in the rank's
    process: how a test changes what a rank does (a fault to inject, a slow copy). It
    changes that rank's process alone, which ends with the job."""
    call, call_args = prepare
    call(*call_args)
    return fn(ctx, *args, **kwargs)


def slow_staging(delay: float | None) -> None:
    """Make every async save's background copy start ``delay`` s late (None: undo), so
    that a step that does not wait for the copy would change the tensors under it."""
    from torch.distributed.checkpoint.staging import DefaultStager

    original = DefaultStager.__dict__.get("_clustersdk_original", DefaultStager._stage)
    if delay is None:
        DefaultStager._stage = original
        return

    def late(self, state_dict, **kwargs):
        time.sleep(delay)
        return original(self, state_dict, **kwargs)

    DefaultStager._clustersdk_original = original
    DefaultStager._stage = late


def ticker(ctx, steps: int = 1_000_000, sleep: float = 0.02) -> int:
    """A checkpointable DDP job that runs until stopped: a loss every step, and
    ``tick N on rank R`` printed every 5 steps (the CLI's and the lab panel's tests)."""
    model = ctx.prepare(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx.register(optimizer=opt)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for step, _ in ctx.loop(None, steps=steps):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 5 == 0:
            print(f"tick {step} on rank {ctx.rank}")
        ctx.log(loss=loss.item())
        time.sleep(sleep)
    return ctx.step


def hang_at(
    ctx,
    rank: int = 1,
    step: int = 5,
    steps: int = 1000,
    marker: str | None = None,
    sleep: float = 0.02,
) -> int:
    """A checkpointable DDP job whose ``rank`` gets stuck for good at ``step`` (as in a
    stuck data loader): its peers then wait in their next collective. With ``marker``
    (a path) it gets stuck only once: the restarted job goes on."""
    model = ctx.prepare(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx.register(optimizer=opt)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for s, _ in ctx.loop(None, steps=steps):
        if ctx.rank == rank and s == step and not (marker and os.path.exists(marker)):
            if marker:
                open(marker, "w").close()
            stuck_for_good()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.log(loss=loss.item())
        time.sleep(sleep)
    return ctx.step


def stuck_for_good() -> None:
    while True:
        time.sleep(3600)


def count_to(ctx, steps: int = 12) -> str:
    """Logs ``value`` = step / 2 for ``steps`` steps."""
    for step, _ in ctx.loop(None, steps=steps):
        ctx.log(value=float(step) / 2)
    return "done"


# --- a checkpoint storage that kills its process at a chosen point of a save ----------------
FAULT_POINTS = ("staged", "data", "metadata", "manifest", "rename", "committed")
_armed: dict = {}


def inject_fault(point: str | None, nth: int = 1, ranks: tuple[int, ...] | None = None) -> None:
    """SIGKILL this process the ``nth`` time a save reaches ``point`` (None: disarm), by
    making its saves use :func:`faulty_storage`; only in the rank processes of ``ranks``
    when given (``RANK``). Points, in save order: ``FAULT_POINTS`` (under a URL, "rename"
    comes after the manifest: an object store's commit)."""
    _armed.clear()
    if ranks is not None and int(os.environ.get("RANK", "-1")) not in ranks:
        return
    if point is None:
        storage.override(None)
        return
    assert point in FAULT_POINTS, point
    _armed.update(point=point, left=nth)
    storage.override(faulty_storage)


def _reach(point: str) -> None:
    if _armed.get("point") == point:
        _armed["left"] -= 1
        if _armed["left"] <= 0:
            os.kill(os.getpid(), signal.SIGKILL)


class FaultyWrites:
    """Mixed into a DCP writer: dies after its data, or after DCP's metadata."""

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        future.wait()  # the data is on disk when the process dies
        _reach("data")
        return future

    def finish(self, metadata, results):
        super().finish(metadata, results)
        _reach("metadata")


class FaultyWriter(FaultyWrites, Writer):
    pass


class FaultyCommits:
    """Mixed into a storage: dies at the points of a save and of its commit."""

    def writer(self, path):
        _reach("staged")  # the state is collected; nothing is written yet
        return self.faulty_writer(path)

    def write_manifest(self, tmp, step, world_size):
        _reach("manifest")
        super().write_manifest(tmp, step, world_size)

    def publish(self, tmp, final):
        _reach("rename")
        super().publish(tmp, final)
        _reach("committed")


class FaultyStorage(FaultyCommits, FileStorage):
    def faulty_writer(self, path):
        return FaultyWriter(path, sync_files=True, thread_count=2)


class FaultyObjectStorage(FaultyCommits, ObjectStorage):
    def faulty_writer(self, path):
        writer = type("FaultyObjectWriter", (FaultyWrites, storage.object_writer()), {})
        return writer(path, sync_files=False, thread_count=2)


def faulty_storage(root: str):
    """The storage of ``root`` (a directory or a URL), dying where ``inject_fault`` said."""
    return FaultyObjectStorage() if is_url(root) else FaultyStorage()


def raise_once(marker: str | None, rank: int, step: int) -> None:
    """Raise if the file ``marker`` (``{"rank": r, "step": s}``) asks this rank to, at
    step ``s`` or later; the file is removed first, so it happens once."""
    if not marker or not os.path.exists(marker):
        return
    try:
        with open(marker) as f:
            order = json.load(f)
    except (OSError, ValueError):  # removed by its rank just now, or half written
        return
    if order["rank"] == rank and step >= order["step"]:
        os.remove(marker)
        raise RuntimeError(f"injected: rank {rank} raises at step {step}")


def train_exact(
    ctx,
    kind: str = "mlp",
    steps: int = 24,
    global_batch: int = 24,
    stop_at: int | None = None,
    delay: float = 0.0,
    dropout: float = 0.1,
    n_experts: int = 0,
    n_layers: int = 2,
    raise_marker: str | None = None,
) -> dict | None:
    """The exactness tests' job, under any strategy; rank 0 returns the whole state.

    ``kind="mlp"``: the small MLP of :func:`ckpt_model` (dropout), AdamW and a step
    schedule, in a plain ``loss.backward(); opt.step()`` loop. ``kind="lm"``: the
    reference transformer (``n_experts`` > 0: mixture-of-experts blocks), AdamW and
    warm-up + cosine over ``steps``, through ``ctx.train_step``. Every layout sees
    the same ``global_batch`` samples per step. ``stop_at`` ends the loop early
    (the schedule still spans ``steps``). ``raise_marker``: see :func:`raise_once`.
    """
    from clustersdk import models

    batch_size = global_batch // ctx.dp_size
    if kind == "mlp":
        net = ctx.prepare(ckpt_model(dropout=dropout), loss_fn=nn.functional.mse_loss)
        data = dataset()
        opt = torch.optim.AdamW(net.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
    else:
        net = ctx.prepare(
            models.Transformer(n_layers=n_layers, n_experts=n_experts), loss_fn=models.lm_loss
        )
        data = models.SyntheticText(n=256, seq_len=16, vocab=64, seed=0)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
        from clustersdk import warmup_cosine

        sched = warmup_cosine(opt, warmup=3, total=steps)
    ctx.register(optimizer=opt, scheduler=sched)
    for _step, (x, y) in ctx.loop(ctx.shard(data, batch_size=batch_size), steps=stop_at or steps):
        raise_once(raise_marker, ctx.rank, _step)
        if kind == "mlp":
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        else:
            loss = ctx.train_step(opt, x, y)
        sched.step()
        ctx.log(loss=loss)
        if delay:
            time.sleep(delay)
    return {"state": ctx.full_state_dict(opt), "step": ctx.step}


# --- requests asked before a job's first step (tests/test_early_requests.py) ----------------
def final_loss(ctx, steps: int = 10) -> dict:
    """As the README's example: the code after the loop needs a step's ``loss``."""
    net = ctx.prepare(model())
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    ctx.register(optimizer=opt)
    for _step, (x, y) in ctx.loop(ctx.shard(dataset(), batch_size=16), steps=steps):
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.log(loss=loss)
    return {"final_loss": loss.item()}


def slow_start(delay: float | None, dask_worker=None) -> None:
    """Make this worker start each rank ``delay`` s late (None: undo), so that a job stays
    STARTING for that long: what a kernel's request right after launch meets."""
    import asyncio

    key = "clustersdk_start_rank"
    original = getattr(dask_worker, "_clustersdk_start_rank", None) or dask_worker.handlers[key]
    if delay is None:
        dask_worker.handlers[key] = original
        return
    dask_worker._clustersdk_start_rank = original

    async def late(comm=None, **kwargs):  # the handler, as Dask calls it (the comm first)
        await asyncio.sleep(delay)
        result = original(comm, **kwargs)
        return await result if asyncio.iscoroutine(result) else result

    dask_worker.handlers[key] = late
