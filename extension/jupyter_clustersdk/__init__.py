"""Jupyter server extension for clustersdk: REST API, Prometheus metrics, health.

Routes under ``<base_url>/clustersdk/`` (see ``openapi.yaml`` in this package,
also served at ``/clustersdk/api/openapi.json``)::

    GET  api/overview                 (every cluster and job, for the lab panel)
    GET  api/clusters                 api/clusters/{cluster}
    GET  api/jobs[?cluster=]          api/jobs/{job}
    GET  api/jobs/{job}/history?since=&limit=
    GET  api/jobs/{job}/logs?rank=&since=
    GET  api/jobs/{job}/checkpoints
    POST api/jobs/{job}/pause|resume|checkpoint|suspend|stop
    GET  metrics                      (Prometheus text format)
    GET  healthz                      (no authentication; no job data)
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import ClusterSDKApp

    return [{"module": "jupyter_clustersdk.app", "app": ClusterSDKApp}]
