"""What ``clustersdk cluster up|down|status`` does on one host of a standing cluster.

On the machine that runs the command, these functions are called in place; on another
host (an SSH cluster's) the command runs them there over SSH, as::

    python -m clustersdk.standing.host prepare ROOT --slots N [--listen ADDRESS]
                                                  # -> {"root", "gpus", "shares", "port"}
    python -m clustersdk.standing.host start ROOT                 # -> {"pid"}
    python -m clustersdk.standing.host stop ROOT [--remove]       # -> {"left": [...]}
    python -m clustersdk.standing.host state ROOT                 # -> {"supervisor", "processes"}

each printing one JSON line. ``ROOT`` is the host's directory of the cluster
(:class:`~.record.HostPaths`); ``~`` in it is the host account's home.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from .record import HostPaths, read_json

STOP_WAIT_S = 40.0  # what a supervisor has to stop its processes (its own grace: 20 s)


def prepare(root: str, slots: int | None = None, listen: str | None = None) -> dict[str, Any]:
    """Make the host's directory (0700, with ``tls/``, ``logs/``, ``run/``); what the host
    has: its GPUs (their ids) and, for the slots it will run (``slots``; default one per
    GPU, else 1), each one's share of its CPUs (None where there are fewer CPUs); with
    ``listen``, a port free on that address now (the scheduler's, where it runs here)."""
    from .. import cpus
    from ..cluster.remote import gpu_count

    paths = HostPaths(_expanded(root))
    for directory in (paths.root, paths.tls, paths.logs, paths.run):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
    gpus = gpu_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = (
        [v.strip() for v in visible.split(",") if v.strip()][:gpus]
        if visible is not None
        else [str(i) for i in range(gpus)]
    )
    count = slots if slots else (len(ids) or 1)
    return {
        "root": paths.root,
        "gpus": ids,
        "shares": cpus.shares(count),
        "python": sys.executable,
        "hostname": os.uname().nodename,
        "port": _free_port(listen) if listen else None,
    }


def start(root: str, python: str | None = None) -> dict[str, Any]:
    """Start the host's supervisor, detached (a session of its own, its output to its
    log), unless it runs already; its pid."""
    paths = HostPaths(_expanded(root))
    running = supervisor_pid(paths)
    if running is not None:
        return {"pid": running, "already": True}
    os.makedirs(paths.logs, mode=0o700, exist_ok=True)
    with open(paths.log("supervisor"), "ab") as log:
        proc = subprocess.Popen(
            [python or sys.executable, "-m", "clustersdk.standing.supervisor", paths.root],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=paths.root,
        )
    return {"pid": proc.pid, "already": False}


def stop(root: str, remove: bool = False, wait: float = STOP_WAIT_S) -> dict[str, Any]:
    """SIGTERM to the host's supervisor (it stops its processes); what is left after
    ``wait`` seconds is killed; with ``remove`` the host's directory goes too. The pids
    still alive after all that (none, normally)."""
    paths = HostPaths(_expanded(root))
    pid = supervisor_pid(paths)
    listed = [
        p.get("pid") for p in ((read_json(paths.status) or {}).get("processes") or {}).values()
    ]
    family = _family(pid) if pid is not None else set()
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.2)
    for child in {*(int(p) for p in listed if p), *family, *([pid] if pid else [])}:
        if alive(child):  # a supervisor killed by hand left its processes: end them
            with contextlib.suppress(OSError):
                os.killpg(child, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
    time.sleep(0.2)
    left = sorted(p for p in family if alive(p))
    if remove:
        import shutil

        shutil.rmtree(paths.root, ignore_errors=True)
    return {"left": left}


def state(root: str, events: int = 20) -> dict[str, Any]:
    """The supervisor (its pid, or None when it does not run), what it says of each
    process, and its newest events."""
    paths = HostPaths(_expanded(root))
    pid = supervisor_pid(paths)
    status = read_json(paths.status) or {}
    return {
        "supervisor": pid,
        "processes": status.get("processes", {}) if pid is not None else {},
        "events": tail_events(paths, events),
    }


def supervisor_pid(paths: HostPaths) -> int | None:
    """The host's supervisor's pid, if it runs."""
    found = read_json(paths.pid_file)
    pid = int(found.get("pid", 0)) if found else 0
    return pid if pid and alive(pid) else None


def tail_events(paths: HostPaths, n: int) -> list[dict[str, Any]]:
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


def _free_port(host: str) -> int:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _expanded(root: str) -> str:
    return os.path.abspath(os.path.expanduser(root))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for every purpose here
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _family(pid: int) -> set[int]:
    try:
        import psutil
    except ImportError:
        return set()
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m clustersdk.standing.host")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("root")
    p.add_argument("--slots", type=int, default=None)
    p.add_argument("--listen", default=None, help="find a free port on this address")
    s = sub.add_parser("start")
    s.add_argument("root")
    s.add_argument("--python", default=None)
    t = sub.add_parser("stop")
    t.add_argument("root")
    t.add_argument("--remove", action="store_true")
    q = sub.add_parser("state")
    q.add_argument("root")
    args = parser.parse_args(argv)
    if args.action == "prepare":
        out = prepare(args.root, args.slots, args.listen)
    elif args.action == "start":
        out = start(args.root, args.python)
    elif args.action == "stop":
        out = stop(args.root, args.remove)
    else:
        out = state(args.root)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
