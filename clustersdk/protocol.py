"""What crosses the wire: the one module the kernel, the control plane and the agents share.

Pure (no Dask, no torch): importing it costs nothing, so every side can.

::

    kernel (Cluster, Job)  ──Op──>  scheduler: control plane  ──WorkerOp──>  worker: agent
          ^                              │   ^                                   │
          └──── topic(job): Message ─────┘   └──────── Op.RANK_EVENT: RankEvent ─┘

- :class:`WireSpec`: the job spec as the scheduler and the ranks see it, a
  frozen dataclass sent as a plain dict (:meth:`WireSpec.as_dict`), versioned.
  Its fields are the launch options that cross the wire (:mod:`clustersdk.options`
  holds their defaults: a journal written before a field existed reads with it).
- :class:`Word`: the control vector's entries (see :mod:`clustersdk.runtime.control_words`).
- :class:`Op` / :class:`WorkerOp`: the RPC operations, reached with :func:`op`.
- :class:`RankEvent`, :class:`ExitStatus`: what a rank reports.
- :func:`topic` and the message kinds published on it (``Message``).
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from .errors import ProtocolError
from .options import spec_field

VERSION = 1  # of WireSpec and the messages; a newer peer's spec is refused, an older one read

HANDLER_PREFIX = "clustersdk_"
TOPIC_PREFIX = "clustersdk-job-"
EXIT_TOPIC = "clustersdk-worker-exit"  # a nanny's report of how its worker process ended
# what a standing cluster's supervisor tells a process it started again (JSON: the process,
# its restart count, how its predecessor ended): the control plane journals it
ENV_RESTART = "CLUSTERSDK_RESTART"
#: A Cluster.slurm worker's: Slurm warns it (SIGUSR1) this many seconds before its walltime.
ENV_SLURM_NOTICE = "CLUSTERSDK_SLURM_NOTICE"


# --- the control vector ------------------------------------------------------------------
class Word(enum.IntEnum):
    """Positions in the control vector. Each entry only ever grows (element-wise max
    merges copies in any order)."""

    STOP = 0  # 1 once a stop is asked
    SUSPEND = 1  # 1 once a suspend is asked
    PAUSE = 2  # pause generation: incremented by every pause
    RESUME = 3  # resume generation: equal to PAUSE after a resume
    CHECKPOINT = 4  # sequence number of the newest checkpoint request
    PROFILE = 5  # the newest profile request: profile_word(seq, steps)
    RUN = 6  # sequence number of the newest job.run request (code run on the ranks)
    UPDATE = 7  # sequence number of the newest job.update (hyperparameters changed)
    RELEASE = 8  # breakpoints released: a rank at its k-th ctx.breakpoint waits for >= k
    NONFINITE = 9  # raised by the ranks themselves: 1 + the step of a non-finite loss


def no_words() -> list[int]:
    """A control vector that asks for nothing."""
    return [0] * len(Word)


PROFILE_STEPS_BITS = 16  # a profile covers at most 2**16 - 1 steps
MAX_PROFILE_STEPS = 1000  # more makes traces of gigabytes


def profile_word(seq: int, steps: int) -> int:
    """The PROFILE word of request ``seq`` for ``steps`` steps: one int, so that the
    element-wise max keeps the newest request together with its step count.

    >>> profile_request(profile_word(3, 5))
    (3, 5)
    """
    return (seq << PROFILE_STEPS_BITS) | steps


def profile_request(word: int) -> tuple[int, int]:
    """``(seq, steps)`` of a PROFILE word (``(0, 0)``: none asked)."""
    return word >> PROFILE_STEPS_BITS, word & ((1 << PROFILE_STEPS_BITS) - 1)


#: The phases of a step each rank times (:mod:`clustersdk.runtime.phases`), in the order
#: of a phase row's values after its step: ``[step, *PHASES]``, in seconds.
PHASES = ("data", "compute", "optimizer", "checkpoint", "sync", "total")


# --- operations ----------------------------------------------------------------------------
class Op(str, enum.Enum):
    """Handlers of the control plane on the scheduler."""

    WORKER_READY = "worker_ready"
    INVENTORY = "inventory"
    SUBMIT = "submit"
    JOB = "job"
    JOBS = "jobs"
    WAIT = "wait"
    STOP = "stop"
    PAUSE = "pause"
    RESUME = "resume"
    CHECKPOINT = "checkpoint"
    SUSPEND = "suspend"
    HISTORY = "history"
    STEPS = "steps"  # per-step summaries over the ranks: mean, min, max
    LOGS = "logs"
    SYSTEM = "system"
    RANK_EVENT = "rank_event"
    SET_CAPACITY = "set_capacity"  # an autoscaling deployer: how far it grows, why jobs wait
    QUEUE = "queue"  # the queues: who holds what, what waits and why
    CONFIGURE = "configure"  # an admin's change of the scheduling settings
    STACKS = "stacks"  # where each rank of a job is (its training thread's stack)
    PROFILE = "profile"  # capture torch.profiler traces for N steps
    PROFILE_WAIT = "profile_wait"  # the profile of request seq, once every rank reported
    PHASES = "phases"  # the per-step phase timings of a job
    DEBUG = "debug"  # a HELD rank's failing stack with its locals
    RESTART = "restart"  # a HELD job: restart from its newest checkpoint
    CONSOLE = "console"  # a breakpoint's pdb session: input in, transcript out
    RUN = "run"  # job.run: a function for some ranks at their next boundary
    RUN_WAIT = "run_wait"  # the results of job.run request seq, once every rank reported
    UPDATE = "update"  # job.update: hyperparameters changed at one step boundary
    LIVE_PENDING = (
        "live_pending"  # from a rank: the job.run / job.update requests it must carry out
    )
    WHOAMI = "whoami"  # the identity a request comes from, and what it may do
    CLUSTER_EVENTS = "cluster_events"  # a standing cluster's restarts of its processes
    REVOKE = "revoke"  # an admin's new revocation list: refused from now on
    DRAIN = "drain"  # an admin takes a host (or a worker) out: its jobs move, no new ranks
    UNDRAIN = "undrain"  # ... and gives it back
    NOTICE = "notice"  # from a worker: it goes away soon (SIGTERM); its jobs move first
    FORK = "fork"  # job.fork: a new job from a checkpoint of this one, which goes on

    @property
    def handler(self) -> str:
        return HANDLER_PREFIX + self.value


class WorkerOp(str, enum.Enum):
    """Handlers of the agent on each worker."""

    OPEN_STORE = "open_store"
    START_RANK = "start_rank"
    CONTROL = "control"
    STACKS = "stacks"  # where the job's rank on this worker is (its Python stack)
    CONSOLE = "console"  # a line of input for the rank's pdb session
    END_RANK = "end_rank"  # kill the job's rank process here (a hung rank); the worker stays
    REVOKE = "revoke"  # a new revocation list for this worker's listeners

    @property
    def handler(self) -> str:
        return HANDLER_PREFIX + self.value


def op(rpc: Any, operation: Op | WorkerOp) -> Any:
    """The coroutine function that calls ``operation`` through a Dask RPC object
    (``client.scheduler``, ``worker.scheduler`` or ``scheduler.rpc(address)``)."""
    return getattr(rpc, operation.handler)


# --- what ranks report ---------------------------------------------------------------------
class RankEvent(str, enum.Enum):
    STARTED = "started"  # inside the user's function
    METRICS = "metrics"  # rows, logs and samples only
    LOOP = "loop"  # total_steps of ctx.loop (rank 0)
    RESTORED = "restored"  # step, path: a checkpoint was loaded (rank 0)
    PAUSED = "paused"  # step
    RESUMED = "resumed"  # step
    CHECKPOINT = "checkpoint"  # seq, step, path: committed (rank 0)
    CHECKPOINT_FAILED = "checkpoint_failed"  # seq, step, message (rank 0)
    PROFILED = "profiled"  # seq, profile: this rank's trace and summary
    TUNABLE = "tunable"  # info: what job.update may change here (its optimizers...)
    RAN = "ran"  # seq, result (pickled) or error: a job.run on this rank
    UPDATED = "updated"  # seq, step, changes {key: [old, new]} or error
    NONFINITE = "nonfinite"  # step, values: a watched scalar was NaN or Inf
    FAILED = "failed"  # error: the rank raised
    HELD = "held"  # error, frames, step: raised under on_error="hold"
    BREAK = "break"  # k, step: at its k-th ctx.breakpoint(), pdb opens
    CONSOLE = "console"  # k, text, closed: what the rank's pdb session printed
    CONTROLS = "controls"  # accepts: what a script rank opted into (pause...)
    EXIT = "exit"  # status (ExitStatus), result (rank 0): the rank is gone


#: What a rank reports without waiting for the control plane to have heard it: facts for
#: progress bars and dashboards. Its worker still sends them in order, before anything the
#: rank says later; every other report is waited for (a pause, a checkpoint, a failure).
NOTICES = frozenset({RankEvent.STARTED, RankEvent.LOOP, RankEvent.RESTORED, RankEvent.TUNABLE})


class ExitStatus(str, enum.Enum):
    OK = "ok"  # returned
    STOPPED = "stopped"  # left ctx.loop on a stop
    SUSPENDED = "suspended"  # left ctx.loop after its suspend checkpoint
    FAILED = "failed"  # raised
    LOST = "lost"  # its worker left the cluster (set by the control plane)
    NOT_STARTED = "not started"  # its worker could not start it (set by the control plane)


# --- topics and messages ---------------------------------------------------------------------
def topic(job: str) -> str:
    """The Dask event topic of a job: status changes, metrics, checkpoints."""
    return TOPIC_PREFIX + job


class Row(TypedDict):
    rank: int
    step: int
    time: float
    scalars: dict[str, float]


class MetricsMessage(TypedDict, total=False):
    kind: Literal["metrics"]
    rank: int
    attempt: int
    sent: float  # when the rank sent it (time.time())
    event: str  # the RankEvent it came with, if any
    rows: list[Row]
    logs: list[tuple[int, float, str, str]]  # rank, time, stream, text
    system: list[dict[str, Any]]  # rank, time, sample
    phases: list[list[float]]  # [step, *PHASES] of this rank's steps


class StepBand(TypedDict):
    """One step of a job's scalars over its ranks: per scalar ``[min, mean, max]``."""

    step: int
    time: float  # when its newest row was logged
    oldest: float  # when the oldest row new in this message was logged
    ranks: int  # how many ranks logged the step so far
    scalars: dict[str, list[float]]


class SystemBand(TypedDict):
    """One tick's system samples over the ranks: per reading ``[min, mean, max]``."""

    time: float
    source: str  # "nvml" or "psutil"
    ranks: int
    fields: dict[str, list[float]]


class PhaseBand(TypedDict):
    """One step's phases over the ranks (each list in :data:`PHASES` order)."""

    step: int
    ranks: int
    min: list[float]
    mean: list[float]
    max: list[float]
    slowest: int  # the rank whose own work (data, compute, optimizer,
    slowest_work: float  # checkpoint) took longest, and those seconds


class StepsMessage(TypedDict):
    """What kernels get of a job of more ranks than ``clustersdk.dashboard.aggregate-above``,
    once per tick, instead of every rank's :class:`MetricsMessage`: bands over the ranks
    (a chart needs one point per pixel). The per-rank rows are in the journal
    (``job.history()``); ``job.steps()`` reads the same bands back."""

    kind: Literal["steps"]
    attempt: int
    steps: list[StepBand]  # the steps that changed, in step order
    system: SystemBand | None
    phases: list[PhaseBand]
    logs: list[tuple[int, float, str, str]]  # rank, time, stream, text


class StatusMessage(TypedDict):
    kind: Literal["status"]
    status: str  # a JobStatus name
    attempt: int


class ProgressMessage(TypedDict):
    kind: Literal["progress"]
    total_steps: int


class CheckpointMessage(TypedDict):
    kind: Literal["checkpoint"]
    path: str
    step: int


class CheckpointFailedMessage(TypedDict):
    kind: Literal["checkpoint_failed"]
    step: int
    message: str


class ProfileMessage(TypedDict):
    """A profile request's traces are complete (or the job ended before they were)."""

    kind: Literal["profile"]
    seq: int


class ConsoleMessage(TypedDict):
    """A breakpoint's pdb session on ``rank`` printed ``text`` (``open`` False: it ended).
    ``seq`` numbers the job's console messages, so that a transcript read later and the
    messages that follow it are joined without a gap or a repeat."""

    kind: Literal["console"]
    seq: int
    rank: int
    k: int  # the rank's k-th ctx.breakpoint()
    text: str
    open: bool


class UpdatedMessage(TypedDict):
    """``job.update`` request ``seq`` took effect before ``step`` (the loss chart's marker)."""

    kind: Literal["updated"]
    seq: int
    step: int
    changes: dict[str, list[Any]]  # key -> [old, new]


class DiagnosisMessage(TypedDict):
    """What went wrong, and what to do (a :class:`clustersdk.diagnosis.Diagnosis`
    as a dict)."""

    kind: Literal["diagnosis"]
    diagnosis: dict[str, Any]


class ControlsMessage(TypedDict):
    """What a script job's ranks accept changed (they opted into step boundaries): buttons
    read the job's record again."""

    kind: Literal["controls"]
    controls: list[str]


class RollbackMessage(TypedDict):
    """Rows of steps at or after ``step`` were rolled back (a restart or resume
    replays them): forget them."""

    kind: Literal["rollback"]
    step: int


Message = (
    MetricsMessage
    | StepsMessage
    | StatusMessage
    | ProgressMessage
    | CheckpointMessage
    | CheckpointFailedMessage
    | ProfileMessage
    | RollbackMessage
    | ConsoleMessage
    | UpdatedMessage
    | DiagnosisMessage
    | ControlsMessage
)


def what_runs(spec: Mapping[str, Any]) -> str:
    """How a job's record names what it runs: its strategy, or for a script job
    ``"script train.py"`` (``-m pkg.train``, a command).

    >>> what_runs({"strategy": "fsdp"}), what_runs({"script": "/a/t.py", "fn": "t.py"})
    ('fsdp', 'script t.py')
    """
    if spec.get("script") or spec.get("module") or spec.get("command"):
        return f"script {spec.get('fn')}"
    return str(spec.get("strategy", "?"))


# --- the job spec ------------------------------------------------------------------------------
def new_id() -> str:
    """A job id: 12 hex digits."""
    return uuid.uuid4().hex[:12]


@dataclasses.dataclass(frozen=True)
class WireSpec:
    """A job as the control plane and the ranks see it: every option, no Python objects.

    Built by :meth:`clustersdk.JobSpec.to_wire` (which validates), kept in the
    journal, sent to each rank. A restart or resume makes a new one with
    :meth:`replace`. Each launch option's default is :mod:`clustersdk.options`'s (a
    setting's, such as ``timeout``, read from the configuration when the spec is made).

    >>> spec = WireSpec(id="a1", name="a", world_size=2)
    >>> spec.keep, spec.replace(attempt=1).attempt
    (3, 1)
    >>> WireSpec.from_dict(spec.as_dict()) == spec
    True
    """

    id: str
    name: str
    world_size: int
    fn: str = "job"  # the training function's qualified name
    owner: str | None = None  # who launched it (login name)
    # the launch options that cross the wire (each one's doc: clustersdk.options)
    # >>> generated: wirespec-fields (python -m clustersdk.codegen)
    strategy: str = spec_field("strategy")
    timeout: float = spec_field("timeout")
    metrics_interval: float = spec_field("metrics_interval")
    checkpoint_dir: str | None = spec_field("checkpoint_dir")
    checkpoint_every: int | None = spec_field("checkpoint_every")
    keep: int = spec_field("keep")
    async_checkpoint: bool = spec_field("async_checkpoint")
    resume: str | None = spec_field("resume")
    tensorboard_dir: str | None = spec_field("tensorboard_dir")
    max_restarts: int = spec_field("max_restarts")
    mesh: dict[str, int] | None = spec_field("mesh")
    precision: str = spec_field("precision")
    grad_accum: int = spec_field("grad_accum")
    clip_grad_norm: float | None = spec_field("clip_grad_norm")
    microbatches: int | None = spec_field("microbatches")
    schedule: str | None = spec_field("schedule")
    split: list[str] | None = spec_field("split")
    reshard_after_forward: bool | None = spec_field("reshard_after_forward")
    cpu_offload: bool | None = spec_field("cpu_offload")
    env: dict[str, str] | None = spec_field("env")
    working_dir: str | None = spec_field("working_dir")
    py_modules: list[str] | None = spec_field("py_modules")
    queue: str | None = spec_field("queue")
    priority: int | str | None = spec_field("priority")
    preemptible: bool = spec_field("preemptible")
    time_limit: float | None = spec_field("time_limit")
    min_world_size: int | None = spec_field("min_world_size")
    hang_timeout: float | None = spec_field("hang_timeout")
    on_hang: str = spec_field("on_hang")
    on_error: str = spec_field("on_error")
    hold_timeout: float = spec_field("hold_timeout")
    debug: bool = spec_field("debug")
    hparams: dict[str, Any] | None = spec_field("hparams")
    on_nan: str = spec_field("on_nan")
    on_spike: str = spec_field("on_spike")
    script: str | None = spec_field("script")
    module: str | None = spec_field("module")
    command: str | None = spec_field("command")
    grace: float = spec_field("grace")
    # <<< generated
    # what the control plane adds
    attempt: int = 0  # gang starts after the first (restarts, resumes)
    asked_world_size: int | None = None  # running on fewer than asked: the size to regain
    profile_dir: str | None = None  # the control plane's state dir (profile traces)
    args: list[str] | None = None  # the script's arguments
    skip_steps: list[int] | None = None  # steps whose batch is drawn and dropped (rollbacks)
    parent: str | None = None  # the job it was forked from (job.fork) ...
    forked_at: int | None = None  # ... at the step its checkpoint resumes from
    version: int = VERSION

    @property
    def kind(self) -> str:
        """``"script"`` for a job of :meth:`~clustersdk.Cluster.launch_script` (a script,
        a module or a console command), else ``"function"``."""
        return "script" if self.script or self.module or self.command else "function"

    def as_dict(self) -> dict[str, Any]:
        """The msgpack- and JSON-able form that crosses the wire and sits in the journal."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WireSpec:
        """Read a spec sent or journaled by this or an older clustersdk.

        Missing fields take their defaults (an older release did not have them);
        a newer version, or fields this release does not know, are refused:
        acting on half of a spec would run something else than was asked.
        """
        version = data.get("version", 1)
        if not isinstance(version, int) or version > VERSION:
            raise ProtocolError(
                f"job spec version {version!r} is newer than this clustersdk's ({VERSION}); "
                "install the same clustersdk release in the kernel, scheduler and workers"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ProtocolError(
                f"job spec has fields this clustersdk does not know: {', '.join(unknown)}; "
                "install the same clustersdk release in the kernel, scheduler and workers"
            )
        return cls(**data)

    def replace(self, **changes: Any) -> WireSpec:
        return dataclasses.replace(self, **changes)
