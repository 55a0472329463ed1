"""A worker dies under a running job: within its restart budget the job restarts
from its newest checkpoint on whatever slots it gets, and ends as if nothing happened.

The workers are real Nanny-managed processes, killed with SIGKILL; the nanny
brings each back, so the cluster heals while the tests watch.
"""

from __future__ import annotations

import sqlite3

import pytest

import clustersdk as cs
from clustersdk.control.journal import Journal
from clustersdk.runtime.agent import Agent
from clustersdk.runtime.control_words import Control
from clustersdk.widgets.model import JobView

from . import workloads
from .helpers import (
    Statuses,
    assert_same_run,
    checkpointed_at,
    kill_worker_of,
    losses,
    wait_for,
)

TRAIN = {"steps": 60, "delay": 0.03}


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    """Three CPU slots: a two-rank job has a spare to restart on."""
    c = cs.Cluster.local(workers=3, state_dir=str(tmp_path_factory.mktemp("state3")))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def healed(cluster3):
    """All three slots present and free before the test (the nanny restarts killed workers)."""
    wait_for(
        lambda: len(cluster3.slots()) == 3 and not any(s["job"] for s in cluster3.slots()),
        timeout=60,
    )
    yield cluster3


@pytest.fixture(scope="module")
def uninterrupted(cluster3):
    job = cluster3.launch(workloads.train_ckpt, kwargs={"steps": TRAIN["steps"]}, world_size=2)
    return job.wait(timeout=120), losses(job)


def test_a_lost_worker_restarts_the_job_from_its_checkpoint_bitwise(
    healed, uninterrupted, tmp_path
):
    reference, reference_losses = uninterrupted
    job = healed.launch(
        workloads.train_ckpt,
        kwargs=TRAIN,
        world_size=2,
        timeout=10,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=10,
        max_restarts=2,
    )
    statuses = Statuses(job)
    view = JobView.from_record(job.info())  # a dashboard's model, fed by the live stream
    job.on_event(view.apply)
    wait_for(lambda: checkpointed_at(job, 20), timeout=60)
    lost = kill_worker_of(healed, job, rank=1)
    out = job.wait(timeout=120)
    wait_for(lambda: "FINISHED" in statuses)  # the stream may trail wait() a little
    # it went through the restart, and finished exactly like the uninterrupted run
    assert statuses.after("RESTARTING") == [
        "RESTARTING",
        "QUEUED",
        "STARTING",
        "RUNNING",
        "FINISHED",
    ]
    assert job.restarts == 1
    assert lost not in [r["worker"] for r in job.info()["ranks"]]
    assert_same_run(out, reference, exact=True)
    assert losses(job) == reference_losses  # each step once, the replayed ones replaced
    # the history is the run that counts: every step once per rank, in order, for both
    # the rank that died (its unsent rows) and the one that survived (its rolled-back rows)
    history = job.history()
    for rank in (0, 1):
        assert [r["step"] for r in history if r["rank"] == rank] == list(range(TRAIN["steps"]))
        steps, _ = view.scalars["loss"][rank].points()
        assert steps == [float(step) for step in range(TRAIN["steps"])]
    assert "resumed from" in job.logs(rank=1)


def test_a_paused_job_that_loses_a_worker_comes_back_paused(healed, uninterrupted, tmp_path):
    reference, reference_losses = uninterrupted
    job = healed.launch(
        workloads.train_ckpt,
        kwargs=TRAIN,
        world_size=2,
        timeout=10,
        checkpoint_dir=str(tmp_path),
        max_restarts=1,
    )
    wait_for(lambda: any(r["step"] >= 15 for r in job.history()), timeout=60)
    job.pause()
    saved = job.checkpoint()
    statuses = Statuses(job)
    kill_worker_of(healed, job, rank=0)
    wait_for(lambda: "RESTARTING" in statuses and job.status is cs.JobStatus.PAUSED, timeout=60)
    assert job.info()["checkpoint"] == saved  # it holds at the step it was paused at
    job.resume()
    out = job.wait(timeout=120)
    assert_same_run(out, reference, exact=True)
    assert losses(job) == reference_losses


def test_the_restart_budget_runs_out_and_then_the_job_fails(healed):
    job = healed.launch(workloads.spin, world_size=2, timeout=10, max_restarts=1)
    wait_for(lambda: job.status is cs.JobStatus.RUNNING and len(job.history()) > 5, timeout=60)
    kill_worker_of(healed, job, rank=0)
    # no checkpoint_dir: it starts over, and its history with it
    wait_for(lambda: job.restarts == 1 and job.status is cs.JobStatus.RUNNING, timeout=60)
    assert job.info()["spec"]["resume"] is None
    wait_for(lambda: len(job.history()) > 5, timeout=30)
    for rank in (0, 1):  # the first run's rows are gone: no step twice
        steps = [r["step"] for r in job.history() if r["rank"] == rank]
        assert len(steps) == len(set(steps))
    kill_worker_of(healed, job, rank=1)
    with pytest.raises(
        cs.JobFailedError,
        match=r"left the cluster \(all 1 restart\(s\) of the "
        r"job are used up\)",
    ) as info:
        job.wait(timeout=60)
    assert info.value.rank == 1 and info.value.exc_type == "WorkerLost"
    assert job.restarts == 1
    # both causes stay findable after the job moved on: a restart, then the failure
    events = job.events()
    assert [e["kind"] for e in events] == ["restarted", "failed"]
    assert events[0]["message"].endswith("left the cluster; restart 1 of 1")
    assert "of rank 0 left the cluster" in events[0]["message"] and events[0]["step"] >= 5
    assert "of rank 1 left the cluster (all 1 restart(s)" in events[1]["message"]
    assert events[0]["time"] < events[1]["time"]


def test_stop_during_a_restart_stops_the_job(healed):
    job = healed.launch(workloads.spin, world_size=3, timeout=10, max_restarts=3)
    statuses = Statuses(job)
    wait_for(lambda: job.status is cs.JobStatus.RUNNING, timeout=60)
    kill_worker_of(healed, job, rank=2)
    # a three-rank job on three slots waits QUEUED until the nanny brings the worker back
    wait_for(lambda: "RESTARTING" in statuses, timeout=30)
    assert job.stop(timeout=60) is cs.JobStatus.STOPPED
    assert job.restarts == 1
    wait_for(lambda: len(healed.slots()) == 3, timeout=60)
    assert not any(s["job"] for s in healed.slots())


def test_a_rank_that_cannot_be_started_restarts_the_gang(healed):
    second = healed.slots()[1]["worker"]  # rank 1 of the next two-rank gang
    healed.client.run(workloads.break_start_once, workers=[second])
    job = healed.launch(
        workloads.train_mlp, kwargs={"steps": 5}, world_size=2, timeout=3, max_restarts=1
    )
    out = job.wait(timeout=60)  # rank 0 gave up on its missing peer; the restart ran
    assert len(out["losses"]) == 5
    assert job.restarts == 1


# pieces, without a cluster ----------------------------------------------------------------
def test_late_control_words_of_an_earlier_attempt_are_dropped():
    from clustersdk.protocol import Word, no_words

    def vector(**words: int) -> list[int]:
        out = no_words()
        for name, value in words.items():
            out[Word[name.upper()]] = value
        return out

    class Rank:  # what the agent uses of a rank here: its attempt, its words
        attempt = 1

        def __init__(self) -> None:
            self.control = Control()

        def merge(self, words: list[int]) -> None:
            self.control.merge(words)

    agent = Agent()
    agent.early = {}
    agent.ranks = {"j": Rank()}
    agent.control("j", vector(stop=1), attempt=0)  # the STOP that ended attempt 0
    assert agent.ranks["j"].control.words() == no_words() and not agent.early
    agent.control("j", vector(pause=1), attempt=1)
    assert agent.ranks["j"].control.words() == vector(pause=1)
    agent.control("j", vector(checkpoint=3), attempt=2)  # for a rank not started yet: kept
    assert agent.early[("j", 2)].words() == vector(checkpoint=3)


def test_a_state_dir_of_an_older_release_gains_the_restart_count(tmp_path):
    path = str(tmp_path / "journal.sqlite")
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, scheduler TEXT NOT NULL, "
        "status TEXT NOT NULL, spec TEXT NOT NULL, submitted REAL NOT NULL, started REAL, "
        "ended REAL, reason TEXT NOT NULL DEFAULT '', ranks TEXT NOT NULL DEFAULT '[]', "
        "error TEXT, result BLOB, paused_at INTEGER, checkpoint TEXT, checkpoint_step "
        "INTEGER, checkpoint_error TEXT, total_steps INTEGER)"
    )
    db.execute(
        "INSERT INTO jobs (id, name, scheduler, status, spec, submitted) "
        "VALUES ('old1', 'old', 's', 'FINISHED', '{}', 0)"
    )
    db.commit()
    db.close()
    journal = Journal(path)
    try:
        assert journal.get("old1")["restarts"] == 0  # the old record is kept
        journal.update("old1", restarts=2)
        assert journal.get("old1")["restarts"] == 2
    finally:
        journal.close()


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_max_restarts_must_be_a_count(bad, cluster3):
    with pytest.raises(
        cs.SpecError, match=f"max_restarts must be an int of at least 0, got {bad!r}"
    ):
        cluster3.launch(workloads.spin, world_size=1, max_restarts=bad)
