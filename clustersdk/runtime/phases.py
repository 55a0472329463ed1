"""Where each step's time goes, measured on every step at the cost of a few clock reads.

``ctx.loop`` reads ``time.perf_counter`` at the points it already passes
(the step boundary, around the loader's ``next()``, around the ``yield``) and
two process-wide optimizer hooks add the time spent in ``optimizer.step()``.
No device synchronisation, no collective. The phases of one step, in seconds:

``data``
    blocked in the loader's ``next()`` (a prefetching loader: only the wait).
``compute``
    the training function's body between two ``ctx.loop`` steps (forward,
    backward, and what else it does: logging, an evaluation pass), less
    ``optimizer`` and ``checkpoint``.
    Under DDP the gradient all-reduce overlaps backward inside autograd and
    is part of this phase: splitting it out would need a Python
    communication hook in place of DDP's C++ one, which costs time on every
    bucket and changes the reduction DDP runs. The profiler's summary
    (``job.profile``) separates communication from compute.
``optimizer``
    inside ``optimizer.step()`` of any optimizer the rank steps.
``checkpoint``
    the rank blocked by checkpoint saves (the staging of an async save, all
    of a blocking one, the wait for the previous save).
``sync``
    the control agreement at step boundaries (a tiny all-reduce every few
    steps): the time this rank waited for the slowest one there, so a
    straggler's peers show it here. Time paused is not counted.
``total``
    the whole step, boundary to boundary, less time paused. The other
    phases add up to at most this.

On a GPU the clock is the host's: kernels are queued asynchronously, so GPU
work shows where the host waits for it (a ``.item()``, a collective, a
synchronising copy), not necessarily in the phase that queued it.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

_local = threading.local()  # the PhaseClock of the rank whose thread this is
_hooks_installed = False
_install_lock = threading.Lock()


class PhaseClock:
    """One rank's phase timer; :meth:`rows` hands over the finished steps' rows.

    >>> clock = PhaseClock()
    >>> clock.begin_step(); clock.before_data(); clock.after_data()
    >>> clock.resumed(step=0)
    >>> [(int(row[0]), len(row)) for row in clock.rows()]
    [(0, 7)]
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.optimizer = 0.0  # running totals, read at the phase marks
        self.checkpoint = 0.0
        self.paused = 0.0
        self._opt_t0 = 0.0
        self._opt_depth = 0  # an optimizer that steps others inside: only the outer counts
        self._rows: collections.deque = collections.deque()  # appends and pops are atomic
        self._start = self._data0 = self._data1 = 0.0
        self._marks = (0.0, 0.0, 0.0)  # optimizer, checkpoint, paused at the step's start
        self._ckpt_boundary = 0.0
        self._paused_boundary = 0.0
        self._open = False
        if enabled:
            _install_hooks()

    # the marks ctx.loop sets ---------------------------------------------------------------
    def bind(self) -> None:
        """Count the optimizer steps of the calling thread (the rank's) for this clock."""
        _local.clock = self if self.enabled else None

    def begin_step(self) -> None:
        if not self.enabled:
            return  # no row: resumed() finds no open step
        self._opt_depth = 0  # an optimizer step that raised last step never came back
        self._start = time.perf_counter()
        self._marks = (self.optimizer, self.checkpoint, self.paused)
        self._open = True

    def before_data(self) -> None:
        self._data0 = time.perf_counter()
        self._ckpt_boundary = self.checkpoint - self._marks[1]
        self._paused_boundary = self.paused - self._marks[2]

    def after_data(self) -> None:
        self._data1 = time.perf_counter()

    def resumed(self, step: int) -> None:
        """The training function asks for the next step: ``step`` is over."""
        if not self._open:
            return
        self._open = False
        end = time.perf_counter()
        opt0, ckpt0, paused0 = self._marks
        paused = self.paused - paused0
        optimizer = self.optimizer - opt0
        ckpt_body = self.checkpoint - ckpt0 - self._ckpt_boundary
        data = self._data1 - self._data0
        body = end - self._data1 - (paused - self._paused_boundary)
        sync = self._data0 - self._start - self._paused_boundary - self._ckpt_boundary
        row = [
            float(step),
            data,
            max(body - optimizer - ckpt_body, 0.0),
            optimizer,
            self._ckpt_boundary + ckpt_body,
            max(sync, 0.0),
            end - self._start - paused,
        ]
        self._rows.append(row)

    def abandon(self) -> None:
        """The loop left in the middle of a step: it has no row."""
        self._open = False

    # what ships --------------------------------------------------------------------------
    def rows(self) -> list[list[float]]:
        """``[step, *PHASES]`` (:data:`clustersdk.protocol.PHASES`) of the steps finished
        since the last call."""
        rows = self._rows
        return [rows.popleft() for _ in range(len(rows))]


class Timed:
    """``with Timed(clock, "checkpoint"):`` adds the block's wall time to that total."""

    __slots__ = ("clock", "name", "t0")

    def __init__(self, clock: PhaseClock | None, name: str):
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        clock = self.clock
        if clock is not None:
            setattr(clock, self.name, getattr(clock, self.name) + time.perf_counter() - self.t0)


# optimizer.step(), wherever it is called ------------------------------------------------------
def _pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    clock = getattr(_local, "clock", None)
    if clock is not None:
        if not clock._opt_depth:
            clock._opt_t0 = time.perf_counter()
        clock._opt_depth += 1


def _post(optimizer: Any, args: Any, kwargs: Any) -> None:
    clock = getattr(_local, "clock", None)
    if clock is not None and clock._opt_depth:
        clock._opt_depth -= 1
        if not clock._opt_depth:
            clock.optimizer += time.perf_counter() - clock._opt_t0


def _install_hooks() -> None:
    """Process-wide optimizer hooks, once; they do nothing on threads without a clock."""
    global _hooks_installed
    with _install_lock:
        if _hooks_installed:
            return
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        register_optimizer_step_pre_hook(_pre)
        register_optimizer_step_post_hook(_post)
        _hooks_installed = True
