"""What kernels (and the server extension) ask the control plane: one handler per :class:`Op`.

Each handler checks what only the plane knows (the cluster's size, a name
clash), feeds the request to the job's lifecycle, and, for the requests that
return once the ranks have acted (pause, checkpoint, suspend, wait), waits for
the job to get there. Records go back as plain dicts (the journal's rows).

A QUEUED job's pause, checkpoint or update is kept for its first step boundary
(see :mod:`.lifecycle`) and answered at once, with the request under the record's
``pending``: waiting for it would hold the caller until the cluster has room. A
STARTING job's is waited for, as a RUNNING job's: its ranks are on their way.

Every handler is reached through :meth:`Requests.guarded`: the identity of the
connection a request came on (its TLS certificate) is checked against the rules of
:mod:`.access` before anything happens, a job's owner is that identity, and each
request that changes a job is journaled with it (``job.events()``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Callable
from typing import Any

from dask.utils import parse_bytes

from .. import config, hparams, options
from ..checkpoint_files import committed
from ..errors import (
    CapacityError,
    CheckpointError,
    InvalidTransitionError,
    JobNotFoundError,
    JobTimeoutError,
    SpecError,
)
from ..protocol import Op, WireSpec, Word, WorkerOp, new_id
from ..security.identity import Identity
from ..status import EARLY, JobStatus
from . import events as ev
from . import policy
from .access import JOURNALED, Access, Job
from .gate import Gate
from .journal import PRIVATE, Journal
from .live import NOT_STARTED, RUN_STATES
from .placement import Placement
from .plane import Plane, Run
from .watchdog import Watchdog


class Requests:
    """The client-facing handlers of one control plane."""

    def __init__(
        self, plane: Plane, placement: Placement, watchdog: Watchdog, gate: Gate, access: Access
    ):
        self.plane = plane
        self.placement = placement
        self.watchdog = watchdog
        self.gate = gate
        self.access = access

    def handlers(self) -> dict[Op, Callable]:
        return {
            Op.INVENTORY: self.inventory,
            Op.SUBMIT: self.submit,
            Op.JOB: self.job,
            Op.JOBS: self.jobs,
            Op.WAIT: self.wait,
            Op.STOP: self.stop,
            Op.PAUSE: self.pause,
            Op.RESUME: self.resume,
            Op.CHECKPOINT: self.checkpoint,
            Op.SUSPEND: self.suspend,
            Op.HISTORY: self.history,
            Op.STEPS: self.steps,
            Op.LOGS: self.logs,
            Op.SYSTEM: self.system,
            Op.QUEUE: self.queue,
            Op.CONFIGURE: self.configure,
            Op.STACKS: self.stacks,
            Op.PROFILE: self.profile,
            Op.PROFILE_WAIT: self.profile_wait,
            Op.PHASES: self.phases,
            Op.DEBUG: self.debug,
            Op.RESTART: self.restart,
            Op.CONSOLE: self.console,
            Op.RUN: self.run,
            Op.RUN_WAIT: self.run_wait,
            Op.UPDATE: self.update,
            Op.FORK: self.fork,
            Op.WHOAMI: self.whoami,
            Op.REVOKE: self.revoke,
        }

    def guarded(self, operation: Op, handler: Callable) -> Callable:
        """``handler`` as Dask calls it (the comm first): the request's identity checked
        against the rules, passed on as ``who=`` to a handler that takes it, and a
        change to a job journaled with it once done."""
        wants_who = "who" in inspect.signature(handler).parameters
        journaled = operation in JOURNALED

        async def guarded(comm: Any, **kwargs: Any) -> Any:
            who = self.gate.identify(comm)
            job = kwargs.get("job")
            facts = self.job_facts(job) if job and self.access.needs_job(operation) else None
            self.access.check(operation, who, facts)
            if wants_who:
                kwargs["who"] = who
            asked = time.time()
            result = handler(**kwargs)
            if inspect.isawaitable(result):
                result = await result
            if journaled and job and self.access.enforced:
                self._journal_request(job, operation, who, asked)
            return result

        guarded.__name__ = getattr(handler, "__name__", operation.value)
        return guarded

    def job_facts(self, job: str) -> Job | None:
        """A job's id, name and owner, for the rules (None: no such job)."""
        record = self.journal.get(job)
        if record is None:
            return None
        return Job(record["id"], record["name"], (record.get("spec") or {}).get("owner"))

    def _journal_request(self, job: str, operation: Op, who: Identity, asked: float) -> None:
        run = self.plane.runs.get(job)
        self.journal.add_event(
            job,
            asked,
            run.step if run is not None else None,
            "request",
            f"{operation.value} asked by {who.name}",
            {"op": operation.value, "by": who.name, "role": who.role},
        )

    @property
    def journal(self) -> Journal:
        return self.plane.journal

    # --- the cluster -----------------------------------------------------------------------
    def inventory(self) -> list[dict]:
        plane = self.plane
        return [
            {
                **dataclasses.asdict(s),
                "job": plane.busy.get(s.worker),
                "drained": plane.drained_why(s.worker),
            }
            for s in policy.rank_order(plane.slots.values())
        ]

    def _check_capacity(self, world_size: int) -> int:
        """The most slots the cluster can hold; a job that needs more is refused."""
        total, text = self.plane.can_hold()
        if world_size > total:
            raise CapacityError(
                f"world_size={world_size} is more than this cluster can ever hold: it has "
                f"{text}; add workers or ask for fewer ranks"
            )
        return total

    # --- jobs ----------------------------------------------------------------------------------
    def submit(self, spec: dict, payload: bytes, who: Identity | None = None) -> dict:
        plane = self.plane
        wire = WireSpec.from_dict(spec)
        if self.access.enforced and who is not None:  # the owner is who asked, not who it says
            wire = wire.replace(owner=who.name)
        total = self._check_capacity(wire.world_size)
        # its queue and priority resolved; refused (naming the limit) if it can never fit
        wire = self.placement.admit(wire, total)
        if wire.profile_dir is None:  # job.profile's traces go beside the journal
            wire = wire.replace(profile_dir=plane.state_dir)
        clash = self.journal.find(plane.id, wire.name)
        if clash and not JobStatus[clash["status"]].terminal:
            raise SpecError(
                f"a job named {wire.name!r} is already {clash['status']}; stop it or "
                "pick another name"
            )
        now = time.time()
        seq = self.placement.scheduler.next_seq()
        self.journal.add_job(
            {
                "id": wire.id,
                "name": wire.name,
                "scheduler": plane.id,
                "address": plane.address,
                "status": JobStatus.QUEUED.name,
                "spec": wire.as_dict(),
                "submitted": now,
                "seq": seq,
                "payload": payload,
            }
        )
        plane.follow(wire, payload, seq)
        return self._record(wire.id)

    def job(self, job: str | None = None, name: str | None = None) -> dict:
        if job is None:
            found = self.journal.find(self.plane.id, name)
            if found is None:
                known = sorted({r["name"] for r in self.journal.jobs(self.plane.id)})
                raise JobNotFoundError(
                    f"no job named {name!r} on this cluster; known jobs: "
                    f"{', '.join(known) or 'none'}"
                )
            job = found["id"]
        # one job's record carries its durable events (restarts, failures, preemptions...)
        return {**self._record(job), "events": self.journal.events(job)}

    def jobs(self) -> list[dict]:
        now, runs = time.time(), self.plane.runs
        return [
            _public({**r, "goodput": runs[r["id"]].goodput.summary(now)} if r["id"] in runs else r)
            for r in self.journal.jobs(self.plane.id)
        ]

    async def wait(self, job: str, timeout: float | None = None) -> dict:
        run = self.plane.runs.get(job)
        if run is not None:
            try:
                await asyncio.wait_for(run.done.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return self._record(job, with_result=True)

    def history(
        self,
        job: str,
        since: int = 0,
        limit: int | None = None,
        last_steps: int | None = None,
        rank: int | None = None,
    ) -> list[dict]:
        return self.journal.history(job, since, limit, last_steps=last_steps, rank=rank)

    def steps(self, job: str, last: int | None = None, since_step: int | None = None) -> list[dict]:
        return self.journal.steps(job, last, since_step)

    def system(self, job: str, since: int = 0) -> list[dict]:
        return self.journal.system(job, since)

    def phases(
        self, job: str, since: int = 0, limit: int | None = None, tail: int | None = None
    ) -> list[dict]:
        return self.journal.phases(job, since, limit, tail)

    def logs(self, job: str, rank: int | None = None, since: int = 0) -> list[dict]:
        return self.journal.logs(job, rank, since)

    async def stacks(self, job: str, all_threads: bool = False) -> dict:
        """Where each rank is now (a job with ranks out there), else the stacks kept
        when it was found hung (empty when it never was)."""
        record = self._record(job)
        run = self.plane.runs.get(job)
        if run is not None and run.machine.ranks and run.machine.held:
            return await self.watchdog.stacks(run, all_threads)
        return record.get("stacks") or {}

    # --- identity -------------------------------------------------------------------------
    def whoami(self, who: Identity) -> dict:
        """The identity this request came from, and the rules in force (what a panel needs
        to grey out what its user may not do)."""
        return {
            **who.as_dict(),
            "enforced": self.access.enforced,
            "hide_metrics": self.access.hide_metrics,
        }

    async def revoke(self, crl: str) -> dict:
        """An admin's new revocation list: refused by the scheduler's listeners and by the
        rules at once, then by every worker's and nanny's listeners."""
        serials = self.gate.revoke(crl)
        reached = await self.gate.push(crl)
        return {"revoked": sorted(format(s, "X") for s in serials), "reached": reached}

    # --- sharing the cluster ------------------------------------------------------------
    def queue(self) -> dict:
        """Per queue: who holds what, what waits and why, estimated starts."""
        plane = self.plane
        names = {job: run.machine.name for job, run in plane.runs.items()}
        return self.placement.view(names, time.time())

    def configure(self, changes: dict) -> dict:
        """An admin's change of the scheduling settings; the settings now in force."""
        config = self.placement.configure(changes)
        self.journal.put_setting("scheduling", config.to_dict())
        self.plane.schedule()
        return config.to_dict()

    # --- control ---------------------------------------------------------------------------------
    def stop(self, job: str) -> dict:
        self.plane.feed(self._active(job, "stop", "there is nothing to stop"), ev.StopRequested())
        return self._record(job)

    async def pause(self, job: str, timeout: float | None = None) -> dict:
        run = self._active(job, "pause")
        machine = run.machine
        self.plane.feed(run, ev.PauseRequested())
        if machine.status is JobStatus.QUEUED:  # it starts paused, before its first step
            return self._record(job)
        if not await self.plane.until(
            run,
            lambda: machine.status not in _REACHING or not machine.pause_pending,
            timeout,
        ):
            self.plane.feed(run, ev.PauseWithdrawn())
            raise JobTimeoutError(
                f"job {machine.name!r} did not pause within {timeout} s: its ranks reach no step "
                "boundary (does the training function iterate over ctx.loop?)"
            )
        if machine.pause_pending:  # its gang restarts: the next one is held before step one
            return self._record(job)
        if machine.status is not JobStatus.PAUSED:
            raise InvalidTransitionError(
                f"job {machine.name!r} became {machine.status.name} before it could pause"
            )
        return self._record(job)

    def resume(self, job: str, world_size: int | None = None) -> dict:
        run = self._active(job, "resume")
        if run.machine.status is JobStatus.SUSPENDED:
            ws = run.machine.world_size if world_size is None else world_size
            if isinstance(ws, int) and not isinstance(ws, bool):
                self._check_capacity(ws)
        self.plane.feed(run, ev.ResumeRequested(world_size))
        return self._record(job)

    async def checkpoint(self, job: str, timeout: float | None = None) -> dict:
        run = self._active(job, "checkpoint")
        machine = run.machine
        self.plane.feed(run, ev.CheckpointRequested())
        seq = machine.words[Word.CHECKPOINT]
        if machine.status is JobStatus.QUEUED:  # taken at its first step boundary
            return self._record(job)
        done = await self.plane.until(
            run,
            lambda: (
                machine.checkpoint_seq >= seq
                or machine.checkpoint_failed_seq >= seq
                or machine.status.terminal
            ),
            timeout,
        )
        record = self._record(job)
        if machine.checkpoint_seq >= seq:
            return record
        if machine.checkpoint_failed_seq >= seq:
            raise CheckpointError(
                f"checkpoint of job {machine.name!r} failed: {record['checkpoint_error']}; the "
                f"previous one is kept ({record['checkpoint'] or 'none yet'})"
            )
        if not done:
            raise JobTimeoutError(f"job {machine.name!r} did not checkpoint within {timeout} s")
        raise InvalidTransitionError(
            f"job {machine.name!r} became {machine.status.name} before it could checkpoint"
        )

    async def fork(
        self,
        job: str,
        name: str | None = None,
        at: int | None = None,
        changes: dict | None = None,
        world_size: int | None = None,
        checkpoint_dir: str | None = None,
        timeout: float | None = None,
        who: Identity | None = None,
    ) -> dict:
        """A new job from a checkpoint of ``job``, which goes on: the one it takes at its
        next step boundary, or (``at``) its committed checkpoint that resumes at step
        ``at``; at ``world_size`` (default: the same), with ``changes`` applied before the
        fork's first step (as ``job.update``'s, checked first), its checkpoints in
        ``checkpoint_dir`` (default: beside the job's, ``<dir>-forks/<name>``). The data
        position, RNG and optimizer states come with the checkpoint: a fork without
        changes is bitwise the job from there on. The new job's record."""
        parent = self.journal.get(job)
        if parent is None:
            raise JobNotFoundError(f"no job with id {job!r} on this cluster")
        spec = WireSpec.from_dict(parent["spec"])
        if not spec.checkpoint_dir:
            raise SpecError(
                f"job {spec.name!r} has no checkpoint_dir: a fork starts from one of its "
                "checkpoints (launch it with checkpoint_dir=...)"
            )
        run = self.plane.runs.get(job)
        payload = run.payload if run is not None else parent.get("payload")
        if not payload:  # released with its end
            raise InvalidTransitionError(
                f"job {spec.name!r} is {parent['status']}: its function is no longer kept; "
                f"launch it again with resume= one of its checkpoints (in {spec.checkpoint_dir})"
            )
        if world_size is not None:
            world_size = options.check_world_size(world_size)
        if changes:  # refused before anything happens, as job.update would be
            info = run.machine.live.info if run is not None else {}
            changes = hparams.check(changes, spec, info, deferred=not info)
        if at is None:
            record = await self.checkpoint(job, timeout=timeout)
            if record["status"] == JobStatus.QUEUED.name:
                raise InvalidTransitionError(
                    f"job {spec.name!r} is QUEUED: it has no step to fork from yet"
                )
            path, step = record["checkpoint"], record["checkpoint_step"]
        else:
            loop = asyncio.get_running_loop()
            found = dict(await loop.run_in_executor(None, committed, spec.checkpoint_dir))
            if at not in found:
                raise SpecError(
                    f"job {spec.name!r} has no checkpoint that resumes at step {at}; its "
                    f"checkpoints resume at steps {sorted(found) or 'none yet'}"
                )
            path, step = found[at], at
        name = name or f"{spec.name}-fork{step}"
        forked = spec.replace(
            id=new_id(),
            name=name,
            resume=path,
            attempt=0,
            world_size=world_size or spec.world_size,
            asked_world_size=None,
            checkpoint_dir=checkpoint_dir or f"{spec.checkpoint_dir.rstrip('/')}-forks/{name}",
            parent=job,
            forked_at=step,
        )
        record = self.submit(forked.as_dict(), payload, who)
        if changes:
            self.plane.feed(self.plane.runs[forked.id], ev.UpdateRequested(changes))
        self.journal.add_event(
            job,
            time.time(),
            step,
            "forked",
            f"forked as {name!r} at step {step}",
            {"fork": forked.id},
        )
        return record

    async def suspend(self, job: str, timeout: float | None = None) -> dict:
        run = self._active(job, "suspend")
        machine = run.machine
        self.plane.feed(run, ev.SuspendRequested())
        await self.plane.until(run, lambda: machine.status is not JobStatus.SUSPENDING, timeout)
        if machine.status not in (JobStatus.SUSPENDED, JobStatus.SUSPENDING):
            raise InvalidTransitionError(
                f"job {machine.name!r} became {machine.status.name} instead of SUSPENDED"
            )
        return self._record(job)

    async def profile(
        self, job: str, steps: int, timeout: float | None = None, wait: bool = True
    ) -> dict:
        """Ask for a profile of the next ``steps`` steps; with ``wait``, return once every
        rank wrote its trace (a PAUSED job's profile starts at its resume: not waited for)."""
        run = self._active(job, "profile", "only a RUNNING or PAUSED job can be profiled")
        machine = run.machine
        self.plane.feed(run, ev.ProfileRequested(steps))
        seq = machine.profiles.seq
        if wait and machine.status is JobStatus.RUNNING:
            return await self.profile_wait(job, seq, timeout)
        return self._profile(job, seq)

    async def profile_wait(self, job: str, seq: int, timeout: float | None = None) -> dict:
        """Profile request ``seq`` once every rank reported, the job ended or restarted,
        or ``timeout`` passed (``complete`` says which)."""
        run = self.plane.runs.get(job)
        if run is not None:
            machine = run.machine
            entry = machine.profiles.entry(seq)
            attempt = entry["attempt"] if entry else machine.attempt
            await self.plane.until(
                run,
                lambda: (
                    entry is None
                    or entry["complete"]
                    or machine.status.terminal
                    or machine.attempt != attempt
                ),
                timeout,
            )
        return self._profile(job, seq)

    def _profile(self, job: str, seq: int) -> dict:
        record = self._record(job)
        entry = next((p for p in record.get("profiles") or () if p["seq"] == seq), None)
        if entry is None:
            raise JobNotFoundError(f"job {record['name']!r} has no profile #{seq}")
        return {**entry, "status": record["status"]}

    # --- debugging: on_error="hold" and ctx.breakpoint() ------------------------------------------
    def debug(self, job: str, rank: int | None = None) -> dict:
        """A held rank's error and failing frames with their locals (the rank whose error
        is the cause, by default); kept with the job's record after it ended."""
        record = self._record(job)
        held = record.get("held") or {}
        ranks = held.get("ranks") or {}
        if not ranks:
            raise InvalidTransitionError(
                f"job {record['name']!r} ({record['status']}) has no held rank: a rank that "
                "raises is held only in a job launched with on_error='hold'"
            )
        key = str(held.get("cause") if rank is None else rank)
        if key not in ranks:
            raise SpecError(
                f"rank {rank!r} of job {record['name']!r} is not held; held "
                f"rank(s): {', '.join(sorted(ranks, key=int))}"
            )
        return {
            **ranks[key],
            "name": record["name"],
            "status": record["status"],
            "cause": held.get("cause"),
            "ended": held.get("ended", ""),
        }

    def restart(self, job: str) -> dict:
        """``job.restart()`` of a HELD job."""
        run = self._active(job, "restart", "only a HELD job can be restarted from its checkpoint")
        self.plane.feed(run, ev.RestartRequested())
        return self._record(job)

    async def console(self, job: str, rank: int | None = None, text: str | None = None) -> dict:
        """Send ``text`` (a line) to the pdb session of ``rank`` (the only one open, by
        default); answer the open sessions and the console's transcript so far."""
        run = self.plane.runs.get(job)
        if run is None:
            record = self._record(job)
            if text is not None:
                raise InvalidTransitionError(
                    f"job {record['name']!r} is {record['status']}; no debugger session is open"
                )
            return {"sessions": {}, "chunks": [], "status": record["status"]}
        machine = run.machine
        book = machine.breakpoints.of(machine.attempt)
        if text is not None:
            if not isinstance(text, str):
                raise SpecError(f"console input must be a str (a pdb command), got {text!r}")
            if rank is None and book.open:
                rank = min(book.open)
            if rank not in book.open:
                where = (
                    ""
                    if rank is None
                    else f" on rank {rank} (open: "
                    + (", ".join(map(str, sorted(book.open))) or "none")
                    + ")"
                )
                raise InvalidTransitionError(
                    f"job {machine.name!r} has no debugger session open{where}; "
                    "ctx.breakpoint() opens one in a job launched with debug=True"
                )
            await self.plane.call_worker(
                machine.ranks[rank].worker,
                WorkerOp.CONSOLE,
                job=job,
                text=text,
                attempt=machine.attempt,
            )
        return {**book.state(), "status": machine.status.name}

    # --- job.run and job.update (see control/live.py) -------------------------------------
    def run(self, job: str, fn: bytes, ranks: list[int] | None = None) -> dict:
        """Ask the ranks (all, or ``ranks``) to run the pickled ``fn`` at their next boundary;
        the request, with its ``seq`` (then :meth:`run_wait` for the results)."""
        run = self._active(
            job, "run", f"job.run needs a RUNNING, PAUSED or HELD job, {NOT_STARTED}"
        )
        limit = parse_bytes(config.get("run-result-limit"))
        self.plane.feed(run, ev.RunRequested(fn, None if ranks is None else tuple(ranks), limit))
        return self._run_view(job, run.machine.live.seq)

    async def run_wait(self, job: str, seq: int, timeout: float | None = None) -> dict:
        """Run request ``seq`` once every chosen rank reported, the job left RUNNING or
        PAUSED (or its gang ended), or ``timeout`` passed (``complete`` says which)."""
        run = self.plane.runs.get(job)
        entry = run.machine.live.runs.get(seq) if run is not None else None
        if entry is not None:
            machine, attempt = run.machine, entry["attempt"]
            await self.plane.until(
                run,
                lambda: (
                    entry["complete"]
                    or machine.attempt != attempt
                    or machine.status not in _WAITING
                ),
                timeout,
            )
        return self._run_view(job, seq)

    def _run_view(self, job: str, seq: int) -> dict:
        run = self.plane.runs.get(job)
        entry = run.machine.live.runs.get(seq) if run is not None else None
        status = run.machine.status.name if run is not None else self._record(job)["status"]
        if entry is None:
            return {"seq": seq, "found": False, "status": status, "complete": False}
        # rank keys as strings: what crosses the wire is msgpack
        return {
            "seq": seq,
            "found": True,
            "status": status,
            "ranks": entry["ranks"],
            "complete": entry["complete"],
            "limit": entry["limit"],
            "started": sorted(entry["fetched"]),
            "results": {str(r): v for r, v in entry["results"].items()},
            "errors": {str(r): v for r, v in entry["errors"].items()},
        }

    async def update(self, job: str, changes: dict, timeout: float | None = None) -> dict:
        """Check ``changes`` and have every rank apply them before one step; the request,
        with ``step`` once applied (None: not yet, see ``status`` and ``timed_out``)."""
        run = self._active(
            job, "update", f"job.update needs a RUNNING or PAUSED job, {NOT_STARTED}"
        )
        machine = run.machine
        if (
            hparams.needs_ranks(changes)
            and not machine.live.info
            and machine.status is JobStatus.RUNNING
        ):  # its ranks report after a step
            await self.plane.until(
                run,
                lambda: bool(machine.live.info) or machine.status is not JobStatus.RUNNING,
                timeout,
            )
        self.plane.feed(run, ev.UpdateRequested(changes))
        seq, attempt = machine.live.seq, machine.attempt
        queued = machine.status is JobStatus.QUEUED  # applied before its first step
        done = queued or await self.plane.until(
            run,
            lambda: (
                machine.live.done(seq, machine.world_size)
                or machine.attempt != attempt
                or machine.status not in _WAITING
            ),
            timeout,
        )
        entry = machine.live.updates[seq]
        return {
            "seq": seq,
            "step": entry["step"],
            "changes": entry["changes"],
            "error": entry["error"],
            "status": machine.status.name,
            "timed_out": not done,
        }

    def live_pending(
        self, job: str, rank: int, attempt: int, runs: list[int], updates: list[int]
    ) -> list[dict]:
        """From a rank: the run and update requests it must carry out now, in order."""
        run = self.plane.runs.get(job)
        if run is None or run.machine.attempt != attempt:
            return []  # an earlier gang's rank: nothing of it is asked any more
        return run.machine.live.pending(attempt, rank, tuple(runs), tuple(updates))

    # --- helpers -----------------------------------------------------------------------------------
    def _active(self, job: str, action: str, why: str | None = None) -> Run:
        run = self.plane.runs.get(job)
        if run is None:
            record = self._record(job)
            raise InvalidTransitionError(
                f"job {record['name']!r} is {record['status']}; {why or f'it cannot {action}'}"
            )
        return run

    def _record(self, job: str, with_result: bool = False) -> dict:
        record = self.journal.get(job)
        if record is None:
            raise JobNotFoundError(f"no job with id {job!r} on this cluster")
        run = self.plane.runs.get(job)
        if run is not None:  # its goodput up to now (the journal's is of its last change)
            record["goodput"] = run.goodput.summary(time.time())
        if with_result:
            return {k: v for k, v in record.items() if k != "payload"}
        return _public(record)


# while a job is in these states, its ranks may still answer a job.run or job.update
_WAITING = RUN_STATES | EARLY | {JobStatus.HUNG}
# ... and reach the step boundary a pause waits for
_REACHING = (JobStatus.STARTING, JobStatus.RUNNING)


def _public(record: dict) -> dict:
    public = {k: v for k, v in record.items() if k not in PRIVATE}
    if public.get("goodput"):  # without what only a restarted scheduler goes on from
        public["goodput"] = {k: v for k, v in public["goodput"].items() if k != "carry"}
    return public
