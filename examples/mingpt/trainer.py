"""minGPT's Trainer, ported to clustersdk.

What changed from the torchrun version: the context replaces the
environment variables, ``.to(local_rank)`` and ``DDP(...)`` (``ctx.prepare``:
DDP or FSDP, as the launch says); ``ctx.shard`` replaces ``DataLoader`` with
a ``DistributedSampler`` (and keeps its position in checkpoints); the loop
over epochs and batches is ``ctx.loop(..., epochs=)``, so pause, suspend,
resume at another world size and stop work between any two steps; snapshot
saving and loading are gone (``ctx.register`` and the launch's
``checkpoint_dir``/``resume``); the evaluation runs through
``ctx.evaluate`` with its loss averaged over every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TrainerConfig:
    max_epochs: int = 10
    batch_size: int = 32  # per rank: the global batch is batch_size * world_size
    data_loader_workers: int = 0
    grad_norm_clip: float = 1.0
    log_every: int = 100


class Trainer:
    def __init__(
        self, ctx, trainer_config: TrainerConfig, model, optimizer, train_dataset, test_dataset=None
    ):
        self.ctx = ctx
        self.config = trainer_config
        self.train_loader = self._prepare_dataloader(train_dataset)
        self.test_loader = self._prepare_dataloader(test_dataset) if test_dataset else None
        self.model = ctx.prepare(model)
        self.optimizer = optimizer
        ctx.register(optimizer=optimizer)

    def _prepare_dataloader(self, dataset):
        return self.ctx.shard(
            dataset,
            batch_size=self.config.batch_size,
            shuffle=False,
            num_workers=self.config.data_loader_workers,
        )

    def _run_batch(self, source, targets, train: bool = True) -> float:
        with torch.set_grad_enabled(train), self.ctx.autocast():
            _, loss = self.model(source, targets)
        if train:
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
            self.optimizer.step()
        return loss.item()

    def _run_eval(self) -> None:
        self.model.eval()
        for source, targets in self.ctx.evaluate(self.test_loader):
            self.ctx.log(eval_loss=self._run_batch(source, targets, train=False), reduce="mean")
        self.model.train()

    def train(self) -> None:
        loop = self.ctx.loop(self.train_loader, epochs=self.config.max_epochs)
        for step, (source, targets) in loop:
            loss = self._run_batch(source, targets)
            self.ctx.log(loss=loss, epoch=self.ctx.epoch)
            if step % self.config.log_every == 0:
                print(
                    f"[rank{self.ctx.rank}] Epoch {self.ctx.epoch} | Step {step} | "
                    f"Train Loss {loss:.5f}"
                )
            if self.test_loader is not None and self.ctx.epoch_end:
                self._run_eval()
