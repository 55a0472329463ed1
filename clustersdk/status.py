"""The job lifecycle: one enum and the table of allowed transitions.

::

    QUEUED     ──> STARTING | SUSPENDED (suspend: held out of the queue) | STOPPED | FAILED
    STARTING   ──> RUNNING | HELD | RESTARTING | SUSPENDING | STOPPING | FINISHED | FAILED
    RUNNING    ──> PAUSED | HUNG | HELD | RESTARTING | SUSPENDING | STOPPING | FINISHED | FAILED
    HUNG       ──> RUNNING (a step finished after all) | HELD | RESTARTING | STOPPING | FINISHED
                   | FAILED
    PAUSED     ──> RUNNING | HELD | RESTARTING | SUSPENDING | STOPPING | FINISHED | FAILED
    HELD       ──> STOPPING (job.stop(); then FAILED) | RESTARTING (job.restart())
                   | FAILED (the hold timed out)
    RESTARTING ──> QUEUED (again, from the newest checkpoint) | STOPPING | FAILED
    SUSPENDING ──> SUSPENDED | QUEUED (preempted) | STOPPING | FINISHED | FAILED
    SUSPENDED  ──> QUEUED (resume) | STOPPED
    STOPPING   ──> STOPPED | QUEUED (preempted) | FINISHED | FAILED

PAUSED holds the job's slots and process group; SUSPENDED holds a checkpoint
and no slots. HUNG: no rank has finished a step for the job's ``hang_timeout``
(see :mod:`clustersdk.control.hangs`). HELD: a rank raised under ``on_error="hold"``
and waits, alive, with its slots and the failing frames, until a stop, a restart from
the checkpoint or ``hold_timeout`` (see :mod:`clustersdk.control.holds`). RESTARTING
follows the loss of a worker within the job's restart budget (``max_restarts``): the
other ranks wind down, then the job queues again.
A job preempted for a higher-priority one (see :mod:`clustersdk.control.scheduling`)
checkpoints and leaves (SUSPENDING), or without a checkpoint directory is
stopped (STOPPING), and then queues again by itself. A job is *terminal* once
FINISHED, FAILED or STOPPED; nothing leaves a terminal state.

A job that is QUEUED or STARTING (:data:`EARLY`) has no rank at a step boundary yet: a
pause, checkpoint, ``job.run`` or ``job.update`` asked then is kept and carried out at
its first step boundary (see :mod:`clustersdk.control.lifecycle`).
"""

from __future__ import annotations

import enum

from .errors import InvalidTransitionError


class JobStatus(str, enum.Enum):
    QUEUED = "queued"  # waiting for a gang of free slots
    STARTING = "starting"  # slots allocated, process group coming up
    RUNNING = "running"  # every rank is inside the user's function
    PAUSED = "paused"  # every rank waits at the same step boundary, slots held
    HUNG = "hung"  # no rank has finished a step for hang_timeout
    HELD = "held"  # a rank raised under on_error="hold": kept alive for a post-mortem
    RESTARTING = "restarting"  # a worker was lost: the other ranks wind down, then it queues again
    SUSPENDING = "suspending"  # checkpointing, then giving the slots back
    SUSPENDED = "suspended"  # checkpointed, no slots; resume() queues it again
    STOPPING = "stopping"  # stop asked; ranks leave at the next step boundary
    FINISHED = "finished"  # every rank returned
    FAILED = "failed"  # a rank raised or its worker was lost
    STOPPED = "stopped"  # stopped on request

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    def __str__(self) -> str:
        return self.name


TERMINAL = frozenset({JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED})
#: No rank has reached a step boundary: requests wait for the first one.
EARLY = frozenset({JobStatus.QUEUED, JobStatus.STARTING})

_S = JobStatus
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    _S.QUEUED: frozenset({_S.STARTING, _S.SUSPENDED, _S.STOPPED, _S.FAILED}),
    _S.STARTING: frozenset(
        {_S.RUNNING, _S.RESTARTING, _S.SUSPENDING, _S.STOPPING, _S.FINISHED, _S.FAILED, _S.HELD}
    ),
    _S.RUNNING: frozenset(
        {
            _S.PAUSED,
            _S.HUNG,
            _S.RESTARTING,
            _S.SUSPENDING,
            _S.STOPPING,
            _S.FINISHED,
            _S.FAILED,
            _S.HELD,
        }
    ),
    _S.HUNG: frozenset({_S.RUNNING, _S.RESTARTING, _S.STOPPING, _S.FINISHED, _S.FAILED, _S.HELD}),
    _S.PAUSED: frozenset(
        {_S.RUNNING, _S.RESTARTING, _S.SUSPENDING, _S.STOPPING, _S.FINISHED, _S.FAILED, _S.HELD}
    ),
    _S.HELD: frozenset({_S.STOPPING, _S.RESTARTING, _S.FAILED}),
    _S.RESTARTING: frozenset({_S.QUEUED, _S.STOPPING, _S.FAILED}),
    _S.SUSPENDING: frozenset({_S.SUSPENDED, _S.QUEUED, _S.STOPPING, _S.FINISHED, _S.FAILED}),
    _S.SUSPENDED: frozenset({_S.QUEUED, _S.STOPPED}),
    _S.STOPPING: frozenset({_S.STOPPED, _S.QUEUED, _S.FINISHED, _S.FAILED}),
    _S.FINISHED: frozenset(),
    _S.FAILED: frozenset(),
    _S.STOPPED: frozenset(),
}


def check_transition(job: str, current: JobStatus, new: JobStatus) -> None:
    """Raise :class:`InvalidTransitionError` unless ``current -> new`` is allowed."""
    if new not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.name for s in TRANSITIONS[current])) or "nothing (terminal)"
        raise InvalidTransitionError(
            f"job {job!r} is {current.name}; it cannot become {new.name} (allowed from "
            f"{current.name}: {allowed})"
        )
