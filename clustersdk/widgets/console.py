"""The notebook console of a job's ``ctx.breakpoint()`` pdb sessions (``job.console()``,
through the ``job_console`` hook that :mod:`clustersdk` provides).

A transcript, an input line and a Send button, bound to the remote pdb: a line typed
and sent (Enter or the button) goes to the control plane (``Op.CONSOLE``), which hands
it to the agent of the rank's worker, where the session's stdin reads it; what pdb
prints comes back as ``console`` messages on the job's topic. Messages are numbered,
so the transcript read when the console opens and the messages that follow join
without a gap or a repeat. Like the dashboard, it only queues messages on Dask's
thread and renders them on the shared :mod:`.pump` thread.

>>> console = job.console()                 # doctest: +SKIP
>>> console.input.value = "p x"             # what a user types ...
>>> console.send_button.click()             # ... and sends
>>> console.text                            # the transcript, as plain text
"""

from __future__ import annotations

import collections
import html
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from .pump import Pump, pump

if TYPE_CHECKING:
    from ..job import Job

logger = logging.getLogger(__name__)

MAX_CHARS = 100_000  # of transcript kept (the newest)

_consoles: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def console(job: Job, rank: int | None = None) -> Console:
    """The console of this ``Job`` handle (made on first use, then reused; ``rank`` picks
    the sessions of one rank, None: every rank's)."""
    with _lock:
        made = _consoles.setdefault(job, {})
        if rank not in made:
            made[rank] = Console(job, rank)
        return made[rank]


class Console:
    """A transcript, an input and a Send button bound to a job's pdb sessions."""

    def __init__(self, job: Job, rank: int | None = None, *, pump_: Pump | None = None):
        self._job = weakref.ref(job)
        self.rank = rank
        self._pump = pump_ or pump()
        self._lock = threading.RLock()
        self._pending: collections.deque = collections.deque()
        self._seen = 0  # the newest message shown (by seq)
        self._text = ""
        self.sessions: dict[int, int] = {}  # rank -> k of its open session
        self._build()
        with self._lock:  # the pump applies nothing before the transcript so far
            job.on_event(self._on_event)  # first, so that nothing after the read is lost
            try:
                state = job.cluster.sync(job.cluster.control.console, job.id, rank=rank)
            except Exception:  # an old scheduler, or the cluster is gone: what comes, then
                logger.debug("clustersdk: could not read the console so far", exc_info=True)
                state = {}
            self._pending.extendleft(reversed(state.get("chunks") or []))
            self.flush()

    def _build(self) -> None:
        self.transcript = w.HTML(layout=w.Layout(width="100%"))
        self.input = w.Text(
            placeholder="pdb command, e.g. p x, n, c (Enter sends)",
            continuous_update=True,
            layout=w.Layout(flex="1 1 auto"),
        )
        self.input.on_msg(self._on_input_msg)
        self.send_button = w.Button(
            description="Send",
            icon="terminal",
            disabled=True,
            tooltip="Send the line to the rank's pdb session",
            layout=w.Layout(width="auto", min_width="80px"),
        )
        self.send_button.on_click(lambda _b: self.send())
        self.status = w.HTML()
        self.widget = w.VBox(
            [
                self.transcript,
                w.HBox(
                    [self.input, self.send_button],
                    layout=w.Layout(width="100%", align_items="center"),
                ),
                self.status,
            ],
            layout=w.Layout(width="100%", padding="2px"),
        )
        self.widget.add_class("clustersdk-console")
        self._render()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        return self.widget._repr_mimebundle_(**kwargs)

    @property
    def text(self) -> str:
        """The transcript: what the sessions printed and what was typed."""
        with self._lock:
            return self._text

    # input --------------------------------------------------------------------------
    def _on_input_msg(self, _widget: Any, content: dict, _buffers: Any) -> None:
        if content.get("event") == "submit":  # Enter in the input line
            self.send()

    def send(self, text: str | None = None) -> None:
        """Send ``text`` (default: the input line's, which is then cleared) to the open
        session (of ``rank``, or the lowest rank with one)."""
        job = self._job()
        line = self.input.value if text is None else text
        if text is None:
            self.input.value = ""
        if job is None:
            return
        with self._lock:
            rank = self.rank if self.rank is not None else min(self.sessions, default=None)
        try:
            job.cluster.sync(job.cluster.control.console, job.id, rank=rank, text=line)
        except Exception as e:  # noqa: BLE001 - shown under the input; the kernel goes on
            self._note(f"not sent: {e}", error=True)
            return
        self._note("")

    # output (Dask's thread, then the pump's) ---------------------------------------------
    def _on_event(self, msg: dict[str, Any]) -> None:
        try:
            if msg.get("kind") == "console":
                self._pending.append(msg)
                self._pump.request(self)
        except Exception:  # never raise into Dask's event loop
            logger.debug("clustersdk: dropped a console message", exc_info=True)

    def flush(self) -> None:
        with self._lock:
            changed = False
            while self._pending:
                changed |= self._apply(self._pending.popleft())
            if changed:
                self._render()

    def _apply(self, chunk: dict[str, Any]) -> bool:
        seq = int(chunk.get("seq", 0))
        if seq <= self._seen:
            return False  # read with the transcript already
        self._seen = seq
        rank = int(chunk.get("rank", 0))
        if self.rank is not None and rank != self.rank:
            return False
        if chunk.get("open"):
            self.sessions[rank] = int(chunk.get("k", 0))
        else:
            self.sessions.pop(rank, None)
        self._text = (self._text + str(chunk.get("text", "")))[-MAX_CHARS:]
        return True

    def _render(self) -> None:
        body = (
            html.escape(self._text)
            or '<span style="color:#9ca3af;">(no session yet: '
            "ctx.breakpoint() in a job launched with debug=True opens one)</span>"
        )
        # column-reverse keeps the newest line in view
        self.transcript.value = (
            '<div style="display:flex;flex-direction:column-reverse;max-height:320px;'
            'overflow:auto;border:1px solid #e5e7eb;border-radius:4px;background:#111827;">'
            '<pre class="clustersdk-console-transcript" style="margin:0;padding:4px 8px;'
            f'font-size:12px;line-height:1.35;color:#e5e7eb;">{body}</pre></div>'
        )
        self.send_button.disabled = not self.sessions
        if self.sessions:
            ranks = ", ".join(
                f"rank {r} (breakpoint {k})" for r, k in sorted(self.sessions.items())
            )
            self._note(f"pdb session open on {ranks}")
        else:
            self._note("no pdb session open")

    def _note(self, text: str, error: bool = False) -> None:
        color = "#b91c1c" if error else "#6b7280"
        self.status.value = (
            f'<span style="font-size:12px;color:{color};">{html.escape(text)}</span>'
        )

    def close(self) -> None:
        """Stop following the job and close the widgets (the sessions go on)."""
        from .tree import close_tree

        self._pump.forget(self)
        close_tree(self.widget)
