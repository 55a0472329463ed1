"""Thin HTTP handlers: parse the request, call the manager, render a model.

Every handler but ``/clustersdk/healthz`` needs an authenticated Jupyter user
(``@web.authenticated``) who is authorized for its ``auth_resource``
(``@authorized``: GET is ``read``, POST is ``write``), and acts as that user on
TLS clusters (:mod:`.acting`): the control plane refuses what the user's own
credentials may not do (403). Known errors become
400/404/409/502 JSON bodies ``{"error": code, "message": ...}``; anything
else a JSON 500 without a traceback (the traceback goes to the server log).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from http.client import responses
from importlib import resources
from typing import Any

import yaml
from jupyter_server.auth.decorator import allow_unauthenticated, authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from . import doctor
from .acting import JUPYTER_USER
from .errors import KNOWN_ERRORS, BadRequestError, http_status
from .manager import ACTIONS, ClusterManager
from .models import error_model

JOBS, CLUSTERS, METRICS = "clustersdk:jobs", "clustersdk:clusters", "clustersdk:metrics"
MAX_LIMIT = 10_000
_KIND_NAMES = {str: "a string", bool: "true or false", int: "an integer"}
_CODES = {400: "bad_request", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}
#: what /clustersdk/metrics answers (503), and the server logs once, without prometheus_client
METRICS_MISSING = (
    "clustersdk: /clustersdk/metrics is off: prometheus_client is not installed "
    "(pip install 'clustersdk[server]', or pip install prometheus_client, and restart the server)"
)


def prometheus() -> tuple[Any, Callable[..., Any]] | None:
    """The metrics renderer (:mod:`.metrics`) and prometheus_client's ``choose_encoder``;
    None where prometheus_client is missing (the ``server`` extra installs it; Jupyter
    Server does too, today), so that the rest of the extension loads without it."""
    try:
        from prometheus_client.exposition import choose_encoder
    except ImportError:
        return None
    from . import metrics

    return metrics, choose_encoder


def _json(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
    """Send what the method returns as JSON, and a known error as its status and model."""

    @functools.wraps(method)
    async def inner(self: ClusterSDKHandler, *args: Any, **kwargs: Any) -> None:
        try:
            body = await method(self, *args, **kwargs)
        except KNOWN_ERRORS as e:
            status, code = http_status(e)
            self.set_status(status)
            self.finish(json.dumps(error_model(code, str(e))))
            return
        self.finish(json.dumps(body))

    return inner


class ClusterSDKHandler(ExtensionHandlerMixin, APIHandler):
    """Common parts: the manager, argument parsing, JSON error bodies."""

    auth_resource = JOBS

    @property
    def manager(self) -> ClusterManager:
        return self.settings["clustersdk_manager"]

    async def prepare(self, *args: Any, **kwargs: Any) -> None:
        """The request acts as its Jupyter user: a TLS scheduler sees their credentials."""
        await super().prepare(*args, **kwargs)
        user = self.current_user
        JUPYTER_USER.set(getattr(user, "username", None) if user else None)

    def int_arg(
        self, name: str, default: int | None, minimum: int = 0, maximum: int | None = None
    ) -> int | None:
        raw = self.get_query_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise BadRequestError(f"query parameter {name}={raw!r} must be an integer") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            raise BadRequestError(f"query parameter {name}={value} must be {bound}")
        return value

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        if isinstance(exc, web.HTTPError):
            message = exc.log_message or responses.get(status_code, "error")
            code = _CODES.get(status_code, "error")
        else:  # a bug of ours: tornado has logged the traceback; the client gets none
            message, code = "internal server error; the server log has the details", "internal"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(error_model(code, message)))


class ClustersHandler(ClusterSDKHandler):
    auth_resource = CLUSTERS

    @web.authenticated
    @authorized
    @_json
    async def get(self) -> Any:
        return {"clusters": await self.manager.clusters()}


class ClusterHandler(ClusterSDKHandler):
    auth_resource = CLUSTERS

    @web.authenticated
    @authorized
    @_json
    async def get(self, cluster: str) -> Any:
        return await self.manager.cluster(cluster)


class DoctorHandler(ClusterSDKHandler):
    """POST: the doctor's pre-flight checks of one cluster. A POST that needs ``write``:
    it opens ports on every host, writes to the checkpoint directory and loads the links."""

    auth_resource = CLUSTERS

    @web.authenticated
    @authorized
    @_json
    async def post(self, cluster: str) -> Any:
        options = self._options()
        target = self.manager.target(cluster)
        return await doctor.run(
            target,
            connect_timeout=self.manager.connect_timeout,
            credentials=self.manager.credentials.for_address(target.address, target.id),
            **options,
        )

    def _options(self) -> dict[str, Any]:
        raw = self.request.body.strip()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            raise BadRequestError("the request body must be a JSON object") from None
        if not isinstance(body, dict):
            raise BadRequestError("the request body must be a JSON object")
        kinds = {"checkpoint_dir": str, "bandwidth": bool, "max_size": int}
        unknown = sorted(set(body) - set(kinds))
        if unknown:
            raise BadRequestError(f"doctor takes {sorted(kinds)}, got {unknown}")
        for name, value in body.items():
            if value is not None and (
                not isinstance(value, kinds[name])
                or (kinds[name] is int and isinstance(value, bool))
            ):
                raise BadRequestError(f"{name} must be {_KIND_NAMES[kinds[name]]}, got {value!r}")
        if body.get("max_size") is not None and body["max_size"] < 1:
            raise BadRequestError(f"max_size must be at least 1 (bytes), got {body['max_size']}")
        if body.get("checkpoint_dir") == "":
            raise BadRequestError("checkpoint_dir must be a path, got ''")
        return {k: v for k, v in body.items() if v is not None}


class JobsHandler(ClusterSDKHandler):
    @web.authenticated
    @authorized
    @_json
    async def get(self) -> Any:
        return await self.manager.jobs(self.get_query_argument("cluster", None) or None)

    @web.authenticated
    @authorized
    @_json
    async def post(self) -> Any:
        """A script job (``cluster.launch_script``): 201 with its record."""
        raw = self.request.body.strip()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            raise BadRequestError("the request body must be a JSON object") from None
        if not isinstance(body, dict):
            raise BadRequestError(
                'the request body must be a JSON object, e.g. {"world_size": '
                '2, "script": "train.py", "args": ["--lr", "1e-3"]}'
            )
        record = await self.manager.submit_script(body)
        self.set_status(201)
        return record


class QueueHandler(ClusterSDKHandler):
    """Per cluster and queue: the jobs holding slots, those waiting, why, and when."""

    auth_resource = CLUSTERS

    @web.authenticated
    @authorized
    @_json
    async def get(self) -> Any:
        return await self.manager.queue(self.get_query_argument("cluster", None) or None)


class JobHandler(ClusterSDKHandler):
    @web.authenticated
    @authorized
    @_json
    async def get(self, job: str) -> Any:
        return await self.manager.job(job)


class HistoryHandler(ClusterSDKHandler):
    @web.authenticated
    @authorized
    @_json
    async def get(self, job: str) -> Any:
        since = self.int_arg("since", 0)
        limit = self.int_arg("limit", 1000, minimum=1, maximum=MAX_LIMIT)
        return await self.manager.history(job, since=since, limit=limit)


class LogsHandler(ClusterSDKHandler):
    @web.authenticated
    @authorized
    @_json
    async def get(self, job: str) -> Any:
        return await self.manager.logs(
            job, rank=self.int_arg("rank", None), since=self.int_arg("since", 0)
        )


class OverviewHandler(ClusterSDKHandler):
    """Every cluster with its slots and every job with its progress: the lab panel's refresh."""

    auth_resource = CLUSTERS

    @web.authenticated
    @authorized
    @_json
    async def get(self) -> Any:
        return await self.manager.overview()


class CheckpointsHandler(ClusterSDKHandler):
    @web.authenticated
    @authorized
    @_json
    async def get(self, job: str) -> Any:
        return await self.manager.checkpoints(job)


class ActionHandler(ClusterSDKHandler):
    """POST pause | resume | checkpoint | suspend | stop | restart (a HELD job, from its
    newest checkpoint); resume takes ``{"world_size": N}``."""

    @web.authenticated
    @authorized
    @_json
    async def post(self, job: str, action: str) -> Any:
        return await self.manager.act(job, action, **self._options(action))

    def _options(self, action: str) -> dict[str, Any]:
        raw = self.request.body.strip()
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError:
            raise BadRequestError("the request body must be a JSON object") from None
        if not isinstance(body, dict):
            raise BadRequestError("the request body must be a JSON object")
        allowed = {"world_size"} if action == "resume" else set()
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise BadRequestError(f"{action} takes {sorted(allowed) or 'no fields'}, got {unknown}")
        ws = body.get("world_size")
        if ws is None:
            return {}
        if isinstance(ws, bool) or not isinstance(ws, int) or ws < 1:
            raise BadRequestError(f"world_size must be a positive integer, got {ws!r}")
        return {"world_size": ws}


class UpdateHandler(ClusterSDKHandler):
    """POST ``{"lr": 1e-4, "warmup": 200}``: ``job.update`` on every rank before one step.
    200 once applied (the step and each change's old -> new), 202 if not yet (the job left
    RUNNING and PAUSED first, or no rank reached a boundary within the action timeout: they
    apply it at their next), 400 for a key or value it can't take."""

    @web.authenticated
    @authorized
    @_json
    async def post(self, job: str) -> Any:
        raw = self.request.body.strip()
        try:
            changes = json.loads(raw) if raw else None
        except ValueError:
            raise BadRequestError("the request body must be a JSON object") from None
        if not isinstance(changes, dict) or not changes:
            raise BadRequestError(
                'the request body must be a JSON object of the changes, e.g. {"lr": 0.0001}'
            )
        result = await self.manager.update(job, changes)
        if not result["applied"]:
            self.set_status(202)
        return result


class ForkHandler(ClusterSDKHandler):
    """POST ``{"name": "half-lr", "hparams": {"lr": 5e-4}}`` (also ``at``, ``world_size``,
    ``checkpoint_dir``): ``job.fork``, a new job from the job's state; 201 with the fork's
    record, 400 for a change it can't take or a job without checkpoints."""

    FIELDS = {"name": str, "at": int, "hparams": dict, "world_size": int, "checkpoint_dir": str}
    JSON = {str: "a string", int: "an integer", dict: "an object"}

    @web.authenticated
    @authorized
    @_json
    async def post(self, job: str) -> Any:
        raw = self.request.body.strip()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            raise BadRequestError("the request body must be a JSON object") from None
        if not isinstance(body, dict):
            raise BadRequestError(
                'the request body must be a JSON object, e.g. {"hparams": {"lr": 0.0005}}'
            )
        for key, value in body.items():
            kind = self.FIELDS.get(key)
            if kind is None:
                raise BadRequestError(
                    f"unknown field {key!r}; a fork takes {', '.join(self.FIELDS)}"
                )
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
                raise BadRequestError(f"{key} must be {self.JSON[kind]}, got {value!r}")
        record = await self.manager.fork(job, **body)
        self.set_status(201)
        return record


class StacksHandler(ClusterSDKHandler):
    """GET: where every rank is now, its step, phase and training thread's stack (every
    thread's with ``?all_threads=true``), collected without the rank's help."""

    @web.authenticated
    @authorized
    @_json
    async def get(self, job: str) -> Any:
        flag = self.get_query_argument("all_threads", "false").lower()
        if flag not in ("true", "false", "1", "0"):
            raise BadRequestError(f"all_threads must be true or false, got {flag!r}")
        return await self.manager.stacks(job, all_threads=flag in ("true", "1"))


class OpenAPIHandler(ClusterSDKHandler):
    """The OpenAPI 3 description of this API, with this server's base URL."""

    auth_resource = CLUSTERS

    @web.authenticated
    @authorized
    async def get(self, fmt: str) -> None:
        spec = dict(openapi_spec())
        spec["servers"] = [{"url": self.base_url.rstrip("/") or "/"}]
        if fmt == "json":
            self.finish(json.dumps(spec))
        else:
            self.finish(yaml.safe_dump(spec, sort_keys=False), set_content_type="application/yaml")


class MetricsHandler(ClusterSDKHandler):
    """Prometheus text format (or OpenMetrics, when the scraper asks for it)."""

    auth_resource = METRICS
    _track_activity = False  # a scraper must not keep an idle server alive

    @web.authenticated
    @authorized
    async def get(self) -> None:
        found = prometheus()
        if found is None:
            self.set_status(503)
            self.finish(json.dumps(error_model("metrics_unavailable", METRICS_MISSING)))
            return
        metrics, choose_encoder = found
        snapshot = await self.manager.snapshot()
        encoder, content_type = choose_encoder(self.request.headers.get("Accept", ""))
        self.finish(metrics.render(snapshot, encoder), set_content_type=content_type)


class HealthHandler(ClusterSDKHandler):
    """200 when every known scheduler answers, else 503 and why; no job data, no login."""

    _track_activity = False

    @allow_unauthenticated
    async def get(self) -> None:
        status, body = await self.manager.health()
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))


@functools.lru_cache(maxsize=1)
def openapi_spec() -> dict[str, Any]:
    """The OpenAPI description shipped in this package."""
    text = resources.files(__package__).joinpath("openapi.yaml").read_text()
    return yaml.safe_load(text)


_JOB = r"(?P<job>[^/]+)"
#: (pattern under the base URL, handler): the whole route table
ROUTES: list[tuple[str, type[ClusterSDKHandler]]] = [
    (r"/clustersdk/api/clusters", ClustersHandler),
    (r"/clustersdk/api/clusters/(?P<cluster>[^/]+)", ClusterHandler),
    (r"/clustersdk/api/clusters/(?P<cluster>[^/]+)/doctor", DoctorHandler),
    (r"/clustersdk/api/overview", OverviewHandler),
    (r"/clustersdk/api/jobs", JobsHandler),
    (r"/clustersdk/api/queue", QueueHandler),
    (rf"/clustersdk/api/jobs/{_JOB}", JobHandler),
    (rf"/clustersdk/api/jobs/{_JOB}/history", HistoryHandler),
    (rf"/clustersdk/api/jobs/{_JOB}/logs", LogsHandler),
    (rf"/clustersdk/api/jobs/{_JOB}/checkpoints", CheckpointsHandler),
    (rf"/clustersdk/api/jobs/{_JOB}/stacks", StacksHandler),
    (rf"/clustersdk/api/jobs/{_JOB}/update", UpdateHandler),
    (rf"/clustersdk/api/jobs/{_JOB}/fork", ForkHandler),
    (rf"/clustersdk/api/jobs/{_JOB}/(?P<action>{'|'.join(ACTIONS)})", ActionHandler),
    (r"/clustersdk/api/openapi\.(?P<fmt>json|yaml)", OpenAPIHandler),
    (r"/clustersdk/metrics", MetricsHandler),
    (r"/clustersdk/healthz", HealthHandler),
]
