"""The control plane's side of the scheduling policy.

:class:`Placement` keeps a :class:`~.scheduling.Scheduler` in step with the
jobs' lifecycles (submissions, slots, progress, checkpoints, pauses, releases)
and turns its decisions into lifecycle events, which the plane feeds: a gang to
start (``Allocated``), a victim to preempt (``Preempted``), an idle job to
reclaim (``Reclaimed``), a job to grow back (``Grow``); and it journals, for every
waiting job, the line its ``reason`` shows. The rules themselves are all in
:mod:`.scheduling` (pure); this is bookkeeping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..protocol import WireSpec
from ..status import JobStatus
from . import events as ev
from .journal import Journal
from .plane import Run
from .scheduling import PolicyConfig, Request, Scheduler, Slot, admit

# what the policy's holdings say for a lifecycle state
_HOLD = {
    JobStatus.PAUSED: "paused",
    JobStatus.SUSPENDING: "suspending",
    JobStatus.STOPPING: "stopping",
}


class Placement:
    """Which job runs where, and why the others wait, for one control plane."""

    def __init__(self, journal: Journal, config: PolicyConfig):
        self.journal = journal
        self.scheduler = Scheduler(config)
        self.seqs: dict[str, tuple[int, float]] = {}  # job -> (submission order, time)
        self.reasons: dict[str, str] = {}  # the wait reason last journaled
        self.preempted: dict[str, str] = {}  # why it left, until it runs again

    @property
    def config(self) -> PolicyConfig:
        return self.scheduler.config

    # --- launch -------------------------------------------------------------------------
    def admit(self, spec: WireSpec, total_slots: int) -> WireSpec:
        """Resolve the queue and priority of ``spec``; refuse a job that can never fit."""
        admission = admit(
            self.config,
            world_size=spec.world_size,
            queue=spec.queue,
            priority=spec.priority,
            preemptible=spec.preemptible,
            time_limit=spec.time_limit,
            min_world_size=spec.min_world_size,
            total_slots=total_slots or None,
        )
        return spec.replace(queue=admission.queue, priority=admission.priority)

    def request(self, spec: WireSpec) -> Request:
        seq, submitted = self.seqs[spec.id]
        # a job running on fewer ranks than asked (min_world_size) asks for all again
        return Request(
            id=spec.id,
            world_size=spec.asked_world_size or spec.world_size,
            owner=spec.owner or "",
            queue=spec.queue or self.config.default_queue,
            priority=self.config.priority(spec.priority),
            seq=seq,
            submitted_at=submitted,
            min_world_size=spec.min_world_size,
            preemptible=spec.preemptible,
            time_limit=spec.time_limit,
            has_checkpoint_dir=bool(spec.checkpoint_dir),
            name=spec.name,
        )

    # --- what happens to jobs -----------------------------------------------------------------
    def submit(self, spec: WireSpec, now: float, seq: int | None = None) -> int:
        """Queue the job (again: in its old place, ``seq`` kept); its submission number."""
        if spec.id not in self.seqs:
            order = self.scheduler.next_seq() if seq is None else seq
            self.seqs[spec.id] = (order, now)
        if spec.id in self.scheduler.holdings:  # slots still its own: queued once released
            return self.seqs[spec.id][0]
        if spec.id not in self.scheduler.queued:
            self.scheduler.submit(self.request(spec))
        return self.seqs[spec.id][0]

    def cancel(self, job: str) -> None:
        if job in self.scheduler.queued:
            self.scheduler.cancel(job)
        self.reasons.pop(job, None)
        self.preempted.pop(job, None)

    def released(self, job: str, now: float) -> None:
        """The job holds no slot any more (its lifecycle queues it again if it must)."""
        if job in self.scheduler.holdings:
            self.scheduler.released(job, now, requeue=False)

    def forget(self, job: str) -> None:
        self.cancel(job)
        self.seqs.pop(job, None)

    def status(self, run: Run, before: JobStatus, now: float) -> None:
        """Tell the policy what a change of the job's state means to it."""
        job, after = run.id, run.machine.status
        if job not in self.scheduler.holdings or after is before:
            return
        if after is JobStatus.PAUSED:
            self.scheduler.paused(job, now)
        elif before is JobStatus.PAUSED and after is JobStatus.RUNNING:
            self.scheduler.resumed(job, now)
        elif after is JobStatus.SUSPENDING and not run.machine.sharing.preempted:
            self.scheduler.suspending(job, now)  # the user's: it won't come back by itself

    def progress(self, job: str, step: int, now: float) -> None:
        if job in self.scheduler.holdings:
            self.scheduler.progress(job, now, step=step)

    def checkpointed(self, job: str, step: int, now: float) -> None:
        if job in self.scheduler.holdings:
            self.scheduler.checkpointed(job, now, step=step)

    # --- deciding ----------------------------------------------------------------------------
    def decide(
        self, now: float, runs: Mapping[str, Run], note: str = ""
    ) -> list[tuple[Run, ev.Event]]:
        """One decision of the policy: the events it means for the jobs of ``runs``, in
        order (``note``: what else queued jobs wait for, e.g. Slurm's pending reason)."""
        decision = self.scheduler.decide(now)
        out: list[tuple[Run, ev.Event]] = []
        for start in decision.start:
            self.reasons.pop(start.job, None)
            self.preempted.pop(start.job, None)
            out.append(
                (
                    runs[start.job],
                    ev.Allocated(
                        tuple(ev.RankSlot(s.worker, s.host, _device(s)) for s in start.slots)
                    ),
                )
            )
        for preempt in decision.preempt:
            if preempt.job in runs:
                if not preempt.overdue:
                    self.preempted[preempt.job] = preempt.reason
                out.append(
                    (runs[preempt.job], ev.Preempted(preempt.how, preempt.reason, preempt.overdue))
                )
        for reclaim in decision.reclaim:
            if reclaim.job in runs:
                out.append((runs[reclaim.job], ev.Reclaimed(reclaim.how, reclaim.reason)))
        out += self._grow(decision, runs)
        note = f"; {note}" if note else ""
        for job in list(self.scheduler.queued):
            wait = decision.waiting.get(job)
            if wait is None:
                continue
            reason = wait.reason + note
            if job in self.preempted:  # why it left first, then what it waits for now
                reason = f"{self.preempted[job]} ({reason})"
            if self.reasons.get(job) != reason:
                self.reasons[job] = reason
                self.journal.update(job, reason=reason, estimated_start=wait.estimated_start)
        return out

    def _grow(self, decision: Any, runs: Mapping[str, Run]) -> list[tuple[Run, ev.Event]]:
        """A job running on fewer ranks than it asked for grows back when the slots it
        lacks are free and nobody waits for them."""
        if self.scheduler.queued or decision.start:
            return []
        free = len(self.scheduler.inventory) - sum(
            len(h.slots) for h in self.scheduler.holdings.values()
        )
        out: list[tuple[Run, ev.Event]] = []
        for run in runs.values():
            spec, machine = run.machine.spec, run.machine
            if (
                spec.asked_world_size
                and machine.status is JobStatus.RUNNING
                and not machine.sharing.preempted
                and spec.checkpoint_dir
                and free >= spec.asked_world_size - spec.world_size
            ):
                free -= spec.asked_world_size - spec.world_size
                out.append((run, ev.Grow(spec.asked_world_size)))
        return out

    # --- admin and views ------------------------------------------------------------------------
    def configure(self, changes: Mapping[str, Any]) -> PolicyConfig:
        """An admin's change of the queues, quotas or classes (running jobs go on)."""
        config = self.scheduler.configure(changes)
        self.reasons.clear()  # every wait may read differently now
        return config

    def view(self, names: Mapping[str, str], now: float) -> dict[str, Any]:
        """Per queue: who holds what, what waits and why (see :func:`queue_view`)."""
        return queue_view(self.scheduler, names, now)


def queue_view(scheduler: Scheduler, names: Mapping[str, str], now: float) -> dict[str, Any]:
    """A JSON model of the queues: guarantees and limits, the jobs holding slots and the
    jobs waiting (in the order they would start), with their reasons and estimates."""
    config = scheduler.config
    total = len(scheduler.inventory)
    waits = scheduler.waits
    queues: dict[str, dict[str, Any]] = {}
    for name in config.queues:
        limit = config.limit(name, total)
        queues[name] = {
            "name": name,
            "guaranteed": config.guaranteed(name, total),
            "limit": None if limit == float("inf") else int(limit),
            "used": 0,
            "holding": [],
            "waiting": [],
        }
    users: dict[str, int] = {}
    for holding in scheduler.holdings.values():
        req = holding.request
        entry = queues.setdefault(
            req.queue,
            {
                "name": req.queue,
                "guaranteed": 0,
                "limit": None,
                "used": 0,
                "holding": [],
                "waiting": [],
            },
        )
        entry["used"] += holding.size
        users[req.owner] = users.get(req.owner, 0) + holding.size
        entry["holding"].append(
            {
                **_job(req, names, config),
                "slots": holding.size,
                "status": holding.status,
                "started": holding.started_at,
                "step": holding.step,
                "ends_by": holding.ends_at,
            }
        )
    for req in sorted(scheduler.queued.values(), key=lambda r: r.key):
        wait = waits.get(req.id) if waits is not None else None
        queues.setdefault(
            req.queue,
            {
                "name": req.queue,
                "guaranteed": 0,
                "limit": None,
                "used": 0,
                "holding": [],
                "waiting": [],
            },
        )
        queues[req.queue]["waiting"].append(
            {
                **_job(req, names, config),
                "world_size": req.world_size,
                "kind": wait.kind if wait else None,
                "reason": wait.reason if wait else "",
                "estimated_start": wait.estimated_start if wait else None,
            }
        )
    busy = sum(len(h.slots) for h in scheduler.holdings.values())
    return {
        "time": now,
        "slots": total,
        "free": total - busy,
        "per_user_cap": config.per_user_cap,
        "users": users,
        "queues": list(queues.values()),
    }


def _job(req: Request, names: Mapping[str, str], config: PolicyConfig) -> dict[str, Any]:
    return {
        "job": req.id,
        "name": names.get(req.id, req.id),
        "owner": req.owner,
        "priority": req.priority,
        "priority_name": config.priority_name(req.priority),
    }


def slot_of(slot: Any) -> Slot:
    """The policy's slot for the plane's (the same fields)."""
    return slot if isinstance(slot, Slot) else Slot(**dataclasses.asdict(slot))


def _device(slot: Slot) -> str:
    return f"cuda:{slot.index}" if slot.kind == "cuda" else "cpu"
