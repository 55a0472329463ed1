"""Cluster.ssh against real sshds that refuse, stall or die: a clear error within its
timeout that names the host, and no process left behind (checked by pid)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

import clustersdk as cs
from clustersdk.cluster import sshconn

from ..helpers import wait_for
from . import netbed
from .helpers import addresses, cmdline, gone, need_bed, ssh_options, started_on

pytestmark = pytest.mark.timeout(180)


def targets(bed, hosts=None):
    return [sshconn.Target(h.address) for h in (hosts or bed.hosts)]


def options(bed, **more) -> sshconn.Options:
    o = ssh_options(bed, **more)
    o.pop("python")
    return sshconn.Options(**o)


def nothing_left(bed) -> None:
    for host in bed.hosts:
        wait_for(lambda host=host: not started_on(bed, host), timeout=30)


# host keys --------------------------------------------------------------------------------
def test_an_unknown_host_key_is_refused_naming_the_host_and_how_to_add_it(bed, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = bed.hosts[0]
    with pytest.raises(cs.HostKeyError) as info:
        cs.Cluster.ssh([host.address], **ssh_options(bed, known_hosts=str(empty)))
    message = str(info.value)
    assert info.value.host == host.address and f"host {host.address}:" in message
    assert f"ssh-keyscan -p 22 {host.address} >> {empty}" in message
    key = os.path.join(host.dir, "ssh_host_ed25519_key.pub")
    expected = subprocess.run(["ssh-keygen", "-lf", key], capture_output=True, text=True).stdout
    assert expected.split()[1] in message  # the fingerprint the user can compare
    nothing_left(bed)


def test_a_changed_host_key_is_refused_even_with_accept_new_hosts(bed, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    host = bed.hosts[1]
    known.write_text(
        f"{host.address} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n"
    )
    with pytest.raises(cs.HostKeyError, match="CHANGED") as info:
        cs.Cluster.ssh(
            [host.address], **ssh_options(bed, known_hosts=str(known)), accept_new_hosts=True
        )
    assert f"ssh-keygen -R '{host.address}' -f {known}" in str(info.value)
    assert info.value.host == host.address


def test_accept_new_hosts_adds_an_unknown_key_then_it_is_known(bed, tmp_path, caplog):
    known = tmp_path / "known_hosts"
    host = bed.hosts[2]
    connections, _ = sshconn.connect_all(
        targets(bed, [host]), options(bed, known_hosts=str(known), accept_new_hosts=True)
    )
    connections.popitem()[1].close()
    assert "accepted the new host key" in caplog.text
    assert known.read_text().split() == [host.address, *host.host_key.split()]
    connections, _ = sshconn.connect_all(targets(bed, [host]), options(bed, known_hosts=str(known)))
    status, out, _ = connections.popitem()[1].run("echo known", timeout=10)
    assert (status, out) == (0, "known\n")


# logging in -------------------------------------------------------------------------------
def test_a_wrong_user_is_refused_naming_host_and_user(bed):
    host = bed.hosts[0]
    with pytest.raises(
        cs.StartError,
        match=rf"host {host.address}: authentication failed for "
        r"user 'nobody-here'",
    ):
        cs.Cluster.ssh([host.address], user="nobody-here", **ssh_options(bed))


def test_a_wrong_key_is_refused(bed, tmp_path):
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(cs.StartError, match=rf"authentication failed .* the key {key}"):
        cs.Cluster.ssh(addresses(bed)[:1], **ssh_options(bed, key_file=str(key)))


def test_an_unreachable_host_fails_within_the_timeout(bed):
    nobody = f"{bed.net}.99"
    t0 = time.monotonic()
    with pytest.raises(
        cs.StartError,
        match=rf"host {nobody}: (no answer on port 22 within 2 s|"
        r"cannot connect to port 22)",
    ) as info:
        cs.Cluster.ssh([addresses(bed)[0], nobody], **ssh_options(bed, connect_timeout=2))
    assert time.monotonic() - t0 < 30  # 2 s + ARP's give-up: not a hang
    assert info.value.host == nobody
    nothing_left(bed)  # the reachable host's connection was closed, nothing started there


def test_an_sshd_that_never_sends_its_banner(bed):
    silent = socket.socket()
    silent.bind((bed.bridge_address, 0))
    silent.listen()
    accepted = []
    threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True).start()
    port = silent.getsockname()[1]
    try:
        with pytest.raises(
            cs.StartError,
            match=rf"host {bed.bridge_address}:{port}: port {port} "
            r"accepted the connection but sent no SSH banner "
            r"within 2 s",
        ):
            cs.Cluster.ssh([f"{bed.bridge_address}:{port}"], banner_timeout=2, **ssh_options(bed))
        assert accepted  # it really got as far as TCP
    finally:
        silent.close()
        for conn, _ in accepted:
            conn.close()


# the remote side --------------------------------------------------------------------------
def test_a_missing_remote_python_names_every_host(bed):
    with pytest.raises(cs.StartError) as info:
        cs.Cluster.ssh(addresses(bed), **ssh_options(bed, python="/opt/nowhere/bin/python"))
    message = str(info.value)
    assert message.startswith("3 hosts failed")
    for address in addresses(bed):
        assert f"host {address}: /opt/nowhere/bin/python is not there" in message
    nothing_left(bed)


def test_a_remote_python_without_clustersdk(bed):
    host = bed.hosts[0]
    with pytest.raises(
        cs.StartError,
        match=rf"host {host.address}: /usr/bin/python3 has no "
        r"clustersdk",
    ):
        cs.Cluster.ssh([host.address], **ssh_options(bed, python="/usr/bin/python3"))
    nothing_left(bed)


def test_a_host_that_dies_while_starting_stops_everything_already_started(bed):
    victim = bed.hosts[2]
    outcome: dict = {}

    def start() -> None:
        try:
            outcome["cluster"] = cs.Cluster.ssh(
                addresses(bed), start_timeout=60, **ssh_options(bed)
            )
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcome["error"] = e

    thread = threading.Thread(target=start)
    thread.start()
    # once the victim's Nanny has spawned its worker process, every host is starting workers
    # (multiprocessing's child runs spawn_main; the launcher's own command line names
    # Dask's pre-spawn-environ, so plain "spawn" would match the launcher at once)
    spawned = wait_for(
        lambda: [p for p in started_on(bed, victim) if "spawn_main" in cmdline(p)],
        timeout=90,
        interval=0.02,
    )
    others = {h.name: started_on(bed, h) for h in bed.hosts if h is not victim}
    bed.kill_host(victim)
    thread.join(timeout=120)
    try:
        assert not thread.is_alive()
        error = outcome.get("error")
        assert isinstance(error, cs.StartError), outcome
        assert error.host == victim.address and f"host {victim.address}:" in str(error)
        assert others["h1"], "the scheduler and h1's workers had started"
        wait_for(lambda: gone(spawned), timeout=10)  # SIGKILLed: it ends once the kernel is done
        for host in bed.hosts[:2]:  # the scheduler, launchers, nannies and workers: all gone
            wait_for(lambda host=host: not started_on(bed, host), timeout=30)
        assert all(gone(pids) for pids in others.values())
    finally:
        if "cluster" in outcome:
            outcome["cluster"].close()
        bed.start_sshd(victim)  # revive it for the next tests


# many connections, jump hosts, close ----------------------------------------------------
def test_sixteen_hosts_behind_one_sshd_never_trip_max_startups():
    """sshd drops unauthenticated connections beyond MaxStartups: 16 hosts connect in
    handshakes of at most max_concurrent at a time, and every one gets in."""
    need_bed()
    with netbed.Bed(1, sshd_config={1: ["MaxStartups 4"]}, extra_addresses={1: 15}) as wide:
        many = [sshconn.Target(a) for a in wide.addresses(wide.hosts[0])]
        assert len(many) == 16
        connections, _ = sshconn.connect_all(many, options(wide), max_concurrent=4)
        try:
            for target, connection in connections.items():
                status, out, _ = connection.run("echo $SSH_CONNECTION", timeout=10)
                assert status == 0 and out.split()[2] == target.host
        finally:
            for connection in connections.values():
                connection.close()


def test_a_jump_host_carries_the_connections(bed):
    jump = bed.hosts[0]
    connections, via = sshconn.connect_all(
        targets(bed, bed.hosts[1:]), options(bed), jump=sshconn.Target(jump.address)
    )
    try:
        for connection in connections.values():
            status, out, _ = connection.run("echo $SSH_CONNECTION", timeout=10)
            assert out.split()[0] == jump.address  # they came from the jump host, not from here
    finally:
        for connection in connections.values():
            connection.close()
        via.close()


def test_magic_ssh_passes_its_options_and_a_failure_is_one_line(bed, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "clustersdk")
    capsys.readouterr()
    o = ssh_options(bed)
    result = ip.run_cell(
        f"%cluster ssh {bed.hosts[0].address} --user nobody-here --key-file "
        f"{o['key_file']} --known-hosts {o['known_hosts']} --python {o['python']}",
        store_history=False,
    )
    assert not result.success
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1
    assert text.startswith(
        f"UsageError: host {bed.hosts[0].address}: authentication failed for user 'nobody-here'"
    )
