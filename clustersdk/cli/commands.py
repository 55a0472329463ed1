"""What each job command does, through the public ``Cluster`` and ``Job`` API only.

A command looks at the cluster named by ``--cluster NAME|ADDRESS`` (a standing
cluster's name, or a scheduler address), or else at every cluster in this
machine's registry (the clusters the SDK here created or connected to, as the
Jupyter server extension finds them); ``--credentials FILE`` is the file a
``tls://`` cluster wants, as ``Cluster.connect(address, credentials=...)`` takes it
(default: the registry's, or the ``clustersdk.credentials`` setting). A job is named by its
id or its name (the newest job of that name, on whichever cluster has it).
Each command returns its exit code: 0 done, 1 refused or failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from .. import registry
from ..errors import ClusterSDKError, JobNotFoundError, SpecError
from ..hparams import describe
from ..status import JobStatus
from . import render

if TYPE_CHECKING:
    from ..cluster.base import Cluster
    from ..job import Job

OK, FAILED = 0, 1
CONNECT_TIMEOUT = 5.0  # seconds per cluster: a stale registry entry must not hang the CLI
FOLLOW_EVERY = 0.25  # seconds between reads of new log lines with logs -f


def address(target: str | None) -> str | None:
    """The scheduler address ``--cluster`` names (a standing cluster's name in this
    account's registry, or an address already); None when it names none.

    >>> address("tls://10.0.0.5:8786")
    'tls://10.0.0.5:8786'
    """
    if target is None:
        return None
    try:
        return registry.resolve(target)
    except KeyError as e:
        raise SpecError(str(e.args[0])) from None


def connect(where: str, credentials: str | None = None) -> Cluster:
    """The cluster at ``where`` (a name or an address), connected with ``credentials``
    (a file for a ``tls://`` cluster; None: the registry's, or the setting's)."""
    from ..cluster.base import Cluster

    return Cluster.connect(where, timeout=CONNECT_TIMEOUT, credentials=credentials)


class Clusters:
    """The clusters a command looks at, connected for the command's duration: the one
    ``--cluster`` names, or every cluster of the registry.

    >>> with Clusters(None) as clusters:          # doctest: +SKIP
    ...     [c.scheduler_address for c in clusters]
    """

    def __init__(self, target: str | None, credentials: str | None = None):
        self.address = address(target)
        self.credentials = credentials
        self.connected: list[Cluster] = []
        self.unreachable: list[tuple[str, str]] = []  # (address, why)
        self._stack = ExitStack()

    @classmethod
    def of(cls, args: argparse.Namespace) -> Clusters:
        """The clusters of a command's ``--cluster`` and ``--credentials``."""
        return cls(args.cluster, args.credentials)

    def __enter__(self) -> Clusters:
        if self.address is not None:  # named: failing to reach it fails the command
            self.connected.append(
                self._stack.enter_context(connect(self.address, self.credentials))
            )
            return self
        for entry in registry.entries():
            where = entry["address"]
            # --credentials without --cluster: for the registry's tls:// clusters
            mine = self.credentials if where.startswith("tls://") else None
            try:
                cluster = connect(where, mine)
            except ClusterSDKError as e:
                self.unreachable.append((where, str(e)))
                continue
            self.connected.append(self._stack.enter_context(cluster))
        return self

    def one(self, what: str) -> Cluster:
        """The one cluster a command that starts something (``what``) acts on: the one
        ``--cluster`` names, or the registry's only one."""
        if len(self.connected) == 1:
            return self.connected[0]
        self.warn_unreachable()
        found = (
            f"the registry has {len(self.connected)}: "
            + ", ".join(c.scheduler_address for c in self.connected)
            if self.connected
            else "none in the registry is reachable"
        )
        raise SpecError(f"{what} needs one cluster: give --cluster NAME|ADDRESS ({found})")

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def __iter__(self) -> Iterator[Cluster]:
        return iter(self.connected)

    def where(self) -> str:
        if self.address is not None:
            return f"the cluster at {self.address}"
        return (
            f"any of the {len(self.connected)} cluster(s) in the registry"
            if self.connected
            else "any cluster (none is in the registry: give --cluster NAME|ADDRESS)"
        )

    def warn_unreachable(self) -> None:
        for address, why in self.unreachable:
            print(f"clustersdk: skipped {address}: {why}", file=sys.stderr)

    def find(self, ref: str) -> Job:
        """The job with id ``ref`` or, failing that, the newest job named ``ref``."""
        named = []
        for cluster in self:
            for job in cluster.jobs():
                if job.id == ref:
                    return job
                if job.name == ref:
                    named.append(job)
        if not named:
            self.warn_unreachable()
            raise JobNotFoundError(f"no job with id or name {ref!r} on {self.where()}")
        return max(named, key=lambda job: job.info()["submitted"])


def _out(text: str) -> None:
    print(text, flush=True)


# commands ---------------------------------------------------------------------------------
def jobs(args: argparse.Namespace) -> int:
    """List the jobs of every cluster (live ones; all with --all)."""
    with Clusters(args.address or args.cluster, args.credentials) as clusters:
        clusters.warn_unreachable()
        found = [
            (cluster.scheduler_address, job.info())
            for cluster in clusters
            for job in cluster.jobs()
        ]
        shown = [(a, r) for a, r in found if args.all or not JobStatus[r["status"]].terminal]
        if args.json:
            _out(render.to_json([{**r, "cluster": a} for a, r in shown]))
        elif shown:
            _out(render.table([render.job_row(r, a) for a, r in shown], render.JOB_HEADERS))
        else:
            hidden = len(found) - len(shown)
            _out("no jobs" + (f" running ({hidden} ended: --all shows them)" if hidden else ""))
        everything_failed = clusters.unreachable and not clusters.connected
    return FAILED if everything_failed else OK


def queue(args: argparse.Namespace) -> int:
    """The queues of every cluster, as ``cluster.queue()`` and ``%queue`` show them: who
    holds which slots, what waits, why, and when it should start (with --json, as
    ``GET /clustersdk/api/queue`` answers, each cluster named by its address)."""
    with Clusters.of(args) as clusters:
        clusters.warn_unreachable()
        found = [(cluster.scheduler_address, cluster.queue()) for cluster in clusters]
        if args.json:
            _out(
                render.to_json(
                    {
                        "clusters": [{"cluster": a, **view.data} for a, view in found],
                        "unreachable": [a for a, _ in clusters.unreachable],
                    }
                )
            )
        else:
            _out(
                "\n\n".join(f"cluster {a}\n{view!r}" for a, view in found)
                or "no clusters (none in the registry: give --cluster NAME|ADDRESS)"
            )
        everything_failed = clusters.unreachable and not clusters.connected
    return FAILED if everything_failed else OK


def drain(args: argparse.Namespace) -> int:
    """Take a host (or a worker) out: its jobs move at their next step boundary
    (``cluster.drain``); ``undrain`` gives it back."""
    with Clusters.of(args) as clusters:
        cluster = clusters.one(args.command)
        if args.command == "drain":
            done = cluster.drain(args.target, reason=args.reason or "", by=args.by)
            moved = ", ".join(repr(j) for j in done["jobs"]) or "no job"
            when = (
                "at the next step boundary"
                if done.get("moves_at") is None
                else f"at {render.moment(done['moves_at'])} (if still running)"
            )
            message = (
                f"drained {args.target} ({len(done['workers'])} worker(s)): it takes no new "
                f"ranks; {moved} checkpoint(s) {when} and continue(s) on other slots"
            )
        else:
            done = cluster.undrain(args.target)
            message = f"{args.target} takes ranks again ({len(done['workers'])} worker(s))"
        _out(render.to_json(done) if args.json else message)
    return OK


def show(args: argparse.Namespace) -> int:
    """One job: status, progress, ranks, checkpoint, error."""
    with Clusters.of(args) as clusters:
        job = clusters.find(args.job)
        record = job.info()
        done = render.progress(job.history(), record.get("total_steps"))
        address = job.cluster.scheduler_address
        if args.json:
            _out(render.to_json({**record, "cluster": address, "progress": done}))
        else:
            _out(render.show(record, address, done))
    return OK


def act(args: argparse.Namespace) -> int:
    """pause | resume | checkpoint | suspend | stop; refusals raise (exit code 1)."""
    with Clusters.of(args) as clusters:
        job = clusters.find(args.job)
        message = _ACTIONS[args.command](job, args)
        if args.json:
            _out(render.to_json({**job.info(), "cluster": job.cluster.scheduler_address}))
        else:
            _out(message)
    return OK


def _pause(job: Job, args: argparse.Namespace) -> str:
    step = job.pause(timeout=args.timeout)
    if step is None:  # a QUEUED job: the request waits for its start
        return f"job {job.name!r} is {job.status.name}: it will pause before its first step"
    return f"paused job {job.name!r} before step {step}"


def _resume(job: Job, args: argparse.Namespace) -> str:
    status = job.resume(world_size=args.world_size)
    return f"job {job.name!r} is {status.name} (world size {job.world_size})"


def _checkpoint(job: Job, args: argparse.Namespace) -> str:
    path = job.checkpoint(timeout=args.timeout)
    if path is None:  # a QUEUED job: the request waits for its start
        return f"job {job.name!r} is {job.status.name}: it will checkpoint at its first step"
    return f"job {job.name!r} checkpointed: {path}"


def _suspend(job: Job, args: argparse.Namespace) -> str:
    path = job.suspend(timeout=args.timeout)
    return f"job {job.name!r} is SUSPENDED; its slots are free; resume continues from {path}"


def _stop(job: Job, args: argparse.Namespace) -> str:
    status = job.stop(wait=not args.no_wait, timeout=args.timeout)
    return f"job {job.name!r} is {status.name}"


def _restart(job: Job, args: argparse.Namespace) -> str:
    status = job.restart()
    return (
        f"job {job.name!r} is {status.name}: its hold ended, and it continues from step "
        f"{job.info().get('checkpoint_step')}"
    )


_ACTIONS = {
    "pause": _pause,
    "resume": _resume,
    "checkpoint": _checkpoint,
    "suspend": _suspend,
    "stop": _stop,
    "restart": _restart,
}


def _changes(command: str, assignments: list[tuple[str, int | None, Any]]) -> dict[str, Any]:
    """``KEY=VALUE`` and ``KEY[GROUP]=VALUE`` assignments as one changes dict."""
    changes: dict[str, Any] = {}
    for key, group, value in assignments:
        if group is None:
            changes[key] = value
        elif not isinstance(changes.setdefault(key, {}), dict):
            raise SpecError(
                f"{command}: {key}= and {key}[{group}]= together; give one or the other"
            )
        else:
            changes[key][group] = value
    return changes


def fork(args: argparse.Namespace) -> int:
    """A new job from the job's state, which goes on (``job.fork``)."""
    changes = _changes("fork", args.changes)
    with Clusters.of(args) as clusters:
        job = clusters.find(args.job)
        forked = job.fork(
            args.name,
            at="next" if args.at is None else args.at,
            hparams=changes or None,
            world_size=args.world_size,
            checkpoint_dir=args.checkpoint_dir,
        )
        spec = forked.spec
        if args.json:
            _out(render.to_json(forked.info()))
        else:
            changed = f", {', '.join(f'{k}={v}' for k, v in changes.items())}" if changes else ""
            _out(
                f"forked job {job.name!r} at step {spec.forked_at} as {forked.name!r} "
                f"({forked.id}, {spec.world_size} rank(s){changed}): {forked.status.name}"
            )
    return OK


def update(args: argparse.Namespace) -> int:
    """Change hyperparameters before one step on every rank; print old -> new."""
    changes = _changes("update", args.changes)
    with Clusters.of(args) as clusters:
        job = clusters.find(args.job)
        step = job.update(changes, timeout=args.timeout)
        row = next(
            (u for u in reversed(job.updates()) if step is not None and u["step"] == step), None
        )
        if args.json:
            _out(
                render.to_json(
                    {
                        "job": job.id,
                        "name": job.name,
                        "step": step,
                        "changes": row["changes"] if row else None,
                        "cluster": job.cluster.scheduler_address,
                    }
                )
            )
        elif step is None:
            _out(
                f"job {job.name!r} is {job.status.name}: its ranks apply the update first "
                "thing when it runs again"
            )
        else:
            _out(
                f"updated job {job.name!r} before step {step}: "
                f"{describe(row['changes']) if row else changes}"
            )
    return OK


def debug(args: argparse.Namespace) -> int:
    """The failing stack of a held rank, each frame with its locals."""
    with Clusters.of(args) as clusters:
        post = clusters.find(args.job).debug(args.rank)
        _out(render.to_json(post.as_dict()) if args.json else post.text)
    return OK


def stacks(args: argparse.Namespace) -> int:
    """Where every rank is now: its step, phase and the stack of its training thread."""
    with Clusters.of(args) as clusters:
        job = clusters.find(args.job)
        found = job.stacks(all_threads=args.all_threads)
        if args.json:
            _out(render.to_json({str(rank): text for rank, text in found.items()}))
        elif found:
            _out("\n\n".join(found.values()))
        else:
            _out(f"job {job.name!r} is {job.status.name}: no rank is running")
    return OK


def submit(args: argparse.Namespace) -> int:
    """A script job (``cluster.launch_script``): its name; with --follow, its lines."""
    from ..options import SCRIPT
    from .flags import flag_names

    given = {
        name: getattr(args, name)
        for name in flag_names(SCRIPT)
        if name != "script" and getattr(args, name, None) is not None
    }
    script, script_args = args.script, list(args.script_args)
    if script is not None and (args.module or args.command):  # -m M -- ARGS: all arguments
        script, script_args = None, [script, *script_args]
    with Clusters.of(args) as clusters:
        cluster = clusters.one("submit")
        if "world_size" not in given:  # as %%distributed and %run_distributed: every slot
            given["world_size"] = len(cluster.slots())
        job = cluster.launch_script(script, script_args, **given)
        _out(job.id if args.json else job.name)
        if not args.follow:
            return OK
        return follow(job, None, json=args.json)


def follow(job: Job, rank: int | None, *, json: bool = False, keep: bool = True) -> int:
    """Print the job's lines (of ``rank``, or every rank); with ``keep``, until it ends:
    exit code 1 if it failed."""
    prefix = rank is None and job.world_size > 1
    since = 0
    while True:
        status = job.status  # before the read: lines written before it ended are not missed
        lines = job.log_lines(rank=rank, since=since)
        for line in lines:
            _out(render.to_json(line) if json else render.log_line(line, prefix))
        if lines:
            since = lines[-1]["seq"]
        if not keep:
            return OK
        if status.terminal:
            return FAILED if status is JobStatus.FAILED else OK
        time.sleep(FOLLOW_EVERY)


def logs(args: argparse.Namespace) -> int:
    """What the ranks printed; with -f, follow until the job ends (exit 1 if it failed)."""
    with Clusters.of(args) as clusters:
        job = clusters.find(args.job)
        if args.rank is not None and not 0 <= args.rank < job.world_size:
            raise SpecError(
                f"--rank {args.rank} is not a rank of job {job.name!r} "
                f"(its ranks are 0..{job.world_size - 1})"
            )
        return follow(job, args.rank, json=args.json, keep=args.follow)


def history(args: argparse.Namespace) -> int:
    """Every metric row the ranks logged (as CSV with --csv)."""
    with Clusters.of(args) as clusters:
        rows = clusters.find(args.job).history()
        if args.json:
            _out(render.to_json(rows))
        elif args.csv:
            sys.stdout.write(render.history_csv(rows))
        else:
            _out(render.history_table(rows) if rows else "no rows logged yet")
    return OK
