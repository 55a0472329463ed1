"""The live cluster dashboard: slots with device bars, and jobs with their state.

The cluster has no event stream of its own, so a daemon thread re-reads it
every ``REFRESH`` seconds (three small scheduler calls) while the dashboard is
open and the cluster is not closed.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from . import source
from .render import cluster_html, cluster_model
from .tree import close_tree

if TYPE_CHECKING:
    from ..cluster.base import Cluster

logger = logging.getLogger(__name__)

REFRESH = 2.0  # seconds between reads of the cluster


def snapshot(cluster: Cluster, seen: dict | None = None) -> dict[str, Any]:
    """The cluster dashboard's model, read now (``seen`` makes repeated reads incremental)."""
    address = _address(cluster)
    if cluster.closed:
        return cluster_model(
            kind=cluster.kind, address=address, slots=[], jobs=[], samples={}, closed=True
        )
    slots = cluster.slots()
    jobs = source.job_records(cluster)
    samples = source.latest_samples(cluster, slots, {} if seen is None else seen)
    return cluster_model(
        kind=cluster.kind, address=address, slots=slots, jobs=jobs, samples=samples
    )


class ClusterDashboard:
    """A cluster's live dashboard; display it (or the cluster) in a notebook."""

    def __init__(self, cluster: Cluster, refresh: float = REFRESH):
        self._cluster = weakref.ref(cluster)
        self._seen: dict = {}
        self._stop = threading.Event()
        self.refresh = refresh
        self.model = snapshot(cluster, self._seen)
        self.body = w.HTML(cluster_html(self.model), layout=w.Layout(width="100%"))
        self.widget = w.VBox([self.body], layout=w.Layout(width="100%"))
        self.widget.add_class("clustersdk-cluster")
        self._thread = threading.Thread(
            target=self._run, name="clustersdk-cluster-dashboard", daemon=True
        )
        self._thread.start()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        return self.widget._repr_mimebundle_(**kwargs)

    def update(self) -> None:
        """Read the cluster now and redraw (the thread calls this every ``refresh`` s)."""
        cluster = self._cluster()
        if cluster is None:
            self._stop.set()
            return
        model = snapshot(cluster, self._seen)
        if model != self.model:
            self.model = model
            self.body.value = cluster_html(model)
        if model["closed"]:
            self._stop.set()

    def close(self) -> None:
        """Stop refreshing and close the widgets (the cluster goes on)."""
        self._stop.set()
        close_tree(self.widget)

    def _run(self) -> None:
        while not self._stop.wait(self.refresh):
            try:
                self.update()
            except Exception:  # a scheduler that went away: try again, unless closed
                logger.debug("clustersdk: cluster dashboard refresh failed", exc_info=True)
                cluster = self._cluster()
                if cluster is None or cluster.closed:
                    self._stop.set()


def _address(cluster: Cluster) -> str:
    try:
        return cluster.scheduler_address
    except Exception:  # a closed client has no scheduler
        return "?"
