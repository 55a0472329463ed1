"""A rank's output as whole lines: what its process writes, until the worker ships it.

A rank's stdout, stderr and ``log`` stream are pipes its worker reads
(:class:`~.rank.Rank`); the bytes arrive in pieces, and :class:`Sink` makes lines of
them, stamped with the time each was complete. A line that grows past
:data:`LINE_LIMIT` (a progress bar redrawn with ``\\r`` and no newline) is cut there.
The last lines of each stream are also kept apart (``tail``): a rank that dies is
reported with the last lines of its stderr.
"""

from __future__ import annotations

import codecs
import collections
import time

MAX_PENDING_LINES = 10_000  # per rank between two flushes; older lines are dropped
LINE_LIMIT = 64 * 1024  # characters: a longer "line" is cut into pieces this long
TAIL = 20  # lines of each stream kept for a failure's record


class Sink:
    """Collects one rank's complete output lines until the agent drains them."""

    def __init__(self, rank: int):
        self.rank = rank
        self.lines: collections.deque = collections.deque(maxlen=MAX_PENDING_LINES)
        self.tails: dict[str, collections.deque[str]] = {}
        self._partial: dict[str, str] = {}
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}

    def write(self, stream: str, text: str) -> int:
        """Add ``text`` to ``stream``; how many lines it completed."""
        text = self._partial.pop(stream, "") + text
        *complete, rest = text.split("\n")
        while len(rest) > LINE_LIMIT:
            complete.append(rest[:LINE_LIMIT])
            rest = rest[LINE_LIMIT:]
        now = time.time()
        tail = self.tails.setdefault(stream, collections.deque(maxlen=TAIL))
        for line in complete:
            self.lines.append((self.rank, now, stream, line))
            tail.append(line)
        if rest:
            self._partial[stream] = rest
        return len(complete)

    def write_bytes(self, stream: str, data: bytes) -> int:
        """:meth:`write` for bytes read from a pipe (UTF-8; a character cut between two
        reads is decoded whole; bad bytes are replaced)."""
        decoder = self._decoders.get(stream)
        if decoder is None:
            decoder = self._decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")
        return self.write(stream, decoder.decode(data))

    def tail(self, stream: str) -> list[str]:
        """The last lines of ``stream`` (its unfinished line too)."""
        lines = list(self.tails.get(stream, ()))
        if self._partial.get(stream):
            lines = (lines + [self._partial[stream]])[-TAIL:]
        return lines

    def drain(self, final: bool = False) -> list[tuple[int, float, str, str]]:
        if final:
            for stream, rest in list(self._partial.items()):
                self.lines.append((self.rank, time.time(), stream, rest))
            self._partial.clear()
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        return out
