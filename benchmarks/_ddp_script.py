"""A plain torchrun-style DDP script (benchmarks/scripts.py runs it both ways, unmodified):
init from the environment, DistributedSampler, prints its loss; rank 0 saves the final
parameters. No clustersdk in it.

    python _ddp_script.py --steps 200 --out params.pt
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} up", flush=True)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    model = DDP(
        torch.nn.Sequential(
            torch.nn.Linear(256, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 10),
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 0 or step == args.steps - 1:
                print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
            step += 1
            if step >= args.steps:
                break
        epoch += 1
    if rank == 0 and args.out:
        torch.save(model.module.state_dict(), args.out)
    dist.barrier()
    del model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
