"""Hangs end to end: the watchdog finds them, job.stacks() shows every rank, and each
on_hang policy does what it says; a stop ends a hung job even while a rank's process is
frozen (the process is killed, its worker stays). The collective timeout is long (120 s)
in every test: the watchdog, not the timeout, is what finds the hang.

The module has a cluster of its own: these tests end ranks' processes.
"""

from __future__ import annotations

import os
import re
import signal

import pytest

import clustersdk as cs

from . import workloads
from .helpers import step_reached, wait_for

HANG = 3.0  # hang_timeout of every job here, seconds


def last_step_time(job) -> float:
    return max(r["time"] for r in job.history())


def test_a_stuck_rank_is_reported_hung_with_every_ranks_stack_and_stop_ends_it(healed):
    job = healed.launch(
        workloads.hang_at,
        kwargs={"rank": 1, "step": 5},
        world_size=2,
        timeout=120,
        hang_timeout=HANG,
        name="stuck",
    )
    wait_for(lambda: job.status is cs.JobStatus.HUNG, timeout=30)
    (event,) = [e for e in job.events() if e["kind"] == "hung"]
    assert event["time"] - last_step_time(job) <= 2 * HANG + 1  # found within 2x the timeout
    assert job.reason.startswith("hung: no rank has finished a step for ")
    assert "rank 1 at step 5, phase step" in job.reason
    stacks = job.stacks()
    assert sorted(stacks) == [0, 1]
    assert "step 5, phase step" in stacks[1].splitlines()[0]
    assert "in stuck_for_good" in stacks[1]  # where it is stuck, in its own frames
    assert "hang_at" in stacks[0]  # rank 0 waits in the next step's collective
    # the rank's own thread by default (from its function down), every thread on demand
    assert 'Thread "MainThread" (the rank\'s)' in stacks[0] and "zygote.py" not in stacks[0]
    assert "clustersdk-channel" not in stacks[0]
    assert "clustersdk-channel" in job.stacks(all_threads=True)[0]
    kept = wait_for(lambda: job.info().get("stacks"), timeout=10)  # kept with the record
    assert set(kept) == {"0", "1"}
    assert job.stop(timeout=30) is cs.JobStatus.STOPPED  # rank 1 never reaches a boundary
    # rank 1 never reaches a boundary, and rank 0 waits for it in a collective: both ended
    assert any(e["kind"] == "ended" and 1 in e["ranks"] for e in job.events()), job.events()


def test_a_frozen_rank_process_is_named_and_on_hang_fail_fails_the_job(healed):
    job = healed.launch(
        workloads.ticker,
        kwargs={"sleep": 0.02},
        world_size=2,
        timeout=120,
        hang_timeout=HANG,
        on_hang="fail",
        name="frozen",
    )
    wait_for(lambda: step_reached(job, 5), timeout=60)
    workers = healed.client.run(os.getpid)
    pid = int(re.search(r", pid (\d+)", job.stacks()[1].splitlines()[0]).group(1))
    assert pid not in workers.values()  # the rank's own process, not its worker
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(cs.JobFailedError, match=r"hung: no rank has finished a step"):
            job.wait(timeout=60)
        assert job.info()["error"]["type"] == "Hang"
        frozen = job.stacks()[1]  # kept from when it was found hung
        assert "the rank did not answer within 1 s: py-spy's view" in frozen
        assert f"process {pid}: stopped (SIGSTOP)" in frozen
        assert "ticker" in frozen and "ticker" in job.stacks()[0]
        # the frozen rank was killed (a SIGSTOPped process still dies of SIGKILL) and its
        # worker stayed
        wait_for(lambda: not _alive(pid), timeout=30)
        assert healed.client.run(os.getpid) == workers
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGCONT)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie until its zygote reaps it
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_on_hang_restart_restarts_from_the_checkpoint_and_finishes(healed, tmp_path):
    job = healed.launch(
        workloads.hang_at,
        kwargs={"rank": 0, "step": 6, "steps": 12, "marker": str(tmp_path / "hung-once")},
        world_size=2,
        timeout=120,
        hang_timeout=HANG,
        on_hang="restart",
        max_restarts=1,
        checkpoint_dir=str(tmp_path / "ck"),
        checkpoint_every=4,
    )
    assert job.wait(timeout=120) == 12
    assert job.restarts == 1
    kinds = [e["kind"] for e in job.events()]
    assert kinds[:2] == ["hung", "restarted"], kinds
    assert "at step 4" in job.logs(0)  # it went on from its checkpoint


def test_bad_hang_options_are_refused_at_launch(healed):
    with pytest.raises(cs.SpecError, match="hang_timeout must be a positive number"):
        healed.launch(workloads.count_to, world_size=1, hang_timeout=0)
    with pytest.raises(cs.SpecError, match="on_hang must be one of 'report', 'restart', 'fail'"):
        healed.launch(workloads.count_to, world_size=1, on_hang="ignore")
    with pytest.raises(cs.SpecError, match="on_hang='restart' needs max_restarts=1"):
        healed.launch(workloads.count_to, world_size=1, on_hang="restart")
