"""How ``ctx.prepare`` wraps a model for each strategy.

=========  ===============================================================  ===========
strategy   what each rank holds                                             module
=========  ===============================================================  ===========
ddp        the whole model; gradients averaged                              ddp.py
fsdp       1/N of every block's parameters (FSDP2 ``fully_shard``)          fsdp.py
fsdp 2-D   mesh ``{"dp", "tp"}``: FSDP over tensor parallel                 hybrid.py
fsdp 3-D   mesh ``{"dp", "tp", "pp"}``: a pipeline stage, TP then FSDP      threed.py
tp         its columns/rows of the planned layers (``parallelize_module``)  tensor.py
pp         a contiguous slice of layers, run by a pipeline schedule         pipeline.py
ep         the dense layers whole, 1/N of every MoE layer's experts         expert.py
none       the model as given, on the rank's device
=========  ===============================================================  ===========

``wrap`` is the seam: it gets the model as the training function built it
and returns what the training function trains. :func:`check` runs the
model-dependent checks, at launch when ``model=`` is given there, else in
``ctx.prepare``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ...layout import Layout
    from ..context import TrainContext

# FSDP's wrap policy: the module classes to shard separately, or a predicate
WrapPolicy = type | tuple[type, ...] | Callable[[torch.nn.Module], bool] | None


def wrap(
    strategy: str,
    model: torch.nn.Module,
    ctx: TrainContext,
    *,
    plan: Any = None,
    policy: WrapPolicy = None,
    stage: bool = False,
) -> torch.nn.Module:
    """``model`` wrapped for ``strategy`` (for ``pp``: this rank's stage, see ``ctx.prepare``)."""
    if strategy == "pp":
        from . import pipeline

        return pipeline.wrap(model, ctx, stage=stage)
    if strategy == "fsdp" and ctx.layout.pipelined:
        from . import threed

        return threed.wrap(model, ctx, plan=plan, policy=policy, stage=stage)
    model = model.to(ctx.device)
    if strategy == "ddp":
        from .ddp import wrap as wrap_ddp

        return wrap_ddp(model, ctx)
    if strategy == "fsdp" and ctx.layout.size("tp") > 1:
        from . import hybrid

        return hybrid.wrap(model, ctx, plan=plan, policy=policy)
    if strategy == "fsdp":
        from . import fsdp

        return fsdp.wrap(model, ctx, policy=policy)
    if strategy == "tp":
        from . import tensor

        return tensor.wrap(model, ctx, plan=plan)
    if strategy == "ep":
        from . import expert

        return expert.wrap(model, ctx)
    return model  # "none": the user wires parallelism themselves


def check(
    layout: Layout, model: torch.nn.Module, *, plan: Any = None, split: list[str] | None = None
) -> None:
    """Raise :class:`~clustersdk.SpecError` if ``model`` can't be laid out as ``layout``.

    Cheap enough for the meta device: it looks at module types and shapes only.
    """
    if layout.size("tp") > 1:
        from . import tensor

        size = layout.size("tp")
        tensor.check(model, tensor.plan_for(model, plan, size), size)
    if layout.pipelined:
        from . import pipeline

        pipeline.stage_names(model, layout.size("pp"), split)
    if layout.strategy == "ep":
        from . import expert

        expert.check(model, layout.size("ep"))
