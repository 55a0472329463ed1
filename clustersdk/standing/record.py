"""A standing cluster on disk: its name, where its files lie, what each host runs.

Pure (the standard library only): the CLI, the supervisor and the processes it starts
all read it. A standing cluster named ``team`` keeps one directory under the state
directory of the account that ran ``clustersdk cluster up``, and one per host it runs
on (a directory of its own per host, so that hosts sharing a home over NFS do not
share one)::

    <state_dir>/standing/team/
        cluster.json          the record (:class:`Record`): kind, address, hosts, options
        tls/                  the cluster's certificate authority (security/pki.py): its
                              CA and its key, the roles' certificates, users/NAME.pem
        hosts/HOST/           what runs on HOST (:class:`HostPaths`):
            host.json         its supervisor's plan (:class:`HostPlan`)
            tls/              the TLS files its processes need (never the CA's key)
            journal.sqlite    the control plane's journal, on the scheduler's host
            run/              supervisor.pid, status.json (each process: pid, restarts)
            logs/             supervisor.log, scheduler.log, worker-N.log
            events.jsonl      every start, exit, restart and give-up of a process

On another host of an SSH cluster only ``hosts/HOST/`` exists, under that account's
state directory (or the ``--remote-dir`` given to ``up``). A ``kubernetes`` cluster
(``clustersdk cluster kubernetes``, :mod:`.kubernetes`) has its record and its ``tls/``
here, and no ``hosts/``: its processes are the pods of its manifests.

>>> check_name("team-a")
'team-a'
>>> Paths("/s", "team").record
'/s/standing/team/cluster.json'
>>> Paths("/s", "team").host("10.0.0.2").plan
'/s/standing/team/hosts/10.0.0.2/host.json'
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from typing import Any

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
KINDS = ("local", "ssh", "slurm", "kubernetes")


class RecordError(ValueError):
    """A name, record or plan that can't be used (the message says why)."""


def check_name(name: Any) -> str:
    """A standing cluster's name: lower-case letters, digits, ``-`` and ``_`` (it names
    directories, Slurm jobs, systemd units and Kubernetes objects)."""
    if not isinstance(name, str) or not NAME.match(name):
        raise RecordError(
            f"a standing cluster's name is 1-40 lower-case letters, digits, '-' or '_', "
            f"starting with a letter or digit; got {name!r}"
        )
    return name


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where a standing cluster's files lie under ``state_dir``."""

    state_dir: str
    name: str

    @property
    def root(self) -> str:
        return os.path.join(self.state_dir, "standing", self.name)

    @property
    def record(self) -> str:
        return os.path.join(self.root, "cluster.json")

    @property
    def tls(self) -> str:
        """The certificate authority's directory (on the machine that ran ``up``)."""
        return os.path.join(self.root, "tls")

    def host(self, host: str) -> HostPaths:
        return HostPaths(os.path.join(self.root, "hosts", host))


@dataclasses.dataclass(frozen=True)
class HostPaths:
    """Where one host's files of a standing cluster lie (``root``: its directory)."""

    root: str

    def _in(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def plan(self) -> str:
        return self._in("host.json")

    @property
    def tls(self) -> str:
        return self._in("tls")

    @property
    def run(self) -> str:
        return self._in("run")

    @property
    def pid_file(self) -> str:
        return self._in("run", "supervisor.pid")

    @property
    def status(self) -> str:
        return self._in("run", "status.json")

    @property
    def logs(self) -> str:
        return self._in("logs")

    def log(self, process: str) -> str:
        return self._in("logs", f"{process}.log")

    @property
    def events(self) -> str:
        return self._in("events.jsonl")


@dataclasses.dataclass(frozen=True)
class Record:
    """What ``up`` made: enough to find, reach, report on and take down the cluster.

    ``hosts``: each host's name as ``up`` reached it and its workers (for ``local``,
    the one host ``localhost``); ``scheduler_host`` the host whose supervisor runs the
    scheduler; ``address`` the scheduler's (``tls://host:port``); ``credentials`` the
    admin's credentials file; ``options`` what the kind was started with (SSH options,
    Slurm's job options), so that ``down`` reaches the same hosts.
    """

    name: str
    kind: str
    address: str
    port: int
    scheduler_host: str
    hosts: dict[str, int]
    credentials: str
    created: float
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    version: str = ""

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.kind not in KINDS:
            raise RecordError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def workers(self) -> int:
        return sum(self.hosts.values())


@dataclasses.dataclass(frozen=True)
class Process:
    """One process a host's supervisor runs and keeps running: its name (``scheduler``,
    ``worker-0``...), its command line and what it adds to the environment."""

    name: str
    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """What one host's supervisor runs: the cluster's name, its processes (the
    scheduler first, where it runs here), and how long a process that keeps failing
    is tried before it is given up on."""

    cluster: str
    processes: list[Process]
    max_quick_failures: int = 5
    quick_s: float = 30.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostPlan:
        processes = [Process(**p) for p in data.get("processes", [])]
        return cls(
            cluster=check_name(data["cluster"]),
            processes=processes,
            max_quick_failures=int(data.get("max_quick_failures", 5)),
            quick_s=float(data.get("quick_s", 30.0)),
        )


def read_json(path: str) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when it is missing or not one."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: str, data: dict[str, Any], mode: int = 0o600) -> None:
    """``data`` to ``path`` atomically (a reader never sees half of it), ``mode`` its bits."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
