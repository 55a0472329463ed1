"""The model-parallel tests' training function and its single-process reference.

One function trains the reference transformer under any strategy; the
reference trains the same model in one process on the same *global* batches
(see :mod:`clustersdk.layout`): ``perm[b*G:(b+1)*G]`` of the loader's seeded
permutation, ``G = batch_size * dp_size``.
"""

from __future__ import annotations

import torch

import clustersdk as cs
from clustersdk import models

N_SAMPLES = 256


def data() -> models.SyntheticText:
    return models.SyntheticText(n=N_SAMPLES, seq_len=16, vocab=64, seed=0)


class SkewedText(torch.utils.data.Dataset):
    """``n`` token sequences of 2 to ``max_len`` tokens, most of them short (a long tail,
    as real text has): ``(inputs, targets, index)``, the targets shifted by one."""

    def __init__(self, n: int = 200, max_len: int = 16, vocab: int = 64, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        u = torch.rand(n, generator=g)
        self.lengths = (2 + ((max_len - 1) * u**4).long()).clamp(max=max_len).tolist()
        start = torch.randint(0, vocab, (n, 1), generator=g)
        stride = torch.randint(1, 8, (n, 1), generator=g)
        self.tokens = (start + stride * torch.arange(max_len + 1)) % vocab

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):  # noqa: ANN204
        n = self.lengths[i]
        return self.tokens[i, :n], self.tokens[i, 1 : n + 1], torch.tensor(i)


def make_model(n_experts: int = 0, n_layers: int = 2) -> models.Transformer:
    return models.Transformer(n_layers=n_layers, n_experts=n_experts)


def make_optimizer(params, lr: float, steps: int, warmup: int):  # noqa: ANN001
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    return opt, cs.warmup_cosine(opt, warmup=warmup, total=steps)


def train_lm(
    ctx,
    steps: int = 10,
    batch_size: int = 8,
    lr: float = 1e-2,
    n_experts: int = 0,
    n_layers: int = 2,
    warmup: int = 3,
    launch_model: bool = False,
) -> dict | None:
    """Every strategy: the reference transformer, AdamW, warm-up + cosine, ctx.train_step.

    ``launch_model``: build the model given to ``cluster.launch(model=...)`` instead.
    """
    module = None if launch_model else make_model(n_experts, n_layers)
    model = ctx.prepare(module, loss_fn=models.lm_loss)
    opt, sched = make_optimizer(model.parameters(), lr, steps, warmup)
    ctx.register(optimizer=opt, scheduler=sched)
    for _step, (x, y) in ctx.loop(ctx.shard(data(), batch_size=batch_size), steps=steps):
        loss = ctx.train_step(opt, x, y)
        sched.step()
        ctx.log(loss=loss)
    return ctx.full_state_dict(opt)


def reference_lm(
    global_batch: int,
    steps: int = 10,
    lr: float = 1e-2,
    n_experts: int = 0,
    n_layers: int = 2,
    warmup: int = 3,
    precision: str = "fp32",
    clip: float | None = None,
) -> dict:
    """One process, whole global batches: what every layout must reproduce."""
    dataset = data()
    model = make_model(n_experts, n_layers)
    opt, sched = make_optimizer(model.parameters(), lr, steps, warmup)
    per_epoch, losses = N_SAMPLES // global_batch, []
    for step in range(steps):
        epoch, b = divmod(step, per_epoch)
        perm = torch.randperm(N_SAMPLES, generator=torch.Generator().manual_seed(epoch)).tolist()
        x, y = dataset[perm[b * global_batch : (b + 1) * global_batch]]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = models.lm_loss(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {
        "losses": losses,
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def probe_accumulation(ctx) -> list | None:
    """Where gradients stand after each micro-batch of one step, on every rank.

    For each micro-batch: how many parameters have a gradient, and the sum of
    the head's gradient (None when it has none), gathered to rank 0.
    """
    import torch.distributed as dist

    model = ctx.prepare(make_model(), loss_fn=models.lm_loss)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for _step, (x, y) in ctx.loop(ctx.shard(data(), batch_size=8), steps=1):
        for mx, my in ctx.micro_batches(x, y):
            with ctx.autocast():
                loss = models.lm_loss(model(mx), my)
            ctx.backward(loss)
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            params = dict(model.named_parameters())
            head = params.get("head.weight", params.get("module.head.weight"))  # DDP: module.
            local = head.grad.to_local() if hasattr(head.grad, "to_local") else head.grad
            seen.append((len(grads), None if local is None else float(local.sum())))
        ctx.optimizer_step(opt)
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, seen)
    return everyone


def train_own_loop(ctx, steps: int = 3) -> None:
    """Forward/backward written by hand, ignoring ctx's training features."""
    model = ctx.prepare(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _step, (x, y) in ctx.loop(ctx.shard(data(), batch_size=8), steps=steps):
        models.lm_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def read_budget(ctx, steps: int | None = None, epochs: int = 1, budget: int = 48) -> list | None:
    """Token-budget batches of :class:`SkewedText`, no model: every rank's sample ids per
    step, gathered to rank 0 (a checkpoint holds the loader's position alone)."""
    import torch.distributed as dist

    data = ctx.shard(SkewedText(n=120), tokens_per_batch=budget, pad=(0, -100, -1))
    seen = []
    for _step, (_x, _y, idx) in ctx.loop(data, steps=steps, epochs=epochs):
        seen.append(idx.tolist())
    everyone: list = [None] * ctx.world_size
    dist.all_gather_object(everyone, seen)
    return everyone if ctx.rank == 0 else None


def train_budget(ctx, steps: int = 6, budget: int = 128) -> list | None:
    """The reference transformer on token-budget batches of :class:`SkewedText` (whose
    lengths vary from batch to batch) through ``ctx.train_step``: each rank's batch sizes
    and sequence lengths, gathered to rank 0."""
    import torch.distributed as dist

    model = ctx.prepare(make_model(), loss_fn=models.lm_loss)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ctx.register(optimizer=opt)
    data = ctx.shard(SkewedText(n=200), tokens_per_batch=budget, pad=(0, -100, -1))
    shapes = []
    for _step, (x, y, _idx) in ctx.loop(data, steps=steps):
        ctx.log(loss=ctx.train_step(opt, x, y))
        shapes.append(tuple(x.shape))
    everyone: list = [None] * ctx.world_size
    dist.all_gather_object(everyone, shapes)
    return everyone if ctx.rank == 0 else None
