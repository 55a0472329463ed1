"""2-D parallelism: tensor parallel inside each ``tp`` group, FSDP across ``dp``.

``mesh={"dp": 2, "tp": 2}`` on 4 ranks: ranks 0-1 and 2-3 are TP pairs (each
pair splits every planned layer); ranks 0 and 2, and 1 and 3, shard the
TP-split parameters further with FSDP and read different samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from . import fsdp, tensor

if TYPE_CHECKING:
    from ..context import TrainContext
    from . import WrapPolicy


def wrap(
    model: nn.Module, ctx: TrainContext, *, plan: Any = None, policy: WrapPolicy = None
) -> nn.Module:
    mesh = ctx.mesh
    model = tensor.wrap(model, ctx, plan=plan, mesh=mesh["tp"])
    return fsdp.wrap(model, ctx, policy=policy, mesh=mesh["dp"])
