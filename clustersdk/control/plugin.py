"""The control plane: a Dask ``SchedulerPlugin`` that owns jobs and slots.

It keeps the slot inventory the worker agents report, queues jobs, allocates
whole gangs through :mod:`.policy`, tells the chosen agents to start their
ranks, follows what the ranks report and journals everything in SQLite.
Every method runs on the scheduler's event loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .. import config
from ..errors import (
    CapacityError,
    CheckpointError,
    ClusterSDKError,
    InvalidTransitionError,
    JobNotFoundError,
    JobTimeoutError,
    SpecError,
)
from ..layout import Layout
from ..status import TRANSITIONS, JobStatus, check_transition
from . import policy
from .journal import Journal

logger = logging.getLogger(__name__)

PLUGIN_NAME = "clustersdk-control"
STOP, SUSPEND, PAUSE, RESUME, CHECKPOINT = range(5)  # the control vector (runtime/control.py)
_RESTARTABLE = (JobStatus.STARTING, JobStatus.RUNNING, JobStatus.PAUSED)  # on a lost worker


def topic(job: str) -> str:
    """The Dask event topic a job's metrics, logs and status changes go to."""
    return f"clustersdk-job-{job}"


@dataclasses.dataclass
class Run:
    """What the plugin holds in memory about a job that isn't terminal yet."""

    spec: dict[str, Any]
    payload: bytes
    status: JobStatus = JobStatus.QUEUED
    slots: list[policy.Slot] = dataclasses.field(default_factory=list)
    started: set[int] = dataclasses.field(default_factory=set)
    exited: dict[int, dict] = dataclasses.field(default_factory=dict)
    paused: dict[int, int] = dataclasses.field(default_factory=dict)  # rank -> step
    control: list[int] = dataclasses.field(default_factory=lambda: [0] * 5)
    checkpoint_seq: int = 0        # newest CHECKPOINT request committed
    checkpoint_failed_seq: int = -1
    restarts: int = 0              # gang restarts after lost workers, of spec["max_restarts"]
    restart_paused: bool = False   # it was PAUSED when it lost a worker: comes back PAUSED
    # a rank's failure, held back for a moment: was it a peer's lost worker? (then: restart)
    held_failure: dict | None = None
    result: bytes | None = None
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    changed: asyncio.Condition = dataclasses.field(default_factory=asyncio.Condition)
    board: Any = None  # TensorBoard writers, with tensorboard_dir

    def close_board(self) -> None:
        if self.board is not None:
            self.board.close()  # flushed before wait() returns
            self.board = None

    def reset_ranks(self) -> None:
        self.slots, self.started, self.exited, self.paused = [], set(), {}, {}
        self.control = [0] * 5
        self.held_failure, self.result = None, None

    @property
    def id(self) -> str:
        return self.spec["id"]

    @property
    def attempt(self) -> int:
        """Counts the job's gang starts after the first: restarts and resumes."""
        return self.spec.get("attempt", 0)


class ControlPlane(SchedulerPlugin):
    """Job registry, slot inventory and gang allocation, inside the scheduler."""

    name = PLUGIN_NAME
    idempotent = True  # a second client must not replace the live registry

    def __init__(self, state_dir: str):
        self.state_dir = state_dir

    # lifecycle -------------------------------------------------------------
    async def start(self, scheduler) -> None:
        _quiet_expected_errors()
        self.scheduler = scheduler
        self.id = scheduler.id
        self.journal = Journal(os.path.join(self.state_dir, "journal.sqlite"))
        self.slots: dict[str, policy.Slot] = {}
        self.busy: dict[str, str] = {}       # worker address -> job id
        self.queue: list[str] = []           # queued job ids, FIFO
        self.runs: dict[str, Run] = {}       # non-terminal jobs
        # an autoscaling cluster (Cluster.slurm): the most slots it can grow to, and what
        # queued jobs wait for besides free slots (e.g. Slurm's pending reason)
        self.capacity, self.note = 0, ""
        for name in (
            "worker_ready", "submit", "stop", "wait", "job", "jobs",
            "pause", "resume", "checkpoint", "suspend",
            "history", "logs", "system", "inventory", "rank_event", "set_capacity",
        ):
            scheduler.handlers[f"clustersdk_{name}"] = getattr(self, f"_h_{name}")

    async def close(self) -> None:
        for run in list(self.runs.values()):
            # a SUSPENDED job keeps its record and checkpoint (resume="auto" finds it)
            if JobStatus.FAILED in TRANSITIONS[run.status]:
                self._finish(run, JobStatus.FAILED, error=_error(
                    None, "SchedulerClosed", "the Dask scheduler shut down while the job was active"))
        self.journal.close()

    def remove_worker(self, scheduler, worker: str, **kwargs: Any) -> None:
        self.slots.pop(worker, None)
        job = self.busy.pop(worker, None)
        run = self.runs.get(job) if job else None
        if run is None:
            return
        rank = next(i for i, s in enumerate(run.slots) if s.worker == worker)
        run.exited[rank] = {"status": "lost"}
        self._lost(run, rank, "WorkerLost",
                   f"worker {worker} (host {run.slots[rank].host}) of rank {rank} left the cluster")
        self._maybe_done(run)
        self._schedule()
        self._notify(run)

    def log_event(self, topic_name: str, msg: Any) -> None:
        if topic_name.startswith("clustersdk-job-") and isinstance(msg, dict) and msg.get("kind") == "metrics":
            job = topic_name[len("clustersdk-job-"):]
            if msg.get("rows"):
                self.journal.add_metrics(job, msg["rows"])
                board = self._board(job)
                if board is not None:
                    board.write(msg["rows"])
            if msg.get("logs"):
                self.journal.add_logs(job, msg["logs"])
            if msg.get("system"):
                self.journal.add_system(job, msg["system"])

    def _board(self, job: str):
        """The job's TensorBoard writers, opened on its first rows (None without a dir)."""
        run = self.runs.get(job)
        if run is None or not run.spec.get("tensorboard_dir"):
            return None
        if run.board is None:
            from ..runtime.tensorboard import JobBoard

            run.board = JobBoard(run.spec["tensorboard_dir"], run.spec["world_size"])
        return run.board

    # handlers: inventory -----------------------------------------------------
    def _h_worker_ready(self, slot: dict) -> None:
        self.slots[slot["worker"]] = policy.Slot(**slot)
        self._schedule()

    def _h_inventory(self) -> list[dict]:
        return [
            {**dataclasses.asdict(s), "job": self.busy.get(s.worker)}
            for s in policy.rank_order(self.slots.values())
        ]

    # handlers: jobs ------------------------------------------------------------
    def _h_set_capacity(self, slots: int, note: str = "") -> None:
        self.capacity, self.note = int(slots), str(note)
        self._schedule()  # rewrites the queued jobs' reasons

    def _check_capacity(self, ws: int) -> None:
        total = max(len(self.slots), self.capacity)
        if ws > total:
            raise CapacityError(
                f"world_size={ws} is more than this cluster can ever hold: it has {total} "
                f"slot(s) on {len({s.host for s in self.slots.values()})} host(s); add workers or "
                "ask for fewer ranks"
            )

    def _h_submit(self, spec: dict, payload: bytes) -> dict:
        self._check_capacity(spec["world_size"])
        clash = self.journal.find(self.id, spec["name"])
        if clash and not JobStatus[clash["status"]].terminal:
            raise SpecError(
                f"a job named {spec['name']!r} is already {clash['status']}; stop it or pick "
                "another name"
            )
        run = Run(spec=spec, payload=payload)
        self.runs[run.id] = run
        self.journal.add_job({
            "id": run.id, "name": spec["name"], "scheduler": self.id,
            "status": JobStatus.QUEUED.name, "spec": spec, "submitted": time.time(),
        })
        self.queue.append(run.id)
        self._schedule()
        return self._record(run.id)

    def _h_stop(self, job: str) -> dict:
        run = self.runs.get(job)
        if run is None:
            record = self._record(job)
            raise InvalidTransitionError(
                f"job {record['name']!r} is {record['status']}; there is nothing to stop"
            )
        if run.status in (JobStatus.QUEUED, JobStatus.SUSPENDED):
            if job in self.queue:
                self.queue.remove(job)
            self._finish(run, JobStatus.STOPPED, reason=f"stopped while {run.status.name}")
            self._schedule()
        elif run.status is not JobStatus.STOPPING:  # a RESTARTING job then stops for good
            self._transition(run, JobStatus.STOPPING, reason="stop requested")
            run.control[STOP] = 1
            self._broadcast(run)
        return self._record(job)

    async def _h_pause(self, job: str, timeout: float | None = None) -> dict:
        run = self._active(job, "pause")
        check_transition(run.spec["name"], run.status, JobStatus.PAUSED)
        if run.control[PAUSE] <= run.control[RESUME]:
            run.control[PAUSE] = run.control[RESUME] + 1
            run.paused.clear()
            self._broadcast(run)
        if not await self._until(run, lambda: run.status is not JobStatus.RUNNING, timeout):
            run.control[RESUME] = run.control[PAUSE]  # withdraw the request
            self._broadcast(run)
            raise JobTimeoutError(
                f"job {run.spec['name']!r} did not pause within {timeout} s: its ranks reach no step "
                "boundary (does the training function iterate over ctx.loop?)"
            )
        if run.status is not JobStatus.PAUSED:
            raise InvalidTransitionError(
                f"job {run.spec['name']!r} became {run.status.name} before it could pause"
            )
        return self._record(job)

    def _h_resume(self, job: str, world_size: int | None = None) -> dict:
        run = self._active(job, "resume")
        name = run.spec["name"]
        if run.status is JobStatus.PAUSED:
            if world_size not in (None, run.spec["world_size"]):
                raise SpecError(
                    f"job {name!r} is PAUSED and keeps its process group of "
                    f"{run.spec['world_size']} ranks; to resume at world_size={world_size}, "
                    "suspend it first"
                )
            run.control[RESUME] = run.control[PAUSE]
            self._broadcast(run)
            self._transition(run, JobStatus.RUNNING, reason="")
        elif run.status is JobStatus.SUSPENDED:
            ws = run.spec["world_size"] if world_size is None else world_size
            if isinstance(ws, bool) or not isinstance(ws, int) or ws <= 0:
                raise SpecError(f"world_size must be a positive int, got {ws!r}")
            self._check_capacity(ws)
            Layout.resolve(run.spec["strategy"], run.spec.get("mesh"), ws)  # a mesh that fits ws
            record = self.journal.get(job)
            run.reset_ranks()
            run.spec = {**run.spec, "world_size": ws, "resume": record["checkpoint"],
                        "attempt": run.attempt + 1}
            self.journal.update(job, spec=run.spec)
            self._transition(run, JobStatus.QUEUED, reason="")
            self.queue.append(job)
            self._schedule()
        else:
            raise InvalidTransitionError(
                f"job {name!r} is {run.status.name}; only a PAUSED or SUSPENDED job can be resumed"
            )
        return self._record(job)

    async def _h_checkpoint(self, job: str, timeout: float | None = None) -> dict:
        run = self._active(job, "checkpoint")
        self._need_checkpoint_dir(run, "checkpoint")
        if run.status not in (JobStatus.RUNNING, JobStatus.PAUSED):
            raise InvalidTransitionError(
                f"job {run.spec['name']!r} is {run.status.name}; a checkpoint needs a RUNNING or "
                "PAUSED job"
            )
        run.control[CHECKPOINT] += 1
        seq = run.control[CHECKPOINT]
        self._broadcast(run)
        done = await self._until(run, lambda: run.checkpoint_seq >= seq
                                 or run.checkpoint_failed_seq >= seq or run.status.terminal, timeout)
        record = self._record(job)
        if run.checkpoint_seq >= seq:
            return record
        if run.checkpoint_failed_seq >= seq:
            raise CheckpointError(
                f"checkpoint of job {run.spec['name']!r} failed: {record['checkpoint_error']}; the "
                f"previous one is kept ({record['checkpoint'] or 'none yet'})"
            )
        if not done:
            raise JobTimeoutError(f"job {run.spec['name']!r} did not checkpoint within {timeout} s")
        raise InvalidTransitionError(f"job {run.spec['name']!r} became {run.status.name} before "
                                     "it could checkpoint")

    async def _h_suspend(self, job: str, timeout: float | None = None) -> dict:
        run = self._active(job, "suspend")
        self._need_checkpoint_dir(run, "suspend")
        check_transition(run.spec["name"], run.status, JobStatus.SUSPENDING)
        self._transition(run, JobStatus.SUSPENDING, reason="suspend requested")
        run.control[SUSPEND] = 1
        self._broadcast(run)
        await self._until(run, lambda: run.status is not JobStatus.SUSPENDING, timeout)
        record = self._record(job)
        if run.status is not JobStatus.SUSPENDED and run.status is not JobStatus.SUSPENDING:
            raise InvalidTransitionError(
                f"job {run.spec['name']!r} became {run.status.name} instead of SUSPENDED"
            )
        return record

    async def _h_wait(self, job: str, timeout: float | None = None) -> dict:
        run = self.runs.get(job)
        if run is not None:
            try:
                await asyncio.wait_for(run.done.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return self._record(job, with_result=True)

    def _h_job(self, job: str | None = None, name: str | None = None) -> dict:
        if job is None:
            found = self.journal.find(self.id, name)
            if found is None:
                known = sorted({r["name"] for r in self.journal.jobs(self.id)})
                raise JobNotFoundError(
                    f"no job named {name!r} on this cluster; known jobs: {', '.join(known) or 'none'}"
                )
            job = found["id"]
        return self._record(job)

    def _h_jobs(self) -> list[dict]:
        return [_public(r) for r in self.journal.jobs(self.id)]

    def _h_history(self, job: str, since: int = 0, limit: int | None = None) -> list[dict]:
        return self.journal.history(job, since, limit)

    def _h_system(self, job: str, since: int = 0) -> list[dict]:
        return self.journal.system(job, since)

    def _h_logs(self, job: str, rank: int | None = None, since: int = 0) -> list[dict]:
        return self.journal.logs(job, rank, since)

    # handlers: ranks ---------------------------------------------------------
    def _h_rank_event(self, job: str, rank: int, event: str, data: dict | None = None,
                      attempt: int = 0) -> None:
        data = data or {}
        final = {key: data.pop(key, []) for key in ("rows", "logs", "system")}
        data.pop("kind", None)
        if any(final.values()):
            # through the broker, so that subscribers see the last rows too
            self.scheduler.log_event(topic(job), {"kind": "metrics", "rank": rank, "event": event,
                                                  **final})
        run = self.runs.get(job)
        if run is None or attempt != run.attempt:  # over, or a rank of an earlier start
            return
        if event == "started":
            run.started.add(rank)
            if run.status is JobStatus.STARTING and len(run.started) == run.spec["world_size"]:
                self._transition(run, JobStatus.RUNNING, started=time.time(), reason="")
        elif event == "paused":
            run.paused[rank] = data["step"]
            if run.status is JobStatus.RUNNING and len(run.paused) == run.spec["world_size"]:
                self._transition(run, JobStatus.PAUSED, paused_at=max(run.paused.values()))
        elif event == "resumed":
            run.paused.pop(rank, None)
        elif event == "loop":
            self.journal.update(job, total_steps=data["total_steps"])
            self.scheduler.log_event(topic(job), {"kind": "progress",
                                                  "total_steps": data["total_steps"]})
        elif event == "restored":
            # the history goes on from the checkpoint's step: rows logged after it
            # (by a run that died before its next checkpoint) are replaced
            self.journal.truncate_history(job, data["step"])
        elif event == "checkpoint":
            run.checkpoint_seq = max(run.checkpoint_seq, data["seq"])
            self.journal.update(job, checkpoint=data["path"], checkpoint_step=data["step"],
                                checkpoint_error=None)
            self.scheduler.log_event(topic(job), {"kind": "checkpoint", "path": data["path"],
                                                  "step": data["step"]})
        elif event == "checkpoint_failed":
            run.checkpoint_failed_seq = max(run.checkpoint_failed_seq, data["seq"])
            self.journal.update(job, checkpoint_error=f"step {data['step']}: {data['message']}")
            self.scheduler.log_event(topic(job), {"kind": "checkpoint_failed",
                                                  "step": data["step"], "message": data["message"]})
        elif event == "failed":
            # while RESTARTING, the other ranks fail for want of the lost one: not news
            if run.status.terminal or run.status is JobStatus.RESTARTING:
                pass
            elif run.spec.get("max_restarts", 0) and run.status in _RESTARTABLE:
                # A rank often sees a dead peer (connection reset) before Dask tells us the
                # peer's worker left: hold the failure back for a moment to tell them apart.
                if run.held_failure is None:
                    run.held_failure = data["error"]
                    self.scheduler.loop.call_later(float(config.get("failure-grace")),
                                                   self._release_held_failure, run, run.attempt)
            else:
                self._fail(run, data["error"])
        elif event == "exit":
            run.exited[rank] = data
            if rank == 0 and data.get("result") is not None:
                run.result = data["result"]
            slot = run.slots[rank]
            if self.busy.get(slot.worker) == job:
                del self.busy[slot.worker]
            self._maybe_done(run)
            self._schedule()
        self._notify(run)

    # internals -----------------------------------------------------------------
    def _schedule(self) -> None:
        free = [s for w, s in self.slots.items() if w not in self.busy]
        pending = [policy.Pending(j, self.runs[j].spec["world_size"]) for j in self.queue]
        for job, gang in policy.schedule(pending, free):
            self.queue.remove(job)
            run = self.runs[job]
            run.slots = gang
            for slot in gang:
                self.busy[slot.worker] = job
            ranks = [{"rank": i, "worker": s.worker, "host": s.host, "device": _device(s)}
                     for i, s in enumerate(gang)]
            self._transition(run, JobStatus.STARTING, ranks=ranks, reason="")
            self.scheduler.loop.add_callback(self._start, run)
        nfree, total = len(self.slots) - len(self.busy), len(self.slots)
        for ahead, job in enumerate(self.queue):
            reason = policy.wait_reason(self.runs[job].spec["world_size"], nfree, total, ahead)
            self.journal.update(job, reason=f"{reason}; {self.note}" if self.note else reason)

    async def _start(self, run: Run) -> None:
        spec, gang, attempt = run.spec, run.slots, run.attempt
        try:
            port = await self.scheduler.rpc(gang[0].worker).clustersdk_open_store(
                job=run.id, world_size=spec["world_size"], timeout=spec["timeout"]
            )
        except Exception as e:  # the worker of rank 0 vanished: no rank starts
            results: list[Any] = [e] * len(gang)
        else:
            results = await asyncio.gather(*(
                self.scheduler.rpc(slot.worker).clustersdk_start_rank(
                    job=run.id, rank=rank, spec=spec, payload=run.payload,
                    master_addr=gang[0].host, master_port=port,
                )
                for rank, slot in enumerate(gang)
            ), return_exceptions=True)
        failed = {rank: e for rank, e in enumerate(results) if isinstance(e, Exception)}
        if run.attempt != attempt:  # restarted meanwhile: these ranks are not the job's any more
            return
        if not failed:
            if any(run.control):  # e.g. the pause of a job that was PAUSED before its restart
                self._broadcast(run)
            return
        for rank, e in failed.items():  # these never report an exit; the others will
            logger.warning("clustersdk: could not start rank %d of job %s on %s: %r",
                           rank, run.id, gang[rank].worker, e)
            if self.busy.get(gang[rank].worker) == run.id:
                del self.busy[gang[rank].worker]
            run.exited.setdefault(rank, {"status": "not started"})
        rank, e = next(iter(failed.items()))
        if run.status is not JobStatus.RESTARTING:  # else remove_worker has seen to it
            self._lost(run, rank, type(e).__name__,
                       f"could not start rank {rank} on worker {gang[rank].worker}: {e}")
        self._maybe_done(run)
        self._schedule()

    def _broadcast(self, run: Run) -> None:
        """Send the job's control vector to each of its ranks' agents."""
        for slot in run.slots:
            if slot.worker in self.slots:
                self.scheduler.loop.add_callback(self._control, slot.worker, run.id,
                                                 list(run.control), run.attempt)

    async def _control(self, worker: str, job: str, words: list[int], attempt: int) -> None:
        try:
            await self.scheduler.rpc(worker).clustersdk_control(job=job, words=words,
                                                                attempt=attempt)
        except Exception:  # the worker is gone; remove_worker deals with it
            logger.info("clustersdk: control words to %s failed", worker, exc_info=True)

    def _active(self, job: str, action: str) -> Run:
        run = self.runs.get(job)
        if run is None:
            record = self._record(job)
            raise InvalidTransitionError(
                f"job {record['name']!r} is {record['status']}; it cannot {action}"
            )
        return run

    def _need_checkpoint_dir(self, run: Run, action: str) -> None:
        if not run.spec.get("checkpoint_dir"):
            raise SpecError(
                f"job {run.spec['name']!r} has no checkpoint_dir, so it cannot {action}; launch it "
                "with checkpoint_dir=..."
            )

    async def _until(self, run: Run, predicate, timeout: float | None) -> bool:
        """Wait until ``predicate()`` holds (re-checked on every event of the job)."""
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

    def _fail(self, run: Run, error: dict) -> None:
        """First error wins; the other ranks are told to stop and will exit."""
        self._finish(run, JobStatus.FAILED, error=error, reason="")
        run.control[STOP] = 1
        self._broadcast(run)

    def _can_restart(self, run: Run) -> bool:
        return run.status in _RESTARTABLE and run.restarts < run.spec.get("max_restarts", 0)

    def _release_held_failure(self, run: Run, attempt: int) -> None:
        """No worker of the job was lost after all: the held-back failure is the job's."""
        if run.held_failure is not None and run.attempt == attempt and not run.status.terminal \
                and run.status is not JobStatus.RESTARTING:
            self._fail(run, run.held_failure)
            self._maybe_done(run)

    def _lost(self, run: Run, rank: int, exc_type: str, message: str) -> None:
        """Rank ``rank``'s worker is gone (or could not start it): restart the gang
        while the job's restart budget lasts, else fail the job."""
        budget = run.spec.get("max_restarts", 0)
        run.held_failure = None  # the peers of the lost rank failed for want of it
        if run.status is JobStatus.RESTARTING:
            return  # another worker of the gang (a whole host): part of the same restart
        if self._can_restart(run):
            run.restarts += 1
            run.restart_paused = run.status is JobStatus.PAUSED
            self._transition(run, JobStatus.RESTARTING, restarts=run.restarts, reason=(
                f"{message}; restart {run.restarts} of {budget}: the other ranks stop first"))
            run.control[STOP] = 1
            self._broadcast(run)
        elif not run.status.terminal:
            if budget and run.status in _RESTARTABLE:
                message += f" (all {budget} restart(s) of the job are used up)"
            self._fail(run, _error(rank, exc_type, message))

    def _restart(self, run: Run) -> None:
        """Every rank of the lost gang is gone: queue the job again, first in line, to
        continue from its newest committed checkpoint (or from the start without one)."""
        record = self.journal.get(run.id)
        resume = record["checkpoint"] or run.spec.get("resume")
        # the history goes on from where the new run begins (its "restored" event
        # trims it again if an explicit resume= loads an older step)
        start = record["checkpoint_step"] if record["checkpoint"] else 0
        self.journal.truncate_history(run.id, start)
        run.reset_ranks()
        run.spec = {**run.spec, "resume": resume, "attempt": run.attempt + 1}
        if run.restart_paused:
            run.control[PAUSE] = 1
        where = f"from checkpoint {resume}" if resume else "from the start (no checkpoint)"
        self.journal.update(run.id, spec=run.spec)
        self._transition(run, JobStatus.QUEUED, reason=f"restart {run.restarts}: {where}")
        self.queue.insert(0, run.id)
        self._schedule()

    def _maybe_done(self, run: Run) -> None:
        if len(run.exited) < run.spec["world_size"]:
            return
        if run.status is JobStatus.RESTARTING:
            self._restart(run)
            return
        if run.held_failure is not None and not run.status.terminal:
            self._fail(run, run.held_failure)  # every rank is out and no worker was lost
        if run.status is JobStatus.SUSPENDING and all(
            e.get("status") == "suspended" for e in run.exited.values()
        ):
            self._transition(run, JobStatus.SUSPENDED, reason="suspended: resume() to continue")
            run.close_board()
            return  # stays in self.runs, with its payload, for resume()
        if not run.status.terminal:
            final = JobStatus.STOPPED if run.status is JobStatus.STOPPING else JobStatus.FINISHED
            self._finish(run, final, reason="")
        self._release(run)

    def _release(self, run: Run) -> None:
        """The job is over and nothing of it runs: store the result, wake waiters."""
        run.close_board()
        self.journal.update(run.id, result=run.result)
        self.runs.pop(run.id, None)
        run.done.set()

    def _finish(self, run: Run, status: JobStatus, **fields: Any) -> None:
        self._transition(run, status, ended=time.time(), **fields)
        if all(self.busy.get(s.worker) != run.id for s in run.slots):
            self._release(run)  # nothing runs: nobody will report an exit

    def _transition(self, run: Run, status: JobStatus, **fields: Any) -> None:
        check_transition(run.spec["name"], run.status, status)
        run.status = status
        self.journal.update(run.id, status=status.name, **fields)
        self.scheduler.log_event(topic(run.id), {"kind": "status", "status": status.name})
        self._notify(run)

    def _record(self, job: str, with_result: bool = False) -> dict:
        record = self.journal.get(job)
        if record is None:
            raise JobNotFoundError(f"no job with id {job!r} on this cluster")
        return record if with_result else _public(record)


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


def _public(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "result"}


def _device(slot: policy.Slot) -> str:
    return f"cuda:{slot.index}" if slot.kind == "cuda" else "cpu"


def _error(rank: int | None, exc_type: str, message: str, traceback: str = "") -> dict:
    return {"rank": rank, "type": exc_type, "message": message, "traceback": traceback}
