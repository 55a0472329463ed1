"""The doctor on a sick bed of three hosts: each fault is found and named by host.

- h2 drops TCP to port 29505 of the rendezvous range (nftables in its namespace);
- h3 has another cloudpickle first on its path (its sshd sets PYTHONPATH: a copy of
  the installed package whose version says 3.0.0, as a host with a stray older
  install would have; nothing else about it differs), and its eth0 is throttled
  to 200 Mbit/s (tc tbf): a slow NIC.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import cloudpickle
import pytest

import clustersdk as cs

from ..helpers import wait_for
from . import netbed
from .helpers import cmdline, gone, need_bed, ssh_options, started_on

pytestmark = pytest.mark.timeout(240)

OLD = "3.0.0"
BLOCKED = 29505


def stray_cloudpickle(root) -> str:
    """A copy of cloudpickle whose version is OLD, in a directory for PYTHONPATH."""
    source = os.path.dirname(cloudpickle.__file__)
    target = root / "cloudpickle"
    shutil.copytree(source, target)
    init = target / "__init__.py"
    text = init.read_text()
    assert f'__version__ = "{cloudpickle.__version__}"' in text
    init.write_text(
        text.replace(f'__version__ = "{cloudpickle.__version__}"', f'__version__ = "{OLD}"')
    )
    return str(root)


@pytest.fixture(scope="module")
def sick(tmp_path_factory):
    need_bed()
    overlay = stray_cloudpickle(tmp_path_factory.mktemp("overlay"))
    with netbed.Bed(3, sshd_config={3: [f"SetEnv PYTHONPATH={overlay}"]}) as bed:
        h1, h2, h3 = bed.hosts
        bed.block_port(h2, BLOCKED)
        bed.throttle(h3, "200mbit")
        # the scheduler in this process (the notebook's machine: the bridge's address)
        cluster = cs.Cluster.ssh(
            [h.address for h in bed.hosts],
            slots_per_host=1,
            scheduler_host="local",
            interface="eth0",
            rendezvous_ports="29500-29509",
            start_timeout=180,
            state_dir=str(tmp_path_factory.mktemp("doctor-state")),
            **ssh_options(bed),
        )
        try:
            yield bed, cluster
        finally:
            cluster.close()


def test_the_doctor_names_the_blocked_port_the_stray_version_and_the_slow_host(sick, tmp_path):
    bed, cluster = sick
    h1, h2, h3 = (h.address for h in bed.hosts)
    assert cluster.scheduler_address.startswith(f"tls://{bed.bridge_address}:")
    assert [s["host"] for s in cluster.slots()] == [h1, h2, h3]  # listening on eth0
    report = cluster.doctor(checkpoint_dir=str(tmp_path / "ckpt"), max_size=1 << 20)
    found = {(p.host, p.check) for p in report.problems}
    assert found == {(h2, "ports"), (h3, "versions"), (h3, "bandwidth")}, report
    by_check = {p.check: p.message for p in report.problems}
    assert by_check["ports"].startswith(
        f"host {h2}: port {BLOCKED} of the rendezvous range "
        f"(29500-29509) unreachable from {h1}, {h3} (timed out)"
    )
    assert by_check["versions"].startswith(
        f"host {h3}: cloudpickle {OLD}, but {cloudpickle.__version__} on the other hosts: "
        f"install cloudpickle=={cloudpickle.__version__} there"
    )
    assert by_check["bandwidth"].startswith(f"host {h3}: its links reach ")
    # the measurements behind it: three pairs, each swept from 1 KiB to 1 MiB
    assert sorted(s.hosts for s in report.sweeps) == [(h1, h2), (h1, h3), (h2, h3)]
    fast = next(s for s in report.sweeps if s.hosts == (h1, h2))
    assert [size for size, _ in fast.rows] == [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20]
    assert all(s.peak() < 0.5 * fast.peak() for s in report.sweeps if h3 in s.hosts)
    # the checkpoint directory is one filesystem for all: no problem, and no marker left
    assert set(report.disks) == {h1, h2, h3} and not os.listdir(tmp_path / "ckpt")
    text = str(report)
    assert "all-reduce bus bandwidth (gloo" in text and "problems (3):" in text


def test_clustersdk_doctor_address_prints_the_problems_and_fails(sick):
    bed, cluster = sick
    h2 = bed.hosts[1].address
    proc = subprocess.run(
        [sys.executable, "-m", "clustersdk", "doctor", cluster.scheduler_address, "--no-bandwidth"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "DASK_CLUSTERSDK__CREDENTIALS": cluster.credentials},
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"host {h2}: port {BLOCKED} of the rendezvous range" in proc.stdout
    assert "bus bandwidth" not in proc.stdout


def test_magic_cluster_doctor_shows_the_report(sick, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    bed, cluster = sick
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "clustersdk")
    ip.user_ns["cluster"] = cluster
    try:
        report = ip.run_line_magic("cluster", "doctor --no-bandwidth")
    finally:
        ip.user_ns.pop("cluster")
    assert report.hosts == [h.address for h in bed.hosts]
    assert (bed.hosts[1].address, "ports") in {(p.host, p.check) for p in report.problems}
    assert report.sweeps == []


def test_close_stops_every_process_it_started_and_nothing_else(sick):
    """Last in the module: it closes the module's cluster."""
    bed, cluster = sick
    host = bed.hosts[1]
    bystander = subprocess.Popen(["ip", "netns", "exec", host.netns, "sleep", "600"])
    try:
        sshd = {h.name: [p for p in bed.pids(h) if "sshd" in cmdline(p)] for h in bed.hosts}
        ours = {h.name: [p for p in started_on(bed, h) if p != bystander.pid] for h in bed.hosts}
        started = cluster.dask_cluster.pids()
        assert set(started) == {h.address for h in bed.hosts} and all(ours.values())
        for h in bed.hosts:  # the launchers it reports are among the host's processes
            assert set(started[h.address]) <= set(ours[h.name])
        cluster.close()
        for h in bed.hosts:  # scheduler, launchers, nannies, workers: gone, by pid
            wait_for(lambda h=h: gone(ours[h.name]), timeout=30)
            assert not gone(sshd[h.name])
        assert bystander.poll() is None  # not ours: left alone
    finally:
        bystander.kill()
        bystander.wait()
