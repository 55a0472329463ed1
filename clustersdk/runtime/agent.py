"""The worker agent: a Dask ``WorkerPlugin`` that runs ranks in threads.

The control plane reaches it through worker handlers, which run on the
worker's event loop: a control word reaches a rank even while the rank's
thread is busy training (a ``client.submit`` task would wait behind it).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import functools
import logging
import os
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

import cloudpickle
import msgpack
from distributed.core import rpc
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.utils import sync

from .. import checkpoint_files, cpus
from ..protocol import ExitStatus, Op, RankEvent, WireSpec, Word, WorkerOp, no_words, op
from ..security.tls import apply_crl, cluster_only
from . import capture, telemetry
from .anomalies import failure_facts
from .breakpoints import Console
from .control_words import Control, JobSuspended
from .holds import Hold
from .scripts import ScriptRank

if TYPE_CHECKING:
    from .live import Live

logger = logging.getLogger(__name__)

AGENT_NAME = "clustersdk-agent"
# The agent ships each rank's metrics when its job's interval is up, waking only then
# (every wake-up takes the GIL from the ranks): at least this long apart...
FLUSH_MIN_S = 0.05
FLUSH_IDLE_S = 0.5  # ...and at most this long (no rank, or only slow rates)
HEARTBEAT_S = 1.0  # a rank with nothing to ship still says where it is this often (hangs)


class Agent(WorkerPlugin):
    name = AGENT_NAME
    idempotent = True

    async def setup(self, worker) -> None:
        self.worker = worker
        self.ranks: dict[str, RankThread | ScriptRank] = {}
        self.stores: dict[str, Any] = {}
        # control words that arrived before their rank, by (job, attempt)
        self.early: dict[tuple[str, int], Control] = {}
        allowed = sorted(os.sched_getaffinity(0))
        bound = _bind_cpus()  # before the warm-up starts torch's threads
        if worker.nanny:  # a process of its own: out of its starter's signals (see cpus)
            cpus.leave_starter()
        # a bound worker's ranks let their collective helper threads use every core
        self.host_cpus = allowed if bound else None
        # unbound (more workers than CPUs): a job with more ranks here than CPUs pins them
        self.pin_ranks = not bound and os.environ.get(cpus.ENV) != cpus.OFF
        # Importing torch._dynamo costs 1-1.5 s on the first DDP(...); pay it now.
        slot = await asyncio.get_running_loop().run_in_executor(None, _warm_up_and_probe)
        # what the ranks of a job must agree on; compared by the control plane (diagnoses)
        self.versions = await asyncio.get_running_loop().run_in_executor(None, _versions)
        handlers = {
            WorkerOp.OPEN_STORE: self.open_store,
            WorkerOp.START_RANK: self.start_rank,
            WorkerOp.CONTROL: self.control,
            WorkerOp.STACKS: self.stacks,
            WorkerOp.CONSOLE: self.console,
            WorkerOp.REVOKE: self.revoke,
        }
        for operation, handler in handlers.items():  # on TLS: the control plane's alone
            worker.handlers[operation.handler] = cluster_only(worker, "worker", handler)
        capture.install()
        _exit_without_finalizers()
        self._flush_timer: Any = None
        self._schedule_flush(FLUSH_IDLE_S)
        slot.update(worker=worker.address, host=_host_of(worker.address), cpus=bound)
        self.slot = slot
        ready = await op(worker.scheduler, Op.WORKER_READY)(slot=slot)
        if isinstance(ready, dict) and ready.get("crl"):  # revocations so far
            self.revoke(ready["crl"])

    def teardown(self, worker) -> None:
        if self._flush_timer is not None:
            self.worker.loop.remove_timeout(self._flush_timer)
            self._flush_timer = None
        stop = no_words()
        stop[Word.STOP] = 1
        for rank in self.ranks.values():
            rank.control.merge(stop)
            if rank.channel is not None:
                rank.channel.close_comms()

    # handlers ------------------------------------------------------------------
    def revoke(self, crl: str) -> bool:
        """A new revocation list for this worker's listeners (and its file, if any)."""
        return apply_crl(self.worker, crl) > 0

    def open_store(self, job: str, world_size: int, timeout: float) -> int:
        from .process_group import open_store

        # the store listens on the address the worker does, not on every interface
        store = open_store(world_size, timeout, host=_host_of(self.worker.address))
        self.stores[job] = store
        return store.port

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
        store = self.stores.pop(job, None) if rank == 0 else None
        wire = WireSpec.from_dict(spec)
        thread: RankThread | ScriptRank
        if wire.kind == "script":  # a child process of this worker (runtime/scripts.py)
            thread = ScriptRank(
                self, job, rank, wire, payload, master_addr, master_port, store, hosts
            )
        else:
            thread = RankThread(
                self, job, rank, wire, payload, master_addr, master_port, store, hosts
            )
        if words:  # e.g. the pause of a job that was PAUSED before its restart
            thread.control.merge(words)
        early = self.early.pop((job, thread.attempt), None)
        if early is not None:  # e.g. a stop sent while the job was still starting
            thread.control.merge(early.words())
        self.ranks[job] = thread
        thread.start()
        self._schedule_flush(FLUSH_MIN_S)  # the flush timer may be sleeping its idle time

    def control(self, job: str, words: list[int], attempt: int = 0) -> None:
        """Merge control words into the rank of this ``attempt`` of the job (a restart
        or a resume is a new attempt: late words for an earlier one are dropped)."""
        rank = self.ranks.get(job)
        if rank is not None and rank.attempt == attempt:
            rank.control.merge(words)
            return
        if rank is not None and rank.attempt > attempt:
            return
        key = (job, attempt)
        if key not in self.early and len(self.early) >= 1000:
            self.early.pop(next(iter(self.early)))  # words for long-gone jobs
        self.early.setdefault(key, Control()).merge(words)

    async def stacks(self, job: str, all_threads: bool = False) -> dict[str, Any] | None:
        """Where the job's rank on this worker is: its training thread's Python stack
        (every thread's with ``all_threads``), step and phase; a script rank's process
        stack, read by py-spy. Runs on the worker's event loop: it answers while the rank
        is stuck."""
        rank = self.ranks.get(job)
        if rank is None:
            return None
        if isinstance(rank, ScriptRank):
            return await rank.stacks(all_threads)
        frames = sys._current_frames()
        threads = threading.enumerate() if all_threads else [rank]
        text = []
        for thread in threads:
            frame = frames.get(thread.ident) if thread.ident is not None else None
            if frame is None:
                continue
            head = f'Thread "{thread.name}"' + (" (the rank's)" if thread is rank else "")
            text.append(head + ":\n" + "".join(traceback.format_stack(frame)))
        ctx = rank.ctx
        return {
            "rank": rank.rank,
            "attempt": rank.attempt,
            "pid": os.getpid(),
            "step": getattr(ctx, "step", None),
            "phase": getattr(ctx, "phase", "setup"),
            "text": "\n".join(text),
        }

    def console(self, job: str, text: str, attempt: int = 0) -> bool:
        """A line for the pdb session of the job's rank here (``ctx.breakpoint()``)."""
        rank = self.ranks.get(job)
        if rank is None or rank.attempt != attempt or rank.ctx is None:
            return False
        rank.console.feed(text)
        return True

    # what ranks report -------------------------------------------------------------
    def flush(self) -> None:
        """Ship each rank's metrics at its job's rate (skipped while one is on its way),
        and sleep until the next rank is due."""
        self._flush_timer = None
        wait = FLUSH_IDLE_S
        try:
            for rank in list(self.ranks.values()):
                if not rank.outbox.locked() and rank.pace.due():
                    self.worker.loop.add_callback(self.send, rank, RankEvent.METRICS, {})
                wait = min(wait, rank.pace.until_due())
        finally:  # the next round comes, whatever this one met
            self._schedule_flush(max(wait, FLUSH_MIN_S))

    def _schedule_flush(self, delay: float) -> None:
        if self._flush_timer is not None:
            self.worker.loop.remove_timeout(self._flush_timer)
        self._flush_timer = self.worker.loop.call_later(delay, self.flush)

    async def send(
        self,
        rank: RankThread | ScriptRank,
        event: RankEvent,
        data: dict[str, Any],
        final: bool = False,
    ) -> None:
        """Tell the control plane ``event`` of ``rank``, with its metrics since the last
        message. One message of a rank at a time, in order, on the rank's own
        connection: rows arrive in the order they were logged, and before the event
        that follows them. A METRICS message goes packed and without waiting for an
        answer (half the scheduler's cost of a message; 1,024 ranks send thousands a
        second); an event waits until the control plane has handled it."""
        async with rank.outbox:
            msg = rank.drain(final)
            if (
                event is RankEvent.METRICS
                and not (msg["rows"] or msg["logs"] or msg["system"] or msg["phases"])
                and time.monotonic() - rank.last_sent < max(HEARTBEAT_S, rank.interval())
            ):
                return
            rank.last_sent = time.monotonic()
            if rank.channel is None:
                rank.channel = rpc(
                    self.worker.scheduler.address,
                    connection_args=getattr(self.worker, "connection_args", None),
                )
            call = op(rank.channel, Op.RANK_EVENT)
            if event is RankEvent.METRICS:
                await call(
                    job=rank.job,
                    rank=rank.rank,
                    event=event.value,
                    attempt=rank.attempt,
                    data=msgpack.packb({**msg, **data}),
                    reply=False,
                )
                return
            try:
                await call(
                    job=rank.job,
                    rank=rank.rank,
                    event=event.value,
                    attempt=rank.attempt,
                    data={**msg, **data},
                )
            finally:
                if event is RankEvent.EXIT:  # its last message
                    channel, rank.channel = rank.channel, None
                    await channel.close_rpc()

    def report(
        self, rank: RankThread | ScriptRank, event: RankEvent, final: bool = False, **data: Any
    ) -> None:
        """From a rank thread: tell the control plane, and wait until it has heard."""
        sync(self.worker.loop, self.send, rank, event, data, final)

    def fetch(self, rank: RankThread, **ranges: Any) -> list[dict[str, Any]]:
        """From a rank thread: the job.run / job.update requests it must carry out."""
        return sync(
            self.worker.loop,
            op(self.worker.scheduler, Op.LIVE_PENDING),
            job=rank.job,
            rank=rank.rank,
            attempt=rank.attempt,
            **ranges,
        )


class RankThread(threading.Thread):
    """One rank of one job: process group up, user function, process group down."""

    def __init__(
        self,
        agent: Agent,
        job: str,
        rank: int,
        spec: WireSpec,
        payload: bytes,
        master_addr: str,
        master_port: int,
        store: Any,
        hosts: list[str] | None = None,
    ):
        super().__init__(name=f"clustersdk-{spec.name}-rank{rank}", daemon=True)
        self.agent, self.job, self.rank, self.spec = agent, job, rank, spec
        self.hosts = list(hosts or ())  # each rank's host, from the control plane
        self.payload, self.store = payload, store
        self.master = (master_addr, master_port)
        self.attempt = spec.attempt
        self.outbox = asyncio.Lock()  # what this rank sends goes out one message at a time
        self.leftover: collections.deque = collections.deque()  # rows of a context now gone
        self.leftover_phases: collections.deque = collections.deque()
        self.sink = capture.Sink(rank)
        sampler = telemetry.Sampler(agent.slot["kind"], agent.slot["index"])
        self.pace = telemetry.Pace(rank, self.interval, sampler)
        self.ctx = None
        self.control = Control()  # may receive words before the context exists
        self.console = Console()  # the input of a pdb session at ctx.breakpoint()
        self.live: Live | None = None  # job.run / job.update, once the context exists
        self.hold: Hold | None = None  # on_error="hold"
        self.last_sent = 0.0  # monotonic time of the last message to the control plane
        self.channel: Any = None  # the rank's own connection to the control plane (an rpc)

    def interval(self) -> float:
        """Seconds between this rank's messages (its job's metrics_interval, which the
        control plane stretches on a busy cluster; job.update may change it)."""
        ctx = self.ctx
        return (ctx if ctx is not None else self).spec.metrics_interval

    def drain(self, final: bool = False) -> dict[str, Any]:
        ctx = self.ctx
        rows = [self.leftover.popleft() for _ in range(len(self.leftover))]
        rows += ctx.drain_rows() if ctx is not None else []
        phases = [self.leftover_phases.popleft() for _ in range(len(self.leftover_phases))]
        phases += ctx.drain_phases() if ctx is not None else []
        beacon = (
            {"step": ctx.step, "phase": ctx.phase, "ticks": ctx.ticks} if ctx is not None else None
        )
        return {
            "sent": time.time(),
            "rows": rows,
            "logs": self.sink.drain(final),
            "system": self.pace.samples(final),
            "phases": phases,
            "beacon": beacon,
        }

    def run(self) -> None:
        from . import process_group as pg
        from .context import TrainContext
        from .live import Live

        capture.bind(self.sink)
        spec, rank, ws = self.spec, self.rank, self.spec.world_size
        outcome: dict[str, Any] = {"status": ExitStatus.OK.value}
        device = None
        try:
            if self.hosts and self.agent.pin_ranks:  # before its process groups' threads
                cpus.pin_rank(self.hosts, rank)
            device = pg.rank_device(_slot_kind())
            pg.set_env(rank, ws, *self.master, env=spec.env)
            store = self.store or pg.join_store(*self.master, ws, spec.timeout)
            self.store = None
            control_group, checkpoint_group = pg.init(
                store, rank, ws, device, spec.timeout, checkpoints=bool(spec.checkpoint_dir)
            )
            fn, args, kwargs, objects = cloudpickle.loads(self.payload)
            host = self.agent.host_cpus
            self.live = Live(
                fetch=self._fetch,
                report=self._report,
                group=control_group,
                rank=rank,
                world_size=ws,
                hparams=spec.hparams,
            )
            self.hold = Hold(
                control=self.control, report=self._report, rank=rank, timeout=spec.hold_timeout
            )
            self.ctx = TrainContext(
                job=self.job,
                name=spec.name,
                rank=rank,
                world_size=ws,
                local_rank=0,
                device=device,
                strategy=spec.strategy,
                control=self.control,
                control_group=control_group,
                checkpoint_group=checkpoint_group,
                checkpoint=_checkpoint_options(spec, rank),
                report=self._report,
                spec=spec,
                objects=objects,
                console=self.console,
                live=self.live,
                hold=self.hold,
                # once its process groups exist, each loop frees their helper threads
                on_loop=functools.partial(cpus.free_helpers, host) if host else None,
            )
            self.agent.report(
                self, RankEvent.STARTED, versions=getattr(self.agent, "versions", None)
            )
            result = fn(self.ctx, *args, **kwargs)
            if self.ctx.stopped:
                outcome["status"] = ExitStatus.STOPPED.value
            if rank == 0:
                outcome["result"] = cloudpickle.dumps(result)
        except JobSuspended:
            outcome = {"status": ExitStatus.SUSPENDED.value}
        except BaseException as e:  # noqa: BLE001 - every failure must reach the user
            outcome = {"status": ExitStatus.FAILED.value}
            error = {
                "rank": rank,
                "type": type(e).__name__,
                "message": str(e),
                "traceback": "".join(traceback.format_exception(e)),
            }
            facts = failure_facts(e, device)  # e.g. CUDA memory peaks, for its diagnosis
            if facts:
                error["facts"] = facts
            try:  # before teardown, so that the first failure is the one reported
                if not self._hold(e, error):
                    self.agent.report(self, RankEvent.FAILED, final=True, error=error)
            except Exception:
                logger.exception("clustersdk: could not report the failure of rank %d", rank)
        finally:
            if self.ctx is not None:  # its last rows go with the exit report
                self.leftover.extend(self.ctx.drain_rows())
                self.leftover_phases.extend(self.ctx.drain_phases())
            self.ctx = self.live = self.hold = None  # what they hold is the job's
            fn = args = kwargs = objects = result = None  # noqa: F841 - drop the job's objects
            try:
                pg.teardown()
            except Exception:
                logger.exception("clustersdk: process-group teardown failed on rank %d", rank)
            capture.bind(None)
            if self.agent.ranks.get(self.job) is self:
                del self.agent.ranks[self.job]
            try:
                self.agent.report(self, RankEvent.EXIT, final=True, **outcome)
            except Exception:  # the worker is closing: the scheduler learns it by itself
                logger.info("clustersdk: could not report the exit of rank %d", rank, exc_info=True)

    def _hold(self, e: BaseException, error: dict[str, Any]) -> bool:
        """Under ``on_error="hold"``: report HELD and wait, alive, until told to stop
        (:meth:`.holds.Hold.wait`), serving ``job.run`` meanwhile; False when the failure
        takes the usual path."""
        ctx, live, hold = self.ctx, self.live, self.hold
        if (
            self.spec.on_error != "hold"
            or ctx is None
            or live is None
            or hold is None
            or self.control.words()[Word.STOP]
        ):
            return False
        hold.wait(e, error, step=ctx.step, serve_runs=lambda words: live.act_alone(words, ctx))
        return True

    def _fetch(self, **ranges: Any) -> list[dict[str, Any]]:
        """From the rank's context: the job.run / job.update requests in ``ranges``."""
        return self.agent.fetch(self, **ranges)

    def _report(self, event: RankEvent, **data: Any) -> None:
        """From the rank's context: the event, with the metrics and logs so far (a
        paused job's history is then complete as soon as pause() returns)."""
        self.agent.report(self, event, **data)


def _checkpoint_options(spec: WireSpec, rank: int) -> dict[str, Any] | None:
    """Check the checkpoint directory before any training; clean up killed saves."""
    root = spec.checkpoint_dir
    if not root:
        return None
    checkpoint_files.check_writable(root)
    if rank == 0:
        checkpoint_files.clean_leftovers(root)
    return {
        "dir": root,
        "every": spec.checkpoint_every,
        "keep": spec.keep,
        "async": spec.async_checkpoint,
        "resume": spec.resume,
        "attempt": spec.attempt,
    }


def _bind_cpus() -> str:
    """Bind this worker's threads to the share of the host's cores its deployer gave it
    (``clustersdk.cpus``); the CPU list, or "" when it has none."""
    text = os.environ.get(cpus.ENV, "")
    if not text or text == cpus.OFF:
        return ""
    try:
        return cpus.cpulist(cpus.bind_process(text))
    except (ValueError, OSError) as e:  # a share this host does not have: run unbound
        logger.warning("worker not bound to CPUs %r: %s", text, e)
        return ""


def _warm_up_and_probe() -> dict[str, Any]:
    import gc

    import torch
    import torch._dynamo  # noqa: F401

    # Move the hundreds of thousands of objects torch creates at import out of
    # the collector's reach: the full collection after each job then costs
    # milliseconds instead of ~0.1 s.
    gc.collect()
    gc.freeze()

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        index = int(visible) if visible.isdigit() else 0
        return {"kind": "cuda", "index": index, "uuid": str(getattr(props, "uuid", ""))}
    return {"kind": "cpu", "index": -1, "uuid": ""}


def _exit_without_finalizers() -> None:
    """End the worker process with ``os._exit`` once its atexit work is done.

    Gloo objects still alive at interpreter finalization abort the process
    ("terminate called without an active exception"). Registered first among
    ours, this runs after the hooks registered later (atexit is LIFO).
    """

    def hard_exit() -> None:
        for stream in (sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(0)

    atexit.register(hard_exit)


def _versions() -> dict[str, Any]:
    from .versions import versions

    return versions()


def _slot_kind() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _host_of(address: str) -> str:
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host or socket.gethostname()
