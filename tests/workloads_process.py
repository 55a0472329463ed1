"""Training functions for the rank-process tests: ranks that crash, exit, get killed,
install signal handlers, and leave globals behind."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import types

import torch
from torch import nn

from . import workloads


def left_behind() -> dict:
    """A module of the rank's process (registered in ``sys.modules``, as any imported
    module is) whose global one job sets and the next looks for. (This file's own
    globals come with each job's pickled function, anew.)"""
    module = sys.modules.setdefault("clustersdk_test_left", types.ModuleType("left"))
    if not hasattr(module, "LEFT"):
        module.LEFT = {}
    return module.LEFT


def crash_at(ctx, how: str = "segfault", rank: int = 1, step: int = 5, steps: int = 40) -> dict:
    """DDP training in which ``rank`` ends its own process at ``step`` (``segfault``,
    ``exit3``: ``os._exit(3)``, ``wait``: sits there until something kills it), on the
    first gang start only (``TORCHELASTIC_RESTART_COUNT`` 0); it says when, and its pid,
    just before. Rank 0 returns its parameters."""
    net = ctx.prepare(workloads.model())
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    ctx.register(optimizer=opt)
    first_start = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    data = ctx.shard(workloads.dataset(), batch_size=16)
    for s, (x, y) in ctx.loop(data, steps=steps):
        if first_start and ctx.rank == rank and s == step:
            print(f"ending at {time.time():.6f} pid {os.getpid()}", flush=True)
            if how == "segfault":
                ctypes.string_at(0)
            elif how == "exit3":
                os._exit(3)
            else:
                while True:
                    time.sleep(1)
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.log(loss=loss)
    params = {k.removeprefix("module."): v.detach().clone() for k, v in net.state_dict().items()}
    return {"params": params, "step": ctx.step}


def first_step_at(ctx) -> float:
    """When this rank finished its first step (``time.time()``)."""
    for _ in ctx.loop(None, steps=1):
        pass
    return time.time()


def process_facts(ctx) -> dict:
    """What a rank's process looks like from inside: its thread, a signal handler it
    installs, torchrun's variables, and a global an earlier job may have left."""
    caught = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: caught.append(True))
    os.kill(os.getpid(), signal.SIGUSR1)
    deadline = time.time() + 5
    while not caught and time.time() < deadline:
        time.sleep(0.01)
    signal.signal(signal.SIGUSR1, previous)
    names = (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
    )
    facts = {
        "rank": ctx.rank,
        "pid": os.getpid(),
        "main_thread": threading.current_thread() is threading.main_thread(),
        "signal_handled": bool(caught),
        "env": {name: os.environ.get(name) for name in names},
        "left_behind": sorted(left_behind()),
    }
    left_behind()["job"] = ctx.name
    gathered = [None] * ctx.world_size
    torch.distributed.all_gather_object(gathered, facts)
    return {"ranks": gathered}


def hold_memory(ctx, megabytes: int = 64) -> int:
    """Allocates ``megabytes`` and leaves them (and a thread, and an open file) behind."""
    left = left_behind()
    left.setdefault("blobs", []).append(bytearray(megabytes * 2**20))
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    left.setdefault("files", []).append(open(os.devnull))  # noqa: SIM115 - left open
    for _ in ctx.loop(None, steps=2):
        pass
    return os.getpid()
