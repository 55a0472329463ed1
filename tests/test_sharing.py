"""Sharing a cluster, end to end on four local slots: priorities and preemption by a
just-in-time checkpoint, refusals at launch naming the limit, the queue view, idle
reclaim, and settings an admin changes at run time.

The rules themselves are tested without a cluster in ``tests/control/``; here the
control plane carries them out on real ranks: a preempted job must come back by
itself and end bitwise equal to the run nobody interrupted, at 4 ranks.
"""

from __future__ import annotations

import pytest

import clustersdk as cs

from . import workloads
from .helpers import Statuses, assert_bitwise, rows, step_reached, wait_for

KW = {"kind": "mlp", "steps": 20, "global_batch": 24}


@pytest.fixture
def shared(idle4):
    """The four-slot cluster with default scheduling settings before and after."""
    defaults = idle4.configure_scheduling({})
    yield idle4
    added = set(idle4.configure_scheduling({})["queues"]) - set(defaults["queues"])
    idle4.configure_scheduling(
        {**defaults, "queues": {**defaults["queues"], **dict.fromkeys(added)}}
    )


def test_a_high_priority_job_preempts_a_low_one_which_comes_back_by_itself_bitwise(
    shared, tmp_path
):
    want = shared.launch(workloads.train_exact, kwargs=KW, world_size=4)
    want_state, want_rows = want.wait(timeout=120), rows(want)

    low = shared.launch(
        workloads.train_exact,
        kwargs={**KW, "delay": 0.05},
        world_size=4,
        name="low",
        priority="low",
        checkpoint_dir=str(tmp_path),
    )
    seen = Statuses(low)
    wait_for(lambda: step_reached(low, 4), timeout=60)
    high = shared.launch(
        workloads.ticker,
        kwargs={"steps": 30, "sleep": 0.05},
        world_size=2,
        name="high",
        priority="high",
    )
    # it checkpoints at the next step boundary, leaves, and waits for four free slots
    wait_for(lambda: low.status is cs.JobStatus.QUEUED, timeout=60)
    assert low.reason.startswith("preempted by job 'high' (priority high) at step ")
    assert low.info()["checkpoint_step"] >= 4
    assert high.wait(timeout=120) == 30
    got = low.wait(timeout=120)
    assert seen.after("RUNNING")[:3] == ["RUNNING", "SUSPENDING", "QUEUED"]
    assert low.restarts == 0  # a preemption is not a failure: the restart budget is untouched
    assert_bitwise(got, want_state, KW["steps"])
    assert rows(low) == want_rows  # every step once per rank, across the preemption


def test_a_job_that_can_never_fit_is_refused_at_launch_naming_the_limit(shared):
    shared.configure_scheduling({"queues": {"small": {"guaranteed": 1, "borrowing-limit": 1}}})
    with pytest.raises(
        cs.CapacityError,
        match=r"world_size=3 can never fit queue 'small': it "
        r"may hold at most 2 slots \(1 guaranteed \+ 1 "
        r"borrowing limit\)",
    ):
        shared.launch(workloads.count_to, world_size=3, queue="small")
    with pytest.raises(cs.SpecError, match=r"unknown queue 'nowhere'; the queues are"):
        shared.launch(workloads.count_to, world_size=1, queue="nowhere")
    with pytest.raises(
        cs.SpecError,
        match=r"preemptible=False needs priority normal \(50\) or "
        r"higher, got low \(0\)",
    ):
        shared.launch(workloads.count_to, world_size=1, priority="low", preemptible=False)
    with pytest.raises(
        cs.SpecError,
        match=r"unknown priority 'urgent': expected an int or a "
        r"priority class",
    ):
        shared.launch(workloads.count_to, world_size=1, priority="urgent")
    assert not [
        j for j in shared.jobs() if j.name.startswith("count_to") and not j.status.terminal
    ]  # nothing was queued by a refused launch
    # within the limit it runs, in its queue
    job = shared.launch(workloads.count_to, world_size=2, queue="small", priority="high")
    assert job.wait(timeout=60) == "done"
    assert (job.queue, job.priority) == ("small", 100)


def test_the_queue_view_says_who_holds_what_and_why_the_others_wait(shared):
    holder = shared.launch(workloads.spin, world_size=3, name="holder", priority="high")
    wait_for(lambda: holder.status is cs.JobStatus.RUNNING, timeout=60)
    waiter = shared.launch(workloads.count_to, world_size=2, name="waiter")
    try:
        view = wait_for(
            lambda: (lambda v: v if v.waiting() and v.waiting()[0]["reason"] else None)(
                shared.queue()
            ),
            timeout=30,
        )
        (queue,) = view.data["queues"]
        assert queue["name"] == "default" and queue["used"] == 3
        assert [(h["name"], h["slots"], h["priority_name"]) for h in queue["holding"]] == [
            ("holder", 3, "high")
        ]
        (waiting,) = view.waiting()
        assert waiting["name"] == "waiter" and waiting["priority_name"] == "normal"
        assert waiting["reason"].startswith("waiting for 2 slots to be free")
        assert waiter.reason == waiting["reason"]  # the job's own reason says the same
        html = view._repr_html_()
        assert "holder" in html and "waiter" in html and "waiting for 2 slots" in html
    finally:
        holder.stop()
    assert waiter.wait(timeout=60) == "done"


def test_an_idle_paused_job_is_reclaimed_and_resumes_when_asked(shared, tmp_path):
    job = shared.launch(
        workloads.ticker,
        kwargs={"steps": 40},
        world_size=2,
        name="idler",
        checkpoint_dir=str(tmp_path),
    )
    wait_for(lambda: step_reached(job, 3), timeout=60)
    job.pause()
    shared.configure_scheduling({"idle-timeout": 1})
    wait_for(lambda: job.status is cs.JobStatus.SUSPENDED, timeout=30)
    assert job.reason.startswith("suspended after ") and "idle timeout of queue 'default'" in (
        job.reason
    )
    assert not [s for s in shared.slots() if s["job"] == job.id]  # its slots are free
    shared.configure_scheduling({"idle-timeout": None})
    job.resume()
    assert job.wait(timeout=60) == 40


def test_settings_changed_at_run_time_are_refused_when_wrong_and_kept_when_right(shared):
    with pytest.raises(cs.SpecError, match="per-user-cap"):
        shared.configure_scheduling({"per-user-cap": -2})
    settings = shared.configure_scheduling({"per-user-cap": 3})
    assert settings["per-user-cap"] == 3
    with pytest.raises(cs.CapacityError, match="per-user cap of 3 slots"):
        shared.launch(workloads.count_to, world_size=4)
