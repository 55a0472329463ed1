"""``Cluster.ssh``: a Dask scheduler and one worker per GPU on hosts reached over SSH.

Over paramiko (``pip install 'clustersdk[ssh]'``). Each host gets one SSH
connection and, on it, one process running that host's workers
(:mod:`.remote`): a Nanny per GPU, pinned to it with ``CUDA_VISIBLE_DEVICES``
as in ``Cluster.local``, or ``slots_per_host`` CPU slots where there is no GPU.
That process leads its own process group and dies with its SSH channel, so
``cluster.close()`` (or a notebook that dies) leaves nothing behind, and stops
nothing it did not start.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .. import network
from ..errors import SpecError, StartError
from ..options import check_env

if TYPE_CHECKING:
    from ..security.tls import Prepared
    from .base import Cluster
    from .sshconn import Connection, Target
    from .sshproc import RemoteProcess

logger = logging.getLogger(__name__)

LOCAL = "local"  # scheduler_host=LOCAL: the scheduler runs in this process


def ssh(
    cls: type[Cluster],
    hosts: Sequence[str],
    *,
    gpus_per_host: int | None = None,
    slots_per_host: int | None = None,
    user: str | None = None,
    port: int = 22,
    key_file: str | None = None,
    known_hosts: str | None = None,
    python: str | None = None,
    env: dict[str, str] | None = None,
    connect_timeout: float = 10,
    scheduler_host: str | None = None,
    scheduler_port: int = 0,
    banner_timeout: float | None = None,
    start_timeout: float = 120,
    jump_host: str | None = None,
    interface: str | None = None,
    rendezvous_ports: Any = None,
    accept_new_hosts: bool = False,
    max_concurrent: int = 8,
    state_dir: str | None = None,
    security: Any = "auto",
    bind_cpus: bool | None = None,
) -> Cluster:
    """Start a Dask scheduler and one worker per GPU on each of ``hosts``, over SSH.

    ``hosts`` are names or addresses (``[user@]host[:port]``); workers listen on
    the address each host was reached at (or on ``interface``, e.g. ``"eth0"``), and
    rank 0's worker address is every job's ``MASTER_ADDR``. Hosts without a GPU get
    ``slots_per_host`` CPU slots (default 1); ``gpus_per_host`` caps (or, 0, turns
    off) the GPUs used. The scheduler runs on ``scheduler_host`` (default: the first
    host; ``"local"``: in this process). ``python`` is the remote interpreter (default:
    this one's path), which must have clustersdk installed; ``env`` is set for every
    worker (NCCL_IB_DISABLE, NCCL_DEBUG, NCCL_SOCKET_IFNAME...). ``rendezvous_ports``
    (``"29400-29499"``) bounds the ports rank 0's store may use. ``bind_cpus`` (default:
    ``clustersdk.bind-cpus``, true) gives each worker on a host a disjoint share of the
    cores its launcher may use, and pins the ranks of a job with more ranks on a host
    than it has CPUs, as in ``Cluster.local``.

    Host keys are checked against ``known_hosts`` (default ``~/.ssh/known_hosts``):
    an unknown or changed key raises :class:`~clustersdk.HostKeyError`, unless
    ``accept_new_hosts`` adds unknown ones. ``jump_host`` (``[user@]host[:port]``)
    reaches the hosts through a bastion. At most ``max_concurrent`` SSH handshakes
    run at once (sshd's MaxStartups is 10 by default). Any failure is a
    :class:`~clustersdk.StartError` naming the host, raised once everything already
    started is stopped again.

    ``security="auto"`` (the default): mutual TLS with the cluster's own certificate
    authority, made here; each host gets the CA certificate, the revocation list and
    its own certificate and key over SFTP, in a private directory (0700, files 0600)
    removed at ``close()``. A ``distributed.Security`` of your own PKI must name files
    that exist on every host; ``False``: plain tcp:// (warned about).

    >>> cluster = Cluster.ssh(["node1", "node2"], gpus_per_host=8,     # doctest: +SKIP
    ...                       python="/opt/venv/bin/python", env={"NCCL_IB_DISABLE": "1"})
    """
    try:
        from . import sshconn  # paramiko, an extra
    except ImportError as e:
        raise ImportError(f"Cluster.ssh needs paramiko ({e}): pip install 'clustersdk[ssh]'") from e

    plan = _Plan.check(
        hosts,
        gpus_per_host,
        slots_per_host,
        user,
        port,
        env,
        scheduler_host,
        rendezvous_ports,
        max_concurrent,
        python,
    )
    options = sshconn.Options(
        known_hosts=known_hosts or "~/.ssh/known_hosts",
        key_file=key_file,
        connect_timeout=connect_timeout,
        banner_timeout=banner_timeout,
        accept_new_hosts=accept_new_hosts,
    )
    jump = sshconn.Target.parse(jump_host, user=user) if jump_host else None
    from .. import config
    from ..security.tls import cluster_security

    prepared = cluster_security(security, state_dir=config.state_dir(state_dir), kind="ssh")
    plan.tls = prepared.enabled
    plan.bind_cpus = bool(config.get("bind-cpus", True) if bind_cpus is None else bind_cpus)
    nodes = SSHNodes(plan, interface, start_timeout, prepared)
    try:
        nodes.connections, nodes.jump = sshconn.connect_all(
            plan.all_targets, options, jump=jump, max_concurrent=max_concurrent
        )
        nodes.each(plan.all_targets, nodes.ship_keys)  # over SFTP, before anything starts
        # The scheduler starts while each host's launcher reports what it has.
        with ThreadPoolExecutor(max_workers=1) as pool:
            scheduler = pool.submit(nodes.start_scheduler, scheduler_port)
            facts = nodes.each(plan.targets, nodes.launch_workers)
            slots = {t: plan.slots_of(t, facts[t]) for t in plan.targets}
            scheduler.result()
        nodes.each(plan.targets, lambda t: nodes.start_workers(t, slots[t]))
        return nodes.attach(cls, sum(len(s) for s in slots.values()), state_dir)
    except BaseException:
        nodes.close()
        prepared.close()
        raise


class _Plan:
    """The checked arguments: who to connect to, and what to run where."""

    @classmethod
    def check(
        cls,
        hosts: Any,
        gpus_per_host: Any,
        slots_per_host: Any,
        user: Any,
        port: Any,
        env: Any,
        scheduler_host: Any,
        ports: Any,
        max_concurrent: Any,
        python: Any,
    ) -> _Plan:
        from .sshconn import Target

        if isinstance(hosts, str) or not hosts or not all(isinstance(h, str) and h for h in hosts):
            raise SpecError(f"hosts must be a non-empty list of host names, got {hosts!r}")
        if len(set(hosts)) != len(hosts):
            raise SpecError(
                f"hosts lists a host twice ({hosts!r}): give each host once and "
                "its slots with gpus_per_host= or slots_per_host="
            )
        for name, value, low in (
            ("gpus_per_host", gpus_per_host, 0),
            ("slots_per_host", slots_per_host, 1),
            ("max_concurrent", max_concurrent, 1),
            ("port", port, 1),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < low
            ):
                raise SpecError(f"{name} must be an int of at least {low}, got {value!r}")
        plan = cls()
        try:
            plan.targets = [Target.parse(h, user=user, port=port) for h in hosts]
        except ValueError as e:
            raise SpecError(f"hosts: {hosts!r} has a bad port ({e})") from None
        plan.gpus_per_host, plan.slots_per_host = gpus_per_host, slots_per_host or 1
        plan.env = check_env(env) or {}
        plan.ports = network.parse_ports(ports)
        plan.python = python or sys.executable
        plan.tls = False  # set once security= is prepared
        plan.bind_cpus = True  # set from bind_cpus= or the config
        plan.scheduler = None
        if scheduler_host != LOCAL:
            wanted = scheduler_host or hosts[0]
            plan.scheduler = next(
                (t for t, h in zip(plan.targets, hosts) if h == wanted), None
            ) or Target.parse(wanted, user=user, port=port)
        # the scheduler's host needs a connection too, even when it runs no worker
        extra = [plan.scheduler] if plan.scheduler and plan.scheduler not in plan.targets else []
        plan.all_targets = plan.targets + extra
        return plan

    def slots_of(self, target: Target, facts: dict[str, Any]) -> list[str]:
        """CUDA_VISIBLE_DEVICES of each worker on ``target``: its GPUs, or '' per CPU slot."""
        gpus = list(facts.get("gpus") or [])
        if self.gpus_per_host is not None and self.gpus_per_host > len(gpus):
            raise StartError(
                f"host {target.label}: gpus_per_host={self.gpus_per_host}, but it "
                f"has {len(gpus)} GPU(s) visible to torch",
                host=target.label,
            )
        if self.gpus_per_host is not None:
            gpus = gpus[: self.gpus_per_host]
        return gpus or [""] * self.slots_per_host

    def command(self, mode: str, **flags: Any) -> str:
        """The remote command line: the workers' environment, then the launcher."""
        from .local import http_routes, worker_config
        from .remote import command
        from .sshconn import quote_env

        config = {
            **worker_config(),
            **http_routes(self.tls),
            "clustersdk.rendezvous-ports": network.format_ports(self.ports) if self.ports else None,
        }
        args = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items() if v is not None]
        args.append(f"--config={json.dumps(config)}")
        return "exec " + quote_env(self.env) + command(self.python, mode, args)


class SSHNodes:
    """The processes ``Cluster.ssh`` started (the ``dask_cluster`` of its Cluster).

    ``processes`` maps each host to what runs there, ``pids()`` says by pid.
    """

    def __init__(self, plan: _Plan, interface: str | None, timeout: float, prepared: Prepared):
        self.plan, self.interface, self.timeout = plan, interface, timeout
        self.prepared = prepared
        self.key_dirs: dict[Target, str] = {}  # each host's private copy of its TLS files
        self.connections: dict[Target, Connection] = {}
        self.jump: Connection | None = None
        self.processes: dict[str, list[RemoteProcess]] = {}
        self.workers: dict[Target, RemoteProcess] = {}
        self.scheduler_address: str | None = None
        self.scheduler_process: RemoteProcess | None = None
        self._local_scheduler: Any = None
        self.client: Any = None
        self._closed = False

    @property
    def hosts(self) -> list[str]:
        return [t.label for t in self.plan.targets]

    def pids(self) -> dict[str, list[int]]:
        """The pid of each process started on each host (each leads its process group)."""
        return {host: [p.pid for p in procs if p.pid] for host, procs in self.processes.items()}

    def each(self, targets: list[Target], fn: Callable[[Target], Any]) -> dict[Target, Any]:
        """``fn`` on every target at once; one StartError listing every host that failed."""
        from .sshconn import combine

        results, errors = {}, {}
        with ThreadPoolExecutor(max_workers=min(len(targets), 32)) as pool:
            futures = {t: pool.submit(fn, t) for t in targets}
            for t, future in futures.items():
                try:
                    results[t] = future.result()
                except BaseException as e:  # noqa: BLE001 - each host's failure is reported
                    errors[t] = e
        if errors:
            raise combine(errors)
        return results

    # keys --------------------------------------------------------------------------------
    def ship_keys(self, target: Target) -> None:
        """Copy what ``target`` needs of the cluster's authority (the CA certificate, the
        revocation list, the certificate and key of its role) over SFTP into a private
        directory there: 0700, files 0600 from their first byte. Nothing else of the
        authority (its CA key, the users' credentials) leaves this machine."""
        authority = self.prepared.authority
        if authority is None:
            return
        roles = (["worker"] if target in self.plan.targets else []) + (
            ["scheduler"] if target == self.plan.scheduler else []
        )
        files = {
            "ca.pem": authority.ca_file,
            "crl.pem": authority.crl_file,
            **{f"{role}.pem": getattr(authority, f"{role}_file") for role in roles},
        }
        try:
            sftp = self.connections[target].client.open_sftp()
            try:
                home = sftp.normalize(".")
                directory = (
                    f"{home}/.clustersdk-tls-{os.path.basename(authority.directory)}-"
                    f"{target.host}-{target.port}"
                )
                sftp.mkdir(directory, mode=0o700)
                self.key_dirs[target] = directory
                sftp.chmod(directory, 0o700)
                for name, local in files.items():
                    with open(local, "rb") as f:
                        data = f.read()
                    with sftp.open(f"{directory}/{name}", "wb") as remote:
                        remote.chmod(0o600)
                        remote.write(data)
            finally:
                sftp.close()
        except (OSError, EOFError, paramiko_errors()) as e:
            raise StartError(
                f"host {target.label}: could not copy the cluster's TLS files "
                f"over SFTP ({type(e).__name__}: {e}): does its sshd offer the sftp "
                "subsystem? (or pass security= a Security whose files are already "
                "on every host)",
                host=target.label,
            ) from e

    def _remove_keys(self, target: Target) -> None:
        directory = self.key_dirs.pop(target, None)
        connection = self.connections.get(target)
        if directory is None or connection is None or not connection.alive:
            return
        try:
            sftp = connection.client.open_sftp()
            try:
                for name in sftp.listdir(directory):
                    sftp.remove(f"{directory}/{name}")
                sftp.rmdir(directory)
            finally:
                sftp.close()
        except Exception:  # noqa: BLE001 - a host that died: nothing to remove there any more
            logger.info(
                "clustersdk: could not remove %s on %s", directory, target.label, exc_info=True
            )

    def _security(self, target: Target, role: str) -> dict[str, str] | None:
        """What the launcher on ``target`` builds its ``Security`` from (None: plain tcp)."""
        prepared = self.prepared
        if not prepared.enabled:
            return None
        if prepared.authority is not None:
            directory = self.key_dirs[target]
            return {
                "tls_ca_file": f"{directory}/ca.pem",
                "tls_crl_file": f"{directory}/crl.pem",
                f"tls_{role}_cert": f"{directory}/{role}.pem",
                f"tls_{role}_key": f"{directory}/{role}.pem",
            }
        own = {
            k: getattr(prepared.scheduler, k)
            for k in ("tls_ca_file", f"tls_{role}_cert", f"tls_{role}_key")
        }
        if any(v and "\n" in v for v in own.values()):  # never a key on a command line
            raise SpecError(
                "Cluster.ssh(security=...) takes a Security whose certificates and "
                "keys are files (present on every host), not in-memory PEM text"
            )
        return {k: v for k, v in own.items() if v}

    def _run(self, target: Target, mode: str, **flags: Any) -> RemoteProcess:
        """Start the launcher on ``target``; a clear error if its python can't run it."""
        security = self._security(target, "scheduler" if mode == "scheduler" else "worker")
        if security is not None:
            flags["security"] = json.dumps(security)
        process = self.connections[target].start(self.plan.command(mode, **flags))
        self.processes.setdefault(target.label, []).append(process)
        try:
            process.wait_for("pid", self.timeout, "start")
        except StartError as e:
            raise self._cannot_run(target, process) or e from None
        return process

    def _cannot_run(self, target: Target, process: RemoteProcess) -> StartError | None:
        python, err = self.plan.python, process.stderr_text().strip()
        status = process.wait(1.0)
        if "No module named clustersdk" in err:
            why = (
                f"{python} has no clustersdk: install it there, or pass python= the path "
                "of a Python that has it"
            )
        elif status == 127 or "No such file or directory" in err or "not found" in err:
            why = f"{python} is not there (pass python= the path of a Python that has clustersdk)"
        else:
            return None
        return StartError(f"host {target.label}: {why}", host=target.label)

    def _listen(self, target: Target) -> dict[str, Any]:
        host = None if self.interface else target.host if _is_address(target.host) else None
        return {"host": host, "interface": self.interface}

    def launch_workers(self, target: Target) -> dict[str, Any]:
        """Start ``target``'s launcher; the host's facts (versions, GPUs)."""
        process = self._run(target, "workers", name=target.label, **self._listen(target))
        self.workers[target] = process
        return process.wait_for("facts", self.timeout, "report its GPUs")

    def start_workers(self, target: Target, slots: list[str]) -> list[str]:
        """Tell ``target``'s launcher where the scheduler is and what to start; wait for it."""
        process = self.workers[target]
        go = {"scheduler": self.scheduler_address, "slots": slots, "bind_cpus": self.plan.bind_cpus}
        try:
            process.channel.sendall((json.dumps(go) + "\n").encode())
        except OSError as e:
            raise StartError(
                f"host {target.label}: the SSH connection dropped ({e})", host=target.label
            ) from e
        return process.wait_for("ready", self.timeout, f"start its {len(slots)} worker(s)")

    def start_scheduler(self, port: int) -> None:
        target = self.plan.scheduler
        if target is None:
            self._start_local_scheduler(port)
            return
        process = self._run(target, "scheduler", port=port, **self._listen(target))
        self.scheduler_process = process
        self.scheduler_address = process.wait_for("ready", self.timeout, "start the Dask scheduler")

    def _start_local_scheduler(self, port: int) -> None:
        """In this process, on the address this machine reaches the first host from."""
        from distributed import Scheduler, SpecCluster

        first = self.plan.targets[0].host
        host = network.local_address_towards(first)
        if host is None:
            raise StartError(f"host {first}: no local address routes to it", host=first)
        import dask.config

        from .local import http_routes

        prepared = self.prepared
        with dask.config.set(http_routes(prepared.enabled)):
            self._local_scheduler = SpecCluster(
                workers={},
                scheduler={
                    "cls": Scheduler,
                    "options": {
                        "host": host,
                        "port": port,
                        "dashboard": False,
                        "dashboard_address": f"{host}:0",
                        "protocol": prepared.protocol,
                        "security": prepared.scheduler,
                    },
                },
                name="clustersdk-ssh",
                silence_logs=logging.WARNING,
                security=prepared.client,
            )
        self.scheduler_address = self._local_scheduler.scheduler_address

    def attach(self, cls: type[Cluster], n_workers: int, state_dir: str | None) -> Cluster:
        from distributed import Client

        timeout = self.timeout
        self.client = Client(self.scheduler_address, timeout=timeout, security=self.prepared.client)
        try:
            self.client.wait_for_workers(n_workers, timeout=timeout)
        except TimeoutError:
            seen = len(self.client.scheduler_info(n_workers=-1)["workers"])
            raise StartError(
                f"only {seen} of {n_workers} workers reached the scheduler at "
                f"{self.scheduler_address} within {timeout:g} s: can the hosts "
                "reach it (firewall, interface=)?"
            ) from None
        return cls(
            self.client, kind="ssh", dask_cluster=self, state_dir=state_dir, security=self.prepared
        )

    def close(self, grace: float = 10.0) -> None:
        """Stop the workers, then the scheduler, then hang up; dead hosts are skipped."""
        if self._closed:
            return
        self._closed = True
        if self.client is not None:
            self.client.close()
        everything = [p for procs in self.processes.values() for p in procs]
        _stop_all([p for p in everything if p is not self.scheduler_process], grace)
        _stop_all([self.scheduler_process] if self.scheduler_process else [], grace)
        if self._local_scheduler is not None:
            self._local_scheduler.close()
        if self.key_dirs:  # the hosts' copies of the TLS files go with the cluster
            self.each(list(self.key_dirs), self._remove_keys)
        for connection in self.connections.values():
            connection.close()
        if self.jump is not None:
            self.jump.close()

    def __repr__(self) -> str:
        return f"<SSHNodes {' '.join(self.hosts)} scheduler={self.scheduler_address}>"


def _stop_all(processes: list[RemoteProcess], grace: float) -> None:
    if not processes:
        return
    with ThreadPoolExecutor(max_workers=min(len(processes), 32)) as pool:
        for future in [pool.submit(p.stop, grace) for p in processes]:
            try:
                future.result()
            except Exception:  # a host that died: nothing left to stop there
                logger.info("clustersdk: stopping a remote process failed", exc_info=True)


def paramiko_errors() -> type[BaseException]:
    import paramiko

    return paramiko.SSHException


def _is_address(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
