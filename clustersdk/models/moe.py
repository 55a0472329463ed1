"""A top-1 mixture-of-experts MLP whose experts can live on other ranks.

The experts' weights are stacked (``w1``: ``(experts, d_model, hidden)``,
``w2``: ``(experts, hidden, d_model)``), so that expert parallelism is a
``Shard(0)`` of two tensors: checkpoints keep the same keys and shapes at
every layout, and DCP reshards them like any other DTensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

# (tokens, expert of each token, the layer) -> expert outputs, in token order
Dispatch = Callable[[torch.Tensor, torch.Tensor, "MoE"], torch.Tensor]


class MoE(nn.Module):
    """Each token goes to the expert its router scores highest, scaled by that score.

    Without ``dispatch`` every expert is local. ``strategy="ep"`` shards
    ``w1``/``w2`` over ranks and sets ``dispatch`` to an all-to-all exchange
    (:mod:`clustersdk.runtime.strategies.expert`).
    """

    def __init__(self, d_model: int, hidden: int, n_experts: int):
        super().__init__()
        self.n_experts = n_experts
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(n_experts, d_model, hidden))
        self.w2 = nn.Parameter(torch.empty(n_experts, hidden, d_model))
        nn.init.uniform_(self.w1, -1 / math.sqrt(d_model), 1 / math.sqrt(d_model))
        nn.init.uniform_(self.w2, -1 / math.sqrt(hidden), 1 / math.sqrt(hidden))
        self.dispatch: Dispatch | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        gate, expert = self.router(tokens).softmax(-1).max(-1)
        if self.dispatch is None:
            out = self.run_local(tokens, expert, _local(self.w1), _local(self.w2), first=0)
        else:
            out = self.dispatch(tokens, expert, self)
        return (out * gate.unsqueeze(-1)).reshape(x.shape)

    @staticmethod
    def run_local(
        tokens: torch.Tensor, expert: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, first: int
    ) -> torch.Tensor:
        """Apply experts ``first .. first + len(w1) - 1`` to the tokens routed to them."""
        order = torch.argsort(expert, stable=True)
        counts = torch.bincount(expert - first, minlength=w1.shape[0]).tolist()
        pieces = torch.split(tokens[order], counts)
        out = torch.cat([F.gelu(p @ w1[e]) @ w2[e] for e, p in enumerate(pieces)])
        return out[torch.argsort(order)]  # back to token order


def _local(weight: torch.Tensor) -> torch.Tensor:
    """The rank's own rows of a (possibly sharded) expert weight."""
    to_local = getattr(weight, "to_local", None)
    return to_local() if to_local is not None else weight
