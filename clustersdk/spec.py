"""``JobSpec``: everything a launch asks for, validated before anything runs."""

from __future__ import annotations

import dataclasses
import getpass
import numbers
import os
import re
import uuid
from typing import Any, Callable

import cloudpickle

from .hparams import check_hparams
from .errors import SpecError
from .protocol import DEFAULTS, WireSpec

STRATEGIES: dict[str, str] = {
    "ddp": "DistributedDataParallel: every rank holds the whole model, gradients are averaged",
    "fsdp": "FSDP2 (fully_shard per block): each rank holds 1/N of the parameters, gradients "
            "and optimizer state; with mesh={'dp': D, 'tp': T}, FSDP over tensor parallel (2-D)",
    "tp": "tensor parallel: planned layers split by column/row over the ranks (a plan= or the "
          "model's tp_plan(tp))",
    "pp": "pipeline parallel: each rank runs a slice of the layers under a GPipe or 1F1B "
          "schedule (microbatches=, schedule=, split=)",
    "ep": "expert parallel: each rank holds 1/N of every MoE layer's experts, tokens exchanged "
          "with all-to-all; the dense layers are data parallel",
    "none": "no wrapping: ctx.prepare only moves the model to the rank's device",
}
PRECISIONS = ("fp32", "bf16", "fp16")
SCHEDULES = ("gpipe", "1f1b")
# options that only one strategy understands
_ONLY_FOR = {"microbatches": "pp", "schedule": "pp", "split": "pp",
             "reshard_after_forward": "fsdp", "cpu_offload": "fsdp"}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclasses.dataclass
class JobSpec:
    """What to run and on how many ranks.

    >>> JobSpec(fn=print, world_size=2).strategy
    'ddp'
    """

    fn: Callable[..., Any]
    world_size: int
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    strategy: str = DEFAULTS.strategy
    name: str | None = None
    timeout: float = DEFAULTS.timeout                    # process-group timeout, seconds
    metrics_interval: float = DEFAULTS.metrics_interval  # how often ranks ship metrics, seconds
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None  # steps between periodic checkpoints
    keep: int = DEFAULTS.keep            # committed checkpoints kept
    async_checkpoint: bool = DEFAULTS.async_checkpoint
    resume: str | None = None           # "auto" (newest in checkpoint_dir) or a checkpoint path
    tensorboard_dir: str | None = None  # every ctx.log scalar as TensorBoard events
    max_restarts: int = DEFAULTS.max_restarts  # gang restarts after a lost worker
    # model parallelism and training features (see clustersdk.layout, runtime/strategies)
    mesh: dict[str, int] | None = None  # e.g. {"dp": 2, "tp": 2}; default: all ranks on one dim
    precision: str = DEFAULTS.precision  # "bf16" (autocast) or "fp16" (+ grad scaler, CUDA)
    grad_accum: int = DEFAULTS.grad_accum  # micro-batches per optimizer step
    clip_grad_norm: float | None = None
    microbatches: int | None = None     # pp: micro-batches per schedule step (default: stages)
    schedule: str | None = None         # pp: "gpipe" (default) or "1f1b"
    split: list[str] | None = None      # pp: chain names where stages 1.. begin
    reshard_after_forward: bool | None = None  # fsdp: free gathered blocks after forward
    cpu_offload: bool | None = None     # fsdp: keep parameters and optimizer state in CPU memory
    model: Any = None                   # nn.Module or factory: checked at launch, built by ctx.prepare()
    plan: dict | None = None            # tp / 2-D: module name -> "colwise" | "rowwise" | ParallelStyle
    env: dict[str, str] | None = None   # environment of each rank (NCCL_*, GLOO_SOCKET_IFNAME...)
    # the job's own code, shipped to the workers (see clustersdk.cluster.shipping)
    working_dir: str | None = None      # a directory: its modules and files; the ranks' cwd
    py_modules: list | None = None      # modules (or their names) to ship
    # sharing the cluster: checked here for types, against the queues by the control plane
    queue: str | None = None            # None: the default queue
    priority: int | str | None = None   # a class ("low", "normal", "high") or an int
    preemptible: bool = True            # may be suspended (or stopped) for another job
    time_limit: float | None = None     # an estimate, seconds: lets backfill plan around it
    min_world_size: int | None = None   # may start (or resume) on this many ranks or more
    # a job whose ranks stop finishing steps (see clustersdk.control.hangs)
    hang_timeout: float | None = None   # None: max(60 s, 20x the slowest recent step)
    on_hang: str = "report"             # "report", "restart" or "fail"
    # debugging (see clustersdk.control.holds, TrainContext.breakpoint)
    on_error: str = DEFAULTS.on_error   # "fail", or "hold": a rank that raises waits, HELD
    hold_timeout: float = DEFAULTS.hold_timeout  # seconds a HELD job waits before it fails
    debug: bool = DEFAULTS.debug        # ctx.breakpoint() opens a pdb console (else a no-op)
    # ctx.hparams: names -> numbers, strings or booleans that job.update may change
    hparams: dict[str, Any] | None = None
    # a non-finite loss or a loss spike (see clustersdk.diagnosis)
    on_nan: str = DEFAULTS.on_nan       # "report", "pause", "rollback" or "fail"
    on_spike: str = DEFAULTS.on_spike   # "report" or "pause"
    id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise SpecError(f"fn must be callable, got {self.fn!r} of type {type(self.fn).__name__}")
        ws = self.world_size
        if isinstance(ws, bool) or not isinstance(ws, numbers.Integral):
            raise SpecError(f"world_size must be an int, got {ws!r} of type {type(ws).__name__}")
        if ws <= 0:
            raise SpecError(f"world_size must be at least 1, got {ws}")
        self.world_size = int(ws)
        if self.strategy not in STRATEGIES:
            valid = ", ".join(repr(s) for s in STRATEGIES)
            raise SpecError(f"unknown strategy {self.strategy!r}; valid strategies: {valid}")
        if not isinstance(self.args, (tuple, list)):
            raise SpecError(f"args must be a tuple, got {type(self.args).__name__}")
        self.args = tuple(self.args)
        if not isinstance(self.kwargs, dict):
            raise SpecError(f"kwargs must be a dict, got {type(self.kwargs).__name__}")
        if self.name is None:
            base = re.sub(r"[^A-Za-z0-9_.-]+", "-", getattr(self.fn, "__name__", "job"))
            self.name = f"{base.strip('_.-')[:50] or 'job'}-{self.id[:6]}"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SpecError(
                f"job name {self.name!r} is invalid: use 1-64 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit"
            )
        budget = self.max_restarts
        if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 0:
            raise SpecError(f"max_restarts must be an int of at least 0, got {budget!r}")
        self.max_restarts = int(budget)
        for field in ("timeout", "metrics_interval"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
                raise SpecError(f"{field} must be a positive number of seconds, got {value!r}")

        self._check_checkpoint_options()
        self._check_parallel_options()
        self.env = check_env(self.env)
        self._check_code_options()
        self._check_sharing_options()
        self._check_hang_options()
        self._check_debug_options()
        self.hparams = check_hparams(self.hparams)
        self._check_anomaly_options()

    def _check_sharing_options(self) -> None:
        if self.queue is not None and (not isinstance(self.queue, str) or not self.queue):
            raise SpecError(f"queue must be a queue's name, got {self.queue!r}")
        prio = self.priority
        if prio is not None and (isinstance(prio, bool) or not isinstance(prio, (int, str))):
            raise SpecError(f"priority must be a class name ('low', 'normal', 'high'...) or an "
                            f"int, got {prio!r}")
        if not isinstance(self.preemptible, bool):
            raise SpecError(f"preemptible must be True or False, got {self.preemptible!r}")
        limit = self.time_limit
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not limit > 0:
                raise SpecError(f"time_limit must be a positive number of seconds, got {limit!r}")
            self.time_limit = float(limit)
        low = self.min_world_size
        if low is not None and (isinstance(low, bool) or not isinstance(low, int)
                                or not 1 <= low <= self.world_size):
            raise SpecError(f"min_world_size must be an int from 1 to world_size="
                            f"{self.world_size}, got {low!r}")

    def _check_hang_options(self) -> None:
        limit = self.hang_timeout
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not limit > 0:
                raise SpecError(f"hang_timeout must be a positive number of seconds, got "
                                f"{limit!r}")
            self.hang_timeout = float(limit)
        if self.on_hang not in ON_HANG:
            raise SpecError(f"on_hang must be one of {', '.join(map(repr, ON_HANG))}, got "
                            f"{self.on_hang!r}")
        if self.on_hang == "restart" and not self.max_restarts:
            raise SpecError("on_hang='restart' needs max_restarts=1 or more (a restart after a "
                            "hang counts against it)")

    def _check_debug_options(self) -> None:
        if self.on_error not in ON_ERROR:
            raise SpecError(f"on_error must be one of {', '.join(map(repr, ON_ERROR))}, got "
                            f"{self.on_error!r}")
        limit = self.hold_timeout
        if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not limit > 0:
            raise SpecError(f"hold_timeout must be a positive number of seconds (how long a "
                            f"HELD job waits for you before it fails), got {limit!r}")
        self.hold_timeout = float(limit)
        if not isinstance(self.debug, bool):
            raise SpecError(f"debug must be True or False, got {self.debug!r}")

    def _check_anomaly_options(self) -> None:
        if self.on_nan not in ON_NAN:
            raise SpecError(f"on_nan must be one of {', '.join(map(repr, ON_NAN))}, got "
                            f"{self.on_nan!r}")
        if self.on_spike not in ON_SPIKE:
            raise SpecError(f"on_spike must be one of {', '.join(map(repr, ON_SPIKE))}, got "
                            f"{self.on_spike!r}")
        if self.on_nan == "rollback" and self.checkpoint_dir is None:
            raise SpecError("on_nan='rollback' needs checkpoint_dir=... (it restarts from the "
                            "newest checkpoint, skipping the batch of the non-finite step)")

    def _check_code_options(self) -> None:
        if self.working_dir is not None:
            if not isinstance(self.working_dir, (str, os.PathLike)) or \
                    not os.path.isdir(self.working_dir):
                raise SpecError(f"working_dir must be a directory, got {self.working_dir!r}")
            self.working_dir = os.path.abspath(os.fspath(self.working_dir))
        if self.py_modules is not None:
            if isinstance(self.py_modules, (str, bytes)) or not hasattr(self.py_modules, "__iter__"):
                raise SpecError(f"py_modules must be a list of modules or module names, got "
                                f"{self.py_modules!r}")
            self.py_modules = list(self.py_modules)

    def _check_checkpoint_options(self) -> None:
        if self.checkpoint_dir is not None:
            if not isinstance(self.checkpoint_dir, (str, os.PathLike)) or not str(self.checkpoint_dir):
                raise SpecError(f"checkpoint_dir must be a path, got {self.checkpoint_dir!r}")
            self.checkpoint_dir = _checkpoint_root(os.fspath(self.checkpoint_dir))
        every = self.checkpoint_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every <= 0):
            raise SpecError(f"checkpoint_every must be a positive int (steps), got {every!r}")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise SpecError(f"keep must be an int of at least 1, got {self.keep!r}")
        if self.resume is not None and not isinstance(self.resume, str):
            raise SpecError(f"resume must be 'auto' or a checkpoint path, got {self.resume!r}")
        if self.tensorboard_dir is not None:
            self.tensorboard_dir = os.path.abspath(os.path.expanduser(os.fspath(self.tensorboard_dir)))
        needs_dir = [n for n in ("checkpoint_every", "resume") if getattr(self, n) is not None]
        if needs_dir and self.checkpoint_dir is None:
            raise SpecError(f"{' and '.join(needs_dir)} need checkpoint_dir=...")

    def _check_parallel_options(self) -> None:
        from .layout import Layout

        layout = Layout.resolve(self.strategy, self.mesh, self.world_size)
        if self.mesh is not None:
            self.mesh = dict(self.mesh)
        for name, strategy in _ONLY_FOR.items():
            if getattr(self, name) is not None and self.strategy != strategy:
                raise SpecError(f"{name}= is an option of strategy={strategy!r}, not "
                                f"{self.strategy!r}")
        if self.precision not in PRECISIONS:
            raise SpecError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        accum = self.grad_accum
        if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
            raise SpecError(f"grad_accum must be a positive int, got {accum!r}")
        clip = self.clip_grad_norm
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, numbers.Real)
                                 or clip <= 0):
            raise SpecError(f"clip_grad_norm must be a positive number, got {clip!r}")
        for flag in ("reshard_after_forward", "cpu_offload"):
            if getattr(self, flag) not in (None, True, False):
                raise SpecError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if self.plan is not None and layout.size("tp") == 1:
            raise SpecError("plan= is for tensor parallelism: use strategy='tp', or 'fsdp' with a "
                            "mesh that has a 'tp' dimension")
        if self.strategy == "pp":
            self._check_pipeline(layout.size("pp"))
        if self.model is not None:
            self._check_model(layout)

    def _check_pipeline(self, stages: int) -> None:
        micro = self.microbatches
        if micro is not None and (isinstance(micro, bool) or not isinstance(micro, int) or micro < 1):
            raise SpecError(f"microbatches must be a positive int, got {micro!r}")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise SpecError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.schedule == "1f1b" and (micro or stages) < stages:
            raise SpecError(f"schedule='1f1b' needs at least as many microbatches as stages: "
                            f"microbatches={micro}, pp={stages}")
        if self.split is not None:
            if isinstance(self.split, str) or not all(isinstance(s, str) for s in self.split):
                raise SpecError(f"split must be a list of module names, got {self.split!r}")
            self.split = list(self.split)
            if len(self.split) + 1 != stages:
                raise SpecError(f"split={self.split} makes {len(self.split) + 1} stages, but the "
                                f"pipeline has pp={stages} ranks")

    def _check_model(self, layout: Any) -> None:
        """Build ``model`` on the meta device (no memory, no weights) and check that it
        can take the job's layout: a plan for tp, enough layers for pp, experts for ep."""
        import torch

        from .runtime import strategies

        model = self.model
        if not isinstance(model, torch.nn.Module):
            if not callable(model):
                raise SpecError(f"model must be an nn.Module or a function returning one, got "
                                f"{type(model).__name__}")
            with torch.device("meta"):
                model = model()
            if not isinstance(model, torch.nn.Module):
                raise SpecError(f"model= returned {type(model).__name__}, not an nn.Module")
        strategies.check(layout, model, plan=self.plan, split=self.split)

    def payload(self, dumps: Callable[[Any], bytes] = cloudpickle.dumps) -> bytes:
        """The function, its arguments and the Python objects given to launch (a model
        factory, a TP plan), pickled by ``dumps``; a clear error if they can't be."""
        objects = {k: v for k, v in (("model", self.model), ("plan", self.plan)) if v is not None}
        try:
            return dumps((self.fn, self.args, self.kwargs, objects))
        except Exception as e:
            what = getattr(self.fn, "__qualname__", repr(self.fn))
            raise SpecError(
                f"the training function {what} or its arguments can't be pickled "
                f"({type(e).__name__}: {e}); it must be picklable to reach the workers — move "
                "open files, locks, sockets or clients out of it and create them inside the function"
            ) from e

    def to_wire(self) -> WireSpec:
        """What the scheduler keeps and the ranks get: every option, no Python objects."""
        return WireSpec(
            id=self.id, name=self.name, world_size=self.world_size, strategy=self.strategy,
            timeout=float(self.timeout), metrics_interval=float(self.metrics_interval),
            fn=getattr(self.fn, "__qualname__", repr(self.fn)), owner=owner(),
            checkpoint_dir=self.checkpoint_dir, checkpoint_every=self.checkpoint_every,
            keep=self.keep, async_checkpoint=bool(self.async_checkpoint), resume=self.resume,
            tensorboard_dir=self.tensorboard_dir, max_restarts=self.max_restarts,
            mesh=self.mesh, precision=self.precision, grad_accum=self.grad_accum,
            clip_grad_norm=None if self.clip_grad_norm is None else float(self.clip_grad_norm),
            microbatches=self.microbatches, schedule=self.schedule, split=self.split,
            reshard_after_forward=self.reshard_after_forward, cpu_offload=self.cpu_offload,
            env=dict(self.env) if self.env else None, working_dir=self.working_dir,
            py_modules=[getattr(m, "__name__", m) for m in self.py_modules or ()] or None,
            queue=self.queue, priority=self.priority, preemptible=self.preemptible,
            time_limit=self.time_limit, min_world_size=self.min_world_size,
            hang_timeout=self.hang_timeout, on_hang=self.on_hang,
            on_error=self.on_error, hold_timeout=self.hold_timeout, debug=self.debug,
            hparams=dict(self.hparams) if self.hparams else None,
            on_nan=self.on_nan, on_spike=self.on_spike,
        )


# set for each rank by clustersdk itself; MASTER_ADDR is rank 0's worker address
ON_HANG = ("report", "restart", "fail")  # what a HUNG job does (see launch)
ON_ERROR = ("fail", "hold")  # what a rank that raises does to its job (see launch)
ON_NAN = ("report", "pause", "rollback", "fail")  # what a non-finite loss does
ON_SPIKE = ("report", "pause")  # what a loss spike does
RESERVED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env(env: Any) -> dict[str, str] | None:
    """``env`` as a dict of str to str, or a SpecError naming the bad entry.

    >>> check_env({"NCCL_DEBUG": "INFO", "NCCL_BUFFSIZE": 4194304})
    {'NCCL_DEBUG': 'INFO', 'NCCL_BUFFSIZE': '4194304'}
    """
    if env is None:
        return None
    if not isinstance(env, dict):
        raise SpecError(f"env must be a dict of environment variables, got {type(env).__name__}")
    out = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise SpecError(f"env: {name!r} is not an environment variable name")
        if name in RESERVED_ENV:
            raise SpecError(
                f"env: {name} is set by clustersdk for each rank; MASTER_ADDR is rank 0's worker "
                "address, so pick the interface the workers listen on instead "
                "(Cluster.ssh(interface=...)), and the port range with rendezvous_ports=")
        if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
            raise SpecError(f"env: {name}={value!r} must be a string or a number")
        out[name] = str(value)
    return out


def owner() -> str:
    """Who launches: the login name (what the lab panel and ``clustersdk jobs`` show)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container uid with no passwd entry and no $USER
        return f"uid {os.getuid()}"


def _checkpoint_root(value: str) -> str:
    """A local directory, absolute (``file://`` is one too), or an fsspec URL as given
    (``s3://bucket/run``: every worker reaches it with its own credentials)."""
    from .checkpoint_files import is_url

    if value.startswith("file://"):
        value = value[len("file://"):]
    if not is_url(value):
        return os.path.abspath(os.path.expanduser(value))
    url = value.rstrip("/")
    if url.endswith((":", ":/", "::")) or url.endswith("://"):
        raise SpecError(f"checkpoint_dir {value!r} names no bucket or path: "
                        "give one, e.g. 's3://bucket/runs/a'")
    return url
