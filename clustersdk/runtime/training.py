"""Training features that work the same under every strategy.

Mixed precision (autocast; a grad scaler for fp16), gradient clipping that is
correct when parameters are sharded, micro-batches for gradient
accumulation, and the :func:`warmup_cosine` schedule. ``TrainContext`` wires
them into ``ctx.train_step`` / ``ctx.backward`` / ``ctx.optimizer_step``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from ..errors import SpecError

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup: int, total: int, min_ratio: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio`` x lr at ``total``.

    Call ``.step()`` once per optimizer step; register it with ``ctx.register``
    so that a checkpoint holds its position.

    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    >>> sched = warmup_cosine(opt, warmup=2, total=10)
    >>> lrs = []
    >>> for _ in range(11):
    ...     lrs.append(round(sched.get_last_lr()[0], 2)); opt.step(); sched.step()
    >>> lrs
    [0.5, 1.0, 1.0, 0.96, 0.85, 0.69, 0.5, 0.31, 0.15, 0.04, 0.0]
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise SpecError(f"warmup must be a non-negative int (steps), got {warmup!r}")
    if isinstance(total, bool) or not isinstance(total, int) or total <= warmup:
        raise SpecError(f"total must be an int greater than warmup={warmup}, got {total!r}")
    if not 0.0 <= min_ratio <= 1.0:
        raise SpecError(f"min_ratio must be within [0, 1], got {min_ratio!r}")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, _WarmupCosine(warmup, total, min_ratio))


class _WarmupCosine:
    """The multiplier; a class (not a lambda) so LambdaLR's state_dict keeps it."""

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min((step - self.warmup) / (self.total - self.warmup), 1.0)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class Precision:
    """Autocast for ``bf16``/``fp16`` and, for ``fp16``, a grad scaler whose
    overflow check is agreed by all ranks (sharded gradients overflow on some
    ranks only, and every rank must skip the same steps)."""

    def __init__(self, name: str, device: torch.device):
        if name not in PRECISIONS:
            raise SpecError(f"precision must be one of {sorted(PRECISIONS)}, got {name!r}")
        if name == "fp16" and device.type != "cuda":
            raise SpecError(
                f"precision='fp16' needs CUDA (its grad scaler is CUDA-only), but this "
                f"rank runs on {device}; use precision='bf16'"
            )
        self.name, self.device = name, device
        self.dtype = PRECISIONS[name]
        self.scaler = None
        if name == "fp16":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            group = dist.group.WORLD if dist.is_initialized() else None
            self.scaler = ShardedGradScaler(device.type, process_group=group)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss


def split(values: tuple[Any, ...], parts: int) -> list[tuple[Any, ...]]:
    """Cut every tensor in ``values`` into ``parts`` equal pieces along dim 0."""
    if parts == 1:
        return [values]
    sizes = {len(v) for v in values if isinstance(v, torch.Tensor)}
    for size in sizes:
        if size % parts:
            raise SpecError(
                f"grad_accum={parts} must divide this rank's batch of {size} "
                "samples; pick a batch_size that is a multiple of it"
            )
    chunks = [v.chunk(parts) if isinstance(v, torch.Tensor) else (v,) * parts for v in values]
    return [tuple(c[i] for c in chunks) for i in range(parts)]


def clip_grad_norm_(
    parameters: Iterable[torch.nn.Parameter],
    max_norm: float,
    replicated: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Scale gradients in place so that the norm of the *whole model's* gradient is at
    most ``max_norm``; return that norm (same on every rank, same as one process).

    Each rank adds the squares of the gradient elements it holds, divided by
    how many ranks hold the same elements. ``replicated`` ranks hold each
    parameter, whole or in pieces: the world size when every rank has (a
    share of) every parameter, 1 under a pipeline of single ranks, the ranks
    of a stage under 3-D. A plain tensor is a whole copy on each of them; a
    DTensor's pieces are spread over them, so each element is held by
    ``replicated / pieces`` ranks (FSDP over TP: parameters that TP leaves whole
    are copied on every TP peer). One all-reduce adds the parts of all ranks,
    on ``device`` (the rank's; needed when it holds no gradient at all).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    world = dist.get_world_size() if dist.is_initialized() else 1
    if device is None:
        device = _local(grads[0]).device if grads else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float32, device=device)
    for grad in grads:
        local = _local(grad)
        copies = replicated / _shards(grad) if hasattr(grad, "placements") else replicated
        total += local.detach().float().pow(2).sum().to(device) / copies  # CPU-offloaded too
    if world > 1:
        dist.all_reduce(total)
    norm = total.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for grad in grads:
        local = _local(grad).detach()
        local.mul_(coef.to(local.device, local.dtype))
    return norm


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _shards(dtensor: Any) -> int:
    """How many distinct pieces a DTensor is cut into across its mesh."""
    count = 1
    for size, placement in zip(dtensor.device_mesh.shape, dtensor.placements):
        # Shard and its kin (FSDP over TP places a _StridedShard, which is not is_shard())
        if not (placement.is_replicate() or placement.is_partial()):
            count *= size
    return count


class TrainingState:
    """What a checkpoint keeps of the training features: the options the run used
    and the grad scaler's state (its scale and growth tracker)."""

    def __init__(self, options: dict[str, Any], precision: Precision):
        self.options = options
        self.precision = precision

    def state_dict(self) -> dict[str, Any]:
        scaler = self.precision.scaler
        buffer = io.BytesIO()
        torch.save(scaler.state_dict() if scaler is not None else {}, buffer)
        return {"options": json.dumps(self.options, sort_keys=True), "scaler": buffer.getvalue()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        scaler_state = torch.load(io.BytesIO(state["scaler"]), weights_only=False)
        if self.precision.scaler is not None and scaler_state:
            self.precision.scaler.load_state_dict(scaler_state)


@contextlib.contextmanager
def no_grad_sync(model: torch.nn.Module | None, sync: bool) -> Iterator[None]:
    """Turn the data-parallel gradient reduction of ``model`` off (``sync=False``) for
    the backward passes inside, so that inner micro-batches accumulate locally."""
    if sync or model is None:
        yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2, also under 2-D
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    elif hasattr(model, "no_sync"):  # DDP (and expert parallel's dense part)
        with model.no_sync():
            yield
    else:
        yield
