"""``TrainContext``: what a training function gets as its first argument."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from .. import checkpoint_files, config
from ..errors import CheckpointError, SpecError
from ..layout import Layout
from ..protocol import RankEvent, WireSpec
from . import epochs as _epochs, rebind, resume, strategies
from .breakpoints import Debugging
from .checkpoint.export import full_state_dict
from .checkpoint.saver import Saver
from .control_words import Control
from .data import make_loader
from .live import Live, LiveContext
from .looping import Looping
from .metrics import RESERVED, Metrics  # noqa: F401 - RESERVED: the names every row has
from .phases import PhaseClock, Timed
from .steps import Steps
from .training import TrainingState


class TrainContext(Looping, Debugging, LiveContext):
    """The rank's view of its job.

    >>> def train(ctx):
    ...     model = ctx.prepare(torch.nn.Linear(4, 1))
    ...     opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ...     ctx.register(optimizer=opt)
    ...     for step, (x, y) in ctx.loop(ctx.shard(dataset, batch_size=8), epochs=3):
    ...         loss = torch.nn.functional.mse_loss(model(x), y)
    ...         loss.backward(); opt.step(); opt.zero_grad()
    ...         ctx.log(loss=loss, epoch=ctx.epoch)
    ...         if ctx.epoch_end:                       # evaluate after every epoch
    ...             with torch.no_grad():
    ...                 for x, y in ctx.evaluate(test_set, batch_size=8):
    ...                     ctx.log(test_loss=mse_loss(model(x), y), reduce="mean")

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
        fetch: Callable[..., list] | None = None,
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
        self.epoch = 0  # of the data ctx.loop walks, at the step it yielded last
        # where the rank is, for the hang watchdog: setup, data, step (the user's code),
        # control (agreeing at a boundary), checkpoint, evaluate, paused, done
        self.phase = "setup"
        self.ticks = 0  # steps and evaluation batches done: what the watchdog counts
        self.stopped = False
        self.stateful: dict[str, Any] = {}
        self._control = control or Control()
        self._control_group = control_group
        self._report = report or (lambda event, **data: None)
        self._metrics = Metrics(rank, world_size, control_group)
        self._phases = PhaseClock(enabled=bool(config.get("phase-timing", True)))
        self._capture = None  # the running profile (job.profile), if any
        self._profiles_done = 0  # the newest profile request acted on
        self._rebinder = rebind.Rebinder(strategy)
        self._batches: _epochs.Batches | None = None
        self._shards: list[str] = []  # the keys of the loaders ctx.shard made, in order
        self._paused = False
        self._checkpoints_done = 0  # the newest CHECKPOINT request acted on
        self._begun = False
        options = checkpoint or {}
        self._every = options.get("every")
        self._resume = options.get("resume")
        self._saver = None
        self._resume_path: str | None = None
        if options.get("dir"):
            self._saver = Saver(options["dir"], keep=options["keep"], group=checkpoint_group,
                                report=self._report, rank=rank, world_size=world_size, job=job,
                                device=device, pipeline=strategy == "pp",
                                attempt=options.get("attempt", 0))
            self._async = options.get("async", True)
            # known from the start, so that ctx.shard restores its position at once
            self._resume_path = resume.resolve(self._resume, options["dir"], world_size,
                                               control_group)
        # job.run / job.update; fetch: the agent's bridge to the control plane's requests
        self._live = Live(self, fetch)

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
        before = self._rebinder.before(model)
        model = strategies.wrap(self.strategy, model, self, plan=plan, policy=wrap, stage=stage)
        self._rebinder.after(before, model)  # optimizers built before this now train `model`
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
        model = self.stateful.get("model")
        if model is None:
            raise CheckpointError("ctx.full_state_dict needs a model: call ctx.prepare(...) first")
        return full_state_dict(model, optimizer, rank=self.rank, world_size=self.world_size,
                               pipeline=self.strategy == "pp")

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
        self._rebinder.fix(optimizer)  # before clipping, which reads its parameters
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
        self._rebinder.fix(optimizer)
        return self._steps.optimizer_step(optimizer)

    def register(self, **objects: Any) -> None:
        """Name what a checkpoint holds besides the model (optimizers, schedulers, ...)."""
        for key, obj in objects.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise SpecError(
                    f"ctx.register({key}=...) needs an object with state_dict() and "
                    f"load_state_dict(), got {type(obj).__name__}"
                )
            self._rebinder.fix(obj)
            self.stateful[key] = obj

    # data ----------------------------------------------------------------------
    def shard(self, dataset: Any, batch_size: int, **options: Any) -> Any:
        """This rank's share of every global batch (``batch_size`` samples per
        data-parallel rank; ranks that differ only in their ``tp`` or ``pp``
        coordinate get the same samples, see :mod:`clustersdk.layout`).

        ``dataset`` is map-style (a torch ``Dataset``, a Hugging Face
        ``datasets.Dataset``, a list), a stream (an ``IterableDataset``, a
        streaming Hugging Face dataset) or Parquet files (paths, a directory,
        a ``pyarrow.dataset.Dataset``: read by row group, see
        :mod:`.parquet`). Its position goes into checkpoints; in a resumed
        job it is restored here, so ``len()`` is right before the loop.
        Make loaders once, before the loop, in the same order on every run.

        Options: ``shuffle`` (default True; a stream can't), ``seed=0``,
        ``collate_fn``, ``num_workers`` (map-style), ``prefetch`` (batches
        read ahead by a background thread: 2 for streams and Parquet, 0 for
        map-style), ``columns`` and ``lanes`` (Parquet).
        """
        loader = make_loader(dataset, batch_size, self.dp_rank, self.dp_size, self.device, **options)
        key, n = "data", 0
        while key in self.stateful:
            n += 1
            key = f"data_{n}"
        self._shards.append(key)
        if self._resume_path:
            saved = resume.saved_state(self._resume_path, key, loader.state_dict())
            if saved is not None:
                loader.load_state_dict(saved)
        self.stateful[key] = loader
        return loader

    def checkpoint(self) -> None:
        """Save a checkpoint now (all ranks must call it at the same step)."""
        if self._saver is None:
            raise SpecError("this job has no checkpoint_dir; pass checkpoint_dir= to cluster.launch")
        self._save(self._checkpoints_done, blocking=True)

    def _save(self, seq: int, blocking: bool) -> None:
        """What is registered, at this step (answering checkpoint request ``seq``)."""
        with Timed(self._phases, "checkpoint"):
            self._saver.save(self.stateful, self.step, seq, blocking)

    def _begin(self) -> None:
        """Restore a resumed job and check there is room for a checkpoint, once."""
        self._begun = True
        for obj in self.stateful.values():  # their restored state must go to the right tensors
            self._rebinder.fix(obj)
        saver = self._saver
        if saver is None:
            return
        path = self._resume_path
        if path:
            # loaders are restored when they are made
            self.step = saver.restore(self.stateful, path, skip=self._shards)
            print(f"resumed from {path} at step {self.step}")
            if self.rank == 0:
                self._report(RankEvent.RESTORED, step=self.step, path=path)
        if self.rank == 0:
            checkpoint_files.check_space(saver.root, 2 * saver.nbytes(self.stateful))

    # metrics -------------------------------------------------------------------
    def log(self, *, reduce: str | None = None, **scalars: Any) -> None:
        """Record scalars (numbers or one-element tensors) for the current step.

        Every call of a step adds to that step's one row. ``None`` values are
        left out (a pipeline's first stages have no loss), and a row left
        with nothing is not recorded. ``reduce="mean"`` (or ``"sum"``,
        ``"max"``, ``"min"``) records the value over all ranks instead of
        this rank's: at once (every rank must make the same call), or inside
        :meth:`evaluate` over the whole pass, when it ends.
        """
        self._metrics.log(self.step, scalars, reduce)

    def drain_rows(self) -> list[dict[str, Any]]:
        """Logged rows since the last drain, as plain numbers (called by the agent)."""
        return self._metrics.drain()

    def drain_phases(self) -> list[list[float]]:
        """Phase rows (``[step, *PHASES]``) of the steps finished since the last drain."""
        return self._phases.rows()


# the training options of a job's spec, and their values when the spec leaves them out
OPTIONS: dict[str, Any] = {
    "mesh": None, "precision": "fp32", "grad_accum": 1, "clip_grad_norm": None,
    "microbatches": None, "schedule": None, "split": None,
    "reshard_after_forward": True, "cpu_offload": False,
}


def _options(spec: WireSpec) -> dict[str, Any]:
    return {k: default if getattr(spec, k) is None else getattr(spec, k)
            for k, default in OPTIONS.items()}
