"""The manager: finds clusters and talks to their schedulers; no HTTP in here.

It keeps one asynchronous Dask client per scheduler address and calls the
control plane through the SDK's own async core (:class:`clustersdk.client.ControlClient`,
the coroutines ``Cluster`` runs through its sync bridge), with a timeout on
every call. Connection failures, timeouts and operations the scheduler does
not know become :class:`~.errors.UpstreamError`; the SDK's own errors
(``JobNotFoundError``, ``InvalidTransitionError``...) arrive as themselves.

It also follows running jobs incrementally (``history``/``system`` with
``since=``) so that progress and telemetry cost one small read per scrape.

>>> manager = ClusterManager(state_dirs=["~/.clustersdk"])          # doctest: +SKIP
>>> [c["id"] for c in await manager.clusters()]                      # doctest: +SKIP
['tcp-127.0.0.1-8786']
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from clustersdk import registry
from clustersdk.actions import VERBS, WAITING
from clustersdk.client import ControlClient
from clustersdk.cluster.dashboard import DashboardFinder
from clustersdk.control.access import may_change, refusal
from clustersdk.errors import AccessDeniedError, ClusterSDKError, JobNotFoundError, SpecError
from clustersdk.protocol import Op
from clustersdk.security.identity import Identity

from . import models
from .acting import Credentials
from .errors import (
    KNOWN_ERRORS,
    ClusterNotFoundError,
    SchedulerUnavailableError,
    UnsupportedOperationError,
    UpstreamError,
)
from .following import Following, Progress, gather_all
from .models import Target
from .panel import PanelQueries

logger = logging.getLogger(__name__)

ACTIONS = VERBS  # POST .../jobs/{job}/VERB
WAITING_ACTIONS = WAITING  # they return once the ranks have done it
RECONNECT_AFTER = 5.0  # how long a scheduler that refused a connection is not tried again


class ClusterManager(Following, PanelQueries):
    """Every cluster the extension can see, and the calls the REST API makes on them."""

    def __init__(
        self,
        *,
        state_dirs: Iterable[str] = (),
        addresses: Iterable[str] = (),
        call_timeout: float = 10.0,
        action_timeout: float = 120.0,
        connect_timeout: float = 5.0,
        ended_window: float = 300.0,
        credentials: dict[str, str] | None = None,
    ):
        self.state_dirs = list(state_dirs)
        # a TLS scheduler sees the Jupyter user of each request (see acting.py)
        self.credentials = Credentials(credentials, self.state_dirs)
        self.addresses = list(addresses)
        self.call_timeout = call_timeout
        self.action_timeout = action_timeout
        self.connect_timeout = connect_timeout
        self.ended_window = ended_window
        # one client per (address, credentials file): each person's connections are theirs
        self._clients: dict[tuple[str, str | None], Any] = {}
        self._whoami: dict[tuple[str, str | None], dict[str, Any]] = {}
        self._connecting: dict[tuple[str, str | None], asyncio.Lock] = {}
        self._unsupported: dict[tuple[str, str], float] = {}
        self._down: dict[tuple[str, str | None], tuple[float, str]] = {}  # (retry after, why)
        self._progress: dict[str, Progress] = {}
        self._located: dict[str, str] = {}  # job id -> cluster id
        self._dashboards = DashboardFinder()  # each scheduler's Dask dashboard, asked once

    # discovery ---------------------------------------------------------------------
    def targets(self) -> list[Target]:
        """Configured addresses first, then the SDK's registry; one per address."""
        found: dict[str, Target] = {}
        for address in self.addresses:
            found.setdefault(
                address, Target(models.cluster_id(address), address, "remote", "config")
            )
        for state_dir in self.state_dirs:
            for entry in registry.entries(state_dir):
                address = entry["address"]
                found.setdefault(
                    address,
                    Target(
                        models.cluster_id(address),
                        address,
                        str(entry.get("kind", "local")),
                        "registry",
                    ),
                )
        return list(found.values())

    def target(self, cluster: str) -> Target:
        for target in self.targets():
            if target.id == cluster:
                return target
        known = ", ".join(t.id for t in self.targets()) or "none"
        raise ClusterNotFoundError(f"no cluster with id {cluster!r}; known clusters: {known}")

    # calls -------------------------------------------------------------------------
    async def call(
        self, target: Target, op: Op | str, *, call_timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """The control plane's operation ``op`` with ``kwargs``, on ``target``'s scheduler."""
        operation = Op(op)
        client = await self._client(target)
        control = ControlClient(client.scheduler)
        try:
            result = await asyncio.wait_for(
                control.call(operation, **kwargs), call_timeout or self.call_timeout
            )
        except KNOWN_ERRORS:
            raise
        except ClusterSDKError as e:  # an SDK error the API has no status for: the scheduler's
            raise UpstreamError(f"cluster {target.id}: {operation.value!r} failed: {e}") from e
        except (OSError, asyncio.TimeoutError) as e:
            await self._drop(self._key(target))
            raise SchedulerUnavailableError(
                f"the scheduler of cluster {target.id} ({target.address}) did not answer "
                f"{operation.value!r}: {type(e).__name__}: {e}".rstrip(": ")
            ) from e
        except Exception as e:  # the scheduler raised something it shouldn't: report, don't crash
            raise UpstreamError(
                f"the scheduler of cluster {target.id} failed on {operation.value!r}: "
                f"{type(e).__name__}: {e}"
            ) from e
        if result is None:  # what a Dask server replies to an op it has no handler for
            raise UnsupportedOperationError(
                f"the scheduler of cluster {target.id} does not support {operation.value!r}: its "
                "clustersdk control plane is older than this server extension; upgrade it there"
            )
        return result

    def _key(self, target: Target) -> tuple[str, str | None]:
        """Whose connection a request to ``target`` uses: (address, credentials file)."""
        return target.address, self.credentials.for_address(target.address, target.id)

    async def _client(self, target: Target) -> Any:
        key = self._key(target)
        client = self._clients.get(key)
        if client is not None and client.status == "running":
            return client
        down = self._down.get(key)
        if down is not None and time.monotonic() < down[0]:
            raise SchedulerUnavailableError(down[1])  # don't make every request wait again
        lock = self._connecting.setdefault(key, asyncio.Lock())
        async with lock:
            client = self._clients.get(key)
            if client is not None and client.status == "running":
                return client
            down = self._down.get(key)
            if down is not None and time.monotonic() < down[0]:
                raise SchedulerUnavailableError(down[1])
            if client is not None:
                await self._drop(key)
            from distributed import Client

            security = None
            if key[1] is not None:
                from clustersdk.security.tls import credentials_security

                security = credentials_security(key[1])
            client = Client(
                target.address,
                asynchronous=True,
                set_as_default=False,
                timeout=self.connect_timeout,
                name="jupyter-clustersdk",
                security=security,
            )

            async def started() -> None:
                await client

            try:
                await asyncio.wait_for(started(), self.connect_timeout + 1)
            except Exception as e:
                try:
                    await asyncio.wait_for(client.close(), 2)
                except Exception:
                    pass
                message = (
                    f"could not connect to the scheduler of cluster {target.id} "
                    f"({target.address}): {type(e).__name__}: {e}".rstrip(": ")
                )
                self._down[key] = (time.monotonic() + RECONNECT_AFTER, message)
                raise SchedulerUnavailableError(message) from e
            self._down.pop(key, None)
            self._clients[key] = client
            return client

    async def who(self, target: Target) -> dict[str, Any]:
        """Whom requests to ``target`` act as (the control plane's answer, asked once per
        connection): name, role, and whether the rules are enforced."""
        key = self._key(target)
        if not target.address.startswith("tls://"):  # plain tcp: no identities, nothing to ask
            return {"name": "", "role": "user", "enforced": False}
        if key not in self._whoami:
            try:
                self._whoami[key] = await self.call(target, Op.WHOAMI)
            except UnsupportedOperationError:  # an older control plane: no identities
                self._whoami[key] = {"name": "", "role": "user", "enforced": False}
        return self._whoami[key]

    async def _rules(self, target: Target) -> tuple[Identity, bool, bool]:
        who = await self.who(target)
        role = (
            who.get("role")
            if who.get("role") in ("admin", "user", "scheduler", "worker")
            else "user"
        )
        return (
            Identity(who.get("name") or "", role),
            bool(who.get("enforced")),
            bool(who.get("hide_metrics")),
        )

    async def job_view(
        self, target: Target, record: dict[str, Any], progress: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """:func:`.models.job_model`, with whether this request's user may change the job
        (and why not: the panel's tooltip), and its progress only where they may see it."""
        who, enforced, hide = await self._rules(target)
        owner = (record.get("spec") or {}).get("owner")
        allowed = may_change(who, owner, enforced=enforced)
        if hide and not allowed:
            progress = None
        model = models.job_model(record, target.id, progress)
        model["may_change"] = allowed
        model["refusal"] = "" if allowed else (refusal(who, owner) or "")
        return model

    async def _drop(self, key: tuple[str, str | None]) -> None:
        client = self._clients.pop(key, None)
        self._whoami.pop(key, None)
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), 2)
            except Exception:  # a dead scheduler: closing may fail, the client is gone anyway
                logger.debug("closing the client of %s failed", key[0], exc_info=True)

    async def close(self) -> None:
        """Close every scheduler client."""
        await asyncio.gather(*(self._drop(a) for a in list(self._clients)))

    # clusters ------------------------------------------------------------------------
    async def clusters(self) -> list[dict[str, Any]]:
        """Every known cluster, reachable or not."""
        return list(await asyncio.gather(*(self._cluster(t, detail=False) for t in self.targets())))

    async def cluster(self, cluster: str) -> dict[str, Any]:
        """One cluster with its workers and slots (GPU telemetry where ranks report it)."""
        return await self._cluster(self.target(cluster), detail=True)

    async def _cluster(self, target: Target, *, detail: bool) -> dict[str, Any]:
        samples: dict[str, dict] = {}
        try:
            inventory, jobs, identity, events = await gather_all(
                self.call(target, "inventory"),
                self.call(target, "jobs"),
                self._identity(target),
                self.call(target, "cluster_events"),
            )
            if detail:
                busy = {s["job"] for s in inventory if s.get("job")}
                records = [r for r in jobs if r["id"] in busy]
                await gather_all(*(self._follow_system(target, r) for r in records))
                for record in records:
                    samples.update(
                        models.newest_by_worker(record, self._progress[record["id"]].system)
                    )
        except UpstreamError as e:
            return models.cluster_model(target, error=str(e))
        return models.cluster_model(
            target,
            inventory=inventory,
            jobs=jobs,
            samples=samples,
            workers=identity.get("workers"),
            scheduler_id=identity.get("id"),
            events=events,
            dashboard_link=await self.dashboard_link(target, identity),
            detail=detail,
        )

    async def dashboard_link(self, target: Target, identity: dict[str, Any]) -> str | None:
        """The URL of the cluster's Dask dashboard (its scheduler's ``identity`` names
        the HTTP port), or None where it serves none."""
        return await self._dashboards.link(target.address, identity)

    async def _identity(self, target: Target) -> dict[str, Any]:
        client = await self._client(target)
        try:
            return await asyncio.wait_for(client.scheduler.identity(), self.call_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            await self._drop(self._key(target))
            raise SchedulerUnavailableError(f"cluster {target.id}: {type(e).__name__}") from e

    # jobs ------------------------------------------------------------------------------
    async def jobs(self, cluster: str | None = None) -> dict[str, Any]:
        """Jobs of every reachable cluster (or of one), oldest first."""
        answers, unreachable = await self._ask_all(cluster, "jobs")
        jobs = []
        for target, records in answers:
            for record in records:
                self._located[record["id"]] = target.id
                jobs.append(await self.job_view(target, record))
        return models.jobs_model(jobs, unreachable)

    async def submit_script(self, body: dict[str, Any]) -> dict[str, Any]:
        """Submit a script job (``cluster.launch_script``) described by ``body``: the
        cluster's id (optional when there is one), ``world_size``, ``script`` / ``module``
        / ``command``, ``args`` and the other options of a script job. The new record."""
        from clustersdk import options
        from clustersdk.cluster.shipping import script_payload
        from clustersdk.spec import JobSpec

        fields = dict(body)
        cluster = fields.pop("cluster", None)
        args = fields.pop("args", None) or []
        known = set(options.names(options.SCRIPT))
        unknown = sorted(set(fields) - known)
        if unknown:
            raise SpecError(
                f"a script job takes {', '.join(['cluster', 'args', *sorted(known)])}"
                f"; got {', '.join(unknown)}"
            )
        if "world_size" not in fields:
            raise SpecError("world_size is required: how many ranks")
        targets = [self.target(cluster)] if cluster else self.targets()
        if len(targets) != 1:
            raise SpecError(
                f"give the cluster's id: there are {len(targets)} clusters ("
                f"{', '.join(t.id for t in targets) or 'none'})"
            )
        target = targets[0]
        if not isinstance(args, list):
            raise SpecError(f"args must be a list of strings, got {args!r}")
        spec = JobSpec(fn=None, args=tuple(args), **fields)  # a SpecError names the bad field
        # the code is packed here, off the event loop (a working_dir may be large)
        payload = await asyncio.get_running_loop().run_in_executor(None, script_payload, spec)
        wire = spec.to_wire()
        # the control plane makes the owner this request's Jupyter user (their credentials)
        record = await self.call(target, Op.SUBMIT, spec=wire.as_dict(), payload=payload)
        self._located[record["id"]] = target.id
        return await self.job_view(target, record)

    async def queue(self, cluster: str | None = None) -> dict[str, Any]:
        """The queues of every reachable cluster (or of one): who holds what, what waits
        and why, estimated starts."""
        answers, unreachable = await self._ask_all(cluster, "queue")
        return {
            "clusters": [{"cluster": target.id, **view} for target, view in answers],
            "unreachable": unreachable,
        }

    async def _ask_all(
        self, cluster: str | None, op: str
    ) -> tuple[list[tuple[Target, Any]], list[str]]:
        """``op`` on every known cluster's scheduler (or on one): the answers, and the
        ids of the clusters that could not be asked."""
        targets = [self.target(cluster)] if cluster else self.targets()
        results = await asyncio.gather(*(self.call(t, op) for t in targets), return_exceptions=True)
        answers, unreachable = [], []
        for target, result in zip(targets, results):
            if isinstance(result, (UpstreamError, AccessDeniedError)):
                unreachable.append(target.id)
                continue
            if isinstance(result, BaseException):
                raise result
            answers.append((target, result))
        return answers, unreachable

    async def locate(self, ref: str) -> tuple[Target, dict[str, Any]]:
        """The cluster and record of the job with id (or, failing that, name) ``ref``."""
        known = self._located.get(ref)
        if known is not None:
            try:
                target = self.target(known)
                return target, await self.call(target, "job", job=ref)
            except (ClusterNotFoundError, JobNotFoundError, UpstreamError):
                self._located.pop(ref, None)
        targets = self.targets()
        results = await asyncio.gather(
            *(self._find(t, ref) for t in targets), return_exceptions=True
        )
        hits = [(t, r) for t, r in zip(targets, results) if isinstance(r, dict)]
        for result in results:
            if isinstance(result, BaseException) and not isinstance(
                result, (UpstreamError, AccessDeniedError)
            ):
                raise result
        if not hits:
            down = [t.id for t, r in zip(targets, results) if isinstance(r, UpstreamError)]
            extra = f" (unreachable: {', '.join(down)})" if down else ""
            raise JobNotFoundError(f"no job with id or name {ref!r} on any cluster{extra}")
        # an id beats a name; among names, the newest submission
        hits.sort(key=lambda h: (h[1]["id"] == ref, h[1].get("submitted") or 0), reverse=True)
        target, record = hits[0]
        self._located[record["id"]] = target.id
        return target, record

    async def _find(self, target: Target, ref: str) -> dict[str, Any] | None:
        # from the list rather than by asking for the id, then the name: a miss
        # would log a traceback on the scheduler for every lookup
        records = await self.call(target, "jobs")
        by_id = [r for r in records if r["id"] == ref]
        by_name = [r for r in records if r["name"] == ref]
        found = by_id or by_name
        return max(found, key=lambda r: r.get("submitted") or 0) if found else None

    async def job(self, ref: str) -> dict[str, Any]:
        """One job with its progress (step, steps/s, newest scalars)."""
        target, record = await self.locate(ref)
        progress = await self._follow(target, record)
        return await self.job_view(target, record, self._progress_model(progress, record["status"]))

    async def history(self, ref: str, since: int = 0, limit: int = 1000) -> dict[str, Any]:
        target, record = await self.locate(ref)
        rows = await self.call(target, "history", job=record["id"], since=since, limit=limit)
        return models.history_model(record["id"], rows, since, limit)

    async def logs(self, ref: str, rank: int | None = None, since: int = 0) -> dict[str, Any]:
        target, record = await self.locate(ref)
        lines = await self.call(target, "logs", job=record["id"], rank=rank, since=since)
        return models.logs_model(record["id"], lines, since, rank)

    async def act(self, ref: str, action: str, **kwargs: Any) -> dict[str, Any]:
        """Ask for ``pause``/``resume``/``checkpoint``/``suspend``/``stop``/``restart`` (a
        HELD job, from its newest checkpoint); the new record."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
        target, record = await self.locate(ref)
        if action in WAITING_ACTIONS:  # the scheduler gives up (and withdraws the request) first
            kwargs["timeout"] = self.action_timeout
        result = await self.call(
            target, action, job=record["id"], call_timeout=self.action_timeout + 5, **kwargs
        )
        return await self.job_view(target, result)

    async def update(self, ref: str, changes: dict[str, Any]) -> dict[str, Any]:
        """``job.update(**changes)``: checked by the scheduler before any rank sees it (a
        SpecError names what is wrong); the step it was applied before, with old -> new."""
        target, record = await self.locate(ref)
        result = await self.call(
            target,
            Op.UPDATE,
            job=record["id"],
            changes=changes,
            timeout=self.action_timeout,
            call_timeout=self.action_timeout + 5,
        )
        error = result.get("error")
        if error:
            raise SpecError(
                f"the update of job {record['name']!r} was refused by rank "
                f"{error.get('rank')}: {error.get('message')}; nothing changed"
            )
        if result["step"] is not None:  # the old values are in the durable event
            record = await self.call(target, "job", job=record["id"])
        return models.update_model(result, record, target.id)

    async def fork(
        self,
        ref: str,
        name: str | None = None,
        at: int | None = None,
        hparams: dict[str, Any] | None = None,
        world_size: int | None = None,
        checkpoint_dir: str | None = None,
    ) -> dict[str, Any]:
        """``job.fork``: a new job from the job's state (see ``Job.fork``); its record."""
        target, record = await self.locate(ref)
        result = await self.call(
            target,
            Op.FORK,
            job=record["id"],
            name=name,
            at=at,
            changes=hparams,
            world_size=world_size,
            checkpoint_dir=checkpoint_dir,
            timeout=self.action_timeout,
            call_timeout=self.action_timeout + 5,
        )
        return await self.job_view(target, result)

    async def stacks(self, ref: str, all_threads: bool = False) -> dict[str, Any]:
        """Where every rank is now (see ``Job.stacks``)."""
        target, record = await self.locate(ref)
        found = await self.call(
            target,
            Op.STACKS,
            job=record["id"],
            all_threads=all_threads,
            call_timeout=self.action_timeout,
        )
        return models.stacks_model(record, found, target.id)

    async def health(self) -> tuple[int, dict[str, Any]]:
        """Whether every known scheduler answers; see :func:`.models.health_model`."""
        targets = self.targets()

        async def probe(target: Target) -> str | None:
            try:
                await self.call(target, "inventory")
            except SchedulerUnavailableError:
                return "no answer"
            except UnsupportedOperationError:
                return "no clustersdk control plane, or an older one"
            except UpstreamError:
                return "scheduler error"
            return None

        results = await asyncio.gather(*(probe(t) for t in targets))
        return models.health_model({t.id: r for t, r in zip(targets, results)})
