"""Fixtures for the server extension: a real cluster running a real job, Jupyter servers.

pytest-jupyter's fixtures (``jp_fetch``, ``jp_serverapp``, ``jp_server_config``...)
are imported here rather than through ``pytest_plugins``: pytest accepts
``pytest_plugins`` only in the rootdir's conftest, and there its autouse
``jp_asyncio_loop`` (a fresh event loop per test, closed afterwards) would
reach every test of the suite. Imported here, it reaches this folder only.
"""

from __future__ import annotations

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F401,F403  (fixtures and hooks)
from traitlets.config import Config

import clustersdk as cs

from .. import workloads
from ..helpers import wait_for


@pytest.fixture(scope="package")
def sdk_state(tmp_path_factory):
    """The state directory of the package's cluster: its journal and its registry entry."""
    return tmp_path_factory.mktemp("sdk-state")


@pytest.fixture(scope="package")
def sdk_cluster(sdk_state):
    """Two CPU slots, shared by the extension's tests; registered in ``sdk_state``."""
    cluster = cs.Cluster.local(workers=2, state_dir=str(sdk_state))
    try:
        yield cluster
    finally:
        for job in cluster.jobs():
            if not job.status.terminal:
                job.stop(wait=False)
        cluster.close()


@pytest.fixture(scope="module")
def spin_job(sdk_cluster):
    """A one-rank job that runs (and logs a step every ~10 ms) until the module is done."""
    job = sdk_cluster.launch(workloads.spin, world_size=1, name="ext-spin")
    wait_for(lambda: job.status is cs.JobStatus.RUNNING and len(job.history()) >= 5)
    yield job
    if not job.status.terminal:
        job.stop(timeout=30)


def idle_cluster(cluster: cs.Cluster, timeout: float = 30.0) -> cs.Cluster:
    """``cluster`` once no slot runs a job."""
    wait_for(lambda: not [s for s in cluster.slots() if s["job"]], timeout)
    return cluster


@pytest.fixture
def free_slot(sdk_cluster, spin_job):
    """The cluster's second slot, free before the test and freed again after it."""

    def idle():
        return not [s for s in sdk_cluster.slots() if s["job"] and s["job"] != spin_job.id]

    wait_for(idle)
    yield sdk_cluster
    for job in sdk_cluster.jobs():
        if job.id != spin_job.id and not job.status.terminal:
            job.stop(wait=False)
    wait_for(idle)


def extension_config(*state_dirs, addresses: tuple[str, ...] = (), **server: object) -> Config:
    """Server config that enables the extension and points it at ``state_dirs``/``addresses``."""
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {
                    "jupyter_clustersdk": True,
                    "jupyter_server_terminals": False,
                },
                **server,
            },
            "ClusterSDKApp": {
                "state_dirs": [str(d) for d in state_dirs],
                "scheduler_addresses": list(addresses),
                "connect_timeout": 1.0,
            },
        }
    )


@pytest.fixture
def jp_server_config(tmp_path):
    """No cluster by default (an empty state dir); modules with a cluster override this."""
    return extension_config(tmp_path / "no-clusters")


@pytest.fixture
def jp_serverapp(jp_server_config, jp_argv, jp_configurable_serverapp, jp_asyncio_loop):
    """pytest-jupyter's server, whose extensions are stopped (scheduler clients closed) after."""
    app = jp_configurable_serverapp(config=jp_server_config, argv=jp_argv)
    yield app
    jp_asyncio_loop.run_until_complete(app.extension_manager.stop_all_extensions())
