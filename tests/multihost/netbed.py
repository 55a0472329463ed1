"""A multi-host test bed on one machine: network namespaces, a bridge, a real sshd per host.

Run by hand (as root) to get hosts to try ``Cluster.ssh`` on::

    sudo .venv/bin/python tests/multihost/netbed.py --hosts 3     # Ctrl-C tears it down

Each host ``hN`` is a network namespace with

- ``eth0``: a veth pair to the bridge, ``10.X.Y.(10+N)/24``; the bridge holds
  ``10.X.Y.1``, so this machine (the "notebook") reaches every host;
- ``eth1``: ``198.51.100.(10+N)/24`` on a veth pair whose two ends both stay in the
  namespace: an interface that connects to nothing. This machine's host name
  resolves to it inside the namespace (``/etc/netns/<ns>/hosts``), as on a
  multi-homed host whose name points at another network: gloo's default choice
  of address is then one no other host can reach;
- its own OpenSSH server on ``eth0:22`` (Debian's ``sshd``, a host key made for
  the bed), which lets in the bed's client key as root.

Every process of a host (sshd and whatever it starts) lives in its namespace.
:meth:`Bed.down` kills them all by pid, then removes the namespaces, the
bridge and the files, and is safe to call after a partial :meth:`Bed.up`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SSHD = "/usr/sbin/sshd"
SIDE_NET = "198.51.100"  # TEST-NET-2: routed nowhere


def missing() -> str | None:
    """Why a bed can't be made here, or None."""
    if os.geteuid() != 0:
        return "the multi-host bed needs root (network namespaces); CI runs as root"
    for tool in ("ip", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 openssh-client)"
    if not os.path.exists(SSHD):
        return "Debian's openssh-server is not installed (apt-get install openssh-server)"
    return None


@dataclasses.dataclass
class Host:
    index: int
    netns: str
    address: str  # eth0: reachable from every host and from this machine
    side_address: str  # eth1: reachable from nowhere
    dir: str
    host_key: str = ""  # "ssh-ed25519 AAAA..."
    sshd: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return f"h{self.index}"


def sh(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kwargs)


class Bed:
    """``n`` hosts; ``sshd_config[i]`` adds lines to host ``i``'s sshd_config (1-based);
    ``extra_addresses[i]`` gives host ``i`` that many more addresses, each with sshd."""

    def __init__(
        self,
        n: int = 3,
        *,
        sshd_config: dict[int, list[str]] | None = None,
        extra_addresses: dict[int, int] | None = None,
    ):
        self.tag = f"{random.randrange(0x10000):04x}"
        self.net = _free_subnet()
        self.bridge = f"csb{self.tag}"
        self.bridge_address = f"{self.net}.1"
        self.dir = tempfile.mkdtemp(prefix=f"clustersdk-bed-{self.tag}-")
        self.key_file = os.path.join(self.dir, "id_ed25519")
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        self.sshd_config = sshd_config or {}
        self.extra_addresses = extra_addresses or {}
        self.hosts = [
            Host(
                i,
                f"cs-{self.tag}-h{i}",
                f"{self.net}.{10 + i}",
                f"{SIDE_NET}.{10 + i}",
                os.path.join(self.dir, f"h{i}"),
            )
            for i in range(1, n + 1)
        ]

    # set-up --------------------------------------------------------------------------
    def up(self) -> Bed:
        try:
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bed", "-f", self.key_file)
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "up")
            os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
            for host in self.hosts:
                self._make_host(host)
            with open(self.known_hosts, "w") as f:
                for host in self.hosts:
                    for address in self.addresses(host):
                        f.write(f"{address} {host.host_key}\n")
            for host in self.hosts:
                self.start_sshd(host)
        except BaseException:
            self.down()
            raise
        return self

    def addresses(self, host: Host) -> list[str]:
        extra = self.extra_addresses.get(host.index, 0)
        return [host.address] + [f"{self.net}.{100 + 10 * host.index + k}" for k in range(extra)]

    def _make_host(self, host: Host) -> None:
        ns, veth = host.netns, f"csv{self.tag}{host.index}"
        os.makedirs(host.dir)
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", self.bridge, "up")
        for address in self.addresses(host):
            sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1-end")
        sh("ip", "-n", ns, "addr", "add", f"{host.side_address}/24", "dev", "eth1")
        for link in ("lo", "eth0", "eth1", "eth1-end"):
            sh("ip", "-n", ns, "link", "set", link, "up")
        etc = f"/etc/netns/{ns}"
        os.makedirs(etc, exist_ok=True)
        with open(f"{etc}/hosts", "w") as f:
            f.write(f"127.0.0.1 localhost\n{host.side_address} {socket.gethostname()}\n")
        key = os.path.join(host.dir, "ssh_host_ed25519_key")
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", key)
        with open(key + ".pub") as f:
            host.host_key = " ".join(f.read().split()[:2])
        lines = (
            [f"ListenAddress {a}:22" for a in self.addresses(host)]
            + [
                f"HostKey {key}",
                "PidFile none",
                f"AuthorizedKeysFile {self.key_file}.pub",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "LogLevel VERBOSE",
                "Subsystem sftp internal-sftp",  # as Debian's own sshd_config has (Cluster.ssh's keys)
            ]
            + self.sshd_config.get(host.index, [])
        )
        with open(os.path.join(host.dir, "sshd_config"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def start_sshd(self, host: Host) -> None:
        log = open(os.path.join(host.dir, "sshd.log"), "ab")
        host.sshd = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                host.netns,
                SSHD,
                "-D",
                "-e",
                "-f",
                os.path.join(host.dir, "sshd_config"),
            ],
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if host.sshd.poll() is not None:
                raise RuntimeError(f"sshd of {host.name} exited:\n{self.sshd_log(host)}")
            try:
                socket.create_connection((host.address, 22), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd of {host.name} did not listen:\n{self.sshd_log(host)}")

    def sshd_log(self, host: Host) -> str:
        with open(os.path.join(host.dir, "sshd.log"), errors="replace") as f:
            return f.read()

    # faults and inspection -------------------------------------------------------------
    def run(self, host: Host, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """``argv`` inside ``host``'s namespace."""
        return sh("ip", "netns", "exec", host.netns, *argv, check=check)

    def pids(self, host: Host) -> list[int]:
        """Every process of ``host`` (all whose network namespace is its)."""
        out = sh("ip", "netns", "pids", host.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_host(self, host: Host) -> None:
        """SIGKILL every process of the host, sshd too: it died."""
        for pid in self.pids(host):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if host.sshd is not None:
            host.sshd.wait()

    def block_port(self, host: Host, port: int) -> None:
        """Drop TCP to ``port`` at ``host``'s input (nftables, in its namespace only)."""
        table = ["nft", "add", "table", "inet", "csbed"]
        self.run(host, *table)
        self.run(
            host,
            "nft",
            "add",
            "chain",
            "inet",
            "csbed",
            "input",
            "{ type filter hook input priority 0; policy accept; }",
        )
        self.run(
            host, "nft", "add", "rule", "inet", "csbed", "input", "tcp", "dport", str(port), "drop"
        )

    def throttle(self, host: Host, rate: str = "200mbit") -> None:
        """Limit what ``host`` sends on eth0 (tc tbf): a slow NIC or link."""
        self.run(
            host,
            "tc",
            "qdisc",
            "add",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            "256kb",
            "latency",
            "100ms",
        )

    # teardown ------------------------------------------------------------------------
    def down(self) -> None:
        for host in self.hosts:
            self.kill_host(host)
            sh("ip", "netns", "del", host.netns, check=False)
            sh("ip", "link", "del", f"csv{self.tag}{host.index}", check=False)
            shutil.rmtree(f"/etc/netns/{host.netns}", ignore_errors=True)
        sh("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Bed:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def _free_subnet() -> str:
    """A 10.X.Y prefix no interface of this machine uses."""
    taken = sh("ip", "-4", "-o", "addr").stdout
    for _ in range(100):
        net = f"10.{random.randrange(100, 200)}.{random.randrange(256)}"
        if f" {net}." not in taken:
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    args = parser.parse_args(argv)
    reason = missing()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with Bed(args.hosts) as bed:
        print(f"{args.hosts} hosts up (this machine is {bed.bridge_address} on {bed.bridge}):")
        for host in bed.hosts:
            print(
                f"  {host.name}: {host.address} (eth0), {host.side_address} (eth1, isolated), "
                f"namespace {host.netns}"
            )
        print(
            f"\nimport clustersdk as cs\ncluster = cs.Cluster.ssh({[h.address for h in bed.hosts]},"
            f"\n    key_file={bed.key_file!r},\n    known_hosts={bed.known_hosts!r},"
            "\n    slots_per_host=2)\n"
        )
        print(
            f"ssh -i {bed.key_file} -o UserKnownHostsFile={bed.known_hosts} "
            f"root@{bed.hosts[0].address}\n\nCtrl-C tears it all down."
        )
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
