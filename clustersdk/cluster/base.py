"""``Cluster``: a Dask client plus the clustersdk control plane on its scheduler."""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any, Callable, Sequence

from distributed import Client
from distributed.utils import silence_logging_cmgr

from .. import config, registry
from ..client import ControlClient
from ..errors import PluginMissingError, SpecError
from ..job import Job
from ..protocol import DEFAULTS, topic
from ..spec import JobSpec, check_env
from . import shipping


class Cluster:
    """GPU (or CPU) slots on a Dask cluster, ready to run distributed jobs.

    Make one with :meth:`local` or :meth:`connect`; use it as a context manager
    or call :meth:`close`.

    >>> with Cluster.local(workers=2) as cluster:           # doctest: +SKIP
    ...     job = cluster.launch(train, world_size=2)
    ...     job.wait()
    """

    @classmethod
    def local(cls, workers: int | None = None, **options: Any) -> Cluster:
        """Start a local Dask cluster: one worker per GPU, or ``workers`` CPU slots.

        See :func:`clustersdk.cluster.local.local` for the options.
        """
        from .local import local

        return local(cls, workers, **options)

    @classmethod
    def ssh(cls, hosts: Sequence[str], **options: Any) -> Cluster:
        """Start a scheduler and one worker per GPU (or CPU slot) on each host, over SSH.

        See :func:`clustersdk.cluster.ssh.ssh` for the options.

        >>> cluster = Cluster.ssh(["node1", "node2"], gpus_per_host=8)   # doctest: +SKIP
        """
        from .ssh import ssh

        return ssh(cls, hosts, **options)

    @classmethod
    def slurm(cls, **options: Any) -> Cluster:
        """A scheduler here and workers as Slurm jobs, one per GPU, as launches need them.

        See :func:`clustersdk.cluster.slurm.slurm` for the options.

        >>> cluster = Cluster.slurm(gpus_per_worker=1, partition="gpu")   # doctest: +SKIP
        """
        from .slurm import slurm

        return slurm(cls, **options)

    @classmethod
    def connect(cls, target: Any, **options: Any) -> Cluster:
        """Attach to a scheduler address, a Dask ``Cluster`` or a ``Client``.

        See :func:`clustersdk.cluster.connect.connect` for the options.
        """
        from .connect import connect

        return connect(cls, target, **options)

    def __init__(self, client: Client, *, kind: str, dask_cluster: Any = None,
                 owns_client: bool = True, state_dir: str | None = None,
                 silence_logs: int | bool = False, env: dict[str, str] | None = None,
                 scaler: Any = None):
        self.client = client
        self._scaler = scaler  # grows an autoscaling cluster before a launch: want(world_size)
        #: environment every launch's ranks get (a launch's ``env=`` adds to it), e.g.
        #: ``{"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "WARN"}``
        self.env: dict[str, str] = check_env(env) or {}
        self.kind = kind
        self.dask_cluster = dask_cluster
        self.state_dir = config.state_dir(state_dir)
        self.control = ControlClient(client.scheduler)  # the async core; sync() bridges it
        self._owns_client = owns_client
        self._subscriptions: dict[str, list[Subscription]] = {}
        self._subscribe_lock = threading.Lock()
        self._closed = False
        self._silence_logs = silence_logs  # Dask's log lines hidden while closing
        install(client, self.state_dir)
        self._registration = registry.register(self.scheduler_address, kind=kind,
                                               local=dask_cluster is not None,
                                               state_dir=self.state_dir)

    # properties ----------------------------------------------------------------
    @property
    def scheduler_address(self) -> str:
        return self.client.scheduler.address

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the handle then reaches nothing)."""
        return self._closed

    def sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run the coroutine function ``fn`` (e.g. a :attr:`control` operation) on the
        client's event loop and return its result: the sync bridge of the async core.

        >>> cluster.sync(cluster.control.history, job.id, since=0)   # doctest: +SKIP
        """
        return self.client.sync(fn, *args, **kwargs)

    def slots(self) -> list[dict[str, Any]]:
        """Every slot (GPU or CPU) in rank order: worker, host, kind, index and its job."""
        return list(self.sync(self.control.inventory))

    # jobs ------------------------------------------------------------------------
    def launch(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        *,
        world_size: int,
        strategy: str = DEFAULTS.strategy,
        name: str | None = None,
        timeout: float | None = None,
        metrics_interval: float | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_every: int | None = None,
        keep: int = DEFAULTS.keep,
        async_checkpoint: bool = DEFAULTS.async_checkpoint,
        resume: str | None = None,
        tensorboard_dir: str | None = None,
        max_restarts: int | None = None,
        mesh: dict[str, int] | None = None,
        precision: str = DEFAULTS.precision,
        grad_accum: int = DEFAULTS.grad_accum,
        clip_grad_norm: float | None = None,
        microbatches: int | None = None,
        schedule: str | None = None,
        split: list[str] | None = None,
        reshard_after_forward: bool | None = None,
        cpu_offload: bool | None = None,
        model: Any = None,
        plan: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        working_dir: str | None = None,
        py_modules: list[Any] | None = None,
        queue: str | None = None,
        priority: int | str | None = None,
        preemptible: bool = True,
        time_limit: float | None = None,
        min_world_size: int | None = None,
        hang_timeout: float | None = None,
        on_hang: str = "report",
        on_error: str = DEFAULTS.on_error,
        hold_timeout: float | None = None,
        debug: bool = DEFAULTS.debug,
        hparams: dict[str, Any] | None = None,
        on_nan: str = DEFAULTS.on_nan,
        on_spike: str = DEFAULTS.on_spike,
    ) -> Job:
        """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` ranks; return its :class:`Job`.

        The job is queued until ``world_size`` slots are free, then all start at
        once. ``timeout`` bounds every collective (seconds). With
        ``checkpoint_dir``, the job can be checkpointed (every
        ``checkpoint_every`` steps, or on ``job.checkpoint()``), suspended and
        resumed; the newest ``keep`` checkpoints are kept. ``resume="auto"``
        continues from the newest checkpoint in ``checkpoint_dir``, if any.
        ``tensorboard_dir`` receives every ``ctx.log`` scalar as TensorBoard
        events: one run per rank (``rank-N/``) and their mean per step (the
        directory itself), written by the control plane. When a worker of the
        job is lost, the job restarts (state RESTARTING, then QUEUED) on
        whatever slots it can get, from its newest checkpoint (or from the
        start without ``checkpoint_dir``), at most ``max_restarts`` times
        (default: the ``clustersdk.max-restarts`` setting, 0); after that it fails.

        Model parallelism (``strategy`` is one of :data:`~clustersdk.STRATEGIES`):
        ``mesh`` names the ranks' layout, e.g. ``{"dp": 2, "tp": 2}`` for FSDP
        over tensor parallel (one size may be -1: the rest). ``pp`` takes
        ``microbatches``, ``schedule`` ("gpipe" or "1f1b") and ``split`` (the
        module names where stages 1.. begin); ``fsdp`` takes
        ``reshard_after_forward`` and ``cpu_offload``; ``tp`` (and 2-D) a
        ``plan``, else the model's ``tp_plan(tp)``. ``model`` (a module, or a
        function that builds one) is checked against the layout now, on the
        meta device, and built by ``ctx.prepare()``.

        Training features, applied by ``ctx.train_step`` under every strategy:
        ``precision`` "bf16" (autocast) or "fp16" (autocast and a grad scaler;
        every slot must be a GPU), ``grad_accum`` micro-batches per step, and
        ``clip_grad_norm`` (of the whole model, however it is sharded).

        ``env`` is set in every rank's environment before its process group comes up,
        on top of the cluster's ``env`` (``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``,
        ``NCCL_IB_DISABLE``, ``NCCL_DEBUG``, ``NCCL_BUFFSIZE``...); what a job sets is
        undone before the next job on the same workers. Unset socket interfaces default
        to the one each rank reaches rank 0's address through.

        Sharing the cluster (see README "Sharing a cluster"): ``queue`` (default: the
        configured default queue), ``priority`` (a class name, ``"low"``,
        ``"normal"`` (default) or ``"high"``, or an int; higher runs first and may
        preempt lower), ``preemptible`` (a job with ``checkpoint_dir`` is then
        suspended for a higher-priority one and resumes by itself afterwards; one
        without is stopped and starts over), ``time_limit`` (an estimate in
        seconds, for backfill) and ``min_world_size`` (it may start on fewer
        ranks). A job that can never fit its queue's limits is refused here.

        Hangs: when no rank has finished a step for ``hang_timeout`` seconds
        (default: max(60 s, 20x the slowest recent step); time in a checkpoint or
        a pause does not count) the job is HUNG and ``job.stacks()`` shows where
        every rank is; ``on_hang`` then decides: ``"report"`` (keep waiting),
        ``"restart"`` (from the newest checkpoint, within ``max_restarts``) or
        ``"fail"``. A rank stuck for good is ended by restarting its worker.

        Debugging: with ``on_error="hold"`` a rank that raises does not tear the job
        down: the job is HELD (its slots kept, the other ranks paused), ``job.debug(rank)``
        shows the failing frames with their locals, and ``job.stop()`` (the job then
        ends FAILED) or ``job.restart_from_checkpoint()`` ends the hold, as does
        ``hold_timeout`` (default: the ``clustersdk.hold-timeout`` setting, 1800 s).
        ``debug=True`` makes ``ctx.breakpoint()`` pause the job and open a pdb console
        in the notebook (``job.console()``); without it the call does nothing.
        Diagnosis (``job.diagnosis``): a NaN or Inf in a logged loss (a scalar named
        ``loss`` or ``*_loss``) or ``grad_norm``, or in the gradient norm of
        ``clip_grad_norm``, makes ``on_nan`` decide: ``"report"`` (a diagnosis, the job
        goes on), ``"pause"`` (every rank pauses at the next step boundary),
        ``"rollback"`` (restart from the newest checkpoint, dropping that step's batch;
        needs ``checkpoint_dir``) or ``"fail"``; all but ``"report"`` agree on control
        words at every step. A loss spike (a robust z-score over the recent steps) is
        reported, and with ``on_spike="pause"`` pauses the job.

        Code: functions defined in ``__main__`` or a notebook travel by value;
        modules the workers can't import are an error here, naming them, unless
        shipped: ``working_dir`` (a directory whose modules and files go to
        every worker and become the ranks' current directory) and
        ``py_modules`` (modules or names; a package goes whole). See
        :mod:`clustersdk.cluster.shipping`.

        >>> cluster.launch(train, world_size=4, strategy="fsdp",           # doctest: +SKIP
        ...                mesh={"dp": 2, "tp": 2}, precision="bf16", model=Transformer)
        Live changes: ``hparams`` (names to numbers, strings or booleans) is the
        training function's ``ctx.hparams``; ``job.update(name=value)`` changes one
        while the job runs (so do ``lr=``, ``clip_grad_norm=``... see :meth:`Job.update`).

        >>> cluster.launch(train, world_size=2, working_dir="src/")        # doctest: +SKIP
        """
        spec = JobSpec(
            fn=fn, args=args, kwargs=kwargs if kwargs is not None else {},
            world_size=world_size, strategy=strategy, name=name,
            timeout=config.get("timeout") if timeout is None else timeout,
            metrics_interval=(config.get("metrics-interval") if metrics_interval is None
                              else metrics_interval),
            checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, keep=keep,
            async_checkpoint=async_checkpoint, resume=resume, tensorboard_dir=tensorboard_dir,
            max_restarts=config.get("max-restarts") if max_restarts is None else max_restarts,
            mesh=mesh, precision=precision, grad_accum=grad_accum, clip_grad_norm=clip_grad_norm,
            microbatches=microbatches, schedule=schedule, split=split,
            reshard_after_forward=reshard_after_forward, cpu_offload=cpu_offload, model=model,
            plan=plan, env={**self.env, **(env or {})} or None, working_dir=working_dir,
            py_modules=py_modules, queue=queue, priority=priority, preemptible=preemptible,
            time_limit=time_limit, min_world_size=min_world_size,
            hang_timeout=hang_timeout, on_hang=on_hang, on_error=on_error,
            hold_timeout=config.get("hold-timeout") if hold_timeout is None else hold_timeout,
            debug=debug, hparams=hparams, on_nan=on_nan, on_spike=on_spike,
        )
        if spec.precision == "fp16":
            self._check_fp16(spec.world_size)
        if spec.checkpoint_dir and self.kind == "local":
            from ..checkpoint_files import check_writable

            check_writable(spec.checkpoint_dir)  # the workers share this filesystem: fail now
        if self._scaler is not None:
            self._scaler.want(spec.world_size)
        payload = shipping.payload(spec, self.client)  # with the code; checks its modules
        wire = spec.to_wire()
        job = Job(self, {"id": wire.id, "name": wire.name, "status": "QUEUED",
                         "spec": wire.as_dict()})
        job.watch()  # before submit, so that no event is missed
        try:
            self.sync(self.control.submit, wire, payload)
        except BaseException:
            job.close()
            raise
        return job

    def _check_fp16(self, world_size: int) -> None:
        """fp16's grad scaler needs CUDA: refuse before any slot is taken."""
        kinds = sorted({s["kind"] for s in self.slots()})
        if kinds != ["cuda"]:
            raise SpecError(
                f"precision='fp16' needs a CUDA GPU on every rank (its grad scaler is CUDA-only), "
                f"but this cluster's slots are {'/'.join(kinds) or 'none'}; use precision='bf16' "
                f"for the {world_size} ranks"
            )

    def doctor(self, *, checkpoint_dir: str | None = None, bandwidth: bool = True,
               max_size: int | None = None, timeout: float = 60.0) -> Any:
        """Pre-flight checks: versions, GPUs, ports, disk, clocks and all-reduce bandwidth.

        Returns a :class:`clustersdk.doctor.Report` (``print`` it; ``report.problems``
        lists what to fix, one line each). See :mod:`clustersdk.doctor`.

        >>> print(cluster.doctor(checkpoint_dir="/shared/runs"))   # doctest: +SKIP
        """
        from ..doctor import doctor

        return doctor(self.client, checkpoint_dir=checkpoint_dir, bandwidth=bandwidth,
                      max_size=max_size, timeout=timeout)

    def jobs(self) -> list[Job]:
        """Every job this cluster's scheduler has run or is running, oldest first."""
        return [Job(self, record) for record in self.job_records()]

    def job(self, name: str) -> Job:
        """The newest job called ``name`` (same as ``Job.attach(cluster, name)``)."""
        return Job.attach(self, name)

    def job_records(self) -> list[dict[str, Any]]:
        """Every job's record (status, spec, reason, ranks, times...), oldest first:
        plain data, without making :class:`Job` handles."""
        return list(self.sync(self.control.jobs))

    def job_record(self, job: str | None = None, *, name: str | None = None) -> dict[str, Any]:
        """The record of job id ``job``, or of the newest job called ``name``."""
        return self.sync(self.control.job, job=job, name=name)

    # sharing -----------------------------------------------------------------------
    def queue(self) -> Any:
        """The queues: who holds what, what waits and why, estimated starts (a
        :class:`~clustersdk.widgets.queue.QueueView`: a table in a notebook, ``.data``
        for code).

        >>> cluster.queue().waiting()[0]["reason"]          # doctest: +SKIP
        "waiting behind job 'big' (priority high, 8 slots), first in queue 'default'..."
        """
        from ..widgets.queue import QueueView

        return QueueView(self.sync(self.control.queue))

    def configure_scheduling(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change the scheduling settings at run time (an admin's call): queues and
        their quotas, priority classes, the per-user cap, grace and idle timeouts,
        with the keys of ``clustersdk.scheduling`` (a queue set to None is removed).
        Running jobs are never stopped by it: over a lowered quota they finish, or are
        preempted by the rules. Returns every setting now in force.

        >>> cluster.configure_scheduling({"queues": {"research": {"guaranteed": 8}}})  # doctest: +SKIP
        """
        return self.sync(self.control.configure, changes)

    # events ------------------------------------------------------------------------
    def subscribe(self, job: str, callback: Callable[[dict[str, Any]], None]) -> Subscription:
        """Call ``callback(message)`` (on Dask's event loop) for every message the
        control plane publishes about job id ``job``: status changes, metrics,
        checkpoints (see :data:`clustersdk.protocol.Message`), until the returned
        :class:`Subscription` is closed. The scheduler is asked once per job."""
        subscription = Subscription(self, job, callback)
        with self._subscribe_lock:
            first = job not in self._subscriptions
            self._subscriptions.setdefault(job, []).append(subscription)
        if first:
            self.client.subscribe_topic(topic(job), lambda event: self._dispatch(job, event[1]))
        return subscription

    def _unsubscribe(self, subscription: Subscription) -> None:
        with self._subscribe_lock:
            live = self._subscriptions.get(subscription.job, [])
            if subscription in live:
                live.remove(subscription)
            last = not live and self._subscriptions.pop(subscription.job, None) is not None
        if last and not self._closed:
            try:
                self.client.unsubscribe_topic(topic(subscription.job))
            except Exception:  # the client is closing: nothing to release any more
                pass

    def _dispatch(self, job: str, message: dict[str, Any]) -> None:
        for subscription in list(self._subscriptions.get(job, ())):
            subscription.callback(message)

    # lifecycle -----------------------------------------------------------------
    def close(self) -> None:
        """Disconnect; a cluster made by :meth:`local` is shut down too."""
        if self._closed:
            return
        self._closed = True
        registry.unregister(self._registration)
        quiet = silence_logging_cmgr(self._silence_logs) if self._silence_logs else nullcontext()
        with quiet:
            if self._owns_client:
                self.client.close()
            if self.dask_cluster is not None:
                self.dask_cluster.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The cluster dashboard in Jupyter (plain HTML where ipywidgets is missing)."""
        from ..widgets import cluster_mimebundle

        return cluster_mimebundle(self, include=include, exclude=exclude)

    def __repr__(self) -> str:
        if self._closed:
            return f"<Cluster {self.kind} (closed)>"
        slots = self.slots()
        kinds = sorted({s["kind"] for s in slots}) or ["none"]
        busy = sum(1 for s in slots if s["job"])
        hosts = len({s["host"] for s in slots})
        return (f"<Cluster {self.kind} {self.scheduler_address} slots={len(slots)} "
                f"({'/'.join(kinds)}, {busy} busy) hosts={hosts}>")


class Subscription:
    """A callback on a job's messages; :meth:`close` releases it (idempotent)."""

    def __init__(self, cluster: Cluster, job: str, callback: Callable[[dict[str, Any]], None]):
        self.cluster, self.job, self.callback = cluster, job, callback

    def close(self) -> None:
        self.cluster._unsubscribe(self)


def install(client: Client, state_dir: str) -> None:
    """Put the control plane on the scheduler and the agent on every worker (idempotent)."""
    from ..control.plugin import ControlPlane
    from ..runtime.agent import Agent
    from ..runtime.exits import ExitReporter

    client.register_plugin(ControlPlane(state_dir))
    client.register_plugin(Agent())
    client.register_plugin(ExitReporter())  # how lost workers ended: nannies run it
    try:
        client.sync(ControlClient(client.scheduler).inventory)
    except Exception as e:  # pragma: no cover - only with a foreign scheduler
        raise PluginMissingError(
            f"the scheduler at {client.scheduler.address} did not accept the clustersdk control "
            f"plane ({e}); is clustersdk installed in the scheduler's environment?"
        ) from e
