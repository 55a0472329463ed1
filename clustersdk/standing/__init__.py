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
  journal, its logs (``keep_state`` keeps them all, for ``up`` to bring it back);
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
import json
import os
import shutil
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


def up(
    name: str,
    *,
    local: int | None = None,
    ssh: list[str] | None = None,
    slurm: int | None = None,
    slurm_options: dict[str, Any] | None = None,
    host: str | None = None,
    slots_per_host: int | None = None,
    ssh_options: dict[str, Any] | None = None,
    state_dir: str | None = None,
    bind_cpus: bool | None = None,
    memory_limit: str | None = None,
    days: float = DAYS,
    timeout: float = UP_TIMEOUT,
    say: Callable[[str], None] = print,
) -> Record:
    """Start the standing cluster ``name``, or report it if it runs; its record (the
    address, the admin's credentials file) once every worker answers.

    ``local``: that many workers on this host (default: one per GPU, else 2), listening
    on ``host``. ``ssh``: the hosts (``[user@]host[:port]``) to run it on over SSH, the
    scheduler on the first, one worker per GPU (or ``slots_per_host`` CPU slots) on
    each; ``ssh_options`` as :meth:`Cluster.ssh <clustersdk.Cluster.ssh>` takes them
    (``user``, ``port``, ``key_file``, ``known_hosts``, ``accept_new_hosts``,
    ``jump_host``, ``python``, ``connect_timeout``) and ``remote_dir``: the state
    directory on the hosts (default ``~/.clustersdk``). ``slurm``: that many Slurm jobs of
    workers (:mod:`.slurm`), the scheduler here listening on ``host`` (default: this
    host's name's address); ``slurm_options``: ``gpus_per_job`` (1; a worker per GPU),
    ``cpus_per_job`` (1), ``memory``, ``partition``, ``account``, ``walltime``,
    ``sbatch_options`` (more ``#SBATCH`` lines) and ``python``."""
    paths = Paths(config.state_dir(state_dir), _checked(name))
    found = read_json(paths.record)
    if found is not None:
        record = Record.from_dict(found)
        if record.kind == "kubernetes":
            raise SpecError(
                f"{name!r} runs on Kubernetes: `clustersdk cluster kubernetes {name}` writes its "
                "manifests, kubectl applies them"
            )
        if _answers(record):
            say(f"{name}: running at {record.address} (up since {_when(record.created)})")
            _register(record, paths)
            return record
        say(f"{name}: it does not answer; starting its supervisors again at {record.address}")
        hosts = _hosts(record, paths)
        try:
            for h in hosts:
                h.start()
            _wait_ready(record, hosts, timeout, say)
        finally:
            _close(hosts)
        _register(record, paths)
        return record
    if sum(x is not None for x in (local, ssh, slurm)) > 1:
        raise SpecError("give one of --local N, --ssh HOST... and --slurm N")
    if slurm is not None:
        from .slurm import DEFAULTS

        kind = "slurm"
        options = {**DEFAULTS, **(slurm_options or {}), "jobs": slurm}
        options["host"] = host or _this_host()
    elif ssh is not None:
        if isinstance(ssh, str) or not ssh:
            raise SpecError(f"--ssh needs at least one host, got {ssh!r}")
        kind, options = "ssh", {**(ssh_options or {}), "hosts": list(ssh)}
    else:
        if local is None:
            local = _gpus() or 2
        if isinstance(local, bool) or not isinstance(local, int) or local <= 0:
            raise SpecError(f"--local must be a positive number of workers, got {local!r}")
        kind, options = "local", {"host": host or "127.0.0.1", "workers": local}
    options.update(memory_limit=memory_limit, slots_per_host=slots_per_host)
    bind = config.get("bind-cpus", True) if bind_cpus is None else bind_cpus
    os.makedirs(os.path.dirname(paths.root), mode=0o700, exist_ok=True)
    os.mkdir(paths.root, 0o700)
    hosts: list[Any] = []
    try:
        hosts = _connect(kind, options, paths)
        record = _plan(paths, kind, options, hosts, bool(bind), days)
        say(f"{name}: starting a scheduler and {record.workers} worker(s) at {record.address}")
        for h in hosts:  # the scheduler's host first: the workers find it sooner
            h.start()
        _wait_ready(record, hosts, timeout, say)
    except BaseException:
        for h in hosts:
            with contextlib.suppress(Exception):
                h.stop(remove=True)
        _close(hosts)
        shutil.rmtree(paths.root, ignore_errors=True)
        raise
    _close(hosts)
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
    ``keep_state``), then every process it runs, on every host, is stopped and its
    directories removed. ``keep_state`` keeps them (its journal, its keys, its logs), so
    that ``up`` brings it back at the same address with the same people's credentials,
    its suspended jobs ready to resume: an upgrade of clustersdk, a move, a reboot."""
    paths = Paths(config.state_dir(state_dir), _checked(name))
    record = _record(paths)
    hosts = _hosts(record, paths)
    try:
        if not now and _answers(record):
            _suspend_jobs(record, timeout, say)
        say(f"{name}: stopping its processes on {len(hosts)} host(s)")
        for h in hosts:
            left = h.stop(remove=not keep_state).get("left")
            if left:
                say(f"{name}: on {h.label}, processes {left} were still there after a SIGKILL")
    finally:
        _close(hosts)
    registry.unregister(_registry_path(paths))
    if keep_state:
        say(
            f"{name}: down; its journal, keys and logs are kept ({paths.root} and the hosts'): "
            f"`clustersdk cluster up {name}` brings it back as it was"
        )
    else:
        shutil.rmtree(paths.root, ignore_errors=True)
        say(f"{name}: down; its directories removed")


def status(name: str, *, state_dir: str | None = None) -> dict[str, Any]:
    """The cluster's record, what each host's supervisor says of its processes, and what
    its control plane says (``reachable``; the slots, the jobs and the cluster's events)."""
    paths = Paths(config.state_dir(state_dir), _checked(name))
    record = _record(paths)
    out: dict[str, Any] = {"record": record.as_dict(), "hosts": {}, "reachable": False}
    try:
        hosts = _hosts(record, paths)
    except ClusterSDKError as e:
        out["error"] = str(e)
        hosts = []
    try:
        for h in hosts:
            try:
                out["hosts"][h.label] = h.state()
            except ClusterSDKError as e:
                out["hosts"][h.label] = {"supervisor": None, "processes": {}, "error": str(e)}
    finally:
        _close(hosts)
    try:
        with _admin(record, timeout=5.0) as cluster:
            out["slots"] = cluster.slots()
            out["jobs"] = [
                {"name": j.name, "status": j.status.name, "owner": j.owner} for j in cluster.jobs()
            ]
            out["cluster_events"] = cluster.sync(cluster.control.cluster_events)
            out["reachable"] = True
    except ClusterSDKError as e:
        out.setdefault("error", str(e))
    return out


def logs(
    name: str,
    process: str = "scheduler",
    lines: int = 50,
    *,
    host: str | None = None,
    state_dir: str | None = None,
) -> str:
    """The last ``lines`` lines of ``process``'s log (``scheduler``, ``worker-0``,
    ``supervisor``...) on ``host`` (default: the scheduler's host)."""
    paths = Paths(config.state_dir(state_dir), _checked(name))
    record = _record(paths)
    hosts = _hosts(record, paths)
    try:
        wanted = host or record.scheduler_host
        chosen = next((h for h in hosts if h.label == wanted), None)
        if chosen is None:
            raise SpecError(
                f"cluster {name!r} has no host {wanted!r}; its hosts: "
                f"{', '.join(h.label for h in hosts)}"
            )
        try:
            text = chosen.read(f"logs/{process}.log")
        except OSError:
            raise SpecError(
                f"no log of {process!r} on {chosen.label} for cluster {name!r} (scheduler, "
                "worker-N, supervisor)"
            ) from None
    finally:
        _close(hosts)
    return "".join(text.splitlines(keepends=True)[-lines:])


# --- making one ---------------------------------------------------------------------------------
def _connect(kind: str, options: dict[str, Any], paths: Paths) -> list[Any]:
    """The hosts of a cluster of ``kind``, reached (the scheduler's first)."""
    from .hosts import Here, connect

    if kind == "local":
        return [Here(paths.host("localhost").root, options["host"])]
    if kind == "kubernetes":
        return []  # its processes are pods (kubectl delete -f), not this machine's to reach
    if kind == "slurm":
        from .slurm import SlurmJobs

        return [Here(paths.host("localhost").root, options["host"]), SlurmJobs(paths, options)]
    return connect(options["hosts"], options, paths.name)


def _hosts(record: Record, paths: Paths) -> list[Any]:
    """The hosts of an existing cluster, reached again from its record."""
    return _connect(record.kind, record.options, paths)


def _plan(
    paths: Paths, kind: str, options: dict[str, Any], hosts: list[Any], bind: bool, days: float
) -> Record:
    """The CA and each host's plan and TLS files; the record, written."""
    from ..security.pki import Authority
    from ..security.tls import creator_name

    admin = creator_name()
    authority = Authority.create(paths.tls, admin=admin, days=days, cluster=paths.name)
    if kind == "slurm":
        counts, address, port = _plan_slurm(paths, options, hosts[0], authority)
        return _write_record(
            paths, kind, options, address, port, hosts[0], counts, authority, admin
        )
    slots = options.get("workers") if kind == "local" else options.get("slots_per_host")
    found = {h.label: h.prepare(slots, listen=h is hosts[0]) for h in hosts}
    first = hosts[0]
    if kind == "local":
        gpus = found[first.label]["gpus"]
        if gpus and options["workers"] > len(gpus):
            raise SpecError(
                f"--local {options['workers']} but this machine has {len(gpus)} GPU(s): one "
                "worker per GPU"
            )
    port = int(found[first.label]["port"])
    address = f"tls://{_bracket(first.address)}:{port}"
    counts: dict[str, int] = {}
    for i, h in enumerate(hosts):
        facts = found[h.label]
        gpus = list(facts["gpus"])
        n = (
            (options["workers"] if kind == "local" else options.get("slots_per_host"))
            or len(gpus)
            or 1
        )
        shares = facts.get("shares") if bind else None
        python = options.get("python") or facts["python"]
        processes = []
        if i == 0:
            processes.append(scheduler_process(python, h.root, first.address, port))
        for k in range(n):
            share = shares[k] if shares else (None if bind else "off")
            processes.append(
                worker_process(
                    python,
                    f"{h.root}/tls",
                    address,
                    f"{paths.name}-{sum(counts.values()) + k}",
                    h.address,
                    index=k,
                    gpu=gpus[k] if k < len(gpus) else None,
                    cpus=share,
                    memory_limit=options.get("memory_limit"),
                )
            )
        counts[h.label] = n
        roles = ["worker"] + (["scheduler"] if i == 0 else [])
        for file, data in _tls_files(authority, roles).items():
            h.put(f"tls/{file}", data)
        h.put("host.json", json.dumps(HostPlan(paths.name, processes).as_dict()).encode())
    return _write_record(paths, kind, options, address, port, first, counts, authority, admin)


def _tls_files(authority: Any, roles: list[str]) -> dict[str, bytes]:
    """What a host's processes of ``roles`` read: the CA's certificate, its revocation
    list and their certificates (never the CA's key)."""
    out = {}
    for file in ["ca.pem", "crl.pem", *(f"{r}.pem" for r in roles)]:
        with open(os.path.join(authority.directory, file), "rb") as f:
            out[file] = f.read()
    return out


def _plan_slurm(
    paths: Paths, options: dict[str, Any], here: Any, authority: Any
) -> tuple[dict[str, int], str, int]:
    """The scheduler and the keeper of the worker jobs here; each job's directory."""
    from . import slurm

    slurm.check_options(options)
    facts = here.prepare(None, listen=True)
    port = int(facts["port"])
    address = f"tls://{_bracket(here.address)}:{port}"
    python = options.get("python") or facts["python"]
    for file, data in _tls_files(authority, ["worker", "scheduler"]).items():
        here.put(f"tls/{file}", data)
    scheduler = scheduler_process(python, here.root, here.address, port)
    counts = slurm.plan(
        paths, options, python, address, scheduler, _tls_files(authority, ["worker"])
    )
    slurm.test_submit(os.path.join(slurm.job_root(paths, 0), "job.sh"))
    return counts, address, port


def _write_record(
    paths: Paths,
    kind: str,
    options: dict[str, Any],
    address: str,
    port: int,
    first: Any,
    counts: dict[str, int],
    authority: Any,
    admin: str,
) -> Record:
    record = Record(
        name=paths.name,
        kind=kind,
        address=address,
        port=port,
        scheduler_host=first.label,
        hosts=counts,
        credentials=authority.credentials_file(admin),
        created=time.time(),
        options=options,
        version=__version__,
    )
    write_json(paths.record, record.as_dict())
    return record


def scheduler_process(python: str, root: str, host: str, port: int) -> Process:
    argv = [python, "-m", "clustersdk.standing.serve", "scheduler", "--tls", f"{root}/tls"]
    argv += ["--state", root, "--host", host, "--port", str(port)]
    return Process("scheduler", argv)


def worker_process(
    python: str,
    tls: str,
    address: str,
    name: str,
    host: str | None,
    *,
    index: int,
    gpu: str | None = None,
    cpus: str | None = None,
    memory_limit: str | None = None,
) -> Process:
    """The host's ``index``-th slot: its nanny and worker, named ``name``."""
    argv = [python, "-m", "clustersdk.standing.serve", "worker", address, "--tls", tls]
    argv += ["--name", name]
    if host:
        argv += ["--host", host]
    if gpu is not None:
        argv += ["--gpu", gpu]
    if cpus:
        argv += ["--cpus", cpus]  # "off": bound to nothing, its ranks pinned to nothing
    if memory_limit:
        argv += ["--memory-limit", memory_limit]
    return Process(f"worker-{index}", argv)


# --- running it ----------------------------------------------------------------------------------
def _wait_ready(
    record: Record, hosts: list[Any], timeout: float, say: Callable[[str], None]
) -> None:
    """Until the scheduler answers with every worker's slot (or a process is given up)."""
    deadline = time.monotonic() + timeout
    last, checked = "", 0.0
    while time.monotonic() < deadline:
        if time.monotonic() - checked > 2.0:  # a process that keeps failing: say so now
            checked = time.monotonic()
            for h in hosts:
                state = h.state()
                gave_up = [
                    n for n, p in state.get("processes", {}).items() if p.get("state") == "given up"
                ]
                if gave_up:
                    raise StartError(
                        f"{record.name}: on {h.label}, {', '.join(gave_up)} kept failing as it "
                        f"started (its log: clustersdk cluster logs {record.name} {gave_up[0]} "
                        f"--host {h.label})",
                        host=h.label,
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
        f"{record.name}: not every worker answered within {timeout:g} s "
        f"({last or 'the scheduler did not answer'}); see clustersdk cluster logs {record.name}"
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
    back with its journal)."""
    try:
        with _admin(record, timeout=5.0) as cluster:
            for job in cluster.jobs():
                if job.spec.checkpoint_dir and job.status.name in ("RUNNING", "PAUSED"):
                    say(f"{record.name}: suspending job {job.name!r} (a checkpoint first)")
                    with contextlib.suppress(ClusterSDKError):
                        job.suspend(timeout=timeout)
    except ClusterSDKError as e:
        say(f"{record.name}: could not reach the scheduler to suspend its jobs ({e})")


def _record(paths: Paths) -> Record:
    found = read_json(paths.record)
    if found is None:
        raise SpecError(
            f"no standing cluster named {paths.name!r} here ({paths.root} is not one); "
            "clustersdk cluster up NAME starts one"
        )
    return Record.from_dict(found)


def _close(hosts: list[Any]) -> None:
    for h in hosts:
        with contextlib.suppress(Exception):
            h.close()


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


# --- small pieces ---------------------------------------------------------------------------
def _checked(name: str) -> str:
    try:
        return check_name(name)
    except RecordError as e:
        raise SpecError(str(e)) from None


def _gpus() -> int:
    from ..cluster.remote import gpu_count

    return gpu_count()


def _this_host() -> str:
    """The address this host's name resolves to (where compute nodes find it)."""
    import socket

    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))
