"""The control plane: a Dask ``SchedulerPlugin`` that owns jobs and slots.

A thin shell around pure code. It keeps the slot inventory the worker agents
report and the queue, lets :mod:`.policy` pick whole gangs, and turns what it
hears (RPCs from kernels, rank reports from agents, Dask's notice that a
worker left, timers) into :mod:`.events` for each job's
:class:`~.lifecycle.Lifecycle`, then carries out the actions that come back:
journal writes, topic messages, control words, gang starts, freed slots.
Every method runs on the scheduler's event loop, so no locks are needed.
Its parts (:mod:`.requests`: the client-facing handlers; :mod:`.evidence`,
:mod:`.watchdog`, :mod:`.placement`, :mod:`.restore`) see it through the narrow
:class:`~.plane.Plane` interface.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from .. import config
from ..errors import ClusterSDKError, SpecError
from ..protocol import (
    ExitStatus,
    Message,
    MetricsMessage,
    Op,
    RankEvent,
    WireSpec,
    WorkerOp,
    op,
    topic,
)
from ..status import JobStatus
from . import events as ev
from . import policy
from .access import Access
from .digest import Digest
from .evidence import Evidence
from .gate import Gate
from .goodput import Goodput
from .journal import Journal
from .lifecycle import Lifecycle
from .placement import Placement
from .plane import Run
from .requests import Requests
from .restore import adopt, scheduling_config
from .watchdog import Watchdog

logger = logging.getLogger(__name__)

PLUGIN_NAME = "clustersdk-control"
CLUSTER = "*cluster*"  # the journal's key of the cluster's own events (not a job id)
TICK_MS = 1000  # how often the policy looks again without an event (grace, idle timeouts)
PUBLISH_MS = 100  # how often a big job's bands go to kernels and step summaries to the journal
END_RANK_WAIT = 10.0  # seconds a worker has to end a hung rank before it is restarted


class ControlPlane(SchedulerPlugin):
    """Job registry, slot inventory and gang allocation, inside the scheduler (a
    :class:`~.plane.Plane` to its parts)."""

    name = PLUGIN_NAME
    idempotent = True  # a second client must not replace the live registry

    def __init__(self, state_dir: str):
        self.state_dir = state_dir

    # --- Dask's hooks --------------------------------------------------------------------
    async def start(self, scheduler) -> None:
        _quiet_expected_errors()
        self.scheduler = scheduler
        self.id = scheduler.id
        self.journal = Journal(os.path.join(self.state_dir, "journal.sqlite"))
        self.slots: dict[str, policy.Slot] = {}
        self.busy: dict[str, str] = {}  # worker address -> job id
        # drained by an admin (cluster.drain): host or worker address -> why; no new ranks
        self.drained: dict[str, str] = {}
        self.runs: dict[str, Run] = {}  # jobs not released yet
        # an autoscaling cluster (Cluster.slurm): the most slots it can grow to, and what
        # queued jobs wait for besides free slots (e.g. Slurm's pending reason)
        self.capacity, self.note = 0, ""
        # workers that left a moment ago, by address: a nanny is likely restarting them
        self.left: dict[str, tuple[str, float]] = {}  # address -> (host, when)
        self.placement = Placement(self.journal, scheduling_config(self.journal))
        self._scheduling = self._again = False
        self.watchdog = Watchdog(self)
        # who may do what: enforced where the scheduler listens on TLS (see access.py)
        self.access = Access(
            enforced=Gate.tls(scheduler), hide_metrics=bool(config.get("security.hide-metrics"))
        )
        self.gate = Gate(scheduler, self.access, lambda job: self.requests.job_facts(job))
        self.requests = Requests(self, self.placement, self.watchdog, self.gate, self.access)
        self.gate.install()  # Dask's own risky handlers: admins and the cluster only
        self.evidence = Evidence(self)  # for diagnoses: how lost workers ended, where ranks were
        handlers: dict[Op, Callable] = {
            **self.requests.handlers(),
            Op.WORKER_READY: self._worker_ready,
            Op.RANK_EVENT: self._rank_event,
            Op.SET_CAPACITY: self._set_capacity,
            Op.DRAIN: self._drain,
            Op.UNDRAIN: self._undrain,
            Op.NOTICE: self._notice,
            Op.CLUSTER_EVENTS: lambda: self.journal.events(CLUSTER),
            Op.LIVE_PENDING: self.requests.live_pending,
        }
        for operation, handler in handlers.items():  # every request's identity checked
            scheduler.handlers[operation.handler] = self.requests.guarded(operation, handler)
        adopt(self, self.placement)
        # grace periods and idle timeouts run out between events
        self._ticker = PeriodicCallback(self._tick, TICK_MS)
        self._ticker.start()
        self._publisher = PeriodicCallback(self._publish_digests, PUBLISH_MS)
        self._publisher.start()

    async def close(self) -> None:
        self._ticker.stop()
        self._publisher.stop()
        self._publish_digests()
        self.evidence.closed = True
        for run in list(self.runs.values()):
            self.feed(run, ev.SchedulerClosing())
        self.journal.close()

    def remove_worker(self, scheduler, worker: str, **kwargs: Any) -> None:
        slot = self.slots.pop(worker, None)
        if slot is not None:
            self.left[worker] = (slot.host, time.time())
        self.placement.scheduler.remove_slot(worker)
        job = self.busy.get(worker)
        run = self.runs.get(job) if job else None
        if run is None:
            return
        machine = run.machine
        rank = next(i for i, r in enumerate(machine.ranks) if r.worker == worker)
        host = slot.host if slot is not None else machine.ranks[rank].host
        # fed once its nanny said how the process ended (out of memory?), or soon after
        self.evidence.lost(run, ev.WorkerLost(rank, machine.attempt, worker, host))

    def log_event(self, topic: str, msg: Any) -> None:
        self.evidence.heard(topic, msg)  # a nanny's report of a worker's end

    # --- the Plane its parts see -----------------------------------------------------------
    @property
    def address(self) -> str:
        return self.scheduler.address

    def follow(
        self,
        spec: WireSpec,
        payload: bytes,
        seq: int | None = None,
        goodput: dict[str, Any] | None = None,
        **state: Any,
    ) -> Run:
        """A job the plane follows from now on; queued if its lifecycle says so (a
        restarted scheduler's job goes on with the ``goodput`` its record kept)."""
        machine = Lifecycle(
            spec,
            failure_grace=float(config.get("failure-grace")),
            max_rollbacks=int(config.get("diagnosis.max-rollbacks")),
            **state,
        )
        run = self.runs[machine.id] = Run(machine, payload, goodput=Goodput(goodput))
        run.goodput.status(machine.status.name, time.time())
        if machine.status is JobStatus.QUEUED:
            self.placement.submit(machine.spec, time.time(), seq)
        self.schedule()
        return run

    def publish(self, job: str, message: Message) -> None:
        self.scheduler.log_event(topic(job), message)

    def call_worker(self, worker: str, operation: WorkerOp, **kwargs: Any) -> Awaitable[Any]:
        return op(self.scheduler.rpc(worker), operation)(**kwargs)

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.scheduler.loop.call_later(delay, fn, *args)

    def worker_pid(self, worker: str) -> int | None:
        return getattr(self.scheduler.workers.get(worker), "pid", None)

    # --- feeding the lifecycles ---------------------------------------------------------

    def feed(self, run: Run, event: ev.Event) -> list[ev.Action]:
        """Give ``event`` to the job's lifecycle and carry out what it asks for."""
        before = run.machine.status
        actions = run.machine.handle(event, time.time())
        reschedule = False
        for action in actions:
            _EXECUTORS[type(action)](self, run, action)
            reschedule |= isinstance(action, (ev.FreeSlot, ev.Enqueue, ev.Dequeue, ev.Release))
        after = run.machine.status
        if after is not before and after.name == "RUNNING" and before.name != "HUNG":
            run.watch.reset(time.time())  # a new gang, or a resume: nothing to compare yet
        self.placement.status(run, before, time.time())
        if reschedule or run.machine.status is not before:
            self.schedule()
        self._notify(run)
        return actions

    def _tick(self) -> None:
        self.schedule()
        self.watchdog.check()

    def schedule(self) -> None:
        """One decision of the scheduling policy, carried out (once at a time: what the
        decision's own events change is decided on right after)."""
        if self._scheduling:
            self._again = True
            return
        self._scheduling = True
        try:
            self._again = True
            while self._again:
                self._again = False
                for run, event in self.placement.decide(time.time(), self.runs, self.note):
                    if isinstance(event, ev.Allocated):  # rank i on the i-th slot
                        for slot in event.ranks:
                            self.busy[slot.worker] = run.id
                    self.feed(run, event)
        finally:
            self._scheduling = False

    # --- what agents and deployers send ------------------------------------------------------
    def _set_capacity(self, slots: int, note: str = "") -> None:
        self.capacity, self.note = int(slots), str(note)
        self.schedule()  # rewrites the queued jobs' reasons

    # --- drains: an admin takes hosts out -----------------------------------------------
    def drained_why(self, worker: str) -> str | None:
        """Why ``worker`` takes no new ranks (its address or its host drained), or None."""
        slot = self.slots.get(worker)
        return self.drained.get(worker) or (self.drained.get(slot.host) if slot else None)

    def _targets(self, target: str) -> list[str]:
        workers = sorted(w for w, s in self.slots.items() if target in (w, s.host))
        if not workers:
            hosts = sorted({s.host for s in self.slots.values()})
            raise SpecError(
                f"no host or worker {target!r} in this cluster; its hosts: {', '.join(hosts)}"
            )
        return workers

    def _drain(self, target: str, reason: str = "", by: float | None = None) -> dict[str, Any]:
        """Take ``target`` (a host, or one worker's address) out: no new ranks land there,
        and each job with a rank there checkpoints at its next step boundary (as for a
        preemption), leaves, and queues again to continue on other slots. Without a
        checkpoint_dir a job stops and queues again from its newest checkpoint (or start).
        With ``by`` (a time), its jobs run on until ``clustersdk.notice-grace`` before it,
        then move: a job that ends before then is not disturbed."""
        workers = self._targets(target)
        why = reason or "drained by an admin"
        self.drained[target] = why
        for worker in workers:
            self.placement.scheduler.remove_slot(worker)
        now = time.time()
        moves_at = None if by is None else by - float(config.get("notice-grace"))
        until = "" if by is None else f" by {time.strftime('%H:%M:%S', time.localtime(by))}"
        self.journal.add_event(CLUSTER, now, None, "drained", f"{target}{until}: {why}", {})
        if moves_at is not None and moves_at > now:
            self.call_later(moves_at - now, self._move_off, target, why, until)
            found = dict.fromkeys(self.busy[w] for w in workers if w in self.busy)
            jobs = [self.runs[job].machine.name for job in found if job in self.runs]
            self.schedule()
        else:
            jobs = self._move_off(target, why, until)
        return {
            "target": target,
            "workers": workers,
            "jobs": jobs,
            "reason": why,
            "moves_at": moves_at if moves_at is not None and moves_at > now else None,
        }

    def _move_off(self, target: str, why: str, until: str = "") -> list[str]:
        """The jobs with a rank on drained ``target`` checkpoint and move (unless it was
        undrained, or drained again for another reason, meanwhile)."""
        if self.drained.get(target) != why:
            return []
        workers = [w for w, slot in self.slots.items() if target in (w, slot.host)]
        moved = []
        for job in dict.fromkeys(self.busy[w] for w in workers if w in self.busy):
            run = self.runs.get(job)
            if run is None:
                continue
            self.feed(
                run,
                ev.Preempted(
                    "suspend", f"{target} is drained{until} ({why}): it continues on other slots"
                ),
            )
            moved.append(run.machine.name)
        self.schedule()
        return moved

    def _notice(self, worker: str, leaves_in: float, why: str) -> dict[str, Any]:
        """``worker`` goes away within ``leaves_in`` seconds (it received ``why``, e.g.
        SIGTERM): it takes no new ranks, and its job checkpoints at its next step boundary
        and moves, as for a drain; the worker exits once its rank is gone (a cloud's
        notice: the VM goes by itself). A notice shorter than two of the job's slowest
        recent steps (one to reach the boundary, about one more to save) may be too short:
        its events say so."""
        slot = self.slots.get(worker)
        if slot is None:
            return {"jobs": []}
        self.placement.scheduler.remove_slot(worker)
        message = (
            f"worker {worker} (host {slot.host}) received {why}, leaving within {leaves_in:.0f} s"
        )
        logger.warning("clustersdk: %s", message)
        self.journal.add_event(CLUSTER, time.time(), None, "notice", message, {"worker": worker})
        run = self.runs.get(self.busy.get(worker, ""))
        if run is not None:
            step = max(run.watch.durations, default=0.0)
            short = (
                f" (a notice of {leaves_in:.0f} s may be too short: its steps take up to "
                f"{step:.1f} s, and it must finish one and save)"
                if leaves_in < 2 * step
                else ""
            )
            self.feed(
                run, ev.Preempted("suspend", f"{message}: it continues on other slots{short}")
            )
        self.schedule()
        return {"jobs": [run.machine.name] if run is not None else []}

    def _undrain(self, target: str) -> dict[str, Any]:
        """Give a drained host (or worker) back: its slots take ranks again."""
        if target not in self.drained:
            raise SpecError(
                f"{target!r} is not drained; drained: {', '.join(sorted(self.drained)) or 'none'}"
            )
        del self.drained[target]
        workers = [w for w in self._targets(target) if self.drained_why(w) is None]
        for worker in workers:
            self.placement.scheduler.add_slot(self.slots[worker])
        self.journal.add_event(CLUSTER, time.time(), None, "undrained", target, {})
        self.schedule()
        return {"target": target, "workers": workers}

    def can_hold(self) -> tuple[int, str]:
        now = time.time()
        memory = float(config.get("left-slot-memory"))
        for worker, (_, when) in list(self.left.items()):
            if now - when > memory:
                del self.left[worker]
        hosts = {s.host for s in self.slots.values()}
        text = f"{len(self.slots)} slot(s) on {len(hosts)} host(s)"
        if self.left:
            ago = now - max(when for _, when in self.left.values())
            text += f", and {len(self.left)} whose worker left {ago:.0f} s ago"
        if self.capacity > len(self.slots) + len(self.left):
            text += f"; it grows to {self.capacity}"
        return max(len(self.slots) + len(self.left), self.capacity), text

    def restarted(self, process: str, address: str, restart: str | None) -> None:
        """A process of a standing cluster that its supervisor started again (``restart``:
        what ``CLUSTERSDK_RESTART`` said): journaled as a cluster event."""
        try:
            data = json.loads(restart or "{}")
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        host = data.get("host") or address
        message = (
            f"{process} {address} (host {host}) started again by its supervisor (restart "
            f"{data.get('restarts', '?')}): it {data.get('after') or 'ended'}"
        )
        logger.warning("clustersdk: %s", message)
        self.journal.add_event(
            CLUSTER, time.time(), None, "restarted", message, {"process": process, **data}
        )

    def _worker_ready(self, slot: dict, restart: str | None = None) -> dict:
        if restart:
            self.restarted("worker", slot["worker"], restart)
        # a worker back on a host where one left: the one its nanny restarted, presumably
        for worker, (host, _) in sorted(self.left.items(), key=lambda kv: kv[1][1]):
            if host == slot["host"]:
                del self.left[worker]
                break
        self.slots[slot["worker"]] = policy.Slot(**slot)
        if self.drained_why(slot["worker"]) is None:  # a drained host's new worker: none
            self.placement.scheduler.add_slot(self.slots[slot["worker"]])
        self.schedule()
        return {"crl": self.gate.crl}  # a worker started by other means learns revocations

    def _rank_event(
        self, job: str, rank: int, event: str, data: dict | None = None, attempt: int = 0
    ) -> None:
        # a METRICS message comes packed (what the agent's send does to the hot path)
        data = msgpack.unpackb(data) if isinstance(data, bytes) else dict(data or {})
        kind = RankEvent(event)
        run = self.runs.get(job)
        if run is None:  # over: nothing of it is kept any more
            return
        self.evidence.annotate(run, kind, data)  # where every rank was, for its diagnosis
        self._intake(run, rank, attempt, kind, data)
        make = _RANK_EVENTS.get(kind)
        if make is not None:
            event = make(rank, attempt, data)
            self.feed(run, event)
            if isinstance(event, ev.CheckpointCommitted) and attempt == run.machine.attempt:
                self.placement.checkpointed(run.id, event.step, time.time())

    def _intake(self, run: Run, rank: int, attempt: int, kind: RankEvent, data: dict) -> None:
        """Journal and publish the metrics a rank sent. Rows of an earlier gang start are
        dropped: they belong to steps that a restart rolled back (or will replay)."""
        rows = data.pop("rows", None) or []
        logs = data.pop("logs", None) or []
        system = data.pop("system", None) or []
        beacon = data.pop("beacon", None)
        phases = data.pop("phases", None) or []
        if rank == 0 and phases:  # its step times: where the job's time went
            if attempt == run.machine.attempt:
                run.goodput.steps(phases, time.time())
            elif attempt < run.machine.attempt:
                run.goodput.late(phases)
        if attempt != run.machine.attempt:
            rows, phases, beacon = [], [], None
        self.watchdog.heard(run, rank, beacon)
        if not (rows or logs or system or phases):
            return
        digest = self._digest(run)
        digest.add(rank, rows, logs, system, phases)
        if rows:
            self.journal.add_metrics(run.id, rows)
            self.evidence.rows(run, rows)  # a NaN (on_nan="report"), a loss spike
            run.step = max(run.step or 0, max(r["step"] for r in rows))
            self.placement.progress(run.id, run.step, time.time())
            board = self._board(run)
            if board is not None:
                board.write(rows)
        if logs:
            self.journal.add_logs(run.id, logs)
        if system:
            self.journal.add_system(run.id, system)
        if phases:
            self.journal.add_phases(run.id, rank, phases)
        if digest.aggregated:  # its kernels get bands, once per tick (_publish_digests)
            return
        message: MetricsMessage = {
            "kind": "metrics",
            "rank": rank,
            "attempt": attempt,
            "sent": data.pop("sent", time.time()),
            "event": kind.value,
            "rows": rows,
            "logs": logs,
            "system": system,
            "phases": phases,
        }
        self.publish(run.id, message)

    def _digest(self, run: Run) -> Digest:
        """The job's per-step summaries (and, for a big job, what its kernels get next)."""
        machine = run.machine
        digest = run.digest
        if digest is None or digest.attempt != machine.attempt:
            if digest is not None:
                self._publish_digest(run)
            digest = run.digest = Digest(
                machine.world_size,
                int(config.get("dashboard.aggregate-above")),
                machine.attempt,
                restore=lambda step: self.journal.step_summary(run.id, step),
            )
        return digest

    def _publish_digests(self) -> None:
        for run in list(self.runs.values()):
            self._publish_digest(run)
        self.journal.flush()

    def _publish_digest(self, run: Run) -> None:
        digest = run.digest
        if digest is None:
            return
        message = digest.message()
        if message is not None:
            self.publish(run.id, message)
        summaries = digest.summaries()
        if summaries:
            self.journal.put_steps(run.id, summaries)

    def _board(self, run: Run) -> Any:
        """The job's TensorBoard writers, opened on its first rows (None without a dir)."""
        spec = run.machine.spec
        if not spec.tensorboard_dir:
            return None
        if run.board is None:
            from .tensorboard import JobBoard

            run.board = JobBoard(spec.tensorboard_dir, spec.world_size)
        return run.board

    # --- carrying out actions ------------------------------------------------------------
    def _journal(self, run: Run, action: ev.Journal) -> None:
        fields = action.fields
        if "status" in fields:
            now = time.time()
            run.goodput.status(fields["status"], now)
            fields = {**fields, "goodput": run.goodput.summary(now)}
        self.journal.update(run.id, **fields)

    def _publish(self, run: Run, action: ev.Publish) -> None:
        self.publish(run.id, action.message)

    def _start_gang(self, run: Run, action: ev.StartGang) -> None:
        self.scheduler.loop.add_callback(self._start, run, action.attempt, action.words)

    def _send_control(self, run: Run, action: ev.SendControl) -> None:
        for worker in action.workers:
            if worker in self.slots:
                self.scheduler.loop.add_callback(
                    self._control, worker, run.id, list(action.words), action.attempt
                )

    def _free_slot(self, run: Run, action: ev.FreeSlot) -> None:
        if self.busy.get(action.worker) == run.id:
            del self.busy[action.worker]
        if not run.machine.held:  # the gang's last slot: the policy may give them out
            self.placement.released(run.id, time.time())

    def _enqueue(self, run: Run, action: ev.Enqueue) -> None:
        # a restart keeps its place: its submission order stays (first among equals)
        self.placement.submit(run.machine.spec, time.time())

    def _dequeue(self, run: Run, action: ev.Dequeue) -> None:
        self.placement.cancel(run.id)

    def _start_timer(self, run: Run, action: ev.StartTimer) -> None:
        self.scheduler.loop.call_later(action.delay, self.feed, run, action.event)

    def _truncate(self, run: Run, action: ev.TruncateHistory) -> None:
        if run.digest is not None:
            run.digest.truncate(action.step)
        self.journal.truncate_history(run.id, action.step)
        run.goodput.rollback(action.step)
        run.step = None if run.step is None else min(run.step, action.step)
        self.publish(run.id, {"kind": "rollback", "step": action.step})

    def _close_board(self, run: Run, action: ev.CloseBoard) -> None:
        run.close_board()

    def _keep_event(self, run: Run, action: ev.Record) -> None:
        self.journal.add_event(
            run.id, time.time(), run.step, action.kind, action.message, action.data
        )

    def _collect_stacks(self, run: Run, action: ev.CollectStacks) -> None:
        self.scheduler.loop.add_callback(self.watchdog.keep_stacks, run)

    def _end_rank(self, run: Run, action: ev.EndRank) -> None:
        self.scheduler.loop.add_callback(self._end_rank_process, run.id, action)

    def _release(self, run: Run, action: ev.Release) -> None:
        self._publish_digest(run)  # its last bands and step summaries
        goodput = run.goodput.summary(time.time())
        self.journal.update(run.id, result=action.result, payload=None, goodput=goodput)
        self.runs.pop(run.id, None)
        self.placement.forget(run.id)
        run.done.set()

    # --- talking to agents ---------------------------------------------------------------
    async def _end_rank_process(self, job: str, action: ev.EndRank) -> None:
        """End a stuck rank: its worker kills the rank's process. A worker that does not
        answer (frozen itself) is restarted instead."""
        try:
            await asyncio.wait_for(
                self.call_worker(
                    action.worker,
                    WorkerOp.END_RANK,
                    job=job,
                    attempt=action.attempt,
                    reason=action.reason,
                ),
                END_RANK_WAIT,
            )
        except Exception as e:  # noqa: BLE001 - gone, or frozen: its nanny ends it
            if action.worker not in self.slots:
                return  # gone already: remove_worker took care of it
            logger.warning("clustersdk: worker %s did not end its rank (%r)", action.worker, e)
            # no new gang may land on it meanwhile: it comes back as a new worker
            self.slots.pop(action.worker, None)
            self.placement.scheduler.remove_slot(action.worker)
            await self._restart_worker_process(action.worker, action.reason)

    async def _restart_worker_process(self, worker: str, reason: str) -> None:
        """Restart a worker process (its nanny kills it, also when SIGSTOP froze it);
        without a nanny, take the worker out of the cluster."""
        logger.warning("clustersdk: restarting worker %s: %s", worker, reason)
        stimulus = f"clustersdk-hung-{time.time()}"
        try:
            await self.scheduler.restart_workers(
                [worker], timeout=30, wait_for_workers=False, on_error="raise", stimulus_id=stimulus
            )
        except Exception as e:  # noqa: BLE001 - no nanny, or it did not make it in time
            logger.warning("clustersdk: could not restart worker %s (%s); removing it", worker, e)
            await self.scheduler.remove_worker(worker, stimulus_id=stimulus, close=True)

    async def _start(self, run: Run, attempt: int, words: tuple[int, ...]) -> None:
        machine = run.machine
        spec, ranks = machine.spec, machine.ranks
        # the more ranks are busy, the less often each ships: the plane takes about
        # metrics-rate messages a second from all of them (job.update may change it)
        wire = spec.replace(
            metrics_interval=max(
                spec.metrics_interval, len(self.busy) / float(config.get("metrics-rate"))
            )
        ).as_dict()
        try:
            port = await self.call_worker(
                ranks[0].worker,
                WorkerOp.OPEN_STORE,
                job=run.id,
                world_size=spec.world_size,
                timeout=spec.timeout,
            )
        except Exception as e:  # the worker of rank 0 vanished: no rank starts
            results: list[Any] = [e] * len(ranks)
        else:
            results = await asyncio.gather(
                *(
                    self.call_worker(
                        slot.worker,
                        WorkerOp.START_RANK,
                        job=run.id,
                        rank=rank,
                        spec=wire,
                        payload=run.payload,
                        master_addr=ranks[0].host,
                        master_port=port,
                        words=list(words),
                        hosts=[r.host for r in ranks],
                    )
                    for rank, slot in enumerate(ranks)
                ),
                return_exceptions=True,
            )
        for rank, result in enumerate(results):
            if isinstance(result, Exception):
                logger.warning(
                    "clustersdk: could not start rank %d of job %s on %s: %r",
                    rank,
                    run.id,
                    ranks[rank].worker,
                    result,
                )
                self.feed(run, ev.StartFailed(rank, attempt, type(result).__name__, str(result)))

    async def _control(self, worker: str, job: str, words: list[int], attempt: int) -> None:
        try:
            # no answer awaited: a fan-out to 1,024 ranks costs half as much (words only
            # grow, so their order does not matter; a gone worker fails the write)
            await self.call_worker(
                worker, WorkerOp.CONTROL, job=job, words=words, attempt=attempt, reply=False
            )
        except Exception:  # the worker is gone; remove_worker deals with it
            logger.info("clustersdk: control words to %s failed", worker, exc_info=True)

    # --- waiting ---------------------------------------------------------------------------
    async def until(self, run: Run, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``predicate()`` holds (re-checked after every event of the job)."""
        async with run.changed:
            try:
                await asyncio.wait_for(run.changed.wait_for(predicate), timeout)
            except asyncio.TimeoutError:
                return False
        return True

    def _notify(self, run: Run) -> None:
        async def notify() -> None:
            async with run.changed:
                run.changed.notify_all()

        self.scheduler.loop.add_callback(notify)


# what the plugin does for each action of a lifecycle
_EXECUTORS: dict[type, Callable[[ControlPlane, Run, Any], None]] = {
    ev.Journal: ControlPlane._journal,
    ev.Publish: ControlPlane._publish,
    ev.StartGang: ControlPlane._start_gang,
    ev.SendControl: ControlPlane._send_control,
    ev.FreeSlot: ControlPlane._free_slot,
    ev.Enqueue: ControlPlane._enqueue,
    ev.Dequeue: ControlPlane._dequeue,
    ev.StartTimer: ControlPlane._start_timer,
    ev.TruncateHistory: ControlPlane._truncate,
    ev.CloseBoard: ControlPlane._close_board,
    ev.Record: ControlPlane._keep_event,
    ev.CollectStacks: ControlPlane._collect_stacks,
    ev.EndRank: ControlPlane._end_rank,
    ev.Release: ControlPlane._release,
    ev.Diagnosed: lambda plane, run, action: plane.evidence.diagnosed(run, action),
}

# which lifecycle event a rank's report is (METRICS carries rows only)
_RANK_EVENTS: dict[RankEvent, Callable[[int, int, dict], ev.Event]] = {
    RankEvent.STARTED: lambda rank, attempt, d: ev.Started(rank, attempt, d.get("versions")),
    RankEvent.LOOP: lambda rank, attempt, d: ev.LoopStarted(rank, attempt, d["total_steps"]),
    RankEvent.RESTORED: lambda rank, attempt, d: ev.Restored(
        rank, attempt, d["step"], d.get("path", "")
    ),
    RankEvent.PAUSED: lambda rank, attempt, d: ev.Paused(rank, attempt, d["step"]),
    RankEvent.RESUMED: lambda rank, attempt, d: ev.Resumed(rank, attempt, d.get("step", 0)),
    RankEvent.CHECKPOINT: lambda rank, attempt, d: ev.CheckpointCommitted(
        rank, attempt, d["seq"], d["step"], d["path"]
    ),
    RankEvent.CHECKPOINT_FAILED: lambda rank, attempt, d: ev.CheckpointFailed(
        rank, attempt, d["seq"], d["step"], d["message"]
    ),
    RankEvent.FAILED: lambda rank, attempt, d: ev.Failed(rank, attempt, d["error"]),
    RankEvent.PROFILED: lambda rank, attempt, d: ev.Profiled(rank, attempt, d["seq"], d["profile"]),
    RankEvent.HELD: lambda rank, attempt, d: ev.Held(
        rank, attempt, d["error"], d.get("frames") or [], d.get("step")
    ),
    RankEvent.BREAK: lambda rank, attempt, d: ev.BreakpointHit(rank, attempt, d["k"], d["step"]),
    RankEvent.CONSOLE: lambda rank, attempt, d: ev.ConsoleOutput(
        rank, attempt, d["k"], d.get("text", ""), bool(d.get("closed"))
    ),
    RankEvent.TUNABLE: lambda rank, attempt, d: ev.Tunable(rank, attempt, d["info"]),
    RankEvent.RAN: lambda rank, attempt, d: ev.Ran(
        rank, attempt, d["seq"], d.get("result"), d.get("error")
    ),
    RankEvent.UPDATED: lambda rank, attempt, d: ev.Updated(
        rank, attempt, d["seq"], d.get("step"), d.get("changes") or {}, d.get("error")
    ),
    RankEvent.NONFINITE: lambda rank, attempt, d: ev.NonFinite(
        rank, attempt, d["step"], d["values"]
    ),
    RankEvent.CONTROLS: lambda rank, attempt, d: ev.Controls(
        rank, attempt, tuple(d.get("accepts") or ())
    ),
    RankEvent.EXIT: lambda rank, attempt, d: ev.Exited(
        rank, attempt, ExitStatus(d["status"]), d.get("result")
    ),
}


class _ExpectedErrors(logging.Filter):
    """Drop Dask's "Exception while handling op" log for errors we raise on purpose.

    They reach the caller as exceptions with a clear message; logging them with
    a traceback as well (in a notebook, on the kernel's stderr: the scheduler of
    a local cluster runs there) would look like a crash.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ClusterSDKError))


def _quiet_expected_errors() -> None:
    core = logging.getLogger("distributed.core")
    if not any(isinstance(f, _ExpectedErrors) for f in core.filters):
        core.addFilter(_ExpectedErrors())
