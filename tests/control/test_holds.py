"""The hold and breakpoint rules, with no cluster: events in, actions out."""

from __future__ import annotations

import pytest

from clustersdk.control import events as ev
from clustersdk.control.faults import is_communication_error
from clustersdk.errors import InvalidTransitionError, SpecError
from clustersdk.protocol import ExitStatus, Word
from clustersdk.status import JobStatus

from .helpers import exit_all, gang, make, of, running, statuses

S = JobStatus
OWN = {"rank": 1, "type": "ValueError", "message": "bad batch at step 12", "traceback": "tb"}
LINK = {
    "rank": 0,
    "type": "DistBackendError",
    "message": "[gloo] Timed out waiting 60000ms for recv operation to complete",
    "traceback": "",
}
FRAMES = [
    {
        "file": "train.py",
        "line": 9,
        "function": "train",
        "code": "raise ValueError",
        "ours": False,
        "locals": {"x": "3"},
        "omitted": 0,
    }
]


def held(world_size: int = 2, **options):
    job = running(world_size, on_error="hold", hold_timeout=600.0, **options)
    actions = job.handle(ev.Held(1, 0, OWN, FRAMES, step=12), 3.0)
    return job, actions


def journaled(actions, key):
    return [a.fields[key] for a in of(actions, ev.Journal) if key in a.fields]


def test_a_rank_that_raises_holds_the_job_pauses_the_others_and_starts_the_timer():
    job, actions = held()
    assert statuses(actions) == ["HELD"]
    (reason,) = journaled(actions, "reason")
    assert reason.startswith("held: rank 1 raised ValueError at step 12: bad batch at step 12;")
    assert "job.debug(1)" in reason and "job.run(fn, ranks=[1])" in reason
    assert "job.stop() or job.restart() ends the hold" in reason
    (record,) = journaled(actions, "held")[-1:]
    assert record["cause"] == 1 and record["ranks"]["1"]["frames"] == FRAMES
    assert [r.kind for r in of(actions, ev.Record)] == ["held"]
    (control,) = of(actions, ev.SendControl)
    assert control.words[Word.PAUSE] == 1 and not control.words[Word.STOP]
    assert of(actions, ev.StartTimer) == [ev.StartTimer(600.0, ev.HoldExpired(0))]
    assert not of(actions, ev.FreeSlot) and not job.released  # the slots stay the job's
    job.handle(ev.Paused(0, 0, step=13), 3.1)
    assert job.status is S.HELD  # a paused peer does not make it PAUSED


def test_a_peer_s_collective_timeout_is_a_consequence_and_a_later_own_error_the_cause():
    job = running(3, on_error="hold")
    assert is_communication_error(LINK)
    job.handle(ev.Held(0, 0, LINK, [], step=12), 3.0)  # the symptom comes first
    assert job.status is S.HELD and job.holds.book.cause == 0
    actions = job.handle(ev.Held(1, 0, OWN, FRAMES, step=12), 3.5)
    assert (
        job.holds.book.cause == 1 and "rank 1 raised ValueError" in journaled(actions, "reason")[0]
    )
    job.handle(ev.Held(2, 0, {**LINK, "rank": 2}, [], step=12), 4.0)
    job.handle(ev.StopRequested(), 5.0)
    actions = exit_all(job, ExitStatus.FAILED)
    (error,) = journaled(actions, "error")
    assert error["type"] == "ValueError" and error["rank"] == 1
    assert [c["rank"] for c in error["consequences"]] == [0, 2]


def test_stop_ends_the_hold_failed_with_the_error_and_ends_ranks_that_never_get_out():
    job, _ = held()
    actions = job.handle(ev.StopRequested(), 10.0)
    assert statuses(actions) == ["STOPPING"]
    assert of(actions, ev.SendControl)[0].words[Word.STOP] == 1
    assert of(actions, ev.StartTimer) == [ev.StartTimer(10.0, ev.StopOverdue(0, 10.0))]
    (event,) = of(actions, ev.Record)
    assert event.kind == "released" and "the hold ended after 7 s: job.stop()" in event.message
    exit_all(job, ExitStatus.STOPPED, ranks=[0])  # rank 1 is stuck in a collective
    actions = job.handle(ev.StopOverdue(0, 10.0), 20.0)
    assert [a.worker for a in of(actions, ev.EndRank)] == ["w1"]
    assert (
        statuses(actions) == ["FAILED"] and journaled(actions, "error")[0]["type"] == "ValueError"
    )
    assert of(actions, ev.Release) and not job.held


def test_the_hold_timeout_fails_the_job():
    job, _ = held()
    assert job.handle(ev.HoldExpired(attempt=7), 600.0) == []  # another gang start's timer
    actions = job.handle(ev.HoldExpired(0), 603.0)
    assert statuses(actions) == ["FAILED"] and journaled(actions, "error")[0]["rank"] == 1
    assert of(actions, ev.SendControl)[-1].words[Word.STOP] == 1
    assert "hold_timeout" in of(actions, ev.Record)[0].message
    exit_all(job, ExitStatus.FAILED)
    assert job.released


def test_restart_from_checkpoint_continues_from_the_newest_checkpoint_without_a_budget():
    job, _ = held(checkpoint_dir="/ck")
    job.handle(ev.CheckpointCommitted(0, 0, seq=0, step=8, path="/ck/step-8"), 2.0)
    actions = job.handle(ev.RestartRequested(), 5.0)
    assert statuses(actions) == ["RESTARTING"] and job.restarts == 0
    assert of(actions, ev.SendControl)[-1].words[Word.STOP] == 1
    actions = exit_all(job, ExitStatus.STOPPED, ranks=[0]) + exit_all(
        job, ExitStatus.FAILED, ranks=[1]
    )
    assert statuses(actions) == ["QUEUED"] and of(actions, ev.Enqueue) == [ev.Enqueue(front=True)]
    assert job.spec.resume == "/ck/step-8" and job.attempt == 1
    assert journaled(actions, "reason") == [
        "restarted from its checkpoint (job.restart()): from checkpoint /ck/step-8"
    ]
    assert job.holds.ranks == [] and job.faults.cause is None  # the new gang starts clean
    # the hold's pause of the other ranks was no one's pause request: it is not carried
    assert job.words[Word.PAUSE] == 0 and job.pending == []


def test_restart_needs_a_held_job_and_a_checkpoint_and_a_refusal_changes_nothing():
    job, _ = held(checkpoint_dir="/ck")
    with pytest.raises(SpecError, match="has no committed checkpoint to restart from"):
        job.handle(ev.RestartRequested(), 5.0)
    assert job.status is S.HELD
    with pytest.raises(
        InvalidTransitionError, match="is RUNNING; only a HELD job can be restarted"
    ):
        running(2).handle(ev.RestartRequested(), 5.0)


def test_a_held_rank_s_lost_worker_fails_the_job_and_another_s_is_a_consequence():
    job, _ = held(3)
    actions = job.handle(ev.WorkerLost(2, 0, "w2", "h2"), 4.0)
    assert job.status is S.HELD and [a.worker for a in of(actions, ev.FreeSlot)] == ["w2"]
    actions = job.handle(ev.WorkerLost(1, 0, "w1", "h1"), 5.0)
    assert statuses(actions) == ["FAILED"]
    error = journaled(actions, "error")[0]
    assert error["type"] == "ValueError" and len(error["consequences"]) == 2


def test_a_hold_on_a_mere_communication_error_fails_naming_the_lost_worker():
    job = running(2, on_error="hold")
    job.handle(ev.Held(0, 0, LINK, [], step=3), 3.0)
    actions = job.handle(ev.WorkerLost(1, 0, "w1", "h1"), 4.0)
    error = journaled(actions, "error")[0]
    assert statuses(actions) == ["FAILED"] and error["type"] == "WorkerLost"
    assert error["consequences"][0]["type"] == "DistBackendError"


def test_a_held_report_while_the_job_leaves_is_a_failure_and_the_rank_is_told_to_stop():
    job = running(2, on_error="hold")
    job.handle(ev.StopRequested(), 2.0)
    actions = job.handle(ev.Held(1, 0, OWN, FRAMES, step=3), 3.0)
    assert statuses(actions) == ["FAILED"]
    assert of(actions, ev.SendControl)[-1].words[Word.STOP] == 1


def test_a_plain_failure_while_held_does_not_end_the_hold():
    job, _ = held()
    assert statuses(job.handle(ev.Failed(0, 0, LINK), 4.0)) == []
    assert job.status is S.HELD and job.faults.consequences[-1]["rank"] == 0
    assert job.handle(ev.GraceExpired(0), 7.0) == [] and job.status is S.HELD


# --- breakpoints ------------------------------------------------------------------------
def console(actions):
    return [a.message for a in of(actions, ev.Publish) if a.message.get("kind") == "console"]


def test_a_breakpoint_pauses_the_job_and_continue_releases_every_rank():
    job = running(2, debug=True)
    actions = job.handle(ev.BreakpointHit(0, 0, k=1, step=5), 2.0)
    assert statuses(actions) == ["PAUSED"]
    assert journaled(actions, "reason")[0].startswith("at ctx.breakpoint() on rank 0, step 5")
    (opened,) = console(actions)
    assert (
        opened["open"] and opened["seq"] == 1 and "ctx.breakpoint() #1 at step 5" in opened["text"]
    )
    out = job.handle(ev.ConsoleOutput(0, 0, k=1, text="(Pdb rank 0) "), 2.1)
    assert console(out)[0]["text"] == "(Pdb rank 0) " and not of(out, ev.SendControl)
    with pytest.raises(InvalidTransitionError):
        job.handle(ev.PauseRequested(), 2.2)
    actions = job.handle(ev.ConsoleOutput(0, 0, k=1, text="c\n", closed=True), 3.0)
    assert statuses(actions) == ["RUNNING"]
    assert of(actions, ev.SendControl)[-1].words[Word.RELEASE] == 1
    assert [c["seq"] for c in job.breakpoints.state()["chunks"]] == [1, 2, 3]


def test_a_breakpoint_reached_before_the_scheduler_heard_every_rank_start_pauses_then():
    job = make(2, debug=True)
    job.handle(gang(2), 0.0)
    job.handle(ev.Started(1, 0), 1.0)
    actions = job.handle(ev.BreakpointHit(0, 0, k=1, step=3), 1.1)  # rank 0's start is late
    assert job.status is S.STARTING and console(actions)[0]["open"] and job.words[Word.RELEASE] == 0
    assert statuses(job.handle(ev.Started(0, 0), 1.2)) == ["RUNNING", "PAUSED"]
    assert journaled(job.handle(ev.ResumeRequested(), 2.0), "status") == ["RUNNING"]
    assert job.words[Word.RELEASE] == 1
    done = make(2, debug=True)  # the session ended before the start was heard: no pause
    done.handle(gang(2), 0.0)
    done.handle(ev.BreakpointHit(0, 0, k=1, step=3), 1.1)
    done.handle(ev.ConsoleOutput(0, 0, k=1, text="c\n", closed=True), 1.2)
    assert done.words[Word.RELEASE] == 1
    for rank in (0, 1):
        done.handle(ev.Started(rank, 0), 1.3)
    assert done.status is S.RUNNING


def test_two_chosen_ranks_release_once_both_sessions_end_and_resume_ends_them_all():
    job = running(3, debug=True)
    job.handle(ev.BreakpointHit(0, 0, k=1, step=5), 2.0)
    job.handle(ev.BreakpointHit(2, 0, k=1, step=5), 2.0)
    actions = job.handle(ev.ConsoleOutput(0, 0, k=1, text="", closed=True), 3.0)
    assert job.status is S.PAUSED and not of(actions, ev.SendControl)
    job.handle(ev.ConsoleOutput(2, 0, k=1, text="", closed=True), 3.0)
    assert job.status is S.RUNNING and job.words[Word.RELEASE] == 1
    job.handle(ev.BreakpointHit(0, 0, k=2, step=9), 4.0)
    actions = job.handle(ev.ResumeRequested(), 5.0)
    assert statuses(actions) == ["RUNNING"] and job.words[Word.RELEASE] == 2


def test_a_breakpoint_of_a_leaving_job_is_released_at_once():
    job = running(2, debug=True)
    job.handle(ev.StopRequested(), 2.0)
    actions = job.handle(ev.BreakpointHit(0, 0, k=1, step=5), 2.1)
    assert statuses(actions) == [] and job.words[Word.RELEASE] == 1
    assert "is skipped" in console(actions)[0]["text"] and not console(actions)[0]["open"]


def test_a_stop_at_a_breakpoint_reaches_the_ranks_and_the_session_s_end_is_harmless():
    job = running(2, debug=True)
    job.handle(ev.BreakpointHit(0, 0, k=1, step=5), 2.0)
    assert statuses(job.handle(ev.StopRequested(), 3.0)) == ["STOPPING"]
    job.handle(ev.ConsoleOutput(0, 0, k=1, text="quit\n", closed=True), 3.1)
    assert statuses(exit_all(job, ExitStatus.STOPPED)) == ["STOPPED"]
