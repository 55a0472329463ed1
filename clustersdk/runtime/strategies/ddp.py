"""DistributedDataParallel: every rank holds the model; gradients are averaged.

Exactness. DDP sums gradients in buckets (flat buffers of many parameters),
and an all-reduce adds each element in an order that depends on where it
sits in its buffer: a ring all-reduce (gloo's, NCCL's) cuts the buffer into
one chunk per rank and sums each chunk starting at a different rank. Stock
DDP reduces its first step with one layout and then rebuilds its buckets in
the order the gradients became ready; a job resumed at step ``k`` would
reduce step ``k`` with the first-step layout where the uninterrupted run used
the rebuilt one, and from 3 ranks on the sums differ in their last bits.

So :func:`distributed` builds the layout once, when the model is wrapped,
from the model alone: the parameters in reverse registration order (about
the order backward produces their gradients, so that communication still
overlaps with it; Megatron-LM lays out its gradient buffers the same way),
cut into DDP's usual buckets (1 MiB first, then 25 MiB), and never rebuilt.
Every start of a job - fresh, resumed, restarted, at any step - reduces
every step alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel

from ...errors import ClusterSDKError

if TYPE_CHECKING:
    from ..context import TrainContext


def wrap(model: torch.nn.Module, ctx: TrainContext) -> torch.nn.Module:
    if ctx.world_size == 1:
        return model  # nothing to average; DDP would only add overhead
    return distributed(model, ctx.device)


def distributed(model: torch.nn.Module, device: torch.device) -> DistributedDataParallel:
    """``model`` under DDP with a bucket layout fixed from the start (all ranks call it)."""
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = _FixedBuckets(model, device_ids=device_ids)
    # What DDP's first backward would record and its next forward apply, done now in
    # _FixedBuckets' order: the layout is final before the first step. (These are the
    # reducer calls DDP's own Join hook makes for a rank that ran out of data.)
    ddp.reducer._push_all_rebuilt_params()
    if not ddp.reducer._rebuild_buckets():
        raise ClusterSDKError(
            f"DDP of torch {torch.__version__} did not take the fixed bucket "
            "layout, so resumed runs would not be exact: please report it"
        )
    return ddp


class _FixedBuckets(DistributedDataParallel):
    """DDP whose reducer sees the parameters last-registered first."""

    def _build_params_for_reducer(self):  # noqa: ANN202 - DDP's own signature
        params, sparse = super()._build_params_for_reducer()
        return params[::-1], sparse[::-1]
