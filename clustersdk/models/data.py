"""A synthetic next-token dataset that a small model can learn, and its loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class SyntheticText(torch.utils.data.Dataset):
    """``n`` sequences of ``seq_len`` tokens: ``(inputs, targets)`` shifted by one.

    Each sequence counts modulo ``vocab`` from a random start with a random
    stride, so the next token is predictable from the previous two: the loss
    falls quickly, which makes curves in examples worth looking at.

    >>> x, y = SyntheticText(n=4, seq_len=8, vocab=64)[0]
    >>> bool((x[1:] == y[:-1]).all())
    True
    """

    def __init__(self, n: int = 1024, seq_len: int = 16, vocab: int = 64, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        stride = torch.randint(1, 8, (n, 1), generator=g)
        tokens = (start + stride * torch.arange(seq_len + 1)) % vocab
        self.inputs, self.targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index):  # noqa: ANN001 - an int or a list of ints
        return self.inputs[index], self.targets[index]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position of every sequence."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
