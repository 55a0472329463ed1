"""What ``job.update`` may change, and the check of a change before any rank sees it.

Pure (no Dask, no torch). The control plane checks every change against the
job's spec and what its ranks reported about themselves (their optimizers'
parameter groups, their batch, which step helpers the training function
calls: :class:`~clustersdk.protocol.RankEvent` ``TUNABLE``), so that a bad
value is refused with a message that names it, and the job keeps its state
and step. A change that passes is *normalized* into flat keys:

- ``lr``, ``weight_decay``, ``betas``: every parameter group of every registered
  optimizer; ``lr[1]``: group 1 only (``job.update(lr={1: 1e-4})``);
- ``clip_grad_norm``, ``grad_accum``, ``checkpoint_every``, ``metrics_interval``:
  the launch options of the same names (kept in the job's spec from then on);
- any key of the launch's ``hparams={...}``: ``ctx.hparams[key]``.

>>> from clustersdk.protocol import WireSpec
>>> spec = WireSpec(id="j", name="j", world_size=2, hparams={"warmup": 10})
>>> info = {0: {"optimizers": {"optimizer": {"type": "SGD", "groups": [{"lr": 0.1}]}}}}
>>> check({"lr": 0.01, "warmup": 20}, spec, info)
{'lr': 0.01, 'warmup': 20}
>>> check({"lr": -1}, spec, info)
Traceback (most recent call last):
...
clustersdk.errors.SpecError: job.update(lr=-1): lr must be a finite number >= 0
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

from .errors import SpecError

OPTIMIZER_KEYS = ("lr", "weight_decay", "betas")  # set in the optimizers' param groups
SPEC_KEYS = ("clip_grad_norm", "grad_accum", "checkpoint_every", "metrics_interval")
BUILTIN = (*OPTIMIZER_KEYS, *SPEC_KEYS)
HPARAM_TYPES = (bool, int, float, str)  # what launch(hparams=) may hold: JSON scalars

_GROUP_KEY = re.compile(r"^(lr|weight_decay|betas)\[(\d+)\]$")


def split_key(key: str) -> tuple[str, int | None]:
    """``"lr[1]"`` -> ``("lr", 1)``; ``"lr"`` -> ``("lr", None)`` (every group).

    >>> split_key("betas[0]")
    ('betas', 0)
    """
    found = _GROUP_KEY.match(key)
    return (found.group(1), int(found.group(2))) if found else (key, None)


def check_hparams(hparams: Any) -> dict[str, Any] | None:
    """A launch's ``hparams``: a dict of names to JSON scalars, none of them a built-in key.

    >>> check_hparams({"warmup": 100, "label_smoothing": 0.1})
    {'warmup': 100, 'label_smoothing': 0.1}
    """
    if hparams is None:
        return None
    if not isinstance(hparams, Mapping):
        raise SpecError(
            f"hparams must be a dict of names to numbers, strings or booleans, got "
            f"{type(hparams).__name__}"
        )
    out = {}
    for key, value in hparams.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise SpecError(f"hparams: {key!r} is not a valid name (use a Python identifier)")
        if key in BUILTIN:
            raise SpecError(
                f"hparams: {key!r} is a built-in key of job.update (it changes the "
                "optimizers or the launch option of that name); pick another name"
            )
        if not isinstance(value, HPARAM_TYPES) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            raise SpecError(
                f"hparams: {key}={value!r} must be a finite number, a string or a "
                "boolean (job.update checks new values against its type)"
            )
        out[key] = value
    return out


def check(
    changes: Mapping[str, Any],
    spec: Any,
    info: Mapping[int, Mapping[str, Any]] | None,
    *,
    deferred: bool = False,
) -> dict[str, Any]:
    """``changes`` (``job.update``'s keywords) checked and normalized, or a SpecError.

    ``spec`` is the job's :class:`~clustersdk.protocol.WireSpec`; ``info`` what its ranks
    reported (rank -> TUNABLE info; empty or None before any rank has finished a step).
    ``deferred``: the job has run no step yet (QUEUED or STARTING), so what needs the
    ranks' reports is left to the ranks, which check it before their first step.

    >>> from clustersdk.protocol import WireSpec
    >>> check({"lr": 0.01}, WireSpec(id="j", name="j", world_size=1), None, deferred=True)
    {'lr': 0.01}
    """
    if not changes:
        raise SpecError("job.update() needs at least one change, e.g. job.update(lr=1e-3)")
    hparams = spec.hparams or {}
    out: dict[str, Any] = {}
    for key, value in changes.items():
        if key in OPTIMIZER_KEYS:
            out.update(_optimizer_change(key, value, info, deferred))
        elif key in SPEC_KEYS:
            out[key] = _SPEC_CHECKS[key](value, spec, info, deferred)
        elif key in hparams:
            out[key] = _hparam(key, value, hparams[key])
        else:
            mine = ", ".join(sorted(hparams)) or "none: launch(hparams={...}) names them"
            raise SpecError(
                f"job.update({key}=...): unknown key; it changes "
                f"{', '.join(BUILTIN)} and the job's hparams ({mine})"
            )
    return out


def needs_ranks(changes: Mapping[str, Any]) -> bool:
    """Whether checking ``changes`` needs what the ranks report after their first step."""
    return any(k in OPTIMIZER_KEYS or k in ("clip_grad_norm", "grad_accum") for k in changes)


def merge(net: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``net`` with ``changes`` applied after it: a change of every group (``lr``) replaces
    the per-group ones before it (``lr[1]``).

    >>> merge({"lr[1]": 0.1, "warmup": 5}, {"lr": 0.2})
    {'warmup': 5, 'lr': 0.2}
    """
    out = dict(net)
    for key, value in changes.items():
        name, group = split_key(key)
        if group is None and name in OPTIMIZER_KEYS:
            out = {k: v for k, v in out.items() if split_key(k)[0] != name}
        out.pop(key, None)
        out[key] = value
    return out


def spec_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """The launch options among ``changes`` (they go into the job's spec)."""
    return {k: v for k, v in changes.items() if k in SPEC_KEYS}


def describe(changes: Mapping[str, list[Any]]) -> str:
    """``{"lr": [0.01, 0.001]}`` -> ``lr 0.01 → 0.001``."""
    return ", ".join(f"{k} {_show(old)} → {_show(new)}" for k, (old, new) in changes.items())


# --- the checks, per key ------------------------------------------------------------------
def _what(key: str, value: Any) -> str:
    return f"job.update({key}={value!r})"


def _number(key: str, value: Any, *, positive: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        bound = "> 0" if positive else ">= 0"
        raise SpecError(f"{_what(key, value)}: {key} must be a finite number {bound}")
    return float(value)


def _count(key: str, value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise SpecError(f"{_what(key, value)}: {key} must be a positive int ({what})")
    return int(value)


def _betas(key: str, value: Any) -> list[float]:
    ok = (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(
            not isinstance(b, bool) and isinstance(b, numbers.Real) and 0.0 <= b < 1.0
            for b in value
        )
    )
    if not ok:
        raise SpecError(
            f"{_what(key, value)}: betas must be two numbers in [0, 1), e.g. (0.9, 0.999)"
        )
    return [float(b) for b in value]


def _optimizer_value(key: str, value: Any) -> Any:
    return _betas(key, value) if key == "betas" else _number(key, value)


def _optimizer_change(
    key: str, value: Any, info: Mapping[int, Mapping[str, Any]] | None, deferred: bool = False
) -> dict[str, Any]:
    # deferred: no optimizer to check against yet (each rank checks its own)
    optimizers = {} if deferred and not info else _optimizers(key, value, info)
    if isinstance(value, Mapping):  # per group: {group index: value}
        out = {}
        for group, v in value.items():
            index = _group_index(key, value, group)
            for name, opt in optimizers.items():
                count = len(opt["groups"])
                if index >= count:
                    raise SpecError(
                        f"{_what(key, value)}: group {index} does not exist; optimizer "
                        f"{name!r} ({opt.get('type', '?')}) has {count} param group(s), "
                        f"0 to {count - 1}"
                    )
                _has_key(key, value, name, opt, [index])
            out[f"{key}[{index}]"] = _optimizer_value(key, v)
        if not out:
            raise SpecError(f"{_what(key, value)}: name at least one param group")
        return out
    for name, opt in optimizers.items():
        _has_key(key, value, name, opt, range(len(opt["groups"])))
    return {key: _optimizer_value(key, value)}


def _optimizers(
    key: str, value: Any, info: Mapping[int, Mapping[str, Any]] | None
) -> dict[str, Mapping[str, Any]]:
    if not info:
        raise SpecError(
            f"{_what(key, value)}: the ranks report their optimizers after their "
            "first step, and no rank has finished one yet; try again once the "
            "job has run a step"
        )
    optimizers: dict[str, Mapping[str, Any]] = {}
    for rank in sorted(info):  # every rank's (pipeline stages hold different groups)
        for name, opt in (info[rank].get("optimizers") or {}).items():
            known = optimizers.get(name)
            if known is None or len(opt["groups"]) < len(known["groups"]):
                optimizers[name] = opt
    if not optimizers:
        raise SpecError(
            f"{_what(key, value)}: the training function registered no optimizer; "
            "call ctx.register(optimizer=opt) so that job.update can reach it"
        )
    return optimizers


def _group_index(key: str, value: Any, group: Any) -> int:
    if isinstance(group, str) and group.isdigit():
        group = int(group)  # a JSON object's keys are strings
    if isinstance(group, bool) or not isinstance(group, int) or group < 0:
        raise SpecError(
            f"{_what(key, value)}: {group!r} is not a param group index (use "
            f"ints, e.g. {key}={{0: ..., 1: ...}})"
        )
    return group


def _has_key(key: str, value: Any, name: str, opt: Mapping[str, Any], groups: Any) -> None:
    for index in groups:
        held = opt["groups"][index]
        if key not in held:
            raise SpecError(
                f"{_what(key, value)}: optimizer {name!r} ({opt.get('type', '?')}) "
                f"has no {key!r} in param group {index}; it has "
                f"{', '.join(sorted(held))}"
            )


def _calls(info: Mapping[int, Mapping[str, Any]] | None) -> set[str] | None:
    """The step helpers the training function called in its first step (None: unknown)."""
    if not info:
        return None
    return set.intersection(*(set(i.get("calls") or ()) for i in info.values()))


def _clip(value: Any, spec: Any, info: Any, deferred: bool = False) -> float | None:
    if value is None:
        return None
    clip = _number("clip_grad_norm", value, positive=True)
    calls = _calls(info)
    if calls is not None and "optimizer_step" not in calls:
        raise SpecError(
            f"{_what('clip_grad_norm', value)}: clipping takes effect through "
            "ctx.optimizer_step or ctx.train_step, which this training function "
            "does not call"
        )
    return clip


def _accum(value: Any, spec: Any, info: Any, deferred: bool = False) -> int:
    accum = _count("grad_accum", value, "micro-batches per optimizer step")
    if spec.strategy == "pp":
        raise SpecError(
            f"{_what('grad_accum', value)}: under strategy='pp' the pipeline "
            "schedule cuts each batch into its micro-batches, and its number can't "
            "change while the job runs; launch again with grad_accum="
        )
    calls = _calls(info)
    if calls is None and deferred:
        return accum  # each rank checks it against its batch before its first step
    if calls is None:
        raise SpecError(
            f"{_what('grad_accum', value)}: the ranks report their batch after "
            "their first step, and no rank has finished one yet; try again once "
            "the job has run a step"
        )
    if accum > 1 and "micro_batches" not in calls:
        raise SpecError(
            f"{_what('grad_accum', value)}: gradient accumulation takes effect "
            "through ctx.micro_batches or ctx.train_step, which this training "
            "function does not call"
        )
    for rank in sorted(info):
        batch = info[rank].get("batch")
        if batch and batch % accum:
            raise SpecError(
                f"{_what('grad_accum', value)}: grad_accum must divide the batch "
                f"of each rank, and rank {rank}'s is {batch} samples"
            )
    return accum


def _every(value: Any, spec: Any, info: Any, deferred: bool = False) -> int | None:
    if not spec.checkpoint_dir:
        raise SpecError(
            f"{_what('checkpoint_every', value)}: the job has no checkpoint_dir; "
            "launch it with checkpoint_dir=... to checkpoint"
        )
    if value is None:
        return None
    return _count("checkpoint_every", value, "steps between checkpoints")


def _interval(value: Any, spec: Any, info: Any, deferred: bool = False) -> float:
    return _number("metrics_interval", value, positive=True)


_SPEC_CHECKS = {
    "clip_grad_norm": _clip,
    "grad_accum": _accum,
    "checkpoint_every": _every,
    "metrics_interval": _interval,
}


def _hparam(key: str, value: Any, launched: Any) -> Any:
    """``value`` if it has the type of the launch's value (an int is a float too)."""
    kind = type(launched)
    if kind is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not kind or (kind is float and not math.isfinite(value)):
        raise SpecError(
            f"{_what(key, value)}: ctx.hparams[{key!r}] is a {kind.__name__} "
            f"(launched as {launched!r}); give a {kind.__name__}"
        )
    return value


def _show(value: Any) -> str:
    return (
        f"{value:g}"
        if isinstance(value, float)
        else repr(value)
        if isinstance(value, str)
        else str(value)
    )
