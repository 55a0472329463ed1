"""The hang rules, with no cluster: the watch's verdict and what a HUNG job does."""

from __future__ import annotations

import pytest

from clustersdk.control import events as ev
from clustersdk.control.hangs import MIN_DEFAULT, Watch
from clustersdk.protocol import ExitStatus, Word
from clustersdk.status import JobStatus

from .helpers import exit_all, of, running, statuses

S = JobStatus


def beat(watch: Watch, t: float, *ranks: tuple[int, int, str]) -> None:
    for rank, step, phase in ranks:
        watch.heard(rank, step, phase, t)


def test_a_job_is_hung_when_no_step_finished_for_the_timeout():
    w = Watch(0.0)
    beat(w, 0.5, (0, 1, "step"), (1, 1, "step"))
    beat(w, 1.0, (0, 2, "step"), (1, 2, "control"))
    assert w.verdict(6.9, hang_timeout=6) is None
    beat(w, 7.5, (0, 2, "control"), (1, 2, "control"))  # heard, but no step finished
    assert w.verdict(7.5, hang_timeout=6) == pytest.approx(6.5)
    assert w.where(8.0) == (
        "rank 0 at step 2, phase control (heard 0.5 s ago), "
        "rank 1 at step 2, phase control (heard 0.5 s ago)"
    )
    beat(w, 8.0, (1, 3, "step"))  # one rank moved on: progress
    assert w.verdict(8.5, hang_timeout=6) is None


def test_time_in_a_checkpoint_or_outside_ctx_loop_is_not_waiting():
    w = Watch(0.0)
    beat(w, 1.0, (0, 4, "checkpoint"), (1, 4, "control"))  # a long save starts at 1 s
    assert w.verdict(100.0, hang_timeout=6) is None
    beat(w, 100.0, (0, 4, "control"))  # the save took 99 s: not counted
    assert w.verdict(104.0, hang_timeout=6) is None and w.verdict(108.0, hang_timeout=6)
    outside = Watch(0.0)
    beat(outside, 1.0, (0, 0, "setup"), (1, 0, "setup"))  # a function without ctx.loop
    assert outside.verdict(1000.0, hang_timeout=6) is None


def test_the_default_timeout_follows_the_slowest_recent_step():
    w = Watch(0.0)
    assert w.timeout(None) == MIN_DEFAULT
    for step in range(1, 6):
        beat(w, step * 10.0, (0, step, "step"))  # 10 s steps
    assert w.timeout(None) == pytest.approx(200.0) and w.timeout(3.0) == 3.0


def hung(on_hang: str = "report", **options):
    job = running(3, on_hang=on_hang, **options)
    actions = job.handle(ev.HangDetected(7.0, 6.0, "rank 1 at step 4, phase step", 10.0), 9.0)
    return job, actions


def test_report_keeps_a_hung_job_waiting_with_its_stacks_collected():
    job, actions = hung("report")
    assert statuses(actions) == ["HUNG"] and of(actions, ev.CollectStacks) == [ev.CollectStacks()]
    reason = of(actions, ev.Journal)[0].fields["reason"]
    assert reason.startswith("hung: no rank has finished a step for 7 s (hang_timeout 6 s)")
    assert "rank 1 at step 4, phase step" in reason
    assert [r.kind for r in of(actions, ev.Record)] == ["hung"]
    assert not of(actions, ev.SendControl) and not of(actions, ev.StartTimer)
    assert statuses(job.handle(ev.Progressed(), 12.0)) == ["RUNNING"]  # it was only slow


def test_fail_fails_a_hung_job_and_ends_the_ranks_that_never_stop():
    job, actions = hung("fail")
    assert statuses(actions) == ["HUNG", "FAILED"]
    error = [a.fields["error"] for a in of(actions, ev.Journal) if "error" in a.fields][0]
    assert error["type"] == "Hang" and error["rank"] is None
    assert of(actions, ev.SendControl)[0].words[Word.STOP] == 1
    assert of(actions, ev.StartTimer) == [ev.StartTimer(10.0, ev.StopOverdue(0, 10.0))]
    exit_all(job, ExitStatus.STOPPED, ranks=[0, 2])  # rank 1 is stuck for good
    actions = job.handle(ev.StopOverdue(0, 10.0), 20.0)
    assert [a.worker for a in of(actions, ev.EndRank)] == ["w1"]
    assert of(actions, ev.FreeSlot) == [ev.FreeSlot("w1")] and job.released


def test_restart_restarts_the_gang_counting_against_the_budget():
    job, actions = hung("restart", max_restarts=2, checkpoint_dir="/ck")
    assert statuses(actions) == ["HUNG", "RESTARTING"] and job.restarts == 1
    exit_all(job, ExitStatus.STOPPED, ranks=[0, 2])
    actions = job.handle(ev.StopOverdue(0, 10.0), 20.0)
    assert of(actions, ev.EndRank) and statuses(actions) == ["QUEUED"]
    assert [r.kind for r in of(actions, ev.Record)] == ["ended"]


def test_a_users_stop_of_a_hung_job_ends_it_within_the_grace():
    job, _ = hung("report")
    actions = job.handle(ev.StopRequested(), 11.0)
    assert statuses(actions) == ["STOPPING"]
    assert of(actions, ev.StartTimer) == [ev.StartTimer(10.0, ev.StopOverdue(0, 10.0))]
    exit_all(job, ExitStatus.STOPPED, ranks=[0, 2])
    actions = job.handle(ev.StopOverdue(0, 10.0), 21.0)
    assert statuses(actions) == ["STOPPED"] and job.released


def test_a_late_overdue_timer_or_a_verdict_on_a_paused_job_changes_nothing():
    job, _ = hung("report")
    job.handle(ev.Progressed(), 12.0)
    assert job.handle(ev.StopOverdue(0, 10.0), 30.0) == []  # every rank is still in
    paused = running(2)
    paused.handle(ev.PauseRequested(), 1.0)
    for rank in (0, 1):
        paused.handle(ev.Paused(rank, 0, step=3), 1.1)
    assert paused.handle(ev.HangDetected(70.0, 60.0, "", 10.0), 80.0) == []


def test_evaluation_batches_are_progress_too():
    w = Watch(0.0)
    beat(w, 1.0, (0, 4, "step"), (1, 4, "step"))
    for t in range(2, 100):  # a long evaluation inside step 4: its batches come in
        w.heard(0, 4, "evaluate", float(t), ticks=4 + t)
    assert w.verdict(100.0, hang_timeout=6) is None
    assert w.verdict(107.5, hang_timeout=6)  # and then they stop coming
