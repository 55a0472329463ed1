"""Breakpoints: ``ctx.breakpoint()`` pauses the whole job and opens a pdb session on the
chosen rank(s), whose input and output go through the notebook (pure; a part of
:class:`~.lifecycle.Lifecycle`).

Every rank counts its ``ctx.breakpoint()`` calls (``k``). A chosen rank reports
``BreakpointHit(k, step)`` and runs pdb on the caller's frame; the others wait inside
their call until the control word ``RELEASE`` reaches ``k`` (or a stop or suspend is
asked). The rules:

- **BreakpointHit** on a RUNNING job: PAUSED (``reason``: where), a session opens for
  that rank; a second chosen rank of the same breakpoint opens its own session. On a
  job in any other state (stopping, suspending, ...) nobody waits for a console:
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
from typing import TYPE_CHECKING, Any

from ..protocol import ConsoleMessage, Word
from ..status import JobStatus
from . import events as ev

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

MAX_CHUNKS = 1000  # console messages a job keeps for a console opened later


class Sessions:
    """The open pdb sessions of one gang start and the console's transcript.

    >>> book = Sessions()
    >>> book.open[0] = {"k": 1, "step": 4}
    >>> book.add(0, 1, "(Pdb) ", True)["seq"]
    1
    >>> [c["text"] for c in book.state()["chunks"]]
    ['(Pdb) ']
    """

    def __init__(self, attempt: int = 0) -> None:
        self.attempt = attempt
        self.open: dict[int, dict[str, int]] = {}  # rank -> k, step
        self.k = 0                                  # the newest breakpoint reported
        self.pausing = False                        # the job is PAUSED by a breakpoint
        self.seq = 0
        self.chunks: collections.deque = collections.deque(maxlen=MAX_CHUNKS)

    def add(self, rank: int, k: int, text: str, is_open: bool) -> ConsoleMessage:
        self.seq += 1
        chunk: ConsoleMessage = {"kind": "console", "seq": self.seq, "rank": rank, "k": k,
                                 "text": text, "open": is_open}
        self.chunks.append(chunk)
        return chunk

    def state(self) -> dict[str, Any]:
        """What ``Op.CONSOLE`` answers: the open sessions and the transcript so far."""
        return {"sessions": {str(r): dict(s) for r, s in sorted(self.open.items())},
                "chunks": list(self.chunks)}


def book(job: Lifecycle) -> Sessions:
    """The sessions of the current gang start: a restart's ranks count their breakpoints
    from 0 again (the transcript and its numbering go on)."""
    sessions = job.breaks
    if sessions.attempt != job.attempt:
        sessions.attempt, sessions.open, sessions.k, sessions.pausing = job.attempt, {}, 0, False
    return sessions


# --- the lifecycle's rules ----------------------------------------------------------------
def hit(job: Lifecycle, e: ev.BreakpointHit) -> None:
    """A chosen rank reached breakpoint ``k``: the job pauses, its session opens."""
    sessions = book(job)
    sessions.k = max(sessions.k, e.k)
    if job.status is JobStatus.RUNNING:
        job._transition(JobStatus.PAUSED, paused_at=e.step, reason=(
            f"at ctx.breakpoint() on rank {e.rank}, step {e.step}: its pdb console is open "
            "(job.console()); 'c' or job.resume() continues"))
        sessions.pausing = True
    elif not (job.status is JobStatus.PAUSED and sessions.pausing):
        sessions.pausing = False
        job._out.append(ev.Publish(sessions.add(e.rank, e.k, (
            f"(job is {job.status.name}: breakpoint {e.k} on rank {e.rank} is skipped)\n"),
            False)))
        job._ask(Word.RELEASE, e.k)
        return
    sessions.open[e.rank] = {"k": e.k, "step": e.step}
    job._out.append(ev.Publish(sessions.add(e.rank, e.k, (
        f"[rank {e.rank}: ctx.breakpoint() #{e.k} at step {e.step}]\n"), True)))


def output(job: Lifecycle, e: ev.ConsoleOutput) -> None:
    """What a session printed; its end releases the breakpoint once no session is left."""
    sessions = book(job)
    if e.text or e.closed:
        job._out.append(ev.Publish(sessions.add(e.rank, e.k, e.text, not e.closed)))
    if not e.closed:
        return
    sessions.open.pop(e.rank, None)
    if any(s["k"] == e.k for s in sessions.open.values()):
        return  # another chosen rank still debugs this breakpoint
    if job.status is JobStatus.PAUSED and sessions.pausing:
        job._transition(JobStatus.RUNNING, reason="")
    sessions.pausing = False
    job._ask(Word.RELEASE, e.k)


def resumed(job: Lifecycle) -> None:
    """``job.resume()`` of a job a breakpoint paused: every session continues."""
    sessions = book(job)
    if sessions.pausing or sessions.open:
        sessions.pausing = False
        job._ask(Word.RELEASE, sessions.k)
