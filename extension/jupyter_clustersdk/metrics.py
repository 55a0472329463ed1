"""Prometheus metrics from a manager snapshot (pure: no I/O, no Dask).

Every family carries a ``cluster`` label (the cluster id); job families add
``job`` (id) and ``name``; GPU families add ``host``, ``worker``, ``gpu``
(device index) and ``uuid``, and exist only where NVML reports them.

==========================================  ====================================================
``clustersdk_scheduler_up``                 1 if the scheduler answered this scrape
``clustersdk_slots`` / ``_slots_busy``      slots per kind (``cuda``/``cpu``), and the busy ones
``clustersdk_queue_length``                 jobs waiting for a gang of free slots
``clustersdk_jobs``                         jobs per ``state`` on the scheduler (all time)
``clustersdk_job_state``                    1 for the job's current ``state``, 0 for the others
``clustersdk_job_info``                     1, labelled with the job's ``owner``, ``queue``, ``priority``
``clustersdk_job_step``                     furthest step of any rank
``clustersdk_job_loss``                     mean of each rank's newest ``loss`` (if logged)
``clustersdk_job_scalar``                   mean of each rank's newest value per ``scalar``
``clustersdk_job_steps_per_second``         rank 0's pace over the last 30 s
``clustersdk_job_world_size``               ranks
``clustersdk_job_restarts_total``           gang restarts after a worker loss
``clustersdk_job_goodput_ratio``            the share of its wall time in steps that stand
``clustersdk_job_time_seconds``             its wall time per ``bucket`` (they add up to it)
``clustersdk_job_lost_steps_total``         steps a restart threw away
``clustersdk_goodput_ratio``                the same over every job of the cluster's journal
``clustersdk_time_seconds``                 and its seconds per ``bucket``
``clustersdk_gpu_utilization_percent``      NVML utilisation of the GPU a rank runs on
``clustersdk_gpu_memory_used_bytes``        and ``_total_bytes``
``clustersdk_gpu_temperature_celsius``      where the board reports it
``clustersdk_gpu_power_watts``              where the board reports it
``clustersdk_rank_cpu_percent``             CPU ranks: host CPU use and the rank's RSS
``clustersdk_rank_memory_rss_bytes``
==========================================  ====================================================

>>> text = render({"time": 0, "clusters": [{"id": "c", "up": False}]})
>>> b'clustersdk_scheduler_up{cluster="c"} 0.0' in text
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from clustersdk.status import JobStatus

JOB = ["cluster", "job", "name"]
GPU = ["cluster", "host", "worker", "gpu", "uuid", "job", "rank"]
RANK = ["cluster", "host", "worker", "job", "rank"]

# (family, help, sample key): per-GPU gauges from NVML samples
_GPU_GAUGES = (
    ("clustersdk_gpu_utilization_percent", "GPU utilisation (NVML), percent", "gpu_util"),
    ("clustersdk_gpu_memory_used_bytes", "GPU memory in use (NVML), bytes", "gpu_mem_used"),
    ("clustersdk_gpu_memory_total_bytes", "GPU memory in total (NVML), bytes", "gpu_mem_total"),
    ("clustersdk_gpu_temperature_celsius", "GPU temperature (NVML), degrees Celsius", "gpu_temp"),
    ("clustersdk_gpu_power_watts", "GPU power draw (NVML), watts", "gpu_power"),
)
_RANK_GAUGES = (
    (
        "clustersdk_rank_cpu_percent",
        "Host CPU use seen by a CPU rank (psutil), percent",
        "cpu_percent",
    ),
    (
        "clustersdk_rank_memory_rss_bytes",
        "Resident memory of a rank's process (psutil), bytes",
        "rss",
    ),
)


def families(snapshot: Mapping[str, Any]) -> list[Metric]:
    """The metric families of one snapshot (see :meth:`.ClusterManager.snapshot`)."""
    f: dict[str, Metric] = {}

    def gauge(name: str, doc: str, labels: list[str]) -> Callable[[list[str], float], None]:
        if name not in f:
            f[name] = GaugeMetricFamily(name, doc, labels=labels)
        return f[name].add_metric

    gauge(
        "clustersdk_scheduler_up", "1 if the cluster's scheduler answered this scrape", ["cluster"]
    )
    for cluster in snapshot.get("clusters", ()):
        cid = cluster["id"]
        gauge("clustersdk_scheduler_up", "", ["cluster"])([cid], 1.0 if cluster.get("up") else 0.0)
        if not cluster.get("up"):
            continue
        _cluster_families(f, gauge, cid, cluster)
        for job in cluster.get("jobs", ()):
            _job_families(f, gauge, cid, job)
    return list(f.values())


def render(
    snapshot: Mapping[str, Any], encoder: Callable[[CollectorRegistry], bytes] = generate_latest
) -> bytes:
    """The snapshot in Prometheus' text format (or the format ``encoder`` writes)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families(snapshot)))
    return encoder(registry)


class _Fixed:
    """A collector that yields families built beforehand (the scrape is already done)."""

    def __init__(self, metrics: list[Metric]):
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return iter(self._metrics)


def _cluster_families(f: dict, gauge: Callable, cid: str, cluster: Mapping[str, Any]) -> None:
    slots = cluster.get("slots", ())
    kinds = sorted({s["kind"] for s in slots}) or ["cpu"]
    for kind in kinds:
        mine = [s for s in slots if s["kind"] == kind]
        gauge("clustersdk_slots", "Slots (GPUs or CPU slots) per kind", ["cluster", "kind"])(
            [cid, kind], float(len(mine))
        )
        gauge("clustersdk_slots_busy", "Slots running a job, per kind", ["cluster", "kind"])(
            [cid, kind], float(sum(1 for s in mine if s.get("job")))
        )
    overall = cluster.get("goodput") or {}
    if overall.get("goodput") is not None:
        gauge(
            "clustersdk_goodput_ratio",
            "Share of the jobs' wall time in steps that stand (every job in the journal)",
            ["cluster"],
        )([cid], float(overall["goodput"]))
    for bucket, value in (overall.get("seconds") or {}).items():
        gauge(
            "clustersdk_time_seconds",
            "The jobs' wall time per goodput bucket, seconds",
            ["cluster", "bucket"],
        )([cid, bucket], float(value))
    counts = cluster.get("counts", {})
    gauge("clustersdk_queue_length", "Jobs waiting for a gang of free slots", ["cluster"])(
        [cid], float(counts.get(JobStatus.QUEUED.name, 0))
    )
    for status in JobStatus:
        gauge("clustersdk_jobs", "Jobs per state on this scheduler", ["cluster", "state"])(
            [cid, status.name], float(counts.get(status.name, 0))
        )
    by_worker = {s["worker"]: s for s in slots}
    for job in cluster.get("jobs", ()):
        _telemetry_families(gauge, cid, job, by_worker)


def _job_families(f: dict, gauge: Callable, cid: str, job: Mapping[str, Any]) -> None:
    record, progress = job["record"], job.get("progress") or {}
    labels = [cid, record["id"], record["name"]]
    for status in JobStatus:
        gauge("clustersdk_job_state", "1 for the job's current state", [*JOB, "state"])(
            [*labels, status.name], 1.0 if record["status"] == status.name else 0.0
        )
    spec = record.get("spec") or {}
    gauge(
        "clustersdk_job_info",
        "1, labelled with who launched the job and where it queues",
        [*JOB, "owner", "queue", "priority"],
    )(
        [
            *labels,
            str(spec.get("owner") or ""),
            str(spec.get("queue") or ""),
            str(spec.get("priority") if spec.get("priority") is not None else ""),
        ],
        1.0,
    )
    gauge("clustersdk_job_world_size", "Ranks of the job", JOB)(
        labels, float((record.get("spec") or {}).get("world_size") or 0)
    )
    if progress.get("step") is not None:
        gauge("clustersdk_job_step", "Furthest step any rank has logged", JOB)(
            labels, float(progress["step"])
        )
    gauge("clustersdk_job_steps_per_second", "Rank 0's steps per second over the last 30 s", JOB)(
        labels, float(progress.get("steps_per_second") or 0.0)
    )
    scalars = progress.get("scalars") or {}
    if _finite(scalars.get("loss")):
        gauge("clustersdk_job_loss", "Mean over ranks of each rank's newest loss", JOB)(
            labels, float(scalars["loss"])
        )
    for name, value in sorted(scalars.items()):
        if _finite(value):
            gauge(
                "clustersdk_job_scalar",
                "Mean over ranks of each rank's newest ctx.log value",
                [*JOB, "scalar"],
            )([*labels, name], float(value))
    if "clustersdk_job_restarts" not in f:
        f["clustersdk_job_restarts"] = CounterMetricFamily(
            "clustersdk_job_restarts", "Gang restarts of the job after a lost worker", labels=JOB
        )
    f["clustersdk_job_restarts"].add_metric(labels, float(record.get("restarts") or 0))
    _goodput_families(f, gauge, labels, record.get("goodput") or {})


def _goodput_families(
    f: dict, gauge: Callable, labels: list[str], summary: Mapping[str, Any]
) -> None:
    """Where the job's wall time went (see :mod:`clustersdk.control.goodput`)."""
    if not summary:
        return
    if summary.get("goodput") is not None:
        gauge(
            "clustersdk_job_goodput_ratio", "Share of the job's wall time in steps that stand", JOB
        )(labels, float(summary["goodput"]))
    for bucket, value in (summary.get("seconds") or {}).items():
        gauge(
            "clustersdk_job_time_seconds",
            "The job's wall time per goodput bucket, seconds (they add up to its wall time)",
            [*JOB, "bucket"],
        )([*labels, bucket], float(value))
    if "clustersdk_job_lost_steps" not in f:
        f["clustersdk_job_lost_steps"] = CounterMetricFamily(
            "clustersdk_job_lost_steps", "Steps of the job that a restart threw away", labels=JOB
        )
    f["clustersdk_job_lost_steps"].add_metric(labels, float(summary.get("lost_steps") or 0))


def _telemetry_families(
    gauge: Callable, cid: str, job: Mapping[str, Any], by_worker: Mapping[str, Mapping[str, Any]]
) -> None:
    """Per GPU (NVML samples) or per CPU rank (psutil samples): the newest reading."""
    record, newest = job["record"], job.get("system") or {}
    for rank in record.get("ranks") or []:
        sample = newest.get(rank["rank"])
        if not sample:
            continue
        slot = by_worker.get(rank["worker"], {})
        if sample.get("source") == "nvml":
            labels = [
                cid,
                rank["host"],
                rank["worker"],
                str(slot.get("index", "")),
                str(slot.get("uuid") or ""),
                record["id"],
                str(rank["rank"]),
            ]
            table, names = _GPU_GAUGES, GPU
        else:
            labels = [cid, rank["host"], rank["worker"], record["id"], str(rank["rank"])]
            table, names = _RANK_GAUGES, RANK
        for family, doc, key in table:
            if _finite(sample.get(key)):
                gauge(family, doc, names)(labels, float(sample[key]))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
