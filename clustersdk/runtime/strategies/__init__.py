"""How ``ctx.prepare`` wraps a model for each strategy."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..context import TrainContext


def wrap(strategy: str, model: torch.nn.Module, ctx: TrainContext) -> torch.nn.Module:
    if strategy == "ddp":
        from .ddp import wrap as wrap_ddp

        return wrap_ddp(model, ctx)
    return model  # "none": the user wires parallelism themselves
