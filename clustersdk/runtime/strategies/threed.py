"""3-D parallelism: pipeline stages, each tensor parallel in its ``tp`` group and
FSDP-sharded across ``dp``.

``strategy="fsdp"`` with ``mesh={"dp": 2, "tp": 2, "pp": 2}`` on 8 ranks
(laid out ``pp, dp, tp``, see :mod:`clustersdk.layout`): ranks 0-3 run the
first stage and 4-7 the second; inside a stage, ranks 0-1 and 2-3 are TP
pairs and ranks 0 and 2, 1 and 3 are the FSDP group that reads different
samples. ``{"dp": D, "pp": P}`` (no ``tp``) is FSDP under a pipeline.

Each rank builds its stage the way torchtitan composes the three: cut the
model into stages (:mod:`.pipeline`; the model's ``pipeline_chain()`` or
``split=``), apply the tensor-parallel plan to this stage's layers (the
whole model's ``tp_plan()`` or ``plan=``, restricted to the stage), then
``fully_shard`` its blocks and the stage over ``dp``. The stage keeps the
model's own parameter names, so a 3-D checkpoint loads into any other
layout and back. The pipeline schedule (``ctx.train_step``) runs the
micro-batches; FSDP's gradient reduction waits for the last micro-batch
(``torch.distributed.pipelining`` switches it off for the others).

FSDP keeps the gathered parameters between a stage's forward and backward
unless ``reshard_after_forward=True`` is given: a pipeline runs the forward
of several micro-batches before their backward, and re-gathering for each
would cost an all-gather per micro-batch (torchtitan's default too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from . import fsdp, pipeline, tensor

if TYPE_CHECKING:
    from ..context import TrainContext
    from . import WrapPolicy


def wrap(
    model: nn.Module,
    ctx: TrainContext,
    *,
    plan: Any = None,
    policy: WrapPolicy = None,
    stage: bool = False,
) -> nn.Module:
    """This rank's stage of ``model`` (or ``model`` itself with ``stage=True``), tensor
    parallel over its ``tp`` group and sharded over its ``dp`` group."""
    layout, mesh = ctx.layout, ctx.mesh
    tp = layout.size("tp")
    if tp > 1:  # the plan of the whole model (its tp_plan), before the model is cut
        plan = tensor.plan_for(model, plan, tp)
    if not stage:
        names = pipeline.stage_names(model, layout.size("pp"), ctx.options.get("split"))
        model = pipeline.Stage(model, names[ctx.stage_index])
    model = model.to(ctx.device)
    if tp > 1:
        mine = tensor.restrict(plan, model)
        if mine:  # a stage of embeddings alone has nothing to split
            model = tensor.wrap(model, ctx, plan=mine, mesh=mesh["tp"])
    explicit = ctx.spec.reshard_after_forward
    return fsdp.wrap(
        model,
        ctx,
        policy=policy,
        mesh=mesh["dp"],
        reshard_after_forward=bool(explicit) if explicit is not None else False,
    )
