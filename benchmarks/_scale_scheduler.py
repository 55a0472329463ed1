"""The Dask scheduler of ``benchmarks/scale.py``, in a process of its own (its CPU and
memory are what the benchmark reports), with an event-loop lag probe.

The control plane is installed by scale.py's ``Cluster.connect``, as on any cluster.
Two handlers are added for the benchmark:

- ``scale_probe(reset)``: the lags seen since the last reset (seconds each
  :data:`PROBE_S` sleep overran by), and this process's id;
- ``scale_profile(path)``: start cProfile (``path`` None) or stop it and write its
  stats to ``path``.

Prints ``ready ADDRESS`` once it listens.
"""

from __future__ import annotations

import asyncio
import collections
import cProfile
import gc
import os
import sys
import threading
import time
import traceback
from typing import Any

from distributed import Scheduler

PROBE_S = 0.02  # the probe's sleep: Dask's own tick measures the same interval


STUCK_S = 0.2  # a loop busy this long: where it is gets noted (by a thread of its own)


class Probe:
    def __init__(self) -> None:
        self.lags: list[float] = []
        self.profile: cProfile.Profile | None = None
        self.beat = time.perf_counter()
        self.stuck: collections.Counter[str] = collections.Counter()
        self.gc_pauses: list[tuple[int, float]] = []  # (generation, seconds) of each collection
        self._gc_t0 = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc_pauses.append((info["generation"], time.perf_counter() - self._gc_t0))

    async def run(self) -> None:
        loop_thread = threading.get_ident()
        threading.Thread(target=self.watch, args=(loop_thread,), daemon=True).start()
        while True:
            t0 = self.beat = time.perf_counter()
            await asyncio.sleep(PROBE_S)
            self.lags.append(max(time.perf_counter() - t0 - PROBE_S, 0.0))

    def watch(self, loop_thread: int) -> None:
        """Where the loop is when it has not come back for STUCK_S (a sample every 0.1 s)."""
        while True:
            time.sleep(0.1)
            if time.perf_counter() - self.beat > STUCK_S:
                frame = sys._current_frames().get(loop_thread)
                where = traceback.format_stack(frame, limit=12) if frame is not None else []
                self.stuck["".join(where[-6:])] += 1

    def read(self, reset: bool = False) -> dict[str, Any]:
        lags, stuck = self.lags, dict(self.stuck.most_common(5))
        full = [t for g, t in self.gc_pauses if g == 2]
        collected = {
            "gc_seconds": sum(t for _, t in self.gc_pauses),
            "gc_full": len(full),
            "gc_full_max_s": max(full, default=0.0),
            "gc_objects": len(gc.get_objects()),
        }
        if reset:
            self.lags = []
            self.stuck.clear()
            self.gc_pauses = []
        return {"lags": lags, "pid": os.getpid(), "stuck": stuck, **collected}

    def toggle_profile(self, path: str | None = None) -> bool:
        if path is None:
            self.profile = cProfile.Profile()
            self.profile.enable()
            return True
        if self.profile is not None:
            self.profile.disable()
            self.profile.dump_stats(path)
            self.profile = None
        return False


async def main() -> None:
    probe = Probe()
    scheduler = Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address=None)
    scheduler.handlers["scale_probe"] = probe.read
    scheduler.handlers["scale_profile"] = probe.toggle_profile
    await scheduler
    asyncio.get_running_loop().create_task(probe.run())
    print("ready", scheduler.address, flush=True)
    await scheduler.finished()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
