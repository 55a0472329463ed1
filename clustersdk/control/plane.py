"""What the control plane's parts may read and do: :class:`Plane`, and a job's :class:`Run`.

The plane (:class:`~.plugin.ControlPlane`, a Dask ``SchedulerPlugin``) is a thin
shell: it owns the slots, the jobs and Dask. Its parts get this narrow interface,
never the plugin itself, so none of them reaches into another's state:

- :class:`~.requests.Requests`: the handlers kernels and the server extension call;
- :class:`~.evidence.Evidence`: what lost workers and rows say, for diagnoses;
- :class:`~.watchdog.Watchdog`: hangs, and every rank's stack;
- :class:`~.placement.Placement`: the scheduling policy's bookkeeping (it gets no
  :class:`Plane` at all: it returns the events its decisions mean);
- :func:`~.restore.adopt`: the jobs an earlier scheduler left.

Everything here runs on the scheduler's event loop, so nothing needs a lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from ..protocol import Message, WireSpec, WorkerOp
from . import events as ev
from .goodput import Goodput
from .hangs import Watch
from .journal import Journal
from .lifecycle import Lifecycle
from .scheduling import Slot


@dataclasses.dataclass
class Run:
    """A job that isn't released yet: its lifecycle and what the plane keeps beside it."""

    machine: Lifecycle
    payload: bytes
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    changed: asyncio.Condition = dataclasses.field(default_factory=asyncio.Condition)
    board: Any = None  # TensorBoard writers, with tensorboard_dir
    step: int | None = None  # the furthest step a rank logged (what events are stamped with)
    watch: Watch = dataclasses.field(default_factory=lambda: Watch(time.time()))
    losses: Any = None  # each step's mean loss over the ranks (signals.StepMeans) ...
    detector: Any = None  # ... and its SpikeDetector, made on the first rows
    digest: Any = None  # per-step summaries; a big job's bands for kernels (digest.Digest)
    goodput: Goodput = dataclasses.field(default_factory=Goodput)  # where its time went

    @property
    def id(self) -> str:
        return self.machine.id

    def close_board(self) -> None:
        if self.board is not None:
            self.board.close()  # flushed before wait() returns
            self.board = None


class Plane(Protocol):
    """The control plane, as its parts see it."""

    # --- what it holds ----------------------------------------------------------------
    @property
    def id(self) -> str:
        """The Dask scheduler's id (the journal keeps each scheduler's jobs apart)."""

    @property
    def address(self) -> str: ...

    @property
    def state_dir(self) -> str: ...

    @property
    def journal(self) -> Journal: ...

    @property
    def runs(self) -> Mapping[str, Run]:
        """The jobs not released yet, by id."""

    @property
    def slots(self) -> Mapping[str, Slot]:
        """The GPU (or CPU) slots the worker agents reported, by worker address."""

    @property
    def busy(self) -> Mapping[str, str]:
        """Worker address -> the job whose rank runs there."""

    @property
    def capacity(self) -> int:
        """The most slots an autoscaling cluster can grow to (0: what it has)."""

    def can_hold(self) -> tuple[int, str]:
        """The most slots the cluster can hold, and how that reads: the slots it has,
        with those whose workers left a moment ago (a nanny restarts them), or what an
        autoscaling cluster grows to."""

    # --- what it does --------------------------------------------------------------------
    def feed(self, run: Run, event: ev.Event) -> list[ev.Action]:
        """Give ``event`` to the job's lifecycle and carry out the actions it returns."""

    def follow(
        self,
        spec: WireSpec,
        payload: bytes,
        seq: int | None = None,
        goodput: dict[str, Any] | None = None,
        **state: Any,
    ) -> Run:
        """A job the plane follows from now on (queued if its ``state`` says QUEUED)."""

    def schedule(self) -> None:
        """Let the scheduling policy decide again."""

    def publish(self, job: str, message: Message) -> None:
        """Send ``message`` to the job's topic (every subscribed kernel sees it)."""

    def call_worker(self, worker: str, operation: WorkerOp, **kwargs: Any) -> Awaitable[Any]:
        """Call ``operation`` on the agent of ``worker``."""

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None: ...

    def until(
        self, run: Run, predicate: Callable[[], bool], timeout: float | None
    ) -> Awaitable[bool]:
        """Wait until ``predicate()`` holds (checked after every event of the job)."""

    def drained_why(self, worker: str) -> str | None:
        """Why ``worker`` takes no new ranks (its host or itself drained), or None."""

    def worker_pid(self, worker: str) -> int | None:
        """The process id Dask knows for ``worker``."""
