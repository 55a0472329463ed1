"""A failed rank held for a post-mortem (``on_error="hold"``): its frames rendered safely,
and the wait until it is told to go.

:func:`render_frames` turns the failing traceback into plain data the control plane
keeps and ``job.debug(rank)`` shows: each frame's file, line, function, source line
and its locals as short reprs. Rendering runs user code (``__repr__``), so it is
bounded every way it can hurt:

- each value's repr is cut to :data:`VALUE_LIMIT` characters (``reprlib``: long
  containers and strings are cut while they are made, not after), all of them to
  :data:`TOTAL_LIMIT` (the failing frame, innermost, gets the budget first);
- a repr that raises shows what it raised; one that runs longer than
  :data:`REPR_SECONDS` is stopped (a tracer ends Python code; the rendering runs in
  a thread of its own, so a repr blocked in C is abandoned after
  :data:`TOTAL_SECONDS` and named so);
- tensors are never printed: shape, dtype, device, and, up to :data:`STATS_NUMEL`
  elements, min, max, mean and whether they hold NaN or Inf; modules are their
  class and parameter count.

:class:`Hold` is what the rank thread does instead of tearing down: it reports
``HELD`` with the error and the frames, keeps the exception (``ctx.error``) and so
its frames alive, and waits until the control vector says STOP or ``hold_timeout``
passes. Every new control vector meanwhile goes to the ``serve_runs`` it is given
(where ``job.run`` on a held rank is served).
"""

from __future__ import annotations

import logging
import os
import reprlib
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..protocol import RankEvent, Word

if TYPE_CHECKING:
    from .control_words import Control

logger = logging.getLogger(__name__)

VALUE_LIMIT = 240  # characters of one local's repr
TOTAL_LIMIT = 20_000  # characters of every local of every frame together
MAX_FRAMES = 40  # innermost frames kept
MAX_LOCALS = 60  # locals shown per frame
REPR_SECONDS = 1.0  # one repr running Python code longer than this is stopped
TOTAL_SECONDS = 10.0  # all of them; a repr blocked outside Python is abandoned then
STATS_NUMEL = 10_000_000  # tensors up to this size get min/max/mean/NaN stats
SHOWN_NUMEL = 6  # tensors up to this size show their values

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # clustersdk/


# --- safe reprs ---------------------------------------------------------------------------
class _Deadline(BaseException):
    """Raised into a repr that ran too long (a BaseException: its ``except Exception``
    must not swallow it)."""


class SafeRepr(reprlib.Repr):
    """``reprlib`` with tensors and modules summarized and failing reprs named.

    >>> SafeRepr().repr(list(range(100)))
    '[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ...]'
    """

    def __init__(self) -> None:
        super().__init__()
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = 10
        self.maxdict = 10
        self.maxarray = 10
        self.maxstring = self.maxother = VALUE_LIMIT
        self.maxlong = 60
        self.maxlevel = 4

    def repr1(self, x: Any, level: int) -> str:
        torch = sys.modules.get("torch")
        if torch is not None:
            if isinstance(x, torch.Tensor):
                return tensor_text(x)
            if isinstance(x, torch.nn.Module):
                return module_text(x)
        return super().repr1(x, level)

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            text = repr(x)
        except _Deadline:
            raise
        except BaseException as e:  # noqa: BLE001 - a broken __repr__ is the user's to see
            return f"<{type(x).__name__} object; its repr raised {type(e).__name__}: {e}>"[
                :VALUE_LIMIT
            ]
        return _cut(text, self.maxother)


def tensor_text(t: Any) -> str:
    """``Tensor(shape=[16, 8], dtype=float32, device=cpu, min=-2.1, max=2.4, mean=0.01,
    nan=False)``: what a tensor is without printing it."""
    import torch

    parts = [
        f"shape={list(t.shape)}",
        f"dtype={str(t.dtype).removeprefix('torch.')}",
        f"device={t.device}",
    ]
    if t.requires_grad:
        parts.append("requires_grad")
    try:
        local = t.to_local() if type(t).__name__ == "DTensor" else t  # never a collective
        if local is not t:
            parts.append(f"local shard {list(local.shape)}")
        parts += _stats(torch, local)
    except Exception as e:  # noqa: BLE001 - a meta, sparse or broken tensor: no stats
        parts.append(f"no stats: {type(e).__name__}")
    return f"{type(t).__name__}({', '.join(parts)})"


def _stats(torch: Any, t: Any) -> list[str]:
    if t.is_meta or t.layout != torch.strided or t.numel() == 0:
        return []
    n = t.numel()
    with torch.no_grad():
        d = t.detach()
        out: list[str] = []
        if n <= SHOWN_NUMEL:  # the values say it all
            return [f"values={d.flatten().tolist()}"]
        if n > STATS_NUMEL or d.dtype == torch.bool:
            return out
        if d.is_floating_point() or d.is_complex():
            out.append(f"nan={bool(torch.isnan(d).any())}")
            if bool(torch.isinf(d).any()):
                out.append("inf=True")
            if d.is_complex():
                return out
            f = d.float()
            return out + [
                f"min={f.min().item():.4g}",
                f"max={f.max().item():.4g}",
                f"mean={f.mean().item():.4g}",
            ]
        return out + [f"min={d.min().item()}", f"max={d.max().item()}"]


def module_text(m: Any) -> str:
    params = list(m.parameters())
    count = sum(p.numel() for p in params)
    device = params[0].device if params else "no parameters"
    return f"<{type(m).__name__}: {count:,} parameters on {device}>"


def _cut(text: str, limit: int = VALUE_LIMIT) -> str:
    """One line (a multi-line repr's lines joined) of at most ``limit`` characters."""
    if "\n" in text:
        text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bounded(fn: Callable[[], str], seconds: float) -> str:
    """``fn()``, stopped with :class:`_Deadline` once it ran ``seconds`` in Python code."""
    end = time.monotonic() + seconds

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True  # a loop of one line has no line events
        if time.monotonic() > end:
            raise _Deadline()
        return tracer

    sys.settrace(tracer)
    try:
        return fn()
    finally:
        sys.settrace(None)


def safe_repr(value: Any, seconds: float = REPR_SECONDS) -> str:
    """A repr of ``value`` that is short, and says so when it raised or took too long."""
    try:
        return _cut(_bounded(lambda: SafeRepr().repr(value), seconds))
    except _Deadline:
        return f"<{type(value).__name__} object; its repr took longer than {seconds:g} s>"
    except BaseException as e:  # noqa: BLE001
        return _cut(f"<{type(value).__name__} object; its repr raised {type(e).__name__}: {e}>")


# --- frames ---------------------------------------------------------------------------------
def render_frames(tb: Any) -> list[dict[str, Any]]:
    """The frames of traceback ``tb``, outermost first: file, line, function, source line,
    whether it is clustersdk's own (``ours``: no locals shown) and its locals as reprs
    (``omitted``: how many were left out for the limits)."""
    walked = list(traceback.walk_tb(tb))[-MAX_FRAMES:]
    frames = []
    for frame, line in walked:
        code = frame.f_code
        frames.append(
            {
                "file": code.co_filename,
                "line": line,
                "function": code.co_name,
                "code": _source_line(code.co_filename, line, frame.f_globals),
                "ours": os.path.abspath(code.co_filename).startswith(_OURS + os.sep),
                "locals": {},
                "omitted": 0,
            }
        )
    wanted = []  # (frame index, name, value), the innermost frame first
    for index in reversed(range(len(walked))):
        if frames[index]["ours"]:
            continue
        items = list(walked[index][0].f_locals.items())
        frames[index]["omitted"] = max(len(items) - MAX_LOCALS, 0)
        wanted += [(index, name, value) for name, value in items[:MAX_LOCALS]]
    texts = _render_all([value for _i, _n, value in wanted])
    budget = TOTAL_LIMIT
    for (index, name, _value), text in zip(wanted, texts):
        if budget <= 0:
            frames[index]["omitted"] += 1
            continue
        frames[index]["locals"][name] = text
        budget -= len(name) + len(text)
    return frames


def _render_all(values: list[Any]) -> list[str]:
    """Each value's :func:`safe_repr`, made in a thread of its own within TOTAL_SECONDS."""
    texts: list[str] = []
    cut_off = threading.Event()

    def work() -> None:
        for value in values:
            if cut_off.is_set():
                return
            texts.append(safe_repr(value))

    thread = threading.Thread(target=work, name="clustersdk-render-locals", daemon=True)
    thread.start()
    thread.join(TOTAL_SECONDS)
    cut_off.set()
    done = list(texts)
    note = f"<not rendered: the locals took longer than {TOTAL_SECONDS:g} s>"
    return done + [note] * (len(values) - len(done))


def _source_line(filename: str, line: int, globals_: dict[str, Any]) -> str:
    import linecache

    try:
        return linecache.getline(filename, line, globals_).strip()
    except Exception:  # noqa: BLE001 - a loader that fails: no source line
        return ""


# --- the hold -------------------------------------------------------------------------------
class Hold:
    """One rank's hold under ``on_error="hold"``: what it was held for, and the wait.

    What it needs of its rank: ``control`` (the STOP that ends the hold), ``report``
    (``HELD``, with the rendered frames), ``rank`` and ``timeout`` (``hold_timeout``).
    ``error`` is the exception the rank is held for (None before); ``phase`` is
    ``"held"`` from then on (``job.stacks()`` and the hang watchdog see it), else None.
    """

    def __init__(self, *, control: Control, report: Callable[..., None], rank: int, timeout: float):
        self.control, self.report, self.rank, self.timeout = control, report, rank, timeout
        self.error: BaseException | None = None
        self.phase: str | None = None

    def wait(
        self,
        exc: BaseException,
        error: dict[str, Any],
        *,
        step: int,
        serve_runs: Callable[[list[int]], None],
    ) -> None:
        """Report ``HELD`` and wait, alive, until the job says STOP or ``timeout`` passes,
        handing each new control vector to ``serve_runs``.

        Called by the rank thread in place of its failure report; the process group, the
        exception (``ctx.error``) and its frames stay as they were meanwhile.
        """
        self.error = exc
        self.phase = "held"
        try:
            frames = render_frames(exc.__traceback__)
        except Exception:  # noqa: BLE001 - the post-mortem must not cost the report
            logger.exception(
                "clustersdk: rendering the failing frames of rank %d failed", self.rank
            )
            frames = []
        self.report(RankEvent.HELD, error=error, frames=frames, step=step)
        control = self.control
        deadline = time.monotonic() + self.timeout
        seen = control.words()
        while not seen[Word.STOP]:
            left = deadline - time.monotonic()
            if left <= 0:
                logger.warning(
                    "clustersdk: rank %d was held for hold_timeout=%g s: failing",
                    self.rank,
                    self.timeout,
                )
                return
            if control.wait_beyond(seen, min(left, 1.0)):
                seen = control.words()
                if not seen[Word.STOP]:
                    serve(serve_runs, seen, self.rank)


def serve(serve_runs: Callable[[list[int]], None], words: list[int], rank: int) -> None:
    """Hand a new control vector to ``serve_runs`` (``job.run`` on a waiting rank); what it
    raises never ends a hold or a breakpoint."""
    try:
        serve_runs(words)
    except Exception:  # noqa: BLE001
        logger.exception("clustersdk: serving a request on rank %d failed", rank)
