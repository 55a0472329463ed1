"""The scheduler's door: who each connection is, Dask's own risky handlers, revocations.

The control plane's operations are checked by :class:`~.requests.Requests` with the
rules of :mod:`.access`; this wraps what Dask itself serves on the scheduler so that,
on a TLS cluster:

- handlers that run code in the scheduler process (``run_function``, ``feed``,
  plugin registration, the unpickling of a submitted task graph), reconfigure or stop
  the cluster are an admin's (:data:`~.access.DASK_ADMIN`);
- registering as a worker or nanny is the cluster's own processes' (a user must not
  pose as a worker and be handed ranks or tasks);
- the scheduler does not forward a person's message to the workers' clustersdk
  handlers (``broadcast``, ``proxy``), nor publish it on a clustersdk topic;
- with ``hide-metrics``, a user subscribes only to their own jobs' topics.

It also keeps the cluster's revocation list: loaded into the scheduler's listeners
(the next handshake of a revoked certificate fails) and handed to the rules, which
refuse requests on connections opened before.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from ..errors import AccessDeniedError
from ..protocol import TOPIC_PREFIX, WorkerOp, op
from ..security.identity import Identity
from ..security.pki import revoked_serials
from ..security.tls import apply_crl, own_subject
from .access import DASK_ADMIN, DASK_CLUSTER, Access, Job

logger = logging.getLogger(__name__)

ANONYMOUS = Identity("anonymous", "anonymous")


class Gate:
    """Identities of connections, Dask's handlers wrapped, and the revocation list."""

    def __init__(self, scheduler: Any, access: Access, job_of: Callable[[str], Job | None]):
        self.scheduler = scheduler
        self.access = access
        self.job_of = job_of  # a topic's job, for hide-metrics
        self.own = own_subject(getattr(scheduler, "security", None), "scheduler")
        self.crl: str | None = None
        path = getattr(getattr(scheduler, "security", None), "tls_crl_file", None)
        if path:
            with open(path) as f:
                self._remember(f.read())

    @staticmethod
    def tls(scheduler: Any) -> bool:
        """Whether the scheduler listens on TLS (then the rules are enforced)."""
        return str(getattr(scheduler, "address", "")).startswith("tls://")

    def identify(self, comm: Any) -> Identity:
        """Who is at the other end of ``comm``: its TLS peer certificate's identity."""
        if not self.access.enforced:
            return ANONYMOUS
        info = getattr(comm, "extra_info", None) or {}
        return Identity.from_peercert(info.get("peercert"), self.own)

    def client(self, client: str) -> Identity:
        """The identity of a Dask client, by its id (for the stream handlers)."""
        stream = self.scheduler.client_comms.get(client)
        return (
            self.identify(getattr(stream, "comm", None))
            if stream is not None
            else Identity("unknown client", "user")
        )

    # --- wrapping Dask's handlers ----------------------------------------------------------
    def install(self) -> None:
        """Wrap Dask's risky scheduler handlers (no-op on a cluster without TLS)."""
        if not self.access.enforced:
            return
        handlers = self.scheduler.handlers
        for name in sorted((DASK_ADMIN | DASK_CLUSTER) & set(handlers)):
            handlers[name] = self._checked(name, handlers[name])
        for name in ("broadcast", "proxy"):
            if name in handlers:
                handlers[name] = self._forwarding(name, handlers[name])
        if "log_event" in handlers:
            handlers["log_event"] = self._publishing(handlers["log_event"])
        streams = self.scheduler.stream_handlers
        if "update-graph" in streams:
            streams["update-graph"] = self._graph(streams["update-graph"])
        if "subscribe-topic" in streams:
            streams["subscribe-topic"] = self._subscribing(streams["subscribe-topic"])

    def _checked(self, name: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        takes_comm = _expects_comm(handler)

        def checked(comm: Any, **kwargs: Any) -> Any:
            self.access.check_dask(name, self.identify(comm))
            return handler(comm, **kwargs) if takes_comm else handler(**kwargs)

        return checked

    def _forwarding(self, name: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        takes_comm = _expects_comm(handler)

        def forwarding(comm: Any, msg: Any = None, **kwargs: Any) -> Any:
            op = msg.get("op") if isinstance(msg, dict) else None
            self.access.check_forward(name, str(op), self.identify(comm))
            return handler(comm, msg=msg, **kwargs) if takes_comm else handler(msg=msg, **kwargs)

        return forwarding

    def _publishing(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        def publishing(comm: Any, topic: Any = None, msg: Any = None) -> Any:
            topics = [topic] if isinstance(topic, str) else list(topic or ())
            who = self.identify(comm)
            for name in topics:
                self.access.check_topic(str(name), who)
            return handler(topic=topic, msg=msg)

        return publishing

    def _graph(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        def update_graph(client: str, keys: Any = (), **kwargs: Any) -> Any:
            try:
                self.access.check_dask("update-graph", self.client(client))
            except AccessDeniedError as e:
                self._refuse_keys(client, keys, e)
                return None
            return handler(client=client, keys=keys, **kwargs)

        return update_graph

    def _refuse_keys(self, client: str, keys: Any, error: Exception) -> None:
        """Every future of a refused graph fails with ``error`` (as a graph that can't be
        deserialized does), rather than waiting forever."""
        from distributed.core import error_message

        logger.warning("clustersdk: %s", error)
        err = error_message(error)
        for key in keys:
            self.scheduler.report(
                {
                    "op": "task-erred",
                    "key": key,
                    "exception": err["exception"],
                    "traceback": err["traceback"],
                },
                client=client,
            )

    def _subscribing(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        def subscribe(topic: str, client: str) -> Any:
            if self.access.hide_metrics and str(topic).startswith(TOPIC_PREFIX):
                job = self.job_of(str(topic)[len(TOPIC_PREFIX) :])
                who = self.client(client)
                if job is not None and not self.access.may_see_metrics(who, job.owner):
                    logger.info(
                        "clustersdk: %s may not follow job %r of %r",
                        who.describe(),
                        job.name,
                        job.owner,
                    )
                    return None
            return handler(topic=topic, client=client)

        return subscribe

    # --- revocation ------------------------------------------------------------------------
    def revoke(self, crl: str) -> frozenset[int]:
        """A new revocation list: into the scheduler's listeners and the rules; the
        serial numbers it names (the caller pushes it to the workers and nannies)."""
        serials = self._remember(crl)
        apply_crl(self.scheduler, crl)
        return serials

    async def push(self, crl: str) -> int:
        """Hand the list to every worker and nanny (their listeners refuse from then on;
        one that starts later gets it when its agent says it is ready); how many took it."""
        import asyncio

        addresses = [
            a for ws in self.scheduler.workers.values() for a in (ws.address, ws.nanny) if a
        ]

        async def one(address: str) -> bool:
            try:
                return bool(await op(self.scheduler.rpc(address), WorkerOp.REVOKE)(crl=crl))
            except Exception as e:  # noqa: BLE001 - a worker that left; the rest go on
                logger.info("clustersdk: could not hand the revocation list to %s: %r", address, e)
                return False

        return sum(await asyncio.gather(*(one(a) for a in addresses)))

    def _remember(self, crl: str) -> frozenset[int]:
        serials = revoked_serials(crl)
        self.crl = crl
        self.access.revoke(serials)
        return serials


def _expects_comm(handler: Callable[..., Any]) -> bool:
    """Whether Dask calls ``handler`` with the comm first (its first parameter's name)."""
    try:
        params = list(inspect.signature(handler).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == "comm"
