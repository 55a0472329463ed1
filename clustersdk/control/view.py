"""What a rule of a job's life may know of the job, and the only ways it may change it.

:class:`~.lifecycle.Lifecycle` composes one object per concern (faults, hangs,
holds, breakpoints, anomalies, live requests, profiles, sharing; see
:mod:`.lifecycle`). Each keeps its own state and handles its own events, given
the job as a :class:`JobView`: the job's facts, read-only, and ten commands.
The lifecycle implements them and is the only writer of the job's status, its
spec, its gang and its control words, so a rule never writes another object's
fields and every change of state goes through :meth:`JobView.transition`.

The commands change the job at once (a rule may read the new state right
after), and queue the actions the control plane will carry out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..protocol import ExitStatus, WireSpec, Word
from ..status import JobStatus
from . import events as ev


class JobView(Protocol):
    """One job, as its rules see it."""

    # --- facts ---------------------------------------------------------------------------
    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> WireSpec: ...

    @property
    def status(self) -> JobStatus: ...

    @property
    def attempt(self) -> int:
        """The gang start under way (events of an earlier one never reach a rule)."""

    @property
    def world_size(self) -> int: ...

    @property
    def now(self) -> float:
        """The time of the event being handled."""

    @property
    def ranks(self) -> tuple[ev.RankSlot, ...]:
        """Where each rank of the current gang runs (empty before a gang starts)."""

    @property
    def exited(self) -> Mapping[int, ExitStatus]:
        """The ranks of the current gang that are out, and how they left."""

    @property
    def words(self) -> Sequence[int]:
        """The control vector the ranks were last asked to follow (index by :class:`Word`)."""

    @property
    def checkpoint(self) -> str | None:
        """The newest committed checkpoint."""

    @property
    def checkpoint_step(self) -> int | None: ...

    @property
    def resume_point(self) -> str | None:
        """What a new gang continues from: the newest checkpoint, else the spec's resume."""

    @property
    def held_ranks(self) -> list[int]:
        """The ranks held under ``on_error="hold"`` (see :mod:`.holds`)."""

    # --- commands ------------------------------------------------------------------------
    def transition(self, status: JobStatus, **fields: Any) -> None:
        """Enter ``status`` (an illegal transition raises), journal ``fields`` with it."""

    def ask(self, word: Word, value: int) -> None:
        """Raise a control word to ``value`` and send the vector to every rank still out."""

    def pause(self) -> None:
        """Ask every rank to pause at its next step boundary (unless one is asked already)."""

    def emit(self, *actions: ev.Action) -> None:
        """Queue actions for the control plane (journal, publish, timers...)."""

    def record(self, kind: str, message: str, **data: Any) -> None:
        """A durable event of the job (``job.events()``)."""

    def fail(self, err: dict[str, Any]) -> None:
        """The job FAILS with error record ``err``; the ranks still out are told to stop."""

    def lose(
        self, rank: int | None, exc_type: str, message: str, facts: dict[str, Any] | None = None
    ) -> None:
        """A rank's worker is gone (or the gang must go): restart or fail, by the rules."""

    def end_ranks(self, ranks: Sequence[int], status: ExitStatus) -> None:
        """Count ``ranks`` as out (their slots freed) though they never said so."""

    def replace_spec(self, **changes: Any) -> None:
        """The job's spec with ``changes`` (journaled)."""

    def requeue(
        self,
        reason: str,
        *,
        front: bool = False,
        paused: bool = False,
        world_size: int | None = None,
    ) -> None:
        """Every rank is out: a new gang start, QUEUED to continue from :attr:`resume_point`
        (at ``world_size`` when given; paused at its first step with ``paused``)."""
