"""What the JupyterLab panel asks for that the rest of the API has no single call for.

:class:`PanelQueries` is mixed into :class:`~.manager.ClusterManager`: it uses
the manager's scheduler calls (``call``, ``_identity``), its incremental
following of each job's history and telemetry (``_follow``, ``_follow_system``,
``_progress``) and its job lookup (``locate``), and adds

- :meth:`overview`: every cluster with its slots and every job with its
  progress, so that one request per refresh serves the whole sidebar;
- :meth:`checkpoints`: a job's committed checkpoints (step, size, time).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from clustersdk.errors import AccessDeniedError, CheckpointError

from . import checkpoints, models
from .errors import UpstreamError
from .models import Target

if TYPE_CHECKING:
    from .manager import ClusterManager


class PanelQueries:
    """The panel's reads, on top of the manager's calls (see the module docstring)."""

    async def overview(self: ClusterManager) -> dict[str, Any]:
        """Every cluster (reachable or not) with its slots and their newest telemetry, and
        every job with its progress where the server follows it (jobs that are live or
        ended within ``ended_window``, the same set the metrics follow)."""
        parts = await asyncio.gather(*(self._overview(t) for t in self.targets()))
        jobs = [job for _, cluster_jobs in parts for job in cluster_jobs]
        return models.overview_model([cluster for cluster, _ in parts], jobs, time.time())

    async def _overview(
        self: ClusterManager, target: Target
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        try:
            inventory, records, identity, events = await _settled(
                self.call(target, "inventory"),
                self.call(target, "jobs"),
                self._identity(target),
                self.call(target, "cluster_events"),
            )
            now = time.time()
            followed = {
                r["id"]
                for r in records
                if not models.is_terminal(r["status"])
                or (r.get("ended") or now) >= now - self.ended_window
            }
            busy = {s["job"] for s in inventory if s.get("job")}
            await _settled(*(self._follow(target, r) for r in records if r["id"] in followed))
            await _settled(*(self._follow_system(target, r) for r in records if r["id"] in busy))
        except (UpstreamError, AccessDeniedError) as e:
            return models.cluster_model(target, error=str(e)), []
        samples: dict[str, dict[str, Any]] = {}
        jobs = []
        for record in records:
            self._located[record["id"]] = target.id
            progress = self._progress.get(record["id"])
            if record["id"] in busy and progress is not None:
                samples.update(models.newest_by_worker(record, progress.system))
            shown = None
            if record["id"] in followed and progress is not None:
                shown = self._progress_model(progress, record["status"])
            jobs.append(await self.job_view(target, record, shown))
        cluster = models.cluster_model(
            target,
            inventory=inventory,
            jobs=records,
            samples=samples,
            workers=identity.get("workers"),
            scheduler_id=identity.get("id"),
            events=events,
            dashboard_link=await self.dashboard_link(target, identity),
            detail=True,
        )
        return cluster, jobs

    async def checkpoints(self: ClusterManager, ref: str) -> dict[str, Any]:
        """The job's committed checkpoints, as far as this server can see its checkpoint_dir."""
        _, record = await self.locate(ref)
        directory = (record.get("spec") or {}).get("checkpoint_dir")
        found: list[dict[str, Any]] = []
        error = None
        if directory:
            try:
                found = await asyncio.get_running_loop().run_in_executor(
                    None, checkpoints.scan, directory
                )
            except (OSError, CheckpointError) as e:  # CheckpointError: fsspec's package missing
                error = (
                    f"checkpoint_dir {directory!r} can't be read from this server "
                    f"({type(e).__name__}: {getattr(e, 'strerror', None) or e})"
                )
        return models.checkpoints_model(
            record["id"], directory, found, record.get("checkpoint"), error
        )


async def _settled(*awaitables: Any) -> list[Any]:
    """Let every call finish, then raise the first error (none left running behind)."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
