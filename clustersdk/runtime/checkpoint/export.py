"""The whole model (and an optimizer's state) as plain CPU tensors on rank 0.

What a training function returns at the end (``ctx.full_state_dict``):
sharded parameters (FSDP, TP, 2-D, expert) and their optimizer state are
gathered by DCP's state-dict API; pipeline stages send theirs to rank 0 (under
3-D each stage gathers its shards first, among its own ranks, and one rank of
the stage sends them).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)


def full_state_dict(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    rank: int,
    world_size: int,
    pipeline: bool,
    sends: bool = True,
) -> dict[str, Any] | None:
    """``{"model": ..., "optim": ...}`` on rank 0, None on the others (all must call it).

    ``sends``: under a pipeline, whether this rank sends its stage to rank 0 (one rank
    per stage need: the others hold the same whole tensors).
    """
    if not pipeline:
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = {"model": get_model_state_dict(model, options=full)}
        if optimizer is not None:
            state["optim"] = get_optimizer_state_dict(model, optimizer, options=full)
        return state if rank == 0 else None
    # whole tensors on every rank of the stage (a collective among them when it is sharded)
    whole = StateDictOptions(full_state_dict=True)
    state = {"model": _to_cpu(get_model_state_dict(model, options=whole))}
    if optimizer is not None:
        state["optim"] = _to_cpu(get_optimizer_state_dict(model, optimizer, options=whole))
    if world_size == 1:
        return state
    parts: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(state if sends else None, parts, dst=0)
    return _merge_stages([p for p in parts if p is not None]) if parts is not None else None


def _merge_stages(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {"model": {}}
    for part in parts:
        merged["model"].update(part["model"])
    if "optim" in parts[0]:
        groups = [dict(g, params=[]) for g in parts[0]["optim"]["param_groups"]]
        state: dict[str, Any] = {}
        for part in parts:
            state.update(part["optim"]["state"])
            for mine, theirs in zip(groups, part["optim"]["param_groups"]):
                mine["params"].extend(theirs["params"])
        merged["optim"] = {"state": state, "param_groups": groups}
    return merged


def _to_cpu(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_to_cpu(v) for v in tree]
    return tree
