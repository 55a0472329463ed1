"""How a rank's process can start warm: the mechanisms side by side, on this machine.

Each way runs the same small rank (an MLP's forward, backward and SGD step in torch) as
a new unit of execution, and is timed from the request to the rank's step done:

- **thread in a warm process**: what clustersdk did before rank processes (a rank was a
  thread of its Dask worker): the lower bound, without isolation;
- **fork of a warm zygote**: a single-threaded process with torch imported forks the
  rank (clustersdk's ``runtime/zygote.py``); the rank then pays its first step cold;
- **zygote + spare**: a rank process forked and warmed up ahead waits for its job
  (what a clustersdk worker keeps per slot); the request is one message to it;
- **multiprocessing forkserver**: Python's own fork server with torch preloaded (its
  children cannot start from a daemonic Dask worker, and it passes no file
  descriptors: shown for its speed);
- **a fresh interpreter**: ``python -c``, as torchrun and multiprocessing's spawn start
  each rank: it imports torch every time.

It also reports what each way keeps resident per slot while idle (PSS, which splits
shared pages between the processes that share them) and, for the ways that keep a
process ahead, how long the next one takes to be ready after one was used.

    python benchmarks/rank_start.py              # 15 rounds
    python benchmarks/rank_start.py --rounds 3   # smoke run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

IMPORTS = "import torch, torch.distributed, torch._dynamo"
WARM_UP_AFTER_S = 0.5  # clustersdk.runtime.inside's: a spare warms up once idle this long


def step() -> None:
    """The rank's work: one training step of a small MLP."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy(net(torch.randn(32, 64)), torch.randint(0, 4, (32,)))
    loss.backward()
    opt.step()


def warm_up() -> None:
    """What a spare rank process does while it waits (as clustersdk's does)."""
    import torch

    state = torch.get_rng_state()
    step()
    torch.set_rng_state(state)


# --- the ways ------------------------------------------------------------------------------------
def by_thread() -> float:
    t0 = time.perf_counter()
    worker = threading.Thread(target=step)
    worker.start()
    worker.join()
    return time.perf_counter() - t0


class Zygote:
    """A single-threaded warm process that forks a rank per request (``spare``: one
    forked ahead and warmed up, waiting on a pipe)."""

    def __init__(self, spare: bool):
        self.spare = spare
        self.requests_r, self.requests_w = os.pipe()
        self.done_r, self.done_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            self._serve()
        os.read(self.done_r, 1)  # warm

    def _serve(self) -> None:
        import gc

        import torch  # noqa: F401
        import torch._dynamo  # noqa: F401

        gc.collect()
        gc.freeze()
        os.write(self.done_w, b"r")
        waiting = self._fork_spare() if self.spare else None
        while os.read(self.requests_r, 1) == b"f":
            if waiting is not None:  # the spare runs the rank; the next one is forked
                os.write(waiting[1], b"g")
                os.close(waiting[1])
                waiting = self._fork_spare()
            else:
                if os.fork() == 0:
                    step()
                    os.write(self.done_w, b"d")
                    os._exit(0)
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
        if waiting is not None:
            os.write(waiting[1], b"q")
        os._exit(0)

    def _fork_spare(self) -> tuple[int, int]:
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            import select

            os.close(go_w)
            if not select.select([go_r], [], [], WARM_UP_AFTER_S)[0]:
                warm_up()  # idle a while: warm up (as clustersdk's spare does)
            if os.read(go_r, 1) == b"g":
                step()
                os.write(self.done_w, b"d")
            os._exit(0)
        os.close(go_r)
        return pid, go_w

    def run(self) -> float:
        t0 = time.perf_counter()
        os.write(self.requests_w, b"f")
        os.read(self.done_r, 1)
        return time.perf_counter() - t0

    def close(self) -> None:
        os.write(self.requests_w, b"q")  # (other processes hold this pipe too: no EOF)
        os.waitpid(self.pid, 0)


def _forkserver_rank(done: Any) -> None:
    step()
    done.set()


class ForkServer:
    def __init__(self) -> None:
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["torch", "torch._dynamo"])
        self.done = self.context.Event()
        self.run()  # starts the server and imports torch there

    def run(self) -> float:
        self.done.clear()
        t0 = time.perf_counter()
        proc = self.context.Process(target=_forkserver_rank, args=(self.done,))
        proc.start()
        self.done.wait()
        took = time.perf_counter() - t0
        proc.join()
        return took


def by_interpreter() -> float:
    code = f"{IMPORTS}\nimport sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
    code += "import rank_start; rank_start.step()"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


# --- what a slot keeps while idle -----------------------------------------------------------------
def pss_mb(pids: list[int]) -> float:
    import psutil

    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except psutil.Error:
            pass
    return total / 2**20


def interpreter_pss() -> float:
    """What a spare interpreter kept per slot holds (torch imported, waiting)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"{IMPORTS}\nimport sys; print('ready', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return pss_mb([proc.pid])
    finally:
        proc.kill()
        proc.wait()


def spare_refill() -> tuple[float, float]:
    """How long a zygote takes to fork a warmed-up spare, and a fresh interpreter to be
    ready (imports done): what a slot waits after its process was used."""
    zygote_ready = []
    for _ in range(3):
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            warm_up()
            os._exit(0)
        os.waitpid(pid, 0)
        zygote_ready.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], check=True)
    return statistics.median(zygote_ready), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (default 15)")
    parser.add_argument("--json", metavar="PATH", help="also write the medians here")
    args = parser.parse_args(argv)
    import torch  # noqa: F401 - this process is the warm one the thread runs in
    import torch._dynamo  # noqa: F401

    torch.set_num_threads(1)
    zygote, spare = Zygote(spare=False), Zygote(spare=True)
    server = ForkServer()
    by_thread()  # warm: "a job has run before"
    ways: dict[str, Callable[[], float]] = {
        "thread in a warm process": by_thread,
        "fork of a warm zygote": zygote.run,
        "zygote + spare": spare.run,
        "multiprocessing forkserver": server.run,
        "a fresh interpreter": by_interpreter,
    }
    times: dict[str, list[float]] = {way: [] for way in ways}
    try:
        for i in range(args.rounds):
            order = list(ways)[i % len(ways) :] + list(ways)[: i % len(ways)]
            for way in order:
                times[way].append(ways[way]())
        idle = {
            "fork of a warm zygote": pss_mb([zygote.pid]),
            "zygote + spare": pss_mb(_family(spare.pid)),
            "a spare interpreter": interpreter_pss(),
        }
    finally:
        zygote.close()
        spare.close()
    refill, interpreter_ready = spare_refill()
    medians = {way: statistics.median(t) for way, t in times.items()}
    base = medians["thread in a warm process"]
    print(
        f"\nrequest to a rank's first step done, median of {args.rounds} rounds (1 torch thread)\n"
    )
    print(f"{'way':<30}{'ms':>9}{'vs thread':>11}")
    for way, value in medians.items():
        print(f"{way:<30}{1000 * value:>9.1f}{value / base:>10.1f}x")
    print("\nkept per slot while idle (PSS):")
    for way, value in idle.items():
        print(f"  {way:<28}{value:>8.0f} MB")
    print("\nready again after one was used:")
    print(f"  zygote: a warmed-up spare forked in    {1000 * refill:8.1f} ms")
    print(f"  a fresh interpreter imports torch in   {1000 * interpreter_ready:8.1f} ms")
    out = {
        "ms": {w: round(1000 * v, 2) for w, v in medians.items()},
        "idle_pss_mb": {w: round(v, 1) for w, v in idle.items()},
        "refill_ms": {
            "zygote spare": round(1000 * refill, 1),
            "interpreter": round(1000 * interpreter_ready, 1),
        },
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


def _family(pid: int) -> list[int]:
    import psutil

    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return [pid]


if __name__ == "__main__":
    main()
