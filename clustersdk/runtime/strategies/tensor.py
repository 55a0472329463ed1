"""Tensor parallelism: layers split by column or row over the ``tp`` ranks.

A plan maps module names (``*`` matches one level, as in
``parallelize_module``) to ``"colwise"``, ``"rowwise"`` or any
``ParallelStyle``. It comes from ``plan=`` (of ``cluster.launch`` or
``ctx.prepare``) or from the model's ``tp_plan(tp)`` method (given the number
of ranks, it may refuse with a ``SpecError``), like the one of
:class:`clustersdk.models.Transformer`.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from ...errors import SpecError

if TYPE_CHECKING:
    from ..context import TrainContext

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def wrap(model: nn.Module, ctx: TrainContext, *, plan: Any = None, mesh: Any = None) -> nn.Module:
    plan = plan_for(model, plan, ctx.layout.size("tp"))  # checked by ctx.prepare already
    mesh = mesh if mesh is not None else ctx.mesh
    return parallelize_module(model, mesh, {k: style(v) for k, v in plan.items()})


def plan_for(model: nn.Module, plan: Any, size: int) -> dict[str, Any]:
    """The plan given, else the model's own; a clear error when there is none."""
    if plan is None and callable(getattr(model, "tp_plan", None)):
        plan = model.tp_plan(size)
    if not plan:
        raise SpecError(
            f"tensor parallelism needs a plan, but {type(model).__name__} has no tp_plan(tp) method "
            "and no plan= was given; pass plan={'layer.name': 'colwise' | 'rowwise', ...} to "
            "cluster.launch or ctx.prepare"
        )
    if not isinstance(plan, dict):
        raise SpecError(
            f"a tensor-parallel plan must be a dict of module name -> style, got "
            f"{type(plan).__name__}"
        )
    for key, value in plan.items():
        style(value, key)
    return plan


def restrict(plan: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """The entries of ``plan`` that name some module of ``model`` (a pipeline stage holds
    only some of the layers the whole model's plan names)."""
    names = [name for name, _ in model.named_modules()]
    return {key: value for key, value in plan.items() if any(_matches(name, key) for name in names)}


def style(value: Any, key: str = "") -> ParallelStyle:
    if isinstance(value, ParallelStyle):
        return value
    if value in STYLES:
        return STYLES[value]()
    raise SpecError(f"plan[{key!r}] = {value!r}: use 'colwise', 'rowwise' or a ParallelStyle")


def check(model: nn.Module, plan: dict[str, Any], size: int) -> None:
    """Every plan entry names some module, and the split dimension divides by ``size``."""
    modules = dict(model.named_modules())
    for key, value in plan.items():
        matched = [name for name in modules if _matches(name, key)]
        if not matched:
            raise SpecError(f"plan entry {key!r} matches no module of {type(model).__name__}")
        kind = value if isinstance(value, str) else type(value).__name__
        for name in matched:
            dim = _split_dim(modules[name], kind)
            if dim is not None and dim % size:
                raise SpecError(
                    f"{name} ({kind}) splits a dimension of {dim}, which does not "
                    f"divide over tp={size} ranks"
                )


def _matches(name: str, pattern: str) -> bool:
    parts, want = name.split("."), pattern.split(".")
    return len(parts) == len(want) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, want))


def _split_dim(module: nn.Module, kind: str) -> int | None:
    column = kind in ("colwise", "ColwiseParallel")
    row = kind in ("rowwise", "RowwiseParallel")
    if isinstance(module, nn.Linear):
        return module.out_features if column else module.in_features if row else None
    if isinstance(module, nn.Embedding):
        return module.embedding_dim if column else module.num_embeddings if row else None
    return None
