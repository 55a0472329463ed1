"""Pipeline parallelism: each rank runs a slice of the layers (``torch.distributed.pipelining``).

Splitting. A model can be cut where its ``forward`` is a chain: an
``nn.Sequential``, or a model with a ``pipeline_chain()`` method naming, in
order, the children its ``forward`` applies (like
:class:`clustersdk.models.Transformer`). Stages begin at the ``split=`` names
given to ``cluster.launch``; without them the repeated blocks (the items of a
``ModuleList``) are spread evenly, whatever comes before them going to the
first stage and after them to the last. Each stage keeps the original
parameter names, so checkpoints move freely between pipeline and other
layouts. Or build this rank's stage yourself (see ``ctx.stage_index``) and
pass ``ctx.prepare(stage_module, stage=True)``.

Running. ``ctx.train_step`` feeds the batch to the first stage and the
targets to the last; the schedule (``schedule="gpipe"`` or ``"1f1b"``) cuts
the batch into ``microbatches`` and runs forward and backward of all of them.
Batches may change shape from step to step (token budgets): the schedule then
infers the shapes its stages exchange again, at the cost of one more
micro-batch forward and backward.
The loss is known on the last stage only: ``train_step`` returns it there
and ``None`` elsewhere, and ``ctx.log`` drops ``None`` values, so the job's
history holds one loss per step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from ...errors import SpecError
from ..training import Precision

if TYPE_CHECKING:
    from ..context import TrainContext

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def wrap(model: nn.Module, ctx: TrainContext, *, stage: bool = False) -> nn.Module:
    """This rank's stage of ``model`` (or ``model`` itself with ``stage=True``), on its device."""
    if not stage:
        names = stage_names(model, ctx.layout.size("pp"), ctx.options.get("split"))
        model = Stage(model, names[ctx.stage_index])
    return model.to(ctx.device)


# --- splitting ------------------------------------------------------------------------
def chain(model: nn.Module) -> list[str] | None:
    """The names ``model.forward`` applies in order, or None if it is not a chain."""
    if callable(getattr(model, "pipeline_chain", None)):
        return list(model.pipeline_chain())
    if isinstance(model, nn.Sequential):
        return [name for name, _ in model.named_children()]
    return None


def stage_names(model: nn.Module, stages: int, split: list[str] | None = None) -> list[list[str]]:
    """The chain names of each stage; a clear error if ``model`` can't make ``stages`` stages."""
    what = type(model).__name__
    names = chain(model)
    if names is None:
        raise SpecError(
            f"strategy='pp' can split an nn.Sequential or a model with a pipeline_chain() method "
            f"(like clustersdk.models.Transformer); {what} is neither: build this rank's stage "
            "yourself and pass ctx.prepare(stage_module, stage=True)"
        )
    _check_covered(model, names)
    if split:
        unknown = [s for s in split if s not in names]
        if unknown:
            raise SpecError(f"split point(s) {unknown} are not in {what}'s pipeline chain {names}")
        if len(split) + 1 != stages:
            raise SpecError(
                f"split={list(split)} makes {len(split) + 1} stages, but the pipeline "
                f"has pp={stages} ranks"
            )
        cuts = [names.index(s) for s in split]
        if cuts != sorted(set(cuts)) or cuts[0] == 0:
            raise SpecError(
                f"split={list(split)} must name distinct points in chain order, after {names[0]!r}"
            )
        bounds = [0, *cuts, len(names)]
    else:
        first, end = _blocks(names)
        layers = end - first
        if stages > layers:
            raise SpecError(
                f"a pipeline of pp={stages} stages needs at least {stages} layers, but "
                f"{what} has {layers}"
            )
        counts = [layers // stages + (i < layers % stages) for i in range(stages)]
        bounds, cut = [0], first
        for count in counts[:-1]:
            cut += count
            bounds.append(cut)
        bounds.append(len(names))
    return [names[a:b] for a, b in zip(bounds, bounds[1:])]


def _blocks(names: list[str]) -> tuple[int, int]:
    """Where the repeated blocks are in the chain: the largest run of siblings."""
    parents = Counter(n.rsplit(".", 1)[0] for n in names if "." in n)
    if not parents:
        return 0, len(names)
    parent = parents.most_common(1)[0][0]
    inside = [i for i, n in enumerate(names) if n.rsplit(".", 1)[0] == parent and "." in n]
    return inside[0], inside[-1] + 1


def _check_covered(model: nn.Module, names: list[str]) -> None:
    stray = [
        key
        for key in model.state_dict()
        if not any(key == n or key.startswith(n + ".") for n in names)
    ]
    if stray:
        raise SpecError(
            f"{type(model).__name__}'s pipeline chain leaves out {stray[:5]}: every "
            "parameter must belong to a module of the chain"
        )


class Stage(nn.Module):
    """Some of a chain model's children, under their original names, applied in order."""

    def __init__(self, model: nn.Module, names: list[str]):
        super().__init__()
        self.names = list(names)
        for name in names:
            parent: nn.Module = self
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(parent, part):
                    parent.add_module(part, nn.ModuleDict())
                parent = getattr(parent, part)
            parent.add_module(leaf, model.get_submodule(name))

    def forward(self, x: Any) -> Any:
        for name in self.names:
            x = self.get_submodule(name)(x)
        return x

    def extra_repr(self) -> str:
        return f"names={self.names}"


# --- running --------------------------------------------------------------------------
class Pipeline:
    """This rank's stage under a schedule; :meth:`step` runs one batch through it."""

    def __init__(
        self, stage: nn.Module, ctx: TrainContext, loss_fn: Callable[[Any, Any], torch.Tensor]
    ):
        if loss_fn is None:
            raise SpecError(
                "strategy='pp' computes the loss inside the pipeline: pass "
                "ctx.prepare(model, loss_fn=...) (e.g. clustersdk.models.lm_loss)"
            )
        stages = ctx.layout.size("pp")
        self.microbatches = ctx.options.get("microbatches") or stages
        self.loss_fn = loss_fn
        group = ctx.mesh.get_group("pp") if stages < ctx.world_size else None
        self.stage = PipelineStage(stage, ctx.stage_index, stages, ctx.device, group=group)
        self._kind = SCHEDULES[ctx.options.get("schedule") or "gpipe"]
        self.schedule = self._schedule()
        # the ranks of this stage that read other batches (its FSDP peers under 3-D): they
        # must learn of a new batch shape together (see _follow_shapes)
        self._peers = ctx.mesh.get_group("dp") if ctx.layout.size("dp") > 1 else None
        self._device = ctx.device
        self._shapes: Any = None
        self._computed: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._divide = 1
        self._precision: Precision | None = None

    def _schedule(self) -> Any:
        # grads are scaled by our loss (1 / (microbatches * grad_accum)), not by the schedule,
        # which would divide again at every step of an accumulation
        return self._kind(self.stage, self.microbatches, loss_fn=self._loss, scale_grads=False)

    def _follow_shapes(self, chunks: list[tuple[Any, Any]]) -> None:
        """A fresh schedule when the batch's shapes changed (token-budget batches do).

        A schedule infers the shapes its stages exchange on its first step (running
        a micro-batch forward and backward) and keeps them. Under FSDP that inference
        gathers parameters across ``dp``, whose ranks read other batches: they agree
        (one all-reduce) so that all of them infer again, or none.
        """
        shapes = _shapes(chunks[0])
        changed = self._shapes is not None and shapes != self._shapes
        if self._peers is not None:
            flag = torch.tensor([int(changed)], device=self._device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._peers)
            changed = bool(flag.item())
        if changed:
            self.schedule = self._schedule()
        self._shapes = shapes

    def _loss(self, output: Any, target: Any) -> torch.Tensor:
        loss = self.loss_fn(output, target)
        scaled = loss / self._divide
        if self._precision is not None:
            scaled = self._precision.scale(scaled)
        self._computed.append((scaled, loss.detach()))
        return scaled

    def step(self, chunks: list[tuple[Any, Any]], precision: Precision) -> torch.Tensor | None:
        """Forward and backward of every micro-batch of ``chunks`` (grad accumulation pieces);
        the mean loss on the last stage, None on the others."""
        self._precision, self._divide = precision, self.microbatches * len(chunks)
        self._follow_shapes(chunks)
        losses: list[torch.Tensor] = []
        for inputs, target in chunks:
            size = len(target) if isinstance(target, torch.Tensor) else None
            if size is not None and size % self.microbatches:
                raise SpecError(
                    f"microbatches={self.microbatches} must divide the batch of {size} "
                    "samples each pipeline step gets"
                )
            args = (
                (inputs if isinstance(inputs, tuple) else (inputs,)) if self.stage.is_first else ()
            )
            self._computed, mine = [], []
            with precision.autocast():
                self.schedule.step(
                    *args,
                    target=target if self.stage.is_last else None,
                    losses=mine if self.stage.is_last else None,
                    return_outputs=False,
                )
            # the schedule also calls the loss function to infer shapes, on made-up data:
            # keep the losses of the micro-batches it reports
            real = {id(t) for t in mine}
            losses.extend(raw for scaled, raw in self._computed if id(scaled) in real)
        self._computed = []
        return torch.stack(losses).mean() if self.stage.is_last else None


def _shapes(value: Any) -> list[tuple[int, ...]]:
    """The shapes of the tensors in ``value`` (nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return [tuple(value.shape)]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [shape for item in value for shape in _shapes(item)]
    return []
