"""Simulated ranks for ``benchmarks/scale.py``: one process that hosts many fake workers.

What is real and what is simulated (the control plane sees the real protocol):

- Each fake worker has its own address: a listener of this process's one
  ``distributed.core.Server`` (one event loop, one set of Dask's periodic
  callbacks for all of them). A call arriving on a listener is routed by the
  address it came in on to that worker's **real** :class:`clustersdk.runtime.agent.Agent`
  handlers (``control``, ``stacks``, ``console``); ``open_store`` hands out a port
  without a TCPStore behind it, and ``start_rank`` makes a :class:`SimRank`
  instead of starting a rank thread. Each fake worker registers its slot with
  ``Op.WORKER_READY`` and talks to the scheduler through its own
  ``distributed.core.rpc`` (its own connections, as a worker process has).
  It is not a Dask worker: Dask's own per-worker traffic (heartbeats, the
  worker's batched stream) is not simulated.
- A :class:`SimRank` is the real :class:`~clustersdk.runtime.rank.Rank` (its outbox,
  its ``due``/``drain`` batching, the beacon, the log sink) with no process: this
  process's one driver ends its steps. Each step
  lasts ``step_s`` seconds and logs a loss through a real
  :class:`~clustersdk.runtime.metrics.Metrics` (and a real
  :class:`~clustersdk.runtime.phases.PhaseClock` times it). The agent's real
  ``flush`` and ``send`` ship what a rank logged, at the job's metrics interval.
  A telemetry sample is a fixed GPU-shaped sample (what NVML would give), so
  that no rank pays for reading ``/proc`` 4,096 times a second here.
- No process group: the ranks act on the control words each one holds at its
  own step boundary (real ranks first agree on them with one all-reduce, so a
  real pause also waits for the slowest rank's boundary).

Run by scale.py (``python _scale_ranks.py SCHEDULER COUNT FIRST STEP_S``); it
prints ``ready ADDRESS`` once every fake worker registered, where ``ADDRESS`` is
the host's stats listener (``scale_stats``).
"""

from __future__ import annotations

import asyncio
import heapq
import math
import os
import sys
import time
from typing import Any

from distributed.core import Server, rpc

from clustersdk.protocol import ExitStatus, Op, RankEvent, WireSpec, Word, op
from clustersdk.runtime.agent import Agent
from clustersdk.runtime.control_words import Control
from clustersdk.runtime.metrics import Metrics
from clustersdk.runtime.phases import PhaseClock
from clustersdk.runtime.rank import Rank

GPUS_PER_HOST = 8
TICK_S = 0.005  # how often the driver looks for steps that ended
FLUSH_S = 0.05  # the agent's FLUSH_MS: how often each agent looks for metrics to ship
SAMPLE = {
    "source": "nvml",
    "gpu_util": 97.0,
    "gpu_mem_used": 6.1e10,
    "gpu_mem_total": 8.1e10,
    "gpu_temp": 61.0,
    "gpu_power": 612.0,
}


class CannedSampler:
    """A GPU-shaped telemetry sample without reading the device."""

    def sample(self) -> dict[str, Any]:
        return dict(SAMPLE)


class SimContext:
    """What the agent reads of a rank's TrainContext: step, phase, ticks, spec, rows."""

    def __init__(self, rank: int, spec: WireSpec, first_step: int):
        self.spec = spec
        self.step = first_step
        self.ticks = 0
        self.phase = "setup"
        self.metrics = Metrics(rank, spec.world_size, None)
        self.clock = PhaseClock(enabled=True)

    def drain_rows(self) -> list[dict[str, Any]]:
        return self.metrics.drain()

    def drain_phases(self) -> list[list[float]]:
        return self.clock.rows()


class SimRank(Rank):
    """A rank whose steps the host's driver ends (it has no process)."""

    def __init__(self, host: Host, *args: Any):
        super().__init__(*args)
        self.host = host
        self.pace.sampler = CannedSampler()
        self.ctx: SimContext | None = None
        self.paused = False
        self.gone = False
        self.logged = 0

    def start(self) -> None:
        self.host.begin(self)

    def drain(self, final: bool = False) -> dict[str, Any]:
        ctx = self.ctx
        if ctx is not None:  # what a rank's process ships: its rows and where it is
            self.rows.extend(ctx.drain_rows())
            self.phases.extend(ctx.drain_phases())
            self.step, self.phase, self.ticks = ctx.step, ctx.phase, ctx.ticks
        msg = super().drain(final)
        self.host.sent_rows += len(msg["rows"])
        self.host.messages += 1
        return msg


class SimAgent(Agent):
    """The real agent's handlers, on a fake worker of a :class:`Host`."""

    def __init__(self, host: Host, address: str, index: int, scheduler: str):
        self.host = host
        self.worker = _WorkerShim(address, scheduler)
        self.ranks: dict[str, Rank] = {}
        self.stores: dict[str, Any] = {}
        self.early: dict[tuple[str, int], Control] = {}
        self.versions = host.versions
        # what the control plane is told: a GPU of an 8-GPU host
        self.ready = {
            "worker": address,
            "host": f"simhost-{index // GPUS_PER_HOST:05d}",
            "kind": "cuda",
            "index": index % GPUS_PER_HOST,
            "uuid": f"GPU-sim-{index:06d}",
        }
        # what the rank's sampler is made from: no NVML to open (SimRank samples nothing)
        self.slot = dict(self.ready, kind="cpu")

    def open_store(self, job: str, world_size: int, timeout: float) -> int:
        return 29500  # simulated: no TCPStore (the ranks form no process group)

    def start_rank(
        self,
        job: str,
        rank: int,
        spec: dict,
        payload: bytes,
        master_addr: str,
        master_port: int,
        words: list[int] | None = None,
        hosts: list[str] | None = None,
    ) -> None:
        self.host.note("start_rank", job, rank)
        thread = SimRank(
            self.host,
            self,
            job,
            rank,
            WireSpec.from_dict(spec),
            payload,
            (master_addr, master_port),
            hosts,
        )
        if words:
            thread.merge(words)
        early = self.early.pop((job, thread.attempt), None)
        if early is not None:
            thread.merge(early.words())
        self.ranks[job] = thread
        thread.start()

    def control(self, job: str, words: list[int], attempt: int = 0) -> None:
        rank = self.ranks.get(job)
        before = rank.control.words() if rank is not None else None
        super().control(job, words, attempt)
        if rank is None or before is None:
            return
        after = rank.control.words()
        for name, word in (("pause", Word.PAUSE), ("resume", Word.RESUME), ("stop", Word.STOP)):
            if after[word] > before[word]:
                self.host.note(name, job, rank.rank)
        if rank.paused:
            self.host.wake(rank)


class _WorkerShim:
    """What the agent uses of its Dask worker: address, loop, and an RPC to the scheduler."""

    def __init__(self, address: str, scheduler: str):
        self.address = address
        self.scheduler = rpc(scheduler)
        self.connection_args: dict[str, Any] = {}
        self.handlers: dict[str, Any] = {}

    @property
    def loop(self) -> Any:
        from tornado.ioloop import IOLoop

        return IOLoop.current()


class Host:
    """Many fake workers in this process, their ranks, and the driver that steps them."""

    def __init__(
        self,
        scheduler: str,
        count: int,
        first: int,
        step_s: float,
        fast_steps: int,
        fast_step_s: float,
    ):
        self.scheduler, self.count, self.first = scheduler, count, first
        self.step_s, self.fast_steps, self.fast_step_s = step_s, fast_steps, fast_step_s
        self.agents: dict[str, SimAgent] = {}
        self.versions = _versions()
        self.heap: list[tuple[float, int, SimRank]] = []
        self.seq = 0
        self.events: dict[str, list[tuple[str, int, float]]] = {}
        self.logged_rows = 0
        self.sent_rows = 0
        self.messages = 0
        self.exited = 0
        self.lags: list[float] = []  # this process's event-loop lag (a busy host delays its ranks)

    async def start(self) -> str:
        handlers = {
            f"clustersdk_{name}": self._route(name)
            for name in ("open_store", "start_rank", "control", "stacks", "console")
        }
        handlers["scale_stats"] = self.stats
        self.server = Server(handlers)
        await self.server
        await self.server.listen("tcp://127.0.0.1:0")
        stats_address = self.server.listeners[0].contact_address
        for i in range(self.count):
            await self.server.listen("tcp://127.0.0.1:0")
            address = self.server.listeners[-1].contact_address
            self.agents[address] = SimAgent(self, address, self.first + i, self.scheduler)
        await asyncio.gather(
            *(op(a.worker.scheduler, Op.WORKER_READY)(slot=a.ready) for a in self.agents.values())
        )
        asyncio.get_running_loop().create_task(self.drive())
        asyncio.get_running_loop().create_task(self.flush())
        asyncio.get_running_loop().create_task(self.probe())
        return stats_address

    async def probe(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.02)
            self.lags.append(max(time.perf_counter() - t0 - 0.02, 0.0))

    def _route(self, name: str) -> Any:
        def handler(comm: Any, **kwargs: Any) -> Any:
            agent = self.agents[comm.local_address]
            return getattr(agent, name)(**kwargs)

        handler.__name__ = name
        return handler

    # what scale.py reads ---------------------------------------------------------------
    def note(self, what: str, job: str, rank: int) -> None:
        self.events.setdefault(what, []).append((job, rank, time.time()))

    def stats(self, reset: bool = False) -> dict[str, Any]:
        intervals = {r.interval() for a in self.agents.values() for r in a.ranks.values()}
        out = {
            "logged_rows": self.logged_rows,
            "sent_rows": self.sent_rows,
            "intervals": sorted(intervals),
            "lags": self.lags,
            "messages": self.messages,
            "exited": self.exited,
            "events": {k: list(v) for k, v in self.events.items()},
            "ranks": sum(len(a.ranks) for a in self.agents.values()),
        }
        if reset:
            self.events.clear()
            self.lags = []
        return out

    # the ranks ------------------------------------------------------------------------
    def begin(self, rank: SimRank) -> None:
        first = int(os.environ.get("SCALE_FIRST_STEP", "0"))
        rank.ctx = SimContext(rank.rank, rank.spec, first)
        rank.agent.worker.loop.add_callback(
            rank.agent.send, rank, RankEvent.STARTED, {"versions": self.versions}
        )
        self.note("started", rank.job, rank.rank)
        if rank.rank == 0:
            rank.agent.worker.loop.add_callback(
                rank.agent.send, rank, RankEvent.LOOP, {"total_steps": 10**9}
            )
        self._open_step(rank)
        self._schedule(rank, time.time() + self._step_time(rank) * (1 + 0.1 * _jitter(rank)))

    def wake(self, rank: SimRank) -> None:
        self._schedule(rank, time.time())

    def _step_time(self, rank: SimRank) -> float:
        return self.fast_step_s if rank.ctx.ticks < self.fast_steps else self.step_s

    def _schedule(self, rank: SimRank, when: float) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (when, self.seq, rank))

    def _open_step(self, rank: SimRank) -> None:
        ctx = rank.ctx
        ctx.clock.begin_step()
        ctx.clock.before_data()
        ctx.clock.after_data()
        ctx.phase = "step"
        rank.in_step = True

    async def drive(self) -> None:
        while True:
            now = time.time()
            heap = self.heap
            while heap and heap[0][0] <= now:
                _, _, rank = heapq.heappop(heap)
                if not rank.gone:
                    self._boundary(rank, now)
            await asyncio.sleep(TICK_S)

    async def flush(self) -> None:
        """Every agent's real ``flush`` (a worker process runs its own every 50 ms)."""
        while True:
            for agent in self.agents.values():
                if agent.ranks:
                    agent.flush()
            await asyncio.sleep(FLUSH_S)

    def _boundary(self, rank: SimRank, now: float) -> None:
        ctx = rank.ctx
        if getattr(rank, "in_step", False):  # the step's end: log its loss, time it
            rank.in_step = False
            ctx.metrics.merge(
                ctx.step, {"loss": 2.0 + math.exp(-ctx.step / 300.0) + 0.01 * _jitter(rank)}
            )
            ctx.clock.resumed(ctx.step)
            ctx.metrics.end_step()
            self.logged_rows += 1
            ctx.step += 1
            ctx.ticks += 1
        words = rank.control.words()
        loop, send = rank.agent.worker.loop, rank.agent.send
        if words[Word.STOP] or words[Word.SUSPEND]:
            self._exit(rank, ExitStatus.STOPPED)
            return
        if words[Word.PAUSE] > words[Word.RESUME]:
            if not rank.paused:
                rank.paused = True
                ctx.phase = "paused"
                loop.add_callback(send, rank, RankEvent.PAUSED, {"step": ctx.step})
                self.note("paused", rank.job, rank.rank)
            return  # a control word wakes it
        if rank.paused:
            rank.paused = False
            loop.add_callback(send, rank, RankEvent.RESUMED, {"step": ctx.step})
        self._open_step(rank)
        self._schedule(rank, now + self._step_time(rank))

    def _exit(self, rank: SimRank, status: ExitStatus) -> None:
        rank.gone = True
        ctx = rank.ctx
        rank.rows.extend(ctx.drain_rows())
        rank.phases.extend(ctx.drain_phases())
        rank.step, rank.phase = ctx.step, "done"
        rank.ctx = None
        if rank.agent.ranks.get(rank.job) is rank:
            del rank.agent.ranks[rank.job]
        self.exited += 1
        self.note("exited", rank.job, rank.rank)
        rank.agent.worker.loop.add_callback(
            rank.agent.send, rank, RankEvent.EXIT, {"status": status.value}, True
        )


def _jitter(rank: SimRank) -> float:
    """A fixed number in [0, 1) per rank: its steps end out of step with the others'."""
    return ((rank.rank * 2654435761) % 1000) / 1000.0


def _versions() -> dict[str, Any]:
    from clustersdk.doctor.probes import versions

    return versions()


async def main() -> None:
    scheduler, count, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    step_s = float(sys.argv[4])
    fast_steps = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    fast_step_s = float(sys.argv[6]) if len(sys.argv) > 6 else step_s
    host = Host(scheduler, count, first, step_s, fast_steps, fast_step_s)
    address = await host.start()
    print("ready", address, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    os.nice(int(os.environ.get("SCALE_NICE", "0")))
    if os.environ.get("SCALE_PROFILE_RANKS"):  # where this process's time goes (scale.py --profile)
        import cProfile
        import signal

        profile = cProfile.Profile()
        path = f"{os.environ['SCALE_PROFILE_RANKS']}.{os.getpid()}"

        def dump(*_: Any) -> None:
            profile.disable()
            profile.dump_stats(path)
            os._exit(0)

        signal.signal(signal.SIGTERM, dump)
        profile.enable()
    asyncio.run(main())
