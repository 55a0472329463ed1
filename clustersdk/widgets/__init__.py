"""Notebook displays of jobs and clusters.

``Job._repr_mimebundle_`` and ``Cluster._repr_mimebundle_`` come here, through the
``job_display`` and ``cluster_display`` hooks that :mod:`clustersdk` provides (the
client never imports this package; see :mod:`clustersdk.hooks`). In a
Jupyter kernel with ipywidgets, the bundle holds the live dashboard (one per
``Job``/``Cluster`` handle: re-displaying shows the same widget), plus static
``text/html`` and ``text/plain`` for renderers that can't run widgets
(nbconvert, GitHub). Without ipywidgets, or outside a kernel, only the static
forms are made.

>>> job                               # in JupyterLab: the live dashboard  # doctest: +SKIP
>>> dashboard(job).charts["loss"]     # the same dashboard, from code       # doctest: +SKIP
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from . import render, source

if TYPE_CHECKING:
    from ..cluster.base import Cluster
    from ..job import Job
    from .cluster import ClusterDashboard
    from .job import JobDashboard

__all__ = ["cluster_dashboard", "cluster_mimebundle", "dashboard", "job_mimebundle"]

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

_dashboards: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def widgets_available() -> bool:
    """Whether live widgets can show: ipywidgets and bqplot import, and a kernel runs us."""
    try:
        import bqplot  # noqa: F401
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def dashboard(job: Job) -> JobDashboard:
    """The live dashboard of this ``Job`` handle (made on first use, then reused)."""
    from .job import JobDashboard

    with _lock:
        existing = _dashboards.get(job)
        if existing is None:
            existing = _dashboards[job] = JobDashboard(job)
        return existing


def cluster_dashboard(cluster: Cluster) -> ClusterDashboard:
    """The live dashboard of this ``Cluster`` handle (made on first use, then reused)."""
    from .cluster import ClusterDashboard

    with _lock:
        existing = _dashboards.get(cluster)
        if existing is None:
            existing = _dashboards[cluster] = ClusterDashboard(cluster)
        return existing


def job_mimebundle(job: Job, include: Any = None, exclude: Any = None) -> dict[str, Any]:
    """The display of a job: live dashboard where possible, always HTML and text."""
    if widgets_available():
        dash = dashboard(job)
        dash.flush()  # the static forms show what is known now, not what the pump has yet to apply
        bundle = dash._repr_mimebundle_(include=include, exclude=exclude)
        bundle.update({"text/html": dash.html(), "text/plain": dash.text(repr(job))})
    else:
        view = source.job_view(job)
        bundle = {
            "text/html": render.job_html(view),
            "text/plain": render.job_text(view, repr(job)),
        }
    return _filter(bundle, include, exclude)


def cluster_mimebundle(
    cluster: Cluster, include: Any = None, exclude: Any = None
) -> dict[str, Any]:
    """The display of a cluster: live dashboard where possible, always HTML and text."""
    from .cluster import snapshot

    if widgets_available() and not cluster.closed:
        dash = cluster_dashboard(cluster)
        bundle = dash._repr_mimebundle_(include=include, exclude=exclude)
        model = dash.model
    else:
        bundle, model = {}, snapshot(cluster)
    bundle.update(
        {"text/html": render.cluster_html(model), "text/plain": render.cluster_text(model)}
    )
    return _filter(bundle, include, exclude)


def _filter(bundle: dict[str, Any], include: Any, exclude: Any) -> dict[str, Any]:
    if include:
        bundle = {k: v for k, v in bundle.items() if k in include}
    if exclude:
        bundle = {k: v for k, v in bundle.items() if k not in exclude}
    return bundle
