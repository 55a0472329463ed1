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
MAX_CHECK_EVERY = 1000


class JobSuspended(BaseException):
    """Raised out of ``ctx.loop`` once a suspend checkpoint is committed.

    A ``BaseException``, like ``GeneratorExit``: a user's ``except Exception``
    must not swallow it, and no code after the loop may run as if it had ended.
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

    The all-reduce is synchronous (a request is acted on at the next check)
    and spaced so that checks come about every ``CHECK_INTERVAL`` seconds:
    every step when steps are slow, every N steps when they are fast, where a
    collective per step would cost several percent of throughput. N follows
    the slowest rank's step time, carried in the same all-reduce, so every
    rank computes the same next check step. ``every_step``: a check at every
    step (``on_nan`` other than "report": a rank that sees a non-finite loss
    raises a word that every rank must act on at the very next boundary).
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

    def due(self, step: int) -> bool:
        return step >= self.next_step

    def agree(self, step: int) -> list[int]:
        now = time.perf_counter()
        elapsed_us = int(1e6 * (now - self.since) / max(step - self.since_step, 1))
        words = self.control.words()
        if self.world_size > 1:
            import torch
            import torch.distributed as dist

            msg = torch.tensor([*words, elapsed_us], dtype=torch.int64)
            dist.all_reduce(msg, op=dist.ReduceOp.MAX, group=self.group)
            *words, step_us = msg.tolist()
        else:
            step_us = elapsed_us
        every = min(max(int(CHECK_INTERVAL * 1e6 / max(step_us, 1)), 1), MAX_CHECK_EVERY)
        every = 1 if self.every_step else every
        self.next_step = step + (1 if step == self.since_step else every)
        self.since, self.since_step = time.perf_counter(), step
        return words
