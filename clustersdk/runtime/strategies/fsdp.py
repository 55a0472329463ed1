"""FSDP2: every rank holds 1/N of each parameter; blocks are gathered just in time.

``fully_shard`` is applied to each block (so that only one block is whole at
a time), then to the root. Which modules are blocks is the wrap policy:

- default: the items of every ``nn.ModuleList``/``nn.ModuleDict`` (a
  transformer's layers); if there are none and the model is an
  ``nn.Sequential``, each child with parameters;
- ``ctx.prepare(model, wrap=Block)`` (classes) or ``wrap=lambda m: ...``
  (a predicate) to choose yourself.

Every rank must build the same initial weights (seed the model, as the
reference models do): each rank keeps its own slice of what it built, and
nothing is broadcast from rank 0 as DDP does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

if TYPE_CHECKING:
    from ..context import TrainContext
    from . import WrapPolicy


def wrap(
    model: nn.Module,
    ctx: TrainContext,
    *,
    policy: WrapPolicy = None,
    mesh: Any = None,
    reshard_after_forward: bool | None = None,
) -> nn.Module:
    """Shard ``model`` over ``mesh`` (default: the job's); ``reshard_after_forward``
    overrides the job's option (default True)."""
    mesh = mesh if mesh is not None else ctx.mesh
    if reshard_after_forward is None:
        reshard_after_forward = ctx.options.get("reshard_after_forward", True)
    options = {
        "mesh": mesh,
        "reshard_after_forward": reshard_after_forward,
        # pinned memory needs an accelerator; on a CPU rank offloading is a no-op anyway
        "offload_policy": (
            CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda")
            if ctx.options.get("cpu_offload")
            else OffloadPolicy()
        ),
    }
    for block in blocks(model, policy):
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def blocks(model: nn.Module, policy: WrapPolicy = None) -> list[nn.Module]:
    """The modules to shard separately, innermost first (``fully_shard`` needs that order)."""
    modules = [m for m in model.modules() if m is not model]
    if policy is None:
        chosen = [
            m
            for parent in modules
            if isinstance(parent, (nn.ModuleList, nn.ModuleDict))
            for m in parent.children()
        ]
        if not chosen and isinstance(model, nn.Sequential):
            chosen = [m for m in model.children() if any(True for _ in m.parameters())]
    elif isinstance(policy, type) or (
        isinstance(policy, tuple) and all(isinstance(c, type) for c in policy)
    ):
        chosen = [m for m in modules if isinstance(m, policy)]
    elif callable(policy):
        chosen = [m for m in modules if policy(m)]
    else:
        from ...errors import SpecError

        raise SpecError(f"wrap= must be module classes or a predicate on modules, got {policy!r}")
    order = {id(m): i for i, m in enumerate(modules)}
    return sorted({id(m): m for m in chosen}.values(), key=lambda m: -order[id(m)])
