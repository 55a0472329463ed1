"""Small reference models and data for examples, tests and notebooks (no downloads).

>>> from clustersdk import models
>>> net = models.Transformer(models.TransformerConfig(n_layers=2))
>>> data = models.SyntheticText(n=256, seq_len=net.config.seq_len, vocab=net.config.vocab)
>>> x, y = data[0]
>>> tuple(net(x[None]).shape)
(1, 16, 64)

``Transformer.tp_plan(tp)`` is the ready tensor-parallel plan for
``strategy="tp"`` and 2-D ``strategy="fsdp", mesh={"dp": ..., "tp": ...}``;
``Transformer.pipeline_chain()`` tells ``strategy="pp"`` where it may split;
``TransformerConfig(n_experts=4)`` makes every block's MLP a mixture of
experts that ``strategy="ep"`` shards over ranks.
"""

from __future__ import annotations

from .data import SyntheticText, lm_loss
from .moe import MoE
from .transformer import Transformer, TransformerConfig

__all__ = ["MoE", "SyntheticText", "Transformer", "TransformerConfig", "lm_loss"]
