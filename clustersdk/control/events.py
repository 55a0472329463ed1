"""The vocabulary of :mod:`.lifecycle`: events that happen to a job, actions it asks for.

Pure dataclasses. The control plane turns what it hears (an RPC, a rank's
report, Dask's notice that a worker left, a timer) into an *event*, feeds it
to the job's :class:`~.lifecycle.Lifecycle`, and carries out the *actions*
that come back, in order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..protocol import ExitStatus, Message, StatusMessage


# --- events: what the control plane learned --------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RankSlot:
    """Where one rank of a gang runs."""

    worker: str
    host: str
    device: str  # "cuda:<index>" or "cpu"


@dataclasses.dataclass(frozen=True)
class Allocated:
    """The policy gave the queued job a whole gang, in rank order."""

    ranks: tuple[RankSlot, ...]


@dataclasses.dataclass(frozen=True)
class RankEventBase:
    rank: int
    attempt: int  # the gang start it belongs to: events of an earlier one are ignored


@dataclasses.dataclass(frozen=True)
class Started(RankEventBase):
    versions: dict[str, Any] | None = None  # python, torch, clustersdk... of the rank's worker


@dataclasses.dataclass(frozen=True)
class Paused(RankEventBase):
    step: int


@dataclasses.dataclass(frozen=True)
class Resumed(RankEventBase):
    step: int = 0


@dataclasses.dataclass(frozen=True)
class LoopStarted(RankEventBase):
    total_steps: int


@dataclasses.dataclass(frozen=True)
class Restored(RankEventBase):
    step: int
    path: str = ""


@dataclasses.dataclass(frozen=True)
class CheckpointCommitted(RankEventBase):
    seq: int
    step: int
    path: str


@dataclasses.dataclass(frozen=True)
class CheckpointFailed(RankEventBase):
    seq: int
    step: int
    message: str


@dataclasses.dataclass(frozen=True)
class Failed(RankEventBase):
    error: dict[str, Any]  # rank, type, message, traceback


@dataclasses.dataclass(frozen=True)
class Exited(RankEventBase):
    status: ExitStatus
    result: bytes | None = None  # rank 0's pickled return value


@dataclasses.dataclass(frozen=True)
class Profiled(RankEventBase):
    """The rank wrote its trace of profile request ``seq`` (``profile``: its summary)."""

    seq: int
    profile: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Held(RankEventBase):
    """The rank raised under ``on_error="hold"`` and waits (see :mod:`.holds`): its
    ``error`` record, its failing ``frames`` with their locals, the ``step``."""

    error: dict[str, Any]
    frames: list[dict[str, Any]]
    step: int | None = None


@dataclasses.dataclass(frozen=True)
class BreakpointHit(RankEventBase):
    """The rank reached its ``k``-th ``ctx.breakpoint()`` and opened a pdb session."""

    k: int
    step: int


@dataclasses.dataclass(frozen=True)
class ConsoleOutput(RankEventBase):
    """What the rank's pdb session of breakpoint ``k`` printed; ``closed``: it ended."""

    k: int
    text: str
    closed: bool = False


@dataclasses.dataclass(frozen=True)
class Ran(RankEventBase):
    """The rank ran ``job.run`` request ``seq``: its pickled ``result``, or its ``error``."""

    seq: int
    result: bytes | None = None
    error: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Updated(RankEventBase):
    """The rank applied ``job.update`` request ``seq`` before ``step`` (``changes``: key ->
    [old, new]), or refused it (``error``; ``cause`` set on the rank that found why)."""

    seq: int
    step: int | None = None
    changes: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    error: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Tunable(RankEventBase):
    """What ``job.update``'s checks need to know of the rank (its optimizers' param groups,
    its batch, the step helpers it calls), reported after its first step."""

    info: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Controls(RankEventBase):
    """A script rank opted into step boundaries (:mod:`clustersdk.script`): what it
    ``accepts`` there ("pause", "checkpoint")."""

    accepts: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class StartFailed(RankEventBase):
    """The agent could not start the rank (its worker vanished, or refused)."""

    exc_type: str
    message: str


@dataclasses.dataclass(frozen=True)
class WorkerLost(RankEventBase):
    worker: str
    host: str
    # how its process ended, when its nanny said: exitcode, memory_limit, rss,
    # terminated_for_memory (see clustersdk.control.evidence)
    facts: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class NonFinite(RankEventBase):
    """A watched scalar (a loss, a gradient norm) was NaN or Inf at ``step``: reported by
    the rank itself (``on_nan`` other than "report") or found in its rows."""

    step: int
    values: dict[str, float]


@dataclasses.dataclass(frozen=True)
class LossSpike(RankEventBase):
    """The job's loss at ``step`` (``mean``, over ``ranks`` ranks) is a spike (see
    :mod:`clustersdk.signals`); ``rank`` had the highest loss of that step, ``value``."""

    step: int
    value: float
    median: float
    mad: float
    score: float
    window: int
    mean: float | None = None
    ranks: int = 1
    scale: float | None = None  # how high the steps before went (clustersdk.signals)


@dataclasses.dataclass(frozen=True)
class GraceExpired:
    """The failure held back at this attempt was not explained by a lost worker."""

    attempt: int


@dataclasses.dataclass(frozen=True)
class StopRequested:
    pass


@dataclasses.dataclass(frozen=True)
class PauseRequested:
    pass


@dataclasses.dataclass(frozen=True)
class PauseWithdrawn:
    """The pause did not happen in time: take the request back."""


@dataclasses.dataclass(frozen=True)
class ResumeRequested:
    world_size: int | None = None


@dataclasses.dataclass(frozen=True)
class CheckpointRequested:
    pass


@dataclasses.dataclass(frozen=True)
class SuspendRequested:
    pass


@dataclasses.dataclass(frozen=True)
class ProfileRequested:
    steps: int


@dataclasses.dataclass(frozen=True)
class RestartRequested:
    """``job.restart()`` of a HELD job."""


@dataclasses.dataclass(frozen=True)
class HoldExpired:
    """The hold of gang start ``attempt`` lasted ``hold_timeout``: the job fails."""

    attempt: int


@dataclasses.dataclass(frozen=True)
class RunRequested:
    """``job.run``: ``fn`` (cloudpickled) for ``ranks`` (None: all); results up to ``limit``
    bytes."""

    fn: bytes
    ranks: tuple[int, ...] | None
    limit: int


@dataclasses.dataclass(frozen=True)
class UpdateRequested:
    """``job.update(**changes)``, as given (checked by the lifecycle)."""

    changes: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class SchedulerClosing:
    pass


@dataclasses.dataclass(frozen=True)
class HangDetected:
    """No rank has finished a step for ``idle_for`` seconds (over ``timeout``): ``where``
    says where each rank was; ``grace`` is how long a stop may take before the ranks
    still out are ended by restarting their workers."""

    idle_for: float
    timeout: float
    where: str
    grace: float


@dataclasses.dataclass(frozen=True)
class Progressed:
    """A step finished again on a HUNG job."""


@dataclasses.dataclass(frozen=True)
class StopOverdue:
    """The ranks of a hung gang had ``grace`` seconds to get out (``attempt``'s)."""

    attempt: int
    grace: float


@dataclasses.dataclass(frozen=True)
class Preempted:
    """The scheduling policy needs the job's slots for another job: ``how`` is
    ``"suspend"`` (checkpoint, then leave) or ``"stop"``; either way it queues again.
    ``overdue``: a suspend that outlived the preemption grace: stop it now."""

    how: str
    reason: str
    overdue: bool = False


@dataclasses.dataclass(frozen=True)
class Grow:
    """Slots are free again for a job running on fewer ranks than it asked for:
    checkpoint, then continue at ``world_size``."""

    world_size: int


@dataclasses.dataclass(frozen=True)
class Reclaimed:
    """Idle too long (paused, or no finished step): suspend it (or stop it, without a
    checkpoint_dir) to free its slots; it does not queue again by itself."""

    how: str
    reason: str


Event = (
    Allocated
    | Started
    | Paused
    | Resumed
    | LoopStarted
    | Restored
    | CheckpointCommitted
    | CheckpointFailed
    | Failed
    | Exited
    | Profiled
    | StartFailed
    | WorkerLost
    | GraceExpired
    | StopRequested
    | PauseRequested
    | PauseWithdrawn
    | ResumeRequested
    | CheckpointRequested
    | SuspendRequested
    | ProfileRequested
    | SchedulerClosing
    | Preempted
    | Reclaimed
    | HangDetected
    | Progressed
    | StopOverdue
    | Grow
    | Held
    | BreakpointHit
    | ConsoleOutput
    | RestartRequested
    | HoldExpired
    | RunRequested
    | Ran
    | UpdateRequested
    | Updated
    | Tunable
    | NonFinite
    | LossSpike
    | Controls
)


# --- actions: what the control plane must do ----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Journal:
    """Update the job's record with these fields."""

    fields: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Publish:
    """Send ``message`` to the job's topic (every subscribed kernel sees it)."""

    message: Message


@dataclasses.dataclass(frozen=True)
class StartGang:
    """Open rank 0's store and start every rank of the allocated gang with ``spec``."""

    attempt: int
    words: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SendControl:
    """Send the control vector to the agents of ``workers``."""

    words: tuple[int, ...]
    attempt: int
    workers: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FreeSlot:
    """The slot of ``worker`` no longer runs anything of the job."""

    worker: str


@dataclasses.dataclass(frozen=True)
class Enqueue:
    """Queue the job for a gang: at the back, or first in line (a restart)."""

    front: bool = False


@dataclasses.dataclass(frozen=True)
class Dequeue:
    pass


@dataclasses.dataclass(frozen=True)
class StartTimer:
    """Feed ``event`` back to the job after ``delay`` seconds."""

    delay: float
    event: GraceExpired | StopOverdue | HoldExpired


@dataclasses.dataclass(frozen=True)
class TruncateHistory:
    """Forget the metric rows of steps at or after ``step`` (they will be replayed)."""

    step: int


@dataclasses.dataclass(frozen=True)
class CloseBoard:
    """Flush and close the job's TensorBoard writers."""


@dataclasses.dataclass(frozen=True)
class Record:
    """Keep a durable event of the job (``job.events()``): ``kind`` (restarted, failed,
    resized, preempted, reclaimed), a line for people, and structured ``data``."""

    kind: str
    message: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CollectStacks:
    """Ask every rank's worker where its training thread is, and keep the answers."""


@dataclasses.dataclass(frozen=True)
class EndRank:
    """End a rank that will never stop by itself: kill its process on ``worker`` (the
    worker stays; if it does not answer, it is restarted through its nanny)."""

    worker: str
    attempt: int
    reason: str


@dataclasses.dataclass(frozen=True)
class Diagnosed:
    """Keep, log and publish a diagnosis (:class:`~.diagnosis.Diagnosis` as a dict): the
    job's newest, a durable event of kind ``diagnosis``, a line of its log."""

    diagnosis: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Release:
    """The job is over and nothing of it runs: store ``result``, wake waiters, forget it."""

    result: bytes | None


Action = (
    Journal
    | Publish
    | StartGang
    | SendControl
    | FreeSlot
    | Enqueue
    | Dequeue
    | StartTimer
    | TruncateHistory
    | CloseBoard
    | Record
    | CollectStacks
    | EndRank
    | Release
    | Diagnosed
)


def status_message(status: str, attempt: int) -> StatusMessage:
    return {"kind": "status", "status": status, "attempt": attempt}


def error_record(
    rank: int | None,
    exc_type: str,
    message: str,
    traceback: str = "",
    facts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A job's error record (``JobFailedError.from_record`` reads it); ``facts`` of a lost
    worker (how its process ended) are what its diagnosis rests on."""
    err = {"rank": rank, "type": exc_type, "message": message, "traceback": traceback}
    return {**err, "facts": {"worker": facts}} if facts else err
