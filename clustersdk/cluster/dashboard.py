"""Where a cluster's Dask dashboard is: ``cluster.dashboard_link``, and the lab panel's link.

A Dask scheduler always runs an HTTP server (its ``dashboard`` service in
``scheduler_info()["services"]``), but it serves the Bokeh dashboard only when asked
and when bokeh is installed; otherwise (as on ``Cluster.local(dashboard=False)``) the
server has health checks alone. So, unlike Dask's ``Cluster.dashboard_link``, a link
is given only where the server answers ``/`` as Dask's dashboard does: with a redirect
to its ``status`` page. Each scheduler's server is asked once.

>>> finder = DashboardFinder()                                         # doctest: +SKIP
>>> await finder.link("tls://127.0.0.1:40001", client.scheduler_info())  # doctest: +SKIP
'http://127.0.0.1:40503/status'
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

PROBE_TIMEOUT = 2.0  # seconds: a dashboard that does not answer by then is not linked
ASK_AGAIN = 60.0  # seconds before a server that did not answer is asked again


def address(scheduler_address: str, port: int) -> tuple[str, str]:
    """The dashboard's URL as the user sees it (Dask's ``distributed.dashboard.link``
    template, e.g. a Jupyter proxy's path) and the server's own root URL, to ask it."""
    from distributed.comm import get_address_host
    from distributed.utils import format_dashboard_link

    host = get_address_host(scheduler_address)
    if ":" in host:  # IPv6: brackets in a URL
        host = f"[{host}]"
    return format_dashboard_link(host, port), f"http://{host}:{port}/"


class DashboardFinder:
    """Finds the dashboard of schedulers: each scheduler's HTTP server is asked once
    (one that did not answer, by a timeout or a refusal, again after ``ask_again`` s)."""

    def __init__(self, timeout: float = PROBE_TIMEOUT, ask_again: float = ASK_AGAIN):
        self.timeout = timeout
        self.ask_again = ask_again
        self._found: dict[tuple[str, int], str | None] = {}
        self._silent: dict[tuple[str, int], float] = {}  # when it last did not answer

    async def link(self, scheduler_address: str, info: Mapping[str, Any]) -> str | None:
        """The dashboard's URL of the scheduler at ``scheduler_address`` whose Dask
        ``identity`` (``scheduler_info()``) is ``info``; None where it serves none."""
        port = (info.get("services") or {}).get("dashboard")
        if not port:
            return None
        key = (scheduler_address, int(port))
        if key in self._found:
            return self._found[key]
        if time.monotonic() - self._silent.get(key, -math.inf) < self.ask_again:
            return None
        url, root = address(scheduler_address, int(port))
        served = await self._serves(root)
        if served is None:
            self._silent[key] = time.monotonic()
            return None
        self._found[key] = url if served else None
        return self._found[key]

    async def _serves(self, root: str) -> bool | None:
        """Whether ``root`` redirects to Dask's dashboard (None: no answer)."""
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        try:
            response = await AsyncHTTPClient().fetch(
                root, follow_redirects=False, raise_error=False, request_timeout=self.timeout
            )
        except (OSError, HTTPClientError):
            return None
        code = int(response.code)
        if code == 599:  # tornado's code for no response (timeout, refused)
            return None
        return 300 <= code < 400
