"""Characters of a text file as (input, next-character target) blocks, as in minGPT."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset


@dataclass
class DataConfig:
    path: str = "data/input.txt"
    block_size: int = 32
    train_split: float = 0.9
    truncate: float = 1.0  # the share of the text to use


class CharDataset(Dataset):
    """Every position of the text starts a sample: ``block_size`` characters and the
    same shifted by one."""

    def __init__(self, config: DataConfig):
        with open(config.path, encoding="utf-8") as f:
            text = f.read()
        text = text[: int(len(text) * config.truncate)]
        chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(chars)}
        self.itos = dict(enumerate(chars))
        self.vocab_size = len(chars)
        self.block_size = config.block_size
        self.data = torch.tensor([self.stoi[ch] for ch in text], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.data) - self.block_size

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[idx : idx + self.block_size + 1]
        return chunk[:-1], chunk[1:]
