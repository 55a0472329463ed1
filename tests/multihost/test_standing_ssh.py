"""A standing cluster over SSH on three hosts of the namespace bed: ``clustersdk cluster up
--ssh`` from this machine (a fourth), the command exits, a job from another process runs
on every host, and ``down`` leaves nothing on any of them."""

from __future__ import annotations

import functools
import json
import os

import pytest

import clustersdk as cs

from .. import helpers as common
from .. import workloads
from ..helpers import wait_for
from . import jobs
from .helpers import addresses, gone, python, started_on

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


cli = functools.partial(common.cli, timeout=240)  # a command on several hosts


def test_up_over_ssh_runs_a_job_on_three_hosts_and_down_leaves_nothing(bed, tmp_path):
    state, remote = str(tmp_path / "here"), str(tmp_path / "hosts")
    up = cli(
        state,
        "cluster",
        "up",
        "lab",
        "--ssh",
        *addresses(bed),
        "--slots-per-host",
        "1",
        "--key-file",
        bed.key_file,
        "--known-hosts",
        bed.known_hosts,
        "--python",
        python(bed),
        "--remote-dir",
        remote,
        "--connect-timeout",
        "5",
        "--json",
    )
    try:
        assert up.returncode == 0, up.stderr
        record = json.loads(up.stdout)
        first = bed.hosts[0].address
        assert record["address"].startswith(f"tls://{first}:") and record["scheduler_host"] == first
        # the command is gone; each host runs what it was given, in sessions of its own
        for host in bed.hosts:
            assert started_on(bed, host), host.name
        with cs.Cluster.connect("lab", state_dir=state, timeout=30) as cluster:
            assert {s["host"] for s in cluster.slots()} == set(addresses(bed))
            job = cluster.launch(jobs.report_env, world_size=3)
            assert job.wait(timeout=120)["sum"] == 3.0  # every rank reached every other
            assert sorted(r["host"] for r in job.info()["ranks"]) == sorted(addresses(bed))
            assert (
                cluster.launch(workloads.count_to, kwargs={"steps": 3}, world_size=3).wait(
                    timeout=120
                )
                == "done"
            )
        status = cli(state, "cluster", "status", "lab", "--json")
        assert status.returncode == 0, status.stderr
        hosts = json.loads(status.stdout)["hosts"]
        assert set(hosts) == set(addresses(bed)) and all(h["supervisor"] for h in hosts.values())
    finally:
        pids = {h.name: started_on(bed, h) for h in bed.hosts}
        down = cli(state, "cluster", "down", "lab", "--now")
    assert down.returncode == 0, down.stderr
    for host in bed.hosts:
        wait_for(lambda host=host: gone(pids[host.name]), timeout=30)
        assert not started_on(bed, host), host.name
    assert not os.listdir(os.path.join(remote, "standing", "lab", "hosts"))
    assert not os.path.exists(os.path.join(state, "standing", "lab"))
