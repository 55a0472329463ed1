"""The worker agent: a Dask ``WorkerPlugin`` that runs each rank in a process of its own.

Each rank of each job is a process forked from this worker's zygote (:mod:`.zygote`,
started with the worker: torch imported, CUDA untouched) and supervised by a
:class:`~.rank.Rank`; the worker stays alive whatever a rank does, and its slot is
free for the next job as soon as a rank's process is gone.

The control plane reaches the agent through worker handlers, which run on the
worker's event loop: a control word reaches a rank even while it is busy training
(a ``client.submit`` task would wait behind the worker's one thread).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
from typing import Any

import dask.config
import msgpack
from distributed.core import rpc
from distributed.diagnostics.plugin import WorkerPlugin

from .. import cpus
from ..errors import SpecError
from ..protocol import (
    ENV_RESTART,
    ENV_SLURM_NOTICE,
    Op,
    RankEvent,
    WireSpec,
    Word,
    WorkerOp,
    no_words,
    op,
)
from ..security.tls import apply_crl, cluster_only
from .cloud import Notice, Poller
from .control_words import Control
from .environ import ENV_WARM_CUDA
from .rank import Forked, Rank, fork
from .zygote import Zygote

logger = logging.getLogger(__name__)

AGENT_NAME = "clustersdk-agent"
# The agent ships a rank's metrics when its job's interval is up and the rank did not
# (a script's rows, the system samples of a rank that is busy), waking only then...
FLUSH_MIN_S = 0.05
FLUSH_IDLE_S = 0.5  # ...and at most this long (no rank, or only slow rates)
HEARTBEAT_S = 1.0  # a rank with nothing to ship still says where it is this often (hangs)
# a SIGTERM this soon after the first is the same stop twice, not a second one: its nanny
# passes on what reached every process at once (a host's shutdown)
REPEAT_S = 2.0


class Agent(WorkerPlugin):
    name = AGENT_NAME
    idempotent = True

    async def setup(self, worker) -> None:
        self.worker = worker
        self.ranks: dict[str, Rank] = {}
        self.stores: dict[str, Any] = {}
        # control words that arrived before their rank, by (job, attempt)
        self.early: dict[tuple[str, int], Control] = {}
        allowed = sorted(os.sched_getaffinity(0))
        bound = _bind_cpus()  # before the zygote starts: it and its ranks inherit it
        if worker.nanny:  # a process of its own: out of its starter's signals (see cpus)
            cpus.leave_starter()
        # a bound worker's ranks let their collective helper threads use every core
        self.host_cpus = allowed if bound else None
        # unbound (more workers than CPUs): a job with more ranks here than CPUs pins them
        self.pin_ranks = not bound and os.environ.get(cpus.ENV) != cpus.OFF
        # what a rank's processes may hold together (the nanny watches this process only)
        memory = getattr(worker, "memory_manager", None)
        self.memory_limit = getattr(memory, "memory_limit", None)
        self.memory_terminate = dask.config.get("distributed.worker.memory.terminate", 0.95)
        # every rank is forked from the zygote: torch and the rank runtime imported once
        self.zygote = Zygote()
        self.closing = False  # the worker closes: its ranks' ends are the worker's loss
        warm_cuda = "1" if dask.config.get("clustersdk.warm-cuda", True) else "0"
        self._zygote_env = {**os.environ, ENV_WARM_CUDA: warm_cuda}
        self._restarting = asyncio.Lock()
        await self.zygote.start(self._zygote_env)
        # ...and one function rank's process is forked ahead, warmed up, waiting for a job
        self._spare: asyncio.Future | None = None
        self._prepare_spare()
        slot = dict(self.zygote.slot)
        # what the ranks of a job must agree on; compared by the control plane (diagnoses)
        self.versions = self.zygote.versions
        # rank 0's worker holds its job's rendezvous store (torch, imported meanwhile)
        self._torch = asyncio.get_running_loop().run_in_executor(None, _import_torch)
        handlers = {
            WorkerOp.OPEN_STORE: self.open_store,
            WorkerOp.START_RANK: self.start_rank,
            WorkerOp.CONTROL: self.control,
            WorkerOp.STACKS: self.stacks,
            WorkerOp.CONSOLE: self.console,
            WorkerOp.END_RANK: self.end_rank,
            WorkerOp.REVOKE: self.revoke,
        }
        for operation, handler in handlers.items():  # on TLS: the control plane's alone
            worker.handlers[operation.handler] = cluster_only(worker, "worker", handler)
        self._flush_timer: Any = None
        self._schedule_flush(FLUSH_IDLE_S)
        slot.update(worker=worker.address, host=_host_of(worker.address), cpus=bound)
        self.slot = slot
        self._noticed: float | None = None  # when the first SIGTERM came
        self._sigterm: Any = None  # the handler before ours
        self.cloud: Poller | None = None
        if threading.current_thread() is threading.main_thread():
            # SIGTERM to this process (or to its nanny, which passes it on): move its job
            # first, then leave
            self._sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
            if os.environ.get(ENV_SLURM_NOTICE):  # Cluster.slurm's worker, warned by Slurm
                signal.signal(signal.SIGUSR1, self._on_walltime)
        # started again by a standing cluster's supervisor: how its predecessor ended
        restart = os.environ.get(ENV_RESTART)
        ready = await op(worker.scheduler, Op.WORKER_READY)(slot=slot, restart=restart)
        if isinstance(ready, dict) and ready.get("crl"):  # revocations so far
            self.revoke(ready["crl"])
        try:  # a spot or preemptible VM: the cloud's notice moves the job, as SIGTERM does
            self.cloud = Poller.from_config(
                self._cloud_notice, f"clustersdk-agent ({worker.address})"
            )
        except SpecError as e:  # a worker without the notices, not one that fails to start
            logger.error("clustersdk: no cloud notices on %s: %s", worker.address, e)

    def teardown(self, worker) -> None:
        if self._flush_timer is not None:
            self.worker.loop.remove_timeout(self._flush_timer)
            self._flush_timer = None
        self.closing = True
        if self.cloud is not None:
            self.cloud.stop()
        if self._sigterm is not None and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._sigterm)
        stop = no_words()
        stop[Word.STOP] = 1
        for rank in list(self.ranks.values()):
            rank.merge(stop)
            rank.kill("its worker closed")
        if self._spare is not None:
            self._spare.cancel()
        self.zygote.close()  # and with it every rank process still there
        self.stores.clear()

    # notices ---------------------------------------------------------------------
    def _on_sigterm(self, signum: int, frame: Any) -> None:
        first = self._noticed
        if first is not None and time.monotonic() - first < REPEAT_S:
            return
        if first is not None or self.closing or not self.ranks:  # again, or nothing to move
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self._noticed = time.monotonic()
        asyncio.get_event_loop().call_soon_threadsafe(
            lambda: asyncio.ensure_future(self._leave("SIGTERM"))
        )

    def _on_walltime(self, signum: int, frame: Any) -> None:
        """Slurm's warning that this worker's walltime ends in ``--signal=B:USR1@N``
        seconds: as a SIGTERM, with N seconds to leave (and leave it does: its Slurm job
        ends, a new worker job takes over)."""
        if self._noticed is not None or self.closing:
            return
        self._noticed = time.monotonic()
        lead = float(os.environ.get(ENV_SLURM_NOTICE) or 0)
        why = f"Slurm's warning that its walltime ends in {lead:.0f} s"
        asyncio.get_event_loop().call_soon_threadsafe(
            lambda: asyncio.ensure_future(self._leave(why, grace=max(1.0, lead - 5)))
        )

    async def _leave(self, why: str, grace: float | None = None) -> None:
        """Tell the scheduler (its jobs here checkpoint and move), wait until this
        worker's ranks are gone or the grace is up, then exit as SIGTERM asked."""
        if grace is None:
            grace = float(dask.config.get("clustersdk.notice-grace"))
        deadline = time.monotonic() + grace
        logger.warning(
            "clustersdk: worker %s received %s: leaving within %.0f s",
            self.worker.address,
            why,
            grace,
        )
        try:
            await asyncio.wait_for(
                op(self.worker.scheduler, Op.NOTICE)(
                    worker=self.worker.address, leaves_in=grace, why=why
                ),
                max(1.0, grace / 2),
            )
        except Exception as e:  # noqa: BLE001 - no scheduler to tell: leave all the same
            logger.warning("clustersdk: the scheduler did not take the notice (%r)", e)
        while self.ranks and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    async def _cloud_notice(self, notice: Notice) -> None:
        """The cloud takes this VM away at ``notice.at``: the scheduler moves the job here
        and gives the slot no new rank. The worker stays: the VM goes by itself."""
        leaves_in = max(0.0, notice.at - time.time())
        logger.warning(
            "clustersdk: worker %s: %s, in %.0f s", self.worker.address, notice.why, leaves_in
        )
        await op(self.worker.scheduler, Op.NOTICE)(
            worker=self.worker.address, leaves_in=leaves_in, why=notice.why
        )

    # handlers ------------------------------------------------------------------
    def revoke(self, crl: str) -> bool:
        """A new revocation list for this worker's listeners (and its file, if any)."""
        return apply_crl(self.worker, crl) > 0

    async def open_store(self, job: str, world_size: int, timeout: float) -> int:
        """The job's rendezvous store, held here while its rank 0 runs (every rank's
        process joins it as a client, as under torchrun's agent)."""
        await self._torch
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
        wire = WireSpec.from_dict(spec)
        proc = Rank(self, job, rank, wire, payload, (master_addr, master_port), hosts)
        if rank == 0:  # held as long as the rank runs
            proc.store = self.stores.pop(job, None)
        if words:  # e.g. the pause of a job that was PAUSED before its restart
            proc.merge(words)
        early = self.early.pop((job, proc.attempt), None)
        if early is not None:  # e.g. a stop sent while the job was still starting
            proc.merge(early.words())
        self.ranks[job] = proc
        proc.task = asyncio.ensure_future(proc.run())
        self._schedule_flush(FLUSH_MIN_S)  # the flush timer may be sleeping its idle time

    def control(self, job: str, words: list[int], attempt: int = 0) -> None:
        """Merge control words into the rank of this ``attempt`` of the job (a restart
        or a resume is a new attempt: late words for an earlier one are dropped)."""
        rank = self.ranks.get(job)
        if rank is not None and rank.attempt == attempt:
            rank.merge(words)
            return
        if rank is not None and rank.attempt > attempt:
            return
        key = (job, attempt)
        if key not in self.early and len(self.early) >= 1000:
            self.early.pop(next(iter(self.early)))  # words for long-gone jobs
        self.early.setdefault(key, Control()).merge(words)

    async def stacks(self, job: str, all_threads: bool = False) -> dict[str, Any] | None:
        """Where the job's rank on this worker is: its main thread's Python stack (every
        thread's with ``all_threads``), step and phase; read from outside by py-spy when
        the rank cannot answer. Runs on the worker's event loop: it answers while the rank
        is stuck."""
        rank = self.ranks.get(job)
        if rank is None:
            return None
        return await rank.stacks(all_threads)

    def console(self, job: str, text: str, attempt: int = 0) -> bool:
        """A line for the pdb session of the job's rank here (``ctx.breakpoint()``)."""
        rank = self.ranks.get(job)
        if rank is None or rank.attempt != attempt:
            return False
        return rank.console(text)

    def end_rank(self, job: str, attempt: int, reason: str) -> bool:
        """End the job's rank here now (a hung rank that will not stop by itself): its
        processes are killed, the worker and its slot stay."""
        rank = self.ranks.get(job)
        if rank is None or rank.attempt != attempt:
            return False
        logger.warning("clustersdk: ending rank %d of job %s: %s", rank.rank, job, reason)
        rank.kill(reason, ended=True)
        return True

    async def function_process(self) -> Forked:
        """A process for a function rank: the one kept ready (forked and warmed up ahead),
        else a new one. The next is readied once this one's rank is over: readied now, it
        would take the cores from the job that starts."""
        spare, self._spare = self._spare, None
        forked = None
        if spare is not None:
            try:
                forked = await spare
            except Exception:  # noqa: BLE001 - could not fork it: a new one below says why
                logger.info("clustersdk: the spare rank process failed", exc_info=True)
            if forked is not None and self.zygote.ended(forked.pid):
                forked.close()  # it died while it waited (its stderr said why)
                forked = None
        if forked is None:
            await self.zygote_alive()
            forked = await fork(self.zygote)
        return forked

    async def zygote_alive(self) -> None:
        """A zygote that died (the OOM killer's choice, a kill by hand) is started again:
        its ranks died with it, the next ones need it. One at a time."""
        if not self.zygote.gone:
            return
        async with self._restarting:
            if self.zygote.gone:
                logger.warning("clustersdk: %s; starting a new one", self.zygote.gone)
                zygote = Zygote()
                await zygote.start(self._zygote_env)
                self.zygote = zygote

    def _prepare_spare(self) -> None:
        if self._spare is None and not self.zygote.gone:
            self._spare = asyncio.ensure_future(fork(self.zygote))

    def processes(self) -> dict[str, Any]:
        """The processes this worker keeps for its ranks: its zygote, the rank process
        waiting for the next job (None while there is none), and each job's rank.

        >>> client.run(lambda dask_worker: dask_worker.plugins[AGENT_NAME].processes())
        ...                                                   # doctest: +SKIP
        {'tls://...': {'zygote': 4242, 'spare': 4250, 'ranks': {'a1b2c3': 4301}}}
        """
        spare = self._spare
        ready = spare is not None and spare.done() and not spare.cancelled()
        forked = spare.result() if ready and spare.exception() is None else None
        proc = self.zygote.proc
        return {
            "zygote": proc.pid if proc is not None and not self.zygote.gone else None,
            "spare": forked.pid if forked is not None else None,
            "ranks": {job: rank.pid for job, rank in self.ranks.items()},
        }

    def forget(self, rank: Rank) -> None:
        """``rank``'s process is gone (its exit is reported next)."""
        if self.ranks.get(rank.job) is rank:
            del self.ranks[rank.job]
        rank.store = None
        self._prepare_spare()

    # what ranks report -------------------------------------------------------------
    def flush(self) -> None:
        """Ship each rank's metrics at its job's rate when the rank did not (skipped while
        one is on its way), and sleep until the next rank is due."""
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
        rank: Rank,
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
            if rank.uplink is None:
                rank.uplink = rpc(
                    self.worker.scheduler.address,
                    connection_args=getattr(self.worker, "connection_args", None),
                )
            call = op(rank.uplink, Op.RANK_EVENT)
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
                    uplink, rank.uplink = rank.uplink, None
                    await uplink.close_rpc()

    async def fetch(self, rank: Rank, **ranges: Any) -> list[dict[str, Any]]:
        """The job.run / job.update requests ``rank`` must carry out."""
        return await op(self.worker.scheduler, Op.LIVE_PENDING)(
            job=rank.job, rank=rank.rank, attempt=rank.attempt, **ranges
        )


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


def _host_of(address: str) -> str:
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host or socket.gethostname()


def _import_torch() -> None:
    import torch.distributed  # noqa: F401 - the rendezvous stores this worker holds
