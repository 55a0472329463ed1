"""The job lifecycle: one enum and the table of allowed transitions.

::

    QUEUED   ──> STARTING | STOPPED | FAILED
    STARTING ──> RUNNING | STOPPING | FINISHED | FAILED
    RUNNING  ──> STOPPING | FINISHED | FAILED
    STOPPING ──> STOPPED | FINISHED | FAILED

A job is *terminal* once FINISHED, FAILED or STOPPED; nothing leaves a terminal
state.
"""

from __future__ import annotations

import enum

from .errors import InvalidTransitionError


class JobStatus(str, enum.Enum):
    QUEUED = "queued"          # waiting for a gang of free slots
    STARTING = "starting"      # slots allocated, process group coming up
    RUNNING = "running"        # every rank is inside the user's function
    STOPPING = "stopping"      # stop asked; ranks leave at the next step boundary
    FINISHED = "finished"      # every rank returned
    FAILED = "failed"          # a rank raised or its worker was lost
    STOPPED = "stopped"        # stopped on request

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    def __str__(self) -> str:
        return self.name


TERMINAL = frozenset({JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED})

TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.STARTING, JobStatus.STOPPED, JobStatus.FAILED}),
    JobStatus.STARTING: frozenset(
        {JobStatus.RUNNING, JobStatus.STOPPING, JobStatus.FAILED, JobStatus.FINISHED}
    ),
    JobStatus.RUNNING: frozenset({JobStatus.STOPPING, JobStatus.FINISHED, JobStatus.FAILED}),
    JobStatus.STOPPING: frozenset({JobStatus.STOPPED, JobStatus.FAILED, JobStatus.FINISHED}),
    JobStatus.FINISHED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.STOPPED: frozenset(),
}


def check_transition(job: str, current: JobStatus, new: JobStatus) -> None:
    """Raise :class:`InvalidTransitionError` unless ``current -> new`` is allowed."""
    if new not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.name for s in TRANSITIONS[current])) or "nothing (terminal)"
        raise InvalidTransitionError(
            f"job {job!r} is {current.name}; it cannot become {new.name} (allowed from "
            f"{current.name}: {allowed})"
        )
