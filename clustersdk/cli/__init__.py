"""The job commands of ``clustersdk`` on a terminal, as ``sky``, ``det`` or ``ray job`` offer::

    clustersdk jobs [ADDRESS] [--all]          every cluster in the registry without ADDRESS
    clustersdk queue                           who holds which slots, what waits and why
    clustersdk show JOB
    clustersdk pause|checkpoint|suspend JOB [--timeout S]
    clustersdk resume JOB [--world-size N]
    clustersdk stop JOB [--no-wait]
    clustersdk update JOB KEY=VALUE... [--timeout S]     lr=1e-4 lr[1]=1e-5 betas=[0.9,0.95]
    clustersdk restart JOB                     a HELD job: continue from its newest checkpoint
    clustersdk fork JOB [--set lr=1e-4] [--at STEP] [-n N]   a new job from its state
    clustersdk debug JOB [--rank R]            a HELD rank's failing stack with its locals
    clustersdk stacks JOB [--all-threads]      where every rank is now
    clustersdk logs JOB [--rank R] [-f]
    clustersdk history JOB [--csv]
    clustersdk cluster up NAME --local N       a standing cluster: detached, supervised
    clustersdk cluster status|down|logs NAME   how it runs; take it down; a process's log
    clustersdk cluster unit NAME [--out DIR]   systemd units for its processes on this host
    clustersdk cluster kubernetes NAME --image IMAGE [--out FILE]   manifests, its own PKI
    clustersdk cluster add-user NAME [--admin] [--out PATH]   credentials for a TLS cluster
    clustersdk cluster remove-user NAME        revoke them at once
    clustersdk cluster users                   who holds credentials
    clustersdk drain|undrain HOST [--reason R] [--by TIME]   an admin takes a host out
    clustersdk submit [-n N] [options] script.py [-- ARGS]   a script job (every slot without -n)
    clustersdk submit [-n N] [options] -m pkg.train [-- ARGS] (or --command C)
    clustersdk doctor                          pre-flight checks of a running cluster

Every command that talks to a cluster takes ``--cluster NAME|ADDRESS`` (a standing
cluster's name or a scheduler address; default: every cluster in this machine's
registry, or its only one for submit and doctor) and ``--credentials FILE`` (for a
``tls://`` cluster, as ``Cluster.connect`` takes it); most take ``--json``. Exit codes:
0 done, 1 refused or failed (the message on stderr names the job and why), 2 usage.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import re
import sys
from typing import Any

from ..actions import JOB_ACTIONS, WAITING
from ..errors import ClusterSDKError

USAGE = 2
INTERRUPTED = 130


EVERY = "every cluster in the registry"
ONE = "the registry's only cluster"


def cluster_flags(default: str = EVERY) -> argparse.ArgumentParser:
    """The flags that say which cluster a command talks to, and how: a parent parser
    of every such command (``clustersdk doctor`` included)."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--cluster",
        metavar="NAME|ADDRESS",
        help=f"a standing cluster's name or a scheduler address, e.g. tls://10.0.0.5:8786 "
        f"(default: {default})",
    )
    # submit's --address of earlier releases: the same, kept out of the help
    flags.add_argument("--address", dest="cluster", help=argparse.SUPPRESS)
    flags.add_argument(
        "--credentials",
        metavar="FILE",
        help="the credentials file of a tls:// cluster, from `clustersdk cluster add-user` "
        "(default: the registry's, or the clustersdk.credentials setting)",
    )
    return flags


def _common(default: str = EVERY) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False, parents=[cluster_flags(default)])
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    return common


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add the job commands to the ``clustersdk`` parser's subcommands."""
    from . import commands

    common = _common()

    jobs = sub.add_parser("jobs", parents=[common], help="list jobs (of every registered cluster)")
    jobs.add_argument(
        "address", nargs="?", metavar="NAME|ADDRESS", help="the same as --cluster NAME|ADDRESS"
    )
    jobs.add_argument("--all", action="store_true", help="also jobs that have ended")
    jobs.set_defaults(run=commands.jobs)
    queue = sub.add_parser(
        "queue",
        parents=[common],
        help="the queues: who holds which slots, what waits, why, and when it should start",
    )
    queue.set_defaults(run=commands.queue)

    def job_command(name: str, help: str, run) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, parents=[common], help=help)
        parser.add_argument("job", metavar="JOB", help="a job id, or a job name (the newest)")
        parser.set_defaults(run=run)
        return parser

    for verb, help in (
        ("drain", "take a host (or worker) out: its jobs move, it takes no new ranks"),
        ("undrain", "give a drained host (or worker) back"),
    ):
        draining = sub.add_parser(verb, parents=[_common(ONE)], help=help)
        draining.add_argument("target", metavar="HOST", help="a host, or a worker's address")
        if verb == "drain":
            draining.add_argument("--reason", help="why (shown in the jobs' events)")
            draining.add_argument(
                "--by",
                type=_when,
                metavar="TIME",
                help="free it by then (14:00, 2026-12-08T09:30 or +2h): its jobs run on "
                "until clustersdk.notice-grace before it (default: they move now)",
            )
        draining.set_defaults(run=commands.drain)

    job_command("show", "a job's status, progress, ranks, checkpoint and error", commands.show)
    acting = {a.verb: job_command(a.verb, a.help, commands.act) for a in JOB_ACTIONS}
    for verb in WAITING:
        acting[verb].add_argument(
            "--timeout",
            type=_positive(float),
            default=120.0,
            metavar="S",
            help="seconds to wait for the ranks (default: 120)",
        )
    acting["resume"].add_argument(
        "--world-size",
        type=_positive(int),
        metavar="N",
        help="resume a suspended job on N ranks (resharding its checkpoint)",
    )
    stop = acting["stop"]
    stop.add_argument("--no-wait", action="store_true", help="return once the stop is asked")
    stop.add_argument(
        "--timeout",
        type=_positive(float),
        default=None,
        metavar="S",
        help="seconds to wait for the job to stop",
    )
    update = job_command(
        "update", "change hyperparameters on every rank before one step", commands.update
    )
    update.add_argument(
        "changes",
        nargs="+",
        type=_assignment,
        metavar="KEY=VALUE",
        help="e.g. lr=1e-4, lr[1]=1e-5 (param group 1), betas=[0.9,0.95], "
        "warmup=200; values are read as JSON, else as text",
    )
    update.add_argument(
        "--timeout",
        type=_positive(float),
        default=60.0,
        metavar="S",
        help="seconds to wait for the ranks to apply it (default: 60)",
    )
    fork = job_command(
        "fork", "a new job from the job's state (which goes on), with changes", commands.fork
    )
    fork.add_argument("--name", help="the fork's name (default: JOB-forkSTEP)")
    fork.add_argument(
        "--at",
        type=int,
        metavar="STEP",
        help="from its checkpoint that resumes at STEP (default: one taken at its next step)",
    )
    fork.add_argument(
        "--set",
        dest="changes",
        action="append",
        default=[],
        type=_assignment,
        metavar="KEY=VALUE",
        help="a change before the fork's first step, as for update (repeat for more)",
    )
    fork.add_argument(
        "-n", "--world-size", type=_positive(int), metavar="N", help="its ranks (default: the same)"
    )
    fork.add_argument("--checkpoint-dir", help="its checkpoints (default: beside the job's)")
    debug = job_command(
        "debug", "the failing stack of a HELD rank, with its locals", commands.debug
    )
    debug.add_argument(
        "--rank",
        type=int,
        metavar="R",
        help="that held rank (default: the one whose error is the cause)",
    )
    stacks = job_command(
        "stacks", "where every rank is now: its step, phase and stack", commands.stacks
    )
    stacks.add_argument(
        "--all-threads",
        action="store_true",
        help="every thread of each rank's worker, not only the training thread",
    )
    logs = job_command("logs", "what the ranks printed or logged", commands.logs)
    logs.add_argument("--rank", type=int, metavar="R", help="only rank R (default: every rank)")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing new lines until the job ends (exit 1 if it failed)",
    )
    history = job_command("history", "every metric row the ranks logged", commands.history)
    history.add_argument("--csv", action="store_true", help="as CSV")
    from . import deploy, standing, users

    cluster = sub.add_parser(
        "cluster",
        help="standing clusters (up, down, status, logs; under systemd, on Kubernetes) and who "
        "may use them",
    )
    inner = cluster.add_subparsers(dest="action", required=True)
    standing.add_commands(inner)
    users.add_commands(inner, _common("the one TLS cluster this account created"))
    deploy.add_commands(inner)

    from .. import options
    from .flags import add_flags

    submit = sub.add_parser(
        "submit",
        parents=[_common(ONE)],
        help="run a script on N ranks, as torchrun would",
        description="Run `python -u SCRIPT ARGS` (or -m MODULE, or --command C) on N ranks "
        "(-n; default: every slot of the cluster, as %run_distributed does) of a cluster "
        "as a script job (cluster.launch_script); print the job's "
        "name, then with --follow every rank's lines until it ends. The script's "
        "own arguments go after `--`.",
    )
    submit.add_argument(
        "script",
        nargs="?",
        metavar="SCRIPT",
        help="the Python file each rank runs (or give -m / --command)",
    )
    submit.add_argument(
        "script_args", nargs="*", metavar="ARGS", help="the script's arguments (after --)"
    )
    submit.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="print every rank's lines until the job ends (exit 1 if it failed)",
    )
    add_flags(submit, options.SCRIPT, skip=("script",))
    # (its --command flag takes args.command, the subcommand's name elsewhere)
    submit.set_defaults(run=commands.submit, verb="submit")


def run(args: argparse.Namespace) -> int:
    """Run a parsed job command; a refusal or failure is one line on stderr and exit code 1."""
    # Dask's own log lines (connection retries, shutdown) would bury the answer
    logging.getLogger("distributed").setLevel(logging.ERROR)
    try:
        return args.run(args)
    except ClusterSDKError as e:
        print(f"clustersdk {getattr(args, 'verb', None) or args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:  # `clustersdk logs JOB | head`
        return 0


_GROUP = re.compile(r"^([A-Za-z_]\w*)(?:\[(\d+)\])?$")


def _assignment(text: str) -> tuple[str, int | None, Any]:
    """``KEY=VALUE`` (``lr[1]=VALUE``: param group 1) -> ``(key, group, value)``; the
    value as JSON (numbers, lists, booleans), else as the text itself.

    >>> _assignment("lr[1]=1e-4"), _assignment("betas=[0.9, 0.95]"), _assignment("s=cos")
    (('lr', 1, 0.0001), ('betas', None, [0.9, 0.95]), ('s', None, 'cos'))
    """
    key, sep, raw = text.partition("=")
    found = _GROUP.match(key.strip())
    if not sep or not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. lr=1e-4, lr[1]=1e-5)")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return found.group(1), None if found.group(2) is None else int(found.group(2)), value


_IN = re.compile(r"^\+(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _when(text: str, now: datetime.datetime | None = None) -> datetime.datetime:
    """``--by``: a time today (the next one: ``14:00``), a date and time (ISO 8601), or
    how long from now (``+90s``, ``+15m``, ``+2h``, ``+1d``), in this machine's time zone.

    >>> now = datetime.datetime(2026, 12, 7, 15, 0)
    >>> [str(_when(t, now)) for t in ("+2h", "16:30", "09:00", "2026-12-24T08:00")]
    ['2026-12-07 17:00:00', '2026-12-07 16:30:00', '2026-12-08 09:00:00', '2026-12-24 08:00:00']
    """
    now = now or datetime.datetime.now()
    found = _IN.match(text.strip())
    if found:
        return now + datetime.timedelta(seconds=float(found[1]) * _UNIT_S[found[2]])
    try:
        clock = datetime.time.fromisoformat(text)
    except ValueError:
        pass
    else:
        at = datetime.datetime.combine(now.date(), clock)
        return at if at > now else at + datetime.timedelta(days=1)
    try:
        at = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: say 14:00, 2026-12-08T09:30 or +2h (also +90s, +15m, +1d)"
        ) from None
    if at <= now:
        raise argparse.ArgumentTypeError(f"{text!r} is already past")
    return at


def _positive(kind: type) -> type:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value

    parse.__name__ = kind.__name__
    return parse
