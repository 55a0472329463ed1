"""``ctx.breakpoint()``: the whole job pauses, and a pdb session on the chosen rank talks
to the notebook. :class:`Breakpoints` is one rank's side of it.

Off unless the job was launched with ``debug=True``: then the call is one attribute
check and nothing else. With it, every rank counts its calls (``k``). A chosen rank
reports ``BREAK`` (the control plane pauses the job) and runs a :class:`RemotePdb` on
the caller's frame: its output goes out as ``CONSOLE`` reports, through the control
plane to the job's topic, and its input comes from the kernel through the control
plane and this worker's agent into a :class:`Console` that the session's stdin reads. The
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

import contextlib
import pdb
import queue
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import SpecError
from ..protocol import RankEvent, Word
from .holds import serve

if TYPE_CHECKING:
    from .control_words import Control

POLL_S = 0.2  # how often a waiting session looks at the control words (resume, stop)


class Console:
    """The lines the notebook sends to this rank's pdb session, in order (fed by the
    worker's event loop, read by the session in the rank's thread)."""

    def __init__(self) -> None:
        self._lines: queue.Queue[str] = queue.Queue()

    def feed(self, text: str) -> None:
        """A line (or lines) for the session."""
        for line in str(text).splitlines() or [""]:
            self._lines.put(line)

    def next(self, timeout: float) -> str | None:
        """The next line, or None if none came within ``timeout`` seconds."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def clear(self) -> None:
        """Drop what was sent to an earlier session."""
        while not self._lines.empty():
            self._lines.get_nowait()


class Breakpoints:
    """One rank's ``ctx.breakpoint()`` calls under ``debug=True``: counted, debugged on the
    chosen ranks, waited out on the others.

    What it needs of its rank: ``control`` (the control words: release, stop, suspend),
    ``report`` (BREAK and CONSOLE reports to the control plane), ``console`` (the
    session's input) and ``serve_runs(words)`` (the ``job.run`` requests of a rank that
    waits here). ``phase`` is ``"paused"`` while it waits for a person or for the release
    (``job.stacks()`` and the hang watchdog see it), else None.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        control: Control,
        report: Callable[..., None],
        console: Console,
        serve_runs: Callable[[list[int]], None],
    ):
        self.rank, self.world_size = rank, world_size
        self.control, self.report, self.console = control, report, console
        self.serve_runs = serve_runs
        self.count = 0  # breakpoints reached so far: the k of the newest
        self.phase: str | None = None

    def stop_here(self, ranks: Any, frame: Any, step: int) -> None:
        """Breakpoint ``k`` of this rank at ``step``: debug ``frame`` (a chosen rank) or wait
        for the release."""
        chosen = check_ranks(ranks, self.world_size)
        self.count += 1
        k = self.count
        words = self.control.words()
        if words[Word.STOP] or words[Word.SUSPEND]:
            return  # the job is leaving: it goes on to its next step boundary
        if self.rank in chosen:
            self.report(RankEvent.BREAK, k=k, step=step)
            RemotePdb(self, k).set_trace(frame)  # stops at the caller's next line
            return
        with self.waiting():
            while not released(words, k):
                if self.control.wait_beyond(words, 1.0):
                    words = self.control.words()
                    serve(self.serve_runs, words, self.rank)
                words = self.control.words()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Phase ``paused`` inside the block: waiting for a person, not hung."""
        before, self.phase = self.phase, "paused"
        try:
            yield
        finally:
            self.phase = before


def check_ranks(ranks: Any, world_size: int) -> tuple[int, ...]:
    """``ranks`` as a tuple of this job's ranks, or a SpecError naming the bad value."""
    chosen = (ranks,) if isinstance(ranks, int) and not isinstance(ranks, bool) else ranks
    try:
        chosen = tuple(chosen)
    except TypeError:
        chosen = (ranks,)
    if not chosen or not all(
        isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world_size for r in chosen
    ):
        raise SpecError(
            f"ctx.breakpoint(ranks={ranks!r}): ranks must be ranks of this job, "
            f"from 0 to {world_size - 1}, e.g. ranks=[0]"
        )
    return chosen


def released(words: list[int], k: int) -> bool:
    """Whether breakpoint ``k`` no longer holds the ranks: released, or the job leaves."""
    return words[Word.RELEASE] >= k or bool(words[Word.STOP] or words[Word.SUSPEND])


class ConsoleOut:
    """The session's stdout: what pdb prints, sent to the notebook at each prompt."""

    def __init__(self, report: Callable[..., None], k: int):
        self.report, self.k = report, k
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def flush(self, closed: bool = False) -> None:
        text, self._parts = "".join(self._parts), []
        if text or closed:
            self.report(RankEvent.CONSOLE, k=self.k, text=text, closed=closed)


class ConsoleIn:
    """The session's stdin: lines the notebook sends; ``quit`` by itself once the
    breakpoint is released (``job.resume()``) or the job leaves (stop, suspend)."""

    def __init__(self, console: Console, control: Control, k: int, out: ConsoleOut):
        self.console, self.control, self.k, self.out = console, control, k, out
        console.clear()  # input sent to an earlier session is not for this one

    def readline(self) -> str:
        self.out.flush()
        while True:
            line = self.console.next(POLL_S)
            if line is None:
                words = self.control.words()
                if released(words, self.k):
                    why = "job.resume()" if words[Word.RELEASE] >= self.k else "the job is leaving"
                    self.out.write(f"quit  # {why}\n")
                    return "quit\n"
                continue
            self.out.write(line + "\n")  # the transcript shows what was typed
            return line + "\n"


class RemotePdb(pdb.Pdb):
    """pdb on a rank thread, its stdin and stdout the notebook's console."""

    def __init__(self, breakpoints: Breakpoints, k: int):
        self.breakpoints, self.k = breakpoints, k
        self.console_out = ConsoleOut(breakpoints.report, k)
        stdin = ConsoleIn(breakpoints.console, breakpoints.control, k, self.console_out)
        super().__init__(
            stdin=stdin, stdout=self.console_out, skip=["clustersdk.*"], nosigint=True, readrc=False
        )
        self.prompt = f"(Pdb rank {breakpoints.rank}) "
        self._closed = False

    def interaction(self, frame: Any, tb: Any) -> None:
        with self.breakpoints.waiting():  # waiting for a person, not hung
            super().interaction(frame, tb)

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
