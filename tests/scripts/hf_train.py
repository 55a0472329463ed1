"""A Hugging Face Trainer script as people write them: GPT-2 from a small GPT2Config,
synthetic data, no downloads; it resumes from its own newest checkpoint as HF's example
scripts do. --callback adds the one line clustersdk asks for (ClusterSDKCallback)."""

from __future__ import annotations

import argparse
import os
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 256, length: int = 16, vocab: int = 128):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Slow(TrainerCallback):
    """Steps as long as a real model's, so that a test can act mid-run."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--callback", action="store_true")
    a = parser.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    )
    args = TrainingArguments(
        output_dir=a.out,
        max_steps=a.steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
    )
    callbacks: list = [Slow(a.sleep)] if a.sleep else []
    if a.callback:
        from clustersdk.integrations.huggingface import ClusterSDKCallback

        callbacks.append(ClusterSDKCallback())
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)
    last = get_last_checkpoint(a.out) if os.path.isdir(a.out) else None
    if last:
        print(f"resuming from {last}", flush=True)
    trainer.train(resume_from_checkpoint=last)
    print(f"rank {os.environ.get('RANK')} global step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
