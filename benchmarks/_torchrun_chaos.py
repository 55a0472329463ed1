"""The competitor of ``chaos.py --sigkill-runs``: the same MLP under ``torchrun --max-restarts``.

Run by torchrun (``python -m torch.distributed.run ... _torchrun_chaos.py DIR STEPS DELAY EVERY``):
DDP over gloo, rank 0 saves model and optimizer every EVERY steps (written to a
temporary file, then renamed), every rank resumes from that file when torchrun
restarts the group. Each rank writes its pid to ``DIR/pid-RANK`` and appends
``rank step time`` to ``DIR/steps-RANK`` after every step, which the benchmark
reads to time a kill's failure -> first step after.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import _chaos_workload as work


def main(out: str, steps: int, delay: float, every: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(os.path.join(out, f"pid-{rank}"), "w") as f:
        f.write(str(os.getpid()))
    net = nn.parallel.DistributedDataParallel(work.model())
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    path, start = os.path.join(out, "ckpt.pt"), 0
    if os.path.exists(path):
        saved = torch.load(path)
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        start = saved["step"]
    data = work.dataset()
    per_rank = 24 // world
    log = open(os.path.join(out, f"steps-{rank}"), "a", buffering=1)
    for step in range(start, steps):
        lo = (step * 24 + rank * per_rank) % (len(data) - per_rank)
        x, y = data[lo:lo + per_rank]
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        log.write(f"{rank} {step} {time.time()}\n")
        if delay:
            time.sleep(delay)
        if (step + 1) % every == 0:
            if rank == 0:
                torch.save({"model": net.state_dict(), "optim": opt.state_dict(),
                            "step": step + 1}, path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
