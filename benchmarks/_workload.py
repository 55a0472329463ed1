"""The workload every launcher in ``launch.py`` runs, and the script torchrun starts.

A DDP MLP (256→512→512→10) on synthetic batches, timed on rank 0. Only the
launcher differs between the three ways: they share :func:`make_model`,
:func:`make_batches` and the loop body in :func:`run`.

As a script (under torchrun): ``_workload.py OUT_JSON STEPS``.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BATCH = 64  # samples per rank per step
N_BATCHES = 16  # distinct batches per rank, cycled
WARMUP_STEPS = 10  # excluded from steps/s


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(256, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 10),
    )


def make_batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed-seed inputs and labels, built up front so the loop only computes."""
    gen = torch.Generator().manual_seed(1000 + rank)
    return [
        (torch.randn(BATCH, 256, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen))
        for _ in range(N_BATCHES)
    ]


def run(
    model: nn.Module, loop: Iterable[tuple[int, Any]], log: Callable[..., None] | None = None
) -> dict[str, float]:
    """The shared loop body; ``loop`` yields ``(step, (x, y))``.

    Returns ``first_step`` (``time.time()`` when step 0 finished, comparable
    with the launching process's clock) and ``steps_per_s`` after warm-up.
    """
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    first_step = t_warm = t_end = 0.0
    done = 0
    for step, (x, y) in loop:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if log is not None:
            log(loss=loss)
        t_end = time.perf_counter()
        if step == 0:
            first_step = time.time()
        if step == WARMUP_STEPS - 1:
            t_warm = t_end  # the end of step 9 is where the timed steps begin
        done = step + 1
    return {"first_step": first_step, "steps_per_s": (done - WARMUP_STEPS) / (t_end - t_warm)}


def train_clustersdk(ctx: Any, steps: int) -> dict[str, float]:
    """clustersdk's training function; rank 0's return value is ``job.wait()``'s."""
    torch.set_num_threads(1)
    model = ctx.prepare(make_model())
    return run(model, ctx.loop(make_batches(ctx.rank), steps=steps), log=ctx.log)


def train_from_env(steps: int, out: str) -> None:
    """One rank under torchrun or notebook_launcher, which set RANK, MASTER_ADDR, ...

    Rank 0 writes its timings as JSON to ``out``.
    """
    torch.set_num_threads(1)  # torchrun's OMP_NUM_THREADS=1, made explicit for every launcher
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(make_model())
    loop = enumerate(itertools.islice(itertools.cycle(make_batches(rank)), steps))
    timings = run(model, loop)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(timings, f)
    # gloo objects alive at interpreter exit abort the process after backward
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    train_from_env(int(sys.argv[2]), sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
