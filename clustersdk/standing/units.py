"""systemd units for a standing cluster's processes on this host (``clustersdk cluster unit``).

``clustersdk cluster up`` runs a host's processes under a supervisor of its own, which
nothing starts again after a reboot. :func:`write_units` hands them to systemd
instead: for the host's plan (``host.json``, :class:`~.record.HostPlan`) it writes one
service per process, with the plan's exact command line, and a target that groups
them::

    clustersdk-team.target                  WantedBy=multi-user.target; Wants= each service
    clustersdk-team-scheduler.service       where the scheduler runs on this host
    clustersdk-team-worker-0.service        After= and Wants= the scheduler's service
    clustersdk-team-worker-1.service        ...

systemd is then the supervisor: it restarts a process that ends (after
:data:`RESTART_S`), gives up on one that keeps ending as it starts (the plan's
``max_quick_failures`` starts within ``max_quick_failures * quick_s`` seconds), stops
the workers before the scheduler, and keeps each process's output in the journal
(``journalctl -u clustersdk-team-worker-0``). Restarts are ``Restart=always``, not
``on-failure``: a worker whose scheduler went away closes with exit status 0, and must
come back with it.

:func:`render_units` is pure (a plan in, file names and texts out); the quoting of a
command line for ``ExecStart=`` is :func:`exec_line`.

>>> exec_line(["/usr/bin/python3", "-m", "m", "--memory-limit", "16 GiB", "100%"])
'/usr/bin/python3 -m m --memory-limit "16 GiB" 100%%'
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex

from .. import config
from ..errors import SpecError
from .record import HostPlan, Paths, Record, RecordError, check_name, read_json

__all__ = ["Units", "exec_line", "render_units", "write_units"]

RESTART_S = 2  # systemd's wait before a restart (the supervisor's: 0.5 s, doubling to 10 s)
# what a stopped process has to end before systemd kills its unit's processes: a worker's
# job checkpoints and moves first, within clustersdk.notice-grace (30 s) and a margin
STOP_S = 45
_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")  # a word systemd takes as it is


@dataclasses.dataclass(frozen=True)
class Units:
    """What :func:`write_units` wrote: the files (the target first), the host whose plan
    they run, and the commands that hand the processes over to systemd."""

    files: list[str]
    target: str
    host: str
    commands: list[str]


def exec_line(argv: list[str]) -> str:
    """``argv`` as systemd's ``ExecStart=`` reads it back: a word with a space, a quote
    or a backslash in double quotes (C escapes inside), ``%`` (a specifier) doubled,
    ``$`` (a variable) doubled.

    >>> exec_line(["/bin/echo", "$HOME", "a b"])
    '/bin/echo "$$HOME" "a b"'
    """
    if not argv or not os.path.isabs(argv[0]):
        raise SpecError(f"a unit's command starts with an absolute path, got {argv!r}")
    return " ".join(_word(a) for a in argv)


def _word(arg: str, variables: bool = True) -> str:
    """One word of a unit's setting, quoted as systemd unquotes it (``variables``: it
    expands ``$NAME`` there, as in ``ExecStart=``, unlike ``Environment=``)."""
    text = arg.replace("%", "%%")
    if variables:
        text = text.replace("$", "$$")
    if _PLAIN.match(arg):
        return text
    for raw, escaped in (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\t", "\\t")):
        text = text.replace(raw, escaped)
    return f'"{text}"'


def render_units(
    cluster: str, plan: HostPlan, root: str, *, user: str | None = None, source: str = ""
) -> dict[str, str]:
    """File name -> text of each unit for ``plan`` (the host's directory ``root`` its
    working directory), the target first. ``user``: the account the processes run as
    (``User=``; None: root). ``source``: what the header names as where it came from."""
    _checked(cluster)
    if not plan.processes:
        raise SpecError(f"the plan of cluster {cluster!r} runs no process on this host")
    prefix = f"clustersdk-{cluster}"
    services = {p.name: f"{prefix}-{p.name}.service" for p in plan.processes}
    scheduler = services.get("scheduler")
    header = (
        f"# clustersdk standing cluster {cluster!r}: written by `clustersdk cluster unit "
        f"{cluster}`{f' from {source}' if source else ''}.\n"
    )
    target = f"{prefix}.target"
    units = {
        target: header
        + _section(
            "Unit",
            Description=f"clustersdk standing cluster {cluster}",
            Wants=" ".join(services.values()),
            After="network-online.target",
        )
        + "\n"
        + _section("Install", WantedBy="multi-user.target")
    }
    # the supervisor's give-up, as systemd counts: max_quick_failures starts within the
    # time as many runs of quick_s (and the waits between them) would take
    burst = max(1, plan.max_quick_failures)
    interval = int(burst * (plan.quick_s + RESTART_S))
    for process in plan.processes:
        after = ["network-online.target"]
        if scheduler is not None and process.name != "scheduler":
            after.append(scheduler)
        unit = _section(
            "Unit",
            Description=f"clustersdk standing cluster {cluster}: {process.name}",
            After=" ".join(after),
            Wants=" ".join(after),
            PartOf=target,
            StartLimitIntervalSec=str(interval),
            StartLimitBurst=str(burst),
        )
        service: dict[str, str | list[str] | None] = {
            "Type": "exec",
            "User": user,
            "WorkingDirectory": root.replace("%", "%%"),
            "Environment": [_word(f"{k}={v}", False) for k, v in sorted(process.env.items())],
            "ExecStart": exec_line(process.argv),
            "Restart": "always",
            "RestartSec": str(RESTART_S),
            # SIGTERM to the process alone (its worker's job moves first, then it closes its
            # worker and ranks itself), the rest of the unit's processes killed only if
            # still there after STOP_S
            "KillMode": "mixed",
            "TimeoutStopSec": str(STOP_S),
            "StandardOutput": "journal",
            "StandardError": "journal",
            "SyslogIdentifier": services[process.name].removesuffix(".service"),
        }
        units[services[process.name]] = (
            header
            + unit
            + "\n"
            + _section("Service", **service)
            + "\n"
            + _section("Install", WantedBy=target)
        )
    return units


def _section(name: str, **keys: str | list[str] | None) -> str:
    lines = [f"[{name}]"]
    for key, value in keys.items():
        for one in value if isinstance(value, list) else [value]:
            if one:
                lines.append(f"{key}={one}")
    return "\n".join(lines) + "\n"


def write_units(
    name: str,
    *,
    out: str = ".",
    user: str | None = None,
    host: str | None = None,
    state_dir: str | None = None,
) -> Units:
    """Write the systemd units of the standing cluster ``name``'s processes on this host
    into ``out``: what :func:`render_units` makes of the host's plan. ``host``: which
    host's plan, where this machine has several (hosts sharing a home directory);
    ``user``: the account they run as (default: the owner of the host's directory,
    none for root)."""
    paths = Paths(config.state_dir(state_dir), _checked(name))
    found = read_json(paths.record)
    if found is not None and Record.from_dict(found).kind == "kubernetes":
        raise SpecError(f"cluster {name!r} runs on Kubernetes: it has no processes here")
    label, root = _host(paths, host)
    plan = HostPlan.from_dict(read_json(paths.host(label).plan) or {"cluster": name})
    if user is None:
        user = _owner(root)
    units = render_units(name, plan, root, user=user, source=paths.host(label).plan)
    os.makedirs(out, exist_ok=True)
    files = []
    for file, text in units.items():
        path = os.path.join(os.path.abspath(out), file)
        with open(path, "w") as f:
            f.write(text)
        files.append(path)
    return Units(files, files[0], label, _commands(paths, label, files, plan))


def _host(paths: Paths, wanted: str | None) -> tuple[str, str]:
    """The host (its label, its directory) whose plan this machine runs."""
    hosts_dir = os.path.join(paths.root, "hosts")
    try:
        labels = sorted(h for h in os.listdir(hosts_dir) if os.path.isfile(paths.host(h).plan))
    except OSError:
        labels = []
    if not labels:
        raise SpecError(
            f"no standing cluster named {paths.name!r} runs a process on this machine "
            f"({hosts_dir} holds no host's plan); clustersdk cluster up NAME starts one"
        )
    if wanted is None and len(labels) > 1:
        raise SpecError(
            f"cluster {paths.name!r} has plans for several hosts here ({', '.join(labels)}): "
            "give --host for the one this machine is"
        )
    label = wanted or labels[0]
    if label not in labels:
        raise SpecError(
            f"cluster {paths.name!r} has no plan for host {label!r} here; it has: "
            f"{', '.join(labels)}"
        )
    return label, paths.host(label).root


def _owner(root: str) -> str | None:
    """The name of the account that owns ``root`` (the one whose files the processes
    read), None for root."""
    import pwd

    uid = os.stat(root).st_uid
    if uid == 0:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # an account with no name here: systemd takes the number
        return str(uid)


def _commands(paths: Paths, label: str, files: list[str], plan: HostPlan) -> list[str]:
    """What the admin runs next: the supervisor stopped (it runs the same processes),
    the units installed, the target enabled and started."""
    from .host import supervisor_pid

    commands = []
    host_paths = paths.host(label)
    if supervisor_pid(host_paths) is not None:
        python = plan.processes[0].argv[0]
        commands.append(
            shlex.join([python, "-m", "clustersdk.standing.host", "stop", host_paths.root])
            + "   # its supervisor stops; its keys, journal and logs stay"
        )
    system = "/etc/systemd/system"
    if os.path.dirname(files[0]) != system:
        commands.append(f"sudo cp {' '.join(shlex.quote(f) for f in files)} {system}/")
    commands.append("sudo systemctl daemon-reload")
    commands.append(f"sudo systemctl enable --now {os.path.basename(files[0])}")
    return commands


def _checked(name: str) -> str:
    try:
        return check_name(name)
    except RecordError as e:
        raise SpecError(str(e)) from None
