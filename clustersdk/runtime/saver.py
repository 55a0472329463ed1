"""Saving and restoring what a rank registered, with torch.distributed.checkpoint.

A checkpoint holds the model and optimizers (through DCP's state-dict API, so
that keys do not depend on the wrapper and can be resharded), every other
registered object's ``state_dict()``, the data position of ``ctx.shard``, the
step, and per rank the RNG states of python, numpy and torch (CPU and CUDA).
"""

from __future__ import annotations

import concurrent.futures
import copy
import errno
import io
import os
import random
import shutil
import threading
from typing import TYPE_CHECKING, Any, Callable, Collection

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from ..protocol import RankEvent
from . import checkpoint as ckpt
from .checkpoint import CheckpointError

if TYPE_CHECKING:
    from .context import TrainContext


BACKGROUND_NICE = 10  # checkpoint threads yield the CPU to training (Linux, per thread)


def _background() -> None:
    """Lower the calling thread's CPU priority (where the OS has per-thread nice)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):  # not Linux, or not allowed: no harm
        pass


class _CpuStager(AsyncStager):
    """Copies a CPU state dict in one lower-priority background thread, so that the
    ranks' own threads keep the cores while a save is staged."""

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self._copy = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                                  use_async_staging=False,
                                                  use_non_blocking_copy=False))
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="clustersdk-staging", initializer=_background)

    def stage(self, state_dict: dict[str, Any]) -> concurrent.futures.Future:
        return self._pool.submit(self._copy.stage, state_dict)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._copy.close()


# Optimizer state keyed by parameter name, hyperparameters included ("param_groups.<fqn>.lr"):
# pipeline stages hold different parameter groups, which DCP would otherwise store under the
# same list index, once, from one rank.
_KEYED = StateDictOptions(flatten_optimizer_state_dict=True)


class _Writer(dcp.FileSystemWriter):
    """DCP's file writer, fsyncing files, with the fault points the tests use."""

    def set_up_storage_writer(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        if threading.current_thread().name.startswith("AsyncCheckpointExecutor"):
            _background()  # DCP's upload thread of an async save (never a rank's own thread)
        super().set_up_storage_writer(*args, **kwargs)

    def write_data(self, plan, planner):  # noqa: ANN001 - DCP's own types
        future = super().write_data(plan, planner)
        future.wait()
        ckpt.fault("data")
        return future

    def finish(self, metadata, results) -> None:  # noqa: ANN001
        super().finish(metadata, results)
        ckpt.fault("metadata")


class Saver:
    """One job's checkpoints on one rank: at most one save in flight."""

    def __init__(self, ctx: TrainContext, root: str, keep: int, group: Any,
                 report: Callable[..., None]):
        self.ctx = ctx
        self.root = root
        self.keep = keep
        self.group = group
        self.report = report
        self._saves = 0
        self._inflight: threading.Event | None = None
        self.last_step: int | None = None
        # An async save copies ("stages") the tensors in a background thread while
        # the next step computes; whatever would change them waits for the copy.
        self._stager: AsyncStager | None = None
        self._staging: concurrent.futures.Future | None = None
        self._gated: set[int] = set()  # ids of the modules and optimizers hooked

    # --- what is saved -----------------------------------------------------------------
    def _parts(self) -> tuple[torch.nn.Module | None, list[torch.optim.Optimizer], dict[str, Any]]:
        stateful = self.ctx.stateful
        model = stateful.get("model")
        optimizers = [o for o in stateful.values() if isinstance(o, torch.optim.Optimizer)]
        others = {k: o for k, o in stateful.items()
                  if k != "model" and not isinstance(o, torch.optim.Optimizer)}
        return model, optimizers, others

    def state(self, with_optim: bool | None = None) -> dict[str, Any]:
        """What DCP saves and loads. Optimizers are included once they have state:
        DCP initialises an empty optimizer with a zero-gradient step, which would
        change the run (Adam's step count), so a step-0 checkpoint leaves them out."""
        model, optimizers, others = self._parts()
        state: dict[str, Any] = {"extra": {k: o.state_dict() for k, o in others.items()}}
        if with_optim is None:
            with_optim = bool(optimizers) and all(o.state for o in optimizers)
        if model is not None:
            if with_optim:
                state["model"], state["optim"] = get_state_dict(model, optimizers, options=_KEYED)
            else:
                state["model"] = get_model_state_dict(model)
        return state

    def rank_state(self) -> dict[str, Any]:
        state = {"step": self.ctx.step, "python": random.getstate(), "torch": torch.get_rng_state()}
        try:
            import numpy as np

            state["numpy"] = np.random.get_state()
        except ImportError:
            pass
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def nbytes(self) -> int:
        """About how many bytes one checkpoint takes: parameters, and two more copies
        for each optimizer's state (Adam's moments), estimated without touching it."""
        model, optimizers, _ = self._parts()
        if model is None:
            return 1 << 16
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        return params * (1 + 2 * len(optimizers)) + (1 << 16)

    # --- saving ------------------------------------------------------------------------
    def save(self, seq: int, blocking: bool) -> None:
        """Checkpoint the current step; async unless ``blocking``. Rank 0 commits."""
        self.wait()
        step = self.ctx.step
        if self.last_step == step:
            if self.ctx.rank == 0:
                self.report(RankEvent.CHECKPOINT, step=step, path=ckpt.step_dir(self.root, step), seq=seq)
            return
        self._saves += 1
        # The rows this rank logged before this step reach the journal before the
        # checkpoint can commit (rank 0 commits after every rank entered the save):
        # a restart from it then finds each earlier step's row, even from a rank that
        # dies right after.
        self.report(RankEvent.METRICS)
        # Everything goes through DCP, this rank's RNG states included, so that a
        # failure on any rank (a full disk...) reaches every rank as one
        # CheckpointException and all of them carry on alike.
        tmp = ckpt.tmp_dir(self.root, step, f"{self.ctx.job[:8]}{self._saves}")
        writer = _Writer(tmp, sync_files=True, thread_count=2)
        state = self.state()
        state["ranks"] = {str(self.ctx.rank): _pack(self.rank_state())}
        ckpt.fault("staged")
        if blocking:
            try:
                dcp.save(state, storage_writer=writer, process_group=self.group)
            except BaseException as e:  # CheckpointException is a BaseException
                self._failed(step, tmp, e, seq)
                raise CheckpointError(
                    f"checkpoint at step {step} failed: {self._reason(e)}; the previous one is "
                    "kept"
                ) from None
            self._done(step, tmp, seq)
            return
        done = threading.Event()
        self._inflight = done
        gated = self._gate()
        try:  # python objects are copied now (a background copy could see them half-changed)
            state["extra"] = copy.deepcopy(state["extra"])
        except Exception:  # noqa: BLE001 - not copyable: stage all of it before going on
            gated = False
        response = dcp.async_save(state, storage_writer=writer, process_group=self.group,
                                  async_stager=self._staging_stager())
        self._staging, future = response.staging_completion, response.upload_completion
        if not gated:  # nothing tells us before the tensors change: copy them now
            self._wait_staged()

        def finished(f) -> None:  # noqa: ANN001 - a concurrent.futures.Future
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001 - report, keep training
                self._failed(step, tmp, e, seq)
            else:
                self._done(step, tmp, seq)
            finally:
                done.set()

        future.add_done_callback(finished)

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed or has failed."""
        self._wait_staged()
        if self._inflight is not None:
            self._inflight.wait()
            self._inflight = None

    def close(self) -> None:
        """After the loop: the save in flight is over; free the staging thread and buffers."""
        self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    # --- staging in the background -----------------------------------------------------
    def _staging_stager(self) -> AsyncStager:
        if self._stager is None:
            if self.ctx.device.type == "cuda":  # pinned buffers, kept; its own CUDA stream
                self._stager = DefaultStager(StagingOptions(
                    use_pinned_memory=True, use_shared_memory=False, use_async_staging=True,
                    use_non_blocking_copy=True))
            else:
                self._stager = _CpuStager()
        return self._stager

    def _wait_staged(self, *_: Any) -> None:
        """Until the tensors of the save in flight are copied (a failed copy fails the
        save, which reports it: training goes on)."""
        staging, self._staging = self._staging, None
        if staging is not None:
            concurrent.futures.wait([staging])

    def _gate(self) -> bool:
        """Make every change to the saved tensors wait for their copy: an optimizer's
        step (parameters, its state) and, for a model with buffers (batch norm's
        running statistics change in forward), the model's forward. False when the
        job has no optimizer to hook: its parameters may change anywhere."""
        model, optimizers, _ = self._parts()
        if not optimizers:
            return False
        hooked = list(optimizers)
        if model is not None and any(True for _ in model.buffers()):
            hooked.append(model)
        for obj in hooked:
            if id(obj) not in self._gated:
                if isinstance(obj, torch.optim.Optimizer):
                    obj.register_step_pre_hook(self._wait_staged)
                else:
                    obj.register_forward_pre_hook(self._wait_staged)
                self._gated.add(id(obj))
        return True

    def _done(self, step: int, tmp: str, seq: int) -> None:
        self.last_step = step
        if self.ctx.rank != 0:
            return
        try:
            path = ckpt.commit(tmp, ckpt.step_dir(self.root, step), step, self.ctx.world_size)
            ckpt.retain(self.root, self.keep)
        except OSError as e:
            self._failed(step, tmp, e, seq)
            return
        self.report(RankEvent.CHECKPOINT, step=step, path=path, seq=seq)

    def _failed(self, step: int, tmp: str, error: BaseException, seq: int) -> None:
        if self.ctx.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            self.report(RankEvent.CHECKPOINT_FAILED, step=step, message=self._reason(error), seq=seq)

    def _reason(self, error: BaseException) -> str:
        """One line: the root cause, found inside DCP's CheckpointException if need be."""
        causes = [error]
        failures = getattr(error, "failures", None)
        if isinstance(failures, dict):  # DCP: rank -> (exception, stack summary)
            causes = [pair[0] for pair in failures.values()]
        free, needed = shutil.disk_usage(self.root).free, self.nbytes()
        # torch's own writers hide ENOSPC behind messages like "unexpected pos"
        if any(isinstance(c, OSError) and c.errno == errno.ENOSPC for c in causes) or free < needed:
            return (f"no space left on the device ({free / 1024:.0f} KiB free, a checkpoint "
                    f"needs about {needed / 1024:.0f} KiB)")
        cause = causes[0]
        lines = str(cause).strip().splitlines()
        return f"{type(cause).__name__}: {lines[-1][:300] if lines else ''}"

    # --- restoring ---------------------------------------------------------------------
    def restore(self, path: str, skip: Collection[str] = ()) -> int:
        """Load ``path`` into the registered objects but those named in ``skip`` (restored
        already, by whoever made them); return the step it holds."""
        manifest = ckpt.read_manifest(path)
        model, optimizers, others = self._parts()
        others = {k: o for k, o in others.items() if k not in skip}
        meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        state = self.state(with_optim=bool(optimizers) and any(k.startswith("optim.") for k in meta))
        for key in skip:
            state["extra"].pop(key, None)
        _check_matches(path, self._shapes(state), meta)
        source = str(self.ctx.rank % manifest["world_size"])  # another world size: borrow
        state["ranks"] = {source: b""}
        dcp.load(state, checkpoint_id=path, process_group=self.group)
        if "optim" in state:
            set_state_dict(model, optimizers, model_state_dict=state["model"],
                           optim_state_dict=state["optim"], options=_KEYED)
        elif model is not None:
            set_model_state_dict(model, state["model"])
        for key, obj in others.items():
            obj.load_state_dict(state["extra"][key])
        self._restore_rng(_unpack(state["ranks"][source]))
        self.last_step = manifest["step"]
        return manifest["step"]

    def _shapes(self, state: dict[str, Any]) -> dict[str, tuple[int, ...] | None]:
        """Key -> shape of what the job holds; a pipeline's stages pool theirs (each
        holds some of the model, the checkpoint all of it)."""
        shapes = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None
                  for k, v in _flat(state).items() if k.startswith(("model.", "optim.state."))}
        if self.ctx.strategy == "pp" and self.ctx.world_size > 1:
            everyone: list[Any] = [None] * self.ctx.world_size
            dist.all_gather_object(everyone, shapes, group=self.group)
            shapes = {k: v for part in everyone for k, v in part.items()}
        return shapes

    def _restore_rng(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        torch.set_rng_state(state["torch"])
        if "numpy" in state:
            import numpy as np

            np.random.set_state(state["numpy"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def _check_matches(path: str, ours: dict[str, tuple[int, ...] | None], meta: dict[str, Any]) -> None:
    """Name the keys that the checkpoint lacks, has extra, or holds in another shape."""
    theirs = {k: v for k, v in meta.items() if k.startswith(("model.", "optim.state."))}
    missing = sorted(set(ours) - set(theirs))
    unexpected = sorted(set(theirs) - set(ours))
    shapes = []
    for key in sorted(set(ours) & set(theirs)):
        mine, saved = ours[key], theirs[key]
        if mine is not None and isinstance(saved, TensorStorageMetadata):
            if mine != tuple(saved.size):
                shapes.append(f"{key}: checkpoint {tuple(saved.size)}, model {mine}")
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing in the checkpoint: {', '.join(missing)}")
        if unexpected:
            parts.append(f"not in the model: {', '.join(unexpected)}")
        if shapes:
            parts.append(f"shape mismatch: {'; '.join(shapes)}")
        raise CheckpointError(f"checkpoint {path} does not match this job's model — " + " | ".join(parts))


def full_state_dict(ctx: TrainContext, optimizer: torch.optim.Optimizer | None = None
                    ) -> dict[str, Any] | None:
    """``{"model": ..., "optim": ...}`` of the whole job as plain CPU tensors, on rank 0.

    Sharded (FSDP, TP, 2-D, expert) parameters and their optimizer state are
    gathered by DCP's state-dict API; pipeline stages send theirs to rank 0.
    """
    model = ctx.stateful.get("model")
    if model is None:
        raise CheckpointError("ctx.full_state_dict needs a model: call ctx.prepare(...) first")
    if ctx.strategy != "pp":
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = {"model": get_model_state_dict(model, options=full)}
        if optimizer is not None:
            state["optim"] = get_optimizer_state_dict(model, optimizer, options=full)
        return state if ctx.rank == 0 else None
    state = {"model": {k: v.detach().cpu() for k, v in get_model_state_dict(model).items()}}
    if optimizer is not None:
        state["optim"] = _to_cpu(get_optimizer_state_dict(model, optimizer))
    if ctx.world_size == 1:
        return state
    parts: list[Any] | None = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object(state, parts, dst=0)
    return _merge_stages(parts) if parts is not None else None


def _merge_stages(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {"model": {}}
    for part in parts:
        merged["model"].update(part["model"])
    if "optim" in parts[0]:
        groups = [dict(g, params=[]) for g in parts[0]["optim"]["param_groups"]]
        state: dict[str, Any] = {}
        for part in parts:
            state.update(part["optim"]["state"])
            for mine, theirs in zip(groups, part["optim"]["param_groups"]):
                mine["params"].extend(theirs["params"])
        merged["optim"] = {"state": state, "param_groups": groups}
    return merged


def _to_cpu(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_to_cpu(v) for v in tree]
    return tree


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def _pack(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _unpack(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)
