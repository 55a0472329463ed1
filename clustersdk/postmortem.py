"""What ``job.debug(rank)`` returns: a held rank's failing stack, each frame with its locals.

>>> post = job.debug(1)          # doctest: +SKIP
>>> post                         # the stack, innermost frame last, as a traceback reads
>>> post.frames[-1]["locals"]    # {"x": "Tensor(shape=[8, 8], ..., nan=True)", ...}  # doctest: +SKIP

The locals were rendered on the rank when it raised (see
:mod:`clustersdk.runtime.holds`): reprs cut to a length, tensors summarized, a
repr that raised or ran too long named as such. Pure: no Dask, no torch.
"""

from __future__ import annotations

import html
from typing import Any


class PostMortem:
    """One held rank: ``rank``, ``error`` (type, message, traceback), ``frames``
    (outermost first; each: file, line, function, code, locals, ours, omitted), the
    ``step`` it failed at and the job's ``status``."""

    def __init__(self, entry: dict[str, Any]):
        self._entry = entry

    @property
    def rank(self) -> int:
        return int(self._entry["rank"])

    @property
    def error(self) -> dict[str, Any]:
        return dict(self._entry.get("error") or {})

    @property
    def frames(self) -> list[dict[str, Any]]:
        return list(self._entry.get("frames") or [])

    @property
    def step(self) -> int | None:
        return self._entry.get("step")

    @property
    def status(self) -> str:
        return str(self._entry.get("status", ""))

    @property
    def cause(self) -> bool:
        """Whether this rank's error is the job's (the others raised because of it)."""
        return self._entry.get("cause") == self.rank

    def as_dict(self) -> dict[str, Any]:
        """Everything the record holds, as plain data (what ``clustersdk debug --json`` prints)."""
        return dict(self._entry)

    def headline(self) -> str:
        err = self.error
        at = f" at step {self.step}" if self.step is not None else ""
        ended = f"; {self._entry['ended']}" if self._entry.get("ended") else ""
        return (
            f"rank {self.rank} of job {self._entry.get('name', '?')!r} raised "
            f"{err.get('type')}{at}: {err.get('message')} ({self.status}{ended})"
        )

    @property
    def text(self) -> str:
        """The stack as a traceback reads (innermost frame last), each frame's locals under
        it (clustersdk's own frames without theirs)."""
        lines = [self.headline(), "Traceback (most recent call last), with each frame's locals:"]
        for frame in self.frames:
            lines.append(f'  File "{frame["file"]}", line {frame["line"]}, in {frame["function"]}')
            if frame.get("code"):
                lines.append(f"    {frame['code']}")
            for name, value in (frame.get("locals") or {}).items():
                lines.append(f"      {name} = {value}")
            if frame.get("omitted"):
                lines.append(f"      ... {frame['omitted']} more local(s) left out")
        err = self.error
        lines.append(f"{err.get('type')}: {err.get('message')}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        """The frames innermost first, the failing one open, each with a table of locals."""
        parts = [
            f'<div class="clustersdk-postmortem"><strong>{html.escape(self.headline())}</strong>'
        ]
        for index, frame in enumerate(reversed(self.frames)):
            rows = "".join(
                f"<tr><td><code>{html.escape(n)}</code></td><td><code>"
                f"{html.escape(v)}</code></td></tr>"
                for n, v in (frame.get("locals") or {}).items()
            )
            where = (
                f"{html.escape(frame['function'])} — {html.escape(frame['file'])}, "
                f"line {frame['line']}"
            )
            opened = " open" if index == 0 else ""
            parts.append(
                f"<details{opened}><summary><code>{where}</code></summary>"
                f'<pre style="margin:2px 0 4px 12px;">{html.escape(frame.get("code") or "")}'
                f"</pre>{f'<table>{rows}</table>' if rows else ''}</details>"
            )
        return "".join(parts) + "</div>"
