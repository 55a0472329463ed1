"""A drain by a time (``cluster.drain(host, by=...)``, ``clustersdk drain HOST --by TIME``):
the host takes no new ranks at once, and its job runs on until ``notice-grace`` before
that time, then moves and ends bitwise (issue 42). The drain at once: tests/test_drain.py."""

from __future__ import annotations

import argparse
import datetime
import time

import dask
import pytest

from clustersdk.cli import _when

from . import workloads
from .helpers import Statuses, assert_bitwise, rows, step_reached, wait_for

KW = {"kind": "mlp", "steps": 20, "global_batch": 24}


def test_a_drain_by_a_time_moves_its_job_just_before_then(idle4, tmp_path):
    want = idle4.launch(workloads.train_exact, kwargs=KW, world_size=2)
    want_state, want_rows = want.wait(timeout=120), rows(want)
    job = idle4.launch(
        workloads.train_exact,
        kwargs={**KW, "delay": 0.2},  # 4 s of steps
        world_size=2,
        checkpoint_dir=str(tmp_path),
    )
    seen = Statuses(job)
    wait_for(lambda: step_reached(job, 2), timeout=60)
    leaving = [s["worker"] for s in idle4.slots() if s["job"] == job.id][1]
    grace = float(dask.config.get("clustersdk.notice-grace"))
    by = datetime.timedelta(seconds=grace + 1.5)  # it moves 1.5 s from now
    try:
        drained = idle4.drain(leaving, reason="kernel update", by=by)
        assert list(drained["jobs"]) == [job.name]
        assert drained["moves_at"] == pytest.approx(time.time() + 1.5, abs=0.5)
        assert {s["worker"]: s["drained"] for s in idle4.slots()}[leaving] == "kernel update"
        time.sleep(1.0)
        assert "SUSPENDING" not in seen  # not yet: it runs on until then

        got = job.wait(timeout=120)
        assert seen.after("RUNNING")[:3] == ["RUNNING", "SUSPENDING", "QUEUED"]
        (moved,) = [e for e in job.events() if e["kind"] == "preempted"]
        assert (
            f"{leaving} is drained by " in moved["message"]
            and "(kernel update)" in moved["message"]
        )
        assert_bitwise(got, want_state, KW["steps"])
        assert rows(job) == want_rows
        assert job.goodput["lost_steps"] == 0
    finally:
        idle4.undrain(leaving)


def test_an_undrain_before_the_time_leaves_the_job_where_it_is(idle4):
    job = idle4.launch(workloads.ticker, kwargs={"steps": 200, "sleep": 0.02}, world_size=2)
    seen = Statuses(job)
    wait_for(lambda: step_reached(job, 2), timeout=60)
    leaving = [s["worker"] for s in idle4.slots() if s["job"] == job.id][0]
    grace = float(dask.config.get("clustersdk.notice-grace"))
    idle4.drain(leaving, by=datetime.timedelta(seconds=grace + 1.0))
    idle4.undrain(leaving)
    assert job.wait(timeout=60) == 200
    assert seen.after("RUNNING") == ["RUNNING", "FINISHED"]  # never moved


def test_by_on_the_command_line_reads_times_people_write():
    now = datetime.datetime(2026, 12, 7, 15, 0)
    assert _when("+90s", now) == datetime.datetime(2026, 12, 7, 15, 1, 30)
    assert _when("14:00", now) == datetime.datetime(2026, 12, 8, 14, 0)  # past today: tomorrow
    assert _when("2026-12-08T09:30", now) == datetime.datetime(2026, 12, 8, 9, 30)
    for wrong, said in (("soon", "is not a time: say 14:00"), ("2026-01-01T00:00", "already past")):
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            _when(wrong, now)
