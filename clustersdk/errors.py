"""The one exception tree of clustersdk.

::

    ClusterSDKError
     ├── SpecError (also ValueError)        a bad argument, caught before anything runs
     ├── CapacityError (also ValueError)    asks for more slots than the cluster can ever hold
     ├── PluginMissingError                  the scheduler has no clustersdk control plane
     ├── ProtocolError                       a peer speaks another version of the wire protocol
     ├── ClusterClosedError (also RuntimeError)  a call on a Cluster after its close()
     ├── JobNotFoundError (also KeyError)    no job by that name or id
     ├── InvalidTransitionError              an action that makes no sense in the job's state
     ├── AccessDeniedError                   the identity that asked may not do this to this job
     ├── JobTimeoutError (also TimeoutError) wait() ran out of time; the job goes on
     ├── JobStoppedError                     the job was stopped before it produced a result
     ├── CheckpointError                     a checkpoint can't be written, found or loaded
     ├── StartError                          a cluster's hosts or batch jobs could not be started
     │    └── HostKeyError                   an SSH host key is unknown or has changed: refused
     ├── RunError                            job.run's function failed on some ranks
     └── JobFailedError                      a rank failed (raised, or its process died);
                                             carries rank, type, message, traceback

Every message names the bad value and what was expected, so that a user can
fix the call without reading our code. Every error pickles and comes back whole
(its message and its fields): the control plane's errors cross the wire that way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: What a rank's error record is typed when its process ended without an exception of
#: its own: a script's non-zero exit, a function rank killed by a signal or ``os._exit``.
#: Its message says how ("exited with code 3", "died of SIGSEGV (signal 11)").
EXIT_TYPES = frozenset({"ScriptExit", "RankExit"})


def describe(error: Mapping[str, Any]) -> str:
    """One line for a rank's error record: what happened to which rank.

    >>> describe({"rank": 1, "type": "RankExit", "message": "died of SIGSEGV (signal 11)",
    ...           "where": "host 10.0.0.2, GPU 3"})
    'rank 1 (host 10.0.0.2, GPU 3) died of SIGSEGV (signal 11)'
    >>> describe({"rank": 0, "type": "ValueError", "message": "boom"})
    'rank 0 raised ValueError: boom'
    """
    rank = f"rank {error.get('rank')}"
    if error.get("where"):
        rank += f" ({error['where']})"
    if error.get("type") in EXIT_TYPES:
        return f"{rank} {error.get('message')}"
    return f"{rank} raised {error.get('type')}: {error.get('message')}"


class ClusterSDKError(Exception):
    """Base class of every error clustersdk raises on purpose."""


class SpecError(ClusterSDKError, ValueError):
    """A launch argument is invalid; nothing was started."""


class CapacityError(ClusterSDKError, ValueError):
    """The job asks for more slots than the cluster has in total."""


class PluginMissingError(ClusterSDKError):
    """The Dask scheduler does not run the clustersdk control plane."""


class ProtocolError(ClusterSDKError):
    """A message or spec from a peer running another clustersdk release."""


class ClusterClosedError(ClusterSDKError, RuntimeError):
    """A call on a :class:`~clustersdk.Cluster` (or one of its jobs) after
    ``cluster.close()``: the handle reaches nothing any more. ``address`` is the
    scheduler it was connected to; the message says how to get a working handle.

    >>> str(ClusterClosedError("the Cluster is closed: start a new one", "tcp://10.0.0.5:8786"))
    'the Cluster is closed: start a new one'
    """

    def __init__(self, message: str, address: str | None = None):
        super().__init__(message)
        self.address = address


class JobNotFoundError(ClusterSDKError, KeyError):
    """No job with that name or id is known to the scheduler."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidTransitionError(ClusterSDKError):
    """The requested action is not allowed in the job's current state."""


class AccessDeniedError(ClusterSDKError):
    """The identity a request came from (its TLS certificate) may not do what it asked:
    change a job it does not own, or an admin's or the cluster's own operation. Nothing
    was changed. ``job``, ``owner``, ``identity`` and ``action`` name who asked what.

    >>> str(AccessDeniedError("'bob' may not stop job 'a': it is 'alice''s", "a", "alice",
    ...                       "bob", "stop"))
    "'bob' may not stop job 'a': it is 'alice''s"
    """

    def __init__(
        self,
        message: str,
        job: str | None = None,
        owner: str | None = None,
        identity: str | None = None,
        action: str | None = None,
    ):
        # every field in args: the error crosses the wire pickled, and comes back whole
        super().__init__(message, job, owner, identity, action)
        self.job, self.owner, self.identity, self.action = job, owner, identity, action

    def __str__(self) -> str:
        return str(self.args[0])


class JobTimeoutError(ClusterSDKError, TimeoutError):
    """``Job.wait`` timed out; the job itself keeps running."""


class JobStoppedError(ClusterSDKError):
    """The job was stopped before rank 0 returned a result."""


class CheckpointError(ClusterSDKError):
    """A checkpoint can't be written, found or loaded; the message says why and
    which checkpoint is kept instead."""


class StartError(ClusterSDKError):
    """A cluster could not be brought up: a host that can't be reached, logged into or
    started on, or a batch system that refused its jobs. ``host`` names the host (None
    when the failure is not one host's); whatever had been started is stopped again."""

    def __init__(self, message: str, host: str | None = None):
        super().__init__(message)
        self.host = host


class HostKeyError(StartError):
    """An SSH host offered a key that ``known_hosts`` does not have, or a different one
    than it has. Never accepted silently: the message says how to check and add it."""


class RunError(ClusterSDKError):
    """``job.run``'s function did not give a result on some ranks: it raised, did not
    return within the timeout, or returned something that can't be pickled or is over
    ``clustersdk.run-result-limit``. The job itself is not affected.

    ``results`` holds the ranks that succeeded (rank -> result), ``errors`` the others
    (rank -> ``{"type", "message", "traceback"}``, the traceback being the rank's own).

    >>> err = RunError("a", {0: 1.5}, {1: {"type": "ValueError", "message": "no", "traceback": ""}})
    >>> str(err).splitlines()[0]
    "job.run on job 'a' failed on rank 1 (rank 0 returned):"
    """

    def __init__(self, job: str, results: dict[int, Any], errors: dict[int, dict[str, Any]]):
        self.job = job
        self.results = dict(results)
        self.errors = dict(errors)
        failed = ", ".join(str(r) for r in sorted(errors))
        good = f" (rank {', '.join(str(r) for r in sorted(results))} returned)" if results else ""
        text = f"job.run on job {job!r} failed on rank {failed}{good}:"
        for rank in sorted(errors):
            err = errors[rank]
            text += f"\n  rank {rank}: {err.get('type')}: {err.get('message')}"
        for rank in sorted(errors):
            tb = (errors[rank].get("traceback") or "").rstrip()
            if tb:
                text += f"\n\nRemote traceback (rank {rank}):\n{tb}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        # built from its fields again (Exception's default passes the text as one argument)
        return type(self), (self.job, self.results, self.errors), dict(self.__dict__)


class JobFailedError(ClusterSDKError):
    """A rank raised: the job is FAILED.

    Attributes name the first failing ``rank``, the exception type
    (``exc_type``), its ``message`` and the remote ``traceback`` text, and, when
    the failure is a known kind (out of memory, a collective timeout...), its
    ``diagnosis`` (a :class:`~clustersdk.Diagnosis`: what went wrong, what to do).
    """

    def __init__(
        self,
        job: str,
        rank: int,
        exc_type: str,
        message: str,
        traceback: str,
        consequences: list[dict[str, Any]] | None = None,
        diagnosis: dict[str, Any] | None = None,
        where: str | None = None,
    ):
        self.job = job
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.traceback = traceback
        self.where = where  # the failed rank's host and device: "host h, GPU 0"
        self.consequences = consequences or []  # the peers' errors the cause brought about
        self.diagnosis = None
        if diagnosis:
            from .diagnosis import Diagnosis

            self.diagnosis = Diagnosis.from_dict(diagnosis)
        if exc_type == "WorkerLost":  # no rank raised: its worker went away
            text = f"job {job!r} failed: {message}"
        else:  # "rank 1 raised ValueError: ...", "rank 1 (host h, CPU) died of SIGSEGV"
            record = {"rank": rank, "type": exc_type, "message": message, "where": where}
            text = f"job {job!r} failed: {describe(record)}"
        if self.diagnosis is not None:
            text += f"\n\nDiagnosis: {self.diagnosis.summary}\nWhat to do: {self.diagnosis.advice}"
        if self.consequences:
            text += "\n\nThen, as a consequence:" + "".join(
                f"\n  {describe(c)}" for c in self.consequences
            )
        if traceback:
            text += f"\n\nRemote traceback (rank {rank}):\n{traceback}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        # built from its fields again (Exception's default passes the text as one argument);
        # the state keeps what was added after (a note)
        diagnosis = self.diagnosis.as_dict() if self.diagnosis is not None else None
        fields = (self.rank, self.exc_type, self.message, self.traceback, self.consequences)
        return type(self), (self.job, *fields, diagnosis, self.where), dict(self.__dict__)

    @classmethod
    def from_record(cls, job: str, error: dict[str, Any]) -> JobFailedError:
        return cls(
            job,
            error["rank"],
            error["type"],
            error["message"],
            error["traceback"],
            error.get("consequences"),
            error.get("diagnosis"),
            error.get("where"),
        )
