"""A DDP script that saves and resumes by itself: every step's batch is a function of the
step, so a run that stops, saves and comes back ends where an uninterrupted one does.

    --control   opt into clustersdk.script's step boundaries (pause, checkpoint, stop)
    --sigterm   save on SIGTERM and exit 0 (no clustersdk in the script: Slurm's way)
    --sleep S   seconds per step (so a test can act mid-run)
    --out PATH  rank 0 writes the final parameters there

Checkpoints go to $CLUSTERSDK_CHECKPOINT_DIR (or --dir): state.pt, written atomically.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from clustersdk import script


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--control", action="store_true")
    parser.add_argument("--sigterm", action="store_true")
    parser.add_argument("--dir", default=os.environ.get("CLUSTERSDK_CHECKPOINT_DIR"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} pid {os.getpid()} restart {script.restarts()}", flush=True)
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    path = os.path.join(args.dir, "state.pt") if args.dir else None
    start = 0
    if path and os.path.exists(path):
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"rank {rank} resumed at step {start}", flush=True)

    def save(step: int) -> str | None:
        if path is None:
            return None
        if rank == 0:
            tmp = path + ".tmp"
            torch.save(
                {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, tmp
            )
            os.replace(tmp, path)
        dist.barrier()
        return path

    stop = {"asked": False}
    if args.sigterm:
        signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))

    step = start
    while step < args.steps:
        x, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
        script.log(step=step, loss=loss.item())
        if args.sleep:
            time.sleep(args.sleep)
        if args.control:
            todo = script.step(step, saves=True)
            if todo.checkpoint:
                script.saved(save(step), step=step)
            if todo.stop:
                print(f"rank {rank} leaves at step {step}", flush=True)
                return 0
        if args.sigterm:
            # every rank learns of the signal at its own moment: agree on it at each step
            flag = torch.tensor([int(stop["asked"])])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                save(step)
                print(f"rank {rank} saved on SIGTERM at step {step}", flush=True)
                return 0
    if rank == 0 and args.out:
        torch.save(model.module.state_dict(), args.out)
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    dist.destroy_process_group()
    sys.exit(code)
