"""A small decoder-only transformer, written to be sharded every way clustersdk knows.

Its ``forward`` applies its top-level children in order (``embed``, each of
``layers``, ``norm``, ``head``), so a pipeline can cut it between any two of
them while every parameter keeps its name; attention finds its number of
heads from the width it is given, so column-sharded ``q``/``k``/``v`` work
unchanged under tensor parallelism.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SpecError
from .moe import MoE


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes of the reference :class:`Transformer` (defaults: ~45k parameters)."""

    vocab: int = 64
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    seq_len: int = 16
    mlp_ratio: int = 4
    n_experts: int = 0  # > 0: each block's MLP is a top-1 mixture of this many experts
    seed: int = 0  # the same seed builds the same weights on every rank

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise SpecError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")


class Embedding(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.tokens = nn.Embedding(config.vocab, config.d_model)
        self.positions = nn.Embedding(config.seq_len, config.d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[-1], device=ids.device)
        return self.tokens(ids) + self.positions(positions)


class Attention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        d = config.d_model
        self.head_dim = d // config.n_heads
        self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism this rank holds only some of them
        q, k, v = (
            p(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
            for p in (self.q, self.k, self.v)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.fc2 = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attn = Attention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        if config.n_experts:
            self.mlp: nn.Module = MoE(
                config.d_model, config.mlp_ratio * config.d_model, config.n_experts
            )
        else:
            self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """Decoder-only language model: token ids ``(batch, seq)`` to logits ``(batch, seq, vocab)``.

    >>> net = Transformer(TransformerConfig(n_layers=4))
    >>> net.pipeline_chain()[:3]
    ['embed', 'layers.0', 'layers.1']
    """

    def __init__(self, config: TransformerConfig | None = None, **sizes: int):
        super().__init__()
        config = dataclasses.replace(config or TransformerConfig(), **sizes)
        self.config = config
        with torch.random.fork_rng(devices=[]):  # deterministic, and the caller's RNG untouched
            torch.manual_seed(config.seed)
            self.embed = Embedding(config)
            self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
            self.norm = nn.LayerNorm(config.d_model)
            self.head = nn.Linear(config.d_model, config.vocab, bias=False)
            for name, p in self.named_parameters():
                if name.startswith("embed."):
                    nn.init.normal_(p, std=0.3)
                elif name == "head.weight":
                    nn.init.normal_(p, std=1 / math.sqrt(config.d_model))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))

    def pipeline_chain(self) -> list[str]:
        """The children ``forward`` applies in order: where ``strategy="pp"`` may cut."""
        return ["embed", *(f"layers.{i}" for i in range(len(self.layers))), "norm", "head"]

    def tp_plan(self, tp: int) -> dict[str, str]:
        """Megatron-style tensor parallelism over ``tp`` ranks: heads and MLP columns split.

        ``q``, ``k``, ``v`` and ``fc1`` are split by output column (each rank
        computes some heads / hidden units), ``o`` and ``fc2`` by input row,
        so each block needs one all-reduce forward and one backward.
        Embeddings, norms and the head stay replicated.
        """
        if self.config.n_experts:
            raise SpecError(
                "the reference Transformer has no tensor-parallel plan for "
                "mixture-of-experts blocks; use strategy='ep' for them"
            )
        if self.config.n_heads % tp:
            raise SpecError(
                f"n_heads={self.config.n_heads} attention heads can't be split over tp={tp} ranks"
            )
        return {
            "layers.*.attn.q": "colwise",
            "layers.*.attn.k": "colwise",
            "layers.*.attn.v": "colwise",
            "layers.*.attn.o": "rowwise",
            "layers.*.mlp.fc1": "colwise",
            "layers.*.mlp.fc2": "rowwise",
        }
