"""The client-side handle of a job: :class:`Job`, and :class:`Profile`, the handle of one
``job.profile()`` request.

A ``Job`` holds no state of its own that matters: the control plane in the
scheduler is the truth, so a handle made by ``Job.attach`` in another process
sees exactly what the launching one sees. A handle follows the job's event
stream only while something needs it (``latest``, ``on_event``, a dashboard),
and lets go of it when it is closed or garbage-collected.

Everything a user does to a job is a method here, ``job.run`` and ``job.update``
too: they ask the control plane, wait in slices, and turn its answers into results
or errors (the control plane keeps the requests; the ranks pull them at their next
step boundary).
How a job shows itself (its notebook dashboard, ``job.console()``) is not here:
the presentation provides it through :mod:`clustersdk.hooks`, since this client
tier never imports the tier above it.
"""

from __future__ import annotations

import html
import numbers
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import cloudpickle

from . import hooks
from .errors import (
    ClusterClosedError,
    InvalidTransitionError,
    JobFailedError,
    JobStoppedError,
    JobTimeoutError,
    RunError,
    SpecError,
)
from .hparams import spec_changes
from .postmortem import PostMortem
from .protocol import WireSpec, what_runs
from .status import JobStatus

if TYPE_CHECKING:
    from .cluster.base import Cluster, Subscription
    from .diagnosis import Diagnosis

WAIT_SLICE = 5.0  # seconds per server-side wait, so that Ctrl-C stays responsive
# a job.run's ranks may still answer (a QUEUED or STARTING job's at its first boundary)
RUN_WAITING = ("QUEUED", "STARTING", "RUNNING", "PAUSED", "HUNG")


class Job:
    """A job on a cluster: status, result, history, logs and control.

    >>> job = cluster.launch(train, world_size=2, name="a")   # doctest: +SKIP
    >>> job.wait()                                             # doctest: +SKIP
    {'final_loss': 0.02}
    """

    def __init__(self, cluster: Cluster, record: dict[str, Any]):
        self.cluster = cluster
        self.id: str = record["id"]
        self.name: str = record["name"]
        self._record = record
        self._latest: dict[int, dict[str, Any]] = {}
        self._spec_stale = False  # a status event came: the world size may have changed
        self._callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._lock = threading.Lock()
        self._subscription: Subscription | None = None

    # attach ------------------------------------------------------------------
    @classmethod
    def attach(cls, cluster: Cluster, name: str) -> Job:
        """The newest job called ``name`` on ``cluster``, from any process."""
        return cls(cluster, cluster.job_record(name=name))

    # state ---------------------------------------------------------------------
    @property
    def spec(self) -> WireSpec:
        """Every option of the job as the scheduler keeps it (world size, strategy...)."""
        return WireSpec.from_dict(self._record["spec"])

    @property
    def world_size(self) -> int:
        """How many ranks the job was launched with (its spec's; a job resumed at another
        world size has a new spec)."""
        return self.spec.world_size

    @property
    def strategy(self) -> str:
        """How the model is spread over the ranks: ``ddp``, ``fsdp``, ``tp``, ``pp`` or ``ep``."""
        return self.spec.strategy

    @property
    def queue(self) -> str | None:
        """The queue it waits or runs in."""
        return self.spec.queue

    @property
    def priority(self) -> int | str | None:
        """Its priority (an int once the control plane admitted it)."""
        return self.spec.priority

    @property
    def owner(self) -> str | None:
        """Who launched it."""
        return self.spec.owner

    def stacks(self, all_threads: bool = False) -> dict[int, str]:
        """Where every rank is: rank -> the Python stack of its main thread (every
        thread's with ``all_threads``), headed by its process id, step and phase. A rank
        that cannot answer (stuck holding its interpreter lock, frozen) is read from
        outside by py-spy, and a frozen process says so. For a finished job: the stacks kept when it was found
        HUNG (empty if it never was)."""
        found = self.cluster.sync(self.cluster.control.stacks, self.id, all_threads)
        out = {}
        for key, entry in sorted(found.items(), key=lambda kv: int(kv[0])):
            where = f"rank {key} on {entry.get('worker')}"
            if entry.get("pid"):  # the rank's own process
                where += f", pid {entry['pid']}"
            if entry.get("step") is not None:
                where += f", step {entry['step']}, phase {entry.get('phase')}"
            out[int(key)] = f"{where}:\n{entry.get('text', '')}"
        return out

    def events(self) -> list[dict[str, Any]]:
        """What happened to the job that a user must be able to find later, oldest first:
        each restart, failure, change of world size, preemption or reclaim, with its
        ``kind``, ``message`` (the cause: e.g. which worker was lost), ``time`` and
        ``step`` (the furthest step logged then), and the errors it caused
        (``consequences``)."""
        return self.info().get("events", [])

    @property
    def diagnosis(self) -> Diagnosis | None:
        """The newest diagnosis of the job (what went wrong, what to do), or None.

        A failure of a known kind (CUDA or host out of memory, a collective timeout, two
        ranks on one GPU, a port in use), a non-finite loss, a loss spike or ranks on
        different versions; see :mod:`clustersdk.diagnosis`.

        >>> job.diagnosis                                # doctest: +SKIP
        Diagnosis(kind='host_oom', summary="host out of memory: Dask's nanny terminated ...")
        """
        from .diagnosis import Diagnosis

        found = self.info().get("diagnosis")
        return Diagnosis.from_dict(found) if found else None

    def diagnoses(self) -> list[Diagnosis]:
        """Every diagnosis of the job, oldest first (kept with its durable events)."""
        from .diagnosis import Diagnosis

        return [
            Diagnosis.from_dict(e["diagnosis"])
            for e in self.events()
            if e.get("kind") == "diagnosis" and e.get("diagnosis")
        ]

    def info(self) -> dict[str, Any]:
        """The job's record: status, reason, ranks and their workers, times, error, the newest
        ``diagnosis`` and the durable ``events``. Raises
        :class:`~clustersdk.ClusterClosedError` once its cluster is closed: what the handle
        last saw may be stale, so it does not pass for the job's state now."""
        try:
            self._record = self.cluster.sync(self.cluster.control.job, job=self.id)
        except ClusterClosedError as e:
            seen = self._record.get("status", "?")
            raise ClusterClosedError(
                f"can't ask about job {self.name!r} (last seen {seen}): {e}", e.address
            ) from None
        return self._record

    @property
    def status(self) -> JobStatus:
        """The job's state now, asked of the control plane (``QUEUED``, ``RUNNING``,
        ``PAUSED``...)."""
        return JobStatus[self.info()["status"]]

    @property
    def reason(self) -> str:
        """Why a queued job waits (empty otherwise)."""
        return self.info()["reason"]

    @property
    def restarts(self) -> int:
        """How often the job restarted after losing a worker (of ``max_restarts``)."""
        return int(self.info().get("restarts") or 0)

    @property
    def goodput(self) -> dict[str, Any]:
        """Where the job's wall time went: ``goodput`` (the share in steps that stand,
        None for a job without ``ctx.loop`` steps), ``wall`` and ``seconds`` per bucket
        (adding up to ``wall``: ``productive``, ``checkpoint``, ``lost``, ``startup``,
        ``hung``, ``queued``, ``paused``), ``steps`` that stand and ``lost_steps`` that a
        restart threw away. Wall time runs from the job's first start, not its submission.

        >>> job.goodput["goodput"], job.goodput["lost_steps"]      # doctest: +SKIP
        (0.93, 0)
        """
        return dict(self.info().get("goodput") or {})

    @property
    def latest(self) -> dict[int, dict[str, Any]]:
        """The last row each rank of the job's current world size logged, kept current by
        the event stream (a handle follows the stream from its launch, or from the first
        read of ``latest``; a rank that a resume at a smaller world size left out is gone)."""
        self.watch()
        if self._spec_stale:
            self._spec_stale = False
            try:
                self.info()
            except Exception:  # the cluster is gone: keep what we know
                pass
        with self._lock:
            return {rank: dict(row) for rank, row in self._latest.items() if rank < self.world_size}

    def on_event(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """Call ``callback(msg)`` for every status change and metrics batch (from Dask's loop)."""
        self.cluster.ensure_open()  # (a handle that follows already would take it silently)
        self.watch()
        self._callbacks.append(callback)

    def watch(self) -> None:
        """Follow the job's event stream (``latest``, ``on_event`` and dashboards do)."""
        if self._subscription is not None:
            return
        ref = weakref.ref(self)

        def deliver(message: dict[str, Any]) -> None:
            job = ref()
            if job is not None:
                job._on_event(message)

        self._subscription = self.cluster.subscribe(self.id, deliver)
        weakref.finalize(self, self._subscription.close)

    def close(self) -> None:
        """Stop following the job's events (the job itself goes on)."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    # results -------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> Any:
        """Block until the job ends; return rank 0's return value.

        Raises :class:`JobFailedError` (with the remote traceback) if a rank failed,
        :class:`JobTimeoutError` if ``timeout`` passes first (the job goes on).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - time.monotonic())
            record = self.cluster.sync(self.cluster.control.wait, self.id, timeout=max(left, 0.0))
            if JobStatus[record["status"]].terminal:
                return self._outcome(record)
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeoutError(
                    f"job {self.name!r} is still {record['status']} after {timeout} s; it keeps "
                    "running (wait again, or stop it)"
                )

    @property
    def result(self) -> Any:
        """Rank 0's return value of a finished job (raises if it has none)."""
        record = self.cluster.sync(self.cluster.control.wait, self.id, timeout=0)
        if not JobStatus[record["status"]].terminal:
            raise InvalidTransitionError(
                f"job {self.name!r} is {record['status']}; it has no result yet (use job.wait())"
            )
        return self._outcome(record)

    def _outcome(self, record: dict[str, Any]) -> Any:
        self._record = {k: v for k, v in record.items() if k != "result"}
        status = JobStatus[record["status"]]
        if status is JobStatus.FAILED:
            raise JobFailedError.from_record(self.name, record["error"])
        if record.get("result") is None:
            raise JobStoppedError(f"job {self.name!r} was stopped before it returned a result")
        return cloudpickle.loads(record["result"])

    def history(
        self,
        since: int = 0,
        limit: int | None = None,
        *,
        last_steps: int | None = None,
        rank: int | None = None,
    ) -> list[dict[str, Any]]:
        """Logged rows after sequence number ``since``: seq, rank, step, time, scalars,
        in the order they came. ``last_steps``: only the newest that many steps;
        ``rank``: only that rank's rows (both in step order, then rank).

        Each rank logs its own row per step: a job of 1,024 ranks has a million rows
        per 1,000 steps. :meth:`steps` reads one row per step.

        >>> job.history(last_steps=100, rank=0)[-1]["loss"]     # doctest: +SKIP
        1.93
        """
        return list(
            self.cluster.sync(
                self.cluster.control.history,
                self.id,
                since=since,
                limit=limit,
                last_steps=last_steps,
                rank=rank,
            )
        )

    def steps(self, last: int | None = None, since_step: int | None = None) -> list[dict[str, Any]]:
        """One row per step, oldest first: ``step``, ``time`` (of its newest row),
        ``ranks`` (how many logged it) and ``scalars``: per name its ``mean``, ``min``
        and ``max`` over the ranks and ``ranks`` (how many logged it). Only the newest
        ``last`` steps, or those after ``since_step``. What a chart of a big job draws.

        >>> job.steps(last=1)                                    # doctest: +SKIP
        [{'step': 999, 'time': 1733.2, 'ranks': 1024,
          'scalars': {'loss': {'mean': 1.93, 'min': 1.71, 'max': 2.30, 'ranks': 1024}}}]
        """
        return list(
            self.cluster.sync(self.cluster.control.steps, self.id, last=last, since_step=since_step)
        )

    def system(self, since: int = 0) -> list[dict[str, Any]]:
        """GPU samples per rank (utilisation, memory, temperature, power) or, without a
        GPU, CPU, memory and network samples; ``source`` says which ("nvml"/"psutil")."""
        return list(self.cluster.sync(self.cluster.control.system, self.id, since=since))

    def phases(
        self, since: int = 0, limit: int | None = None, tail: int | None = None
    ) -> list[dict[str, Any]]:
        """Where each step's time went, per rank (the first ``limit`` rows after ``since``,
        or only the newest ``tail``): seq, rank, step and the seconds of
        ``data``, ``compute``, ``optimizer``, ``checkpoint``, ``sync`` and the step's
        ``total`` (see :mod:`clustersdk.runtime.phases` for what each one counts)."""
        return list(
            self.cluster.sync(
                self.cluster.control.phases, self.id, since=since, limit=limit, tail=tail
            )
        )

    def log_lines(self, rank: int | None = None, since: int = 0) -> list[dict[str, Any]]:
        """Log lines after sequence number ``since`` (of one rank, or every rank):
        seq, rank, time, stream ("stdout", "stderr", "log") and text."""
        return list(self.cluster.sync(self.cluster.control.logs, self.id, rank=rank, since=since))

    def logs(self, rank: int = 0) -> str:
        """What rank ``rank`` printed or logged, as text."""
        return "".join(line["text"] + "\n" for line in self.log_lines(rank))

    # control -------------------------------------------------------------------
    def pause(self, timeout: float | None = 60) -> int | None:
        """Hold every rank at the same step boundary, keeping the slots and process group.

        Returns once every rank has paused, with the step they stopped before. A job
        that has not started (QUEUED) or is starting is held before its first step: a
        STARTING job's pause returns once its ranks wait there; a QUEUED job's at once,
        with None (``job.info()["pending"]`` shows it until the job starts and pauses).
        ``resume()`` lets it go, also before then.

        >>> job = cluster.launch(train, world_size=2)     # doctest: +SKIP
        >>> job.pause()                                   # doctest: +SKIP
        0
        """
        self._record = self.cluster.sync(self.cluster.control.pause, self.id, timeout=timeout)
        return self._record["paused_at"] if self._record["status"] == "PAUSED" else None

    def resume(self, world_size: int | None = None) -> JobStatus:
        """Continue a PAUSED job, or queue a SUSPENDED one again (optionally at another
        ``world_size``; the global batch stays the same)."""
        self._record = self.cluster.sync(
            self.cluster.control.resume, self.id, world_size=world_size
        )
        return JobStatus[self._record["status"]]

    def checkpoint(self, timeout: float | None = None) -> str | None:
        """Checkpoint at the next step boundary; return the committed checkpoint's path.

        A STARTING job checkpoints at its first step boundary (before its first step); a
        QUEUED one will, when it starts: this returns None at once, and
        ``job.info()["pending"]`` shows the request until it is committed.
        """
        self._record = self.cluster.sync(self.cluster.control.checkpoint, self.id, timeout=timeout)
        return None if self._record["status"] == "QUEUED" else self._record["checkpoint"]

    def fork(
        self,
        name: str | None = None,
        *,
        at: int | str = "next",
        hparams: dict[str, Any] | None = None,
        world_size: int | None = None,
        checkpoint_dir: str | None = None,
        timeout: float | None = 120.0,
    ) -> Job:
        """A new job that goes on from this one's state while this one goes on too.

        ``at="next"`` checkpoints this job at its next step boundary and starts the fork
        from there; ``at=step`` starts it from the committed checkpoint that resumes at
        ``step`` (the job needs a ``checkpoint_dir``). The data position, the RNG and the
        optimizer come with the checkpoint, so a fork without changes is bitwise this job
        from there on. ``hparams`` are applied before the fork's first step, as
        :meth:`update` would (and checked first: a bad key changes nothing);
        ``world_size`` may differ. The fork's checkpoints go to ``checkpoint_dir``
        (default: ``<this job's>-forks/<name>``); its name defaults to
        ``<name>-fork<step>``. Its :attr:`parent` is this job; :meth:`forks` lists them.

        >>> half = job.fork(hparams={"lr": 5e-4})                     # doctest: +SKIP
        >>> half.parent.name, half.spec.forked_at                     # doctest: +SKIP
        ('a', 200)
        """
        record = self.cluster.sync(
            self.cluster.control.fork,
            self.id,
            name,
            None if at == "next" else at,
            hparams,
            world_size,
            checkpoint_dir,
            timeout,
        )
        return Job(self.cluster, record)

    @property
    def parent(self) -> Job | None:
        """The job this one was forked from (:meth:`fork`), or None."""
        parent = self.spec.parent
        return None if parent is None else Job(self.cluster, self.cluster.job_record(job=parent))

    def forks(self) -> list[Job]:
        """The jobs forked from this one, oldest first."""
        return [
            Job(self.cluster, r)
            for r in self.cluster.job_records()
            if (r.get("spec") or {}).get("parent") == self.id
        ]

    def suspend(self, timeout: float | None = None) -> str | None:
        """Checkpoint, free the slots and wait SUSPENDED; ``resume()`` continues.

        Returns the path of the checkpoint the job will resume from. A STARTING job
        checkpoints at its first step boundary; a QUEUED one has nothing to save: it
        leaves the queue, SUSPENDED (None, or its newest checkpoint), until ``resume()``.
        """
        self._record = self.cluster.sync(self.cluster.control.suspend, self.id, timeout=timeout)
        return self._record["checkpoint"]

    def profile(self, steps: int = 5, wait: bool = True, timeout: float | None = None) -> Profile:
        """Capture ``torch.profiler`` traces of the next ``steps`` steps on every rank.

        No restart: the ranks start at the next agreed step boundary (a PAUSED job's:
        when it resumes) and go on training. Returns once every rank wrote its trace
        (unless ``wait=False``, or the job is PAUSED: then ``.wait()`` on the result).
        The result shows a per-rank summary in a notebook; ``.traces`` are Chrome trace
        JSON files, which Perfetto and TensorBoard's profiler open.

        >>> job.profile(steps=5)                    # doctest: +SKIP
        profile #1 of job 'a': 5 steps, complete
          rank 0: steps 120-124  21.4 ms: compute 93%, communication 5%, data wait 2% ...
        """
        entry = self.cluster.sync(
            self.cluster.control.profile, self.id, steps, timeout=timeout, wait=wait
        )
        return Profile(self, entry)

    def profiles(self) -> list[Profile]:
        """Every profile taken of this job, oldest first."""
        record = self.info()
        return [
            Profile(self, {**p, "status": record["status"]}) for p in record.get("profiles") or ()
        ]

    def run(
        self,
        fn: Callable[[Any], Any],
        ranks: int | Iterable[int] | None = None,
        timeout: float | None = 60.0,
    ) -> dict[int, Any]:
        """Run ``fn(ctx)`` on ``ranks`` (default: every rank) of a RUNNING or PAUSED job,
        in each rank's own training thread, at its next step boundary (a PAUSED job's: at
        once; a QUEUED or STARTING job's: at its first, before its first step); return
        ``{rank: result}``.

        ``fn`` sees the live job: ``ctx.model``, ``ctx.registered["optimizer"]``,
        ``ctx.exposed`` (what the training function passed to ``ctx.expose``),
        ``ctx.hparams``. Run on every rank, it may use collectives (every rank runs it
        at the same boundary). It never fails or unpauses the job: if it raises, does
        not return within ``timeout`` seconds, or returns something that can't be
        pickled or is over ``clustersdk.run-result-limit``, :class:`RunError` says so
        per rank (with the remote traceback) and carries the other ranks' ``results``.
        A rank still inside ``fn`` at the timeout goes on with the job once it returns.

        >>> job.pause()                                                  # doctest: +SKIP
        >>> job.run(lambda ctx: float(ctx.exposed["loss"]))               # doctest: +SKIP
        {0: 0.4113, 1: 0.4372}
        """
        if not callable(fn):
            raise SpecError(f"job.run needs a function of ctx, got {fn!r}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout <= 0
        ):
            raise SpecError(
                f"job.run(timeout={timeout!r}): give a positive number of seconds, "
                "or None to wait as long as it takes"
            )
        chosen = (
            [ranks]
            if isinstance(ranks, int) and not isinstance(ranks, bool)
            else None
            if ranks is None
            else list(ranks)
        )
        try:
            payload = cloudpickle.dumps(fn)
        except Exception as e:
            what = getattr(fn, "__qualname__", repr(fn))
            raise SpecError(
                f"job.run: the function {what} can't be pickled ({type(e).__name__}: {e}); it "
                "must be picklable to reach the ranks — leave open files, locks, sockets or "
                "clients out of it (the ranks' own objects are in ctx)"
            ) from e
        seq = self.cluster.sync(self.cluster.control.run, self.id, payload, ranks=chosen)["seq"]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - time.monotonic())
            entry = self.cluster.sync(
                self.cluster.control.run_wait, self.id, seq, timeout=max(left, 0.0)
            )
            over = deadline is not None and time.monotonic() >= deadline
            if (
                not entry["found"]
                or entry["complete"]
                or entry["status"] not in RUN_WAITING
                or over
            ):
                break
        return _run_outcome(self.name, entry, timeout)

    def update(
        self,
        changes: dict[str, Any] | None = None,
        /,
        *,
        timeout: float | None = 60.0,
        **hparams: Any,
    ) -> int | None:
        """Change hyperparameters of a RUNNING or PAUSED job on every rank before the same
        step; return that step.

        Keys: ``lr``, ``weight_decay``, ``betas`` (every param group of every registered
        optimizer, or per group: ``lr={0: 1e-3, 1: 1e-4}``; with a registered LR
        scheduler, ``lr`` is the schedule's base), ``clip_grad_norm``, ``grad_accum``
        (not under ``pp``), ``checkpoint_every``, ``metrics_interval``, and the keys of
        the launch's ``hparams`` (``ctx.hparams``; give ``changes`` as a dict for a key
        that is not a valid keyword). Checked before any rank sees it (a
        :class:`SpecError` names the key and what it takes; the job keeps its state and
        step). Each change is a durable event (``job.updates()``, ``job.events()``), a
        marker on the dashboard's loss chart, and is kept by checkpoints and the job's
        spec: a resume (also at another world size) or a restart keeps it. Returns None
        if the job left RUNNING and PAUSED before its ranks applied it (its next gang
        does, first thing), and at once for a QUEUED job: its ranks apply it before their
        first step (a STARTING job's: this waits for that, and returns 0 or the step it
        resumed at). Before the ranks have reported their optimizers and batch, the
        changes are checked as far as the launch options allow and each rank checks the
        rest; a rank's refusal is then a durable event (``job.events()``).

        >>> job.update(lr=1e-4, warmup=200)                             # doctest: +SKIP
        1200
        """
        record = self.cluster.sync(
            self.cluster.control.update, self.id, {**(changes or {}), **hparams}, timeout=timeout
        )
        error = record.get("error")
        if error:
            raise SpecError(
                f"job.update of job {self.name!r} was refused by rank "
                f"{error.get('rank')}: {error.get('message')}; nothing changed, the "
                "job keeps its state and step"
            )
        if record["step"] is None and record["timed_out"]:
            raise JobTimeoutError(
                f"job {self.name!r} reached no step boundary within {timeout} s; the update is "
                "kept and its ranks apply it at their next one"
            )
        if spec_changes(record["changes"]):
            self.info()  # job.spec shows the launch options' new values at once
        return record["step"]

    def updates(self) -> list[dict[str, Any]]:
        """Every change ``job.update`` made, oldest first: ``seq``, ``step`` (applied before
        it), ``time`` and ``changes`` (key -> ``[old, new]``)."""
        return [
            {
                "seq": e.get("seq"),
                "step": e.get("step"),
                "time": e.get("time"),
                "changes": {k: list(v) for k, v in (e.get("changes") or {}).items()},
            }
            for e in self.events()
            if e.get("kind") == "updated"
        ]

    def stop(self, wait: bool = True, timeout: float | None = None) -> JobStatus:
        """Stop at the next step boundary (or dequeue); by default wait until it has.

        A HELD job (``on_error="hold"``) then ends FAILED with the error it was held for."""
        self.cluster.sync(self.cluster.control.stop, self.id)
        if wait:
            try:
                self.wait(timeout)
            except (JobStoppedError, JobFailedError):
                pass
        return self.status

    # debugging ---------------------------------------------------------------------
    def debug(self, rank: int | None = None) -> PostMortem:
        """The failing stack of a rank held under ``on_error="hold"`` (by default the one
        whose error is the cause), each frame with its locals, rendered safely (reprs cut
        to a length; tensors as shape, dtype, device and a few stats). Kept with the job's
        record: it is there after the hold ended too.

        >>> job = cluster.launch(train, world_size=2, on_error="hold")   # doctest: +SKIP
        >>> job.status                                                     # doctest: +SKIP
        <JobStatus.HELD: 'held'>
        >>> job.debug(1)                                                   # doctest: +SKIP
        rank 1 of job 'a' raised ValueError at step 12: bad batch (HELD) ...
        """
        return PostMortem(self.cluster.sync(self.cluster.control.debug, self.id, rank=rank))

    def restart(self) -> JobStatus:
        """End the hold of a HELD job: its ranks stop, and it continues from its newest
        committed checkpoint, first in the queue (not counted against ``max_restarts``).
        ``clustersdk restart JOB``, ``%job restart NAME`` and ``POST .../restart`` do the
        same.

        >>> job.restart()                                                  # doctest: +SKIP
        <JobStatus.RESTARTING: 'restarting'>
        """
        self._record = self.cluster.sync(self.cluster.control.restart, self.id)
        return JobStatus[self._record["status"]]

    def restart_from_checkpoint(self) -> JobStatus:
        """The same as :meth:`restart` (its name in earlier releases)."""
        return self.restart()

    def console(self, rank: int | None = None) -> Any:
        """The notebook console of the job's ``ctx.breakpoint()`` pdb sessions (jobs
        launched with ``debug=True``): a transcript, an input line and a Send button
        (a :class:`clustersdk.widgets.console.Console`, one per handle and ``rank``). The
        job's dashboard shows it by itself when a session opens. Needs ipywidgets."""
        return hooks.call("job_console", self, rank)

    # events ------------------------------------------------------------------------
    def _on_event(self, msg: dict[str, Any]) -> None:
        kind = msg.get("kind")
        if kind == "status":
            self._spec_stale = True  # read the record on the caller's thread, not Dask's
        if kind == "metrics":
            with self._lock:
                for row in msg.get("rows", ()):
                    self._keep_latest(row["rank"], row["step"], row["time"], row["scalars"])
        elif kind == "rollback":  # those steps will be replayed
            with self._lock:
                for rank in [r for r, row in self._latest.items() if row["step"] >= msg["step"]]:
                    del self._latest[rank]
        for callback in list(self._callbacks):
            callback(msg)

    def _keep_latest(self, rank: int, step: int, when: float, scalars: dict[str, Any]) -> None:
        self._latest[rank] = {"step": step, "time": when, **scalars}

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The live dashboard in Jupyter (plain HTML where ipywidgets is missing), as the
        presentation provides it (see :mod:`clustersdk.hooks`); the plain repr without one."""
        if not hooks.provided("job_display"):
            return {"text/plain": repr(self)}
        return hooks.call("job_display", self, include=include, exclude=exclude)

    def __repr__(self) -> str:
        runs = what_runs(self._record.get("spec") or {})
        what = f"strategy={runs!r}" if self.spec.kind == "function" else runs
        return f"<Job {self.name!r} {self._record.get('status', '?')} world_size={self.world_size} {what}>"


def _run_outcome(name: str, entry: dict[str, Any], timeout: float | None) -> dict[int, Any]:
    """``job.run``'s results from the control plane's ``entry``, or the :class:`RunError`
    that names what each rank without a result did."""
    if not entry["found"]:  # the job is over and forgot it
        raise RunError(
            name,
            {},
            {
                -1: {
                    "type": "JobEnded",
                    "traceback": "",
                    "message": (
                        f"the job is {entry['status']}; the results of job.run were not kept"
                    ),
                }
            },
        )
    results: dict[int, Any] = {}
    errors = {int(r): dict(e) for r, e in entry["errors"].items()}
    for key, data in entry["results"].items():
        try:
            results[int(key)] = cloudpickle.loads(data)
        except Exception as e:  # e.g. a class that only the workers can import
            errors[int(key)] = {
                "type": "UnpicklingError",
                "traceback": "",
                "message": (
                    f"its result can't be unpickled in this process ({type(e).__name__}: {e})"
                ),
            }
    started = set(entry.get("started") or ())
    for rank in entry["ranks"]:
        if rank in results or rank in errors:
            continue
        if entry["status"] not in RUN_WAITING:
            message = f"the job became {entry['status']} before rank {rank} ran the function"
            kind = "JobLeft"
        elif rank in started:
            message = (
                f"the function did not return within {timeout} s; the job is not "
                "affected: the rank goes on training once it returns"
            )
            kind = "Timeout"
        else:
            message = (
                f"the rank reached no step boundary within {timeout} s; it runs the "
                "function when it does"
            )
            kind = "Timeout"
        errors[rank] = {"type": kind, "message": message, "traceback": ""}
    if errors:
        raise RunError(name, dict(sorted(results.items())), errors)
    return dict(sorted(results.items()))


class Profile:
    """One profile request of a job (what ``job.profile(steps=N)`` returns): its ranks'
    trace files and summaries, as far as they have come.

    >>> profile = job.profile(steps=5)          # doctest: +SKIP
    >>> profile                                 # per-rank table in a notebook    # doctest: +SKIP
    >>> profile.traces                          # {rank: "/.../rank0.pt.trace.json"}  # doctest: +SKIP

    Open a trace in https://ui.perfetto.dev (or ``chrome://tracing``), or point
    TensorBoard at its directory (with the ``torch-tb-profiler`` plugin).
    """

    def __init__(self, job: Job, entry: dict[str, Any]):
        self.job = job
        self._entry = entry

    @property
    def seq(self) -> int:
        """The request's sequence number within its job."""
        return int(self._entry["seq"])

    @property
    def steps(self) -> int:
        """How many steps were asked for."""
        return int(self._entry["steps"])

    @property
    def complete(self) -> bool:
        """Every rank wrote its trace."""
        return bool(self._entry["complete"])

    @property
    def ranks(self) -> dict[int, dict[str, Any]]:
        """Each reporting rank's summary: first_step, steps, path, wall_s, data_wait_s,
        communication_s, compute_s, top_ops (or ``error``)."""
        return {int(r["rank"]): r for r in self._entry["ranks"]}

    @property
    def traces(self) -> dict[int, str]:
        """The Chrome trace JSON file of each rank (Perfetto and TensorBoard open them)."""
        return {rank: r["path"] for rank, r in self.ranks.items() if r.get("path")}

    @property
    def directory(self) -> str | None:
        """The directory of the ranks' trace files (for TensorBoard), or None before any."""
        paths = list(self.traces.values())
        return os.path.dirname(paths[0]) if paths else None

    def wait(self, timeout: float | None = None) -> Profile:
        """Until every rank wrote its trace (or the job ended or restarted first)."""
        cluster = self.job.cluster
        self._entry = cluster.sync(
            cluster.control.profile_wait, self.job.id, self.seq, timeout=timeout
        )
        return self

    # --- display ----------------------------------------------------------------------------
    def summary(self, top: int = 5) -> str:
        """Per rank: the split of the profiled steps' time and the top operators."""
        lines = [self._headline()]
        for rank, r in sorted(self.ranks.items()):
            if r.get("error"):
                lines.append(f"  rank {rank}: failed: {r['error']}")
                continue
            lines.append(
                f"  rank {rank}: steps {r['first_step']}-{r['first_step'] + r['steps'] - 1}"
                f"  {_split(r)}  trace {r['path']}"
            )
            for op in r.get("top_ops", [])[:top]:
                lines.append(f"      {_ms(_self_time(op)):>9}  x{op['calls']:<5} {op['name']}")
        return "\n".join(lines)

    def _headline(self) -> str:
        n, ws = len(self.ranks), int(self._entry.get("world_size", 0))
        state = "complete" if self.complete else f"{n} of {ws} ranks reported"
        waiting = (
            "; starts when the job resumes"
            if self._entry.get("status") == "PAUSED" and not n
            else ""
        )
        return f"profile #{self.seq} of job {self.job.name!r}: {self.steps} steps, {state}{waiting}"

    def _repr_html_(self) -> str:
        rows = []
        for rank, r in sorted(self.ranks.items()):
            if r.get("error"):
                rows.append(
                    f"<tr><td>{rank}</td><td colspan='5'>failed: "
                    f"{html.escape(r['error'])}</td></tr>"
                )
                continue
            ops = "<br>".join(
                f"{_ms(_self_time(op))} &times;{op['calls']} <code>{html.escape(op['name'])}</code>"
                for op in r.get("top_ops", [])[:5]
            )
            wall = r["wall_s"] or 1.0
            bar = "".join(
                f"<span title='{label} {_ms(r[key])}' style='display:inline-block;height:10px;"
                f"width:{100 * r[key] / wall:.1f}px;background:{color}'></span>"
                for key, label, color in _PARTS
            )
            rows.append(
                f"<tr><td>{rank}</td><td>{r['first_step']}&ndash;"
                f"{r['first_step'] + r['steps'] - 1}</td><td>{bar}<br>"
                f"<small>{html.escape(_split(r))}</small></td><td>{ops}</td>"
                f"<td><code>{html.escape(r['path'])}</code></td></tr>"
            )
        return (
            f"<div><b>{html.escape(self._headline())}</b>"
            "<table><tr><th>rank</th><th>steps</th><th>time</th><th>top ops (self time)</th>"
            "<th>trace (Perfetto / TensorBoard)</th></tr>" + "".join(rows) + "</table></div>"
        )

    def __repr__(self) -> str:
        return self.summary()


_PARTS = (
    ("compute_s", "compute", "#2563eb"),
    ("communication_s", "communication", "#d97706"),
    ("data_wait_s", "data wait", "#dc2626"),
)


def _split(r: dict[str, Any]) -> str:
    wall = r["wall_s"] or 1.0
    return f"{_ms(r['wall_s'])}: " + ", ".join(
        f"{label} {100 * r[key] / wall:.0f}%" for key, label, _ in _PARTS
    )


def _self_time(op: dict[str, Any]) -> float:
    return op["device_s"] or op["self_s"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
