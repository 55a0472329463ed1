"""Shared fixtures: one warm local cluster per test module, cleaned up always.

Where tests live (they mirror the code):

- ``tests/runtime/``: the runtime's modules (what runs in the ranks: data, epochs,
  metrics, capture, checkpoints, strategies, training features), in one process or on
  a local cluster when what they check is decided on the ranks;
- ``tests/control/``: the control plane's rules, without a cluster;
- ``tests/extension/``: the server extension; ``tests/browser/``, ``tests/multihost/``:
  what needs a browser or several hosts;
- ``tests/`` itself: the job's life as a user drives it through every tier (launch,
  pause and resume, restarts, hangs, holds, breakpoints, ``job.run``, profiles,
  sharing, diagnoses, dashboards, magics, the CLI) and the SDK's own modules (spec,
  status, errors, layout, network, models).

Helpers shared by test modules live in plain helper modules (``helpers.py``, the
``workloads*.py`` the ranks run, ``control/helpers.py``) or in fixtures here; a test
module never imports another test module (``tests/test_imports.py`` checks it).
"""

from __future__ import annotations

import logging

import cloudpickle
import dask.config
import pytest

import clustersdk as cs

from . import workloads, workloads_parallel
from .helpers import wait_for, wait_idle

# The workers import the workload functions by value: tests/ is not on their path.
cloudpickle.register_pickle_by_value(workloads)
cloudpickle.register_pickle_by_value(workloads_parallel)

# Dask's INFO lines drown the test output; warnings still show.
dask.config.set({"distributed.logging.distributed": "warning"})
logging.getLogger("distributed").setLevel(logging.WARNING)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two CPU slots, shared by the tests of one module."""
    state = tmp_path_factory.mktemp("state")
    c = cs.Cluster.local(workers=2, state_dir=str(state))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def idle(cluster):
    """The module's cluster, checked to have every slot free before and after the test."""
    wait_idle(cluster)
    yield cluster
    for job in cluster.jobs():  # a failed test may leave a job behind: stop it
        if not job.status.terminal:
            job.stop(wait=False)
    wait_idle(cluster)


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory):
    """Four CPU slots, for the model-parallel modules (their 2-rank jobs run on it too)."""
    state = tmp_path_factory.mktemp("state4")
    c = cs.Cluster.local(workers=4, state_dir=str(state))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def idle4(cluster4):
    """The four-slot cluster, every slot free before and after the test."""
    wait_idle(cluster4)
    yield cluster4
    for job in cluster4.jobs():
        if not job.status.terminal:
            job.stop(wait=False)
    wait_idle(cluster4)


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory):
    """Two CPU slots of the module's own, for modules whose tests restart workers."""
    c = cs.Cluster.local(workers=2, state_dir=str(tmp_path_factory.mktemp("own")))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def healed(own_cluster):
    """``own_cluster`` with both slots there (a test restarted a worker) and free, before
    and after the test."""

    def ready() -> bool:
        slots = own_cluster.slots()
        return len(slots) == 2 and not any(s["job"] for s in slots)

    wait_for(ready, timeout=120)
    yield own_cluster
    for job in own_cluster.jobs():
        if not job.status.terminal:
            job.stop(wait=False)
    wait_for(ready, timeout=120)


def pytest_runtest_setup(item):
    """Start every test in the repository root: a test that left the process in a
    deleted temporary directory would break every Nanny spawned afterwards."""
    import os

    os.chdir(item.config.rootpath)
