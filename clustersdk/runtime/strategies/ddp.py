"""DistributedDataParallel: every rank holds the model; gradients are averaged."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel

if TYPE_CHECKING:
    from ..context import TrainContext


def wrap(model: torch.nn.Module, ctx: TrainContext) -> torch.nn.Module:
    if ctx.world_size == 1:
        return model  # nothing to average; DDP would only add overhead
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)
