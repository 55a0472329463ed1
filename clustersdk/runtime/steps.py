"""One optimizer step, the same way under every strategy (``ctx.train_step`` and its parts).

A step takes this rank's batch, cuts it into ``grad_accum`` micro-batches,
runs forward (under autocast) and backward for each - with the data-parallel
gradient reduction switched off for all but the last, so that inner
micro-batches cost no communication - then unscales (fp16), clips (the norm
of the whole model's gradient, whatever the sharding), steps the optimizer
and zeroes the gradients. Under ``pp`` the pipeline schedule runs forward
and backward of the micro-batches instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..errors import SpecError
from . import training
from .training import Precision

if TYPE_CHECKING:
    from .context import TrainContext

# what each option needs the training function to call, so that it takes effect
NEEDS = {
    "bf16": {"autocast"},
    "fp16": {"autocast", "backward", "optimizer_step"},
    "grad_accum": {"micro_batches"},
    "clip_grad_norm": {"optimizer_step"},
    "pp": {"train_step"},
}


class Steps:
    def __init__(self, ctx: TrainContext):
        self.ctx = ctx
        self.precision = Precision(ctx.options["precision"], ctx.device)
        self.accum = ctx.options["grad_accum"]
        self.clip = ctx.options["clip_grad_norm"]
        self.model: torch.nn.Module | None = None
        self.loss_fn: Callable[..., torch.Tensor] | None = None
        self.pipeline: Any = None
        self.called: set[str] = set()
        self.last_norm: torch.Tensor | None = None  # of the last clipping (on_nan checks it)

    # --- the parts ----------------------------------------------------------------------
    def autocast(self):  # noqa: ANN201 - a context manager
        self.called.add("autocast")
        return self.precision.autocast()

    def micro_batches(self, *values: Any) -> Iterator[tuple[Any, ...]]:
        self.called.add("micro_batches")
        self._not_pipeline("ctx.micro_batches")
        pieces = training.split(values, self.accum)
        for i, piece in enumerate(pieces):
            with training.no_grad_sync(self.model, sync=i == len(pieces) - 1):
                yield piece

    def backward(self, loss: torch.Tensor) -> None:
        self.called.add("backward")
        self._not_pipeline("ctx.backward")
        self.precision.scale(loss / self.accum).backward()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        self.called.add("optimizer_step")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise SpecError(
                f"ctx.optimizer_step needs a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        scaler, norm = self.precision.scaler, None
        if scaler is not None:
            scaler.unscale_(optimizer)
        if self.clip is not None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            # the ranks that hold each parameter: all, or (pipelines) those of its stage
            holders = self.ctx.world_size // self.ctx.layout.size("pp")
            norm = training.clip_grad_norm_(params, self.clip, holders, self.ctx.device)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.last_norm = norm
        return norm

    # --- the whole step -----------------------------------------------------------------
    def train_step(
        self, optimizer: torch.optim.Optimizer, inputs: Any, target: Any
    ) -> torch.Tensor | None:
        self.called.update(
            ("train_step", "autocast", "micro_batches", "backward", "optimizer_step")
        )
        if self.model is None:
            raise SpecError(
                "ctx.train_step needs a model: call ctx.prepare(model, loss_fn=...) first"
            )
        if self.loss_fn is None:
            raise SpecError("ctx.train_step needs the loss: pass ctx.prepare(model, loss_fn=...)")
        if self.pipeline is not None:
            loss = self.pipeline.step(training.split((inputs, target), self.accum), self.precision)
        else:
            losses = []
            for x, y in self.micro_batches(inputs, target):
                with self.precision.autocast():
                    loss = self.loss_fn(
                        self.model(*x) if isinstance(x, tuple) else self.model(x), y
                    )
                self.backward(loss)
                losses.append(loss.detach())
            loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        self.optimizer_step(optimizer)
        return loss

    # --- what job.update and on_nan use ------------------------------------------------
    def retune(self, options: Mapping[str, Any]) -> None:
        """Take ``clip_grad_norm`` and ``grad_accum`` from the job's options (as
        ``job.update`` left them)."""
        self.clip = options["clip_grad_norm"]
        self.accum = options["grad_accum"]

    def take_norm(self) -> torch.Tensor | None:
        """The gradient norm of the last clipping, once (None when none happened since)."""
        norm, self.last_norm = self.last_norm, None
        return norm

    # --- misuse -------------------------------------------------------------------------
    def check_used(self) -> None:
        """After the first step: every option given to launch was put to work."""
        wanted = {
            f"precision={self.precision.name!r}": NEEDS.get(self.precision.name, set()),
            f"grad_accum={self.accum}": NEEDS["grad_accum"] if self.accum > 1 else set(),
            f"clip_grad_norm={self.clip}": NEEDS["clip_grad_norm"]
            if self.clip is not None
            else set(),
            self._pipeline_name(): NEEDS["pp"] if self.pipeline is not None else set(),
        }
        for option, needs in wanted.items():
            missing = sorted(needs - self.called)
            if missing:
                calls = ", ".join(f"ctx.{m}" for m in missing)
                raise SpecError(
                    f"{option} takes effect through {calls}, which this training "
                    "function did not call in its first step; use "
                    "loss = ctx.train_step(optimizer, inputs, target)"
                )

    def _pipeline_name(self) -> str:
        """How the launch asked for a pipeline: ``strategy='pp'`` or a mesh with ``pp``."""
        if self.ctx.strategy == "pp":
            return "strategy='pp'"
        return f"mesh={self.ctx.options['mesh']!r}"

    def _not_pipeline(self, what: str) -> None:
        if self.pipeline is not None:
            raise SpecError(
                f"{what} can't be used with {self._pipeline_name()}: its pipeline "
                "schedule runs forward and backward; use "
                "loss = ctx.train_step(optimizer, inputs, target)"
            )
