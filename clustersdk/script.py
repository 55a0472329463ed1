"""Inside a script job: live charts and step-boundary control, without a rewrite.

A script launched with ``cluster.launch_script`` (or ``clustersdk submit``) runs as it
would under ``torchrun``. Two calls give it what a training function gets from ``ctx``:

>>> from clustersdk import script
>>> for step in range(start, steps):                          # doctest: +SKIP
...     loss = train_one_step()
...     script.log(step=step, loss=loss.item())               # the job's history and charts
...     todo = script.step(step, saves=True)                  # a paused job waits here
...     if todo.checkpoint:                                   # job.checkpoint(), a suspend...
...         path = save(step)
...         script.saved(path, step=step)                     # job.checkpoint() returns it
...     if todo.stop:                                         # a stop, suspend or preemption
...         break

- :func:`log` sends a rank's scalars to the job (``job.history()``, the dashboard's
  charts, TensorBoard). Outside a clustersdk job (plain ``python`` or ``torchrun``) it
  does nothing, so the script runs unchanged anywhere.
- :func:`step` is the step boundary through which requests reach a script that opts
  in: a pause waits there (``job.pause()`` returns once every rank does), a checkpoint
  request comes back as ``.checkpoint`` (``saves=True`` says the script saves then, which
  is what lets ``job.checkpoint()`` and the Checkpoint button ask), and a stop, a suspend
  or a preemption as ``.stop`` (``.suspend`` when the job comes back: save first). Under
  ``torch.distributed`` every rank must call it at the same steps: the ranks agree there
  (one tiny all-reduce on a gloo group of its own, spaced to about one per 40 ms of
  steps, as ``ctx.loop``'s), so that they all pause, save or leave at the same step.
- Stop, suspend and preemption also send SIGTERM, then SIGKILL after the job's
  ``grace``: once :func:`step` was called, SIGTERM (where the script has no handler of
  its own) only marks the request, which the next boundary returns.
- :func:`restarts` (``TORCHELASTIC_RESTART_COUNT``), :func:`checkpoint_dir`
  (``CLUSTERSDK_CHECKPOINT_DIR``) and :func:`resume_from` (the newest checkpoint the
  script reported with :func:`saved`) tell a script coming back where to resume from.

Dependency-free: the standard library only (``torch.distributed`` when the script has
initialized it). The job's rank gives the process a Unix socket (``CLUSTERSDK_CONTROL``),
the line every rank process has to its worker (:mod:`clustersdk.runtime.channel`);
a log is one message written to it, a boundary that asks for nothing is a few
attribute reads.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from .protocol import RankEvent, Word, no_words
from .runtime.channel import Channel

__all__ = ["Request", "checkpoint_dir", "in_job", "log", "restarts", "resume_from", "saved", "step"]

ENV_CONTROL = "CLUSTERSDK_CONTROL"
STEP_REPORT_S = 0.5  # a rank that only calls step() says where it is this often (hangs)
# A stop or suspend from the job sends its control words down the socket before SIGTERM;
# a SIGTERM is taken for a plain stop only once this long passed with no word for it (the
# words may still be on their way to the listening thread: a suspend must not become a
# stop that saves nothing). A SIGTERM from outside (scancel, kill) waits this long once.
SIGTERM_WORDS_S = 2.0


@dataclasses.dataclass(frozen=True)
class Request:
    """What :func:`step` asks of the script at this boundary (false: carry on).

    ``checkpoint``: save now (then :func:`saved`); ``stop``: leave now (a stop, a suspend
    or a preemption; ``suspend``: the job comes back, so save first).
    """

    checkpoint: bool = False
    stop: bool = False
    suspend: bool = False

    def __bool__(self) -> bool:
        return self.checkpoint or self.stop


NOTHING = Request()


def in_job() -> bool:
    """Whether this process is a rank of a clustersdk job."""
    return bool(os.environ.get(ENV_CONTROL))


def restarts() -> int:
    """How many times the job's gang started before this one (restarts, resumes): 0 the
    first time (``TORCHELASTIC_RESTART_COUNT``, as under torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def checkpoint_dir() -> str | None:
    """The job's ``checkpoint_dir`` (``CLUSTERSDK_CHECKPOINT_DIR``), or None."""
    return os.environ.get("CLUSTERSDK_CHECKPOINT_DIR") or None


def resume_from() -> str | None:
    """The newest checkpoint the script reported with :func:`saved` before this gang
    started (``CLUSTERSDK_RESUME``), or None."""
    return os.environ.get("CLUSTERSDK_RESUME") or None


def log(step: int | None = None, **scalars: Any) -> None:
    """Send this rank's ``scalars`` at ``step`` to the job's history and charts.

    Values are numbers (a 0-d tensor's ``.item()`` is taken: that waits for the GPU, as
    printing it would). Nothing happens outside a clustersdk job.

    >>> log(step=3, loss=0.25)        # outside a job: nothing
    """
    channel = _channel()
    if channel is None:
        return
    values = {k: _number(k, v) for k, v in scalars.items()}
    channel.log(step, values)


def step(step: int, *, saves: bool = False) -> Request:
    """The step boundary after step ``step``: wait here while the job is paused; return
    what the job asks of the script now (see :class:`Request`).

    ``saves=True``: the script saves a checkpoint when ``.checkpoint`` is true (and then
    calls :func:`saved`), so ``job.checkpoint()`` may ask. Every rank must call it at the
    same steps. Outside a clustersdk job it returns a false :class:`Request` at once.

    >>> bool(step(10))                # outside a job
    False
    """
    channel = _channel()
    if channel is None:
        return NOTHING
    return channel.boundary(int(step), saves)


def saved(path: str | None = None, *, step: int | None = None) -> None:
    """The checkpoint asked for at the last boundary is saved (at ``path``): the job's
    newest checkpoint (``job.checkpoint()`` returns it, and a job that comes back finds
    it in :func:`resume_from`). Call it on every rank, after the save."""
    channel = _channel()
    if channel is None:
        return
    channel.saved(path, step)


# --- the channel to the rank -------------------------------------------------------------------
class _Channel:
    """This process's line to its rank: rows, whereabouts and reports out, control words in."""

    def __init__(self, path: str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        self.line = Channel(sock)
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.changed = threading.Condition()
        self.words = no_words()
        self.sigterm = False
        self.sigterm_at = 0.0  # when it came (monotonic)
        self.opted = False
        self.check: Any = None  # the ranks' agreement (clustersdk.runtime.control_words)
        self.agreed = no_words()  # the newest words every rank acted on
        self.done = no_words()  # what this script handled: the request seqs
        self.step: int | None = None  # the newest step it logged or reached
        self.last_report = 0.0
        threading.Thread(target=self._listen, daemon=True, name="clustersdk-script").start()

    def send(self, message: dict[str, Any]) -> None:
        # the rank is going away when this fails: the script goes on as it would alone
        self.line.send(message)

    def log(self, step: int | None, scalars: dict[str, float]) -> None:
        if step is not None:
            self.step = step if self.step is None else max(self.step, int(step))
        at = step if step is not None else self.step
        row = {"rank": self.rank, "step": at or 0, "time": time.time(), "scalars": scalars}
        self.send({"op": "rows", "rows": [row], "beacon": {"step": self.step}})

    def report(self, event: RankEvent, at: int, phase: str | None = None, **data: Any) -> None:
        beacon = {"step": at, "phase": phase} if phase else {"step": at}
        self.send({"op": "report", "event": event.value, "data": data, "beacon": beacon})

    def where(self, step: int, phase: str | None = None) -> None:
        beacon = {"step": step, "phase": phase} if phase else {"step": step}
        self.send({"op": "rows", "beacon": beacon})

    def _listen(self) -> None:
        try:
            while True:
                message = self.line.recv()
                if message is None:
                    return
                words = message.get("words") if message.get("op") == "words" else None
                if words:
                    with self.changed:
                        self.words = [max(a, int(b)) for a, b in zip(self.words, words)]
                        self.changed.notify_all()
        except (OSError, ValueError):
            pass

    # --- the boundary --------------------------------------------------------------------------
    def boundary(self, step: int, saves: bool) -> Request:
        if not self.opted:
            self._opt_in(step, saves)
        self.step = step if self.step is None else max(self.step, step)
        now = time.monotonic()
        if now - self.last_report >= STEP_REPORT_S:
            self.last_report = now
            self.where(step)
        words = self._agree(step)
        if words is None:
            return NOTHING
        if words[Word.PAUSE] > words[Word.RESUME] and not (words[Word.STOP] or words[Word.SUSPEND]):
            words = self._paused(step, words)
        checkpoint = words[Word.CHECKPOINT] > self.done[Word.CHECKPOINT]
        if checkpoint:
            self.done[Word.CHECKPOINT] = words[Word.CHECKPOINT]
        suspend = bool(words[Word.SUSPEND]) and not words[Word.STOP]
        stop = bool(words[Word.STOP] or words[Word.SUSPEND])
        if checkpoint or stop:
            self.where(step, "checkpoint" if checkpoint or suspend else "step")
        return Request(checkpoint=checkpoint or suspend, stop=stop, suspend=suspend)

    def _opt_in(self, step: int, saves: bool) -> None:
        self.opted = True
        accepts = ["pause", "checkpoint"] if saves else ["pause"]
        self.report(RankEvent.CONTROLS, step, accepts=accepts)
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        ):
            signal.signal(signal.SIGTERM, self._on_sigterm)
        dist = sys.modules.get("torch.distributed")
        if (
            dist is not None
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() > 1
        ):
            from .runtime.control_words import Control, ControlCheck

            group = dist.new_group(backend="gloo")  # every rank is at its first boundary
            self.check = ControlCheck(Control(), step, dist.get_world_size(), group)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.sigterm_at = time.monotonic()
        self.sigterm = True  # the control words say what it was for; else: a stop
        with self.changed:
            self.changed.notify_all()

    def _local(self) -> list[int]:
        def leaving() -> bool:
            return bool(self.words[Word.STOP] or self.words[Word.SUSPEND])

        with self.changed:
            if self.sigterm and not leaving():
                wait = self.sigterm_at + SIGTERM_WORDS_S - time.monotonic()
                self.changed.wait_for(leaving, timeout=max(wait, 0.0))
            words = list(self.words)
            if self.sigterm and not leaving():
                words[Word.STOP] = 1
        return words

    def _agree(self, step: int) -> list[int] | None:
        """The words every rank acts on at this boundary (None: nothing new, no check
        due). Alone, this rank's own."""
        check = self.check
        if check is None:
            words = self._local()
        elif check.due(step):
            check.control.merge(self._local())
            words = check.agree(step)
        else:
            return None
        if words == self.agreed:
            return None if not (words[Word.STOP] or words[Word.SUSPEND]) else words
        self.agreed = list(words)
        return words

    def _paused(self, step: int, words: list[int]) -> list[int]:
        """Wait at this boundary until the pause is resumed, or a stop comes (every rank
        sees the same words here: they agreed to pause, and each waits for the same ones)."""
        generation = words[Word.PAUSE]
        self.report(RankEvent.PAUSED, step, "paused", step=step)
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self._leaves_pause(generation), timeout=0.2)
            local = self._local()
            if self._leaves_pause(generation):
                break
        words = [max(a, b) for a, b in zip(words, local)]
        if self.check is not None:  # resume together: one more agreement
            self.check.control.merge(words)
            words = self.check.agree(step)
        self.agreed = list(words)
        self.report(RankEvent.RESUMED, step, "step", step=step)
        return words

    def _leaves_pause(self, generation: int) -> bool:
        words = self.words
        return (
            words[Word.RESUME] >= generation
            or bool(words[Word.STOP])
            or bool(words[Word.SUSPEND])
            or self.sigterm
        )

    def saved(self, path: str | None, step: int | None) -> None:
        at = (self.step or 0) if step is None else int(step)
        self.where(at, "step")
        if self.rank == 0:  # as a function job's: rank 0 reports the commit
            where = os.fspath(path) if path is not None else (checkpoint_dir() or "")
            seq = self.done[Word.CHECKPOINT]
            self.report(RankEvent.CHECKPOINT, at, "step", seq=seq, step=at, path=where)


_lock = threading.Lock()
_state: dict[str, Any] = {}


def _channel() -> _Channel | None:
    """This process's channel, opened on first use; None outside a clustersdk job."""
    found = _state.get("channel", False)
    if found is not False:
        return found
    with _lock:
        if "channel" not in _state:
            path = os.environ.get(ENV_CONTROL)
            try:
                _state["channel"] = _Channel(path) if path else None
            except OSError:  # e.g. a process the script started, after its rank ended
                _state["channel"] = None
        return _state["channel"]


def _number(name: str, value: Any) -> float:
    item = getattr(value, "item", None)
    if callable(item):
        value = item()
    try:
        return float(value)  # NaN and Inf too: the job's diagnosis reports them
    except (TypeError, ValueError):
        raise TypeError(f"clustersdk.script.log: {name}={value!r} is not a number") from None
