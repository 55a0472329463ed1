"""``JobSpec``: everything a launch asks for, validated before anything runs."""

from __future__ import annotations

import dataclasses
import numbers
import os
import re
import uuid
from typing import Any, Callable

import cloudpickle

from .errors import SpecError

STRATEGIES: dict[str, str] = {
    "ddp": "DistributedDataParallel: every rank holds the whole model, gradients are averaged",
    "none": "no wrapping: ctx.prepare only moves the model to the rank's device",
}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclasses.dataclass
class JobSpec:
    """What to run and on how many ranks.

    >>> JobSpec(fn=print, world_size=2).strategy
    'ddp'
    """

    fn: Callable[..., Any]
    world_size: int
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    strategy: str = "ddp"
    name: str | None = None
    timeout: float = 60.0           # process-group timeout, seconds
    metrics_interval: float = 0.2   # how often ranks ship metrics and logs, seconds
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None  # steps between periodic checkpoints
    keep: int = 3                       # committed checkpoints kept
    async_checkpoint: bool = True
    resume: str | None = None           # "auto" (newest in checkpoint_dir) or a checkpoint path
    id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise SpecError(f"fn must be callable, got {self.fn!r} of type {type(self.fn).__name__}")
        ws = self.world_size
        if isinstance(ws, bool) or not isinstance(ws, numbers.Integral):
            raise SpecError(f"world_size must be an int, got {ws!r} of type {type(ws).__name__}")
        if ws <= 0:
            raise SpecError(f"world_size must be at least 1, got {ws}")
        self.world_size = int(ws)
        if self.strategy not in STRATEGIES:
            valid = ", ".join(repr(s) for s in STRATEGIES)
            raise SpecError(f"unknown strategy {self.strategy!r}; valid strategies: {valid}")
        if not isinstance(self.args, (tuple, list)):
            raise SpecError(f"args must be a tuple, got {type(self.args).__name__}")
        self.args = tuple(self.args)
        if not isinstance(self.kwargs, dict):
            raise SpecError(f"kwargs must be a dict, got {type(self.kwargs).__name__}")
        if self.name is None:
            base = re.sub(r"[^A-Za-z0-9_.-]+", "-", getattr(self.fn, "__name__", "job"))
            self.name = f"{base.strip('_.-')[:50] or 'job'}-{self.id[:6]}"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SpecError(
                f"job name {self.name!r} is invalid: use 1-64 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit"
            )
        for field in ("timeout", "metrics_interval"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
                raise SpecError(f"{field} must be a positive number of seconds, got {value!r}")

        self._check_checkpoint_options()

    def _check_checkpoint_options(self) -> None:
        if self.checkpoint_dir is not None:
            if not isinstance(self.checkpoint_dir, (str, os.PathLike)) or not str(self.checkpoint_dir):
                raise SpecError(f"checkpoint_dir must be a path, got {self.checkpoint_dir!r}")
            self.checkpoint_dir = os.path.abspath(os.path.expanduser(os.fspath(self.checkpoint_dir)))
        every = self.checkpoint_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every <= 0):
            raise SpecError(f"checkpoint_every must be a positive int (steps), got {every!r}")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise SpecError(f"keep must be an int of at least 1, got {self.keep!r}")
        if self.resume is not None and not isinstance(self.resume, str):
            raise SpecError(f"resume must be 'auto' or a checkpoint path, got {self.resume!r}")
        needs_dir = [n for n in ("checkpoint_every", "resume") if getattr(self, n) is not None]
        if needs_dir and self.checkpoint_dir is None:
            raise SpecError(f"{' and '.join(needs_dir)} need checkpoint_dir=...")

    def payload(self) -> bytes:
        """The function and its arguments, cloudpickled; a clear error if they can't be."""
        try:
            return cloudpickle.dumps((self.fn, self.args, self.kwargs))
        except Exception as e:
            what = getattr(self.fn, "__qualname__", repr(self.fn))
            raise SpecError(
                f"the training function {what} or its arguments can't be pickled "
                f"({type(e).__name__}: {e}); it must be picklable to reach the workers — move "
                "open files, locks, sockets or clients out of it and create them inside the function"
            ) from e

    def to_wire(self) -> dict[str, Any]:
        """The msgpack-able part the scheduler keeps (no function)."""
        return {
            "id": self.id,
            "name": self.name,
            "world_size": self.world_size,
            "strategy": self.strategy,
            "timeout": float(self.timeout),
            "metrics_interval": float(self.metrics_interval),
            "fn": getattr(self.fn, "__qualname__", repr(self.fn)),
            "checkpoint_dir": self.checkpoint_dir,
            "checkpoint_every": self.checkpoint_every,
            "keep": self.keep,
            "async_checkpoint": bool(self.async_checkpoint),
            "resume": self.resume,
        }
