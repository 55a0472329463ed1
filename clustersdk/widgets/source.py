"""What the dashboards read from a cluster: the only module here that talks to Dask.

Each function makes a few scheduler calls and returns plain data for
:mod:`.model` and :mod:`.render`. Call them from the kernel's thread or a
dashboard's own thread, never from Dask's event loop (they block on it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import config
from ..job import Job
from .model import JobView

if TYPE_CHECKING:
    from ..cluster.base import Cluster


def job_view(job: Job, **options: Any) -> JobView:
    """A :class:`JobView` holding everything the job has recorded so far."""
    view = JobView.from_record(job.info(), **options)
    load_into(view, job)
    return view


def load_into(view: JobView, job: Job) -> None:
    """Read the job's journal (metrics, samples, log lines) into ``view``.

    A job of more ranks than ``clustersdk.dashboard.aggregate-above`` is read as its
    per-step bands (``job.steps()``: its per-rank rows are a million per 1,000 steps
    at 1,024 ranks); its system readings and phases fill in as they come.
    """
    if view.world_size > int(config.get("dashboard.aggregate-above")):
        view.load_steps(job.steps())
    else:
        view.load_history(job.history())
        view.load_system(job.system())
        view.load_phases(job.phases(tail=view.phases.keep * max(view.world_size, 1)))
    view.load_logs(log_lines(job))


def log_lines(job: Job, since: int = 0) -> list[dict[str, Any]]:
    """Every rank's log lines after sequence number ``since``: seq, rank, time, stream, text."""
    return job.log_lines(since=since)


def job_records(cluster: Cluster) -> list[dict[str, Any]]:
    """The cluster's job records, oldest first."""
    return cluster.job_records()


def latest_samples(
    cluster: Cluster, slots: list[dict[str, Any]], seen: dict[str, tuple[int, dict]]
) -> dict[str, dict[str, Any]]:
    """The newest system sample of each busy slot's rank, by worker address.

    ``seen`` (job id -> (last seq, {rank: sample})) carries what earlier calls
    read, so that each call only fetches new samples.
    """
    out: dict[str, dict[str, Any]] = {}
    busy = {s["job"] for s in slots if s.get("job")}
    for job in list(seen):
        if job not in busy:
            del seen[job]
    ranks_of: dict[str, dict[str, int]] = {}
    for job in busy:
        since, latest = seen.get(job, (0, {}))
        record = cluster.job_record(job)
        for sample in Job(cluster, record).system(since=since):
            since = max(since, sample["seq"])
            latest[sample["rank"]] = sample
        seen[job] = (since, latest)
        ranks_of[job] = {r["worker"]: r["rank"] for r in record.get("ranks") or ()}
    for s in slots:
        job = s.get("job")
        if job and job in seen:
            rank = ranks_of.get(job, {}).get(s["worker"])
            sample = seen[job][1].get(rank)
            if sample is not None:
                out[s["worker"]] = sample
    return out
