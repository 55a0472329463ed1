"""A short chaos soak (``benchmarks/chaos.py`` is the long one): a 3-rank checkpointed DDP
job on four workers loses three workers to SIGKILL, one after the other, and has one
rank raise; it ends bitwise equal to the uninterrupted run.

A rank's exception fails the job (it is a bug: a restart would raise again), so after
the raise the test launches the job again with ``resume="auto"``, as a user would; a
lost worker restarts it (``max_restarts``) on the spare worker while the nanny brings
the killed one back. Between events the job is paused until all four workers are back,
so that on a slow machine it cannot run to its end before the last event.
"""

from __future__ import annotations

import json
import os

import psutil
import pytest

import clustersdk as cs
from clustersdk import checkpoint_files as files

from . import workloads
from .helpers import cluster_processes, kill_worker_of, wait_for, wait_idle

pytestmark = pytest.mark.slow

STEPS = 60
JOB = {"steps": STEPS, "global_batch": 24, "dropout": 0.0}


def launch(cluster, root, **options):
    kwargs = {**JOB, "delay": 0.05, "raise_marker": f"{root}-raise.json"}
    return cluster.launch(
        workloads.train_exact,
        kwargs=kwargs,
        world_size=3,
        timeout=30,
        checkpoint_dir=root,
        checkpoint_every=5,
        max_restarts=100,
        hang_timeout=60,
        **options,
    )


def top_step(job) -> int:
    return max((r["step"] for r in job.history()), default=-1)


def at_step(cluster, job, step: int) -> None:
    """Until ``job`` runs past ``step``; then paused until every worker is back, so that
    the next event finds a healed cluster and a job with steps left to run."""
    wait_for(lambda: job.status is cs.JobStatus.RUNNING and top_step(job) >= step, timeout=120)
    job.pause()
    wait_for(lambda: len(cluster.slots()) == 4, timeout=120)
    job.resume()


def committed(segments: list[list[dict]]) -> list[dict]:
    """The rows that count over jobs that each resumed from the previous one's newest
    checkpoint: a later job's first step cuts off the earlier job's rows."""
    out = []
    for i, rows in enumerate(segments):
        cut = (
            min((r["step"] for r in segments[i + 1]), default=None)
            if i + 1 < len(segments)
            else None
        )
        out += [r for r in rows if cut is None or r["step"] < cut]
    return out


def test_three_sigkills_and_a_raise_end_bitwise_equal_to_the_uninterrupted_run(cluster4, tmp_path):
    wait_idle(cluster4)
    wait_for(lambda: len(cluster4.slots()) == 4, timeout=60)
    # what ran before (other modules' servers, e.g. the multihost bed's sshds) is not ours
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    want = cluster4.launch(workloads.train_exact, kwargs=JOB, world_size=3).wait(timeout=120)
    root = str(tmp_path / "ckpt")
    first = launch(cluster4, root)
    killed = []
    for rank, step in ((0, 12), (1, 24)):
        at_step(cluster4, first, step)
        killed.append(kill_worker_of(cluster4, first, rank))
    at_step(cluster4, first, 36)
    with open(f"{root}-raise.part", "w") as f:
        json.dump({"rank": 2, "step": top_step(first) + 2}, f)
    os.replace(f"{root}-raise.part", f"{root}-raise.json")  # the ranks read it every step
    with pytest.raises(cs.JobFailedError, match="rank 2 raises") as failure:
        first.wait(timeout=120)
    assert failure.value.rank == 2
    second = launch(cluster4, root, resume="auto")
    at_step(cluster4, second, 45)
    killed.append(kill_worker_of(cluster4, second, 2))
    got = second.wait(timeout=180)

    # the run that counts is the uninterrupted one, to the bit
    assert got["step"] == want["step"] == STEPS
    for key, value in want["state"]["model"].items():
        assert bitwise(got["state"]["model"][key], value), key
    for key, moments in want["state"]["optim"]["state"].items():
        for name, value in moments.items():
            assert bitwise(got["state"]["optim"]["state"][key][name], value), (key, name)
    # every step once per rank, over both jobs
    rows = committed([first.history(), second.history()])
    for rank in range(3):
        assert sorted(r["step"] for r in rows if r["rank"] == rank) == list(range(STEPS)), rank
    # each restart names the worker that was killed; the raise is a failure, not a restart
    restarts = [
        [e["message"] for e in job.events() if e["kind"] == "restarted"] for job in (first, second)
    ]
    assert len(restarts[0]) == 2 and len(restarts[1]) == 1, restarts
    for worker, message in zip(killed, restarts[0] + restarts[1]):
        assert f"worker {worker}" in message and "left the cluster" in message
    failed = [e for e in first.events() if e["kind"] == "failed"]
    assert len(failed) == 1 and "rank 2" in failed[0]["message"]
    # nothing left over: no staging checkpoint directory, no stray process
    names = {os.path.basename(p) for _, p in files.committed(root)}
    assert sorted(os.listdir(root)) == sorted(names) and names
    wait_for(lambda: len(cluster4.slots()) == 4, timeout=120)
    wait_idle(cluster4)
    # the workers, their nannies, zygotes and waiting rank processes; no rank process left
    processes = cluster_processes(cluster4)
    assert not [seen["ranks"] for seen in processes.values() if seen["ranks"]], processes
    known = {
        pid
        for seen in processes.values()
        for pid in (seen["worker"], seen["nanny"], seen["zygote"], seen["spare"])
    }
    stray = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in known | before and "resource_tracker" not in " ".join(p.cmdline())
    ]
    assert not stray, [(p.pid, p.cmdline()) for p in stray]


def bitwise(a, b) -> bool:
    import torch

    return torch.equal(a, b)
