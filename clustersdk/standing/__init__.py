"""Standing clusters: a cluster a team keeps running, apart from any notebook or shell.

Every cluster :class:`~clustersdk.Cluster` starts lives and dies with the process that
made it. ``clustersdk cluster up NAME`` starts one that does not: its scheduler (with
clustersdk's control plane from its first moment, its journal in the cluster's state
directory) and its workers run under a supervisor per host (:mod:`.supervisor`),
detached from the command, in sessions of their own, with logs to files. The command
returns once the cluster answers, printing its address and the admin's credentials;
a notebook, a login shell or the command itself can end without touching it.

- :func:`up` (``--local N`` here; over SSH and under Slurm: :mod:`.ssh`, :mod:`.slurm`)
  is idempotent: a cluster of that name that runs is reported; one whose supervisor
  is gone is started again with its certificates, its address and its journal (its
  queued and suspended jobs come back);
- :func:`down` suspends the jobs that have a ``checkpoint_dir`` (unless ``now``), stops
  every process ``up`` started, and removes the cluster's directory: its keys, its
  journal, its logs (``keep_state`` keeps the journal and logs);
- :func:`status` is what the supervisor says of each process (running, restarting,
  given up, how many restarts) and what the control plane says (slots, jobs, the
  cluster's events);
- :func:`logs` is the tail of a process's log.

``Cluster.connect("team")`` (and ``--cluster team``, ``%cluster connect team``) finds
it by name in this account's registry.

>>> record = up("team", local=2)                    # doctest: +SKIP
>>> record.address, record.credentials              # doctest: +SKIP
('tls://127.0.0.1:41231', '/home/ana/.clustersdk/standing/team/tls/users/ana.pem')
>>> down("team")                                    # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from .. import config, registry
from ..errors import ClusterSDKError, SpecError, StartError
from ..version import __version__
from .record import HostPlan, Paths, Process, Record, RecordError, check_name, read_json, write_json

__all__ = ["Record", "down", "logs", "status", "up"]

UP_TIMEOUT = 120.0  # seconds up waits for the scheduler and every worker to answer
DAYS = 365.0  # the cluster's certificates: a standing cluster outlives a local one's 30 days
STOP_WAIT_S = 40.0  # what a supervisor has to stop its processes (its own grace: 20 s)


def up(
    name: str,
    *,
    local: int | None = None,
    host: str = "127.0.0.1",
    state_dir: str | None = None,
    bind_cpus: bool | None = None,
    memory_limit: str | None = None,
    days: float = DAYS,
    timeout: float = UP_TIMEOUT,
    say: Callable[[str], None] = print,
) -> Record:
    """Start the standing cluster ``name`` on this host with ``local`` workers (default:
    one per GPU, else 2), listening on ``host``; or report it if it runs. Returns its
    record (the address, the admin's credentials file) once every worker answers."""
    check = _checked(name)
    paths = Paths(config.state_dir(state_dir), check)
    found = read_json(paths.record)
    if found is not None:
        record = Record.from_dict(found)
        if _supervisor_pid(paths) is not None and _answers(record):
            say(f"{name}: running at {record.address} (up since {_when(record.created)})")
            return record
        say(f"{name}: its supervisor is gone; starting it again at {record.address}")
        _detach(paths, _python())
        _wait_ready(record, paths, timeout, say)
        _register(record, paths)
        return record
    if local is None:
        local = _gpus() or 2
    if isinstance(local, bool) or not isinstance(local, int) or local <= 0:
        raise SpecError(f"--local must be a positive number of workers, got {local!r}")
    record = _create_local(paths, local, host, bind_cpus, memory_limit, days)
    say(f"{name}: starting a scheduler and {local} worker(s) at {record.address}")
    try:
        _detach(paths, _python())
        _wait_ready(record, paths, timeout, say)
    except BaseException:
        _stop(paths, say=lambda text: None)
        shutil.rmtree(paths.root, ignore_errors=True)
        raise
    _register(record, paths)
    return record


def down(
    name: str,
    *,
    now: bool = False,
    keep_state: bool = False,
    state_dir: str | None = None,
    timeout: float = 300.0,
    say: Callable[[str], None] = print,
) -> None:
    """Take the standing cluster ``name`` down: its jobs with a ``checkpoint_dir`` are
    suspended first (unless ``now``; they resume when the cluster comes back with
    ``keep_state``), then every process it runs is stopped and its directory removed
    (``keep_state``: all but the keys)."""
    paths = Paths(config.state_dir(state_dir), _checked(name))
    found = read_json(paths.record)
    if found is None:
        raise SpecError(f"no standing cluster named {name!r} here ({paths.root} is not one)")
    record = Record.from_dict(found)
    if not now and _supervisor_pid(paths) is not None:
        _suspend_jobs(record, timeout, say)
    _stop(paths, say)
    registry.unregister(_registry_path(paths))
    if keep_state:
        shutil.rmtree(paths.tls, ignore_errors=True)
        shutil.rmtree(paths.run, ignore_errors=True)
        say(f"{name}: down; its journal and logs are kept in {paths.root}")
    else:
        shutil.rmtree(paths.root, ignore_errors=True)
        say(f"{name}: down; {paths.root} removed")


def status(name: str, *, state_dir: str | None = None) -> dict[str, Any]:
    """The cluster's record, what its supervisor says of each process, and what its
    control plane says (``reachable``; the slots, the jobs and the cluster's events)."""
    paths = Paths(config.state_dir(state_dir), _checked(name))
    found = read_json(paths.record)
    if found is None:
        raise SpecError(f"no standing cluster named {name!r} here ({paths.root} is not one)")
    record = Record.from_dict(found)
    supervised = read_json(paths.status) or {}
    pid = _supervisor_pid(paths)
    out: dict[str, Any] = {
        "record": record.as_dict(),
        "supervisor": {"pid": pid, "running": pid is not None},
        "processes": supervised.get("processes", {}) if pid is not None else {},
        "events": _tail_events(paths, 20),
        "reachable": False,
    }
    try:
        with _admin(record, timeout=5.0) as cluster:
            out["slots"] = cluster.slots()
            out["jobs"] = [
                {"name": j.name, "status": j.status.name, "owner": j.owner} for j in cluster.jobs()
            ]
            out["cluster_events"] = cluster.sync(cluster.control.cluster_events)
            out["reachable"] = True
    except ClusterSDKError as e:
        out["error"] = str(e)
    return out


def logs(
    name: str, process: str = "scheduler", lines: int = 50, *, state_dir: str | None = None
) -> str:
    """The last ``lines`` lines of ``process``'s log (``scheduler``, ``worker-0``,
    ``supervisor``...)."""
    paths = Paths(config.state_dir(state_dir), _checked(name))
    path = paths.log(process)
    if not os.path.exists(path):
        known = (
            sorted(n[: -len(".log")] for n in os.listdir(paths.logs))
            if os.path.isdir(paths.logs)
            else []
        )
        raise SpecError(
            f"no log of {process!r} for cluster {name!r}; there are: {', '.join(known) or 'none'}"
        )
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


# --- making one ---------------------------------------------------------------------------------
def _create_local(
    paths: Paths,
    workers: int,
    host: str,
    bind_cpus: bool | None,
    memory_limit: str | None,
    days: float,
) -> Record:
    from .. import cpus
    from ..security.pki import Authority
    from ..security.tls import creator_name

    gpus = _gpus()
    if gpus and workers > gpus:
        raise SpecError(f"--local {workers} but this machine has {gpus} GPU(s): one worker per GPU")
    os.makedirs(os.path.dirname(paths.root), mode=0o700, exist_ok=True)
    os.mkdir(paths.root, 0o700)
    admin = creator_name()
    authority = Authority.create(paths.tls, admin=admin, days=days, cluster=paths.name)
    port = _free_port(host)
    address = f"tls://{_bracket(host)}:{port}"
    record = Record(
        name=paths.name,
        kind="local",
        address=address,
        port=port,
        scheduler_host="localhost",
        hosts={"localhost": workers},
        credentials=authority.credentials_file(admin),
        created=time.time(),
        options={"host": host, "memory_limit": memory_limit},
        version=__version__,
    )
    bind = config.get("bind-cpus", True) if bind_cpus is None else bind_cpus
    shares = cpus.shares(workers) if bind else None
    python = _python()
    processes = [scheduler_process(python, paths, host, port)]
    for i in range(workers):
        share = shares[i] if shares else (cpus.OFF if not bind else None)
        processes.append(
            worker_process(
                python,
                paths.tls,
                address,
                f"{paths.name}-{i}",
                host,
                gpu=str(i) if gpus else None,
                cpus=share,
                memory_limit=memory_limit,
            )
        )
    write_json(paths.plan, HostPlan(paths.name, processes).as_dict())
    write_json(paths.record, record.as_dict())
    return record


def scheduler_process(python: str, paths: Paths, host: str, port: int) -> Process:
    argv = [python, "-m", "clustersdk.standing.serve", "scheduler", "--tls", paths.tls]
    argv += ["--state", paths.root, "--host", host, "--port", str(port)]
    return Process("scheduler", argv)


def worker_process(
    python: str,
    tls: str,
    address: str,
    name: str,
    host: str | None,
    *,
    gpu: str | None = None,
    cpus: str | None = None,
    memory_limit: str | None = None,
) -> Process:
    """One slot's nanny (``worker-N``, from the worker's name ``CLUSTER-N``)."""
    argv = [python, "-m", "clustersdk.standing.serve", "worker", address, "--tls", tls]
    argv += ["--name", name]
    if host:
        argv += ["--host", host]
    if gpu is not None:
        argv += ["--gpu", gpu]
    env: dict[str, str] = {}
    if cpus:
        env["CLUSTERSDK_CPUS"] = cpus  # off, or the share (cpus.ENV)
    if memory_limit:
        argv += ["--memory-limit", memory_limit]
    return Process(f"worker-{name.rsplit('-', 1)[-1]}", argv, env)


# --- running it ----------------------------------------------------------------------------------
def _detach(paths: Paths, python: str) -> int:
    """Start the host's supervisor in a session of its own, its output to its log; its pid."""
    os.makedirs(paths.logs, mode=0o700, exist_ok=True)
    with open(paths.log("supervisor"), "ab") as log:
        proc = subprocess.Popen(
            [python, "-m", "clustersdk.standing.supervisor", paths.root],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=paths.root,
        )
    return proc.pid


def _wait_ready(record: Record, paths: Paths, timeout: float, say: Callable[[str], None]) -> None:
    """Until the scheduler answers with every worker's slot (or a process is given up)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        gave_up = [
            name
            for name, p in ((read_json(paths.status) or {}).get("processes") or {}).items()
            if p.get("state") == "given up"
        ]
        if gave_up:
            raise StartError(
                f"{record.name}: {', '.join(gave_up)} kept failing as it started; its log: "
                f"{paths.log(gave_up[0])}"
            )
        slots = _slots(record)
        if slots is not None:
            text = f"{len(slots)}/{record.workers} worker(s) ready"
            if text != last:
                say(f"{record.name}: {text}")
                last = text
            if len(slots) >= record.workers:
                return
        time.sleep(0.5)
    raise StartError(
        f"{record.name}: not every worker answered within {timeout:g} s ({last or 'no scheduler'}); "
        f"see {paths.logs}"
    )


def _slots(record: Record) -> list[dict[str, Any]] | None:
    """The scheduler's slots, or None while it does not answer."""
    try:
        with _admin(record, timeout=2.0) as cluster:
            return cluster.slots()
    except (ClusterSDKError, OSError):
        return None


def _answers(record: Record) -> bool:
    return _slots(record) is not None


@contextlib.contextmanager
def _admin(record: Record, timeout: float):  # noqa: ANN202 - a Cluster, imported on use
    """The cluster, connected as its admin (registered nowhere: this is a look, not a use)."""
    from distributed import Client

    from ..cluster.base import Cluster
    from ..security.tls import credentials_security

    try:
        client = Client(
            record.address, timeout=timeout, security=credentials_security(record.credentials)
        )
    except (OSError, TimeoutError) as e:
        raise ClusterSDKError(f"the scheduler at {record.address} does not answer: {e}") from e
    try:
        cluster = Cluster(client, kind="standing", register=False)
    except BaseException:
        client.close()
        raise
    try:
        yield cluster
    finally:
        cluster.close()


def _suspend_jobs(record: Record, timeout: float, say: Callable[[str], None]) -> None:
    """Suspend every running job with a checkpoint_dir (it resumes if the cluster comes
    back with its journal); stop the others."""
    try:
        with _admin(record, timeout=5.0) as cluster:
            for job in cluster.jobs():
                if job.status.terminal or job.status.name in ("QUEUED", "SUSPENDED"):
                    continue
                if job.spec.checkpoint_dir and job.status.name in ("RUNNING", "PAUSED"):
                    say(f"{record.name}: suspending job {job.name!r} (a checkpoint first)")
                    with contextlib.suppress(ClusterSDKError):
                        job.suspend(timeout=timeout)
    except ClusterSDKError as e:
        say(f"{record.name}: could not reach the scheduler to suspend its jobs ({e})")


def _stop(paths: Paths, say: Callable[[str], None]) -> None:
    """SIGTERM to the supervisor; what is left after :data:`STOP_WAIT_S` is killed."""
    pid = _supervisor_pid(paths)
    listed = [
        p.get("pid") for p in ((read_json(paths.status) or {}).get("processes") or {}).values()
    ]
    if pid is not None:
        say(f"{paths.name}: stopping its processes")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline and registry.pid_alive(pid):
            time.sleep(0.2)
        if registry.pid_alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    for child in listed:  # a supervisor killed by hand left them: not the cluster's any more
        if child and registry.pid_alive(int(child)):
            with contextlib.suppress(OSError):
                os.killpg(int(child), signal.SIGKILL)


def _supervisor_pid(paths: Paths) -> int | None:
    """The supervisor's pid, if it runs."""
    found = read_json(paths.pid_file)
    pid = int(found.get("pid", 0)) if found else 0
    return pid if pid and registry.pid_alive(pid) else None


def _register(record: Record, paths: Paths) -> None:
    registry.register(
        record.address,
        kind="standing",
        local=False,
        state_dir=paths.state_dir,
        pid=0,
        credentials=record.credentials,
        authority=paths.tls,
        name=record.name,
    )


def _registry_path(paths: Paths) -> str | None:
    for entry in registry.entries(paths.state_dir):
        if entry.get("name") == paths.name and entry.get("kind") == "standing":
            return entry.get("path")
    return None


def _tail_events(paths: Paths, n: int) -> list[dict[str, Any]]:
    import json

    try:
        with open(paths.events) as f:
            lines = f.readlines()[-n:]
    except OSError:
        return []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


# --- small pieces ---------------------------------------------------------------------------
def _checked(name: str) -> str:
    try:
        return check_name(name)
    except RecordError as e:
        raise SpecError(str(e)) from None


def _python() -> str:
    return sys.executable


def _gpus() -> int:
    from ..cluster.remote import gpu_count

    return gpu_count()


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))
