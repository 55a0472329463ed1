"""What each key of ``job.update`` changes on a rank, planned (and checked) before anything
changes.

The control plane checked the change already (:mod:`clustersdk.hparams`);
the rank checks it again against what only it knows for sure (its optimizers,
its batch: its :class:`Tunables`), then :class:`~.live.Live` applies the plan on
every rank or on none.
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
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from ..errors import SpecError
from ..hparams import OPTIMIZER_KEYS, SPEC_KEYS, split_key


@dataclasses.dataclass(frozen=True)
class Tunables:
    """What ``job.update`` may change on a rank, and what its checks look at (the rank's
    context makes one when an update comes).

    ``settings`` holds the current value of each launch option an update may change
    (:data:`clustersdk.hparams.SPEC_KEYS`); ``set_option(key, value)`` changes one on
    the rank (and in its spec). ``called`` is the ``ctx`` methods the training function
    called in its first step; ``checkpoints``: the job has a ``checkpoint_dir``.
    """

    rank: int
    stateful: Mapping[str, Any]  # the registered optimizers and LR schedulers
    hparams: dict[str, Any]  # ctx.hparams, changed in place
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    set_option: Callable[[str, Any], None] | None = None
    called: Collection[str] = ()
    pipeline: bool = False
    checkpoints: bool = False


@dataclasses.dataclass
class Change:
    """One key's change on this rank: ``apply()`` carries it out."""

    key: str
    old: Any
    new: Any
    apply: Callable[[], None]


def plan(rank: Tunables, changes: dict[str, Any], batch: int | None) -> list[Change]:
    """The changes to make on this rank, in order (values already in place left out);
    a SpecError, before anything changed, for one this rank can't take."""
    out: list[Change | None] = []
    for key, value in changes.items():
        name, group = split_key(key)
        if name in OPTIMIZER_KEYS:
            out.append(_optimizer(rank, key, name, group, value))
        elif name in SPEC_KEYS:
            out.append(_SPEC[name](rank, value, batch))
        elif name in rank.hparams:
            out.append(_hparam(rank, name, value))
        else:
            raise SpecError(f"job.update({key}=...): this rank has no such key")
    return [c for c in out if c is not None]


def optimizers_info(stateful: Mapping[str, Any]) -> dict[str, Any]:
    """The registered optimizers' param groups, as plain data (no parameters)."""
    return {
        name: {
            "type": type(opt).__name__,
            "groups": [
                {k: _plain(v) for k, v in group.items() if k != "params" and _plain(v) is not None}
                for group in opt.param_groups
            ],
        }
        for name, opt in _optimizers(stateful)
    }


# --- the optimizers' keys ------------------------------------------------------------------
def _optimizers(stateful: Mapping[str, Any]) -> list[tuple[str, torch.optim.Optimizer]]:
    return [(k, o) for k, o in stateful.items() if isinstance(o, torch.optim.Optimizer)]


def _schedulers(stateful: Mapping[str, Any], opt: torch.optim.Optimizer) -> list[Any]:
    return [
        s
        for s in stateful.values()
        if getattr(s, "optimizer", None) is opt and hasattr(s, "base_lrs")
    ]


def _optimizer(rank: Tunables, key: str, name: str, group: int | None, value: Any) -> Change | None:
    optimizers = _optimizers(rank.stateful)
    if not optimizers:
        raise SpecError(
            f"job.update({key}=...): no optimizer is registered on rank "
            f"{rank.rank}; call ctx.register(optimizer=opt)"
        )
    targets = []  # (optimizer, group index)
    for opt_name, opt in optimizers:
        groups = range(len(opt.param_groups)) if group is None else [group]
        for index in groups:
            if index >= len(opt.param_groups) or name not in opt.param_groups[index]:
                raise SpecError(
                    f"job.update({key}=...): optimizer {opt_name!r} on rank "
                    f"{rank.rank} has no {name!r} in param group {index}"
                )
            targets.append((opt, index))
    olds = [_current(rank.stateful, opt, index, name) for opt, index in targets]
    new = tuple(value) if name == "betas" else value
    todo = [(t, o) for t, o in zip(targets, olds) if _plain(o) != _plain(new)]
    if not todo:
        return None

    def apply() -> None:
        for (opt, index), _old in todo:
            _set(rank.stateful, opt, index, name, new)

    distinct = {repr(_plain(o)) for o in olds}
    old = _plain(olds[0]) if len(distinct) == 1 else [_plain(o) for o in olds]
    return Change(key, old, _plain(new), apply)


def _current(stateful: Mapping[str, Any], opt: torch.optim.Optimizer, index: int, name: str) -> Any:
    """A group's value of ``name``; for ``lr`` under a scheduler, the schedule's base."""
    if name == "lr":
        for sched in _schedulers(stateful, opt):
            return sched.base_lrs[index]
    return opt.param_groups[index][name]


def _set(
    stateful: Mapping[str, Any], opt: torch.optim.Optimizer, index: int, name: str, value: Any
) -> None:
    group = opt.param_groups[index]
    if name != "lr":
        group[name] = value
        return
    schedulers = _schedulers(stateful, opt)
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
def _option(rank: Tunables, key: str, new: Any) -> Change | None:
    """The change of launch option ``key`` to ``new`` (None when it is in place already)."""
    set_option = rank.set_option
    if key not in rank.settings or set_option is None:
        raise SpecError(f"job.update({key}=...): this rank has no such launch option")
    old = rank.settings[key]
    if old == new:
        return None
    return Change(key, old, new, lambda: set_option(key, new))


def _clip(rank: Tunables, value: Any, batch: int | None) -> Change | None:
    if (
        value is not None
        and value != rank.settings.get("clip_grad_norm")
        and "optimizer_step" not in rank.called
    ):
        raise SpecError(
            "job.update(clip_grad_norm=...): clipping takes effect through "
            "ctx.optimizer_step or ctx.train_step, which this rank does not call"
        )
    return _option(rank, "clip_grad_norm", value)


def _accum(rank: Tunables, value: int, batch: int | None) -> Change | None:
    if value != rank.settings.get("grad_accum"):
        if rank.pipeline:
            raise SpecError("job.update(grad_accum=...) can't change a pipeline's micro-batches")
        if batch and batch % value:
            raise SpecError(
                f"job.update(grad_accum={value}): it must divide rank {rank.rank}'s "
                f"batch of {batch} samples"
            )
        if value > 1 and "micro_batches" not in rank.called:
            raise SpecError(
                "job.update(grad_accum=...): accumulation takes effect through "
                "ctx.micro_batches or ctx.train_step, which this rank does not call"
            )
    return _option(rank, "grad_accum", value)


def _every(rank: Tunables, value: int | None, batch: int | None) -> Change | None:
    if not rank.checkpoints:
        raise SpecError("job.update(checkpoint_every=...): this job has no checkpoint_dir")
    return _option(rank, "checkpoint_every", value)


def _interval(rank: Tunables, value: float, batch: int | None) -> Change | None:
    # the agent ships this rank's metrics at the rate of ctx.spec
    return _option(rank, "metrics_interval", value)


_SPEC = {
    "clip_grad_norm": _clip,
    "grad_accum": _accum,
    "checkpoint_every": _every,
    "metrics_interval": _interval,
}


def _hparam(rank: Tunables, key: str, value: Any) -> Change | None:
    hparams = rank.hparams
    old = hparams[key]
    if old == value and type(old) is type(value):
        return None

    def apply() -> None:
        hparams[key] = value

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
