"""``Cluster``: a Dask client plus the clustersdk control plane on its scheduler.

Like :class:`~clustersdk.Job`, a ``Cluster`` does not import the tiers above it:
its notebook dashboard, ``cluster.queue()``'s tables and ``cluster.doctor()`` come
from the hooks that :mod:`clustersdk` provides (see :mod:`clustersdk.hooks`).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from distributed import Client
from distributed.utils import silence_logging_cmgr

from .. import config, hooks, options, registry
from ..client import ControlClient
from ..errors import ClusterClosedError, PluginMissingError, SpecError
from ..job import Job
from ..options import check_env
from ..protocol import topic
from ..spec import JobSpec
from . import shipping
from .connect import connect as _connect
from .dashboard import DashboardFinder
from .local import local as _local
from .slurm import slurm as _slurm
from .ssh import ssh as _ssh

if TYPE_CHECKING:
    from ..security.tls import Prepared


class Cluster:
    """GPU (or CPU) slots on a Dask cluster, ready to run distributed jobs.

    Make one with :meth:`local` or :meth:`connect`; use it as a context manager
    or call :meth:`close`.

    >>> with Cluster.local(workers=2) as cluster:           # doctest: +SKIP
    ...     job = cluster.launch(train, world_size=2)
    ...     job.wait()
    """

    # The ways to make one: each is its module's function bound to the class, so that
    # help(), the docs and a notebook's completion show every keyword it takes.
    local = classmethod(_local)
    ssh = classmethod(_ssh)
    slurm = classmethod(_slurm)
    connect = classmethod(_connect)

    def __init__(
        self,
        client: Client,
        *,
        kind: str,
        dask_cluster: Any = None,
        owns_client: bool = True,
        state_dir: str | None = None,
        silence_logs: int | bool = False,
        env: dict[str, str] | None = None,
        scaler: Any = None,
        security: Prepared | None = None,
        credentials: str | None = None,
        register: bool = True,
    ):
        self.client = client
        # what security= made (the creator's authority) and the credentials this process shows
        self._security = security
        self.credentials = credentials or (security.credentials if security else None)
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
        self._address = client.scheduler.address  # still named once closed (the client forgets)
        self._whoami: dict[str, Any] | None = None
        self._dashboard = DashboardFinder()  # asks the scheduler's HTTP server once
        self._silence_logs = silence_logs  # Dask's log lines hidden while closing
        # a cluster this process did not make has its plugins already, or gets them once
        install(client, self.state_dir, probe=kind in ("connect", "standing"))
        authority = security.authority if security is not None else None
        self._registration = (
            registry.register(
                self.scheduler_address,
                kind=kind,
                local=dask_cluster is not None,
                state_dir=self.state_dir,
                credentials=self.credentials,
                authority=authority.directory if authority is not None else None,
            )
            if register
            else None
        )

    # properties ----------------------------------------------------------------
    @property
    def scheduler_address(self) -> str:
        """The Dask scheduler's address (``tls://host:port``): what ``Cluster.connect``
        and ``clustersdk jobs ADDRESS`` take."""
        return self._address

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the handle then reaches nothing)."""
        return self._closed

    def ensure_open(self) -> None:
        """Raise :class:`~clustersdk.ClusterClosedError`, saying how to get a working
        handle, once :meth:`close` was called (or the Dask client was closed under it):
        every call that reaches the cluster asks this first."""
        if not self._closed and self.client.status != "closed":
            return
        address = self.scheduler_address
        if not self._closed:  # someone closed the Dask client under this handle
            what = f"its Dask client was closed; connect again with cs.Cluster.connect({address!r})"
        elif self.dask_cluster is not None:  # close() shut the cluster down, with its jobs
            what = (
                f"cluster.close() shut the {self.kind} cluster at {address} down, with its "
                f"jobs; start a new one with cs.Cluster.{self.kind}(...)"
            )
        else:  # only this handle went: the cluster and its jobs go on
            what = (
                f"cluster.close() let go of {address}, whose jobs go on; connect again with "
                f"cs.Cluster.connect({address!r})"
            )
        raise ClusterClosedError(f"the Cluster is closed: {what}", address)

    def sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run the coroutine function ``fn`` (e.g. a :attr:`control` operation) on the
        client's event loop and return its result: the sync bridge of the async core.

        >>> cluster.sync(cluster.control.history, job.id, since=0)   # doctest: +SKIP
        """
        self.ensure_open()
        return self.client.sync(fn, *args, **kwargs)

    @property
    def dashboard_link(self) -> str | None:
        """The URL of the cluster's Dask dashboard, as Dask's ``Cluster.dashboard_link``;
        None where its scheduler serves none (``Cluster.local(dashboard=False)``, no
        bokeh there) or the handle is closed. Dask's ``distributed.dashboard.link``
        template shapes it (e.g. ``{JUPYTERHUB_SERVICE_PREFIX}proxy/{port}/status``).

        >>> cluster.dashboard_link                 # doctest: +SKIP
        'http://127.0.0.1:40503/status'
        """
        if self.closed:
            return None
        info = self.client.scheduler_info(n_workers=0)
        return self.sync(self._dashboard.link, self.scheduler_address, info)

    def slots(self) -> list[dict[str, Any]]:
        """Every slot (GPU or CPU) in rank order: worker, host, kind, index, uuid, the CPU
        cores its worker is bound to (``cpus``, a CPU list; "" unbound), its job, and why
        it takes no new ranks (``drained``; None when it does)."""
        return list(self.sync(self.control.inventory))

    def drain(
        self,
        target: str,
        reason: str = "",
        by: datetime.datetime | datetime.timedelta | None = None,
    ) -> dict[str, Any]:
        """Take a host (or one worker, by address) out of service, an admin's call: it
        takes no new ranks, and every job with a rank there checkpoints at its next step
        boundary (the just-in-time checkpoint of a preemption), leaves, and queues again
        to continue on other slots, bitwise where it has a ``checkpoint_dir`` (without
        one it starts again). With ``by`` (a time, or how long from now) its jobs run on
        until ``clustersdk.notice-grace`` (30 s) before it and move then; one that ends
        sooner is not disturbed. :meth:`undrain` gives it back. Returns the workers
        drained, the jobs that move and when (``moves_at``; None: now).

        >>> cluster.drain("gpu3", reason="fan replacement")               # doctest: +SKIP
        {'target': 'gpu3', 'workers': ['tls://10.0.0.3:40211'], 'jobs': ['bert'], ...}
        >>> cluster.drain("gpu4", by=datetime.timedelta(hours=2))        # doctest: +SKIP
        """
        if isinstance(by, datetime.timedelta):
            by = datetime.datetime.now() + by
        when = None if by is None else by.timestamp()
        return self.sync(self.control.drain, target, reason, when)

    def undrain(self, target: str) -> dict[str, Any]:
        """Give a drained host (or worker) back: its slots take ranks again."""
        return self.sync(self.control.undrain, target)

    # jobs ------------------------------------------------------------------------
    def launch(
        self,
        fn: Callable[..., Any] | JobSpec,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        *,
        # >>> generated: launch-keywords (python -m clustersdk.codegen)
        world_size: int | None = None,
        strategy: str = "ddp",
        name: str | None = None,
        timeout: float | None = None,
        metrics_interval: float | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_every: int | None = None,
        keep: int = 3,
        async_checkpoint: bool = True,
        resume: str | None = None,
        tensorboard_dir: str | None = None,
        max_restarts: int | None = None,
        mesh: dict[str, int] | None = None,
        precision: str = "fp32",
        grad_accum: int = 1,
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
        on_error: str = "fail",
        hold_timeout: float | None = None,
        debug: bool = False,
        hparams: dict[str, Any] | None = None,
        on_nan: str = "report",
        on_spike: str = "report",
        # <<< generated
    ) -> Job:
        """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` ranks; return its :class:`Job`.

        The job is queued until ``world_size`` slots are free, then all start at
        once. ``cluster.launch(spec)`` runs a :class:`~clustersdk.JobSpec` instead
        (each launch is a new job; give nothing else). ``timeout``,
        ``metrics_interval``, ``max_restarts`` and ``hold_timeout`` left at None take
        the ``clustersdk.*`` setting of that name. ``env`` adds to the cluster's.

        Refused here, before any slot is taken, with a message naming the cause: a bad
        option (:class:`~clustersdk.SpecError`), a module the workers can't import and
        ``working_dir`` or ``py_modules`` does not ship, ``precision="fp16"`` without
        CUDA, an unwritable ``checkpoint_dir``, a job its queue's limits can never fit,
        more ranks than the cluster can ever hold (:class:`~clustersdk.CapacityError`).

        The options, by group, each group with the guide page that explains it (the
        table of every option with its default and doc: :doc:`/guide/launching`, or
        ``print(clustersdk.options.describe())``):

        - core (:doc:`/guide/launching`): world_size strategy name timeout metrics_interval
        - checkpointing (:doc:`/guide/checkpoints`): checkpoint_dir checkpoint_every keep
          async_checkpoint resume tensorboard_dir
        - faults (:doc:`/guide/faults`): max_restarts hang_timeout on_hang
        - parallelism (:doc:`/guide/model-parallel`): mesh microbatches schedule split
          reshard_after_forward cpu_offload model plan
        - training (:doc:`/guide/model-parallel`): precision grad_accum clip_grad_norm
        - code (:doc:`/guide/launching`): env working_dir py_modules
        - sharing (:doc:`/guide/sharing`): queue priority preemptible time_limit
          min_world_size
        - debugging (:doc:`/guide/faults`): on_error hold_timeout debug
        - live (:doc:`/guide/live`): hparams
        - diagnosis (:doc:`/guide/faults`): on_nan on_spike

        >>> cluster.launch(train, world_size=4, strategy="fsdp",           # doctest: +SKIP
        ...                mesh={"dp": 2, "tp": 2}, precision="bf16", model=Transformer)
        >>> spec = cs.JobSpec(train, world_size=2, checkpoint_dir="runs/a")  # doctest: +SKIP
        >>> first, second = cluster.launch(spec), cluster.launch(spec)     # doctest: +SKIP
        """
        # >>> generated: launch-given (python -m clustersdk.codegen)
        given = {
            "world_size": world_size,
            "strategy": strategy,
            "name": name,
            "timeout": timeout,
            "metrics_interval": metrics_interval,
            "checkpoint_dir": checkpoint_dir,
            "checkpoint_every": checkpoint_every,
            "keep": keep,
            "async_checkpoint": async_checkpoint,
            "resume": resume,
            "tensorboard_dir": tensorboard_dir,
            "max_restarts": max_restarts,
            "mesh": mesh,
            "precision": precision,
            "grad_accum": grad_accum,
            "clip_grad_norm": clip_grad_norm,
            "microbatches": microbatches,
            "schedule": schedule,
            "split": split,
            "reshard_after_forward": reshard_after_forward,
            "cpu_offload": cpu_offload,
            "model": model,
            "plan": plan,
            "env": env,
            "working_dir": working_dir,
            "py_modules": py_modules,
            "queue": queue,
            "priority": priority,
            "preemptible": preemptible,
            "time_limit": time_limit,
            "min_world_size": min_world_size,
            "hang_timeout": hang_timeout,
            "on_hang": on_hang,
            "on_error": on_error,
            "hold_timeout": hold_timeout,
            "debug": debug,
            "hparams": hparams,
            "on_nan": on_nan,
            "on_spike": on_spike,
        }
        # <<< generated
        if isinstance(fn, JobSpec):
            spec = self._renewed(fn, args, kwargs, given)
        else:
            if world_size is None:  # what Python says when a required keyword is missing
                raise TypeError(
                    "Cluster.launch() missing 1 required keyword-only argument: 'world_size'"
                )
            spec = JobSpec(
                fn=fn,
                args=args,
                kwargs=kwargs if kwargs is not None else {},
                **{**given, "env": {**self.env, **(env or {})} or None},
            )
        return self._submit(spec)

    def launch_script(
        self,
        script: str | None = None,
        args: Sequence[Any] = (),
        *,
        # >>> generated: launch-script-keywords (python -m clustersdk.codegen)
        world_size: int | None = None,
        name: str | None = None,
        timeout: float | None = None,
        metrics_interval: float | None = None,
        checkpoint_dir: str | None = None,
        tensorboard_dir: str | None = None,
        max_restarts: int | None = None,
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
        module: str | None = None,
        command: str | None = None,
        grace: float | None = None,
        # <<< generated
    ) -> Job:
        """Run ``python -u script *args`` (or ``-m module``, or a console ``command``) on
        ``world_size`` ranks, as ``torchrun`` would; return its :class:`Job`.

        Each rank is a child process of its slot's worker (which pins its GPU), with
        torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
        ``MASTER_PORT``, ``TORCHELASTIC_*``...), so ``dist.init_process_group()``,
        accelerate and the Hugging Face ``Trainer`` work untouched; plus
        ``CLUSTERSDK_JOB`` and, with ``checkpoint_dir``, ``CLUSTERSDK_CHECKPOINT_DIR``.
        Queued, gang-scheduled, preempted and restarted as any job: what every rank
        prints is its log; a non-zero exit ends the gang and restarts it within
        ``max_restarts`` (else the job fails naming the rank and its exit code); stop,
        suspend and preemption send SIGTERM, then SIGKILL after ``grace`` seconds.
        :mod:`clustersdk.script` (or ``ClusterSDKCallback`` in a ``Trainer``) adds live
        charts, pause and checkpoints at step boundaries. ``job.wait()`` returns 0.

        The script is found in ``working_dir`` when that is given (which ships with the
        job and is the ranks' working directory), else in the current directory and
        shipped alone. ``timeout`` is how long the ranks' rendezvous store waits for a
        peer. The options, by group, each group with the guide page that explains it
        (``print(clustersdk.options.describe())``: each one's default and doc):

        - core (:doc:`/guide/launching`): world_size name timeout metrics_interval
        - checkpointing (:doc:`/guide/checkpoints`): checkpoint_dir tensorboard_dir
        - faults (:doc:`/guide/faults`): max_restarts hang_timeout on_hang
        - code (:doc:`/guide/launching`): env working_dir py_modules
        - sharing (:doc:`/guide/sharing`): queue priority preemptible time_limit
          min_world_size
        - scripts (:doc:`/guide/scripts`): script module command grace

        >>> job = cluster.launch_script("train.py", ["--epochs", "3"], world_size=4,   # doctest: +SKIP
        ...                             working_dir=".", max_restarts=2)
        >>> cluster.launch_script(module="pkg.train", world_size=2)                     # doctest: +SKIP
        """
        # >>> generated: launch-script-given (python -m clustersdk.codegen)
        given = {
            "world_size": world_size,
            "name": name,
            "timeout": timeout,
            "metrics_interval": metrics_interval,
            "checkpoint_dir": checkpoint_dir,
            "tensorboard_dir": tensorboard_dir,
            "max_restarts": max_restarts,
            "env": env,
            "working_dir": working_dir,
            "py_modules": py_modules,
            "queue": queue,
            "priority": priority,
            "preemptible": preemptible,
            "time_limit": time_limit,
            "min_world_size": min_world_size,
            "hang_timeout": hang_timeout,
            "on_hang": on_hang,
            "script": script,
            "module": module,
            "command": command,
            "grace": grace,
        }
        # <<< generated
        if world_size is None:
            raise TypeError(
                "Cluster.launch_script() missing 1 required keyword-only argument: 'world_size'"
            )
        if script is None and module is None and command is None:
            raise SpecError(
                "launch_script needs what to run: a script's path, module=... or command=..."
            )
        spec = JobSpec(
            fn=None, args=tuple(args), **{**given, "env": {**self.env, **(env or {})} or None}
        )
        return self._submit(spec)

    def _submit(self, spec: JobSpec) -> Job:
        """Check what only the cluster can check, ship the code, submit; the job's handle."""
        self.ensure_open()
        if spec.precision == "fp16":
            self._check_fp16(spec.world_size)
        if spec.checkpoint_dir and self.kind == "local":
            from ..checkpoint_files import check_writable

            check_writable(spec.checkpoint_dir)  # the workers share this filesystem: fail now
        if self._scaler is not None:
            self._scaler.want(spec.world_size)
        # with the code; checks its modules
        payload = (
            shipping.script_payload(spec, self.client)
            if spec.kind == "script"
            else shipping.payload(spec, self.client)
        )
        wire = spec.to_wire()
        if self._identity() is not None:  # what the control plane will record as its owner
            wire = wire.replace(owner=self._identity())
        job = Job(
            self, {"id": wire.id, "name": wire.name, "status": "QUEUED", "spec": wire.as_dict()}
        )
        job.watch()  # before submit, so that no event is missed
        try:
            self.sync(self.control.submit, wire, payload)
        except BaseException:
            job.close()
            raise
        return job

    def _renewed(
        self, spec: JobSpec, args: tuple, kwargs: dict[str, Any] | None, given: dict[str, Any]
    ) -> JobSpec:
        """``launch(spec)``: the spec as a new job, with the cluster's ``env`` under its
        own. Anything given beside it is an error: which of the two should win?"""
        extra = [f"{k}={v!r}" for k, v in given.items() if _differs(v, k)]
        if kwargs:
            extra.insert(0, f"kwargs={kwargs!r}")
        if args:
            extra.insert(0, f"args={args!r}")
        if extra:
            raise SpecError(
                f"launch(spec) takes every option from the JobSpec, but was also given "
                f"{', '.join(extra)}; change the spec instead, e.g. "
                f"cluster.launch(dataclasses.replace(spec, {', '.join(extra)}))"
            )
        return spec.renewed(env={**self.env, **(spec.env or {})} or None)

    def _check_fp16(self, world_size: int) -> None:
        """fp16's grad scaler needs CUDA: refuse before any slot is taken."""
        kinds = sorted({s["kind"] for s in self.slots()})
        if kinds != ["cuda"]:
            raise SpecError(
                f"precision='fp16' needs a CUDA GPU on every rank (its grad scaler is CUDA-only), "
                f"but this cluster's slots are {'/'.join(kinds) or 'none'}; use precision='bf16' "
                f"for the {world_size} ranks"
            )

    def doctor(
        self,
        *,
        checkpoint_dir: str | None = None,
        bandwidth: bool = True,
        max_size: int | None = None,
        timeout: float = 60.0,
    ) -> Any:
        """Pre-flight checks: versions, GPUs, ports, disk, clocks and all-reduce bandwidth.

        Returns a :class:`clustersdk.doctor.Report` (``print`` it; ``report.problems``
        lists what to fix, one line each). See :mod:`clustersdk.doctor`, which sits
        above this client and is reached through the ``doctor`` hook.

        >>> print(cluster.doctor(checkpoint_dir="/shared/runs"))   # doctest: +SKIP
        """
        self.ensure_open()
        return hooks.call(
            "doctor",
            self.client,
            checkpoint_dir=checkpoint_dir,
            bandwidth=bandwidth,
            max_size=max_size,
            timeout=timeout,
        )

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
    def queue(self) -> QueueView:
        """The queues: who holds what, what waits and why, estimated starts (a
        :class:`QueueView`: a table in a notebook, ``.data`` for code).

        >>> cluster.queue().waiting()[0]["reason"]          # doctest: +SKIP
        "waiting behind job 'big' (priority high, 8 slots), first in queue 'default'..."
        """
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

    # people ------------------------------------------------------------------------
    def whoami(self) -> dict[str, Any]:
        """The identity this process acts as (its certificate's name and role) and the
        rules in force: ``{"name", "role", "admin", "enforced", "hide_metrics"}``."""
        return self.sync(self.control.whoami)

    def _who(self) -> dict[str, Any]:
        """:meth:`whoami`, asked once ({} on a cluster without TLS)."""
        if self._whoami is None:
            self._whoami = self.whoami() if self.scheduler_address.startswith("tls://") else {}
        return self._whoami

    def _identity(self) -> str | None:
        """The name this process's certificate carries (None: no TLS)."""
        return self._who().get("name") if self._who().get("enforced") else None

    def refusal(self, owner: str | None) -> str | None:
        """Why this process may not change a job of ``owner`` (None: it may, as its owner,
        an admin, or on a cluster without identities): what a dashboard greys out."""
        who = self._who()
        if not who.get("enforced"):
            return None
        from ..control.access import refusal
        from ..security.identity import Identity

        return refusal(Identity(who["name"], who["role"]), owner)

    def add_user(self, name: str, *, admin: bool = False, path: str | None = None) -> str:
        """Credentials for ``name`` (an admin's with ``admin=True``): a file holding their
        certificate, its key and the cluster's CA certificate, written 0600; its path.
        Hand it to them privately; they connect with
        ``Cluster.connect(address, credentials=path)``. Needs the cluster's CA key:
        the account that created the cluster has it (``security="auto"``).

        >>> path = cluster.add_user("bob")                  # doctest: +SKIP
        """
        return self._authority().add_user(name, admin=admin, path=path)

    def remove_user(self, name: str) -> None:
        """Revoke ``name``'s credentials: the scheduler, every worker and every nanny
        refuse their certificate from now on (new connections fail the TLS handshake,
        and requests on connections already open are refused)."""
        _, crl = self._authority().remove_user(name)
        self.sync(self.control.revoke, crl)

    def users(self) -> dict[str, dict[str, Any]]:
        """Everyone ever given credentials: name -> role, serial, file, expiry, revoked."""
        return self._authority().users()

    def _authority(self) -> Any:
        if self._security is not None and self._security.authority is not None:
            return self._security.authority
        found = registry.authority(self.scheduler_address, self.state_dir)
        if found is None:
            raise SpecError(
                f"managing the users of {self.scheduler_address} needs its certificate "
                "authority, which the account that created the cluster (with security='auto') "
                "keeps in its state directory; ask that admin to add or remove users"
            )
        from ..security.pki import Authority

        return Authority(found)

    # events ------------------------------------------------------------------------
    def subscribe(self, job: str, callback: Callable[[dict[str, Any]], None]) -> Subscription:
        """Call ``callback(message)`` (on Dask's event loop) for every message the
        control plane publishes about job id ``job``: status changes, metrics,
        checkpoints (see :data:`clustersdk.protocol.Message`), until the returned
        :class:`Subscription` is closed. The scheduler is asked once per job."""
        self.ensure_open()
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
        if self._security is not None:
            self._security.close()  # the cluster is gone: so are its keys

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The cluster dashboard in Jupyter (plain HTML where ipywidgets is missing), as the
        presentation provides it (see :mod:`clustersdk.hooks`); the plain repr without one."""
        if not hooks.provided("cluster_display"):
            return {"text/plain": repr(self)}
        return hooks.call("cluster_display", self, include=include, exclude=exclude)

    def __repr__(self) -> str:
        if self._closed:
            return f"<Cluster {self.kind} (closed)>"
        slots = self.slots()
        kinds = sorted({s["kind"] for s in slots}) or ["none"]
        busy = sum(1 for s in slots if s["job"])
        hosts = len({s["host"] for s in slots})
        return (
            f"<Cluster {self.kind} {self.scheduler_address} slots={len(slots)} "
            f"({'/'.join(kinds)}, {busy} busy) hosts={hosts}>"
        )


def _differs(value: Any, name: str) -> bool:
    """Whether launch's keyword ``name`` was given a value other than its default."""
    default = options.OPTIONS_BY_NAME[name].launch_default
    return value is not None if default is None else value != default


class Subscription:
    """A callback on a job's messages; :meth:`close` releases it (idempotent)."""

    def __init__(self, cluster: Cluster, job: str, callback: Callable[[dict[str, Any]], None]):
        self.cluster, self.job, self.callback = cluster, job, callback

    def close(self) -> None:
        self.cluster._unsubscribe(self)


class QueueView:
    """Per queue: who holds what, what waits and why, estimated starts (what
    ``cluster.queue()`` returns). ``data`` is the plain model the control plane answers
    (what ``GET /clustersdk/api/queue`` serves too); its text and its table in a
    notebook come from the presentation (the ``queue_text`` and ``queue_html`` hooks).

    >>> cluster.queue()            # doctest: +SKIP
    16 slots, 4 free · queue default (rest of the slots): 12 in use
    """

    def __init__(self, data: dict[str, Any]):
        self.data = data

    @property
    def queues(self) -> list[dict[str, Any]]:
        return self.data["queues"]

    def waiting(self) -> list[dict[str, Any]]:
        """Every waiting job, queue by queue, in the order they would start."""
        return [j for q in self.queues for j in q["waiting"]]

    def holding(self) -> list[dict[str, Any]]:
        """Every job that holds slots, queue by queue."""
        return [j for q in self.queues for j in q["holding"]]

    def _repr_html_(self) -> str | None:
        return hooks.call("queue_html", self.data) if hooks.provided("queue_html") else None

    def __repr__(self) -> str:
        if hooks.provided("queue_text"):
            return hooks.call("queue_text", self.data)
        return (
            f"<QueueView {len(self.queues)} queue(s), {len(self.holding())} holding, "
            f"{len(self.waiting())} waiting>"
        )


def cluster_plugins(state_dir: str) -> tuple[Any, list[Any], list[Any]]:
    """What makes a Dask cluster a clustersdk cluster: the control plane (the scheduler's
    plugin, its journal in ``state_dir``), the workers' plugins (the agent) and the
    nannies' (how a worker ended; revocations)."""
    from ..control.plugin import ControlPlane
    from ..runtime.agent import Agent
    from ..runtime.exits import ExitReporter
    from ..runtime.revocations import Revocations

    return ControlPlane(state_dir), [Agent()], [ExitReporter(), Revocations()]


def install(client: Client, state_dir: str, probe: bool = False) -> None:
    """Put the control plane on the scheduler and the agent on every worker; with
    ``probe`` (a cluster this process connects to), only if the control plane is not
    there yet (registering plugins is an admin's right on a TLS cluster: a user who
    connects installs nothing)."""
    control = ControlClient(client.scheduler)
    if probe:
        try:
            if client.sync(control.inventory) is not None:
                return
        except Exception:  # noqa: BLE001 - no control plane yet (or not ours): install it
            pass
    plane, workers, nannies = cluster_plugins(state_dir)
    try:
        client.register_plugin(plane)
        for plugin in [*workers, *nannies]:  # nannies: how lost workers ended, revocations
            client.register_plugin(plugin)
        client.sync(control.inventory)
    except Exception as e:
        raise PluginMissingError(
            f"the scheduler at {client.scheduler.address} did not accept the clustersdk control "
            f"plane ({type(e).__name__}: {e}); is clustersdk installed in the scheduler's "
            "environment (and, on a TLS cluster, are you its admin)?"
        ) from e
