"""The client-side handle of a job.

A ``Job`` holds no state of its own that matters: the control plane in the
scheduler is the truth, so a handle made by ``Job.attach`` in another process
sees exactly what the launching one sees.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import cloudpickle

from .errors import InvalidTransitionError, JobFailedError, JobStoppedError, JobTimeoutError
from .status import JobStatus

if TYPE_CHECKING:
    from .cluster.base import Cluster

WAIT_SLICE = 5.0  # seconds per server-side wait, so that Ctrl-C stays responsive


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
        self.spec: dict[str, Any] = record["spec"]
        self._record = record
        self._latest: dict[int, dict[str, Any]] = {}
        self._spec_stale = False  # a status event came: the world size may have changed
        self._callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._lock = threading.Lock()
        cluster._watch(self.id, self._on_event)

    # attach ------------------------------------------------------------------
    @classmethod
    def attach(cls, cluster: Cluster, name: str) -> Job:
        """The newest job called ``name`` on ``cluster``, from any process."""
        return cls(cluster, cluster._call("job", name=name))

    # state ---------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.spec["world_size"]

    @property
    def strategy(self) -> str:
        return self.spec["strategy"]

    def info(self) -> dict[str, Any]:
        """The job's record: status, reason, ranks and their workers, times, error."""
        self._record = self.cluster._call("job", job=self.id)
        self.spec = self._record.get("spec") or self.spec  # resume(world_size=) changes it
        return self._record

    @property
    def status(self) -> JobStatus:
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
    def latest(self) -> dict[int, dict[str, Any]]:
        """The last row each rank of the job's current world size logged, kept current by
        the event stream (a rank that a resume at a smaller world size left out is gone)."""
        if self._spec_stale:
            self._spec_stale = False
            try:
                self.info()
            except Exception:  # the cluster is gone: keep what we know
                pass
        with self._lock:
            return {rank: dict(row) for rank, row in self._latest.items()
                    if rank < self.world_size}

    def on_event(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """Call ``callback(msg)`` for every status change and metrics batch (from Dask's loop)."""
        self._callbacks.append(callback)

    # results -------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> Any:
        """Block until the job ends; return rank 0's return value.

        Raises :class:`JobFailedError` (with the remote traceback) if a rank failed,
        :class:`JobTimeoutError` if ``timeout`` passes first (the job goes on).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - time.monotonic())
            record = self.cluster._call("wait", job=self.id, timeout=max(left, 0.0))
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
        record = self.cluster._call("wait", job=self.id, timeout=0)
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

    def history(self, since: int = 0) -> list[dict[str, Any]]:
        """Every logged row after sequence number ``since``: seq, rank, step, time, scalars."""
        return list(self.cluster._call("history", job=self.id, since=since))

    def system(self, since: int = 0) -> list[dict[str, Any]]:
        """GPU samples per rank (utilisation, memory, temperature, power) or, without a
        GPU, CPU, memory and network samples; ``source`` says which ("nvml"/"psutil")."""
        return list(self.cluster._call("system", job=self.id, since=since))

    def logs(self, rank: int = 0) -> str:
        """What rank ``rank`` printed or logged, as text."""
        lines = self.cluster._call("logs", job=self.id, rank=rank)
        return "".join(line["text"] + "\n" for line in lines)

    # control -------------------------------------------------------------------
    def pause(self, timeout: float | None = 60) -> int:
        """Hold every rank at the same step boundary, keeping the slots and process group.

        Returns once every rank has paused, with the step they stopped before.
        """
        return self.cluster._call("pause", job=self.id, timeout=timeout)["paused_at"]

    def resume(self, world_size: int | None = None) -> JobStatus:
        """Continue a PAUSED job, or queue a SUSPENDED one again (optionally at another
        ``world_size``; the global batch stays the same)."""
        self._record = self.cluster._call("resume", job=self.id, world_size=world_size)
        self.spec = self._record["spec"]  # the world size may have changed
        return JobStatus[self._record["status"]]

    def checkpoint(self, timeout: float | None = None) -> str:
        """Checkpoint at the next step boundary; return the committed checkpoint's path."""
        return self.cluster._call("checkpoint", job=self.id, timeout=timeout)["checkpoint"]

    def suspend(self, timeout: float | None = None) -> str:
        """Checkpoint, free the slots and wait SUSPENDED; ``resume()`` continues.

        Returns the path of the checkpoint the job will resume from.
        """
        self._record = self.cluster._call("suspend", job=self.id, timeout=timeout)
        return self._record["checkpoint"]

    def stop(self, wait: bool = True, timeout: float | None = None) -> JobStatus:
        """Stop at the next step boundary (or dequeue); by default wait until it has."""
        self.cluster._call("stop", job=self.id)
        if wait:
            try:
                self.wait(timeout)
            except (JobStoppedError, JobFailedError):
                pass
        return self.status

    # events ------------------------------------------------------------------------
    def _on_event(self, msg: dict[str, Any]) -> None:
        if msg.get("kind") == "status":
            self._spec_stale = True  # read the record on the caller's thread, not Dask's
        if msg.get("kind") == "metrics":
            with self._lock:
                for row in msg.get("rows", ()):
                    self._latest[row["rank"]] = {"step": row["step"], "time": row["time"],
                                                 **row["scalars"]}
        for callback in list(self._callbacks):
            callback(msg)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The live dashboard in Jupyter (plain HTML where ipywidgets is missing)."""
        from .widgets import job_mimebundle

        return job_mimebundle(self, include=include, exclude=exclude)

    def __repr__(self) -> str:
        return (f"<Job {self.name!r} {self._record.get('status', '?')} "
                f"world_size={self.world_size} strategy={self.strategy!r}>")
