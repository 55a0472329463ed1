"""What ``chaos.py`` checks after a soak: pure functions over the jobs' records and the machine.

Each returns a list of problems (empty: the check passed), so the script can
print every failed check, not only the first.
"""

from __future__ import annotations

import collections
import os
import re
import statistics
from typing import Any

import torch


def committed_rows(segments: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The history that counts over jobs that each resumed where the previous one's
    newest checkpoint was: a later job's first step cuts off the earlier job's rows."""
    out: list[dict[str, Any]] = []
    for index, rows in enumerate(segments):
        later = [min((r["step"] for r in seg), default=None) for seg in segments[index + 1 :]]
        cut = next((s for s in later if s is not None), None)
        out += [r for r in rows if cut is None or r["step"] < cut]
    return out


def history_problems(rows: list[dict[str, Any]], world_size: int, steps: int) -> list[str]:
    """Every step 0..steps-1 exactly once per rank: no gap, no duplicate."""
    problems = []
    for rank in range(world_size):
        got = sorted(r["step"] for r in rows if r["rank"] == rank)
        if got != list(range(steps)):
            dup = sorted({s for s in got if got.count(s) > 1})
            gap = sorted(set(range(steps)) - set(got))
            problems.append(
                f"rank {rank}: {len(got)} rows for {steps} steps; duplicated "
                f"{dup[:10]}, missing {gap[:10]}"
            )
    return problems


def bitwise_problems(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """Model, optimizer moments, hyperparameters and step: the same bits."""
    problems = []
    if got["step"] != want["step"]:
        problems.append(f"ended at step {got['step']}, the uninterrupted run at {want['step']}")
    a, b = got["state"], want["state"]
    for key, value in b["model"].items():
        if not torch.equal(a["model"][key], value):
            problems.append(f"parameter {key} differs by {(a['model'][key] - value).abs().max()}")
    for key, moments in b["optim"]["state"].items():
        for name, value in moments.items():
            if not torch.equal(a["optim"]["state"][key][name], value):
                problems.append(f"optimizer state {key}.{name} differs")
    if a["optim"]["param_groups"] != b["optim"]["param_groups"]:
        problems.append("optimizer hyperparameters differ")
    return problems


def reason_problems(events: list[dict[str, Any]], killed: list[str]) -> list[str]:
    """One 'restarted' event per killed worker, each naming it."""
    restarts = [e["message"] for e in events if e["kind"] == "restarted"]
    problems = [
        f"no restart event names the killed worker {w}"
        for w in killed
        if not any(w in m for m in restarts)
    ]
    if len(restarts) != len(killed):
        problems.append(f"{len(restarts)} restart event(s) for {len(killed)} kill(s): {restarts}")
    return problems


def leftover_dirs(checkpoint_dir: str) -> list[str]:
    """What the checkpoint package leaves besides committed ``step-*`` directories:
    a ``.tmp-step-*`` staging directory is an interrupted save nobody cleaned up."""
    from clustersdk import checkpoint_files as files

    committed = {os.path.basename(p) for _, p in files.committed(checkpoint_dir)}
    return sorted(name for name in os.listdir(checkpoint_dir) if name not in committed)


def cluster_processes(dask_worker: Any) -> dict[str, Any]:
    """Run on a worker (``client.run``): its process, its nanny's, and those it keeps for
    its ranks (its zygote, the rank process waiting for the next job, each job's rank)."""
    from clustersdk.runtime.agent import AGENT_NAME

    out: dict[str, Any] = {"worker": os.getpid(), "nanny": os.getppid()}
    agent = dask_worker.plugins.get(AGENT_NAME)
    if agent is not None:
        out.update(agent.processes())
    return out


def leftover_processes(processes: dict[str, dict[str, Any]]) -> list[str]:
    """Processes under this one that are none of the cluster's own (``processes``: what
    :func:`cluster_processes` said on each worker): a rank's stray child, an orphaned
    worker of a killed nanny, a zygote or rank process whose worker is gone; a rank
    process still running on an idle worker; zombies."""
    import psutil

    known: set[int] = set()
    out = []
    for worker, seen in processes.items():
        known |= {p for k in ("worker", "nanny", "zygote", "spare") if (p := seen.get(k))}
        for job, pid in (seen.get("ranks") or {}).items():
            out.append(f"rank process {pid} of job {job} still runs on idle worker {worker}")
    for child in psutil.Process().children(recursive=True):
        try:
            name, status, cmd = child.name(), child.status(), " ".join(child.cmdline())[:120]
        except psutil.NoSuchProcess:
            continue
        if status == psutil.STATUS_ZOMBIE:
            out.append(f"zombie {child.pid} ({name})")
        elif child.pid not in known and "resource_tracker" not in cmd:
            out.append(f"process {child.pid}: {cmd}")
    return out


def worker_footprint() -> dict[str, Any]:
    """Run on a worker (``client.run``): its threads, by name with the numbers taken out
    (``ThreadPoolExecutor-3_0`` and ``-7_1`` are one kind), and its listening TCP ports."""
    import sys
    import threading
    import traceback

    import psutil

    names = collections.Counter(re.sub(r"\d+", "N", t.name) for t in threading.enumerate())
    ports = sorted(
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    )
    frames = sys._current_frames()
    where = {
        t.name: "".join(traceback.format_stack(frames[t.ident])[-4:])
        for t in threading.enumerate()
        if t.name.startswith("clustersdk-") and t.ident in frames
    }
    return {"threads": dict(names), "ports": ports, "where": where}


def footprint_problems(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> list[str]:
    """What the workers hold after the soak beyond what a worker held after one ordinary
    checkpointed job: a rank thread still alive, more threads of a kind than any worker
    had then, more listening ports (a TCPStore left open). ``before``/``after``: worker
    address -> :func:`worker_footprint`. Workers the nanny restarted start from scratch,
    so each is compared with the most any worker had before."""
    most: collections.Counter = collections.Counter()
    ports = 0
    for foot in before.values():
        for name, n in foot["threads"].items():
            most[name] = max(most[name], n)
        ports = max(ports, len(foot["ports"]))
    problems = []
    for worker, foot in after.items():
        for name, n in foot["threads"].items():
            if name.startswith("clustersdk-") and name not in ("clustersdk-agent",):
                stacks = "; ".join(f"{t} at {s!r}" for t, s in foot.get("where", {}).items())
                problems.append(f"{worker}: {n} thread(s) {name} still alive ({stacks})")
            elif n > most[name]:
                problems.append(f"{worker}: {n} thread(s) {name}, at most {most[name]} before")
        if len(foot["ports"]) > ports:
            problems.append(f"{worker}: listens on {foot['ports']}, at most {ports} port(s) before")
    return problems


def summary(seconds: list[float]) -> str:
    if not seconds:
        return "n/a"
    return f"median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s (n={len(seconds)})"
