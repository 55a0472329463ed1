"""``clustersdk cluster up | down | status | logs NAME``: a cluster a team keeps running.

::

    clustersdk cluster up team --local 2          start it (or report it, if it runs)
    clustersdk cluster up team --ssh a b c        ...on hosts over SSH
    clustersdk cluster up team --slurm 4          ...its workers as Slurm jobs
    clustersdk cluster status team [--json]       each process, its restarts; slots, jobs
    clustersdk cluster logs team [PROCESS] [-n N] scheduler, worker-0, supervisor...
    clustersdk cluster down team [--now] [--keep-state]

The verbs call :mod:`clustersdk.standing`; they print what it says and exit 0, or 1
with the reason on stderr.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import Any

from . import render

OK = 0


def up(args: argparse.Namespace) -> int:
    from .. import standing

    ssh_options = {
        k: getattr(args, k)
        for k in (
            "user",
            "port",
            "key_file",
            "known_hosts",
            "accept_new_hosts",
            "jump_host",
            "python",
            "connect_timeout",
            "remote_dir",
        )
        if getattr(args, k) not in (None, False)
    }
    slurm_options = {
        "gpus_per_job": args.gpus_per_job,
        "cpus_per_job": args.cpus_per_job,
        "memory": args.memory,
        "partition": args.partition,
        "account": args.account,
        "walltime": args.walltime,
        "sbatch_options": args.sbatch_option or [],
        "python": args.python,
    }
    record = standing.up(
        args.name,
        local=args.local,
        ssh=args.ssh,
        slurm=args.slurm,
        slurm_options=slurm_options,
        host=args.host,
        slots_per_host=args.slots_per_host,
        ssh_options=ssh_options,
        bind_cpus=False if args.no_bind_cpus else None,
        memory_limit=args.memory_limit,
        timeout=args.timeout,
        say=_say,
    )
    if args.json:
        print(render.to_json(record.as_dict()))
    else:
        print(
            f"{record.name}: {record.workers} worker(s) at {record.address}\n"
            f"admin credentials: {record.credentials}\n"
            f"connect: Cluster.connect({record.name!r}) on this account, or "
            f"Cluster.connect({record.address!r}, credentials=...) with a file from "
            f"`clustersdk cluster add-user PERSON --cluster {record.name}`"
        )
    return OK


def down(args: argparse.Namespace) -> int:
    from .. import standing

    standing.down(args.name, now=args.now, keep_state=args.keep_state, say=_say)
    return OK


def status(args: argparse.Namespace) -> int:
    from .. import standing

    found = standing.status(args.name)
    if args.json:
        print(render.to_json(found))
    else:
        print(status_text(found))
    supervised = all(h.get("supervisor") for h in found["hosts"].values())
    return OK if supervised and found["reachable"] else 1


def logs(args: argparse.Namespace) -> int:
    from .. import standing

    sys.stdout.write(standing.logs(args.name, args.process, args.lines, host=args.host))
    return OK


def status_text(found: dict[str, Any]) -> str:
    """``clustersdk cluster status``'s text: the cluster, its processes, its slots and
    jobs, its restarts."""
    record = found["record"]
    head = (
        f"{record['name']} ({record['kind']}, {len(found['hosts'])} host(s)) at "
        f"{record['address']}, up since {_when(record['created'])}"
    )
    lines = [head, f"admin credentials: {record['credentials']}"]
    rows = []
    for host, seen in found["hosts"].items():
        if not seen.get("supervisor"):
            rows.append([host, "supervisor", "NOT RUNNING", "-", "-", seen.get("error", "")])
        for name, p in (seen.get("processes") or {}).items():
            rows.append(
                [
                    host,
                    name,
                    p.get("state", "?"),
                    str(p.get("pid") or "-"),
                    str(p.get("restarts", 0)),
                    p.get("last") or "",
                ]
            )
    if rows:
        lines.append(
            render.table(rows, ["HOST", "PROCESS", "STATE", "PID", "RESTARTS", "LAST EXIT"])
        )
    if found["reachable"]:
        slots = found.get("slots") or []
        busy = sum(1 for s in slots if s.get("job"))
        jobs = found.get("jobs") or []
        running = [j for j in jobs if j["status"] not in ("FINISHED", "FAILED", "STOPPED")]
        lines.append(f"{len(slots)} slot(s), {busy} busy; {len(running)} job(s) not finished")
        for event in (found.get("cluster_events") or [])[-5:]:
            lines.append(f"  {_when(event['time'])} {event['message']}")
    else:
        lines.append(f"the scheduler does not answer: {found.get('error', '')}")
    return "\n".join(lines)


def add_commands(inner: argparse._SubParsersAction) -> None:
    """The verbs of a standing cluster under ``clustersdk cluster``."""
    start = inner.add_parser(
        "up",
        help="start a standing cluster (detached, supervised; or report it if it runs)",
        description="Start a standing cluster: a scheduler with clustersdk's control plane "
        "and workers, under a supervisor that restarts them, detached from this command. "
        "It returns once every worker answers, printing the address and the admin's "
        "credentials. Again with the same name: reports the running cluster.",
    )
    start.add_argument("name", help="the cluster's name (lower-case letters, digits, - and _)")
    where = start.add_mutually_exclusive_group()
    where.add_argument(
        "--local",
        type=int,
        metavar="N",
        help="N workers on this host (the default, with one per GPU, else 2)",
    )
    where.add_argument(
        "--ssh",
        nargs="+",
        metavar="HOST",
        help="run it on these hosts over SSH ([user@]host[:port]): the scheduler on the first, "
        "a worker per GPU (or --slots-per-host CPU slots) on each",
    )
    where.add_argument(
        "--slurm",
        type=int,
        metavar="N",
        help="the scheduler here and N Slurm jobs of workers (one per GPU each job is given), "
        "kept in the queue",
    )
    start.add_argument(
        "--host",
        default=None,
        help="the address the scheduler listens on (--local: and the workers; default "
        "127.0.0.1; --slurm: this host name's address)",
    )
    ssh = start.add_argument_group("over SSH (as Cluster.ssh takes them)")
    ssh.add_argument("--slots-per-host", type=int, metavar="N", help="CPU slots per GPU-less host")
    ssh.add_argument("--user", help="the SSH user (default: yours)")
    ssh.add_argument("--port", type=int, help="the SSH port (default: 22)")
    ssh.add_argument("--key-file", help="a private key file")
    ssh.add_argument("--known-hosts", help="the known_hosts file (default: ~/.ssh/known_hosts)")
    ssh.add_argument(
        "--accept-new-hosts", action="store_true", help="add unknown host keys (never changed ones)"
    )
    ssh.add_argument("--jump-host", help="a bastion, [user@]host[:port]")
    ssh.add_argument("--python", help="the hosts' Python, with clustersdk (default: python3)")
    ssh.add_argument("--connect-timeout", type=float, help="seconds per SSH handshake (10)")
    ssh.add_argument(
        "--remote-dir", help="the state directory on the hosts (default: ~/.clustersdk)"
    )
    slurm = start.add_argument_group("under Slurm (each worker job's #SBATCH options)")
    slurm.add_argument(
        "--gpus-per-job", type=int, default=1, metavar="G", help="--gres=gpu:G (1; 0: CPU jobs)"
    )
    slurm.add_argument("--cpus-per-job", type=int, default=1, metavar="C", help="CPUs (1)")
    slurm.add_argument("--memory", metavar="SIZE", help="--mem, e.g. 32GiB")
    slurm.add_argument("--partition", help="the partition (default: Slurm's)")
    slurm.add_argument("--account", help="the account to charge")
    slurm.add_argument(
        "--walltime", help="--time of each job (default: the partition's; it is resubmitted)"
    )
    slurm.add_argument(
        "--sbatch-option",
        action="append",
        metavar="OPTION",
        help="one more #SBATCH line, e.g. --sbatch-option=--qos=long (repeatable)",
    )
    start.add_argument("--memory-limit", metavar="SIZE", help="each worker's, e.g. '16 GiB'")
    start.add_argument(
        "--no-bind-cpus", action="store_true", help="no worker bound to a share of the cores"
    )
    start.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for every worker (120)"
    )
    start.add_argument("--json", action="store_true", help="print the record as JSON")
    start.set_defaults(run=up, verb="cluster up")

    stop = inner.add_parser(
        "down",
        help="stop a standing cluster (its jobs with a checkpoint_dir suspended first)",
    )
    stop.add_argument("name")
    stop.add_argument("--now", action="store_true", help="do not suspend its jobs first")
    stop.add_argument(
        "--keep-state",
        action="store_true",
        help="keep its journal, keys and logs: `up NAME` brings it back as it was "
        "(same address, same people, its suspended jobs)",
    )
    stop.set_defaults(run=down, verb="cluster down")

    state = inner.add_parser(
        "status", help="a standing cluster's processes, restarts, slots and jobs (exit 1: down)"
    )
    state.add_argument("name")
    state.add_argument("--json", action="store_true", help="as JSON")
    state.set_defaults(run=status, verb="cluster status")

    tail = inner.add_parser("logs", help="the tail of a standing cluster's process's log")
    tail.add_argument("name")
    tail.add_argument(
        "process", nargs="?", default="scheduler", help="scheduler (default), worker-N, supervisor"
    )
    tail.add_argument("-n", "--lines", type=int, default=50, help="how many lines (50)")
    tail.add_argument("--host", help="the host whose process it is (default: the scheduler's)")
    tail.set_defaults(run=logs, verb="cluster logs")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
