"""Following jobs incrementally: the manager's progress and telemetry reads, and the
metrics snapshot built from them.

Each job's history and system samples are read with ``since=`` cursors, so a
scrape or a panel refresh costs one small read per running job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from clustersdk.control import goodput
from clustersdk.errors import AccessDeniedError

from . import models
from .errors import UnsupportedOperationError, UpstreamError
from .models import Target

HISTORY_PAGE = 5000  # rows per read while catching up with a job's history
RATE_WINDOW = 30.0  # seconds of steps that steps/s is measured over
STALL_AFTER = 10.0  # a running job with no new row for this long makes 0 steps/s
UNSUPPORTED_RETRY = 60.0  # how long an op the scheduler lacks is not asked again


@dataclasses.dataclass
class Progress:
    """What the manager remembers about one job between reads."""

    seq: int = 0  # last history row read
    latest: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    points: deque = dataclasses.field(default_factory=lambda: deque(maxlen=1024))
    system_seq: int = 0  # last telemetry sample read
    system: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    final: bool = False  # terminal and fully read
    updated: float | None = None
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class Following:
    """The progress part of :class:`~.manager.ClusterManager` (it provides ``call``,
    ``targets``, ``ended_window``, ``_progress`` and ``_unsupported``)."""

    # progress ----------------------------------------------------------------------------
    async def _follow(self, target: Target, record: dict[str, Any]) -> Progress:
        """Read the job's new history rows; remember each rank's newest and rank 0's pace."""
        progress = self._progress.setdefault(record["id"], Progress())
        async with progress.lock:
            if progress.final:
                return progress
            terminal = models.is_terminal(record["status"])  # read before the rows: none missed
            while True:
                try:
                    rows = await self.call(
                        target, "history", job=record["id"], since=progress.seq, limit=HISTORY_PAGE
                    )
                except AccessDeniedError:  # hide-metrics: another user's job, not shown
                    return progress
                for row in rows:
                    progress.latest[row["rank"]] = row
                    if row["rank"] == 0:
                        progress.points.append((row["time"], row["step"]))
                if rows:
                    progress.seq = rows[-1]["seq"]
                if len(rows) < HISTORY_PAGE:
                    break
            world_size = int((record.get("spec") or {}).get("world_size") or 0)
            for table in (progress.latest, progress.system):  # resumed at fewer ranks: gone
                for rank in [r for r in table if world_size and r >= world_size]:
                    del table[rank]
            progress.updated = time.time()
            progress.final = terminal
        return progress

    async def _follow_system(self, target: Target, record: dict[str, Any]) -> None:
        """Newest telemetry sample per rank; skipped where the scheduler has no ``system``."""
        progress = self._progress.setdefault(record["id"], Progress())
        key = (target.address, "system")
        if time.monotonic() < self._unsupported.get(key, 0):
            return
        async with progress.lock:
            try:
                samples = await self.call(
                    target, "system", job=record["id"], since=progress.system_seq
                )
            except UnsupportedOperationError:
                self._unsupported[key] = time.monotonic() + UNSUPPORTED_RETRY
                return
            except AccessDeniedError:  # hide-metrics: another user's job
                return
            for sample in samples:
                progress.system[sample["rank"]] = sample
            if samples:
                progress.system_seq = samples[-1]["seq"]

    def _progress_model(self, progress: Progress, status: str) -> dict[str, Any]:
        rate = 0.0  # a paused, queued or finished job makes no progress, whatever it did before
        if status == "RUNNING":
            rate = models.steps_per_second(
                list(progress.points), time.time(), RATE_WINDOW, stale=STALL_AFTER
            )
        return models.progress_model(progress.latest, rate, progress.updated)

    # metrics and health ------------------------------------------------------------------
    async def snapshot(self) -> dict[str, Any]:
        """Everything the metrics endpoint exposes, per cluster (see :mod:`.metrics`)."""
        targets = self.targets()
        clusters = await asyncio.gather(*(self._snapshot(t) for t in targets))
        live = {j["record"]["id"] for c in clusters for j in c.get("jobs", ())}
        for job in list(self._progress):  # forget jobs that left the window
            if job not in live:
                self._progress.pop(job, None)
        return {"time": time.time(), "clusters": list(clusters)}

    async def _snapshot(self, target: Target) -> dict[str, Any]:
        try:
            inventory, records = await gather_all(
                self.call(target, "inventory"), self.call(target, "jobs")
            )
            now = time.time()
            shown = [
                r
                for r in records
                if not models.is_terminal(r["status"])
                or (r.get("ended") or now) >= now - self.ended_window
            ]
            await gather_all(*(self._follow(target, r) for r in shown))
            await gather_all(
                *(
                    self._follow_system(target, r)
                    for r in shown
                    if not models.is_terminal(r["status"])
                )
            )
        except (UpstreamError, AccessDeniedError) as e:
            return {"id": target.id, "up": False, "error": str(e)}
        jobs = []
        for record in shown:
            progress = self._progress[record["id"]]
            visible = (await self.job_view(target, record, {})).get("progress") is not None
            jobs.append(
                {
                    "record": record,
                    "progress": self._progress_model(progress, record["status"])
                    if visible
                    else models.progress_model({}, 0.0, None),
                    "system": dict(progress.system) if visible else {},
                }
            )
        return {
            "id": target.id,
            "up": True,
            "slots": inventory,
            "jobs": jobs,
            "counts": _counts(records),
            "goodput": goodput.overall(r.get("goodput") for r in records),
        }


async def gather_all(*awaitables: Any) -> list[Any]:
    """``asyncio.gather`` that lets every call finish before it raises the first error,
    so that none is left running behind the response."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _counts(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for record in records:
        out[record["status"]] = out.get(record["status"], 0) + 1
    return out
