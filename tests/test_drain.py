"""An admin drains a worker, end to end on four local slots: the job with a rank there
checkpoints at its next step boundary, leaves, and continues on other slots, ending
bitwise equal to the run nobody moved; the drained slot takes no rank until undrained.
(issue 42's drain; the rules of a preemption are tested in tests/control/.)"""

from __future__ import annotations

import os
import signal
import time

import pytest

import clustersdk as cs
from clustersdk.errors import SpecError

from . import workloads
from .helpers import (
    MOVING_KW,
    assert_bitwise,
    cli,
    rows,
    running_beside_a_reference,
    wait_for,
    workers_of,
)

KW = MOVING_KW


def test_a_drained_workers_job_moves_to_other_slots_and_ends_bitwise(idle4, tmp_path):
    (want_state, want_rows), job, seen = running_beside_a_reference(idle4, "moving", tmp_path)
    leaving = workers_of(idle4, job)[1]
    try:
        moved = idle4.drain(leaving, reason="fan replacement")
        assert (list(moved["workers"]), list(moved["jobs"])) == ([leaving], ["moving"])
        drained = {s["worker"]: s["drained"] for s in idle4.slots()}
        assert drained.pop(leaving) == "fan replacement" and set(drained.values()) == {None}

        got = job.wait(timeout=120)
        assert seen.after("RUNNING")[:4] == ["RUNNING", "SUSPENDING", "QUEUED", "STARTING"]
        events = [e for e in job.events() if e["kind"] == "preempted"]
        assert events and f"{leaving} is drained (fan replacement)" in events[0]["message"]
        assert job.restarts == 0  # not a failure: the restart budget is untouched
        assert_bitwise(got, want_state, KW["steps"])
        assert rows(job) == want_rows  # every step once per rank, across the move

        # the drained slot takes no rank: four ranks wait for it
        full = idle4.launch(workloads.ticker, kwargs={"steps": 3, "sleep": 0.01}, world_size=4)
        time.sleep(2)
        assert full.status is cs.JobStatus.QUEUED
        assert list(idle4.undrain(leaving)["workers"]) == [leaving]
        leaving = None
        assert full.wait(timeout=60) == 3
    finally:
        if leaving is not None:
            idle4.undrain(leaving)


def test_a_drain_names_what_it_can_drain(idle4):
    with pytest.raises(SpecError, match=r"no host or worker 'gpu9' in this cluster; its hosts: "):
        idle4.drain("gpu9")
    with pytest.raises(SpecError, match=r"'gpu9' is not drained; drained: none"):
        idle4.undrain("gpu9")


def test_drain_and_undrain_on_the_command_line(idle4):
    target = idle4.slots()[-1]["worker"]
    address = idle4.scheduler_address
    drained = cli(idle4.state_dir, "drain", target, "--reason", "disk swap", "--cluster", address)
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout.startswith(f"drained {target} (1 worker(s)): it takes no new ranks")
    try:
        assert {s["worker"]: s["drained"] for s in idle4.slots()}[target] == "disk swap"
    finally:
        back = cli(idle4.state_dir, "undrain", target, "--cluster", address)
    assert (
        back.returncode == 0 and back.stdout.strip() == f"{target} takes ranks again (1 worker(s))"
    )
    again = cli(idle4.state_dir, "undrain", target, "--cluster", address)
    assert again.returncode == 1 and f"{target!r} is not drained" in again.stderr


def test_a_sigterm_to_a_worker_moves_its_job_first_and_loses_no_step(idle4, tmp_path):
    (want_state, want_rows), job, seen = running_beside_a_reference(idle4, "noticed", tmp_path)
    leaving = workers_of(idle4, job)[1]
    pid = idle4.client.run(os.getpid, workers=[leaving])[leaving]
    os.kill(pid, signal.SIGTERM)  # as Kubernetes' eviction or scancel would
    at = max(r["step"] for r in job.history())

    got = job.wait(timeout=120)
    assert seen.after("RUNNING")[:3] == ["RUNNING", "SUSPENDING", "QUEUED"]
    (notice,) = [e for e in job.events() if e["kind"] == "preempted"]
    assert (
        f"worker {leaving} (host " in notice["message"] and "received SIGTERM" in notice["message"]
    )
    # it checkpointed at the next step boundary: no step since the notice is done twice
    assert job.info()["checkpoint_step"] >= at
    assert job.restarts == 0
    assert_bitwise(got, want_state, KW["steps"])
    assert rows(job) == want_rows
    wait_for(lambda: len(idle4.slots()) == 4, timeout=60)  # its nanny started it again
