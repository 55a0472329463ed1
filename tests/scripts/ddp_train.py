"""A plain torchrun-style DDP script: init from the environment, DistributedSampler, print
the loss; no clustersdk in it. Runs as it is under `torchrun --nproc-per-node N` and under
`cluster.launch_script` (tests/test_scripts.py, benchmarks/scripts.py).

    python ddp_train.py --steps 20 --out params.pt
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
            step += 1
            if step >= args.steps:
                break
        epoch += 1
    if rank == 0 and args.out:
        torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()}, args.out)
    print(
        f"rank {rank} done env LOCAL_RANK={os.environ.get('LOCAL_RANK')} "
        f"RESTART={os.environ.get('TORCHELASTIC_RESTART_COUNT')}",
        flush=True,
    )
    dist.barrier()
    del model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
