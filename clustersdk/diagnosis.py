"""Failure diagnosis: what went wrong, in a sentence, and what to do about it.

Pure (no Dask, torch or I/O). :func:`diagnose` reads a job's error record (a
rank's exception: ``type``, ``message``, ``traceback``, and the ``facts``
attached to it: the rank's CUDA memory peaks, where every rank was, how a
lost worker's process ended) and returns a :class:`Diagnosis`, or ``None``
when the failure is none of the kinds below: no diagnosis is better than a
guess. The builders at the end make the diagnoses that are not failures
(a non-finite loss, a loss spike, ranks on different versions).

====================  =====================================================================
kind                  recognised from
====================  =====================================================================
cuda_oom              ``torch.OutOfMemoryError`` / "CUDA out of memory" (+ the rank's peaks)
host_oom              a rank its worker killed for passing the worker's memory limit, or
                      one killed by SIGKILL near it (the kernel's OOM killer); the same of a
                      lost worker and its nanny; ``MemoryError``, "DefaultCPUAllocator:
                      can't allocate memory"
cuda_error            "CUDA error: ..." other than out of memory: a device-side assert, an
                      illegal memory access (the rank's process, its context poisoned, is gone)
crash                 a rank's process that died of SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT
                      (not NCCL's watchdog): a crash in native code
collective_timeout    gloo "Timed out waiting ...ms for recv/send", NCCL's watchdog timeout,
                      the rendezvous ("N/M clients joined", "wait timeout ... keys")
duplicate_gpu         NCCL "Duplicate GPU detected : rank A and rank B both on CUDA device"
port_in_use           EADDRINUSE, "Address already in use", a full rendezvous port range
version_mismatch      :func:`version_mismatch`: the versions the ranks report as they start
nonfinite             :func:`nonfinite` (a NaN/Inf loss or gradient norm); autograd's
                      anomaly mode ("returned nan values")
loss_spike            :func:`loss_spike` (see :mod:`.signals`)
====================  =====================================================================

>>> d = diagnose({"rank": 1, "type": "DistBackendError", "message": "NCCL error ... Last "
...               "error:\\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"})
>>> d.kind, d.summary
('duplicate_gpu', 'ranks 1 and 0 are on the same GPU (CUDA device 1000)')
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

#: Every kind of diagnosis, and what it is called in a sentence.
KINDS: dict[str, str] = {
    "cuda_oom": "CUDA out of memory",
    "host_oom": "host out of memory",
    "cuda_error": "fatal CUDA error",
    "crash": "process crashed",
    "collective_timeout": "collective timed out",
    "duplicate_gpu": "two ranks on one GPU",
    "port_in_use": "port already in use",
    "version_mismatch": "versions differ between ranks",
    "nonfinite": "non-finite loss",
    "loss_spike": "loss spike",
}

# the versions that must agree between ranks (a CUDA driver may differ)
COMPARED_VERSIONS = ("python", "torch", "nccl", "clustersdk", "distributed", "cloudpickle")
NEAR_LIMIT = 0.8  # a SIGKILLed worker at this fraction of its memory limit: the OOM killer


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What went wrong (``kind``, a one-line ``summary``, the ``detail``), what to do
    (``advice``), where (``rank``, ``worker``, ``host``, ``step``) and the figures it
    rests on (``data``). ``time`` is when the control plane made it.

    >>> d = Diagnosis("loss_spike", "loss spike at step 40 on rank 0", "look at the batch")
    >>> str(d)
    'loss spike at step 40 on rank 0 — look at the batch'
    >>> Diagnosis.from_dict(d.as_dict()) == d
    True
    """

    kind: str
    summary: str
    advice: str
    detail: str = ""
    rank: int | None = None
    worker: str | None = None
    host: str | None = None
    step: int | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    time: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"unknown diagnosis kind {self.kind!r}; expected one of {', '.join(KINDS)}"
            )

    def __str__(self) -> str:
        return f"{self.summary} — {self.advice}"

    def as_dict(self) -> dict[str, Any]:
        """Every field as plain data (what the journal, REST and events hold)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Diagnosis:
        """Read one back (fields a newer release added are left out)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def at(self, **where: Any) -> Diagnosis:
        """The same diagnosis with ``rank``/``worker``/``host``/``step``/``time`` filled in
        where it had none."""
        fill = {k: v for k, v in where.items() if v is not None and getattr(self, k) is None}
        return dataclasses.replace(self, **fill) if fill else self


# --- failures --------------------------------------------------------------------------
def diagnose(error: Mapping[str, Any]) -> Diagnosis | None:
    """The diagnosis of a job's error record, or None when it is not a known kind.

    >>> diagnose({"rank": 0, "type": "ValueError", "message": "bad shape"}) is None
    True
    """
    for rule in RULES:
        found = rule(error)
        if found is not None:
            return found.at(rank=error.get("rank"))
    return None


def _text(error: Mapping[str, Any]) -> str:
    text = f"{error.get('type') or ''}: {error.get('message') or ''}"
    if error.get("stderr"):  # a process that ended without an exception: what it said last
        text += "\n" + "\n".join(str(line) for line in error["stderr"])
    return text


def _facts(error: Mapping[str, Any], key: str) -> dict[str, Any]:
    facts = error.get("facts") or {}
    value = facts.get(key) if isinstance(facts, Mapping) else None
    return dict(value) if isinstance(value, Mapping) else {}


def _on(rank: Any) -> str:
    return "" if rank is None else f" on rank {rank}"


CUDA_OOM_ADVICE = (
    "lower the micro-batch (ctx.shard's batch_size) and keep the global batch with grad_accum=; "
    "shard parameters, gradients and optimizer state with strategy='fsdp'; recompute "
    "activations in the backward pass (activation checkpointing, torch.utils.checkpoint); "
    "precision='bf16' halves activation memory"
)
_CUDA_OOM = re.compile(r"CUDA out of memory|CUDA error: out of memory", re.IGNORECASE)
_TRIED = re.compile(r"Tried to allocate ([\d.]+ \w+)")
# torch >= 2.1 ("capacty" in 2.1), then the older "(GPU 0; 6.00 GiB total capacity; ...)"
_CAPACITY = (
    re.compile(r"total capac\w* of ([\d.]+ \w+) of which ([\d.]+ \w+) is free"),
    re.compile(r"([\d.]+ \w+) total capacity;.*?([\d.]+ \w+) free"),
)


def _cuda_oom(error: Mapping[str, Any]) -> Diagnosis | None:
    text = _text(error)
    if not (
        _CUDA_OOM.search(text)
        or (error.get("type") == "OutOfMemoryError" and "cpu" not in text.lower())
    ):
        return None
    memory = _facts(error, "memory")
    peak, reserved, total = (memory.get(k) for k in ("max_allocated", "max_reserved", "total"))
    device = f" ({memory['device']})" if memory.get("device") else ""
    parts = []
    if peak is not None:
        parts.append(
            f"peak {fmt_bytes(peak)} allocated" + (f" of {fmt_bytes(total)}" if total else "")
        )
    tried = _TRIED.search(text)
    capacity = next((m for m in (p.search(text) for p in _CAPACITY) if m), None)
    if tried:
        parts.append(f"it tried to allocate {tried.group(1)}")
    if capacity and not total:
        parts.append(f"{capacity.group(2)} free of {capacity.group(1)}")
    advice = CUDA_OOM_ADVICE
    if peak and reserved and total and reserved - peak > 0.2 * total:
        advice += (
            "; much memory was reserved but not allocated (fragmentation): "
            "env={'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'}"
        )
    summary = f"CUDA out of memory{_on(error.get('rank'))}{device}"
    return Diagnosis(
        "cuda_oom",
        summary + (": " + ", ".join(parts) if parts else ""),
        advice,
        detail=_first_line(error),
        data={k: v for k, v in memory.items() if v is not None},
    )


HOST_OOM_ADVICE = (
    "lower the batch size, or what each rank holds in host memory (copies of the dataset, "
    "DataLoader num_workers, prefetch=), or give each worker more memory (memory_limit= of "
    "Cluster.local, dask worker --memory-limit, the pod's or Slurm job's memory)"
)
_HOST_OOM = re.compile(
    r"DefaultCPUAllocator: can't allocate memory|Cannot allocate memory|"
    r"std::bad_alloc",
    re.IGNORECASE,
)
_CPU_TRIED = re.compile(r"you tried to allocate (\d+) bytes")


def _host_oom_raised(error: Mapping[str, Any]) -> Diagnosis | None:
    text = _text(error)
    if error.get("type") != "MemoryError" and not _HOST_OOM.search(text):
        return None
    tried = _CPU_TRIED.search(text)
    what = f": an allocation of {fmt_bytes(int(tried.group(1)))} failed" if tried else ""
    return Diagnosis(
        "host_oom",
        f"host out of memory{_on(error.get('rank'))}{what}",
        HOST_OOM_ADVICE,
        detail=_first_line(error),
    )


def _lost_worker(error: Mapping[str, Any]) -> Diagnosis | None:
    """A worker that left: over its memory limit (the nanny's kill), or SIGKILLed near it."""
    if error.get("type") != "WorkerLost":
        return None
    facts = _facts(error, "worker")
    limit, rss, code = facts.get("memory_limit"), facts.get("rss"), facts.get("exitcode")
    worker = facts.get("worker") or "?"
    rank = error.get("rank")
    signal = (
        f"signal {-code}, {_SIGNALS.get(-code, 'a signal')}"
        if isinstance(code, int) and code < 0
        else ""
    )
    at = f" at RSS {fmt_bytes(rss)}" if rss else ""
    if limit and rss:
        at += f", {100 * rss / limit:.0f}% of its memory_limit {fmt_bytes(limit)}"
    if facts.get("terminated_for_memory"):
        fraction = facts.get("terminate_fraction")
        why = "; ".join(p for p in (f"over {100 * fraction:.0f}%" if fraction else "", signal) if p)
        summary = (
            f"host out of memory: Dask's nanny terminated worker {worker} (rank "
            f"{rank}){at}" + (f" ({why})" if why else "")
        )
    elif code == -9 and limit and rss and rss >= NEAR_LIMIT * limit:
        summary = (
            f"host out of memory: worker {worker} (rank {rank}) was killed by SIGKILL"
            f"{at}: most likely the kernel's OOM killer (dmesg on its host says)"
        )
    else:
        return None
    data = {
        k: facts[k]
        for k in ("memory_limit", "rss", "exitcode", "terminate_fraction")
        if facts.get(k) is not None
    }
    return Diagnosis(
        "host_oom",
        summary,
        HOST_OOM_ADVICE,
        detail=str(error.get("message", "")),
        worker=facts.get("worker"),
        host=facts.get("host"),
        data=data,
    )


_SIGNALS = {9: "SIGKILL", 15: "SIGTERM", 6: "SIGABRT", 11: "SIGSEGV", 7: "SIGBUS"}


def _rank_memory(error: Mapping[str, Any]) -> Diagnosis | None:
    """A rank's process its worker killed over the worker's memory limit, or that was
    SIGKILLed near it (the kernel's OOM killer)."""
    if error.get("type") != "RankExit":
        return None
    facts = _facts(error, "process")
    limit, rss = facts.get("memory_limit"), facts.get("rss")
    rank = error.get("rank")
    where = f" ({error['where']})" if error.get("where") else ""
    at = f" at RSS {fmt_bytes(rss)}" if rss else ""
    if limit and rss:
        at += f", {100 * rss / limit:.0f}% of its worker's memory_limit {fmt_bytes(limit)}"
    if facts.get("killed_for_memory"):
        fraction = facts.get("terminate_fraction")
        over = f"over {100 * fraction:.0f}% of it" if fraction else "over it"
        summary = f"host out of memory: rank {rank}{where} was killed by its worker{at} ({over})"
    elif error.get("signal") == "SIGKILL" and limit and rss and rss >= NEAR_LIMIT * limit:
        summary = (
            f"host out of memory: rank {rank}{where} was killed by SIGKILL{at}: most likely "
            "the kernel's OOM killer (dmesg on its host says)"
        )
    else:
        return None
    data = {
        k: facts[k]
        for k in ("memory_limit", "rss", "peak_rss", "terminate_fraction")
        if facts.get(k) is not None
    }
    return Diagnosis("host_oom", summary, HOST_OOM_ADVICE, detail=_first_line(error), data=data)


CUDA_ERROR_ADVICE = (
    "a device-side assert is most often an index out of range (a class label >= the number "
    "of classes, an embedding index >= its size, a gather or scatter index): launch with "
    "env={'CUDA_LAUNCH_BLOCKING': '1'} to see the kernel that failed at its line; an illegal "
    "memory access can also be a custom kernel or extension. The rank's process is gone "
    "(its CUDA context could not be used again): its GPU runs the next job in a fresh one"
)
_CUDA_ERROR = re.compile(r"CUDA error: ([^\n.]+)", re.IGNORECASE)


def _cuda_error(error: Mapping[str, Any]) -> Diagnosis | None:
    found = _CUDA_ERROR.search(_text(error))
    if not found or "out of memory" in found.group(1).lower():
        return None
    return Diagnosis(
        "cuda_error",
        f"fatal CUDA error{_on(error.get('rank'))}: {found.group(1).strip()}",
        CUDA_ERROR_ADVICE,
        detail=_first_line(error),
    )


CRASH_ADVICE = (
    "the Python stacks in the error (faulthandler's, of every thread of the rank) show where "
    "it was: most often a C or C++ extension, a CUDA or NCCL library, or an extension built "
    "for another torch; run that code alone on the same input to reproduce it. The worker "
    "and the other ranks' slots are untouched: launch again, or set max_restarts= to "
    "restart from the newest checkpoint by itself"
)
_CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"})


def _crash(error: Mapping[str, Any]) -> Diagnosis | None:
    if error.get("type") != "RankExit" or error.get("signal") not in _CRASH_SIGNALS:
        return None
    if "NCCL's watchdog" in str(error.get("message", "")):
        return None  # a collective timed out: _collective_timeout's
    rank = error.get("rank")
    where = f" ({error['where']})" if error.get("where") else ""
    return Diagnosis(
        "crash",
        f"rank {rank}{where} crashed: {error.get('signal')} in native code",
        CRASH_ADVICE,
        detail=_first_line(error),
    )


TIMEOUT_ADVICE = (
    "every rank must run the same collectives in the same order: look for a rank that skips "
    "one (a branch on its rank or its data), runs out of data first, or is stuck (job.stacks() "
    "while it hangs; hang_timeout= and on_hang= catch it before the timeout); if a step "
    "really takes that long, raise timeout="
)
RENDEZVOUS_ADVICE = (
    "a rank did not reach the process group's rendezvous in time: look at its log "
    "(job.logs(rank=...)) for a slow import or start, check that every host reaches rank 0's "
    "address and port (clustersdk doctor), or raise timeout="
)
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (recv|send) operation")
_NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\("
    r"SeqNum=(\d+), OpType=(\w+).*?Timeout\(ms\)=(\d+)\)"
)
_PAIR_CLOSED = re.compile(r"Application timeout caused pair closure")
_JOINED = re.compile(
    r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients "
    r"joined"
)
_STORE_WAIT = re.compile(
    r"wait timeout after (\d+)ms, keys:|client socket has timed out after "
    r"(\d+)ms while trying to connect to \(([^,]+), (\d+)\)"
)


def _collective_timeout(error: Mapping[str, Any]) -> Diagnosis | None:
    text, rank = _text(error), error.get("rank")
    joined, store = _JOINED.search(text), _STORE_WAIT.search(text)
    if joined or store:
        what = (
            f"{joined.group(2)}/{joined.group(3)} ranks joined within {joined.group(1)} s"
            if joined
            else "a peer never came"
        )
        return Diagnosis(
            "collective_timeout",
            f"the rendezvous timed out{_on(rank)}: {what}",
            RENDEZVOUS_ADVICE,
            detail=_first_line(error),
            data={"phase": "rendezvous"},
        )
    gloo, nccl = _GLOO_TIMEOUT.search(text), _NCCL_TIMEOUT.search(text)
    if not (gloo or nccl or _PAIR_CLOSED.search(text)):
        return None
    data: dict[str, Any] = {}
    if gloo:
        data.update(timeout_s=int(gloo.group(1)) / 1000, operation=gloo.group(2))
    elif nccl:
        data.update(
            seq=int(nccl.group(1)), operation=nccl.group(2), timeout_s=int(nccl.group(3)) / 1000
        )
    where = _facts(error, "where")
    mine = where.get(str(rank)) or where.get(rank) if rank is not None else None
    step = mine.get("step") if mine else None
    summary = f"a collective ({data.get('operation', 'op')}) timed out{_on(rank)}"
    if step is not None:
        summary += f" at step {step}"
    if data.get("timeout_s"):
        summary += f" after {data['timeout_s']:g} s"
    if mine and len(where) > 1:
        reached, missing = split_ranks(where, mine)
        data.update(reached=reached, missing=[m["rank"] for m in missing])
        summary += f": {_ranks(reached)} reached it"
        if missing:
            summary += "; " + ", ".join(
                f"rank {m['rank']} did not (it was in {m['phase']} at step {m['step']})"
                for m in missing
            )
    return Diagnosis(
        "collective_timeout",
        summary,
        TIMEOUT_ADVICE,
        detail=_first_line(error),
        step=step,
        data=data,
    )


def split_ranks(
    where: Mapping[Any, Mapping[str, Any]], mine: Mapping[str, Any]
) -> tuple[list[int], list[dict[str, Any]]]:
    """The ranks that were where the timed-out rank was (its step and phase), and the
    others with their step and phase."""
    reached, missing = [], []
    for key in sorted(where, key=int):
        at = where[key]
        if at.get("step") == mine.get("step") and at.get("phase") == mine.get("phase"):
            reached.append(int(key))
        else:
            missing.append({"rank": int(key), "step": at.get("step"), "phase": at.get("phase")})
    return reached, missing


DUPLICATE_GPU_ADVICE = (
    "each rank needs a GPU of its own: one Dask worker per GPU, each seeing only its GPU "
    "(CUDA_VISIBLE_DEVICES; Cluster.local and Cluster.ssh(gpus_per_host=) do this); don't "
    "call torch.cuda.set_device or move the model to another cuda:N in the training function"
)
_DUPLICATE = re.compile(
    r"Duplicate GPU detected\s*:\s*rank (\d+) and rank (\d+) both on CUDA "
    r"device (\w+)"
)


def _duplicate_gpu(error: Mapping[str, Any]) -> Diagnosis | None:
    found = _DUPLICATE.search(_text(error))
    if not found:
        return None
    a, b, device = int(found.group(1)), int(found.group(2)), found.group(3)
    return Diagnosis(
        "duplicate_gpu",
        f"ranks {a} and {b} are on the same GPU (CUDA device {device})",
        DUPLICATE_GPU_ADVICE,
        detail=_first_line(error),
        data={"ranks": [a, b], "device": device},
    )


PORT_ADVICE = (
    "another process holds that port on that host: find it (ss -ltnp on the host) and stop "
    "it; don't pin a port in the training function (MASTER_PORT is chosen for you); or give "
    "the rendezvous a wider range of free ports (clustersdk.rendezvous-ports, rendezvous_ports= "
    "of Cluster.ssh)"
)
_IN_USE = re.compile(
    r"EADDRINUSE|address already in use|Errno 98\b|ports? .* (is|are) in use", re.IGNORECASE
)
_PORTS = (re.compile(r"rendezvous range (\d+-\d+)"), re.compile(r"\bport:? (\d+)"))


def _port_in_use(error: Mapping[str, Any]) -> Diagnosis | None:
    text = _text(error)
    if not _IN_USE.search(text):
        return None
    found = next((m for m in (p.search(text) for p in _PORTS) if m), None)
    port = found.group(1) if found else None
    what = (
        f"port {port}"
        if port and "-" not in port
        else (f"every port of the rendezvous range {port}" if port else "a port")
    )
    return Diagnosis(
        "port_in_use",
        f"{what} is already in use{_on(error.get('rank'))}",
        PORT_ADVICE,
        detail=_first_line(error),
        data={"port": port} if port else {},
    )


NONFINITE_ADVICE = (
    "look at the batch of that step (bad samples, a division by zero or log(0) in "
    "preprocessing); lower the learning rate or warm it up; clip gradients (clip_grad_norm=); "
    "prefer precision='bf16' to 'fp16'; on_nan='rollback' restarts from the newest checkpoint "
    "without that batch"
)
_ANOMALY = re.compile(r"returned nan values|Function '(\w+)' returned nan", re.IGNORECASE)


def _nonfinite_raised(error: Mapping[str, Any]) -> Diagnosis | None:
    found = _ANOMALY.search(_text(error))
    if not found:
        return None
    return Diagnosis(
        "nonfinite",
        f"autograd found NaN values{_on(error.get('rank'))}",
        NONFINITE_ADVICE,
        detail=_first_line(error),
    )


# most specific first: a DistBackendError about a duplicate GPU is not a timeout
RULES: tuple[Callable[[Mapping[str, Any]], Diagnosis | None], ...] = (
    _cuda_oom,
    _duplicate_gpu,
    _port_in_use,
    _lost_worker,
    _rank_memory,
    _host_oom_raised,
    _collective_timeout,
    _cuda_error,
    _crash,
    _nonfinite_raised,
)


# --- what is not a failure ------------------------------------------------------------
_POLICY_NAN = {
    "report": "the job goes on (on_nan='report')",
    "pause": "every rank paused before step {next} (on_nan='pause'): resume() goes on, stop() "
    "ends it",
    "rollback": "the job restarts from its newest checkpoint and drops step {step}'s batch "
    "(on_nan='rollback')",
    "fail": "the job failed (on_nan='fail')",
}


def nonfinite(rank: int | None, step: int, values: Mapping[str, float], policy: str) -> Diagnosis:
    """A watched scalar (a loss, a gradient norm) was NaN or Inf at ``step``."""
    shown = ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "a non-finite value"
    return Diagnosis(
        "nonfinite",
        f"non-finite {shown} at step {step}{_on(rank)}",
        NONFINITE_ADVICE,
        detail=_POLICY_NAN[policy].format(step=step, next=step + 1),
        rank=rank,
        step=step,
        data={"values": {k: str(v) for k, v in values.items()}, "policy": policy},
    )


def loss_spike(
    rank: int,
    step: int,
    value: float,
    median: float,
    mad: float,
    score: float,
    window: int,
    paused: bool,
    mean: float | None = None,
    ranks: int = 1,
    scale: float | None = None,
) -> Diagnosis:
    """The loss at ``step`` (``mean`` over ``ranks`` ranks) is far above its recent scale:
    ``median``, that of the last ``window`` steps, and ``scale``, how high the steps before
    went over their medians, at this one (see :mod:`.signals`); ``rank``'s slice of the
    batch had the highest loss, ``value``."""
    then = "the job pauses (on_spike='pause')" if paused else "the job goes on"
    mean = value if mean is None else mean
    where = (
        f"{mean:.4g} (the mean of {ranks} ranks; rank {rank}'s {value:.4g} the highest)"
        if ranks > 1
        else f"{value:.4g}{_on(rank)}"
    )
    against = (
        f"{mean / median:.0f}x the median of the last {window} steps ({median:.4g})"
        if median > 0
        else f"a median of {median:.4g} over the last {window} steps"
    )
    if scale and median > 0:
        against += f"; lately no step came to more than {scale / median:.2g}x its median"
    return Diagnosis(
        "loss_spike",
        f"loss spike at step {step}: {where}, {against}",
        "look at the batch of that step (outliers, mislabeled or corrupted samples); lower the "
        "learning rate or warm it up, or clip gradients (clip_grad_norm=)",
        detail=then,
        rank=rank,
        step=step,
        data={
            "value": value,
            "mean": mean,
            "ranks": ranks,
            "median": median,
            "mad": mad,
            "score": score,
            "window": window,
            "scale": scale,
        },
    )


def version_mismatch(
    versions: Mapping[int, Mapping[str, Any]], hosts: Mapping[int, str] | None = None
) -> Diagnosis | None:
    """Ranks that report different versions of what must agree, or None when all do."""
    hosts = hosts or {}
    differing: dict[str, dict[str, list[int]]] = {}
    for key in COMPARED_VERSIONS:
        seen: dict[str, list[int]] = {}
        for rank in sorted(versions):
            value = versions[rank].get(key)
            if value is not None:
                seen.setdefault(str(value), []).append(rank)
        if len(seen) > 1:
            differing[key] = seen
    if not differing:
        return None
    parts = []
    for key, seen in differing.items():
        ordered = sorted(seen.items(), key=lambda kv: (-len(kv[1]), kv[1]))
        parts.append(
            f"{key} "
            + ", ".join(
                f"{value} on {_ranks(ranks)}{_where(ranks, hosts)}" for value, ranks in ordered
            )
        )
    return Diagnosis(
        "version_mismatch",
        "ranks run different versions: " + "; ".join(parts),
        "install the same versions in every worker's environment (clustersdk doctor lists "
        "them per host); mixed torch or NCCL versions fail or hang in collectives",
        detail="found as the ranks started; the job goes on",
        data={"versions": {key: seen for key, seen in differing.items()}},
    )


def _where(ranks: list[int], hosts: Mapping[int, str]) -> str:
    on = sorted({hosts[r] for r in ranks if r in hosts})
    return f" (host{'s' if len(on) > 1 else ''} {', '.join(on)})" if on else ""


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _first_line(error: Mapping[str, Any]) -> str:
    """The line of the message that says most: the error's own, not a C++ frame."""
    lines = [ln.strip() for ln in str(error.get("message", "")).splitlines() if ln.strip()]
    for line in lines:
        if any(
            p.search(line)
            for p in (
                _CUDA_OOM,
                _DUPLICATE,
                _IN_USE,
                _GLOO_TIMEOUT,
                _NCCL_TIMEOUT,
                _JOINED,
                _HOST_OOM,
            )
        ):
            return line[:500]
    return lines[0][:500] if lines else ""


def fmt_bytes(n: float) -> str:
    """``1.50 GiB``, ``512 MiB``.

    >>> fmt_bytes(1.5 * 2**30), fmt_bytes(512 * 2**20)
    ('1.50 GiB', '512 MiB')
    """
    if abs(n) >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if abs(n) >= 2**20:
        return f"{n / 2**20:.0f} MiB"
    return f"{n / 2**10:.0f} KiB"
