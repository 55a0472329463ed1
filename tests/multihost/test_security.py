"""Mutual TLS across hosts of the namespace bed (real sshd, real network namespaces):
``Cluster.ssh`` ships each host its key over SFTP (0600, removed at close), a stranger
on the network gets nothing from any port, and bob may not touch alice's job."""

from __future__ import annotations

import json
import os
import stat
import sys

import dask.config
import pytest

import clustersdk as cs
import clustersdk.config  # noqa: F401 - its defaults loaded before dask.config.set below
from clustersdk.security.pki import Authority

from .. import workloads
from ..helpers import wait_for
from .helpers import addresses, ssh_options

pytestmark = pytest.mark.timeout(300)

PROBE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "security_probe.py")


@pytest.fixture(scope="module")
def cluster(bed, tmp_path_factory):
    """alice's cluster on the first two hosts (one CPU slot each); the third is a stranger."""
    with dask.config.set({"clustersdk.security.user": "alice"}):
        c = cs.Cluster.ssh(
            addresses(bed)[:2],
            slots_per_host=1,
            state_dir=str(tmp_path_factory.mktemp("tls-state")),
            **ssh_options(bed),
        )
    try:
        yield c
    finally:
        c.close()


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_every_host_gets_only_its_own_key_privately(cluster):
    assert cluster.scheduler_address.startswith("tls://")
    dirs = cluster.dask_cluster.key_dirs
    assert len(dirs) == 2
    first, second = (dirs[t] for t in cluster.dask_cluster.plan.targets)
    # the scheduler's host also holds the scheduler's key; nobody's credentials, no CA key
    assert sorted(os.listdir(first)) == ["ca.pem", "crl.pem", "scheduler.pem", "worker.pem"]
    assert sorted(os.listdir(second)) == ["ca.pem", "crl.pem", "worker.pem"]
    assert mode(first) == mode(second) == 0o700
    assert {mode(os.path.join(d, f)) for d in (first, second) for f in os.listdir(d)} == {0o600}
    # and ranks on two hosts train over it
    out = cluster.launch(workloads.train_mlp, kwargs={"steps": 5}, world_size=2).wait(timeout=120)
    assert out["params"]
    assert all(s["worker"].startswith("tls://") for s in cluster.slots())


def test_a_stranger_on_the_network_gets_nothing(bed, cluster, tmp_path):
    info = cluster.client.scheduler_info(n_workers=-1)["workers"]
    targets = (
        [f"scheduler={cluster.scheduler_address}"]
        + [f"worker={w}" for w in info]
        + [f"nanny={w['nanny']}" for w in info.values()]
    )
    other = Authority.create(str(tmp_path / "other-ca"), admin="mallory")
    marker = tmp_path / "stranger-was-here"
    stranger = bed.hosts[2]  # in no cluster, with no credentials of this one
    out = bed.run(
        stranger,
        sys.executable,
        PROBE,
        "--marker",
        str(marker),
        "--other-credentials",
        other.credentials_file("mallory"),
        *targets,
    )
    answers = json.loads(out.stdout)
    assert len(answers) == 3 * 5
    assert all(a.startswith("refused") for a in answers.values()), answers
    assert not marker.exists()


def test_bob_sees_alices_job_across_the_network_and_may_not_stop_it(cluster, tmp_path):
    path = cluster.add_user("bob", path=str(tmp_path / "bob.pem"))
    job = cluster.launch(workloads.spin, world_size=1, name="alice-far")
    bob = cs.Cluster.connect(
        cluster.scheduler_address, credentials=path, state_dir=str(tmp_path / "bob")
    )
    try:
        wait_for(lambda: job.status is cs.JobStatus.RUNNING, timeout=60)
        with pytest.raises(
            cs.AccessDeniedError, match="'bob' may not stop job 'alice-far'.*belongs to 'alice'"
        ):
            bob.job("alice-far").stop()
        assert job.status is cs.JobStatus.RUNNING
    finally:
        bob.close()
        job.stop()


def test_close_removes_every_hosts_keys(cluster):
    dirs = list(cluster.dask_cluster.key_dirs.values())
    authority = cluster.dask_cluster.prepared.authority.directory
    assert all(os.path.isdir(d) for d in dirs) and os.path.isdir(authority)
    cluster.close()
    assert not [d for d in dirs if os.path.exists(d)] and not os.path.exists(authority)
