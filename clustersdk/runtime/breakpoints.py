"""``ctx.breakpoint()``: the whole job pauses, and a pdb session on the chosen rank talks
to the notebook (a part of :class:`~.context.TrainContext`).

Off unless the job was launched with ``debug=True``: then the call is one attribute
check and nothing else. With it, every rank counts its calls (``k``). A chosen rank
reports ``BREAK`` (the control plane pauses the job) and runs a :class:`RemotePdb` on
the caller's frame: its output goes out as ``CONSOLE`` reports, through the control
plane to the job's topic, and its input comes from the kernel through the control
plane and this worker's agent into a queue that the session's stdin reads. The
other ranks wait inside their call, phase ``paused`` (the hang watchdog does not
count it), until the control word ``RELEASE`` reaches ``k`` (the session ended:
``continue``, ``quit``, or ``job.resume()``), or a stop or suspend is asked (they
then go on to their next step boundary and leave there, as from a pause).

In the session, ``p``, ``pp``, ``w``, ``u``/``d``, ``l``, ``!stmt`` work as in pdb;
``n`` and ``s`` step through this rank's own code, and a step into a collective
(the next ``ctx.loop`` step, DDP's backward) waits there for the peers, which wait
at the breakpoint: ``c`` first. ``c`` with pdb breakpoints set (``b``) keeps
tracing this rank alone; ``q`` leaves the debugger (its breakpoints cleared) and
the job runs on.
"""

from __future__ import annotations

import pdb
import queue
import sys
from typing import Any, Iterable

from ..errors import SpecError
from ..protocol import RankEvent, Word
from .holds import serve

POLL_S = 0.2  # how often a waiting session looks at the control words (resume, stop)


class Debugging:
    """``ctx.breakpoint()``, ``ctx.error`` and the held rank's hook (mixed into
    :class:`~.context.TrainContext`, which provides the attributes used here)."""

    _held: BaseException | None = None  # what the rank is held for (on_error="hold")
    _breaks = 0                         # ctx.breakpoint() calls so far (debug=True)
    _console_input: queue.Queue | None = None

    @property
    def error(self) -> BaseException | None:
        """The exception this rank is held for (``on_error="hold"``), with its traceback
        and frames, or None: what a function run on a held rank inspects."""
        return self._held

    def breakpoint(self, ranks: int | Iterable[int] = (0,)) -> None:
        """Pause the whole job here and open a pdb console in the notebook for ``ranks``.

        A no-op (one attribute check) unless the job was launched with ``debug=True``.
        Every rank must call it at the same point; the others wait in it until the
        session ends (``c``, ``q`` or ``job.resume()``).

        >>> for step, (x, y) in ctx.loop(loader, steps=100):      # doctest: +SKIP
        ...     loss = loss_fn(model(x), y)
        ...     if step == 50:
        ...         ctx.breakpoint(ranks=[0])  # pdb on rank 0, in the notebook
        """
        if not self.spec.debug:
            return
        stop_here(self, ranks, sys._getframe(1))

    def _serve_live(self, words: list[int]) -> None:
        """Called with every new control vector while this rank waits (held, or at a
        breakpoint): ``job.run`` requests for it run here, in its own thread (see
        :meth:`.live.Live.act_alone`)."""
        live = getattr(self, "_live", None)
        if live is not None:
            live.act_alone(words)

    def _console_queue(self) -> queue.Queue:
        if self._console_input is None:
            self._console_input = queue.Queue()
        return self._console_input

    def _console_feed(self, text: str) -> None:
        """A line (or lines) for this rank's pdb session (from the worker's event loop)."""
        for line in str(text).splitlines() or [""]:
            self._console_queue().put(line)


def check_ranks(ranks: Any, world_size: int) -> tuple[int, ...]:
    """``ranks`` as a tuple of this job's ranks, or a SpecError naming the bad value."""
    chosen = (ranks,) if isinstance(ranks, int) and not isinstance(ranks, bool) else ranks
    try:
        chosen = tuple(chosen)
    except TypeError:
        chosen = (ranks,)
    if not chosen or not all(isinstance(r, int) and not isinstance(r, bool)
                             and 0 <= r < world_size for r in chosen):
        raise SpecError(f"ctx.breakpoint(ranks={ranks!r}): ranks must be ranks of this job, "
                        f"from 0 to {world_size - 1}, e.g. ranks=[0]")
    return chosen


def stop_here(ctx: Any, ranks: Any, frame: Any) -> None:
    """Breakpoint ``k`` of this rank: debug it (a chosen rank) or wait for the release."""
    chosen = check_ranks(ranks, ctx.world_size)
    ctx._breaks += 1
    k = ctx._breaks
    words = ctx._control.words()
    if words[Word.STOP] or words[Word.SUSPEND]:
        return  # the job is leaving: it goes on to its next step boundary
    if ctx.rank in chosen:
        ctx._report(RankEvent.BREAK, k=k, step=ctx.step)
        RemotePdb(ctx, k).set_trace(frame)  # stops at the caller's next line
        return
    before, ctx.phase = ctx.phase, "paused"
    try:
        while not released(words, k):
            if ctx._control.wait_beyond(words, 1.0):
                words = ctx._control.words()
                serve(ctx, words)
            words = ctx._control.words()
    finally:
        ctx.phase = before


def released(words: list[int], k: int) -> bool:
    """Whether breakpoint ``k`` no longer holds the ranks: released, or the job leaves."""
    return words[Word.RELEASE] >= k or bool(words[Word.STOP] or words[Word.SUSPEND])


class ConsoleOut:
    """The session's stdout: what pdb prints, sent to the notebook at each prompt."""

    def __init__(self, ctx: Any, k: int):
        self.ctx, self.k = ctx, k
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def flush(self, closed: bool = False) -> None:
        text, self._parts = "".join(self._parts), []
        if text or closed:
            self.ctx._report(RankEvent.CONSOLE, k=self.k, text=text, closed=closed)


class ConsoleIn:
    """The session's stdin: lines the notebook sends; ``quit`` by itself once the
    breakpoint is released (``job.resume()``) or the job leaves (stop, suspend)."""

    def __init__(self, ctx: Any, k: int, out: ConsoleOut):
        self.ctx, self.k, self.out = ctx, k, out
        pending = ctx._console_queue()
        while not pending.empty():  # input sent to an earlier session is not for this one
            pending.get_nowait()

    def readline(self) -> str:
        self.out.flush()
        pending = self.ctx._console_queue()
        while True:
            try:
                line = pending.get(timeout=POLL_S)
            except queue.Empty:
                words = self.ctx._control.words()
                if released(words, self.k):
                    why = "job.resume()" if words[Word.RELEASE] >= self.k else "the job is leaving"
                    self.out.write(f"quit  # {why}\n")
                    return "quit\n"
                continue
            self.out.write(line + "\n")  # the transcript shows what was typed
            return line + "\n"


class RemotePdb(pdb.Pdb):
    """pdb on a rank thread, its stdin and stdout the notebook's console."""

    def __init__(self, ctx: Any, k: int):
        self.ctx, self.k = ctx, k
        self.console_out = ConsoleOut(ctx, k)
        super().__init__(stdin=ConsoleIn(ctx, k, self.console_out), stdout=self.console_out,
                         skip=["clustersdk.*"], nosigint=True, readrc=False)
        self.prompt = f"(Pdb rank {ctx.rank}) "
        self._closed = False

    def interaction(self, frame: Any, tb: Any) -> None:
        before, self.ctx.phase = self.ctx.phase, "paused"  # waiting for a person, not hung
        try:
            super().interaction(frame, tb)
        finally:
            self.ctx.phase = before

    def set_continue(self) -> None:
        super().set_continue()
        if not self.breaks:  # no pdb breakpoint left: the session is over
            self._close()

    def set_quit(self) -> None:
        """``q``: leave the debugger; the job runs on (no BdbQuit into training code)."""
        self.clear_all_breaks()
        self.set_continue()

    def do_interact(self, arg: str) -> None:
        self.error("interact needs a terminal; in the notebook console use p, pp or !statement")

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self.console_out.write("(continuing: the job runs on)\n")
            self.console_out.flush(closed=True)
