"""Breakpoints: ``ctx.breakpoint()`` pauses the whole job and opens a pdb session on the
chosen rank(s), whose input and output go through the notebook (pure;
:class:`Breakpoints` is the part of :class:`~.lifecycle.Lifecycle` that keeps them).

Every rank counts its ``ctx.breakpoint()`` calls (``k``). A chosen rank reports
``BreakpointHit(k, step)`` and runs pdb on the caller's frame; the others wait inside
their call until the control word ``RELEASE`` reaches ``k`` (or a stop or suspend is
asked). The rules:

- **BreakpointHit** on a RUNNING job: PAUSED (``reason``: where), a session opens for
  that rank; a second chosen rank of the same breakpoint opens its own session. On a
  STARTING job (a rank can reach an early step before the scheduler has heard that
  every rank started) the session opens at once and the job is PAUSED as soon as it is
  RUNNING (:meth:`Breakpoints.started`). On a job in any other state (stopping, suspending, ...) nobody waits for a console:
  ``RELEASE`` is raised at once and the rank's session ends by itself.
- **ConsoleOutput**: what the session printed, kept in a bounded transcript and
  published on the job's topic as ``{"kind": "console", "seq", "rank", "k", "text",
  "open"}``; the rank's ``continue`` (or ``quit``: leave the debugger, the job runs on)
  closes its session. Once no session of the breakpoint is open, ``RELEASE`` reaches
  ``k`` and a job the breakpoint paused is RUNNING again.
- **ResumeRequested** on a job a breakpoint paused (``job.resume()``): the same as
  ``continue`` on every open session.
- A stop or a suspend reaches the waiting ranks through their words: each goes on to
  its next step boundary and leaves there, as it would from a pause.
"""

from __future__ import annotations

import collections
from typing import Any

from ..protocol import ConsoleMessage, Word
from ..status import JobStatus
from . import events as ev
from .view import JobView

MAX_CHUNKS = 1000  # console messages a job keeps for a console opened later


class Breakpoints:
    """The open pdb sessions of one gang start and the console's transcript.

    >>> book = Breakpoints()
    >>> book.open[0] = {"k": 1, "step": 4}
    >>> book.add(0, 1, "(Pdb) ", True)["seq"]
    1
    >>> [c["text"] for c in book.state()["chunks"]]
    ['(Pdb) ']
    """

    def __init__(self, attempt: int = 0) -> None:
        self.attempt = attempt
        self.open: dict[int, dict[str, int]] = {}  # rank -> k, step
        self.k = 0  # the newest breakpoint reported
        self.pausing = False  # the job is PAUSED by a breakpoint
        self.early: ev.BreakpointHit | None = None  # hit while STARTING: pauses once RUNNING
        self.seq = 0
        self.chunks: collections.deque[ConsoleMessage] = collections.deque(maxlen=MAX_CHUNKS)

    def add(self, rank: int, k: int, text: str, is_open: bool) -> ConsoleMessage:
        self.seq += 1
        chunk: ConsoleMessage = {
            "kind": "console",
            "seq": self.seq,
            "rank": rank,
            "k": k,
            "text": text,
            "open": is_open,
        }
        self.chunks.append(chunk)
        return chunk

    def state(self) -> dict[str, Any]:
        """What ``Op.CONSOLE`` answers: the open sessions and the transcript so far."""
        return {
            "sessions": {str(r): dict(s) for r, s in sorted(self.open.items())},
            "chunks": list(self.chunks),
        }

    def of(self, attempt: int) -> Breakpoints:
        """This object, for gang start ``attempt``: a restart's ranks count their
        breakpoints from 0 again (the transcript and its numbering go on)."""
        if self.attempt != attempt:
            self.attempt, self.open, self.k, self.pausing = attempt, {}, 0, False
            self.early = None
        return self

    # --- events ---------------------------------------------------------------------------
    def hit(self, job: JobView, e: ev.BreakpointHit) -> None:
        """A chosen rank reached breakpoint ``k``: the job pauses, its session opens."""
        self.of(job.attempt)
        self.k = max(self.k, e.k)
        if job.status is JobStatus.RUNNING:
            self._pause(job, e)
        elif job.status is JobStatus.STARTING:
            self.early = self.early or e
        elif not (job.status is JobStatus.PAUSED and self.pausing):
            self.pausing = False
            job.emit(
                ev.Publish(
                    self.add(
                        e.rank,
                        e.k,
                        (
                            f"(job is {job.status.name}: breakpoint {e.k} on rank {e.rank} is skipped)\n"
                        ),
                        False,
                    )
                )
            )
            job.ask(Word.RELEASE, e.k)
            return
        self.open[e.rank] = {"k": e.k, "step": e.step}
        job.emit(
            ev.Publish(
                self.add(
                    e.rank,
                    e.k,
                    (f"[rank {e.rank}: ctx.breakpoint() #{e.k} at step {e.step}]\n"),
                    True,
                )
            )
        )

    def started(self, job: JobView) -> None:
        """The job is RUNNING: a breakpoint hit while it was STARTING pauses it now, if
        its session is still open."""
        early, self.early = self.early, None
        if early is not None and any(s["k"] == early.k for s in self.open.values()):
            self._pause(job, early)

    def _pause(self, job: JobView, e: ev.BreakpointHit) -> None:
        job.transition(
            JobStatus.PAUSED,
            paused_at=e.step,
            reason=(
                f"at ctx.breakpoint() on rank {e.rank}, step {e.step}: its pdb console is open "
                "(job.console()); 'c' or job.resume() continues"
            ),
        )
        self.pausing = True

    def output(self, job: JobView, e: ev.ConsoleOutput) -> None:
        """What a session printed; its end releases the breakpoint once no session is left."""
        self.of(job.attempt)
        if e.text or e.closed:
            job.emit(ev.Publish(self.add(e.rank, e.k, e.text, not e.closed)))
        if not e.closed:
            return
        self.open.pop(e.rank, None)
        if any(s["k"] == e.k for s in self.open.values()):
            return  # another chosen rank still debugs this breakpoint
        if job.status is JobStatus.PAUSED and self.pausing:
            job.transition(JobStatus.RUNNING, reason="")
        self.pausing = False
        job.ask(Word.RELEASE, e.k)

    def resumed(self, job: JobView) -> None:
        """``job.resume()`` of a job a breakpoint paused: every session continues."""
        self.of(job.attempt)
        if self.pausing or self.open:
            self.pausing = False
            job.ask(Word.RELEASE, self.k)
