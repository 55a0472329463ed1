"""What each key of ``job.update`` changes on a rank, planned (and checked) before anything
changes.

The control plane checked the change already (:mod:`clustersdk.hparams`);
the rank checks it again against what only it knows for sure (its optimizers,
its batch), then :class:`~.live.Live` applies the plan on every rank or on none.
A value that is already in place is left out of the plan: a new gang that
repeats the changes so far (restored from a checkpoint, or read from the spec)
changes nothing.

``lr`` and a registered LR scheduler: a scheduler recomputes the learning rate
from its ``base_lrs`` (a ``LambdaLR``, ``warmup_cosine``) or multiplies the
current one (``StepLR``). ``lr=`` therefore sets the schedule's *base* learning
rate, and the current one becomes the new base times the schedule's current
factor (current / old base): the schedule goes on, scaled. Without a scheduler
it is the learning rate itself. Either way, the scheduler's and optimizer's
state hold it, so checkpoints keep it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..hparams import OPTIMIZER_KEYS, SPEC_KEYS, split_key
from ..errors import SpecError

if TYPE_CHECKING:
    from .context import TrainContext


@dataclasses.dataclass
class Change:
    """One key's change on this rank: ``apply()`` carries it out."""

    key: str
    old: Any
    new: Any
    apply: Callable[[], None]


def plan(ctx: TrainContext, changes: dict[str, Any], batch: int | None) -> list[Change]:
    """The changes to make on this rank, in order (values already in place left out);
    a SpecError, before anything changed, for one this rank can't take."""
    out: list[Change | None] = []
    for key, value in changes.items():
        name, group = split_key(key)
        if name in OPTIMIZER_KEYS:
            out.append(_optimizer(ctx, key, name, group, value))
        elif name in SPEC_KEYS:
            out.append(_SPEC[name](ctx, value, batch))
        elif name in ctx.hparams:
            out.append(_hparam(ctx, name, value))
        else:
            raise SpecError(f"job.update({key}=...): this rank has no such key")
    return [c for c in out if c is not None]


def optimizers_info(ctx: TrainContext) -> dict[str, Any]:
    """The registered optimizers' param groups, as plain data (no parameters)."""
    return {name: {"type": type(opt).__name__,
                   "groups": [{k: _plain(v) for k, v in group.items()
                               if k != "params" and _plain(v) is not None}
                              for group in opt.param_groups]}
            for name, opt in _optimizers(ctx)}


# --- the optimizers' keys ------------------------------------------------------------------
def _optimizers(ctx: TrainContext) -> list[tuple[str, torch.optim.Optimizer]]:
    return [(k, o) for k, o in ctx.stateful.items() if isinstance(o, torch.optim.Optimizer)]


def _schedulers(ctx: TrainContext, opt: torch.optim.Optimizer) -> list[Any]:
    return [s for s in ctx.stateful.values()
            if getattr(s, "optimizer", None) is opt and hasattr(s, "base_lrs")]


def _optimizer(ctx: TrainContext, key: str, name: str, group: int | None,
               value: Any) -> Change | None:
    optimizers = _optimizers(ctx)
    if not optimizers:
        raise SpecError(f"job.update({key}=...): no optimizer is registered on rank "
                        f"{ctx.rank}; call ctx.register(optimizer=opt)")
    targets = []  # (optimizer, group index)
    for opt_name, opt in optimizers:
        groups = range(len(opt.param_groups)) if group is None else [group]
        for index in groups:
            if index >= len(opt.param_groups) or name not in opt.param_groups[index]:
                raise SpecError(f"job.update({key}=...): optimizer {opt_name!r} on rank "
                                f"{ctx.rank} has no {name!r} in param group {index}")
            targets.append((opt, index))
    olds = [_current(ctx, opt, index, name) for opt, index in targets]
    new = tuple(value) if name == "betas" else value
    todo = [(t, o) for t, o in zip(targets, olds) if _plain(o) != _plain(new)]
    if not todo:
        return None

    def apply() -> None:
        for (opt, index), _old in todo:
            _set(ctx, opt, index, name, new)

    distinct = {repr(_plain(o)) for o in olds}
    old = _plain(olds[0]) if len(distinct) == 1 else [_plain(o) for o in olds]
    return Change(key, old, _plain(new), apply)


def _current(ctx: TrainContext, opt: torch.optim.Optimizer, index: int, name: str) -> Any:
    """A group's value of ``name``; for ``lr`` under a scheduler, the schedule's base."""
    if name == "lr":
        for sched in _schedulers(ctx, opt):
            return sched.base_lrs[index]
    return opt.param_groups[index][name]


def _set(ctx: TrainContext, opt: torch.optim.Optimizer, index: int, name: str,
         value: Any) -> None:
    group = opt.param_groups[index]
    if name != "lr":
        group[name] = value
        return
    schedulers = _schedulers(ctx, opt)
    lr = float(group["lr"])
    if schedulers:  # the new base, times the schedule's factor now
        base = schedulers[0].base_lrs[index]
        lr = value * (lr / base) if base else value
        for sched in schedulers:
            sched.base_lrs[index] = value
            last = getattr(sched, "_last_lr", None)
            if last is not None and index < len(last):
                last[index] = lr
        if "initial_lr" in group:
            group["initial_lr"] = value
    else:
        lr = value
    if isinstance(group["lr"], torch.Tensor):  # capturable / fused optimizers
        group["lr"].fill_(lr)
    else:
        group["lr"] = lr


# --- the launch options ----------------------------------------------------------------------
def _spec_change(ctx: TrainContext, key: str, old: Any, new: Any,
                 setter: Callable[[], None]) -> Change | None:
    if old == new:
        return None

    def apply() -> None:
        setter()
        ctx.spec = ctx.spec.replace(**{key: new})

    return Change(key, old, new, apply)


def _clip(ctx: TrainContext, value: Any, batch: int | None) -> Change | None:
    steps = ctx._steps
    if value is not None and value != steps.clip and "optimizer_step" not in steps.called:
        raise SpecError("job.update(clip_grad_norm=...): clipping takes effect through "
                        "ctx.optimizer_step or ctx.train_step, which this rank does not call")

    def setter() -> None:
        steps.clip = ctx.options["clip_grad_norm"] = value

    return _spec_change(ctx, "clip_grad_norm", steps.clip, value, setter)


def _accum(ctx: TrainContext, value: int, batch: int | None) -> Change | None:
    steps = ctx._steps
    if value != steps.accum:
        if ctx.strategy == "pp":
            raise SpecError("job.update(grad_accum=...) can't change a pipeline's micro-batches")
        if batch and batch % value:
            raise SpecError(f"job.update(grad_accum={value}): it must divide rank {ctx.rank}'s "
                            f"batch of {batch} samples")
        if value > 1 and "micro_batches" not in steps.called:
            raise SpecError("job.update(grad_accum=...): accumulation takes effect through "
                            "ctx.micro_batches or ctx.train_step, which this rank does not call")

    def setter() -> None:
        steps.accum = ctx.options["grad_accum"] = value

    return _spec_change(ctx, "grad_accum", steps.accum, value, setter)


def _every(ctx: TrainContext, value: int | None, batch: int | None) -> Change | None:
    if ctx._saver is None:
        raise SpecError("job.update(checkpoint_every=...): this job has no checkpoint_dir")

    def setter() -> None:
        ctx._every = value

    return _spec_change(ctx, "checkpoint_every", ctx._every, value, setter)


def _interval(ctx: TrainContext, value: float, batch: int | None) -> Change | None:
    # the agent ships this rank's metrics at the rate of ctx.spec
    return _spec_change(ctx, "metrics_interval", ctx.spec.metrics_interval, value, lambda: None)


_SPEC = {"clip_grad_norm": _clip, "grad_accum": _accum, "checkpoint_every": _every,
         "metrics_interval": _interval}


def _hparam(ctx: TrainContext, key: str, value: Any) -> Change | None:
    old = ctx.hparams[key]
    if old == value and type(old) is type(value):
        return None

    def apply() -> None:
        ctx.hparams[key] = value

    return Change(key, old, value, apply)


def _plain(value: Any) -> Any:
    """A param group's value as JSON-able data (None: not one to report)."""
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 else None
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return None if any(i is None for i in items) else items
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return None
