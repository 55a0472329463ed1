"""IPython magics: ``%load_ext clustersdk``.

::

    %cluster local -n 2                 start a local cluster and show it
    %cluster connect tls://10.0.0.5:8786 --credentials ~/me.pem
    %cluster ssh node1 node2 --gpus-per-host 8
    %cluster slurm --gpus-per-worker 1 --partition gpu
    %cluster doctor                     pre-flight checks of the current cluster
    %%distributed -n 2 --strategy ddp   run the cell on 2 ranks, ``ctx`` bound
    %run_distributed -n 2 train.py --lr 1e-3     a script on 2 ranks, as torchrun would
    %run_distributed -n 2 -m pkg.train --lr 1e-3
    %%torchrun -n 2 [ARGS]              the cell as a script on 2 ranks (torchrun's env)
    %jobs                               the cluster's jobs
    %job pause NAME                     pause | resume | checkpoint | suspend | stop | show | logs
    %job debug NAME RANK                a held rank's failing stack with its locals (%debug-like)
    %job console NAME                   the console of a breakpoint's pdb session
    %%job run NAME [--ranks 0,1]        run the cell on the job's ranks, ``ctx`` bound (job.run)
    %job update NAME lr=1e-4 warmup=50  change hyperparameters at one step (job.update)
    %job fork NAME lr=5e-4              a new job from its state, which goes on (job.fork)

Each takes ``--help``. They parse, call the public API and display; a mistake
is one line (``UsageError``), never a traceback from inside clustersdk.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import tempfile
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import (
    MagicHelpFormatter,
    argument,
    argument_group,
    magic_arguments,
    parse_argstring,
)

import clustersdk as cs

from . import options
from .actions import VERBS
from .cells import (  # noqa: F401 - cell_function, RemoteFailure: also imported from here
    RemoteFailure,
    RemoteRunFailure,
    cell_function,
    one_line,
    stream,
)
from .cli.flags import flag, flag_names
from .widgets import render, source


class _PlainHelp(MagicHelpFormatter):
    """IPython's help format without its docstring markup ("::" before the usage)."""

    def add_usage(self, usage: Any, actions: Any, groups: Any, prefix: str | None = None) -> None:
        super().add_usage(usage, actions, groups, prefix="usage: %")


def _help(magic: Any, args: Any) -> bool:
    if args.help:
        parser = magic.parser
        saved, parser.formatter_class = parser.formatter_class, _PlainHelp
        try:
            print(parser.format_help().rstrip())
        finally:
            parser.formatter_class = saved
    return bool(args.help)


# --- %%distributed's launch flags ------------------------------------------------------------
# One per launch option of a function job a command line can spell (clustersdk.cli.flags).
FLAGS: tuple[str, ...] = flag_names(options.FUNCTION)
# ... and of a script job (%run_distributed, %%torchrun), but the script: it is positional
SCRIPT_FLAGS: tuple[str, ...] = tuple(n for n in flag_names(options.SCRIPT) if n != "script")


def launch_flags(magic: Any, kind: str = options.FUNCTION, skip: tuple[str, ...] = ()) -> Any:
    """Give ``magic`` (under ``@magic_arguments()``) the launch flags of a job of ``kind``,
    one group per option group, after its own flags in ``--help``."""
    decorators: list[Any] = []  # in the order --help shows them
    for group, (what, _) in options.GROUPS.items():
        flags = [
            flag(o)
            for o in options.OPTIONS
            if o.group == group and kind in o.kinds and o.name not in skip
        ]
        given = [f for f in flags if f is not None]
        if given:
            decorators.append(argument_group(f"{group} ({what})"))
            decorators.extend(argument(*names, **kwargs) for names, kwargs in given)
    for decorator in reversed(decorators):  # the nearest decorator comes first, like @...
        magic = decorator(magic)
    return magic


def _script_flags(magic: Any) -> Any:
    return launch_flags(magic, options.SCRIPT, skip=("script",))


@magics_class
class ClusterMagics(Magics):
    """``%cluster``, ``%%distributed``, ``%jobs`` and ``%job``."""

    def __init__(self, shell: Any):
        super().__init__(shell)
        self.current: cs.Cluster | None = None  # the last one %cluster made
        self._made_local = False

    # %cluster ------------------------------------------------------------------------
    @line_magic("cluster")
    @magic_arguments()
    @argument(
        "mode",
        nargs="?",
        help="local | connect | ssh | slurm | doctor | close (none: show the current cluster)",
    )
    @argument("targets", nargs="*", help="connect: the scheduler address; ssh: the hosts")
    @argument(
        "-n",
        "--workers",
        type=int,
        default=None,
        help="local: worker slots (default: one per GPU, or 2 without a GPU); slurm: "
        "workers to start now (default: as launches need them)",
    )
    @argument("--gpus-per-host", type=int, default=None, help="ssh: GPUs (workers) per host")
    @argument("--slots-per-host", type=int, default=None, help="ssh: CPU slots per GPU-less host")
    @argument("--user", default=None, help="ssh: the login name")
    @argument("--key-file", default=None, help="ssh: the private key")
    @argument("--known-hosts", default=None, help="ssh: host keys (default ~/.ssh/known_hosts)")
    @argument("--python", default=None, help="ssh, slurm: the workers' python")
    @argument("--gpus-per-worker", type=int, default=None, help="slurm: --gres=gpu:N per worker")
    @argument("--partition", default=None, help="slurm: the partition (queue)")
    @argument("--checkpoint-dir", default=None, help="doctor: check free space and writes here")
    @argument("--no-bandwidth", action="store_true", help="doctor: skip the all-reduce sweep")
    @argument("--state-dir", default=None, help="where job records live (default: ~/.clustersdk)")
    @argument(
        "--credentials",
        default=None,
        help="connect: your credentials file for a tls:// scheduler (cluster.add_user's)",
    )
    @argument(
        "--no-tls",
        action="store_true",
        help="local, ssh, slurm: plain tcp://, no identities (security=False; warned)",
    )
    @argument("-h", "--help", action="store_true", help="show this help")
    def cluster(self, line: str = "") -> Any:
        """Start, connect to, show or close the cluster the other magics use."""
        args = parse_argstring(self.cluster, line)
        if _help(self.cluster, args):
            return None
        mode = args.mode
        if mode is None:
            return self._current(None)
        if mode == "doctor":
            with one_line():
                return self._current(None).doctor(
                    checkpoint_dir=args.checkpoint_dir, bandwidth=not args.no_bandwidth
                )
        if mode == "close":
            cluster = self._current(None)
            cluster.close()
            self.current = None
            print(f"closed {cluster!r}")
            return None
        options = {} if args.state_dir is None else {"state_dir": args.state_dir}
        if args.no_tls:
            if mode == "connect":
                raise UsageError(
                    "--no-tls is for clusters this starts (local, ssh, slurm); "
                    "connect follows the address's scheme"
                )
            options["security"] = False
        if args.credentials is not None:
            if mode != "connect":
                raise UsageError(
                    "--credentials is for %cluster connect; a cluster this starts "
                    "makes its own (you are its admin)"
                )
            options["credentials"] = args.credentials
        with one_line():
            if mode == "local":
                if args.targets:
                    raise UsageError(
                        f"%cluster local takes no hosts or addresses, got {' '.join(args.targets)}"
                    )
                cluster = cs.Cluster.local(workers=args.workers, **options)
            elif mode == "connect":
                if len(args.targets) != 1:
                    raise UsageError(
                        "%cluster connect needs one scheduler address, e.g. "
                        "%cluster connect tls://10.0.0.5:8786 --credentials me.pem"
                    )
                cluster = _connect(args.targets[0], options)
            elif mode == "ssh":
                if not args.targets:
                    raise UsageError(
                        "%cluster ssh needs at least one host, e.g. %cluster ssh node1 node2"
                    )
                cluster = cs.Cluster.ssh(
                    args.targets,
                    **options,
                    **_given(
                        args,
                        "gpus_per_host",
                        "slots_per_host",
                        "user",
                        "key_file",
                        "known_hosts",
                        "python",
                    ),
                )
            elif mode == "slurm":
                cluster = cs.Cluster.slurm(
                    **options,
                    **_given(args, "gpus_per_worker", "partition", "python"),
                    **({"workers": args.workers} if args.workers is not None else {}),
                )
            else:
                raise UsageError(
                    f"unknown mode {mode!r}: use local, connect, ssh, slurm, doctor "
                    "or close (%cluster --help)"
                )
        self._replace(cluster, local=mode == "local")
        return cluster

    def _replace(self, cluster: cs.Cluster, local: bool) -> None:
        old, old_local = self.current, self._made_local
        self.current, self._made_local = cluster, local
        if old is not None and old_local and not old.closed:
            old.close()  # re-running the cell must not leave a second local cluster behind
            print(f"(closed the previous local cluster {old.kind})")

    def _current(self, name: str | None) -> cs.Cluster:
        """The cluster to act on: ``--cluster NAME``, the last ``%cluster``, or the only one around."""
        if name is not None:
            found = self.shell.user_ns.get(name)
            if not isinstance(found, cs.Cluster):
                raise UsageError(f"--cluster {name}: no Cluster called {name!r} in the namespace")
            return found
        if self.current is not None and not self.current.closed:
            return self.current
        clusters = {
            k: v
            for k, v in self.shell.user_ns.items()
            if isinstance(v, cs.Cluster) and not v.closed and not k.startswith("_")
        }
        if len(set(map(id, clusters.values()))) == 1:
            return next(iter(clusters.values()))
        if not clusters:
            raise UsageError(
                "no cluster yet: start one with %cluster local (or cs.Cluster.local())"
            )
        raise UsageError(
            f"several clusters in the namespace ({', '.join(sorted(clusters))}): "
            "pick one with --cluster NAME"
        )

    # %%distributed ------------------------------------------------------------------------
    @cell_magic("distributed")
    @magic_arguments()
    @argument(
        "--no-wait",
        action="store_true",
        help="return the job at once and show its dashboard instead of streaming output",
    )
    @argument("--cluster", default=None, help="the Cluster variable to run on")
    @argument("-h", "--help", action="store_true", help="show this help")
    @launch_flags
    def distributed(self, line: str, cell: str | None = None) -> Any:
        """Run the cell as a training function on N ranks, with ctx bound.

        Each rank's output is printed as it comes, labelled by rank; what rank 0
        returns is the cell's value. Interrupting the kernel stops the job.
        """
        args = parse_argstring(self.distributed, line)
        if _help(self.distributed, args):
            return None
        cluster = self._current(args.cluster)
        fn = cell_function(cell or "", self.shell.user_ns)
        chosen = {
            name: getattr(args, name) for name in FLAGS if getattr(args, name) is not None
        }  # the others: launch's defaults
        chosen.setdefault("world_size", len(cluster.slots()))
        with one_line():
            job = cluster.launch(fn, **chosen)
        if args.no_wait:
            return job
        return stream(job)

    # %run_distributed, %%torchrun: script jobs -------------------------------------------------
    @line_magic("run_distributed")
    @magic_arguments()
    @argument("script", nargs="?", help="the Python file each rank runs (or -m MODULE)")
    @argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")
    @argument(
        "--no-wait",
        action="store_true",
        help="return the job at once and show its dashboard instead of streaming output",
    )
    @argument("--cluster", default=None, help="the Cluster variable to run on")
    @argument("-h", "--help", action="store_true", help="show this help")
    @_script_flags
    def run_distributed(self, line: str = "") -> Any:
        """Run a script on N ranks as torchrun would (``cluster.launch_script``): each
        rank's output is printed as it comes, labelled by rank."""
        args = parse_argstring(self.run_distributed, line)
        if _help(self.run_distributed, args):
            return None
        script, rest = args.script, list(args.script_args or ())
        if script is not None and (args.module or args.command):  # -m M ARGS: all arguments
            script, rest = None, [script, *rest]
        return self._launch_script(args, script, rest)

    @cell_magic("torchrun")
    @magic_arguments()
    @argument("script_args", nargs=argparse.REMAINDER, help="the cell's sys.argv[1:]")
    @argument(
        "--no-wait",
        action="store_true",
        help="return the job at once and show its dashboard instead of streaming output",
    )
    @argument("--cluster", default=None, help="the Cluster variable to run on")
    @argument("-h", "--help", action="store_true", help="show this help")
    @_script_flags
    def torchrun(self, line: str, cell: str | None = None) -> Any:
        """Run the cell as a script on N ranks, as ``torchrun --nproc-per-node N cell.py``
        would: each rank runs it in a process of its own, with torchrun's environment."""
        args = parse_argstring(self.torchrun, line)
        if _help(self.torchrun, args):
            return None
        if args.module or args.command:
            raise UsageError("%%torchrun runs the cell: -m and --command are %run_distributed's")
        folder = tempfile.mkdtemp(prefix="clustersdk-cell-")
        path = os.path.join(folder, "cell.py")
        with open(path, "w") as f:
            f.write(cell or "")
        try:
            return self._launch_script(args, path, list(args.script_args or ()))
        finally:  # shipped with the job at launch: the file is no longer needed
            shutil.rmtree(folder, ignore_errors=True)

    def _launch_script(self, args: Any, script: str | None, rest: list[str]) -> Any:
        cluster = self._current(args.cluster)
        chosen = {
            name: getattr(args, name)
            for name in SCRIPT_FLAGS
            if getattr(args, name, None) is not None
        }
        chosen.setdefault("world_size", len(cluster.slots()))
        with one_line():
            job = cluster.launch_script(script, rest, **chosen)
        if args.no_wait:
            return job
        return stream(job)

    # %jobs, %job ------------------------------------------------------------------------------
    @line_magic("jobs")
    @magic_arguments()
    @argument("--cluster", default=None, help="the Cluster variable to list")
    @argument("-h", "--help", action="store_true", help="show this help")
    def jobs(self, line: str = "") -> Any:
        """The jobs the cluster's scheduler has run or runs, oldest first."""
        args = parse_argstring(self.jobs, line)
        if _help(self.jobs, args):
            return None
        return render.JobsTable(source.job_records(self._current(args.cluster)))

    @line_magic("queue")
    @magic_arguments()
    @argument("--cluster", default=None, help="the Cluster variable whose queues to show")
    @argument("-h", "--help", action="store_true", help="show this help")
    def queue(self, line: str = "") -> Any:
        """The queues: who holds what, what waits and why, estimated starts."""
        args = parse_argstring(self.queue, line)
        if _help(self.queue, args):
            return None
        return self._current(args.cluster).queue()

    @line_cell_magic("job")
    @magic_arguments()
    @argument(
        "action",
        nargs="?",
        help=" | ".join(VERBS) + " (restart: a HELD job, from its checkpoint) | show | logs | "
        "run | update | fork (a new job from its state) | debug | console | stacks (where every "
        "rank is now) | history (every metric row)",
    )
    @argument("name", nargs="?", help="the job's name (see %%jobs)")
    @argument(
        "rest",
        nargs="*",
        metavar="RANK | KEY=VALUE",
        help="debug: the held rank (default: the one whose error is the cause); "
        "update, fork: KEY=VALUE ... (e.g. lr=1e-4 warmup=50)",
    )
    @argument("--world-size", type=int, default=None, help="resume, fork: on this many ranks")
    @argument("--rank", type=int, default=0, help="logs: whose output (default 0)")
    @argument("--ranks", default=None, help="run: the ranks, e.g. 0,1 (default: every rank)")
    @argument(
        "--timeout",
        type=float,
        default=60.0,
        help="run, update: seconds to wait for the ranks (default 60)",
    )
    @argument("--cluster", default=None, help="the Cluster variable the job runs on")
    @argument("-h", "--help", action="store_true", help="show this help")
    def job(self, line: str = "", cell: str | None = None) -> Any:
        """Act on a job by name (show: display its dashboard; logs: print a rank's output;
        debug: print a held rank's failing frames with their locals; console: the pdb
        console of a breakpoint).

        ``%%job run NAME`` runs the cell on the job's ranks, in their training threads,
        with ``ctx`` bound (the cell's last expression is each rank's result); ``%job
        update NAME lr=1e-4`` changes hyperparameters at one step boundary.
        """
        args = parse_argstring(self.job, line)
        if _help(self.job, args):
            return None
        actions = (
            *VERBS,
            *("show", "logs", "run", "update", "fork", "debug", "console", "stacks", "history"),
        )
        if args.action not in actions or not args.name:
            raise UsageError(
                f"usage: %job {{{'|'.join(actions)}}} NAME (got {line.strip()!r}; %job --help)"
            )
        cluster = self._current(args.cluster)
        known = [r["name"] for r in source.job_records(cluster)]
        if args.name not in known:
            raise UsageError(
                f"no job named {args.name!r} on this cluster; known jobs: "
                f"{', '.join(dict.fromkeys(reversed(known))) or 'none'}"
            )
        if (args.action == "run") != (cell is not None):
            raise UsageError(
                "%%job run NAME takes the code as a cell; the other actions are "
                "line magics (%job ACTION NAME)"
            )
        rank = _held_rank(args) if args.action == "debug" else None
        if args.rest and args.action not in ("update", "fork", "debug"):
            raise UsageError(
                f"%job {args.action} NAME takes nothing after the name (got {' '.join(args.rest)})"
            )
        with one_line():
            job = cs.Job.attach(cluster, args.name)
            if args.action == "run":
                return self._run_cell(job, cell or "", args)
            if args.action == "show":
                return job
            if args.action == "logs":
                print(job.logs(args.rank), end="")
                return None
            if args.action == "debug":  # like %debug: the failing frames, to read
                print(job.debug(rank))
                return None
            if args.action == "console":
                return job.console()
            if args.action == "restart":
                print(f"job {job.name!r}: now {job.restart()}")
                return None
            if args.action == "stacks":
                found = job.stacks()
                print("\n\n".join(found.values()) or f"job {job.name!r}: no rank is running")
                return None
            if args.action == "history":
                return job.history()
            if args.action == "fork":  # the fork, shown as its dashboard
                changes = _changes(args.rest, "fork") if args.rest else None
                return job.fork(hparams=changes, world_size=args.world_size)
            if not callable(getattr(job, args.action, None)):
                raise UsageError(f"this clustersdk has no Job.{args.action}() yet")
            if args.action == "update":
                result = job.update(_changes(args.rest, "update"), timeout=args.timeout)
            elif args.action == "resume":
                result = job.resume(world_size=args.world_size)
            elif args.action == "stop":
                result = job.stop()  # waits for the step boundary: then the job is over
            else:
                result = getattr(job, args.action)()
        print(f"job {job.name!r}: {_said(args.action, result)}")
        return None

    def _run_cell(self, job: cs.Job, cell: str, args: Any) -> dict[int, Any]:
        fn = cell_function(cell, self.shell.user_ns, returns_last=True)
        try:
            ranks = None if args.ranks is None else [int(r) for r in args.ranks.split(",") if r]
        except ValueError:
            raise UsageError(f"--ranks takes rank numbers like 0,2, got {args.ranks!r}") from None
        try:
            return job.run(fn, ranks=ranks, timeout=args.timeout)
        except cs.RunError as e:
            raise RemoteRunFailure(e) from None


def _held_rank(args: Any) -> int | None:
    """``%job debug NAME [RANK]``: the rank, or None for the one whose error is the cause."""
    if not args.rest:
        return None
    if len(args.rest) > 1 or not args.rest[0].isdigit():
        raise UsageError(
            f"%job debug NAME [RANK] takes one rank number, got {' '.join(args.rest)!r}"
        )
    return int(args.rest[0])


def _changes(items: list[str], verb: str) -> dict[str, Any]:
    """``["lr=1e-4", "schedule=cosine"]`` -> ``{"lr": 0.0001, "schedule": "cosine"}``: values
    are Python literals (numbers, tuples, dicts), else strings."""
    if not items:
        raise UsageError(f"%job {verb} NAME needs changes, e.g. %job {verb} NAME lr=1e-4")
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"%job {verb}: {item!r} is not KEY=VALUE (e.g. lr=1e-4)")
        try:
            out[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[key] = text
    return out


def _given(args: Any, *names: str) -> dict[str, Any]:
    """The options the user gave on the line (the others keep the API's defaults)."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _connect(target: str, options: dict[str, Any]) -> cs.Cluster:
    try:
        return cs.Cluster.connect(target, **options)
    except OSError as e:  # refused, timed out, bad address: the user's to fix, in one line
        raise UsageError(f"could not connect to {target!r}: {e}") from None


def _said(action: str, result: Any) -> str:
    return {
        "pause": f"paused before step {result}",
        "resume": f"resumed ({result})",
        "checkpoint": f"checkpoint saved at {result}",
        "suspend": f"suspended; checkpoint {result}",
        "stop": f"now {result}",
        "update": f"updated before step {result}"
        if result is not None
        else "update kept; the job applies it when it runs again",
    }.get(action, str(result))


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics (``%load_ext clustersdk``); loading twice is harmless."""
    ipython.register_magics(ClusterMagics)
