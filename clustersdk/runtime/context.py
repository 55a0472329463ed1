"""``TrainContext``: what a training function gets as its first argument."""

from __future__ import annotations

import collections
import time
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from ..errors import SpecError
from ..layout import Layout
from . import checkpoint, strategies
from ..protocol import RankEvent, WireSpec, Word
from .control import Control, ControlCheck, JobSuspended
from .data import ShardedLoader
from .saver import Saver, full_state_dict
from .steps import Steps
from .training import TrainingState

RESERVED = frozenset({"seq", "rank", "step", "time"})  # fields of every metrics row


class TrainContext:
    """The rank's view of its job.

    >>> def train(ctx):
    ...     model = ctx.prepare(torch.nn.Linear(4, 1))
    ...     opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ...     ctx.register(optimizer=opt)
    ...     for step, (x, y) in ctx.loop(ctx.shard(dataset, batch_size=8), steps=100):
    ...         loss = torch.nn.functional.mse_loss(model(x), y)
    ...         loss.backward(); opt.step(); opt.zero_grad()
    ...         ctx.log(loss=loss)

    With the training features of the job's spec (``precision``,
    ``grad_accum``, ``clip_grad_norm``) and under every strategy, ``pp``
    included, the body becomes one call:

    >>> def train(ctx):
    ...     model = ctx.prepare(models.Transformer(), loss_fn=models.lm_loss)
    ...     opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ...     ctx.register(optimizer=opt)
    ...     for step, (x, y) in ctx.loop(ctx.shard(data, batch_size=8), steps=100):
    ...         ctx.log(loss=ctx.train_step(opt, x, y))
    ...     return ctx.full_state_dict(opt)
    """

    def __init__(
        self,
        *,
        job: str,
        name: str,
        rank: int,
        world_size: int,
        local_rank: int,
        device: torch.device,
        strategy: str,
        control: Control | None = None,
        control_group: Any = None,
        report: Callable[..., None] | None = None,
        checkpoint: dict[str, Any] | None = None,
        checkpoint_group: Any = None,
        spec: WireSpec | None = None,
        objects: dict[str, Any] | None = None,
    ):
        self.job = job
        self.name = name
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.device = device
        self.strategy = strategy
        # the job's whole spec (mesh, precision, grad_accum, ...)
        self.spec = spec or WireSpec(id=job, name=name, world_size=world_size, strategy=strategy)
        self.options = _options(self.spec)
        self.layout = Layout.resolve(strategy, self.options["mesh"], world_size)
        self._mesh: Any = None
        # the Python objects given to launch (model=, plan=): they can't travel in the spec
        self.objects: dict[str, Any] = dict(objects or {})
        self._steps = Steps(self)
        self.step = 0
        self.stopped = False
        self.stateful: dict[str, Any] = {}
        self._control = control or Control()
        self._control_group = control_group
        self._report = report or (lambda event, **data: None)
        self._rows: collections.deque = collections.deque()
        self._paused = False
        self._checkpoints_done = 0  # the newest CHECKPOINT request acted on
        self._begun = False
        options = checkpoint or {}
        self._every = options.get("every")
        self._resume = options.get("resume")
        self._saver = None
        if options.get("dir"):
            self._saver = Saver(self, options["dir"], options.get("keep", 3), checkpoint_group,
                                self._report)
            self._async = options.get("async", True)

    def __repr__(self) -> str:
        return (f"<TrainContext job={self.name!r} rank={self.rank}/{self.world_size} "
                f"device={self.device} strategy={self.strategy!r} mesh={self.layout} "
                f"step={self.step}>")

    # layout ----------------------------------------------------------------------
    @property
    def mesh(self) -> Any:
        """The job's ``DeviceMesh``, named by the launch's ``mesh=`` (made on first use:
        every rank must touch it at the same point, as ``ctx.prepare`` does)."""
        if self._mesh is None:
            from .process_group import device_mesh

            self._mesh = device_mesh(self.device, self.layout.names, self.layout.shape)
        return self._mesh

    @property
    def dp_rank(self) -> int:
        """This rank's index among the ranks that read different samples."""
        return self.layout.dp_rank(self.rank)

    @property
    def dp_size(self) -> int:
        """How many ranks read different samples (1 under ``tp`` or ``pp`` alone)."""
        return self.layout.dp_size

    @property
    def stage_index(self) -> int:
        """This rank's pipeline stage (0 unless ``strategy="pp"``)."""
        return self.layout.coords(self.rank).get("pp", 0)

    # model and state -------------------------------------------------------
    def prepare(self, model: torch.nn.Module | None = None, *, loss_fn: Callable | None = None,
                plan: dict | None = None, wrap: Any = None, stage: bool = False) -> torch.nn.Module:
        """Move ``model`` to this rank's device and wrap it for the job's strategy.

        ``model`` defaults to the one given to ``cluster.launch(model=...)``.
        ``loss_fn(output, target)`` is what ``ctx.train_step`` minimizes (and
        what the last pipeline stage computes). ``plan`` overrides the
        tensor-parallel plan, ``wrap`` the FSDP wrap policy (module classes or
        a predicate); ``stage=True`` says ``model`` is already this rank's
        pipeline stage. Under ``pp`` the result is this rank's stage.

        Build the same initial weights on every rank (seed the model): FSDP
        and pipeline stages keep what their rank built.
        """
        if model is None:
            model = self.objects.get("model")
            if model is None:
                raise SpecError("ctx.prepare() needs a model, or cluster.launch(model=...)")
            if not isinstance(model, torch.nn.Module):
                model = model()
        if not isinstance(model, torch.nn.Module):
            raise SpecError(f"ctx.prepare expects a torch.nn.Module, got {type(model).__name__}")
        plan = plan if plan is not None else self.objects.get("plan")
        if plan is not None and self.layout.size("tp") == 1:
            raise SpecError(f"plan= is for tensor parallelism, and this job's mesh is {self.layout}")
        if not stage:
            strategies.check(self.layout, model, plan=plan, split=self.options["split"])
        model = strategies.wrap(self.strategy, model, self, plan=plan, policy=wrap, stage=stage)
        steps = self._steps
        steps.model, steps.loss_fn = model, loss_fn
        if self.strategy == "pp":
            from .strategies.pipeline import Pipeline

            steps.pipeline = Pipeline(model, self, loss_fn)
        self.stateful.setdefault("model", model)
        self.stateful.setdefault("training", TrainingState(self.options, steps.precision))
        return model

    def full_state_dict(self, optimizer: torch.optim.Optimizer | None = None) -> dict | None:
        """The whole model's parameters (and ``optimizer``'s state), gathered from every
        shard and stage as plain CPU tensors keyed by parameter name, on rank 0; None on
        the other ranks. Every rank must call it. What a training function returns.
        """
        return full_state_dict(self, optimizer)

    # training steps ----------------------------------------------------------
    def train_step(self, optimizer: torch.optim.Optimizer, inputs: Any, target: Any
                   ) -> torch.Tensor | None:
        """One optimizer step on this rank's batch; returns the mean loss.

        ``grad_accum`` micro-batches (gradients reduced once, after the last),
        autocast for ``precision``, the fp16 grad scaler, ``clip_grad_norm``,
        ``optimizer.step()`` and ``zero_grad``. ``inputs`` is the model's
        argument (a tuple for several). Under ``pp`` the schedule runs the
        micro-batches, and the loss is returned by the last stage only
        (None elsewhere).
        """
        return self._steps.train_step(optimizer, inputs, target)

    def autocast(self) -> Any:
        """The job's autocast context (``precision="bf16"``/``"fp16"``; no-op in fp32)."""
        return self._steps.autocast()

    def micro_batches(self, *values: Any) -> Iterator[tuple[Any, ...]]:
        """Cut the batch into ``grad_accum`` pieces; data-parallel gradient sync only
        happens in the backward of the last one.

        >>> for x, y in ctx.micro_batches(x, y):          # doctest: +SKIP
        ...     with ctx.autocast():
        ...         loss = loss_fn(model(x), y)
        ...     ctx.backward(loss)
        >>> ctx.optimizer_step(opt)                        # doctest: +SKIP
        """
        return self._steps.micro_batches(*values)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, divided by ``grad_accum`` and scaled for fp16."""
        self._steps.backward(loss)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """Unscale (fp16), clip to ``clip_grad_norm``, step, zero the gradients.

        Returns the gradient norm of the whole model when clipping, else None.
        """
        return self._steps.optimizer_step(optimizer)

    def register(self, **objects: Any) -> None:
        """Name what a checkpoint holds besides the model (optimizers, schedulers, ...)."""
        for key, obj in objects.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise SpecError(
                    f"ctx.register({key}=...) needs an object with state_dict() and "
                    f"load_state_dict(), got {type(obj).__name__}"
                )
            self.stateful[key] = obj

    # data ----------------------------------------------------------------------
    def shard(self, dataset: Any, batch_size: int, **options: Any) -> ShardedLoader:
        """This rank's share of every global batch (``batch_size`` samples per
        data-parallel rank; ranks that differ only in their ``tp`` or ``pp``
        coordinate get the same samples, see :mod:`clustersdk.layout`).

        Options: ``shuffle=True``, ``seed=0``, ``collate_fn``, ``num_workers``.
        """
        loader = ShardedLoader(dataset, batch_size, self.dp_rank, self.dp_size, self.device, **options)
        self.stateful.setdefault("data", loader)
        return loader

    def loop(self, data: Iterable[Any] | None, steps: int) -> Iterator[tuple[int, Any]]:
        """Yield ``(step, batch)`` until ``steps`` steps are done or the job is stopped.

        ``data`` is iterated again when it runs out (a new epoch). At step
        boundaries the ranks agree on the control vector (see
        :mod:`.control`), so that they all pause, checkpoint, suspend or stop
        at the same step. On the first call of a resumed job, everything that
        was registered is restored from the checkpoint before the first step.
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise SpecError(f"steps must be a non-negative int, got {steps!r}")
        if not self._begun:
            self._begin()
            if self.rank == 0:  # for progress bars and ETAs
                self._report(RankEvent.LOOP, total_steps=steps)
        batches = _cycle(data) if data is not None else None
        check = ControlCheck(self._control, self.step, self.world_size, self._control_group)
        start = self.step
        try:
            while self.step < steps:
                if self._every and self.step % self._every == 0 and self.step != start:
                    self._saver.save(self._checkpoints_done, blocking=not self._async)
                if check.due(self.step) and not self._act(check, check.agree(self.step)):
                    self.stopped = True
                    return
                batch = next(batches) if batches is not None else None
                yield self.step, batch
                if self.step == start:
                    self._steps.check_used()
                self.step += 1
            if self._every and self.step % self._every == 0 and self.step != start:
                self._saver.save(self._checkpoints_done, blocking=not self._async)
        finally:
            if self._saver is not None:
                self._saver.close()

    def checkpoint(self) -> None:
        """Save a checkpoint now (all ranks must call it at the same step)."""
        if self._saver is None:
            raise SpecError("this job has no checkpoint_dir; pass checkpoint_dir= to cluster.launch")
        self._saver.save(self._checkpoints_done, blocking=True)

    def _begin(self) -> None:
        """Restore a resumed job and check there is room for a checkpoint, once."""
        self._begun = True
        saver = self._saver
        if saver is None:
            return
        path = self._resume
        if path == "auto":
            path = checkpoint.latest(saver.root)
            if self.world_size > 1:  # every rank must load the same one
                chosen = [path]
                dist.broadcast_object_list(chosen, src=0, group=self._control_group)
                path = chosen[0]
        if path:
            self.step = saver.restore(path)
            print(f"resumed from {path} at step {self.step}")
            if self.rank == 0:
                self._report(RankEvent.RESTORED, step=self.step, path=path)
        if self.rank == 0:
            checkpoint.check_space(saver.root, 2 * saver.nbytes())

    def _act(self, check: ControlCheck, words: list[int]) -> bool:
        """Carry out the agreed control vector; False means: leave the loop."""
        while True:
            if words[Word.STOP]:
                return False
            if words[Word.SUSPEND]:
                self._need_saver("suspend")
                self._saver.save(words[Word.CHECKPOINT], blocking=True)
                raise JobSuspended(f"suspended at step {self.step}")
            if words[Word.CHECKPOINT] > self._checkpoints_done:
                self._checkpoints_done = words[Word.CHECKPOINT]
                self._need_saver("checkpoint")
                self._saver.save(words[Word.CHECKPOINT], blocking=not self._async)
            if words[Word.PAUSE] <= words[Word.RESUME]:
                if self._paused:
                    self._paused = False
                    self._report(RankEvent.RESUMED, step=self.step)
                return True
            if not self._paused:
                self._paused = True
                if self._saver is not None:
                    self._saver.wait()  # a paused job's last checkpoint is committed
                self._report(RankEvent.PAUSED, step=self.step)
            self._control.wait_beyond(words)
            words = check.agree(self.step)

    def _need_saver(self, action: str) -> None:
        if self._saver is None:
            raise SpecError(f"cannot {action}: this job has no checkpoint_dir")

    # metrics -------------------------------------------------------------------
    def log(self, **scalars: Any) -> None:
        """Record scalars (numbers or one-element tensors) for the current step.

        ``None`` values are left out (a pipeline's first stages have no loss),
        and a row left with nothing is not recorded.
        """
        row = {}
        for key, value in scalars.items():
            if value is None:
                continue
            if key in RESERVED:
                raise SpecError(f"ctx.log({key}=...): {key!r} is recorded with every row already; "
                                "pick another name")
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise SpecError(
                        f"ctx.log({key}=...) needs a number or a one-element tensor, got a tensor "
                        f"of shape {tuple(value.shape)}"
                    )
                value = value.detach()
                if value.device.type == "cpu":
                    value = value.item()
            elif not isinstance(value, (int, float)):
                raise SpecError(f"ctx.log({key}=...) needs a number, got {type(value).__name__}")
            row[key] = value
        if not row and scalars:
            return
        self._rows.append({"rank": self.rank, "step": self.step, "time": time.time(), "scalars": row})

    def drain_rows(self) -> list[dict[str, Any]]:
        """Logged rows since the last drain, as plain numbers (called by the agent)."""
        out = []
        while self._rows:
            row = self._rows.popleft()
            row["scalars"] = {k: (v.item() if isinstance(v, torch.Tensor) else v)
                              for k, v in row["scalars"].items()}
            out.append(row)
        return out


def _cycle(data: Iterable[Any]) -> Iterator[Any]:
    while True:
        empty = True
        for item in data:
            empty = False
            yield item
        if empty:
            raise SpecError("ctx.loop got an empty data iterable")


# the training options of a job's spec, and their values when the spec leaves them out
OPTIONS: dict[str, Any] = {
    "mesh": None, "precision": "fp32", "grad_accum": 1, "clip_grad_norm": None,
    "microbatches": None, "schedule": None, "split": None,
    "reshard_after_forward": True, "cpu_offload": False,
}


def _options(spec: WireSpec) -> dict[str, Any]:
    return {k: default if getattr(spec, k) is None else getattr(spec, k)
            for k, default in OPTIONS.items()}
