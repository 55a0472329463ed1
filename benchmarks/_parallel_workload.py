"""The training code ``parallel.py`` times under clustersdk and under torchrun.

One function, :func:`train`, runs every strategy through ``ctx.prepare`` and
``ctx.train_step``; under torchrun this file builds the ``TrainContext``
itself, so both launchers run the very same code and only the launcher
differs. :func:`memory` measures what each rank holds.

As a script (under torchrun): ``_parallel_workload.py OUT_JSON STEPS CASES_JSON``,
where CASES_JSON is a list of ``{"name", "strategy", "spec"}``; rank 0 writes
``{name: {"steps_per_s": ...}}``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from clustersdk import models

CONFIG = models.TransformerConfig(vocab=256, d_model=64, n_heads=4, n_layers=4, seq_len=32)
MEMORY_CONFIG = models.TransformerConfig(vocab=1024, d_model=256, n_heads=8, n_layers=4, seq_len=32)
BATCH = 8  # samples per data-parallel rank per step
WARMUP_STEPS = 5  # left out of steps/s
# token budgets against fixed batches: longer sequences, most of them short
TOKENS_CONFIG = models.TransformerConfig(vocab=256, d_model=64, n_heads=4, n_layers=2, seq_len=128)


def make_model(strategy: str, config: models.TransformerConfig = CONFIG) -> models.Transformer:
    n_experts = 4 if strategy == "ep" else 0
    return models.Transformer(config, n_experts=n_experts)


def train(ctx: Any, steps: int) -> dict[str, float]:
    """Steps/s on rank 0 after warm-up, for the job's strategy."""
    torch.set_num_threads(1)
    model = ctx.prepare(make_model(ctx.strategy), loss_fn=models.lm_loss)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx.register(optimizer=opt)
    data = models.SyntheticText(n=4096, seq_len=CONFIG.seq_len, vocab=CONFIG.vocab)
    t_warm = t_end = 0.0
    done = 0
    for step, (x, y) in ctx.loop(ctx.shard(data, batch_size=BATCH), steps=steps):
        ctx.log(loss=ctx.train_step(opt, x, y))
        t_end = time.perf_counter()
        if step == WARMUP_STEPS - 1:
            t_warm = t_end
        done = step + 1
    return {"steps_per_s": (done - WARMUP_STEPS) / (t_end - t_warm)}


class SkewedLengths(torch.utils.data.Dataset):
    """``n`` token sequences whose lengths follow a long-tailed (log-normal) law: median
    about a fifth of ``max_len``, a few up to ``max_len``. ``(inputs, targets)``."""

    def __init__(self, n: int = 4096, max_len: int = 128, vocab: int = 256, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        raw = torch.exp(torch.randn(n, generator=g) * 0.8) * max_len / 5
        self.lengths = raw.round().long().clamp(4, max_len).tolist()
        start = torch.randint(0, vocab, (n, 1), generator=g)
        stride = torch.randint(1, 8, (n, 1), generator=g)
        self.tokens = (start + stride * torch.arange(max_len + 1)) % vocab

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.lengths[i]
        return self.tokens[i, :n], self.tokens[i, 1 : n + 1]


def train_tokens(ctx: Any, steps: int, budget: bool) -> dict[str, float] | None:
    """The reference transformer on :class:`SkewedLengths`: fixed batches of ``BATCH``
    samples, or (``budget``) batches of at most ``BATCH x seq_len`` padded tokens (the
    same worst case). Rank 0 returns steps/s, real tokens/s of all ranks and the padding
    fraction, after warm-up."""
    from clustersdk.runtime.budget import pad_collate

    torch.set_num_threads(1)
    config = TOKENS_CONFIG
    model = ctx.prepare(models.Transformer(config), loss_fn=models.lm_loss)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx.register(optimizer=opt)
    data = SkewedLengths(max_len=config.seq_len, vocab=config.vocab)
    if budget:
        loader = ctx.shard(data, tokens_per_batch=BATCH * config.seq_len, pad=(0, -100))
    else:
        loader = ctx.shard(data, batch_size=BATCH, collate_fn=pad_collate((0, -100)))
    real, padded = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    t_warm = t_end = 0.0
    done = 0
    for step, (x, y) in ctx.loop(loader, steps=steps):
        ctx.log(loss=ctx.train_step(opt, x, y))
        t_end = time.perf_counter()
        if step == WARMUP_STEPS - 1:
            t_warm = t_end
        elif step >= WARMUP_STEPS:
            real += (y != -100).sum()
            padded += y.numel()
        done = step + 1
    totals = torch.stack([real, padded])
    if ctx.world_size > 1:
        dist.all_reduce(totals)
    seconds = t_end - t_warm
    if ctx.rank != 0:
        return None
    return {
        "steps_per_s": (done - WARMUP_STEPS) / seconds,
        "tokens_per_s": float(totals[0]) / seconds,
        "padding": 1 - float(totals[0] / totals[1]),
        "tokens_per_step": float(totals[0]) / (done - WARMUP_STEPS),
    }


def memory(ctx: Any, steps: int = 3) -> list[dict[str, int]] | None:
    """Per rank: bytes of parameters, gradients and optimizer state this rank holds,
    at their peak (after backward, before the optimizer step frees the gradients;
    from the second step on, when AdamW's moments exist). FSDP's one gathered
    block at a time is working memory, not counted."""
    torch.set_num_threads(1)
    model = ctx.prepare(make_model(ctx.strategy, MEMORY_CONFIG), loss_fn=models.lm_loss)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = models.SyntheticText(n=256, seq_len=MEMORY_CONFIG.seq_len, vocab=MEMORY_CONFIG.vocab)
    peak = {"params": 0, "grads": 0, "optim": 0}
    for _step, (x, y) in ctx.loop(ctx.shard(data, batch_size=2), steps=steps):
        for mx, my in ctx.micro_batches(x, y):
            ctx.backward(models.lm_loss(model(mx), my))
        now = {
            "params": _bytes(model.parameters()),
            "grads": _bytes(p.grad for p in model.parameters() if p.grad is not None),
            "optim": _bytes(
                v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)
            ),
        }
        if sum(now.values()) > sum(peak.values()):
            peak = now
        ctx.optimizer_step(opt)
    if torch.cuda.is_available():
        peak["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, peak)
    return everyone if ctx.rank == 0 else None


def _bytes(tensors: Any) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def main(out: str, steps: int, cases: list[dict[str, Any]]) -> None:
    """Under torchrun: every case in turn on one process group, as clustersdk would run it."""
    from clustersdk.protocol import WireSpec
    from clustersdk.runtime.context import TrainContext

    torch.set_num_threads(1)  # torchrun's OMP_NUM_THREADS=1, made explicit
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for case in cases:
        ctx = TrainContext(
            job="torchrun",
            name=case["name"],
            rank=rank,
            world_size=world,
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            device=torch.device("cpu"),
            strategy=case["strategy"],
            spec=WireSpec(
                id="torchrun",
                name=case["name"],
                world_size=world,
                strategy=case["strategy"],
                **case.get("spec", {}),
            ),
        )
        results[case["name"]] = train(ctx, steps)
        del ctx
        gc.collect()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    gc.collect()  # gloo objects alive at interpreter exit abort the process after backward
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
