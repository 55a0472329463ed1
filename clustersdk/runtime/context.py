"""``TrainContext``: what a training function gets as its first argument."""

from __future__ import annotations

import collections
import time
from typing import Any, Iterable, Iterator

import torch
import torch.distributed as dist

from ..errors import SpecError
from . import strategies
from .data import ShardedLoader

RUN, STOP = 0, 1  # control words; the highest word any rank holds wins
RESERVED = frozenset({"seq", "rank", "step", "time"})  # fields of every metrics row
CHECK_INTERVAL = 0.05  # seconds between control checks in a loop of fast steps
MAX_CHECK_EVERY = 1000


class TrainContext:
    """The rank's view of its job.

    >>> def train(ctx):
    ...     model = ctx.prepare(torch.nn.Linear(4, 1))
    ...     opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ...     ctx.register(optimizer=opt)
    ...     for step, (x, y) in ctx.loop(ctx.shard(dataset, batch_size=8), steps=100):
    ...         loss = torch.nn.functional.mse_loss(model(x), y)
    ...         loss.backward(); opt.step(); opt.zero_grad()
    ...         ctx.log(loss=loss)
    """

    def __init__(
        self,
        *,
        job: str,
        name: str,
        rank: int,
        world_size: int,
        local_rank: int,
        device: torch.device,
        strategy: str,
        control_group: Any = None,
    ):
        self.job = job
        self.name = name
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.device = device
        self.strategy = strategy
        self.step = 0
        self.stopped = False
        self.stateful: dict[str, Any] = {}
        self._control_group = control_group
        self._control = RUN  # written by the worker's event loop, read at step boundaries
        self._rows: collections.deque = collections.deque()

    def __repr__(self) -> str:
        return (f"<TrainContext job={self.name!r} rank={self.rank}/{self.world_size} "
                f"device={self.device} strategy={self.strategy!r} step={self.step}>")

    # model and state -------------------------------------------------------
    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move ``model`` to this rank's device and wrap it for the job's strategy."""
        if not isinstance(model, torch.nn.Module):
            raise SpecError(f"ctx.prepare expects a torch.nn.Module, got {type(model).__name__}")
        model = strategies.wrap(self.strategy, model.to(self.device), self)
        self.stateful.setdefault("model", model)
        return model

    def register(self, **objects: Any) -> None:
        """Name what a checkpoint holds besides the model (optimizers, schedulers, ...)."""
        for key, obj in objects.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise SpecError(
                    f"ctx.register({key}=...) needs an object with state_dict() and "
                    f"load_state_dict(), got {type(obj).__name__}"
                )
            self.stateful[key] = obj

    # data ----------------------------------------------------------------------
    def shard(self, dataset: Any, batch_size: int, **options: Any) -> ShardedLoader:
        """This rank's share of every global batch (``batch_size`` samples per rank).

        Options: ``shuffle=True``, ``seed=0``, ``collate_fn``, ``num_workers``.
        """
        loader = ShardedLoader(dataset, batch_size, self.rank, self.world_size, self.device, **options)
        self.stateful.setdefault("data", loader)
        return loader

    def loop(self, data: Iterable[Any] | None, steps: int) -> Iterator[tuple[int, Any]]:
        """Yield ``(step, batch)`` until ``steps`` steps are done or the job is stopped.

        ``data`` is iterated again when it runs out (a new epoch). Every few
        steps the ranks agree on a control word with one tiny all-reduce, so all
        of them act on a stop at the same step; see :class:`ControlCheck`.
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise SpecError(f"steps must be a non-negative int, got {steps!r}")
        batches = _cycle(data) if data is not None else None
        check = ControlCheck(self)
        while self.step < steps:
            if check.due(self.step) and check.agree() >= STOP:
                self.stopped = True
                return
            batch = next(batches) if batches is not None else None
            yield self.step, batch
            self.step += 1

    # metrics -------------------------------------------------------------------
    def log(self, **scalars: Any) -> None:
        """Record scalars (numbers or one-element tensors) for the current step."""
        row = {}
        for key, value in scalars.items():
            if key in RESERVED:
                raise SpecError(f"ctx.log({key}=...): {key!r} is recorded with every row already; "
                                "pick another name")
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise SpecError(
                        f"ctx.log({key}=...) needs a number or a one-element tensor, got a tensor "
                        f"of shape {tuple(value.shape)}"
                    )
                value = value.detach()
                if value.device.type == "cpu":
                    value = value.item()
            elif not isinstance(value, (int, float)):
                raise SpecError(f"ctx.log({key}=...) needs a number, got {type(value).__name__}")
            row[key] = value
        self._rows.append({"rank": self.rank, "step": self.step, "time": time.time(), "scalars": row})

    def drain_rows(self) -> list[dict[str, Any]]:
        """Logged rows since the last drain, as plain numbers (called by the agent)."""
        out = []
        while self._rows:
            row = self._rows.popleft()
            row["scalars"] = {k: (v.item() if isinstance(v, torch.Tensor) else v)
                              for k, v in row["scalars"].items()}
            out.append(row)
        return out


class ControlCheck:
    """When and how the ranks agree on the control word.

    The all-reduce is synchronous (a request is acted on at the next check, not
    one later) and spaced so that checks come about every ``CHECK_INTERVAL``
    seconds: every step when steps are slow, every N steps when they are fast,
    where one more collective per step would cost several percent of
    throughput. N comes from the slowest rank's step time, carried in the same
    all-reduce, so every rank computes the same next check step.
    """

    def __init__(self, ctx: TrainContext):
        self.ctx = ctx
        self.next_step = ctx.step
        self.since = time.perf_counter()
        self.since_step = ctx.step

    def due(self, step: int) -> bool:
        return step >= self.next_step

    def agree(self) -> int:
        ctx = self.ctx
        now, step = time.perf_counter(), ctx.step
        elapsed_us = int(1e6 * (now - self.since) / max(step - self.since_step, 1))
        if ctx.world_size > 1:
            msg = torch.tensor([ctx._control, elapsed_us], dtype=torch.int64)
            dist.all_reduce(msg, op=dist.ReduceOp.MAX, group=ctx._control_group)
            word, step_us = int(msg[0]), int(msg[1])
        else:
            word, step_us = ctx._control, elapsed_us
        every = min(max(int(CHECK_INTERVAL * 1e6 / max(step_us, 1)), 1), MAX_CHECK_EVERY)
        self.next_step = step + (1 if step == self.since_step else every)
        self.since, self.since_step = time.perf_counter(), step
        return word


def _cycle(data: Iterable[Any]) -> Iterator[Any]:
    while True:
        empty = True
        for item in data:
            empty = False
            yield item
        if empty:
            raise SpecError("ctx.loop got an empty data iterable")
