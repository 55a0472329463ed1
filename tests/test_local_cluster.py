"""``Cluster.local`` as a Dask user types it: Dask's dashboard on by default (its link,
on local and connected handles; ``dashboard=False``; no bokeh), ``n_workers=``, and the
real keywords of every way to make a cluster in ``help()``."""

from __future__ import annotations

import asyncio
import inspect
import socket
import sys
import urllib.error
import urllib.request

import pytest

import clustersdk as cs
from clustersdk.cluster.dashboard import DashboardFinder, address


def fetch(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode(errors="replace")


def test_a_default_local_cluster_serves_dasks_dashboard_at_its_link(cluster):
    link = cluster.dashboard_link
    assert link is not None and link.startswith("http://127.0.0.1:") and link.endswith("/status")
    status, page = fetch(link)
    assert status == 200 and "Dask" in page and "bokeh" in page.lower()


def test_a_connected_handle_finds_the_same_dashboard(cluster):
    with cs.Cluster.connect(cluster.scheduler_address, state_dir=cluster.state_dir) as other:
        assert other.dashboard_link == cluster.dashboard_link


def test_n_workers_as_dask_spells_it_and_dashboard_false_serves_none(tmp_path):
    with cs.Cluster.local(n_workers=1, dashboard=False, state_dir=str(tmp_path)) as cluster:
        assert len(cluster.slots()) == 1
        assert cluster.dashboard_link is None
        # the scheduler's HTTP server is there (health checks), but no dashboard on it
        port = cluster.client.scheduler_info(n_workers=0)["services"]["dashboard"]
        with pytest.raises(urllib.error.HTTPError, match="404"):
            fetch(f"http://127.0.0.1:{port}/status")
    assert cluster.dashboard_link is None  # closed: nothing to link to


def test_workers_and_n_workers_together_are_refused():
    with pytest.raises(cs.SpecError, match=r"workers=2 and n_workers=3"):
        cs.Cluster.local(workers=2, n_workers=3)


def test_without_bokeh_a_local_cluster_starts_without_a_dashboard_and_says_so(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "distributed.dashboard.scheduler", None)  # import fails
    with pytest.warns(UserWarning, match=r"no Dask dashboard.*clustersdk\[dashboard\]") as caught:
        cluster = cs.Cluster.local(workers=1, state_dir=str(tmp_path))
    with cluster:
        assert len([w for w in caught if "dashboard" in str(w.message)]) == 1
        assert cluster.dashboard_link is None
        assert len(cluster.slots()) == 1


@pytest.mark.parametrize("way", ["local", "ssh", "slurm", "connect"])
def test_help_shows_the_real_keywords_of_each_way_to_make_a_cluster(way):
    method = getattr(cs.Cluster, way)
    parameters = inspect.signature(method).parameters
    implementation = getattr(sys.modules[f"clustersdk.cluster.{way}"], way)
    assert list(parameters) == list(inspect.signature(implementation).parameters)[1:]  # no cls
    assert "state_dir" in parameters and method.__doc__ == implementation.__doc__
    # only Slurm forwards more, to dask-jobqueue's SLURMCluster (its docstring says so)
    forwarded = [p.name for p in parameters.values() if p.kind is p.VAR_KEYWORD]
    assert forwarded == (["jobqueue_options"] if way == "slurm" else [])
    if way == "local":
        assert {"n_workers", "dashboard", "memory_limit", "security"} <= set(parameters)


def test_no_link_where_no_dashboard_answers_and_ipv6_hosts_are_bracketed():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    finder = DashboardFinder(timeout=2)
    assert asyncio.run(finder.link("tls://127.0.0.1:8786", {"services": {}})) is None
    info = {"services": {"dashboard": port}}
    assert asyncio.run(finder.link("tls://127.0.0.1:8786", info)) is None
    assert address("tcp://[::1]:8786", 8787) == ("http://[::1]:8787/status", "http://[::1]:8787/")
