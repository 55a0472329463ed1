"""Pure functions that build every JSON model the REST API returns.

No Dask, no Tornado, no I/O: each takes what the manager fetched from a
scheduler (plain dicts and lists) and returns a JSON-able dict, so that the
shapes are fixed in one place and tested without a server. The OpenAPI
description (``openapi.yaml``) documents the same shapes.

>>> cluster_id("tcp://127.0.0.1:8786")
'tcp-127.0.0.1-8786'
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from clustersdk.status import JobStatus

#: record fields every control plane sends; others (paused_at, checkpoint...) pass through
_RECORD_FIELDS = (
    "id",
    "name",
    "scheduler",
    "status",
    "reason",
    "submitted",
    "started",
    "ended",
    "ranks",
    "error",
    "spec",
)
_DERIVED_FIELDS = frozenset(
    {"cluster", "terminal", "world_size", "strategy", "owner", "progress", "result"}
)
_SAMPLE_KEYS = (
    "gpu_util",
    "gpu_mem_used",
    "gpu_mem_total",
    "gpu_temp",
    "gpu_power",
    "cpu_percent",
    "mem_used",
    "mem_total",
    "rss",
    "net_sent_per_s",
    "net_recv_per_s",
)


@dataclasses.dataclass(frozen=True)
class Target:
    """A scheduler the extension knows: from the SDK's registry or from its config."""

    id: str
    address: str
    kind: str  # "local" | "connect" | "remote"
    source: str  # "registry" | "config"


def cluster_id(address: str) -> str:
    """The URL-safe id of the cluster whose scheduler listens at ``address``."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", address).strip("-") or "cluster"


def is_terminal(status: str) -> bool:
    try:
        return JobStatus[status].terminal
    except KeyError:  # a status this extension doesn't know yet: treat it as live
        return False


def error_model(code: str, message: str) -> dict[str, Any]:
    """The body of every error response."""
    return {"error": code, "message": message}


# jobs -----------------------------------------------------------------------------
def job_model(
    record: Mapping[str, Any], cluster: str, progress: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One job: the scheduler's record, its cluster id, and (for one job) its progress."""
    spec = record.get("spec") or {}
    out: dict[str, Any] = {key: _jsonable(record.get(key)) for key in _RECORD_FIELDS}
    out["reason"] = out["reason"] or ""
    out["ranks"] = out["ranks"] or []
    out["spec"] = spec
    out.update(
        {
            "cluster": cluster,
            "terminal": is_terminal(str(record.get("status", ""))),
            "world_size": spec.get("world_size"),
            "strategy": spec.get("strategy"),
            "kind": "script"
            if spec.get("script") or spec.get("module") or spec.get("command")
            else "function",  # a script job (launch_script) runs spec["fn"] as torchrun would
            "owner": spec.get("owner"),
            "queue": spec.get("queue"),
            "priority": spec.get("priority"),
            "preemptible": spec.get("preemptible", True),
        }
    )
    for key, value in record.items():
        if key not in out and key not in _DERIVED_FIELDS:
            out[key] = _jsonable(value)
    if progress is not None:
        out["progress"] = dict(progress)
    return out


def update_model(
    result: Mapping[str, Any], record: Mapping[str, Any], cluster: str
) -> dict[str, Any]:
    """A ``job.update``: ``applied`` with the ``step`` it was applied before and each
    change as ``[old, new]`` (from the job's durable ``updated`` event), or not yet
    (the job left RUNNING/PAUSED first: its next gang applies it before its first step)."""
    event = next(
        (
            e
            for e in record.get("events") or ()
            if e.get("kind") == "updated" and e.get("seq") == result["seq"]
        ),
        None,
    )
    changes = (
        {k: list(v) for k, v in event["changes"].items()}
        if event
        else {k: [None, v] for k, v in (result.get("changes") or {}).items()}
    )
    return {
        "job": record["id"],
        "name": record.get("name"),
        "cluster": cluster,
        "seq": result["seq"],
        "applied": result["step"] is not None,
        "step": result["step"],
        "status": result.get("status"),
        "changes": changes,
    }


def stacks_model(
    record: Mapping[str, Any], found: Mapping[str, Mapping[str, Any]], cluster: str
) -> dict[str, Any]:
    """Where every rank is (rank -> worker, step, phase, stack text), ranks in order."""
    ranks = {
        str(k): {key: _jsonable(v) for key, v in entry.items()}
        for k, entry in sorted(found.items(), key=lambda kv: int(kv[0]))
    }
    return {"job": record["id"], "cluster": cluster, "status": record.get("status"), "ranks": ranks}


def jobs_model(jobs: Iterable[dict[str, Any]], unreachable: Sequence[str] = ()) -> dict[str, Any]:
    """The job list, oldest first, and the clusters that could not be asked."""
    ordered = sorted(jobs, key=lambda j: (j.get("submitted") or 0, j["id"]))
    return {"jobs": ordered, "unreachable": list(unreachable)}


def overview_model(
    clusters: Sequence[Mapping[str, Any]], jobs: Iterable[dict[str, Any]], now: float
) -> dict[str, Any]:
    """Everything the JupyterLab panel shows, in one answer: every cluster with its slots,
    and every job (with its progress where the server follows it), oldest first."""
    unreachable = [c["id"] for c in clusters if not c.get("reachable", True)]
    return {"time": now, "clusters": list(clusters), **jobs_model(jobs, unreachable)}


def checkpoints_model(
    job: str,
    directory: str | None,
    found: Sequence[Mapping[str, Any]],
    newest: str | None,
    error: str | None = None,
) -> dict[str, Any]:
    """A job's committed checkpoints, newest first: step, size in bytes, commit time.

    ``directory`` is the job's ``checkpoint_dir`` (``None`` when it has none);
    ``error`` says why it could not be read from this server (the list is then empty).
    """
    rows = [
        {
            "step": c["step"],
            "path": c["path"],
            "bytes": c["bytes"],
            "time": c["time"],
            "world_size": c.get("world_size"),
            "newest": c["path"] == newest,
        }
        for c in sorted(found, key=lambda c: c["step"], reverse=True)
    ]
    return {
        "job": job,
        "directory": directory,
        "readable": error is None,
        "error": error,
        "newest": newest,
        "checkpoints": rows,
    }


def history_model(
    job: str, rows: Sequence[Mapping[str, Any]], since: int, limit: int
) -> dict[str, Any]:
    """Metric rows after ``since``; ``last`` is the ``since`` of the next incremental read."""
    clean = [
        {k: _number(v) if k not in ("seq", "rank", "step") else v for k, v in row.items()}
        for row in rows
    ]
    last = clean[-1]["seq"] if clean else since
    return {"job": job, "since": since, "last": last, "more": len(clean) >= limit, "rows": clean}


def logs_model(
    job: str, lines: Sequence[Mapping[str, Any]], since: int, rank: int | None
) -> dict[str, Any]:
    """Log lines after ``since`` (of one rank, or all); ``text`` joins them."""
    clean = [dict(line) for line in lines]
    last = clean[-1]["seq"] if clean else since
    return {
        "job": job,
        "rank": rank,
        "since": since,
        "last": last,
        "lines": clean,
        "text": "".join(line["text"] + "\n" for line in clean),
    }


def progress_model(
    latest: Mapping[int, Mapping[str, Any]], steps_per_s: float, updated: float | None
) -> dict[str, Any]:
    """Where a job is: its step (the furthest rank), the mean of each rank's newest scalars."""
    if not latest:
        return {
            "step": None,
            "steps_per_second": steps_per_s,
            "scalars": {},
            "ranks": {},
            "updated": updated,
        }
    names = sorted({k for row in latest.values() for k in row if k not in _ROW_KEYS})
    scalars = {}
    for name in names:
        values = [row[name] for row in latest.values() if _finite(row.get(name))]
        if values:
            scalars[name] = sum(values) / len(values)
    ranks = {
        str(rank): {"step": row.get("step"), "time": row.get("time")}
        for rank, row in sorted(latest.items())
    }
    return {
        "step": max(row.get("step", 0) for row in latest.values()),
        "steps_per_second": steps_per_s,
        "scalars": scalars,
        "ranks": ranks,
        "updated": updated,
    }


_ROW_KEYS = frozenset({"seq", "rank", "step", "time"})


def steps_per_second(
    points: Sequence[tuple[float, int]], now: float, window: float, stale: float | None = None
) -> float:
    """Steps per second over the last ``window`` seconds of ``(time, step)`` points.

    0.0 when fewer than two points fall in the window, or when the newest is
    more than ``stale`` seconds old: a stalled job makes no progress.

    >>> steps_per_second([(0.0, 0), (1.0, 10), (2.0, 20)], now=2.0, window=5.0)
    10.0
    >>> steps_per_second([(0.0, 0), (1.0, 10), (2.0, 20)], now=30.0, window=60.0, stale=10.0)
    0.0
    """
    recent = [(t, s) for t, s in points if now - window <= t <= now + window]
    if len(recent) < 2:
        return 0.0
    (t0, s0), (t1, s1) = recent[0], recent[-1]
    if t1 <= t0 or s1 < s0 or (stale is not None and now - t1 > stale):
        return 0.0
    return (s1 - s0) / (t1 - t0)


# clusters -------------------------------------------------------------------------
def cluster_model(
    target: Target,
    *,
    inventory: Sequence[Mapping[str, Any]] | None = None,
    jobs: Sequence[Mapping[str, Any]] = (),
    error: str | None = None,
    samples: Mapping[str, Mapping[str, Any]] | None = None,
    workers: Mapping[str, Mapping[str, Any]] | None = None,
    scheduler_id: str | None = None,
    events: Sequence[Mapping[str, Any]] = (),
    dashboard_link: str | None = None,
    detail: bool = False,
) -> dict[str, Any]:
    """A cluster: how to reach it, its slots (GPUs or CPU slots), utilisation and job counts.

    ``samples`` maps a worker address to the newest telemetry sample of the
    rank running there; ``workers`` is Dask's per-worker info; ``events`` the
    cluster's own events (a standing cluster's processes restarted by their
    supervisor); ``dashboard_link`` the URL of its Dask dashboard (None: none).
    ``detail`` adds the per-worker and per-slot lists.
    """
    out: dict[str, Any] = {
        "id": target.id,
        "address": target.address,
        "kind": target.kind,
        "source": target.source,
        "reachable": error is None,
        "error": error,
    }
    if error is not None:
        return out
    slots = list(inventory or [])
    samples = samples or {}
    counts = Counter(str(j.get("status")) for j in jobs)
    busy = [s for s in slots if s.get("job")]
    gpu_utils = [
        samples[s["worker"]]["gpu_util"]
        for s in busy
        if _finite(samples.get(s["worker"], {}).get("gpu_util"))
    ]
    out.update(
        {
            "scheduler_id": scheduler_id,
            "workers": len({s["worker"] for s in slots}) if workers is None else len(workers),
            "hosts": len({s["host"] for s in slots}),
            "gpus": sum(1 for s in slots if s.get("kind") == "cuda"),
            "utilisation": {
                "slots": len(slots),
                "busy": len(busy),
                "busy_fraction": len(busy) / len(slots) if slots else 0.0,
                "gpu_util_mean": sum(gpu_utils) / len(gpu_utils) if gpu_utils else None,
            },
            "jobs": {status.name: counts.get(status.name, 0) for status in JobStatus},
            "queue_length": counts.get(JobStatus.QUEUED.name, 0),
            "restarts": restarts_model(events),
            "dashboard_link": dashboard_link,
        }
    )
    if detail:
        out["slots"] = [slot_model(s, samples.get(s["worker"])) for s in slots]
        out["worker_details"] = worker_models(slots, workers or {})
    return out


def restarts_model(events: Sequence[Mapping[str, Any]], recent: int = 3) -> dict[str, Any]:
    """How often the cluster's processes were started again, and the newest of those."""
    restarts = [e for e in events if e.get("kind") == "restarted"]
    return {
        "count": len(restarts),
        "recent": [
            {"time": e.get("time"), "message": str(e.get("message", ""))}
            for e in restarts[-recent:]
        ],
    }


def slot_model(slot: Mapping[str, Any], sample: Mapping[str, Any] | None) -> dict[str, Any]:
    """One slot (a GPU, or a CPU slot) and the newest reading of the rank on it."""
    telemetry = None
    if sample:
        telemetry = {k: sample[k] for k in ("source", "time", *_SAMPLE_KEYS) if k in sample}
    return {
        "worker": slot["worker"],
        "host": slot["host"],
        "kind": slot["kind"],
        "index": slot.get("index"),
        "uuid": slot.get("uuid"),
        "cpus": slot.get("cpus") or "",  # the worker's CPU share; "": not bound
        "job": slot.get("job"),
        "telemetry": telemetry,
    }


def worker_models(
    slots: Sequence[Mapping[str, Any]], workers: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Dask workers with their host, threads, memory and the slots they hold."""
    addresses = sorted({s["worker"] for s in slots} | set(workers))
    out = []
    for address in addresses:
        info = workers.get(address, {})
        metrics = info.get("metrics") or {}
        host = info.get("host") or next((s["host"] for s in slots if s["worker"] == address), None)
        out.append(
            {
                "address": address,
                "name": None if info.get("name") is None else str(info.get("name")),
                "host": host,
                "nthreads": info.get("nthreads"),
                "memory_limit": info.get("memory_limit"),
                "cpu": _number(metrics.get("cpu")),
                "memory": _number(metrics.get("memory")),
                "slots": [s.get("index") for s in slots if s["worker"] == address],
            }
        )
    return out


def newest_by_worker(
    record: Mapping[str, Any], newest: Mapping[int, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Re-key a job's newest sample per rank by the worker each rank runs on."""
    out = {}
    for rank in record.get("ranks") or []:
        sample = newest.get(rank["rank"])
        if sample is not None:
            out[rank["worker"]] = dict(sample)
    return out


# health ---------------------------------------------------------------------------
def health_model(results: Mapping[str, str | None]) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` from why each cluster id is unhealthy (``None``: it answered).

    Names no job, no address: it is served without authentication.
    """
    down = sorted(cid for cid, err in results.items() if err is not None)
    body: dict[str, Any] = {
        "status": "ok" if not down else "unavailable",
        "schedulers": len(results),
        "reachable": len(results) - len(down),
    }
    if down:
        body["reason"] = "; ".join(f"cluster {cid}: {results[cid]}" for cid in down)
        return 503, body
    return 200, body


# helpers --------------------------------------------------------------------------
def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any) -> Any:
    """JSON has no NaN or infinity: send those as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return None
    return _number(value)
