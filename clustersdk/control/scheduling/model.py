"""What the scheduler is told (slots, requests, holdings) and what it answers (a Decision)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

from ...errors import SpecError
from .config import PolicyConfig

HoldStatus = Literal["running", "paused", "suspending", "stopping"]
HOLD_STATUSES = ("running", "paused", "suspending", "stopping")
ACTIVE = ("running", "paused")  # may become a victim; the others are already leaving
How = Literal["suspend", "stop"]
Key = tuple[int, int, str]  # Request.key: (-priority, seq, id), queue order


@dataclasses.dataclass(frozen=True)
class Slot:
    """One GPU (or one CPU slot) owned by one Dask worker."""

    worker: str  # the worker's address
    host: str
    kind: str  # "cuda" or "cpu"
    index: int  # device index on the host (-1 for a CPU slot)
    uuid: str = ""  # the physical GPU's UUID; two slots with one UUID share a GPU
    cpus: str = ""  # the CPU cores its worker is bound to (a CPU list); "" not bound


@dataclasses.dataclass(frozen=True)
class Request:
    """A job as the scheduler sees it: who, where, how big, how important.

    ``priority`` is an int (classes resolved at launch); ``seq`` is the submission
    order, kept when a preempted job goes back in the queue; ``time_limit`` is the
    user's estimate in seconds (what backfill plans with); ``min_world_size`` lets the
    job start, or resume, on fewer ranks.
    """

    id: str
    world_size: int
    owner: str = ""
    queue: str = "default"
    priority: int = 50
    seq: int = 0
    submitted_at: float = 0.0
    min_world_size: int | None = None
    preemptible: bool = True
    time_limit: float | None = None
    has_checkpoint_dir: bool = False
    name: str = ""  # what reasons call it (the id when empty)

    @property
    def label(self) -> str:
        return self.name or self.id

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise SpecError(f"world_size must be at least 1, got {self.world_size}")
        low = self.min_world_size
        if low is not None and not 1 <= low <= self.world_size:
            raise SpecError(f"min_world_size must be in 1..{self.world_size}, got {low}")

    @property
    def smallest(self) -> int:
        """The fewest ranks the job may run on."""
        return self.min_world_size or self.world_size

    @property
    def key(self) -> Key:
        """Queue order: higher priority first, then submission order."""
        return (-self.priority, self.seq, self.id)


@dataclasses.dataclass
class Holding:
    """A job that holds slots, with what tells how much work preempting it would lose.

    ``last_progress`` is the time of its newest finished step (None: none yet),
    ``checkpoint_at`` and ``steps_since_checkpoint`` describe its newest committed
    checkpoint (None: none yet), ``state_bytes`` what a checkpoint of it writes.
    ``preempted_for``/``interrupted_at``/``requeue`` are set once it was asked to
    leave: for which job, when, and whether it goes back in the queue afterwards.
    """

    request: Request
    slots: tuple[Slot, ...]
    status: HoldStatus = "running"
    started_at: float = 0.0
    last_progress: float | None = None
    paused_since: float | None = None
    step: int = 0
    checkpoint_at: float | None = None
    steps_since_checkpoint: int | None = None
    state_bytes: int | None = None
    preempted_for: str | None = None
    interrupted_at: float | None = None
    requeue: bool = False

    def __post_init__(self) -> None:
        if self.status not in HOLD_STATUSES:
            raise SpecError(f"status must be one of {HOLD_STATUSES}, got {self.status!r}")
        self.slots = tuple(self.slots)

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def size(self) -> int:
        return len(self.slots)

    @property
    def ends_at(self) -> float | None:
        """When its time_limit says it ends (None: no estimate)."""
        limit = self.request.time_limit
        return None if limit is None else self.started_at + limit


@dataclasses.dataclass
class ClusterState:
    """Everything one decision needs: the inventory, the queue, who holds what, the rules.

    ``slots`` is every slot of the cluster; those no holding has are free. When a
    victim is gone, the slots it left are ``claims`` of the job it left for, until that
    job starts or no longer waits for them (the Scheduler keeps them so).
    """

    slots: Sequence[Slot]
    queued: Sequence[Request]
    holdings: Sequence[Holding]
    config: PolicyConfig
    # job -> workers: slots its victims freed that it is owed (nobody else may take them)
    claims: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Start:
    """Start ``job`` on these slots, rank i on ``slots[i]`` (fewer than asked: elastic)."""

    job: str
    slots: tuple[Slot, ...]

    @property
    def world_size(self) -> int:
        return len(self.slots)


@dataclasses.dataclass(frozen=True)
class Preempt:
    """Ask ``job`` to leave its slots: ``suspend`` (checkpoint at the next step boundary,
    then free them) or ``stop``. ``for_job`` is the job that gets them (None for an idle
    reclaim); ``reason`` is the line its owner reads."""

    job: str
    how: How
    for_job: str | None
    reason: str
    overdue: bool = False  # a suspend that outlived the preemption grace: stop it now


@dataclasses.dataclass(frozen=True)
class Wait:
    """Why a queued job waits: ``kind`` is ``limit`` (a quota or cap), ``head`` (first
    in its queue, slots reserved), ``behind`` (behind its queue's head) or ``preempting``
    (victims are leaving for it). ``estimated_start`` is an absolute time, when known
    (in the past when a running job outlived its time_limit: any moment now);
    ``blocked_by`` the job it waits behind. Jobs that wait alike share one Wait."""

    kind: str
    reason: str
    estimated_start: float | None = None
    blocked_by: str | None = None


@dataclasses.dataclass(frozen=True)
class Reservation:
    """Slots held for a waiting job: ``slots`` are free now and nobody else may take
    them, unless it ends before ``start_by`` (backfill) or reclaims its queue's
    guarantee from a borrowing reservation."""

    job: str
    slots: tuple[Slot, ...]
    start_by: float | None


@dataclasses.dataclass
class Decision:
    """What to do now, and why every queued job that keeps waiting waits.

    ``waiting`` maps each of them to its :class:`Wait` (a lazy mapping: the waits of
    jobs the pass could skip are worked out when read; equal waits are one object,
    so ``is not`` against an earlier one tells a change).
    """

    start: list[Start] = dataclasses.field(default_factory=list)
    preempt: list[Preempt] = dataclasses.field(default_factory=list)
    reclaim: list[Preempt] = dataclasses.field(default_factory=list)
    waiting: Mapping[str, Wait] = dataclasses.field(default_factory=dict)
    reservations: list[Reservation] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        """True when there is something to carry out (waits are only news)."""
        return bool(self.start or self.preempt or self.reclaim)
