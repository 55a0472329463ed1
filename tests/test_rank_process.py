"""Every rank in a process of its own: a crash ends that rank alone and is named, the
worker and its slot stay, the next job starts at once in a clean process.

On a 2-worker ``Cluster.local`` of the module's own (its workers must be the same ones
after every test: one that had to be restarted would show).
"""

from __future__ import annotations

import os
import re
import signal
import time

import cloudpickle
import psutil
import pytest
import torch

import clustersdk as cs

from . import workloads_process as W
from .helpers import wait_for

cloudpickle.register_pickle_by_value(W)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    c = cs.Cluster.local(workers=2, state_dir=str(tmp_path_factory.mktemp("state")))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def free(pair):
    """The cluster with both slots free, before and after the test."""

    def ready() -> bool:
        return len(pair.slots()) == 2 and not any(s["job"] for s in pair.slots())

    wait_for(ready, timeout=60)
    yield pair
    for job in pair.jobs():
        if not job.status.terminal:
            job.stop(wait=False)
    wait_for(ready, timeout=60)


def workers(cluster) -> dict[str, int]:
    """Each worker's address and its process id: a restarted worker would change both."""
    return cluster.client.run(os.getpid)


def ended_at(job, rank: int) -> float:
    """When the rank said it was about to end its process (it printed it first)."""
    found = re.search(r"ending at ([0-9.]+)", job.logs(rank=rank))
    assert found, job.logs(rank=rank)
    return float(found.group(1))


def next_job_starts_at_once(cluster) -> None:
    """A 2-rank job launched now reaches its first step within a second."""
    launched = time.time()
    first = cluster.launch(W.first_step_at, world_size=2).wait(timeout=60)
    assert first - launched < 1.0, first - launched


def test_a_segfault_is_named_with_its_stack_and_the_worker_stays(free):
    before = workers(free)
    job = free.launch(W.crash_at, kwargs={"how": "segfault"}, world_size=2, name="segv")
    with pytest.raises(cs.JobFailedError) as failed:
        job.wait(timeout=60)
    noticed = time.time()
    e = failed.value
    assert noticed - ended_at(job, 1) < 2.0
    assert (e.rank, e.exc_type) == (1, "RankExit")
    assert "rank 1 (host 127.0.0.1, CPU) died of SIGSEGV (signal 11)" in str(e)
    # what faulthandler wrote in the rank's process: the crash, and where it was
    assert "Fatal Python error: Segmentation fault" in e.traceback
    assert "crash_at" in e.traceback
    events = [x["message"] for x in job.events() if x["kind"] == "failed"]
    assert any("rank 1 (host 127.0.0.1, CPU) died of SIGSEGV" in m for m in events), events
    assert workers(free) == before  # the same two workers: none had to be restarted
    next_job_starts_at_once(free)


def test_an_exit_code_is_named_and_the_worker_stays(free):
    before = workers(free)
    job = free.launch(W.crash_at, kwargs={"how": "exit3"}, world_size=2)
    with pytest.raises(cs.JobFailedError) as failed:
        job.wait(timeout=60)
    assert time.time() - ended_at(job, 1) < 2.0
    assert failed.value.rank == 1
    assert "rank 1 (host 127.0.0.1, CPU) exited with code 3" in str(failed.value)
    assert workers(free) == before
    next_job_starts_at_once(free)


def test_a_rank_killed_from_outside_is_named_and_the_worker_stays(free):
    before = workers(free)
    job = free.launch(W.crash_at, kwargs={"how": "wait"}, world_size=2, timeout=30)
    wait_for(lambda: "ending at" in job.logs(rank=1), timeout=60)
    pid = int(re.search(r"pid (\d+)", job.logs(rank=1)).group(1))
    assert pid not in before.values()  # the rank is not its worker
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    with pytest.raises(cs.JobFailedError) as failed:
        job.wait(timeout=60)
    assert time.time() - killed < 2.0
    assert "rank 1 (host 127.0.0.1, CPU) died of SIGKILL (signal 9)" in str(failed.value)
    assert workers(free) == before
    next_job_starts_at_once(free)


def test_a_segfaulting_job_restarts_from_its_checkpoint_bitwise(free, tmp_path):
    reference = free.launch(
        W.crash_at,
        kwargs={"how": "none", "rank": -1},
        world_size=2,
        checkpoint_dir=str(tmp_path / "reference"),
        checkpoint_every=10,
    ).wait(timeout=120)
    job = free.launch(
        W.crash_at,
        kwargs={"how": "segfault", "step": 25},
        world_size=2,
        checkpoint_dir=str(tmp_path / "crashing"),
        checkpoint_every=10,
        max_restarts=1,
    )
    out = job.wait(timeout=120)
    assert job.restarts == 1
    restarted = [x for x in job.events() if x["kind"] == "restarted"]
    assert "died of SIGSEGV" in restarted[0]["message"]
    assert out["step"] == reference["step"] == 40
    for name, value in reference["params"].items():
        assert torch.equal(out["params"][name], value), name


def test_a_function_rank_is_a_process_of_its_own_with_torchruns_environment(free):
    first = free.launch(W.process_facts, world_size=2, name="facts-1").wait(timeout=60)
    second = free.launch(W.process_facts, world_size=2, name="facts-2").wait(timeout=60)
    pids = set(workers(free).values())
    for facts in first["ranks"] + second["ranks"]:
        rank = facts["rank"]
        assert facts["main_thread"] and facts["signal_handled"]
        assert facts["pid"] not in pids
        env = facts["env"]
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        # both ranks on this host: torchrun's local ranks and one node
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == (
            str(rank),
            "2",
            "0",
        )
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert facts["left_behind"] == []  # the first job's global is not in the second
    assert {f["pid"] for f in first["ranks"]}.isdisjoint(f["pid"] for f in second["ranks"])


def test_a_workers_memory_stays_flat_over_twenty_jobs(free):
    """Each job leaves 64 MB, a thread and an open file in its rank: they go with it."""
    rss = []
    pids = workers(free)
    for i in range(20):
        free.launch(W.hold_memory, world_size=2, name=f"mem-{i}").wait(timeout=60)
        rss.append(sum(psutil.Process(pid).memory_info().rss for pid in pids.values()) / 2)
    growth = rss[-1] - rss[0]
    assert growth < 50 * 2**20, [f"{r / 2**20:.0f} MB" for r in rss]


def test_a_function_that_cannot_take_the_context_is_refused_at_launch(free):
    def no_context(lr=1e-3):
        return lr

    def keyword_only(*, ctx):
        return ctx

    before = len(free.jobs())
    for fn in (no_context, keyword_only, lambda: None):
        with pytest.raises(cs.SpecError, match="must take the job's context"):
            free.launch(fn, world_size=1)
    assert len(free.jobs()) == before  # nothing was queued


def test_a_launch_while_a_worker_restarts_waits_for_it(free):
    """Run last: it kills a worker (its nanny starts a new one)."""
    pids = workers(free)
    victim = sorted(pids)[1]
    os.kill(pids[victim], signal.SIGKILL)
    wait_for(lambda: len(free.slots()) == 1, timeout=30)
    job = free.launch(W.first_step_at, world_size=2)  # not refused: the slot comes back
    assert job.status in (cs.JobStatus.QUEUED, cs.JobStatus.STARTING, cs.JobStatus.RUNNING)
    with pytest.raises(
        cs.CapacityError,
        match=r"can ever hold: it has 1 slot\(s\) on 1 host\(s\), and 1 whose worker left",
    ):
        free.launch(W.first_step_at, world_size=3)
    job.wait(timeout=120)
    assert len(free.slots()) == 2 and victim not in workers(free)
