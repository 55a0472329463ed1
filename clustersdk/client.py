"""The control plane's operations, written once, as coroutines.

:class:`ControlClient` wraps any Dask RPC object that reaches a scheduler
(``client.scheduler`` of a sync or an async ``distributed.Client``). The SDK's
:class:`~clustersdk.Cluster` runs these coroutines through its client's sync
bridge; the Jupyter server extension awaits them on its own event loop. No
Dask import here: the RPC object brings the transport.

>>> control = ControlClient(client.scheduler)               # doctest: +SKIP
>>> await control.jobs()                                     # doctest: +SKIP
[{'id': '4f1c...', 'name': 'a', 'status': 'RUNNING', ...}]
"""

from __future__ import annotations

from typing import Any

from .protocol import Op, WireSpec, op


class ControlClient:
    """One coroutine per :class:`~clustersdk.protocol.Op` a kernel may call."""

    def __init__(self, rpc: Any):
        self.rpc = rpc

    async def call(self, operation: Op, **kwargs: Any) -> Any:
        """``operation`` with ``kwargs``; what a scheduler without the handler answers
        (None) comes back as is."""
        return await op(self.rpc, operation)(**kwargs)

    # --- the cluster ----------------------------------------------------------------
    async def inventory(self) -> list[dict[str, Any]]:
        """Every slot in rank order: worker, host, kind, index, uuid and its job."""
        return await self.call(Op.INVENTORY)

    async def set_capacity(self, slots: int, note: str = "") -> None:
        """For an autoscaling deployer: the most slots it can grow to (launches up to that
        are accepted) and what queued jobs wait for besides free slots."""
        await self.call(Op.SET_CAPACITY, slots=slots, note=note)

    async def queue(self) -> dict[str, Any]:
        """Per queue: guarantees and limits, the jobs holding slots, the jobs waiting and why."""
        return await self.call(Op.QUEUE)

    async def configure(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change the scheduling settings (queues, quotas, classes); returns them all."""
        return await self.call(Op.CONFIGURE, changes=changes)

    async def stacks(self, job: str, all_threads: bool = False) -> dict[str, Any]:
        """Where each rank of ``job`` is: rank -> stack text, step, phase (see job.stacks)."""
        return await self.call(Op.STACKS, job=job, all_threads=all_threads)

    async def whoami(self) -> dict[str, Any]:
        """The identity this connection acts as, and whether the rules are enforced."""
        return await self.call(Op.WHOAMI)

    async def cluster_events(self) -> list[dict[str, Any]]:
        """What happened to the cluster's own processes, oldest first: a standing
        cluster's scheduler or worker that its supervisor started again, and why."""
        return await self.call(Op.CLUSTER_EVENTS)

    async def drain(self, target: str, reason: str = "", by: float | None = None) -> dict[str, Any]:
        """Take a host (or a worker) out: its jobs move (by ``by``, a time), it takes no
        new ranks (admins)."""
        return await self.call(Op.DRAIN, target=target, reason=reason, by=by)

    async def undrain(self, target: str) -> dict[str, Any]:
        """Give a drained host (or worker) back (admins)."""
        return await self.call(Op.UNDRAIN, target=target)

    async def revoke(self, crl: str) -> dict[str, Any]:
        """An admin's new revocation list (:meth:`Cluster.remove_user` sends it)."""
        return await self.call(Op.REVOKE, crl=crl)

    # --- jobs ---------------------------------------------------------------------------
    async def submit(self, spec: WireSpec, payload: bytes) -> dict[str, Any]:
        return await self.call(Op.SUBMIT, spec=spec.as_dict(), payload=payload)

    async def job(self, job: str | None = None, name: str | None = None) -> dict[str, Any]:
        """The record of job id ``job``, or of the newest job called ``name``."""
        return await self.call(Op.JOB, job=job, name=name)

    async def jobs(self) -> list[dict[str, Any]]:
        """Every job record of the scheduler, oldest first."""
        return await self.call(Op.JOBS)

    async def wait(self, job: str, timeout: float | None = None) -> dict[str, Any]:
        """The record (with ``result``) once the job is over, or when ``timeout`` passes."""
        return await self.call(Op.WAIT, job=job, timeout=timeout)

    async def history(
        self,
        job: str,
        since: int = 0,
        limit: int | None = None,
        last_steps: int | None = None,
        rank: int | None = None,
    ) -> list[dict[str, Any]]:
        # the last two only when asked: a scheduler of an older release has no such arguments
        extra = {k: v for k, v in (("last_steps", last_steps), ("rank", rank)) if v is not None}
        return await self.call(Op.HISTORY, job=job, since=since, limit=limit, **extra)

    async def steps(
        self, job: str, last: int | None = None, since_step: int | None = None
    ) -> list[dict[str, Any]]:
        """One row per step: its scalars' mean, min and max over the ranks (see job.steps)."""
        return await self.call(Op.STEPS, job=job, last=last, since_step=since_step)

    async def logs(self, job: str, rank: int | None = None, since: int = 0) -> list[dict[str, Any]]:
        return await self.call(Op.LOGS, job=job, rank=rank, since=since)

    async def system(self, job: str, since: int = 0) -> list[dict[str, Any]]:
        return await self.call(Op.SYSTEM, job=job, since=since)

    async def phases(
        self, job: str, since: int = 0, limit: int | None = None, tail: int | None = None
    ) -> list[dict[str, Any]]:
        return await self.call(Op.PHASES, job=job, since=since, limit=limit, tail=tail)

    # --- control ----------------------------------------------------------------------
    async def stop(self, job: str) -> dict[str, Any]:
        return await self.call(Op.STOP, job=job)

    async def pause(self, job: str, timeout: float | None = None) -> dict[str, Any]:
        return await self.call(Op.PAUSE, job=job, timeout=timeout)

    async def resume(self, job: str, world_size: int | None = None) -> dict[str, Any]:
        return await self.call(Op.RESUME, job=job, world_size=world_size)

    async def checkpoint(self, job: str, timeout: float | None = None) -> dict[str, Any]:
        return await self.call(Op.CHECKPOINT, job=job, timeout=timeout)

    async def suspend(self, job: str, timeout: float | None = None) -> dict[str, Any]:
        return await self.call(Op.SUSPEND, job=job, timeout=timeout)

    async def fork(
        self,
        job: str,
        name: str | None = None,
        at: int | None = None,
        changes: dict[str, Any] | None = None,
        world_size: int | None = None,
        checkpoint_dir: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """A new job from a checkpoint of ``job`` (its next one, or the one before step
        ``at``) with ``changes``; the new job's record."""
        return await self.call(
            Op.FORK,
            job=job,
            name=name,
            at=at,
            changes=changes,
            world_size=world_size,
            checkpoint_dir=checkpoint_dir,
            timeout=timeout,
        )

    async def profile(
        self, job: str, steps: int, timeout: float | None = None, wait: bool = True
    ) -> dict[str, Any]:
        return await self.call(Op.PROFILE, job=job, steps=steps, timeout=timeout, wait=wait)

    async def profile_wait(
        self, job: str, seq: int, timeout: float | None = None
    ) -> dict[str, Any]:
        return await self.call(Op.PROFILE_WAIT, job=job, seq=seq, timeout=timeout)

    # --- debugging: on_error="hold" and ctx.breakpoint() -----------------------------------
    async def debug(self, job: str, rank: int | None = None) -> dict[str, Any]:
        """A held rank's error and failing frames with their locals (see job.debug)."""
        return await self.call(Op.DEBUG, job=job, rank=rank)

    async def restart(self, job: str) -> dict[str, Any]:
        """End a HELD job's hold: it continues from its newest checkpoint."""
        return await self.call(Op.RESTART, job=job)

    async def console(
        self, job: str, rank: int | None = None, text: str | None = None
    ) -> dict[str, Any]:
        """Send ``text`` to the pdb session of ``rank`` (None: the open one); the open
        sessions and the console's messages so far (``chunks``, numbered by ``seq``)."""
        return await self.call(Op.CONSOLE, job=job, rank=rank, text=text)

    # --- job.run and job.update -----------------------------------------------------------
    async def run(self, job: str, fn: bytes, ranks: list[int] | None = None) -> dict[str, Any]:
        """Ask for the cloudpickled ``fn(ctx)`` on ``ranks`` (None: all) of a RUNNING or
        PAUSED job, at their next boundary; the request (its ``seq``)."""
        return await self.call(Op.RUN, job=job, fn=fn, ranks=ranks)

    async def run_wait(self, job: str, seq: int, timeout: float | None = None) -> dict[str, Any]:
        """Run request ``seq``: pickled ``results`` and ``errors`` by rank, once complete."""
        return await self.call(Op.RUN_WAIT, job=job, seq=seq, timeout=timeout)

    async def update(
        self, job: str, changes: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        """Change hyperparameters before one step on every rank; the request, with ``step``."""
        return await self.call(Op.UPDATE, job=job, changes=changes, timeout=timeout)
