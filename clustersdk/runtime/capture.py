"""Per-rank capture of stdout, stderr and logging inside a worker process.

Ranks run in threads of a worker process that also serves Dask, so output is
routed by thread: a rank thread ``bind``s a :class:`Sink`, and every write
from that thread lands in the sink as whole lines, while other threads keep
writing to the worker's own streams.
"""

from __future__ import annotations

import collections
import io
import logging
import sys
import threading
import time

_local = threading.local()
_installed = False

MAX_PENDING_LINES = 10_000  # per rank between two flushes; older lines are dropped


class Sink:
    """Collects one rank's complete output lines until the agent drains them."""

    def __init__(self, rank: int):
        self.rank = rank
        self.lines: collections.deque = collections.deque(maxlen=MAX_PENDING_LINES)
        self._partial: dict[str, str] = {}

    def write(self, stream: str, text: str) -> None:
        text = self._partial.pop(stream, "") + text
        *complete, rest = text.split("\n")
        now = time.time()
        for line in complete:
            self.lines.append((self.rank, now, stream, line))
        if rest:
            self._partial[stream] = rest

    def drain(self, final: bool = False) -> list[tuple[int, float, str, str]]:
        if final:
            for stream, rest in list(self._partial.items()):
                self.lines.append((self.rank, time.time(), stream, rest))
            self._partial.clear()
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        return out


class _RankStream(io.TextIOBase):
    """Stands in for sys.stdout/sys.stderr and routes by the writing thread."""

    def __init__(self, original, name: str):
        self._original = original
        self._name = name

    def write(self, s: str) -> int:
        sink = getattr(_local, "sink", None)
        if sink is None:
            return self._original.write(s)
        sink.write(self._name, s)
        return len(s)

    def flush(self) -> None:
        if getattr(_local, "sink", None) is None:
            self._original.flush()

    # io.TextIOBase defines these, so __getattr__ would never see them
    @property
    def encoding(self) -> str:
        return self._original.encoding

    @property
    def errors(self) -> str | None:
        return getattr(self._original, "errors", None)

    def fileno(self) -> int:
        return self._original.fileno()

    def isatty(self) -> bool:
        return self._original.isatty()

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str):
        return getattr(self._original, name)


class _RankLogHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        sink = getattr(_local, "sink", None)
        if sink is not None:
            sink.write("log", self.format(record) + "\n")


def install() -> None:
    """Route this process's streams and root logger through rank sinks (idempotent)."""
    global _installed
    if _installed:
        return
    sys.stdout = _RankStream(sys.stdout, "stdout")
    sys.stderr = _RankStream(sys.stderr, "stderr")
    handler = _RankLogHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    _installed = True


def bind(sink: Sink | None) -> None:
    """Send this thread's output to ``sink`` (None: back to the worker's streams)."""
    _local.sink = sink
