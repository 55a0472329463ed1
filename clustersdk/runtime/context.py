"""``TrainContext``: what a training function gets as its first argument.

One object, the rank's view of its job: its layout, the model and what a
checkpoint holds, the data, the step loop and what the ranks do together at
its step boundaries. The concerns a step boundary or a waiting rank serves
are objects of their own, each given what it needs rather than the context:

- :class:`~.steps.Steps`: one optimizer step under the job's training options;
- :class:`~.metrics.Metrics` and :class:`~.phases.PhaseClock`: what ``ctx.log``
  records and where each step's time goes;
- :class:`~.checkpoint.saver.Saver`: saves and restores;
- :class:`~.live.Live`: ``job.run`` / ``job.update`` (what an update may change,
  :class:`~.tuning.Tunables`, is made here);
- :class:`~.anomalies.NanGuard`: ``on_nan`` checks;
- :class:`~.profiling.Profiler`: ``job.profile``;
- :class:`~.breakpoints.Breakpoints`: ``ctx.breakpoint()``;
- :class:`~.holds.Hold`: a failed rank held under ``on_error="hold"`` (``ctx.error``).

The worker's agent makes what it drives from outside the rank's thread and
hands it in: the control words (:class:`~.control_words.Control`), the
breakpoint console's input (:class:`~.breakpoints.Console`), ``job.run`` /
``job.update`` (:class:`~.live.Live`) and the hold.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from .. import checkpoint_files, config
from ..errors import CheckpointError, SpecError
from ..layout import Layout
from ..protocol import RankEvent, WireSpec, Word
from . import epochs as _epochs
from . import rebind, resume, strategies
from .anomalies import NanGuard
from .breakpoints import Breakpoints, Console
from .checkpoint.export import full_state_dict
from .checkpoint.saver import Saver
from .control_words import Control, ControlCheck, JobStopped, JobSuspended
from .data import make_loader
from .holds import Hold
from .live import HPARAMS_KEY, INTERNAL, HParams, Live
from .metrics import RESERVED, Metrics  # noqa: F401 - RESERVED: the names every row has
from .phases import PhaseClock, Timed
from .profiling import Profiler
from .steps import Steps
from .training import TrainingState
from .tuning import Tunables


class TrainContext:
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

    ``job.run``'s functions get the same ``ctx``: the live model, what was
    registered, and what the training function exposed.

    >>> def train(ctx):                                       # doctest: +SKIP
    ...     model = ctx.prepare(Net())
    ...     opt = torch.optim.AdamW(model.parameters(), lr=ctx.hparams["lr0"])
    ...     ctx.register(optimizer=opt)
    ...     for step, (x, y) in ctx.loop(ctx.shard(data, batch_size=32), steps=1000):
    ...         loss = loss_fn(model(x), y)
    ...         ctx.expose(last_batch=(x, y), loss=loss)      # for job.run to look at
    ...         loss.backward(); opt.step(); opt.zero_grad()
    >>> job.run(lambda ctx: ctx.exposed["loss"].item())      # doctest: +SKIP
    {0: 0.41, 1: 0.43}
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
        console: Console | None = None,
        live: Live | None = None,
        hold: Hold | None = None,
        on_loop: Callable[[], Any] | None = None,
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
        # where the rank is (see the phase property): setup, data, step (the user's code),
        # control (agreeing at a boundary), checkpoint, evaluate, paused, done
        self._phase = "setup"
        self.ticks = 0  # steps and evaluation batches done: what the watchdog counts
        self.stopped = False
        self.stateful: dict[str, Any] = {}
        self._control = control or Control()
        self._control_group = control_group
        self._on_loop = on_loop  # the agent's, as each loop begins (threads' CPUs)
        self._report = report or (lambda event, **data: None)
        self._metrics = Metrics(rank, world_size, control_group)
        self._phases = PhaseClock(enabled=bool(config.get("phase-timing", True)))
        self._profiler = Profiler(rank=rank, device_type=device.type, report=self._report)
        self._rebinder = rebind.Rebinder(strategy, pipelined=self.layout.pipelined)
        self._batches: _epochs.Batches | None = None
        self._shards: list[str] = []  # the keys of the loaders ctx.shard made, in order
        self._paused = False
        self._checkpoints_done = 0  # the newest CHECKPOINT request acted on
        self._nonfinite_done = 0  # the newest NONFINITE word acted on (on_nan)
        self._stop_agreed = False  # the ranks agreed on a stop
        self._begun = False
        options = checkpoint or {}
        self._every = options.get("every")
        self._resume = options.get("resume")
        self._saver = None
        self._resume_path: str | None = None
        if options.get("dir"):
            self._saver = Saver(
                options["dir"],
                keep=options["keep"],
                group=checkpoint_group,
                report=self._report,
                rank=rank,
                world_size=world_size,
                job=job,
                device=device,
                pipeline=self.layout.pipelined,
                attempt=options.get("attempt", 0),
            )
            self._async = options.get("async", True)
            # known from the start, so that ctx.shard restores its position at once
            self._resume_path = resume.resolve(
                self._resume, options["dir"], world_size, control_group
            )
        self._nan_guard = NanGuard(
            self.spec.on_nan,
            metrics=self._metrics,
            steps=self._steps,
            report=self._report,
            control=self._control,
        )
        # job.run / job.update (the agent's Live fetches the control plane's requests)
        self._live = live or Live(
            fetch=None,
            report=self._report,
            group=control_group,
            rank=rank,
            world_size=world_size,
            hparams=self.spec.hparams,
        )
        if self._live.hparams:  # ctx.hparams, saved in checkpoints and restored in place
            self.stateful[HPARAMS_KEY] = HParams(self._live.hparams)
        self._hold = hold or Hold(
            control=self._control, report=self._report, rank=rank, timeout=self.spec.hold_timeout
        )
        self._breakpoints = Breakpoints(
            rank=rank,
            world_size=world_size,
            control=self._control,
            report=self._report,
            console=console or Console(),
            serve_runs=self._serve_runs,
        )

    def __repr__(self) -> str:
        return (
            f"<TrainContext job={self.name!r} rank={self.rank}/{self.world_size} "
            f"device={self.device} strategy={self.strategy!r} mesh={self.layout} "
            f"step={self.step}>"
        )

    @property
    def phase(self) -> str:
        """Where the rank is, for the hang watchdog and ``job.stacks()``: ``setup``,
        ``data``, ``step`` (the training function's code), ``control`` (the ranks agreeing
        at a step boundary), ``checkpoint``, ``evaluate``, ``paused``, ``run`` (a
        ``job.run`` function), ``held`` or ``done``."""
        return self._live.phase or self._hold.phase or self._breakpoints.phase or self._phase

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
        """This rank's pipeline stage (0 unless the mesh has a ``pp`` dimension)."""
        return self.layout.coords(self.rank).get("pp", 0)

    # model and state -------------------------------------------------------
    def prepare(
        self,
        model: torch.nn.Module | None = None,
        *,
        loss_fn: Callable | None = None,
        plan: dict | None = None,
        wrap: Any = None,
        stage: bool = False,
    ) -> torch.nn.Module:
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
            raise SpecError(
                f"plan= is for tensor parallelism, and this job's mesh is {self.layout}"
            )
        if not stage:
            strategies.check(self.layout, model, plan=plan, split=self.options["split"])
        before = self._rebinder.before(model)
        model = strategies.wrap(self.strategy, model, self, plan=plan, policy=wrap, stage=stage)
        self._rebinder.after(before, model)  # optimizers built before this now train `model`
        steps = self._steps
        steps.model, steps.loss_fn = model, loss_fn
        if self.layout.pipelined:
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
        coords = self.layout.coords(self.rank)
        first_of_stage = all(v == 0 for k, v in coords.items() if k != "pp")
        return full_state_dict(
            model,
            optimizer,
            rank=self.rank,
            world_size=self.world_size,
            pipeline=self.layout.pipelined,
            sends=first_of_stage,
        )

    # training steps ----------------------------------------------------------
    def train_step(
        self, optimizer: torch.optim.Optimizer, inputs: Any, target: Any
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
    def shard(self, dataset: Any, batch_size: int | None = None, **options: Any) -> Any:
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

        Token budgets, for samples of different lengths (map-style):
        ``ctx.shard(data, tokens_per_batch=4096, length=...)`` instead of
        ``batch_size`` gives each data-parallel rank whole samples padded to
        the longest, at most 4096 padded tokens per batch, and logs each
        step's ``padding`` fraction and ``tokens``; ``length`` is one int per
        sample, a function of a sample or a key (default: the first
        dimension of its first tensor); ``pad`` the fill value, one or one
        per field (``(0, -100)`` for ids and targets). Each batch holds a
        multiple of the micro-batches a step cuts it into (``grad_accum``,
        and a pipeline's ``microbatches``). See :mod:`clustersdk.runtime.budget`.
        """
        if "tokens_per_batch" in options:
            options["log"] = self.log
            # every batch must cut into the step's equal micro-batches
            pieces = self.options["grad_accum"]
            if self.layout.pipelined:
                pieces *= self.options["microbatches"] or self.layout.size("pp")
            options.setdefault("multiple_of", pieces)
        loader = make_loader(
            dataset, batch_size, self.dp_rank, self.dp_size, self.device, **options
        )
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
            raise SpecError(
                "this job has no checkpoint_dir; pass checkpoint_dir= to cluster.launch"
            )
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

    # the loop --------------------------------------------------------------------
    def loop(
        self, data: Iterable[Any] | None, steps: int | None = None, *, epochs: int | None = None
    ) -> Iterator[tuple[int, Any]]:
        """Yield ``(step, batch)`` until ``steps`` steps or ``epochs`` passes over
        ``data`` are done (whichever comes first), or the job is stopped.

        ``ctx.epoch`` is the epoch of the batch just yielded and
        ``ctx.epoch_end`` says whether it was its epoch's last. With a length
        (a loader of ``ctx.shard``), the loop's total is ``epochs *
        len(data)`` from the start, and epoch boundaries stay at the same
        steps across a resume at another world size; a stream without one
        ends an epoch when it runs out. At step boundaries the ranks agree on
        the control vector (see :mod:`.control_words`), so that they all pause,
        checkpoint, suspend or stop at the same step. On the first call of a
        resumed job, everything that was registered is restored from the
        checkpoint before the first step. What was asked before the job ran
        (a pause, a checkpoint, ``job.run``, ``job.update``) is taken at the
        first boundary, before the first step; a stop there ends the training
        function (``JobStopped``), as no code after the loop could run on no step.
        """
        _epochs.check_target(data, steps, epochs)
        if self._on_loop is not None:
            self._on_loop()
        first = not self._begun
        if first:
            self._begin()
        total = _epochs.total_steps(data, steps, epochs)
        if first and self.rank == 0 and total is not None:  # for progress bars and ETAs
            self._report(RankEvent.LOOP, total_steps=total)
        limit = total if total is not None else steps  # None: until the stream's epochs end
        batches = self._batches = (
            _epochs.Batches(data, epochs, self.step) if data is not None else None
        )
        # on_nan other than "report": every step checked, and agreed on before any save
        guard = self._nan_guard if self.spec.on_nan != "report" else None
        skip = frozenset(self.spec.skip_steps or ())  # steps whose batch a rollback drops
        check = ControlCheck(
            self._control,
            self.step,
            self.world_size,
            self._control_group,
            every_step=guard is not None,
        )
        start = self.step
        clock, profiler = self._phases, self._profiler
        clock.bind()
        try:
            while limit is None or self.step < limit:
                clock.begin_step()
                if guard is not None and check.due(self.step):  # a NaN step is never saved
                    self._phase = "control"
                    if not self._act(check, check.agree(self.step), self.step):
                        self._leave(first and self.step == start)
                        return
                if self._every and self.step % self._every == 0 and self.step != start:
                    self._phase = "checkpoint"
                    self._save(self._checkpoints_done, blocking=not self._async)
                if check.due(self.step):
                    self._phase = "control"
                    if not self._act(check, check.boundary(self.step), self.step):
                        self._leave(first and self.step == start)
                        return
                clock.before_data()
                batch = None
                if batches is not None:
                    self._phase = "data"
                    if self.step in skip and self._drop_batch(batches) is _epochs.END:
                        break
                    capture = profiler.capture
                    if capture is not None:
                        with capture.data():
                            batch = batches.next()
                    else:
                        batch = batches.next()
                    if batch is _epochs.END:
                        break
                    self.epoch = batches.epoch
                clock.after_data()
                self._phase = "step"
                yield self.step, batch
                clock.resumed(self.step)
                if guard is not None:
                    guard.after_step(self.step)
                if self.step == start:
                    self._first_step_done()
                    self._live.first_step(batch, self._tunables())  # what job.update may change
                if profiler.capture is not None:
                    profiler.step_done()
                self._metrics.end_step()
                self.step += 1
                self.ticks += 1
                if self.stopped:  # an evaluation in that step was told to stop
                    return
            if self._every and self.step % self._every == 0 and self.step != start:
                self._phase = "checkpoint"
                self._save(self._checkpoints_done, blocking=not self._async)
        except BaseException:
            # leaving on an exception (a failure, a suspend, the loop closed early): an
            # overlapped check still on its way completes on its own; waiting for it
            # here could only hide the exception behind a peer's gone connection
            check.abandon()
            raise
        finally:
            check.settle()  # ended or stopped: complete the check every rank started
            self._phase = "done"
            clock.abandon()
            profiler.finish()  # stopped, suspended or out of data: what it has, if any
            self._metrics.end_step()
            if batches is not None:
                batches.close()
            self._batches = None
            if self._saver is not None:
                self._saver.close()

    @property
    def epoch_end(self) -> bool:
        """Whether the batch ``ctx.loop`` yielded last is its epoch's last (evaluate now)."""
        return self._batches is not None and self._batches.end_of_epoch()

    def evaluate(self, data: Any, batch_size: int | None = None, **options: Any) -> Iterator[Any]:
        """One pass over ``data``, under the job's control but not counted as steps.

        ``data`` is an iterable of batches (a loader of ``ctx.shard``), or a
        dataset with ``batch_size``: sharded as ``ctx.shard`` does, not
        shuffled, not saved in checkpoints. Every rank must get as many
        batches. ``ctx.log(..., reduce="mean")`` inside the pass accumulates;
        when the pass ends, the figures of every call on every rank are
        reduced and logged once, in the row of the current training step.
        Between batches the ranks agree on control words: a stop ends the
        evaluation (and ``ctx.loop`` before its next step), a pause holds
        it; a checkpoint or suspend asked meanwhile is taken at the next
        step boundary, after the evaluation.
        """
        if batch_size is not None:
            options.setdefault("shuffle", False)
            data = make_loader(data, batch_size, self.dp_rank, self.dp_size, self.device, **options)
        elif options:
            raise SpecError(f"ctx.evaluate({', '.join(options)}=...) needs batch_size= too")
        with self._metrics.evaluating() as evaluation:
            check = ControlCheck(self._control, 0, self.world_size, self._control_group)
            batches, index = iter(data), 0
            try:
                while True:
                    if check.due(index) and not self._act(
                        check, check.agree(index), index, evaluating=True
                    ):
                        self.stopped = True
                        return
                    self._phase = "evaluate"
                    batch = next(batches, _epochs.END)
                    if batch is _epochs.END:
                        break
                    yield batch
                    index += 1
                    self.ticks += 1  # an evaluation batch done is progress too
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()
            self._metrics.finish(self.step, evaluation)

    def _drop_batch(self, batches: _epochs.Batches) -> Any:
        """Draw the batch of a step that a rollback skips, and drop it."""
        dropped = batches.next()
        if self.rank == 0 and dropped is not _epochs.END:
            print(
                f"step {self.step}: its batch is dropped (it gave a non-finite value before "
                "a rollback, on_nan='rollback')"
            )
        return dropped

    def _first_step_done(self) -> None:
        """Misuse that only the first step shows: options left unused, a stale scheduler."""
        self._steps.check_used()
        optimizers = [o for o in self.stateful.values() if isinstance(o, torch.optim.Optimizer)]
        self._rebinder.check_schedulers(self.stateful, optimizers)
        if self.rank == 0:
            for note in self._rebinder.notes:
                print(note)
        self._rebinder.notes.clear()

    def _leave(self, before_any_step: bool) -> None:
        """The agreed vector ends the loop: a stop before the rank's first step raises
        :class:`JobStopped` (no code after the loop runs), else the loop returns."""
        stop = self._stop_agreed  # not a NaN's rollback, which the control plane takes on
        self.stopped = True
        if stop and before_any_step:
            raise JobStopped(f"stopped before step {self.step}, its first")

    def _act(
        self, check: ControlCheck, words: list[int], at: int, evaluating: bool = False
    ) -> bool:
        """Carry out the agreed control vector; False means: leave the loop.

        ``at`` is the check's position (the step; in an evaluation, the batch).
        An evaluation runs inside a step, whose state is not a checkpoint's:
        a checkpoint or suspend waits for the next step boundary.
        """
        with self._metrics.holding():  # the step's row is not complete yet
            return self._act_on(check, words, at, evaluating)

    def _act_on(self, check: ControlCheck, words: list[int], at: int, evaluating: bool) -> bool:
        while True:
            if words[Word.STOP]:
                self._stop_agreed = True
                return False
            if words[Word.NONFINITE] > self._nonfinite_done:  # a rank saw a NaN or Inf
                self._nonfinite_done = words[Word.NONFINITE]
                if not self._nan_guard.act(words):
                    return False  # rollback or fail: the control plane takes it from here
            if words[Word.SUSPEND] and evaluating:
                return True  # finish the evaluation; suspend at the next step boundary
            if words[Word.SUSPEND]:
                self._need_saver("suspend")
                self._phase = "checkpoint"
                self._save(words[Word.CHECKPOINT], blocking=True)
                raise JobSuspended(f"suspended at step {self.step}")
            if words[Word.CHECKPOINT] > self._checkpoints_done and not evaluating:
                self._checkpoints_done = words[Word.CHECKPOINT]
                self._need_saver("checkpoint")
                self._phase = "checkpoint"
                self._save(words[Word.CHECKPOINT], blocking=not self._async)
            if self._live.due(words):  # job.run / job.update: a PAUSED job's too, at once
                self._live.act(words, self, self._tunables)
            if words[Word.PAUSE] <= words[Word.RESUME]:
                if self._paused:
                    self._paused = False
                    self._report(RankEvent.RESUMED, step=self.step)
                if not evaluating:
                    self._profiler.start(words[Word.PROFILE], self.step, self.spec)
                return True
            with Timed(self._phases, "paused"):
                if not self._paused:
                    self._paused = True
                    if self._saver is not None:
                        self._saver.wait()  # a paused job's last checkpoint is committed
                    self._report(RankEvent.PAUSED, step=self.step)
                self._phase = "paused"
                self._control.wait_beyond(words)
                self._phase = "control"
                words = check.agree(at)

    def _need_saver(self, action: str) -> None:
        if self._saver is None:
            raise SpecError(f"cannot {action}: this job has no checkpoint_dir")

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

    # job.run / job.update ----------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module | None:
        """The model ``ctx.prepare`` returned (wrapped for the strategy), or None before."""
        return self.stateful.get("model")

    @property
    def registered(self) -> Mapping[str, Any]:
        """What ``ctx.register`` got (``optimizer``, ``scheduler``...) and ``model``: read-only."""
        return types.MappingProxyType(
            {k: v for k, v in self.stateful.items() if k not in INTERNAL and k not in self._shards}
        )

    def expose(self, **objects: Any) -> None:
        """Make ``objects`` reachable to ``job.run``'s functions as ``ctx.exposed[name]``
        (the newest value of each name; nothing is copied or sent anywhere)."""
        self._live.exposed.update(objects)

    @property
    def exposed(self) -> Mapping[str, Any]:
        """What the training function passed to :meth:`expose`, by name: read-only."""
        return types.MappingProxyType(self._live.exposed)

    @property
    def hparams(self) -> dict[str, Any]:
        """The launch's ``hparams={...}``, as changed by ``job.update`` since. Read it where
        the value is used (each step), so that a change takes effect; it is saved in
        checkpoints and restored when the job resumes."""
        return self._live.hparams

    def _tunables(self) -> Tunables:
        """What ``job.update`` may change on this rank now."""
        steps = self._steps
        return Tunables(
            rank=self.rank,
            stateful=self.stateful,
            hparams=self._live.hparams,
            settings={
                "clip_grad_norm": steps.clip,
                "grad_accum": steps.accum,
                "checkpoint_every": self._every,
                "metrics_interval": self.spec.metrics_interval,
            },
            set_option=self._set_option,
            called=frozenset(steps.called),
            pipeline=self.layout.pipelined,
            checkpoints=self._saver is not None,
        )

    def _set_option(self, key: str, value: Any) -> None:
        """A launch option ``job.update`` changed (planned and checked by :mod:`.tuning`):
        in the spec, and where the rank uses it (the agent reads ``metrics_interval``
        from the spec)."""
        self.spec = self.spec.replace(**{key: value})
        if key in self.options:
            self.options[key] = value
            self._steps.retune(self.options)
        if key == "checkpoint_every":
            self._every = value

    def _serve_runs(self, words: list[int]) -> None:
        """The ``job.run`` requests up to ``words``, for a rank that waits alone."""
        self._live.act_alone(words, self)

    # debugging -----------------------------------------------------------------------
    @property
    def error(self) -> BaseException | None:
        """The exception this rank is held for (``on_error="hold"``), with its traceback
        and frames, or None: what a function run on a held rank inspects."""
        return self._hold.error

    def breakpoint(self, ranks: int | Iterable[int] = (0,)) -> None:
        """Pause the whole job here and open a pdb console in the notebook for ``ranks``.

        A no-op (one attribute check) unless the job was launched with ``debug=True``.
        Every rank must call it at the same point; the others wait in it until the
        session ends (``c``, ``q`` or ``job.resume()``).

        >>> for step, (x, y) in ctx.loop(loader, steps=100):      # doctest: +SKIP
        ...     loss = loss_fn(model(x), y)
        ...     if step == 50:
        ...         ctx.breakpoint(ranks=[0])  # pdb on rank 0, in the notebook
        """
        if not self.spec.debug:
            return
        self._breakpoints.stop_here(ranks, sys._getframe(1), self.step)


# the training options of a job's spec, and their values when the spec leaves them out
OPTIONS: dict[str, Any] = {
    "mesh": None,
    "precision": "fp32",
    "grad_accum": 1,
    "clip_grad_norm": None,
    "microbatches": None,
    "schedule": None,
    "split": None,
    "reshard_after_forward": True,
    "cpu_offload": False,
}


def _options(spec: WireSpec) -> dict[str, Any]:
    return {
        k: default if getattr(spec, k) is None else getattr(spec, k)
        for k, default in OPTIONS.items()
    }
