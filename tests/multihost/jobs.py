"""Training functions of the multi-host tests (shipped by value: tests/ is not on the
workers' path)."""

from __future__ import annotations

import os
import socket

import torch

ENV_NAMES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "NCCL_IB_DISABLE",
    "NCCL_BUFFSIZE",
    "X_CLUSTER",
)


def report_env(ctx) -> dict:
    """Each rank's network environment, gathered over the job's process group."""
    t = torch.ones(1)
    torch.distributed.all_reduce(t)  # the group works: every rank reached every other
    mine = {
        "env": {n: os.environ.get(n) for n in ENV_NAMES},
        "hostname_resolves_to": socket.gethostbyname(socket.gethostname()),
    }
    gathered = [None] * ctx.world_size
    torch.distributed.all_gather_object(gathered, mine)
    return {"ranks": gathered, "sum": t.item()}


def slurm_env(ctx) -> list:
    """The GPU and the Slurm job of each rank."""
    mine = {n: os.environ.get(n) for n in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID")}
    gathered = [None] * ctx.world_size
    torch.distributed.all_gather_object(gathered, mine)
    return gathered
