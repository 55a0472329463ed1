"""The job lifecycle's rules, with no cluster: events in, actions out."""

from __future__ import annotations

import pytest

from clustersdk.control import events as ev
from clustersdk.errors import InvalidTransitionError, SpecError
from clustersdk.protocol import ExitStatus, Word, no_words, profile_request
from clustersdk.status import JobStatus

from .helpers import exit_all, gang, kinds, make, of, running, statuses, vector

S = JobStatus


# --- the happy path --------------------------------------------------------------------
def test_a_gang_starts_runs_and_finishes_freeing_each_slot_once():
    job = make(3)
    actions = job.handle(gang(3), 0.0)
    assert statuses(actions) == ["STARTING"] and of(actions, ev.StartGang) == [
        ev.StartGang(0, tuple(no_words()))
    ]
    assert of(actions, ev.Journal)[0].fields["ranks"][2] == {
        "rank": 2,
        "worker": "w2",
        "host": "h2",
        "device": "cpu",
    }
    assert job.handle(ev.Started(0, 0), 1.0) == []  # not every rank yet
    job.handle(ev.Started(1, 0), 1.0)
    actions = job.handle(ev.Started(2, 0), 1.5)
    assert statuses(actions) == ["RUNNING"] and of(actions, ev.Journal)[0].fields["started"] == 1.5
    actions = exit_all(job)
    assert statuses(actions) == ["FINISHED"]
    assert [a.worker for a in of(actions, ev.FreeSlot)] == ["w0", "w1", "w2"]
    assert of(actions, ev.Release) == [ev.Release(b"result")] and job.released


def test_pause_waits_for_every_rank_and_resume_continues():
    job = running(2)
    actions = job.handle(ev.PauseRequested(), 2.0)
    assert of(actions, ev.SendControl) == [ev.SendControl(vector(pause=1), 0, ("w0", "w1"))]
    assert job.handle(ev.Paused(0, 0, step=7), 2.1) == []
    actions = job.handle(ev.Paused(1, 0, step=7), 2.2)
    assert statuses(actions) == ["PAUSED"] and of(actions, ev.Journal)[0].fields["paused_at"] == 7
    with pytest.raises(SpecError, match="PAUSED and keeps its process group of 2 ranks"):
        job.handle(ev.ResumeRequested(world_size=1), 3.0)
    actions = job.handle(ev.ResumeRequested(), 3.0)
    assert statuses(actions) == ["RUNNING"]
    assert of(actions, ev.SendControl)[0].words == vector(pause=1, resume=1)


def test_a_pause_that_does_not_happen_in_time_is_withdrawn():
    job = running(2)
    job.handle(ev.PauseRequested(), 2.0)
    actions = job.handle(ev.PauseWithdrawn(), 9.0)
    assert of(actions, ev.SendControl)[0].words[Word.RESUME] == 1 and job.status is S.RUNNING


def test_checkpoint_requests_count_up_and_commits_are_journaled():
    job = running(2, checkpoint_dir="/ck")
    job.handle(ev.CheckpointRequested(), 2.0)
    job.handle(ev.CheckpointRequested(), 2.0)
    assert job.words[Word.CHECKPOINT] == 2
    actions = job.handle(ev.CheckpointCommitted(0, 0, seq=2, step=9, path="/ck/step-9"), 2.5)
    assert job.checkpoint_seq == 2 and (job.checkpoint, job.checkpoint_step) == ("/ck/step-9", 9)
    assert of(actions, ev.Journal)[0].fields == {
        "checkpoint": "/ck/step-9",
        "checkpoint_step": 9,
        "checkpoint_error": None,
        "pending": [],  # the request is answered
    }


def test_suspend_then_resume_at_another_world_size_queues_a_new_attempt():
    job = running(2, checkpoint_dir="/ck")
    actions = job.handle(ev.SuspendRequested(), 2.0)
    assert (
        statuses(actions) == ["SUSPENDING"]
        and of(actions, ev.SendControl)[0].words[Word.SUSPEND] == 1
    )
    job.handle(ev.CheckpointCommitted(0, 0, seq=0, step=12, path="/ck/step-12"), 2.5)
    actions = exit_all(job, ExitStatus.SUSPENDED)
    assert statuses(actions) == ["SUSPENDED"] and not of(actions, ev.Release)
    assert len(of(actions, ev.FreeSlot)) == 2
    actions = job.handle(ev.ResumeRequested(world_size=1), 3.0)
    assert statuses(actions) == ["QUEUED"] and of(actions, ev.Enqueue) == [ev.Enqueue(front=False)]
    assert (job.spec.world_size, job.spec.resume, job.attempt) == (1, "/ck/step-12", 1)
    actions = job.handle(gang(1), 4.0)
    assert of(actions, ev.StartGang)[0].attempt == 1


def test_a_suspend_where_a_rank_finished_instead_ends_the_job():
    job = running(2, checkpoint_dir="/ck")
    job.handle(ev.SuspendRequested(), 2.0)
    job.handle(ev.Exited(0, 0, ExitStatus.OK, b"r"), 3.0)
    actions = job.handle(ev.Exited(1, 0, ExitStatus.SUSPENDED), 3.0)
    assert statuses(actions) == ["FINISHED"] and job.released


# --- stop ------------------------------------------------------------------------------
def test_stop_while_queued_dequeues_and_releases_at_once():
    job = make(2)
    actions = job.handle(ev.StopRequested(), 1.0)
    assert kinds(actions) == ["Dequeue", "Journal", "Publish", "CloseBoard", "Release"]
    assert statuses(actions) == ["STOPPED"]
    assert of(actions, ev.Journal)[0].fields["reason"] == "stopped while QUEUED"


def test_stop_while_running_asks_the_ranks_and_ends_stopped():
    job = running(2)
    actions = job.handle(ev.StopRequested(), 2.0)
    assert (
        statuses(actions) == ["STOPPING"] and of(actions, ev.SendControl)[0].words[Word.STOP] == 1
    )
    assert job.handle(ev.StopRequested(), 2.1) == []  # asked already
    assert statuses(exit_all(job, ExitStatus.STOPPED)) == ["STOPPED"] and job.released


def test_stop_of_a_terminal_job_is_refused():
    job = running(1)
    job.handle(ev.Failed(0, 0, {"rank": 0, "type": "E", "message": "m", "traceback": ""}), 2.0)
    job.handle(ev.GraceExpired(0), 5.0)  # FAILED, its rank not out yet
    with pytest.raises(InvalidTransitionError, match="is FAILED; there is nothing to stop"):
        job.handle(ev.StopRequested(), 3.0)


# --- failures and restarts ------------------------------------------------------------------
ERROR = {"rank": 1, "type": "RuntimeError", "message": "Connection reset by peer", "traceback": ""}


OWN = {"rank": 2, "type": "ValueError", "message": "bad batch", "traceback": "Traceback ..."}


def brief(err: dict) -> dict:
    return {"rank": err["rank"], "type": err["type"], "message": err["message"]}


def test_a_failure_without_restarts_stops_the_others_and_fails_once_they_are_out():
    job = running(3)
    actions = job.handle(ev.Failed(2, 0, OWN), 2.0)
    assert statuses(actions) == [] and of(actions, ev.StartTimer) == [
        ev.StartTimer(3.0, ev.GraceExpired(0))
    ]
    assert of(actions, ev.SendControl)[0].words[Word.STOP] == 1  # it fails either way
    job.handle(ev.Failed(0, 0, ERROR), 2.1)  # a peer's collective breaks: a consequence
    actions = exit_all(job, ExitStatus.FAILED)
    assert statuses(actions) == ["FAILED"] and len(of(actions, ev.FreeSlot)) == 3 and job.released
    failure = [a.fields["error"] for a in of(actions, ev.Journal) if "error" in a.fields][0]
    assert failure == {**OWN, "consequences": [{**brief(ERROR), "rank": 1}]}
    assert [(r.kind, r.message) for r in of(actions, ev.Record)] == [
        ("failed", "rank 2: ValueError: bad batch")
    ]


def test_a_rank_s_own_error_is_the_cause_even_when_a_peer_s_broken_pipe_came_first():
    job = running(3)
    job.handle(ev.Failed(1, 0, ERROR), 2.0)  # the symptom reaches the scheduler first
    job.handle(ev.Failed(2, 0, OWN), 2.05)
    actions = exit_all(job, ExitStatus.FAILED)
    failure = [a.fields["error"] for a in of(actions, ev.Journal) if "error" in a.fields][0]
    assert failure["type"] == "ValueError" and failure["consequences"] == [brief(ERROR)]


def test_a_lost_worker_is_the_cause_and_the_peers_errors_its_consequences():
    """The race of the flaky test: a survivor's gloo error first, then Dask's notice."""
    job = running(2)
    job.handle(ev.Failed(0, 0, {**ERROR, "rank": 0}), 2.0)
    job.handle(ev.Exited(0, 0, ExitStatus.FAILED), 2.1)  # the survivor is out; rank 1 is not
    assert job.status is S.RUNNING
    actions = job.handle(ev.WorkerLost(1, 0, "tcp://w1", "h1"), 2.4)
    failure = [a.fields["error"] for a in of(actions, ev.Journal) if "error" in a.fields][0]
    assert statuses(actions) == ["FAILED"] and job.released
    assert (failure["rank"], failure["type"]) == (1, "WorkerLost")
    assert failure["message"] == "worker tcp://w1 (host h1) of rank 1 left the cluster"
    assert failure["consequences"] == [{**brief(ERROR), "rank": 0}]


def test_a_held_failure_that_no_worker_loss_explains_fails_when_the_grace_is_over():
    job = running(2)
    job.handle(ev.Failed(0, 0, ERROR), 2.0)
    assert job.handle(ev.GraceExpired(0), 5.0) and job.status is S.FAILED


def test_with_restarts_a_failure_is_held_back_and_a_lost_worker_restarts_the_job():
    job = running(2, max_restarts=2, checkpoint_dir="/ck")
    job.handle(ev.CheckpointCommitted(0, 0, seq=0, step=20, path="/ck/step-20"), 1.5)
    actions = job.handle(ev.Failed(0, 0, ERROR), 2.0)  # the peer's symptom came first
    assert of(actions, ev.StartTimer) == [ev.StartTimer(3.0, ev.GraceExpired(0))]
    assert job.status is S.RUNNING
    actions = job.handle(ev.WorkerLost(1, 0, "w1", "h1"), 2.1)  # the cause
    assert statuses(actions) == ["RESTARTING"]
    assert (
        "worker w1 (host h1) of rank 1 left the cluster; restart 1 of 2"
        in of(actions, ev.Journal)[0].fields["reason"]
    )
    assert of(actions, ev.FreeSlot) == [ev.FreeSlot("w1")]
    assert of(actions, ev.SendControl)[0].workers == ("w0",)  # only the survivor
    (event,) = of(actions, ev.Record)  # durable, after RESTARTING has long moved on
    assert event.kind == "restarted" and event.message.startswith("worker w1 (host h1) of rank 1")
    assert event.data["consequences"] == [{**brief(ERROR), "rank": 1}]
    actions = job.handle(ev.Exited(0, 0, ExitStatus.FAILED), 2.5)
    assert statuses(actions) == ["QUEUED"] and of(actions, ev.Enqueue) == [ev.Enqueue(front=True)]
    assert of(actions, ev.TruncateHistory) == [ev.TruncateHistory(20)]
    assert (job.attempt, job.spec.resume, job.restarts) == (1, "/ck/step-20", 1)
    assert job.handle(ev.GraceExpired(0), 5.0) == []  # for the earlier attempt: over
    assert job.handle(ev.Started(0, 0), 5.0) == []  # a late event of the earlier gang


def test_losing_a_whole_host_is_one_restart():
    job = running(3, max_restarts=1)
    job.handle(ev.WorkerLost(1, 0, "w1", "h1"), 2.0)
    actions = job.handle(ev.WorkerLost(2, 0, "w2", "h1"), 2.0)  # the same host's other slot
    assert statuses(actions) == [] and job.status is S.RESTARTING and job.restarts == 1
    assert statuses(exit_all(job, ExitStatus.FAILED, ranks=[0])) == ["QUEUED"]


def test_a_held_failure_that_no_lost_worker_explains_fails_the_job():
    job = running(2, max_restarts=1)
    job.handle(ev.Failed(0, 0, ERROR), 2.0)
    actions = job.handle(ev.GraceExpired(0), 5.0)
    assert statuses(actions) == ["FAILED"] and of(actions, ev.Journal)[0].fields["error"] == ERROR


def test_a_held_failure_fails_the_job_once_every_rank_is_out():
    job = running(2, max_restarts=1)
    job.handle(ev.Failed(0, 0, ERROR), 2.0)
    actions = exit_all(job, ExitStatus.FAILED)
    assert statuses(actions) == ["FAILED"] and job.released


def test_when_the_budget_is_used_up_the_lost_worker_fails_the_job_naming_it():
    job = running(2, max_restarts=1)
    job.handle(ev.WorkerLost(0, 0, "w0", "h0"), 2.0)
    exit_all(job, ExitStatus.FAILED, ranks=[1])
    job.handle(gang(2), 3.0)
    job.handle(ev.Started(0, 1), 3.1)
    actions = job.handle(ev.WorkerLost(1, 1, "w1", "h1"), 4.0)
    error = of(actions, ev.Journal)[0].fields["error"]
    assert statuses(actions) == ["FAILED"] and error["type"] == "WorkerLost" and error["rank"] == 1
    assert (
        "w1 (host h1)" in error["message"]
        and "all 1 restart(s) of the job are used up" in error["message"]
    )


def test_a_paused_job_that_loses_a_worker_comes_back_paused_from_the_start():
    job = running(2, max_restarts=1)
    job.handle(ev.PauseRequested(), 1.0)
    for rank in (0, 1):
        job.handle(ev.Paused(rank, 0, step=3), 1.1)
    job.handle(ev.WorkerLost(0, 0, "w0", "h0"), 2.0)
    actions = exit_all(job, ExitStatus.FAILED, ranks=[1])
    assert of(actions, ev.TruncateHistory) == [ev.TruncateHistory(0)]  # no checkpoint
    assert "from the start (no checkpoint)" in of(actions, ev.Journal)[-1].fields["reason"]
    actions = job.handle(gang(2), 3.0)
    assert of(actions, ev.StartGang)[0].words[Word.PAUSE] == 1


def test_a_rank_that_cannot_be_started_counts_as_a_lost_worker():
    job = make(2, max_restarts=1)
    job.handle(gang(2), 0.0)
    actions = job.handle(ev.StartFailed(1, 0, "OSError", "refused"), 0.5)
    assert statuses(actions) == ["RESTARTING"] and of(actions, ev.FreeSlot) == [ev.FreeSlot("w1")]
    assert (
        "could not start rank 1 on worker w1: refused"
        in of(actions, ev.Journal)[0].fields["reason"]
    )
    actions = job.handle(ev.Exited(0, 0, ExitStatus.FAILED), 1.0)
    assert statuses(actions) == ["QUEUED"]


def test_stop_while_restarting_stops_for_good():
    job = running(2, max_restarts=1)
    job.handle(ev.WorkerLost(1, 0, "w1", "h1"), 2.0)
    assert statuses(job.handle(ev.StopRequested(), 2.1)) == ["STOPPING"]
    actions = exit_all(job, ExitStatus.STOPPED, ranks=[0])
    assert statuses(actions) == ["STOPPED"] and job.released and not of(actions, ev.Enqueue)


def test_closing_the_scheduler_fails_active_jobs_but_keeps_suspended_ones():
    job = running(1)
    actions = job.handle(ev.SchedulerClosing(), 9.0)
    assert of(actions, ev.Journal)[0].fields["error"]["type"] == "SchedulerClosed"
    suspended = running(1, checkpoint_dir="/ck")
    suspended.handle(ev.SuspendRequested(), 1.0)
    exit_all(suspended, ExitStatus.SUSPENDED)
    assert suspended.handle(ev.SchedulerClosing(), 9.0) == []
    assert suspended.status is S.SUSPENDED


# --- requests that make no sense ---------------------------------------------------------------
@pytest.mark.parametrize(
    "request_, match",
    [
        (ev.ResumeRequested(), "only a PAUSED or SUSPENDED job can be resumed"),
        (ev.CheckpointRequested(), "has no checkpoint_dir, so it cannot checkpoint"),
        (ev.SuspendRequested(), "has no checkpoint_dir, so it cannot suspend"),
        (ev.ProfileRequested(3), "is QUEUED; only a RUNNING or PAUSED job can be profiled"),
        (ev.ProfileRequested(0), "steps must be an int from 1"),
    ],
)
def test_a_refused_request_changes_nothing(request_, match):
    job = make(2)
    with pytest.raises((InvalidTransitionError, SpecError), match=match):
        job.handle(request_, 1.0)
    assert job.status is S.QUEUED and list(job.words) == no_words()


def test_resume_of_a_suspended_job_checks_the_world_size_and_the_mesh():
    job = running(4, checkpoint_dir="/ck", strategy="fsdp", mesh={"dp": -1, "tp": 2})
    job.handle(ev.SuspendRequested(), 1.0)
    exit_all(job, ExitStatus.SUSPENDED)
    with pytest.raises(SpecError, match="world_size must be at least 1, got 0"):
        job.handle(ev.ResumeRequested(world_size=0), 2.0)
    with pytest.raises(SpecError):
        job.handle(ev.ResumeRequested(world_size=3), 2.0)  # tp=2 does not divide 3
    assert job.status is S.SUSPENDED


# --- sharing the cluster: preempted, reclaimed --------------------------------------------------
def test_a_preempted_job_suspends_then_queues_again_from_its_checkpoint():
    job = running(3, checkpoint_dir="/ck", max_restarts=1)
    actions = job.handle(ev.Preempted("suspend", "preempted for big (priority 100)"), 2.0)
    assert (
        statuses(actions) == ["SUSPENDING"]
        and of(actions, ev.SendControl)[0].words[Word.SUSPEND] == 1
    )
    job.handle(ev.CheckpointCommitted(0, 0, seq=0, step=12, path="/ck/step-12"), 2.5)
    actions = exit_all(job, ExitStatus.SUSPENDED)
    assert statuses(actions) == ["QUEUED"] and of(actions, ev.Enqueue) == [ev.Enqueue()]
    assert len(of(actions, ev.FreeSlot)) == 3 and not of(actions, ev.Release)
    assert of(actions, ev.TruncateHistory) == [ev.TruncateHistory(12)]
    assert (job.spec.resume, job.attempt, job.restarts) == ("/ck/step-12", 1, 0)
    assert of(actions, ev.Journal)[-1].fields["reason"] == "preempted for big (priority 100)"
    assert not job.sharing.preempted
    assert of(job.handle(gang(3), 4.0), ev.StartGang)[0].attempt == 1


def test_a_preempted_job_without_a_checkpoint_dir_stops_and_starts_over():
    job = running(2)
    assert statuses(job.handle(ev.Preempted("suspend", "preempted"), 2.0)) == ["STOPPING"]
    actions = exit_all(job, ExitStatus.STOPPED)
    assert statuses(actions) == ["QUEUED"] and job.spec.resume is None
    assert of(actions, ev.TruncateHistory) == [ev.TruncateHistory(0)]


def test_a_suspend_past_the_preemption_grace_becomes_a_stop_and_keeps_the_old_checkpoint():
    job = running(2, checkpoint_dir="/ck")
    job.handle(ev.CheckpointCommitted(0, 0, seq=0, step=5, path="/ck/step-5"), 1.5)
    job.handle(ev.Preempted("suspend", "preempted"), 2.0)
    actions = job.handle(ev.Preempted("suspend", "preempted: suspend overdue", overdue=True), 9.0)
    assert statuses(actions) == ["STOPPING"] and of(actions, ev.SendControl)[0].words[Word.STOP]
    actions = exit_all(job, ExitStatus.STOPPED)
    assert statuses(actions) == ["QUEUED"] and job.spec.resume == "/ck/step-5"


def test_a_users_stop_during_a_preemption_wins():
    job = running(2, checkpoint_dir="/ck")
    job.handle(ev.Preempted("suspend", "preempted"), 2.0)
    assert statuses(job.handle(ev.StopRequested(), 2.1)) == ["STOPPING"]
    actions = exit_all(job, ExitStatus.STOPPED)
    assert statuses(actions) == ["STOPPED"] and job.released and not of(actions, ev.Enqueue)


@pytest.mark.parametrize("status", [S.QUEUED, S.STARTING, S.SUSPENDING])
def test_preemption_and_reclaim_reach_only_a_running_or_paused_job(status):
    job = make(2, checkpoint_dir="/ck")
    if status is not S.QUEUED:
        job.handle(gang(2), 0.0)
    if status is S.SUSPENDING:
        for rank in range(2):
            job.handle(ev.Started(rank, 0), 1.0)
        job.handle(ev.SuspendRequested(), 1.5)
    assert job.status is status
    assert job.handle(ev.Preempted("suspend", "p"), 2.0) == []
    assert job.handle(ev.Reclaimed("suspend", "idle"), 2.0) == []
    assert job.status is status


def test_an_idle_paused_job_is_reclaimed_to_suspended_and_stays_there():
    job = running(2, checkpoint_dir="/ck")
    for rank in range(2):
        job.handle(ev.Paused(rank, 0, step=4), 1.5)
    reason = "reclaimed: paused for more than 600 s while others waited"
    assert statuses(job.handle(ev.Reclaimed("suspend", reason), 700.0)) == ["SUSPENDING"]
    actions = exit_all(job, ExitStatus.SUSPENDED)
    assert statuses(actions) == ["SUSPENDED"] and not of(actions, ev.Enqueue)
    assert [a.fields["reason"] for a in of(actions, ev.Journal) if "status" in a.fields] == [reason]


def test_an_idle_job_without_a_checkpoint_dir_is_reclaimed_by_stopping_it():
    job = running(2)
    job.handle(ev.Reclaimed("suspend", "reclaimed: idle"), 700.0)
    actions = exit_all(job, ExitStatus.STOPPED)
    assert statuses(actions) == ["STOPPED"] and job.released
    assert of(actions, ev.Journal)[0].fields["reason"] == "reclaimed: idle"


def test_a_gang_smaller_than_asked_for_runs_at_that_world_size():
    job = make(4, min_world_size=2)
    actions = job.handle(gang(3), 0.0)
    assert [(r.kind, r.data) for r in of(actions, ev.Record)] == [
        ("resized", {"world_size": 3, "was": 4, "asked": 4})
    ]
    assert job.spec.asked_world_size == 4
    assert job.world_size == 3 and of(actions, ev.Journal)[0].fields["spec"]["world_size"] == 3
    assert len(of(actions, ev.StartGang)[0].words) == len(Word) and job.held == {0, 1, 2}


def test_closing_the_scheduler_keeps_a_queued_job_for_the_next_one():
    job = make(2)
    actions = job.handle(ev.SchedulerClosing(), 9.0)
    assert job.status is S.QUEUED and not of(actions, ev.Release)
    assert "restarted at the same address" in of(actions, ev.Journal)[0].fields["reason"]


def test_a_job_on_fewer_ranks_grows_back_through_a_checkpoint():
    job = make(4, min_world_size=2, checkpoint_dir="/ck")
    job.handle(gang(3), 0.0)
    for rank in range(3):
        job.handle(ev.Started(rank, 0), 1.0)
    actions = job.handle(ev.Grow(4), 2.0)
    assert (
        statuses(actions) == ["SUSPENDING"]
        and of(actions, ev.SendControl)[0].words[Word.SUSPEND] == 1
    )
    assert [(r.kind, r.data) for r in of(actions, ev.Record)] == [
        ("resized", {"world_size": 4, "was": 3})
    ]
    job.handle(ev.CheckpointCommitted(0, 0, seq=0, step=8, path="/ck/step-8"), 2.5)
    actions = exit_all(job, ExitStatus.SUSPENDED)
    assert statuses(actions) == ["QUEUED"] and of(actions, ev.Enqueue)
    assert (job.spec.world_size, job.spec.asked_world_size, job.spec.resume) == (
        4,
        None,
        "/ck/step-8",
    )
    assert job.handle(ev.Grow(4), 3.0) == []  # only a RUNNING job on fewer ranks grows


def test_profile_requests_reach_every_rank_as_one_word_and_complete_when_all_report():
    job = running(2)
    sent = of(job.handle(ev.ProfileRequested(5), 2.0), ev.SendControl)
    assert len(sent) == 1 and sent[0].workers == ("w0", "w1")
    assert profile_request(sent[0].words[Word.PROFILE]) == (1, 5)
    # a second, shorter request still wins the element-wise max: its seq is newer
    later = of(job.handle(ev.ProfileRequested(2), 2.5), ev.SendControl)[0]
    assert later.words[Word.PROFILE] > sent[0].words[Word.PROFILE]
    assert profile_request(later.words[Word.PROFILE]) == (2, 2)
    first = job.handle(ev.Profiled(0, job.attempt, 1, {"path": "/t/rank0.json"}), 3.0)
    assert not of(first, ev.Publish) and not job.profiles.entry(1)["complete"]
    done = job.handle(ev.Profiled(1, job.attempt, 1, {"path": "/t/rank1.json"}), 3.0)
    assert [a.message for a in of(done, ev.Publish)] == [{"kind": "profile", "seq": 1}]
    entry = job.profiles.entry(1)
    assert entry["complete"] and [r["rank"] for r in entry["ranks"]] == [0, 1]
    assert of(done, ev.Journal)[0].fields["profiles"][0]["complete"]


@pytest.mark.parametrize("steps", [0, -1, 1001, 2.5, True, "5"])
def test_profile_steps_must_be_a_sensible_int(steps):
    job = running(2)
    with pytest.raises(SpecError, match="steps must be an int from 1 to 1000"):
        job.handle(ev.ProfileRequested(steps), 2.0)
    assert job.profiles.seq == 0 and not job.profiles.entries


def test_only_a_running_or_paused_job_can_be_profiled():
    job = make(2)
    with pytest.raises(InvalidTransitionError, match="is QUEUED; only a RUNNING or PAUSED"):
        job.handle(ev.ProfileRequested(3), 0.0)
    job = running(2)
    job.handle(ev.PauseRequested(), 1.0)
    for rank in range(2):
        job.handle(ev.Paused(rank, job.attempt, 7), 1.5)
    assert job.status is S.PAUSED
    assert of(job.handle(ev.ProfileRequested(3), 2.0), ev.SendControl)


def test_a_peers_broken_link_on_the_way_out_does_not_fail_a_stopped_job():
    job = running(3, max_restarts=1)
    job.handle(ev.WorkerLost(2, 0, "w2", "h2"), 2.0)  # RESTARTING: the others stop
    job.handle(ev.StopRequested(), 2.1)  # and the user stops it for good
    job.handle(ev.Failed(0, 0, {**ERROR, "rank": 0}), 2.2)  # a survivor's collective broke
    actions = exit_all(job, ExitStatus.FAILED, ranks=[0, 1])
    assert statuses(actions) == ["STOPPED"] and job.released
    own = running(2)
    own.handle(ev.StopRequested(), 1.0)
    actions = own.handle(ev.Failed(1, 0, {**OWN, "rank": 1}), 1.1)  # its own error still counts
    assert statuses(actions) == ["FAILED"]


# --- requests asked before the first step boundary ------------------------------------------
def test_a_queued_jobs_pause_goes_with_its_gang_and_holds_it_before_step_one():
    job = make(2)
    assert job.handle(ev.PauseRequested(), 0.5) == [ev.Journal({"pending": [{"op": "pause"}]})]
    actions = job.handle(gang(2), 1.0)
    assert of(actions, ev.StartGang) == [ev.StartGang(0, vector(pause=1))]
    job.handle(ev.Started(0, 0), 1.1)
    job.handle(ev.Paused(0, 0, step=0), 1.2)  # a rank may wait before its peer said it started
    assert statuses(job.handle(ev.Started(1, 0), 1.3)) == ["RUNNING"]
    actions = job.handle(ev.Paused(1, 0, step=0), 1.4)
    assert statuses(actions) == ["PAUSED"] and of(actions, ev.Journal)[0].fields == {
        "status": "PAUSED",
        "paused_at": 0,
        "pending": [],
    }


def test_a_starting_jobs_pause_reaches_its_ranks_and_a_resume_lets_it_go_before_then():
    job = make(2)
    job.handle(gang(2), 0.0)
    actions = job.handle(ev.PauseRequested(), 0.5)
    assert of(actions, ev.SendControl) == [ev.SendControl(vector(pause=1), 0, ("w0", "w1"))]
    assert job.status is S.STARTING and job.pause_pending
    actions = job.handle(ev.ResumeRequested(), 0.6)
    assert of(actions, ev.SendControl)[0].words == vector(pause=1, resume=1)
    assert not job.pause_pending and job.pending == []
    with pytest.raises(InvalidTransitionError, match="only a PAUSED or SUSPENDED job can be"):
        job.handle(ev.ResumeRequested(), 0.7)  # nothing to let go any more


def test_a_pause_withdrawn_at_its_timeout_lets_a_starting_job_go():
    job = make(2)
    job.handle(gang(2), 0.0)
    job.handle(ev.PauseRequested(), 0.5)
    actions = job.handle(ev.PauseWithdrawn(), 9.0)
    assert of(actions, ev.SendControl)[0].words == vector(pause=1, resume=1)


def test_early_checkpoints_are_pending_until_committed_and_numbered_across_gangs():
    job = make(2, checkpoint_dir="/ck", max_restarts=1)
    job.handle(ev.CheckpointRequested(), 0.5)
    assert job.pending == [{"op": "checkpoint", "seq": 1}]
    assert of(job.handle(gang(2), 1.0), ev.StartGang)[0].words == vector(checkpoint=1)
    job.handle(ev.CheckpointCommitted(0, 0, seq=1, step=0, path="/ck/step-0"), 2.0)
    assert job.pending == [] and job.checkpoint_step == 0
    job.handle(ev.WorkerLost(1, 0, "w1", "h1"), 3.0)
    exit_all(job, ExitStatus.STOPPED, ranks=[0])
    assert job.status is S.QUEUED and job.words[Word.CHECKPOINT] == 0  # nothing pending
    job.handle(ev.CheckpointRequested(), 4.0)
    assert job.words[Word.CHECKPOINT] == 2  # not 1: that one is answered already


def test_a_restart_carries_the_pause_and_checkpoint_its_gang_never_reached():
    job = make(2, checkpoint_dir="/ck", max_restarts=1)
    job.handle(gang(2), 0.0)
    job.handle(ev.PauseRequested(), 0.5)
    job.handle(ev.CheckpointRequested(), 0.5)
    job.handle(ev.WorkerLost(0, 0, "w0", "h0"), 1.0)  # while STARTING
    exit_all(job, ExitStatus.STOPPED, ranks=[1])
    assert job.status is S.QUEUED and job.attempt == 1
    assert job.pending == [{"op": "pause"}, {"op": "checkpoint", "seq": 1}]
    assert of(job.handle(gang(2), 2.0), ev.StartGang) == [
        ev.StartGang(1, vector(pause=1, checkpoint=1))
    ]


def test_a_pause_in_force_is_not_pending():
    job = running(2, checkpoint_dir="/ck")
    job.handle(ev.PauseRequested(), 1.0)
    for rank in (0, 1):
        job.handle(ev.Paused(rank, 0, step=4), 1.1)
    assert job.status is S.PAUSED and not job.pause_pending  # in force: not pending


def test_a_queued_job_is_suspended_out_of_the_queue_and_resumed_back_into_it():
    job = make(2, checkpoint_dir="/ck", resume="/old/step-3")
    job.handle(ev.PauseRequested(), 0.5)
    actions = job.handle(ev.SuspendRequested(), 1.0)
    assert kinds(actions)[0] == "Dequeue" and statuses(actions) == ["SUSPENDED"]
    assert job.pending == []  # a resume lets the pause go
    actions = job.handle(ev.ResumeRequested(), 2.0)
    assert statuses(actions) == ["QUEUED"] and of(actions, ev.Enqueue)
    assert job.spec.resume == "/old/step-3"  # nothing was saved: as it was launched
    with pytest.raises(SpecError, match="has no checkpoint_dir, so it cannot suspend"):
        make(2).handle(ev.SuspendRequested(), 0.0)


def test_a_starting_job_suspends_at_its_first_boundary():
    job = make(2, checkpoint_dir="/ck")
    job.handle(gang(2), 0.0)
    actions = job.handle(ev.SuspendRequested(), 0.5)
    assert statuses(actions) == ["SUSPENDING"]
    assert of(actions, ev.SendControl)[0].words == vector(suspend=1)


def test_a_stopped_queued_job_forgets_what_it_was_asked():
    job = make(2, checkpoint_dir="/ck")
    job.handle(ev.PauseRequested(), 0.5)
    actions = job.handle(ev.StopRequested(), 1.0)
    assert statuses(actions) == ["STOPPED"] and of(actions, ev.Journal)[-1].fields["pending"] == []


def test_a_takeover_asks_the_journaled_requests_again():
    pending = [
        {"op": "pause"},
        {"op": "checkpoint", "seq": 3},
        {"op": "update", "seq": 4, "changes": {"lr": 0.01}},
    ]
    job = make(2, checkpoint_dir="/ck")
    job = type(job)(job.spec, failure_grace=3.0, pending=pending)
    assert [p["op"] for p in job.pending] == ["pause", "checkpoint", "update"]
    (start,) = of(job.handle(gang(2), 0.0), ev.StartGang)
    assert start.words[Word.PAUSE] == start.words[Word.CHECKPOINT] == 1
    assert job.live.carry is not None and job.live.carry["changes"] == {"lr": 0.01}


def test_what_no_gang_will_take_is_still_refused():
    # (a FINISHED job's: the control plane refuses, it has no lifecycle any more)
    job = running(2, checkpoint_dir="/ck", max_restarts=1)
    job.handle(ev.WorkerLost(0, 0, "w0", "h0"), 1.0)
    assert job.status is S.RESTARTING
    for request, match in [
        (ev.PauseRequested(), "is RESTARTING; it cannot become PAUSED"),
        (ev.CheckpointRequested(), "is RESTARTING; a checkpoint needs a QUEUED, STARTING"),
        (ev.SuspendRequested(), "is RESTARTING; it cannot become SUSPENDING"),
    ]:
        with pytest.raises(InvalidTransitionError, match=match):
            job.handle(request, 5.0)
    script = make(2, script="/work/train.py", fn="train.py")
    with pytest.raises(InvalidTransitionError, match="opted in at its first clustersdk.script"):
        script.handle(ev.PauseRequested(), 0.0)
