"""The competitor of ``chaos.py --sigkill-runs``: the same MLP under ``torchrun --max-restarts``.

Run by torchrun (``python -m torch.distributed.run ... _torchrun_chaos.py DIR STEPS DELAY EVERY``):
DDP over gloo, rank 0 saves model and optimizer every EVERY steps (written to a
temporary file, then renamed), every rank resumes from that file when torchrun
restarts the group. Each rank writes its pid to ``DIR/pid-RANK`` and appends
``rank step time`` to ``DIR/steps-RANK`` after every step, which the benchmark
reads to time a kill's failure -> first step after (:func:`time_kill` drives one run).
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import tempfile
import time

import _chaos_workload as work
import torch
import torch.distributed as dist
from torch import nn


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
        x, y = data[lo : lo + per_rank]
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        log.write(f"{rank} {step} {time.time()} {os.getpid()}\n")
        if delay:
            time.sleep(delay)
        if (step + 1) % every == 0:
            if rank == 0:
                torch.save(
                    {"model": net.state_dict(), "optim": opt.state_dict(), "step": step + 1},
                    path + ".tmp",
                )
                os.replace(path + ".tmp", path)
            dist.barrier()
    dist.destroy_process_group()


def rows(out: str) -> list[tuple[int, int, float, int]]:
    """Every ``(rank, step, time, pid)`` the ranks logged so far."""
    found = []
    for name in os.listdir(out):
        if name.startswith("steps-"):
            with open(os.path.join(out, name)) as f:
                found += [
                    (int(a), int(b), float(c), int(d))
                    for a, b, c, d in (line.split() for line in f if line.count(" ") == 3)
                ]
    return found


def time_kill(
    base: str,
    world: int,
    steps: int,
    delay: float,
    every: int,
    trigger: int,
    victim: int,
    timeout: float = 90.0,
) -> dict:
    """One torchrun job (``--max-restarts 3``): SIGKILL rank ``victim`` at step ``trigger``;
    the seconds from the kill to the first step a restarted process logs, or a hang."""
    out = tempfile.mkdtemp(prefix="torchrun-", dir=base)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={world}",
        "--standalone",
        "--max-restarts=3",
        __file__,
        out,
        str(steps),
        str(delay),
        str(every),
    ]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}  # loopback only, as the cluster's ranks
    with open(os.path.join(out, "stderr"), "w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout
        while not any(r == victim and s >= trigger for r, s, _, _ in rows(out)):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"torchrun never reached step {trigger}: see {out}/stderr")
            time.sleep(0.05)
        before = {p for *_, p in rows(out)}
        with open(os.path.join(out, f"pid-{victim}")) as f:
            pid = int(f.read())
        t = time.time()
        os.kill(pid, signal.SIGKILL)
        try:
            rc, hung = proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            rc, hung = None, True
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: torchrun and its ranks
            proc.wait()
    after = [tm for _, _, tm, p in rows(out) if tm > t and p not in before]
    done = {r for r, s, _, _ in rows(out) if s == steps - 1}
    return {
        "recovery_s": min(after) - t if after else None,
        "rc": rc,
        "hung": hung,
        "finished": rc == 0 and len(done) == world,
    }


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
