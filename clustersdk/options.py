"""The launch options: one table, read by every entry point.

Each option of a launch is one :class:`Option` in :data:`OPTIONS`: its name, type,
default, group, a one-line doc and its check. Everything else derives from the table:

- written from it by ``python -m clustersdk.codegen`` (:mod:`clustersdk.codegen`; the
  test suite fails while that would change a line): the typed keywords of
  :meth:`clustersdk.Cluster.launch` and :meth:`~clustersdk.Cluster.launch_script` and
  the dict of what each was given; :class:`clustersdk.JobSpec`'s fields (same name,
  order and type), so ``help()``, IDEs and mypy see them;
  :class:`clustersdk.protocol.WireSpec`'s field per option that crosses the wire,
  whose defaults are :func:`spec_field`'s (a journal written by an older release, a
  field missing, reads with today's default); and the REST API's description of a
  spec (``Spec`` in the server extension's ``openapi.yaml``).
- made from it when they run: ``%%distributed``'s and the CLI's flags, one per option
  a command line can spell (a number, a string or a flag; not a dict, a list or a
  Python object: :mod:`clustersdk.cli.flags`); :func:`describe` and the docs' table.
- checked against it by ``tests/test_options.py``: launch's docstring, which lists the
  options by group. ``JobSpec`` runs :func:`check` in ``__post_init__``;
  ``JobSpec.to_wire`` copies every option that crosses the wire (``Option.wire``).

Defaults. An option whose default is a setting (:class:`Config`: ``timeout``,
``metrics_interval``, ``max_restarts``, ``hold_timeout``) has its value in
``clustersdk.yaml`` and nowhere else: ``None`` in ``launch``, ``JobSpec`` and a
magic means "the setting", resolved by :func:`default` when the spec is made, so
``dask.config.set({"clustersdk.timeout": 30})`` or ``DASK_CLUSTERSDK__TIMEOUT=30``
changes every entry point. The other defaults are written here once.

Decision: flat keywords plus ``launch(spec)``, no typed option groups. Ray Train
takes ``ScalingConfig`` / ``RunConfig`` / ``FailureConfig`` objects; here they would
be a second spelling of every option (a group's field and the flat keyword) and a
second place for its default, which is what this table removes. Every other entry
point is flat (``%%distributed`` flags, the journal's and the REST API's spec dict,
``job.update`` keys), and the checks cross any grouping one could draw
(``on_nan="rollback"`` needs ``checkpoint_dir``, ``on_hang="restart"`` needs
``max_restarts``, ``plan`` needs a ``tp`` dimension of ``mesh``), so a group
object could not validate itself alone. The reusable bundle a notebook wants is a
:class:`~clustersdk.JobSpec`: build it once, ``cluster.launch(spec)`` it as often
as needed (each launch is a new job), change it with ``dataclasses.replace``. The
groups (:data:`GROUPS`) order the documentation: launch's docstring, the magic's
help and :func:`describe`.

Pure: importing this module loads no Dask and no torch (the configuration is read
when a default is asked for).

>>> default("keep"), OPTIONS_BY_NAME["keep"].group
(3, 'checkpointing')
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from .errors import SpecError
from .hparams import check_hparams

# --- the groups ------------------------------------------------------------------------------
#: group -> (what its options are about, the page of the documentation's user guide that
#: explains them: a path under docs/, without its suffix)
GROUPS: dict[str, tuple[str, str]] = {
    "core": ("what runs, on how many ranks", "guide/launching"),
    "checkpointing": ("checkpoints, resume and TensorBoard", "guide/checkpoints"),
    "faults": ("lost workers and hangs", "guide/faults"),
    "parallelism": ("how the model is spread over the ranks", "guide/model-parallel"),
    "training": ("what ctx.train_step applies on every strategy", "guide/model-parallel"),
    "code": ("the job's code and environment", "guide/launching"),
    "sharing": ("queues, priorities, preemption", "guide/sharing"),
    "debugging": ("a rank that raises, breakpoints", "guide/faults"),
    "live": ("what job.update may change", "guide/live"),
    "diagnosis": ("a non-finite loss, a loss spike", "guide/faults"),
    "scripts": ("what a script job runs, and how its ranks are stopped", "guide/scripts"),
}

# --- the kinds of job ----------------------------------------------------------------------------
#: A job runs a training function (``launch``) or a script (``launch_script``: a Python file,
#: a module or a console command, as torchrun would). Each option says which kinds take it.
FUNCTION, SCRIPT = "function", "script"
BOTH = (FUNCTION, SCRIPT)
ENTRY_POINTS = ("script", "module", "command")  # what a script job runs: exactly one of them

# --- the values some options take --------------------------------------------------------------
STRATEGIES: dict[str, str] = {
    "ddp": "DistributedDataParallel: every rank holds the whole model, gradients are averaged",
    "fsdp": "FSDP2 (fully_shard per block): each rank holds 1/N of the parameters, gradients "
    "and optimizer state; with mesh={'dp': D, 'tp': T}, FSDP over tensor parallel (2-D); "
    "with mesh={'dp': D, 'tp': T, 'pp': P}, pipeline stages over FSDP x TP (3-D)",
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
ON_HANG = ("report", "restart", "fail")  # what a HUNG job does
ON_ERROR = ("fail", "hold")  # what a rank that raises does to its job
ON_NAN = ("report", "pause", "rollback", "fail")  # what a non-finite loss does
ON_SPIKE = ("report", "pause")  # what a loss spike does
# set for each rank by clustersdk itself; MASTER_ADDR is rank 0's worker address
RESERVED_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
# options that only one strategy understands
ONLY_FOR = {
    "microbatches": "pp",
    "schedule": "pp",
    "split": "pp",
    "reshard_after_forward": "fsdp",
    "cpu_offload": "fsdp",
}

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a job's name
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --- the option type ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    """A default that is a setting: ``clustersdk.<key>`` in ``clustersdk.yaml``."""

    key: str


REQUIRED = Config("")  # no default: launch(fn) must be given it (world_size)


# what the REST API's description of a spec says of a number's bounds (Option.schema)
AT_LEAST_0: Mapping[str, Any] = {"minimum": 0}
AT_LEAST_1: Mapping[str, Any] = {"minimum": 1}
POSITIVE: Mapping[str, Any] = {"minimum": 0, "exclusiveMinimum": True}


def _same(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Option:
    """One launch option.

    ``type`` is the annotation of its ``JobSpec`` field and ``launch`` keyword as
    text (``| None`` added there when the default is a :class:`Config`: None means
    the setting). ``check`` takes a value (a setting already filled in) and returns
    it normalized, or raises :class:`SpecError` naming it; checks across options are
    :func:`check`'s. ``wire`` turns the checked value into its :class:`WireSpec`
    form; None: it does not cross the wire (a Python object, pickled with the
    function in the payload). ``wire_type`` is the annotation of its ``WireSpec``
    field when that is not ``type`` (module objects travel as their names), and
    ``schema`` what the REST API's description of a spec adds to the JSON type that
    ``type`` gives and the ``doc`` (a number's bounds): :mod:`clustersdk.codegen` writes both.
    """

    name: str
    type: str
    default: Any
    group: str
    doc: str
    check: Callable[[Any], Any] = _same
    wire: Callable[[Any], Any] | None = _same
    choices: tuple[str, ...] = ()
    kinds: tuple[str, ...] = BOTH  # which kinds of job take it (launch, launch_script)
    wire_type: str | None = None
    schema: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def setting(self) -> str | None:
        """The configuration key of its default (``"hold-timeout"``), or None."""
        if isinstance(self.default, Config) and self.default is not REQUIRED:
            return self.default.key
        return None

    @property
    def launch_default(self) -> Any:
        """Its default in ``launch``'s and ``JobSpec``'s signatures: None for a setting."""
        return None if isinstance(self.default, Config) else self.default


# --- checks of one value -----------------------------------------------------------------------
def _positive_int(name: str, what: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{name} must be a positive int{what}, got {value!r}")
        return value

    return check


def _seconds(name: str, why: str = "") -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
            raise SpecError(f"{name} must be a positive number of seconds{why}, got {value!r}")
        return float(value)

    return check


def _one_of(name: str, values: tuple[str, ...], show: str | None = None) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in values:
            raise SpecError(
                f"{name} must be one of {show or ', '.join(map(repr, values))}, got {value!r}"
            )
        return value

    return check


def _flag(name: str, optional: bool = False) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not (isinstance(value, bool) or (optional and value is None)):
            raise SpecError(f"{name} must be True or False, got {value!r}")
        return value

    return check


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else check(value)


def check_world_size(value: Any) -> int:
    """A world size (a launch's, a resume's), or a :class:`SpecError` saying what it is.

    >>> check_world_size(0)
    Traceback (most recent call last):
    clustersdk.errors.SpecError: world_size must be at least 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SpecError(f"world_size must be an int, got {value!r} of type {type(value).__name__}")
    if value <= 0:
        raise SpecError(f"world_size must be at least 1, got {value}")
    return int(value)


def _strategy(value: Any) -> str:
    if value not in STRATEGIES:
        valid = ", ".join(repr(s) for s in STRATEGIES)
        raise SpecError(f"unknown strategy {value!r}; valid strategies: {valid}")
    return value


def _name(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not NAME.match(value)):
        raise SpecError(
            f"job name {value!r} is invalid: use 1-64 letters, digits, '_', '.' or "
            "'-', starting with a letter or digit"
        )
    return value


def _checkpoint_dir(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise SpecError(f"checkpoint_dir must be a path, got {value!r}")
    return os.fspath(value)  # a local one made absolute by JobSpec (it may be a URL)


def _keep(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"keep must be an int of at least 1, got {value!r}")
    return value


def _resume(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise SpecError(f"resume must be 'auto' or a checkpoint path, got {value!r}")
    return value


def _directory_path(value: Any) -> str | None:
    return None if value is None else os.path.abspath(os.path.expanduser(os.fspath(value)))


def _max_restarts(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise SpecError(f"max_restarts must be an int of at least 0, got {value!r}")
    return int(value)


def _clip(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
        raise SpecError(f"clip_grad_norm must be a positive number, got {value!r}")
    return float(value)


def _schedule(value: Any) -> str | None:
    if value is not None and value not in SCHEDULES:
        raise SpecError(f"schedule must be one of {SCHEDULES}, got {value!r}")
    return value


def _split(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(s, str) for s in value):
        raise SpecError(f"split must be a list of module names, got {value!r}")
    return list(value)


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
                "(Cluster.ssh(interface=...)), and the port range with rendezvous_ports="
            )
        if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
            raise SpecError(f"env: {name}={value!r} must be a string or a number")
        out[name] = str(value)
    return out


def _working_dir(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.path.isdir(value):
        raise SpecError(f"working_dir must be a directory, got {value!r}")
    return os.path.abspath(os.fspath(value))


def _py_modules(value: Any) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise SpecError(f"py_modules must be a list of modules or module names, got {value!r}")
    return list(value)


def _queue(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise SpecError(f"queue must be a queue's name, got {value!r}")
    return value


def _priority(value: Any) -> int | str | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, str))):
        raise SpecError(
            f"priority must be a class name ('low', 'normal', 'high'...) or an int, got {value!r}"
        )
    return value


def _module_names(value: Any) -> list[str] | None:
    return [getattr(m, "__name__", m) for m in value or ()] or None


def _script(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise SpecError(f"script must be the path of a Python file, got {value!r}")
    return os.fspath(value)  # made absolute (and checked) with working_dir by JobSpec


def _module(value: Any) -> str | None:
    if value is not None and (
        not isinstance(value, str) or not all(part.isidentifier() for part in value.split("."))
    ):
        raise SpecError(
            f"module must be a module's dotted name (as python -m takes it), got {value!r}"
        )
    return value


def _command(value: Any) -> str | None:
    if value is not None and (
        not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value)
    ):
        raise SpecError(
            f"command must be one program's name or path (its arguments go in args=), got {value!r}"
        )
    return value


def _copy_or_none(value: Any) -> dict[str, Any] | None:
    return dict(value) if value else None


# --- the table ---------------------------------------------------------------------------------
OPTIONS: tuple[Option, ...] = (
    Option(
        "world_size",
        "int",
        REQUIRED,
        "core",
        "how many ranks (one slot each) the job runs on",
        check_world_size,
        schema=AT_LEAST_1,
    ),
    Option(
        "strategy",
        "str",
        "ddp",
        "core",
        "how the model is spread over the ranks: one of clustersdk.STRATEGIES",
        _strategy,
        choices=tuple(STRATEGIES),
        kinds=(FUNCTION,),
    ),
    Option(
        "name",
        "str | None",
        None,
        "core",
        "the job's name (default: the function's name and the start of the job's id)",
        _name,
        wire_type="str",  # made from the function when not given
    ),
    Option(
        "timeout",
        "float",
        Config("timeout"),
        "core",
        "seconds a collective may wait for a peer",
        _seconds("timeout"),
        schema=POSITIVE,
    ),
    Option(
        "metrics_interval",
        "float",
        Config("metrics-interval"),
        "core",
        "seconds between each rank's shipments of metrics and log lines",
        _seconds("metrics_interval"),
        schema=POSITIVE,
    ),
    Option(
        "checkpoint_dir",
        "str | None",
        None,
        "checkpointing",
        "where checkpoints go (a directory every worker reaches, or a URL like s3://...)",
        _checkpoint_dir,
    ),
    Option(
        "checkpoint_every",
        "int | None",
        None,
        "checkpointing",
        "steps between periodic checkpoints (needs checkpoint_dir)",
        _optional(_positive_int("checkpoint_every", " (steps)")),
        kinds=(FUNCTION,),
        schema=AT_LEAST_1,
    ),
    Option(
        "keep",
        "int",
        3,
        "checkpointing",
        "how many committed checkpoints are kept",
        _keep,
        kinds=(FUNCTION,),
        schema=AT_LEAST_1,
    ),
    Option(
        "async_checkpoint",
        "bool",
        True,
        "checkpointing",
        "save checkpoints in the background while training goes on",
        bool,
        kinds=(FUNCTION,),
    ),
    Option(
        "resume",
        "str | None",
        None,
        "checkpointing",
        "'auto' (the newest checkpoint in checkpoint_dir, if any) or a checkpoint's path",
        _resume,
        kinds=(FUNCTION,),
    ),
    Option(
        "tensorboard_dir",
        "str | None",
        None,
        "checkpointing",
        "write every ctx.log scalar there as TensorBoard events",
        _directory_path,
    ),
    Option(
        "max_restarts",
        "int",
        Config("max-restarts"),
        "faults",
        "how many times the gang restarts after a lost worker (or a hang, a rollback)",
        _max_restarts,
        schema=AT_LEAST_0,
    ),
    Option(
        "mesh",
        "dict[str, int] | None",
        None,
        "parallelism",
        "the ranks' layout, e.g. {'dp': 2, 'tp': 2}; one size may be -1 (the rest)",
        wire=_copy_or_none,
        kinds=(FUNCTION,),
    ),  # checked with the strategy and world size by check()
    Option(
        "precision",
        "str",
        "fp32",
        "training",
        "'bf16' (autocast) or 'fp16' (autocast and a grad scaler; CUDA only)",
        _one_of("precision", PRECISIONS, str(PRECISIONS)),
        choices=PRECISIONS,
        kinds=(FUNCTION,),
    ),
    Option(
        "grad_accum",
        "int",
        1,
        "training",
        "micro-batches per optimizer step",
        _positive_int("grad_accum", ""),
        kinds=(FUNCTION,),
        schema=AT_LEAST_1,
    ),
    Option(
        "clip_grad_norm",
        "float | None",
        None,
        "training",
        "clip the whole model's gradient norm to this",
        _clip,
        kinds=(FUNCTION,),
        schema=POSITIVE,
    ),
    Option(
        "microbatches",
        "int | None",
        None,
        "parallelism",
        "pp or a 3-D mesh: micro-batches per schedule step (default: the stages)",
        _optional(_positive_int("microbatches", "")),
        kinds=(FUNCTION,),
        schema=AT_LEAST_1,
    ),
    Option(
        "schedule",
        "str | None",
        None,
        "parallelism",
        "pp: 'gpipe' (default) or '1f1b'",
        _schedule,
        choices=SCHEDULES,
        kinds=(FUNCTION,),
    ),
    Option(
        "split",
        "list[str] | None",
        None,
        "parallelism",
        "pp: the module names where stages 1.. begin",
        _split,
        kinds=(FUNCTION,),
    ),
    Option(
        "reshard_after_forward",
        "bool | None",
        None,
        "parallelism",
        "fsdp: free the gathered blocks after the forward pass",
        _flag("reshard_after_forward", optional=True),
        kinds=(FUNCTION,),
    ),
    Option(
        "cpu_offload",
        "bool | None",
        None,
        "parallelism",
        "fsdp: keep parameters and optimizer state in CPU memory",
        _flag("cpu_offload", optional=True),
        kinds=(FUNCTION,),
    ),
    Option(
        "model",
        "Any",
        None,
        "parallelism",
        "an nn.Module or a function that builds one: checked against the layout at launch "
        "(on the meta device), built by ctx.prepare()",
        wire=None,
        kinds=(FUNCTION,),
    ),
    Option(
        "plan",
        "dict[str, Any] | None",
        None,
        "parallelism",
        "tp and 2-D: module name -> 'colwise', 'rowwise' or a ParallelStyle",
        wire=None,
        kinds=(FUNCTION,),
    ),
    Option(
        "env",
        "dict[str, str] | None",
        None,
        "code",
        "environment variables of each rank, on top of the cluster's env (NCCL settings...; "
        'docs: guide/multi-node, "Network settings")',
        check_env,
        _copy_or_none,
    ),
    Option(
        "working_dir",
        "str | None",
        None,
        "code",
        "a directory shipped to every worker: its modules and files; the ranks' cwd",
        _working_dir,
    ),
    Option(
        "py_modules",
        "list[Any] | None",
        None,
        "code",
        "modules (or their names) shipped to every worker; a package goes whole",
        _py_modules,
        _module_names,
        wire_type="list[str] | None",
    ),
    Option(
        "queue",
        "str | None",
        None,
        "sharing",
        "the queue it runs in (default: clustersdk.scheduling.default-queue)",
        _queue,
    ),
    Option(
        "priority",
        "int | str | None",
        None,
        "sharing",
        "a class ('low', 'normal', 'high') or an int; higher runs first and may preempt "
        "lower (default: clustersdk.scheduling.default-priority)",
        _priority,
    ),
    Option(
        "preemptible",
        "bool",
        True,
        "sharing",
        "may be suspended (or stopped) for a higher-priority job; False needs priority "
        "normal or higher",
        _flag("preemptible"),
    ),
    Option(
        "time_limit",
        "float | None",
        None,
        "sharing",
        "an estimate of its run time in seconds: lets backfill plan around it",
        _optional(_seconds("time_limit")),
        schema=POSITIVE,
    ),
    Option(
        "min_world_size",
        "int | None",
        None,
        "sharing",
        "it may start (or resume) on this many ranks or more, up to world_size",
        schema=AT_LEAST_1,
    ),
    Option(
        "hang_timeout",
        "float | None",
        None,
        "faults",
        "seconds without a finished step before the job is HUNG (default: max(60 s, 20x "
        "the slowest recent step))",
        _optional(_seconds("hang_timeout")),
        schema=POSITIVE,
    ),
    Option(
        "on_hang",
        "str",
        "report",
        "faults",
        "what a HUNG job does: 'report', 'restart' (within max_restarts) or 'fail'",
        _one_of("on_hang", ON_HANG),
        choices=ON_HANG,
    ),
    Option(
        "on_error",
        "str",
        "fail",
        "debugging",
        "what a rank that raises does: 'fail' the job, or 'hold' it (HELD, for job.debug)",
        _one_of("on_error", ON_ERROR),
        choices=ON_ERROR,
        kinds=(FUNCTION,),
    ),
    Option(
        "hold_timeout",
        "float",
        Config("hold-timeout"),
        "debugging",
        "seconds a HELD job waits for you before it fails",
        _seconds("hold_timeout", " (how long a HELD job waits for you before it fails)"),
        kinds=(FUNCTION,),
        schema=POSITIVE,
    ),
    Option(
        "debug",
        "bool",
        False,
        "debugging",
        "ctx.breakpoint() pauses the job and opens a pdb console (else it does nothing)",
        _flag("debug"),
        kinds=(FUNCTION,),
    ),
    Option(
        "hparams",
        "dict[str, Any] | None",
        None,
        "live",
        "ctx.hparams: names -> numbers, strings or booleans that job.update may change",
        check_hparams,
        _copy_or_none,
        kinds=(FUNCTION,),
    ),
    Option(
        "on_nan",
        "str",
        "report",
        "diagnosis",
        "what a NaN or Inf loss does: 'report', 'pause', 'rollback' (needs checkpoint_dir) "
        "or 'fail'",
        _one_of("on_nan", ON_NAN),
        choices=ON_NAN,
        kinds=(FUNCTION,),
    ),
    Option(
        "on_spike",
        "str",
        "report",
        "diagnosis",
        "what a loss spike does: 'report' or 'pause'",
        _one_of("on_spike", ON_SPIKE),
        choices=ON_SPIKE,
        kinds=(FUNCTION,),
    ),
    Option(
        "script",
        "str | None",
        None,
        "scripts",
        "a Python file each rank runs as `python -u script *args`, torchrun's way (launch_script)",
        _script,
        kinds=(SCRIPT,),
    ),
    Option(
        "module",
        "str | None",
        None,
        "scripts",
        "a module each rank runs as `python -u -m module *args` (instead of script)",
        _module,
        kinds=(SCRIPT,),
    ),
    Option(
        "command",
        "str | None",
        None,
        "scripts",
        "a console command each rank runs as `command *args`, found on the workers' PATH "
        "(instead of script)",
        _command,
        kinds=(SCRIPT,),
    ),
    Option(
        "grace",
        "float",
        Config("term-grace"),
        "scripts",
        "seconds a script's rank has to exit after SIGTERM (stop, suspend, preemption) "
        "before SIGKILL",
        _seconds("grace"),
        kinds=(SCRIPT,),
        schema=POSITIVE,
    ),
)
OPTIONS_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
NAMES: tuple[str, ...] = tuple(OPTIONS_BY_NAME)


def names(kind: str) -> tuple[str, ...]:
    """The options a job of ``kind`` (:data:`FUNCTION` or :data:`SCRIPT`) takes, in order.

    >>> "grace" in names(SCRIPT), "grace" in names(FUNCTION), "strategy" in names(SCRIPT)
    (True, False, False)
    """
    return tuple(o.name for o in OPTIONS if kind in o.kinds)


# --- defaults ----------------------------------------------------------------------------------
def default(name: str) -> Any:
    """Option ``name``'s default: its setting's value now (checked), or the one written above.

    >>> import dask.config
    >>> with dask.config.set({"clustersdk.hold-timeout": 60}):
    ...     default("hold_timeout")
    60.0
    """
    option = OPTIONS_BY_NAME[name]
    key = option.setting
    if key is None:
        if option.default is REQUIRED:
            raise SpecError(f"{name} has no default: give it")
        return option.default
    from . import config

    value = config.get(key)
    try:
        return option.check(value)
    except SpecError as e:
        env = "DASK_CLUSTERSDK__" + key.upper().replace("-", "_")
        raise SpecError(
            f"the setting clustersdk.{key} is invalid ({e}); fix it in "
            f"clustersdk.yaml, dask.config or {env}"
        ) from None


def spec_field(name: str) -> Any:
    """A dataclass field for option ``name``: its default, or for a setting a factory
    that reads it when the instance is made (so a spec journaled without the field
    reads with the setting)."""
    option = OPTIONS_BY_NAME[name]
    if option.setting is None:
        return dataclasses.field(default=default(name))
    return dataclasses.field(default_factory=lambda: default(name))


# --- checking a whole set ----------------------------------------------------------------------
def check(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of ``values`` (a name -> value for each option) checked and normalized,
    settings filled in where the value is None; or a :class:`SpecError` naming the bad one.

    >>> check({**{n: OPTIONS_BY_NAME[n].launch_default for n in NAMES}, "world_size": 2,
    ...        "strategy": "fsdp", "mesh": {"dp": -1}})["mesh"]
    {'dp': -1}
    """
    kind = kind_of(values)
    _check_kind(values, kind)
    out = {}
    for option in OPTIONS:
        value = values[option.name]
        if kind not in option.kinds:  # not given (checked above): stays unset, no setting read
            out[option.name] = value
            continue
        if value is None and option.setting is not None:
            value = default(option.name)
        out[option.name] = option.check(value)
    _check_parallel(out)
    _check_together(out)
    return out


def kind_of(values: Mapping[str, Any]) -> str:
    """:data:`SCRIPT` when ``values`` name a script, module or command to run, else
    :data:`FUNCTION`."""
    return SCRIPT if any(values.get(n) is not None for n in ENTRY_POINTS) else FUNCTION


def _check_kind(values: Mapping[str, Any], kind: str) -> None:
    """Every option given belongs to the job's kind; a script job runs one thing."""
    given = [n for n in ENTRY_POINTS if values.get(n) is not None]
    if len(given) > 1:
        raise SpecError(
            f"a script job runs one thing: give script=, module= or command=, not "
            f"{' and '.join(f'{n}=' for n in given)}"
        )
    other, launcher = (
        (FUNCTION, "cluster.launch(fn, ...)")
        if kind == SCRIPT
        else (SCRIPT, "cluster.launch_script(...)")
    )
    wrong = [
        o.name
        for o in OPTIONS
        if kind not in o.kinds and _is_given(values[o.name], o.launch_default)
    ]
    if wrong:
        what = "a training function" if kind == FUNCTION else "a script"
        verb = "is an option" if len(wrong) == 1 else "are options"
        raise SpecError(
            f"{', '.join(f'{n}=' for n in wrong)} {verb} of {other} jobs "
            f"({launcher}), not of a job that runs {what}"
        )


def _is_given(value: Any, launch_default: Any) -> bool:
    return value is not None if launch_default is None else value != launch_default


def _check_parallel(spec: dict[str, Any]) -> None:
    from .layout import Layout

    layout = Layout.resolve(spec["strategy"], spec["mesh"], spec["world_size"])
    if spec["mesh"] is not None:
        spec["mesh"] = dict(spec["mesh"])
    for name, strategy in ONLY_FOR.items():
        # a pipeline's options also go with a 3-D mesh (strategy 'fsdp' with 'pp')
        if (
            spec[name] is not None
            and spec["strategy"] != strategy
            and not (strategy == "pp" and layout.pipelined)
        ):
            also = (
                " (or of strategy='fsdp' with a mesh that has a 'pp' dimension)"
                if strategy == "pp"
                else ""
            )
            raise SpecError(
                f"{name}= is an option of strategy={strategy!r}, not {spec['strategy']!r}{also}"
            )
    if spec["plan"] is not None and layout.size("tp") == 1:
        raise SpecError(
            "plan= is for tensor parallelism: use strategy='tp', or 'fsdp' with a "
            "mesh that has a 'tp' dimension"
        )
    if not layout.pipelined:
        return
    stages, micro, split = layout.size("pp"), spec["microbatches"], spec["split"]
    if spec["schedule"] == "1f1b" and (micro or stages) < stages:
        raise SpecError(
            f"schedule='1f1b' needs at least as many microbatches as stages: "
            f"microbatches={micro}, pp={stages}"
        )
    if split is not None and len(split) + 1 != stages:
        raise SpecError(
            f"split={split} makes {len(split) + 1} stages, but the pipeline has pp={stages} ranks"
        )


def _check_together(spec: dict[str, Any]) -> None:
    needs_dir = [n for n in ("checkpoint_every", "resume") if spec[n] is not None]
    if needs_dir and spec["checkpoint_dir"] is None:
        raise SpecError(f"{' and '.join(needs_dir)} need checkpoint_dir=...")
    low, size = spec["min_world_size"], spec["world_size"]
    if low is not None and (
        isinstance(low, bool) or not isinstance(low, int) or not 1 <= low <= size
    ):
        raise SpecError(f"min_world_size must be an int from 1 to world_size={size}, got {low!r}")
    if spec["on_hang"] == "restart" and not spec["max_restarts"]:
        raise SpecError(
            "on_hang='restart' needs max_restarts=1 or more (a restart after a "
            "hang counts against it)"
        )
    if spec["on_nan"] == "rollback" and spec["checkpoint_dir"] is None:
        raise SpecError(
            "on_nan='rollback' needs checkpoint_dir=... (it restarts from the "
            "newest checkpoint, skipping the batch of the non-finite step)"
        )


def to_wire(values: Mapping[str, Any]) -> dict[str, Any]:
    """The options of checked ``values`` that cross the wire, in their wire form."""
    # an option of the other kind of job, unset, takes WireSpec's default
    return {
        o.name: o.wire(values[o.name])
        for o in OPTIONS
        if o.wire is not None and not (o.setting is not None and values[o.name] is None)
    }


# --- documentation -----------------------------------------------------------------------------
def describe(group: str | None = None) -> str:
    """Every option (or one group's) as text: name, default and doc, by group.

    >>> print(describe("live"))
    live: what job.update may change (docs: guide/live)
      hparams=None  ctx.hparams: names -> numbers, strings or booleans that job.update may change
    """
    blocks = []
    for name, (what, page) in GROUPS.items():
        if group is not None and name != group:
            continue
        lines = [f"{name}: {what} (docs: {page})"]
        for option in OPTIONS:
            if option.group == name:
                lines.append(f"  {option.name}={_shown_default(option)}  {option.doc}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _shown_default(option: Option) -> str:
    if option.default is REQUIRED:
        return "(required)"
    if option.setting is not None:
        return f"(setting clustersdk.{option.setting})"
    return repr(option.default)
