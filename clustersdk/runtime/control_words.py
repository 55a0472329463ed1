"""Control words: how every rank learns, at the same step, to stop, pause or save.

The control plane sends each rank the job's control vector (its entries are
:class:`clustersdk.protocol.Word`); a rank merges what it receives
(element-wise max, so that order of arrival does not matter) and at step
boundaries all ranks agree on the vector with one tiny all-reduce (MAX).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from ..protocol import no_words

CHECK_INTERVAL = 0.04  # seconds between checks in a loop of fast steps
OVERLAP_STEP = 0.1  # seconds: steps up to this long overlap their checks (see ControlCheck)
MAX_CHECK_EVERY = 1000


class JobSuspended(BaseException):
    """Raised out of ``ctx.loop`` once a suspend checkpoint is committed.

    A ``BaseException``, like ``GeneratorExit``: a user's ``except Exception``
    must not swallow it, and no code after the loop may run as if it had ended.
    """


class JobStopped(BaseException):
    """Raised out of ``ctx.loop`` by a stop agreed before the rank's first step (a job
    stopped while QUEUED or STARTING): the code after the loop expects at least one step
    (its loss, its metrics), so the rank leaves the training function there, STOPPED.
    A later stop ends the loop, and the code after it runs.
    """


class Control:
    """One rank's copy of the control vector, written by the worker's event loop."""

    def __init__(self) -> None:
        self._words = no_words()
        self._changed = threading.Condition()

    def merge(self, words: Sequence[int]) -> None:
        with self._changed:
            self._words = [max(a, int(b)) for a, b in zip(self._words, words)]
            self._changed.notify_all()

    def words(self) -> list[int]:
        with self._changed:
            return list(self._words)

    def wait_beyond(self, agreed: Sequence[int], timeout: float | None = None) -> bool:
        """Block until this rank knows something the last agreement did not."""
        with self._changed:
            return self._changed.wait_for(
                lambda: any(a > b for a, b in zip(self._words, agreed)), timeout
            )


class ControlCheck:
    """When and how the ranks agree on the control vector.

    Checks are spaced so that they come about every ``CHECK_INTERVAL``
    seconds: every step when steps are slow, every N steps when they are
    fast, where a collective per step would cost several percent of
    throughput. N follows the slowest rank's step time, carried in the same
    all-reduce, so every rank computes the same next check step.

    :meth:`agree` is synchronous: what any rank knew when it was called is
    acted on at once (a paused rank waits in it; slow steps check so). The
    training loop's regular checks go through :meth:`boundary`, which with
    steps of up to ``OVERLAP_STEP`` overlaps the all-reduce with the steps
    that follow: a check starts the next all-reduce and returns what the
    previous check started, so no rank waits on it (a request is acted on
    one check later: after ``CHECK_INTERVAL`` s, or one step of at most
    ``OVERLAP_STEP`` s). A synchronous check is a barrier: it costs every
    rank the slowest one's lateness and a round trip at each boundary, which
    the next training collective would otherwise absorb. Every rank still
    acts on the same vector at the same step, and nothing is lost: words only
    grow (element-wise max), so an older vector is a prefix of a newer one.
    ``every_step``: a synchronous check at every step (``on_nan`` other than
    "report": a rank that sees a non-finite loss raises a word that every rank
    must act on at the very next boundary).
    """

    def __init__(
        self, control: Control, step: int, world_size: int, group: Any, every_step: bool = False
    ):
        self.control = control
        self.world_size = world_size
        self.group = group
        self.next_step = step
        self.since = time.perf_counter()
        self.since_step = step
        self.every_step = every_step
        self.every = 1  # steps between checks, as last agreed (the same on every rank)
        self.overlap = False  # as last agreed: steps are short enough to overlap checks
        self._pending: tuple[Any, Any] | None = None  # (work, tensor) of an overlapped check

    def due(self, step: int) -> bool:
        return step >= self.next_step

    def agree(self, step: int) -> list[int]:
        """The vector every rank acts on at this check, agreed now."""
        self.settle()
        if self.world_size == 1:
            return self._agreed(step, self.control.words(), self._elapsed_us(step))
        work, msg = self._start(step)
        work.wait()
        *words, step_us = msg.tolist()
        return self._agreed(step, words, step_us)

    def boundary(self, step: int) -> list[int]:
        """The loop's regular check: overlapped when steps are fast (see the class)."""
        if self.every_step or not self.overlap or self.world_size == 1:
            return self.agree(step)
        previous = self._pending or self._start(step)  # the first: this check's own
        self._pending = self._start(step)  # what the next check acts on
        previous[0].wait()
        *words, step_us = previous[1].tolist()
        return self._agreed(step, words, step_us)

    def settle(self) -> None:
        """Wait for an overlapped all-reduce still on its way (every rank started it at
        the same check, so it completes); before the group is used otherwise or left."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[0].wait()

    def abandon(self) -> None:
        """Leave an overlapped all-reduce unwaited (the rank is failing: a peer may be gone)."""
        self._pending = None

    def _elapsed_us(self, step: int) -> int:
        return int(1e6 * (time.perf_counter() - self.since) / max(step - self.since_step, 1))

    def _start(self, step: int) -> tuple[Any, Any]:
        import torch
        import torch.distributed as dist

        msg = torch.tensor([*self.control.words(), self._elapsed_us(step)], dtype=torch.int64)
        work = dist.all_reduce(msg, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return work, msg

    def _agreed(self, step: int, words: list[int], step_us: int) -> list[int]:
        every = min(max(int(CHECK_INTERVAL * 1e6 / max(step_us, 1)), 1), MAX_CHECK_EVERY)
        self.every = 1 if self.every_step else every
        self.overlap = step_us <= OVERLAP_STEP * 1e6  # also whenever every > 1
        self.next_step = step + (1 if step == self.since_step else self.every)
        self.since, self.since_step = time.perf_counter(), step
        return words
