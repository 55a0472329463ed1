"""Network settings of a rank, without a cluster: port ranges, the job's env, interfaces."""

from __future__ import annotations

import pytest

import clustersdk as cs
from clustersdk import network
from clustersdk.cluster.sshconn import Target
from clustersdk.runtime import process_group
from clustersdk.runtime.environ import rank_environ
from clustersdk.spec import JobSpec


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("29400-29499", (29400, 29499)),
        ((29400, 29410), (29400, 29410)),
        ([1, 1], (1, 1)),
        (29500, (29500, 29500)),
        ("29500", (29500, 29500)),
        (None, None),
        ("", None),
    ],
)
def test_port_ranges(value, expected):
    assert network.parse_ports(value) == expected


@pytest.mark.parametrize("bad", ["29499-29400", "0-10", "1-70000", "a-b", [1, 2, 3], True])
def test_bad_port_ranges_name_the_value(bad):
    with pytest.raises(cs.SpecError, match=r"a port range must look like '29400-29499'.*got"):
        network.parse_ports(bad)


def test_the_job_env_is_checked_at_launch():
    spec = JobSpec(fn=print, world_size=1, env={"NCCL_BUFFSIZE": 4194304, "NCCL_DEBUG": "INFO"})
    assert spec.env == {"NCCL_BUFFSIZE": "4194304", "NCCL_DEBUG": "INFO"}
    assert spec.to_wire().env == spec.env
    with pytest.raises(cs.SpecError, match="MASTER_ADDR is set by clustersdk.*interface="):
        JobSpec(fn=print, world_size=1, env={"MASTER_ADDR": "10.0.0.1"})
    with pytest.raises(cs.SpecError, match=r"env: '1BAD' is not an environment variable name"):
        JobSpec(fn=print, world_size=1, env={"1BAD": "x"})
    with pytest.raises(cs.SpecError, match=r"env: NCCL_IB_DISABLE=True must be a string"):
        JobSpec(fn=print, world_size=1, env={"NCCL_IB_DISABLE": True})


def environ(rank: int, master: str, env: dict | None = None, worker: dict | None = None) -> dict:
    """What rank ``rank`` of a 2-rank job on one host runs with, rank 0 at ``master``."""
    spec = JobSpec(fn=print, world_size=2, env=env or {}).to_wire()
    return rank_environ(rank, ["h", "h"], master, 1234, spec, None, "/e", worker or {})


def test_a_ranks_environment_is_its_workers_with_its_jobs_on_top():
    worker = {"X_TEST_KEEP": "worker's own", "PATH": "/bin"}
    env = environ(0, "127.0.0.1", {"NCCL_DEBUG": "INFO", "X_TEST_KEEP": "job"}, worker)
    assert (env["NCCL_DEBUG"], env["X_TEST_KEEP"], env["PATH"]) == ("INFO", "job", "/bin")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["RANK"]) == ("127.0.0.1", "1234", "0")
    # each rank is a process of its own: the next job's environment starts from the worker's
    assert "NCCL_DEBUG" not in environ(0, "127.0.0.1", worker=worker)
    assert worker == {"X_TEST_KEEP": "worker's own", "PATH": "/bin"}


def test_loopback_jobs_bind_gloo_and_nccl_to_the_loopback_interface():
    # not to whatever the host name resolves to: nobody else may reach an unauthenticated port
    loopback = network.interface_of("127.0.0.1")
    env = environ(1, "127.0.0.1")
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == loopback


def test_a_remote_master_picks_the_interface_that_routes_to_it():
    address = network.local_address_towards("192.0.2.123") or pytest.skip("no default route")
    interface = network.interface_of(address)
    env = environ(1, "192.0.2.123", {"NCCL_SOCKET_IFNAME": "=ib0"})
    assert env["GLOO_SOCKET_IFNAME"] == interface
    assert env["NCCL_SOCKET_IFNAME"] == "=ib0"  # what the job says wins


def test_the_store_opens_inside_the_rendezvous_range():
    import dask.config

    with dask.config.set({"clustersdk.rendezvous-ports": "29650-29659"}):
        first = process_group.open_store(1, 5)
        try:
            assert 29650 <= first.port <= 29659
            others = [process_group.open_store(1, 5) for _ in range(9)]  # the rest of the range
            assert sorted([first.port] + [s.port for s in others]) == list(range(29650, 29660))
            with pytest.raises(
                RuntimeError, match="every port of the rendezvous range 29650-29659 is in use"
            ):
                process_group.open_store(1, 5)
        finally:
            del first
            others = None  # noqa: F841 - the stores close when dropped


def test_the_store_listens_on_the_workers_address_only():
    import subprocess

    store = process_group.open_store(1, 5, host="127.0.0.1")
    try:
        listening = subprocess.run(
            ["ss", "-ltnH", f"sport = :{store.port}"], capture_output=True, text=True, check=True
        ).stdout.split()
        assert f"127.0.0.1:{store.port}" in listening  # not 0.0.0.0 or [::]
        assert not [
            a for a in listening if a.endswith(f":{store.port}") and not a.startswith("127.0.0.1")
        ]
    finally:
        del store


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("node1", Target("node1", 22, None)),
        ("alice@node1:2222", Target("node1", 2222, "alice")),
        ("[fe80::1]:2200", Target("fe80::1", 2200, None)),
        ("fe80::1", Target("fe80::1", 22, None)),
    ],
)
def test_ssh_targets(spec, expected):
    assert Target.parse(spec) == expected
    assert Target.parse("n:2222").known_hosts_name == "[n]:2222"


def test_cluster_ssh_checks_its_arguments_before_connecting():
    with pytest.raises(cs.SpecError, match="hosts lists a host twice"):
        cs.Cluster.ssh(["a", "a"])
    with pytest.raises(cs.SpecError, match="hosts must be a non-empty list"):
        cs.Cluster.ssh("node1")
    with pytest.raises(cs.SpecError, match="slots_per_host must be an int of at least 1, got 0"):
        cs.Cluster.ssh(["a"], slots_per_host=0)
    with pytest.raises(cs.SpecError, match="env: MASTER_PORT is set by clustersdk"):
        cs.Cluster.ssh(["a"], env={"MASTER_PORT": "1"})
