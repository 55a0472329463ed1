"""Optimizers built before ``ctx.prepare``: rebound to the prepared model's parameters.

Strategies that shard (``fsdp``, ``tp``, ``ep``, 2-D) replace a model's
parameters with new ones (DTensors); an optimizer built from the model
before ``ctx.prepare`` (as many scripts do) would hold the old ones, get no
gradients and train nothing, silently. So before any optimizer's first step
(a step pre-hook, and ``ctx.register``, ``ctx.train_step`` and the loop's
start) every parameter of the model as it was is swapped, in place, for the
prepared parameter of the same name; a pipeline stage drops those another
stage holds. The optimizer object stays the same, so an LR scheduler built
on it keeps working. An optimizer that already has state for the old
parameters (it stepped before ``ctx.prepare``) can't be rebound: that is an
error naming the fix. So is an LR scheduler whose optimizer neither is
registered nor stepped in the first step.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from ..errors import SpecError

_local = threading.local()  # the rank thread's Rebinder
_hook_lock = threading.Lock()
_hook_installed = False
_WRAPPERS = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def clean(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (DDP's ``module.`` ...)."""
    for prefix in _WRAPPERS:
        name = name.replace(prefix, "")
    return name


class Rebinder:
    """The parameters ``ctx.prepare`` replaced, and the optimizers already seen."""

    def __init__(self, strategy: str, pipelined: bool | None = None):
        self.strategy = strategy
        # a pipeline stage holds only some of the parameters: the others are dropped
        self.pipelined = strategy == "pp" if pipelined is None else pipelined
        self._old: dict[int, tuple[weakref.ref, str]] = {}  # id -> (the old parameter, its name)
        # weak: a finished job's model must not live on in the thread
        self._new: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._current: set[int] = set()
        self._checked: weakref.WeakSet = weakref.WeakSet()
        self.stepped: weakref.WeakSet = weakref.WeakSet()  # optimizers that stepped...
        self.watching = True  # ...in the first step
        self.notes: list[str] = []

    def before(self, model: torch.nn.Module) -> dict[int, tuple[weakref.ref, str]]:
        """What ``model`` holds before it is wrapped (weakly: FSDP must be able to free it)."""
        return {id(p): (weakref.ref(p), clean(name)) for name, p in model.named_parameters()}

    def after(self, old: dict[int, tuple[weakref.ref, str]], prepared: torch.nn.Module) -> None:
        """``prepared`` is what the model became; rebind on this thread from now on."""
        params = dict(prepared.named_parameters())
        self._current |= {id(p) for p in params.values()}
        self._new.update({clean(name): p for name, p in params.items()})
        self._old.update({i: entry for i, entry in old.items() if i not in self._current})
        self._checked = weakref.WeakSet()  # another model: look at every optimizer again
        _local.rebinder = self
        _install_hook()

    def fix(self, optimizer: Any) -> None:
        """Swap ``optimizer``'s old parameters for the prepared ones (once per optimizer)."""
        if (
            not isinstance(optimizer, torch.optim.Optimizer)
            or optimizer in self._checked
            or not self._new
        ):
            return
        stale = [
            (p, self._old[id(p)][1])
            for group in optimizer.param_groups
            for p in group["params"]
            if id(p) not in self._current and id(p) in self._old and self._old[id(p)][0]() is p
        ]
        if stale:
            self._rebind(optimizer, dict((id(p), name) for p, name in stale), stale)
        self._checked.add(optimizer)

    def _rebind(
        self, optimizer: torch.optim.Optimizer, names: dict[int, str], stale: list[tuple[Any, str]]
    ) -> None:
        kind = type(optimizer).__name__
        if any(p in optimizer.state for p, _ in stale):
            raise SpecError(
                f"the {kind} optimizer holds the parameters the model had before ctx.prepare "
                f"(strategy={self.strategy!r} replaced them, e.g. {stale[0][1]!r}) and has "
                "stepped on them already: build it after model = ctx.prepare(model), from "
                "model.parameters()"
            )
        lost = [name for _, name in stale if name not in self._new]
        if lost and not self.pipelined:
            raise SpecError(
                f"the {kind} optimizer was built before ctx.prepare and holds parameters that "
                f"the prepared model has no counterpart for ({', '.join(lost[:3])}): build it "
                "after model = ctx.prepare(model), from model.parameters()"
            )
        for group in optimizer.param_groups:
            kept, kept_names = [], []
            names_of = group.get("param_names")
            for i, p in enumerate(group["params"]):
                name = names.get(id(p))
                if name is not None:
                    p = self._new.get(name)  # None: another pipeline stage holds it
                if p is not None:
                    kept.append(p)
                    if names_of is not None:
                        kept_names.append(names_of[i])
            group["params"][:] = kept  # in place: some optimizers keep this very list
            if names_of is not None:
                names_of[:] = kept_names
        self.notes.append(
            f"clustersdk: the {kind} optimizer was built before ctx.prepare; its "
            f"{len(stale)} parameter(s) are now the prepared model's (strategy="
            f"{self.strategy!r} replaces parameters)"
        )

    def check_schedulers(self, stateful: dict[str, Any], optimizers: list[Any]) -> None:
        """After the first step: every registered LR scheduler drives an optimizer in use."""
        self.watching = False
        used = set(map(id, optimizers)) | {id(o) for o in self.stepped}
        for key, obj in stateful.items():
            if (
                isinstance(obj, torch.optim.lr_scheduler.LRScheduler)
                and id(obj.optimizer) not in used
            ):
                raise SpecError(
                    f"the LR scheduler registered as {key!r} adjusts an optimizer that is not "
                    "registered and did not step in the first step (built before the one that "
                    "trains?): build the scheduler on the optimizer you step, and register both"
                )


def _pre_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    rebinder = getattr(_local, "rebinder", None)
    if rebinder is not None and rebinder.watching:  # cheap once the first step is over
        rebinder.fix(optimizer)
        rebinder.stepped.add(optimizer)
    elif rebinder is not None and optimizer not in rebinder._checked:  # a new optimizer
        rebinder.fix(optimizer)


def _install_hook() -> None:
    """One global step pre-hook per process; it acts only on threads with a Rebinder."""
    global _hook_installed
    with _hook_lock:
        if not _hook_installed:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            register_optimizer_step_pre_hook(_pre_step)
            _hook_installed = True


def forget() -> None:
    """This thread's job is over."""
    _local.rebinder = None
