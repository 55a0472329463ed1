"""Elastic shrink and grow, end to end: a 4-rank job with ``min_world_size`` loses a
worker that does not come back, goes on at 3 ranks from its newest checkpoint with the
same global batch, and grows back to 4 once a worker is added, ending within 1e-6 of
the run nobody interrupted (the sums of 3 ranks are taken in another order: not
bitwise, see test_exactness).

The module has a cluster of its own: it takes a worker away and adds one.
"""

from __future__ import annotations

import pytest
import torch

import clustersdk as cs

from . import workloads
from .helpers import checkpointed_at, wait_for

KW = {"kind": "mlp", "steps": 24, "global_batch": 24, "dropout": 0.0}


@pytest.fixture(scope="module")
def cluster4e(tmp_path_factory):
    c = cs.Cluster.local(workers=4, state_dir=str(tmp_path_factory.mktemp("state")))
    try:
        yield c
    finally:
        c.close()


def take_away(cluster: cs.Cluster, worker: str) -> tuple[str, dict]:
    """Close ``worker``'s nanny for good (a node gone); its name and spec, to add back."""
    dask = cluster.dask_cluster
    name = next(n for n, w in dask.workers.items() if getattr(w, "worker_address", None) == worker)
    spec = dask.worker_spec.pop(name)
    dask.sync(dask._correct_state)
    wait_for(lambda: worker not in [s["worker"] for s in cluster.slots()], timeout=60)
    return name, spec


def add_back(cluster: cs.Cluster, name: str, spec: dict) -> None:
    dask = cluster.dask_cluster
    dask.worker_spec[name] = spec
    dask.sync(dask._correct_state)


def test_a_lost_worker_without_a_spare_shrinks_the_job_which_grows_back(cluster4e, tmp_path):
    want = cluster4e.launch(workloads.train_exact, kwargs=KW, world_size=4).wait(timeout=120)
    job = cluster4e.launch(
        workloads.train_exact,
        kwargs={**KW, "delay": 0.3},
        world_size=4,
        min_world_size=2,
        max_restarts=2,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=4,
        timeout=20,
        name="elastic",
    )
    wait_for(lambda: checkpointed_at(job, 4), timeout=60)
    victim = next(r["worker"] for r in job.info()["ranks"] if r["rank"] == 3)
    name, spec = take_away(cluster4e, victim)
    try:
        wait_for(
            lambda: (lambda i: i["spec"]["world_size"] == 3 and i["status"] == "RUNNING")(
                job.info()
            ),
            timeout=60,
        )
        job.pause()  # while the node comes back (a worker takes seconds to start)
    finally:
        add_back(cluster4e, name, spec)
    wait_for(lambda: len(cluster4e.slots()) == 4, timeout=120)
    job.resume()  # the slots it lacks are free: it grows back at once
    got = job.wait(timeout=180)
    assert job.info()["spec"]["world_size"] == 4 and job.restarts == 1
    kinds = [(e["kind"], e.get("world_size")) for e in job.events() if e["kind"] != "request"]
    assert kinds == [("restarted", None), ("resized", 3), ("resized", 4)], job.events()
    assert got["step"] == want["step"] == KW["steps"]
    for key, value in want["state"]["model"].items():
        torch.testing.assert_close(got["state"]["model"][key], value, rtol=0, atol=1e-6, msg=key)
    steps = sorted({r["step"] for r in job.history()})
    assert steps == list(range(KW["steps"]))  # every step once, across both changes
