"""Where a resumed job starts: the checkpoint it loads, and data positions read early.

``ctx.shard`` restores its loader's position as soon as the loader is made
(not at the loop's first step, with everything else), so that ``len()`` and
anything computed from it before the loop (``steps = epochs * len(loader)``)
are right at any world size.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from .. import checkpoint_files
from .checkpoint.storage import storage


def resolve(resume: str | None, root: str, world_size: int, group: Any) -> str | None:
    """The checkpoint to load: ``resume`` itself, or for ``"auto"`` the newest committed one
    under ``root`` (rank 0's choice: every rank must load the same one). Every rank calls it."""
    if resume != "auto":
        return resume
    path = checkpoint_files.latest(root)
    if world_size > 1:
        chosen = [path]
        dist.broadcast_object_list(chosen, src=0, group=group)
        path = chosen[0]
    return path


def saved_state(path: str, key: str, template: dict[str, Any]) -> dict[str, Any] | None:
    """What the checkpoint at ``path`` holds for the registered object ``key`` (its keys as
    in ``template``), read by this process alone; None if it holds nothing for ``key``."""
    reader = storage(path).reader(path)
    prefix = f"extra.{key}."
    present = {
        name[len(prefix) :]
        for name in reader.read_metadata().state_dict_metadata
        if name.startswith(prefix)
    }
    wanted = {k: v for k, v in template.items() if k in present}
    if not wanted:
        return None
    state = {"extra": {key: wanted}}
    with warnings.catch_warnings():  # DCP warns that this is one process: that is the point
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state["extra"][key]
