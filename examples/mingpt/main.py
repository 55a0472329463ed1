"""minGPT on a local Dask cluster: ``python main.py --world-size 2 --strategy fsdp``.

As in pytorch/examples' distributed/minGPT-ddp, minus torchrun: the cluster
starts the ranks, and this directory travels to them (``working_dir``), so
the script runs unchanged on a remote cluster (``--scheduler tcp://...``).
Run it again with the same ``--checkpoint-dir`` and it resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field

import torch
from char_dataset import CharDataset, DataConfig
from model import GPT, GPTConfig, OptimizerConfig, create_optimizer
from torch.utils.data import random_split
from trainer import Trainer, TrainerConfig

import clustersdk as cs

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Config:
    gpt: GPTConfig = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    opt: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    seed: int = 1337


def get_train_objs(gpt_cfg: GPTConfig, opt_cfg: OptimizerConfig, data_cfg: DataConfig):
    dataset = CharDataset(data_cfg)
    train_len = int(len(dataset) * data_cfg.train_split)
    train_set, test_set = random_split(
        dataset, [train_len, len(dataset) - train_len], generator=torch.Generator().manual_seed(0)
    )
    gpt_cfg = dataclasses.replace(
        gpt_cfg, vocab_size=dataset.vocab_size, block_size=dataset.block_size
    )
    model = GPT(gpt_cfg)
    optimizer = create_optimizer(model, opt_cfg)
    return model, optimizer, train_set, test_set


def train(ctx, cfg: Config) -> dict:
    """The training function every rank runs."""
    torch.manual_seed(cfg.seed)  # every rank builds the same initial weights
    model, optimizer, train_set, test_set = get_train_objs(cfg.gpt, cfg.opt, cfg.data)
    trainer = Trainer(ctx, cfg.trainer, model, optimizer, train_set, test_set)
    trainer.train()
    return {"steps": ctx.step, "epochs": ctx.epoch + 1, "state": ctx.full_state_dict(optimizer)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"])
    parser.add_argument("--epochs", type=int, default=10)
    # outside HERE: this directory is shipped to the workers with every launch
    parser.add_argument(
        "--checkpoint-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "mingpt-runs")
    )
    parser.add_argument("--scheduler", help="a Dask scheduler address (default: a local cluster)")
    args = parser.parse_args(argv)
    cfg = Config(trainer=TrainerConfig(max_epochs=args.epochs))
    cluster = (
        cs.Cluster.connect(args.scheduler)
        if args.scheduler
        else cs.Cluster.local(workers=args.world_size)
    )
    with cluster:
        job = cluster.launch(
            train,
            kwargs={"cfg": cfg},
            world_size=args.world_size,
            strategy=args.strategy,
            working_dir=HERE,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_every=200,
            resume="auto",
            name="mingpt",
        )
        out = job.wait()
        print(f"trained {out['steps']} steps ({out['epochs']} epochs)")


if __name__ == "__main__":
    main()
