"""The kernel's side of ``job.run`` and ``job.update`` (the :class:`~clustersdk.Job`
methods call these): pickle, ask, wait in slices, turn the answers into results or
errors.

The control plane keeps the requests and the ranks pull them at their next
boundary (:mod:`clustersdk.control.live`, :mod:`clustersdk.runtime.live`).
"""

from __future__ import annotations

import numbers
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

import cloudpickle

from .hparams import spec_changes
from .errors import JobTimeoutError, RunError, SpecError

if TYPE_CHECKING:
    from .job import Job

WAIT_SLICE = 5.0  # seconds per server-side wait, so that Ctrl-C stays responsive
WAITING = ("RUNNING", "PAUSED", "HUNG")  # the ranks may still answer


def run(job: Job, fn: Callable[[Any], Any], ranks: int | Iterable[int] | None = None,
        timeout: float | None = 60.0) -> dict[int, Any]:
    """See :meth:`clustersdk.Job.run`."""
    if not callable(fn):
        raise SpecError(f"job.run needs a function of ctx, got {fn!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)
                                or timeout <= 0):
        raise SpecError(f"job.run(timeout={timeout!r}): give a positive number of seconds, "
                        "or None to wait as long as it takes")
    chosen = [ranks] if isinstance(ranks, int) and not isinstance(ranks, bool) else \
        None if ranks is None else list(ranks)
    try:
        payload = cloudpickle.dumps(fn)
    except Exception as e:
        what = getattr(fn, "__qualname__", repr(fn))
        raise SpecError(
            f"job.run: the function {what} can't be pickled ({type(e).__name__}: {e}); it must "
            "be picklable to reach the ranks — leave open files, locks, sockets or clients out "
            "of it (the ranks' own objects are in ctx)") from e
    cluster = job.cluster
    seq = cluster.sync(cluster.control.run, job.id, payload, ranks=chosen)["seq"]
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - time.monotonic())
        entry = cluster.sync(cluster.control.run_wait, job.id, seq, timeout=max(left, 0.0))
        over = deadline is not None and time.monotonic() >= deadline
        if not entry["found"] or entry["complete"] or entry["status"] not in WAITING or over:
            break
    return _outcome(job.name, entry, timeout)


def _outcome(name: str, entry: dict[str, Any], timeout: float | None) -> dict[int, Any]:
    if not entry["found"]:  # the job is over and forgot it
        raise RunError(name, {}, {-1: {"type": "JobEnded", "traceback": "", "message": (
            f"the job is {entry['status']}; the results of job.run were not kept")}})
    results: dict[int, Any] = {}
    errors = {int(r): dict(e) for r, e in entry["errors"].items()}
    for key, data in entry["results"].items():
        try:
            results[int(key)] = cloudpickle.loads(data)
        except Exception as e:  # e.g. a class that only the workers can import
            errors[int(key)] = {"type": "UnpicklingError", "traceback": "", "message": (
                f"its result can't be unpickled in this process ({type(e).__name__}: {e})")}
    started = set(entry.get("started") or ())
    for rank in entry["ranks"]:
        if rank in results or rank in errors:
            continue
        if entry["status"] not in WAITING:
            message = (f"the job became {entry['status']} before rank {rank} ran the function")
            kind = "JobLeft"
        elif rank in started:
            message = (f"the function did not return within {timeout} s; the job is not "
                       "affected: the rank goes on training once it returns")
            kind = "Timeout"
        else:
            message = (f"the rank reached no step boundary within {timeout} s; it runs the "
                       "function when it does")
            kind = "Timeout"
        errors[rank] = {"type": kind, "message": message, "traceback": ""}
    if errors:
        raise RunError(name, dict(sorted(results.items())), errors)
    return dict(sorted(results.items()))


def update(job: Job, changes: dict[str, Any], timeout: float | None = 60.0) -> int | None:
    """See :meth:`clustersdk.Job.update`."""
    cluster = job.cluster
    record = cluster.sync(cluster.control.update, job.id, changes, timeout=timeout)
    error = record.get("error")
    if error:
        raise SpecError(f"job.update of job {job.name!r} was refused by rank {error.get('rank')}: "
                        f"{error.get('message')}; nothing changed, the job keeps its state and "
                        "step")
    if record["step"] is None and record["timed_out"]:
        raise JobTimeoutError(
            f"job {job.name!r} reached no step boundary within {timeout} s; the update is kept "
            "and its ranks apply it at their next one")
    if spec_changes(record["changes"]):
        job.info()  # job.spec shows the launch options' new values at once
    return record["step"]


def updates(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``updated`` events of a job, as rows: seq, step, time, changes {key: [old, new]}."""
    return [{"seq": e.get("seq"), "step": e.get("step"), "time": e.get("time"),
             "changes": {k: list(v) for k, v in (e.get("changes") or {}).items()}}
            for e in events if e.get("kind") == "updated"]
