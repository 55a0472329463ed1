"""Expert parallelism: each rank owns 1/N of every MoE layer's experts.

The experts' stacked weights of each :class:`clustersdk.models.MoE` become
``Shard(0)`` DTensors on the ``ep`` mesh; the rest of the model is data
parallel (DDP, with the expert weights left out of its all-reduce and its
bucket layout fixed as :mod:`.ddp` explains). In each MoE layer, a rank sends
each of its tokens to the rank that owns the token's expert with one
all-to-all, runs its own experts on what it receives, and sends the results
back with a second all-to-all; backward does the same in reverse. An
all-to-all only moves values (it adds nothing): every start of a job
exchanges the same values in the same order.

Gradients: a rank's expert weights receive the gradient of *every* rank's
loss (through the all-to-all), so a hook divides them by N, which makes them
the gradient of the mean loss, as DDP's average does for the dense weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import Shard, distribute_tensor

from ...errors import SpecError
from ...models.moe import MoE

if TYPE_CHECKING:
    from ..context import TrainContext


def check(model: nn.Module, size: int) -> None:
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, MoE)]
    if not layers:
        raise SpecError(
            f"strategy='ep' shards the experts of clustersdk.models.MoE layers, and "
            f"{type(model).__name__} has none (e.g. TransformerConfig(n_experts=4))"
        )
    for name, layer in layers:
        if layer.n_experts % size:
            raise SpecError(
                f"{name} has {layer.n_experts} experts, which do not divide over ep={size} ranks"
            )


def wrap(model: nn.Module, ctx: TrainContext) -> nn.Module:
    size = ctx.layout.size("ep")  # the layers were checked by ctx.prepare
    if size == 1:
        return model
    mesh = ctx.mesh
    dispatch = AllToAll(mesh.get_group(), size, mesh.get_local_rank())
    sharded = []
    for name, layer in model.named_modules():
        if isinstance(layer, MoE):
            for weight in ("w1", "w2"):
                param = nn.Parameter(
                    distribute_tensor(getattr(layer, weight).detach(), mesh, [Shard(0)])
                )
                param.register_hook(lambda grad: grad / size)
                setattr(layer, weight, param)
                sharded.append(f"{name}.{weight}")
            layer.dispatch = dispatch
    from torch.nn.parallel import DistributedDataParallel

    from .ddp import distributed

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, sharded)
    return distributed(model, ctx.device)  # the dense layers, with a fixed bucket layout


class AllToAll:
    """A MoE layer's dispatch: tokens to their experts' ranks and back."""

    def __init__(self, group: Any, size: int, rank: int):
        self.group, self.size, self.rank = group, size, rank

    def __call__(self, tokens: torch.Tensor, expert: torch.Tensor, layer: MoE) -> torch.Tensor:
        local = layer.n_experts // self.size
        order = torch.argsort(expert, stable=True)
        counts = torch.bincount(expert, minlength=layer.n_experts)
        # counts[s * local + e]: tokens rank s sends to this rank's expert e
        incoming = torch.empty_like(counts)
        dist.all_to_all_single(incoming, counts, group=self.group)
        send = counts.view(self.size, local).sum(1).tolist()
        recv = incoming.view(self.size, local).sum(1).tolist()
        received = _AllToAll.apply(tokens[order], recv, send, self.group)
        first = self.rank * local
        owner = torch.arange(local, device=tokens.device).repeat(self.size)
        experts = torch.repeat_interleave(owner, incoming) + first
        out = MoE.run_local(received, experts, layer.w1.to_local(), layer.w2.to_local(), first)
        back = _AllToAll.apply(out, send, recv, self.group)
        return back[torch.argsort(order)]


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; its backward is the reverse exchange."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],  # noqa: ANN001
        group: Any,
    ) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None
