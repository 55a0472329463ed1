"""``ClusterSDKApp``: the Jupyter server extension that serves clustersdk over HTTP.

Enabled on install (``jupyter server extension list`` shows it). It finds the
clusters that the SDK on this machine created or connected to (the registry
under each of ``state_dirs``) plus the ``scheduler_addresses`` it is given, and
serves them under ``<base_url>/clustersdk/``. Configure it like any Jupyter
application, e.g. in ``jupyter_server_config.py``::

    c.ClusterSDKApp.scheduler_addresses = ["tls://10.0.0.5:8786"]
    c.ClusterSDKApp.state_dirs = ["/shared/clustersdk"]
    c.ClusterSDKApp.credentials = {"alice": "/home/alice/.clustersdk/alice.pem"}  # per user

On a TLS cluster every request acts as its Jupyter user (:mod:`.acting`).
"""

from __future__ import annotations

from jupyter_server.extension.application import ExtensionApp
from traitlets import Dict, Float, List, Unicode, default

from .handlers import METRICS_MISSING, ROUTES, prometheus
from .manager import ClusterManager


class ClusterSDKApp(ExtensionApp):
    """REST API, Prometheus metrics and health checks for clustersdk clusters and jobs."""

    name = "jupyter_clustersdk"
    load_other_extensions = True

    scheduler_addresses = List(
        Unicode(), help="Dask scheduler addresses to serve besides those in the SDK's registry."
    ).tag(config=True)
    state_dirs = List(
        Unicode(),
        help="clustersdk state directories whose cluster registry to read "
        "(default: the SDK's configured state directory).",
    ).tag(config=True)
    call_timeout = Float(10.0, help="Seconds a scheduler may take to answer a read.").tag(
        config=True
    )
    action_timeout = Float(
        120.0,
        help="Seconds a scheduler may take for pause/resume/checkpoint/suspend/stop "
        "(a pause returns once every rank has paused).",
    ).tag(config=True)
    connect_timeout = Float(5.0, help="Seconds to connect to a scheduler.").tag(config=True)
    credentials = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="Jupyter user name -> the clustersdk credentials file (from `clustersdk cluster "
        "add-user`) that user's requests present to TLS schedulers; a user missing from it is "
        "refused. Empty (a single-user server, as JupyterHub runs one per person): every "
        "request acts with this server's own credentials (DASK_CLUSTERSDK__CREDENTIALS, "
        "else the registry's).",
    ).tag(config=True)
    metrics_ended_window = Float(
        300.0, help="Seconds a finished, failed or stopped job stays in the metrics."
    ).tag(config=True)

    @default("state_dirs")
    def _default_state_dirs(self) -> list[str]:
        from clustersdk import config

        return [config.state_dir()]

    def initialize_settings(self) -> None:
        self.manager = ClusterManager(
            state_dirs=self.state_dirs,
            addresses=self.scheduler_addresses,
            call_timeout=self.call_timeout,
            action_timeout=self.action_timeout,
            connect_timeout=self.connect_timeout,
            ended_window=self.metrics_ended_window,
            credentials=dict(self.credentials),
        )
        self.settings["clustersdk_manager"] = self.manager
        self.log.info(
            "clustersdk: serving %d cluster(s) under %sclustersdk/",
            len(self.manager.targets()),
            self.serverapp.base_url,
        )
        if prometheus() is None:
            self.log.warning(METRICS_MISSING)

    def initialize_handlers(self) -> None:
        self.handlers.extend(ROUTES)

    async def stop_extension(self) -> None:
        await self.manager.close()
