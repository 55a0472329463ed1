"""``python -m clustersdk demo``: a local cluster trains a small model with DDP.

The training function lives in this module so that the workers import it by
name, as they would any function of an installed package.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from typing import Any

import torch
from torch import nn


def spirals(n: int = 4096, classes: int = 3, seed: int = 0) -> torch.utils.data.TensorDataset:
    """Interleaved noisy spirals: small, made on the spot, not linearly separable."""
    g = torch.Generator().manual_seed(seed)
    per = n // classes
    r = torch.linspace(0.1, 1.0, per).repeat(classes)
    label = torch.arange(classes).repeat_interleave(per)
    theta = (
        label * (2 * math.pi / classes)
        + r * 3 * math.pi
        + 0.2 * torch.randn(per * classes, generator=g)
    )
    x = torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=1)
    return torch.utils.data.TensorDataset(x, label)


def classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(2, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 3)
    )


def train(ctx, steps: int = 400, batch_size: int = 64, lr: float = 3e-3) -> dict[str, Any]:
    """The demo's training function: DDP over ``ctx.world_size`` ranks."""
    model = ctx.prepare(classifier())
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ctx.register(optimizer=opt)
    data = spirals()
    for _step, (x, y) in ctx.loop(ctx.shard(data, batch_size=batch_size), steps=steps):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.log(loss=loss)
    with torch.no_grad():
        x, y = data.tensors
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    return {"accuracy": accuracy, "final_loss": loss.item(), "steps": ctx.step}


def run(workers: int = 2, steps: int = 2000, state_dir: str | None = None) -> dict[str, Any]:
    """Bring up a local cluster, train with a live progress bar, print a summary (a plain
    progress line where tqdm, the ``demo`` extra, is not installed)."""
    import dask.config

    import clustersdk as cs

    dask.config.set({"distributed.logging.distributed": "error"})
    with tempfile.TemporaryDirectory(prefix="clustersdk-demo-") as tmp:
        print(f"Starting a local cluster with {workers} worker(s)...", flush=True)
        t0 = time.perf_counter()
        with cs.Cluster.local(workers=workers, state_dir=state_dir or tmp) as cluster:
            print(f"  {cluster!r} up in {time.perf_counter() - t0:.1f} s", flush=True)
            bar = _bar(total=steps, desc=f"DDP on {workers} ranks")
            launched = time.time()
            job = cluster.launch(train, kwargs={"steps": steps}, world_size=workers, name="demo")
            job.on_event(lambda msg: _progress(bar, msg, launched))
            result = job.wait()
            bar.update(steps - bar.n)
            bar.close()
            rows = [r for r in job.history() if r["rank"] == 0]
    summary = _summary(result, rows, launched)
    for key, value in summary.items():
        print(f"  {key:<22} {value}")
    return summary


def _bar(total: int, desc: str) -> Any:
    """tqdm's progress bar, or a :class:`_Line` and the hint to install tqdm."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        print("  (pip install 'clustersdk[demo]' for a progress bar)", flush=True)
        return _Line(total, desc)
    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)


class _Line:
    """What the demo uses of a tqdm bar, printed as a line at most every 2 s."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.n = total, desc, 0
        self.postfix: dict[str, Any] = {}
        self._shown = 0.0

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        self.postfix = values

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._shown >= 2.0 or self.n >= self.total:
            self._shown = time.monotonic()
            extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
            print(f"  {self.desc}: step {self.n}/{self.total}{extra}", flush=True)

    def close(self) -> None:
        pass


def _progress(bar: Any, msg: dict[str, Any], launched: float) -> None:
    rows = [r for r in msg.get("rows", ()) if r["rank"] == 0]
    if not rows:
        return
    last = rows[-1]
    rate = (last["step"] + 1) / max(last["time"] - launched, 1e-9)
    bar.set_postfix(loss=f"{last['scalars']['loss']:.4f}", steps_per_s=f"{rate:.0f}", refresh=False)
    bar.update(last["step"] + 1 - bar.n)


def _summary(result: dict[str, Any], rows: list[dict[str, Any]], launched: float) -> dict[str, str]:
    times = [r["time"] for r in rows]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {
        "steps": str(result["steps"]),
        "final loss": f"{result['final_loss']:.4f}",
        "train accuracy": f"{result['accuracy']:.1%}",
        "launch to first step": f"{(times[0] - launched) * 1000:.0f} ms",
        "steps/s (median)": f"{1 / statistics.median(gaps):.0f}" if gaps else "n/a",
        "wall time": f"{times[-1] - launched:.2f} s",
    }
