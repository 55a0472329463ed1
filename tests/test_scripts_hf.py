"""An unmodified Hugging Face Trainer script as a script job (GPT-2 from a small GPT2Config,
synthetic data, no downloads) at 2 ranks; with ClusterSDKCallback its loss reaches the job's
history at every logging step, a pause holds it, and a suspend makes the Trainer save and
resume from its own checkpoint at the same global step."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import clustersdk as cs
from clustersdk import JobStatus

from .helpers import wait_for

pytest.importorskip("transformers")

HF = str(Path(__file__).resolve().parent / "scripts" / "hf_train.py")


def step_of(job: cs.Job) -> int:
    return max((r["step"] for r in job.history()), default=0)


def test_an_unmodified_trainer_script_finishes_at_2_ranks(idle, tmp_path):
    job = idle.launch_script(
        HF, ["--out", str(tmp_path / "out"), "--steps", "6"], world_size=2, name="hf-plain"
    )
    assert job.wait(timeout=240) == 0
    for rank in range(2):
        assert f"rank {rank} global step 6" in job.logs(rank)
    assert job.history() == []  # without the callback, nothing reaches the charts


def test_with_the_callback_loss_is_charted_pause_holds_and_suspend_resumes(idle, tmp_path):
    out = tmp_path / "out"
    job = idle.launch_script(
        HF,
        ["--out", str(out), "--steps", "24", "--sleep", "0.1", "--callback"],
        world_size=2,
        name="hf-callback",
    )
    wait_for(lambda: step_of(job) >= 3, timeout=180)
    assert sorted(job.info()["controls"]) == ["checkpoint", "pause", "stop", "suspend"]
    paused_at = job.pause(timeout=60)
    time.sleep(0.6)
    assert job.status is JobStatus.PAUSED and step_of(job) == paused_at
    job.resume()
    wait_for(lambda: step_of(job) >= paused_at + 3, timeout=60)
    job.suspend(timeout=120)
    assert job.status is JobStatus.SUSPENDED
    saved = int(re.search(r"checkpoint-(\d+)$", job.info()["checkpoint"]).group(1))
    assert (out / f"checkpoint-{saved}").is_dir()  # the Trainer's own format
    job.resume()
    assert job.wait(timeout=240) == 0
    assert f"resuming from {out / f'checkpoint-{saved}'}" in job.logs(0)
    assert "rank 0 global step 24" in job.logs(0)
    for rank in range(2):
        rows = [r for r in job.history() if r["rank"] == rank and "loss" in r]
        assert [r["step"] for r in rows] == list(range(1, 25))  # every logging step, once
