"""What a checkpoint holds, taken from (and given back to) a rank's registered objects.

The model and optimizers go through DCP's state-dict API (keys independent of
the wrapper, so any layout can reshard them), every other registered object
through its own ``state_dict()``, and each rank's RNG states (python, numpy,
torch CPU and CUDA) travel inside the DCP checkpoint too, packed as bytes.
"""

from __future__ import annotations

import io
import random
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from ...errors import CheckpointError

# Optimizer state keyed by parameter name, hyperparameters included ("param_groups.<fqn>.lr"):
# pipeline stages hold different parameter groups, which DCP would otherwise store under the
# same list index, once, from one rank.
KEYED = StateDictOptions(flatten_optimizer_state_dict=True)


class Parts(NamedTuple):
    """The registered objects, by how they are saved."""

    model: torch.nn.Module | None
    optimizers: list[torch.optim.Optimizer]
    others: dict[str, Any]  # anything with state_dict/load_state_dict, by name

    @classmethod
    def of(cls, stateful: Mapping[str, Any], skip: tuple[str, ...] | frozenset = ()) -> Parts:
        """``stateful`` (``ctx.stateful``), leaving out the names in ``skip``."""
        optimizers = [o for o in stateful.values() if isinstance(o, torch.optim.Optimizer)]
        others = {
            k: o
            for k, o in stateful.items()
            if k != "model" and k not in skip and not isinstance(o, torch.optim.Optimizer)
        }
        return cls(stateful.get("model"), optimizers, others)

    def state(self, with_optim: bool | None = None) -> dict[str, Any]:
        """What DCP saves and loads. Optimizers are included once they have state:
        DCP initialises an empty optimizer with a zero-gradient step, which would
        change the run (Adam's step count), so a step-0 checkpoint leaves them out."""
        state: dict[str, Any] = {"extra": {k: o.state_dict() for k, o in self.others.items()}}
        if with_optim is None:
            with_optim = bool(self.optimizers) and all(o.state for o in self.optimizers)
        if self.model is not None:
            if with_optim:
                state["model"], state["optim"] = get_state_dict(
                    self.model, self.optimizers, options=KEYED
                )
            else:
                state["model"] = get_model_state_dict(self.model)
        return state

    def load(self, state: dict[str, Any]) -> None:
        """Give the loaded ``state`` (made by :meth:`state`) back to the objects."""
        if "optim" in state:
            set_state_dict(
                self.model,
                self.optimizers,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=KEYED,
            )
        elif self.model is not None:
            set_model_state_dict(self.model, state["model"])
        for key, obj in self.others.items():
            obj.load_state_dict(state["extra"][key])

    def nbytes(self) -> int:
        """About how many bytes one checkpoint takes: parameters, and two more copies
        for each optimizer's state (Adam's moments), estimated without touching it."""
        if self.model is None:
            return 1 << 16
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return params * (1 + 2 * len(self.optimizers)) + (1 << 16)


# --- each rank's random number generators ---------------------------------------------
def rng_state(step: int) -> bytes:
    """This rank's RNG states (and the step), packed for the checkpoint."""
    state: dict[str, Any] = {
        "step": step,
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def restore_rng(packed: bytes) -> None:
    state = torch.load(io.BytesIO(packed), weights_only=False)
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- does a checkpoint fit the job ---------------------------------------------------------
def shapes(
    state: dict[str, Any], *, pipeline: bool, world_size: int, group: Any = None
) -> dict[str, tuple[int, ...] | None]:
    """Key -> shape of what the job holds; a pipeline's stages pool theirs (each
    holds some of the model, the checkpoint all of it): a collective then."""
    ours = {
        k: tuple(v.shape) if isinstance(v, torch.Tensor) else None
        for k, v in flat(state).items()
        if k.startswith(("model.", "optim.state."))
    }
    if pipeline and world_size > 1:
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, ours, group=group)
        ours = {k: v for part in everyone for k, v in part.items()}
    return ours


def check_matches(path: str, ours: dict[str, tuple[int, ...] | None], meta: dict[str, Any]) -> None:
    """Name the keys that the checkpoint lacks, has extra, or holds in another shape."""
    theirs = {k: v for k, v in meta.items() if k.startswith(("model.", "optim.state."))}
    missing = sorted(set(ours) - set(theirs))
    unexpected = sorted(set(theirs) - set(ours))
    mismatched = []
    for key in sorted(set(ours) & set(theirs)):
        mine, saved = ours[key], theirs[key]
        if mine is not None and isinstance(saved, TensorStorageMetadata):
            if mine != tuple(saved.size):
                mismatched.append(f"{key}: checkpoint {tuple(saved.size)}, model {mine}")
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"missing in the checkpoint: {', '.join(missing)}")
        if unexpected:
            parts.append(f"not in the model: {', '.join(unexpected)}")
        if mismatched:
            parts.append(f"shape mismatch: {'; '.join(mismatched)}")
        raise CheckpointError(
            f"checkpoint {path} does not match this job's model — " + " | ".join(parts)
        )


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}
