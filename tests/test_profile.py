"""job.profile and the always-on step phases, on a real three-worker LocalCluster."""

from __future__ import annotations

import json
import time

import pytest

import clustersdk as cs
from clustersdk.protocol import PHASES

from . import workloads
from .helpers import losses, step_reached, wait_for, wait_idle

WS = 3
PAUSE = 2.0  # seconds a job is held paused


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    state = tmp_path_factory.mktemp("state3")
    c = cs.Cluster.local(workers=WS, state_dir=str(state))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def idle3(cluster3):
    wait_idle(cluster3)
    yield cluster3
    for job in cluster3.jobs():
        if not job.status.terminal:
            job.stop(wait=False)
    wait_idle(cluster3)


def _launch(cluster, tmp_path, name, steps=40, delay=0.02):
    return cluster.launch(
        workloads.train_ckpt,
        kwargs={"steps": steps, "delay": delay},
        world_size=WS,
        name=name,
        checkpoint_dir=str(tmp_path / name),
    )


def _all_losses(job):
    return {rank: losses(job, rank) for rank in range(WS)}


def test_profile_of_a_running_job_writes_one_trace_per_rank_and_changes_nothing(idle3, tmp_path):
    plain = _launch(idle3, tmp_path, "plain")
    plain.wait(timeout=120)

    job = _launch(idle3, tmp_path, "profiled")
    wait_for(lambda: step_reached(job, 3), timeout=60)
    profile = job.profile(steps=3, timeout=60)
    assert profile.complete and sorted(profile.ranks) == list(range(WS))
    firsts = {r["first_step"] for r in profile.ranks.values()}
    assert len(firsts) == 1 and firsts.pop() >= 3  # every rank, from one agreed step
    assert all(r["steps"] == 3 for r in profile.ranks.values())
    for rank, path in profile.traces.items():
        assert path.startswith(str(tmp_path / "profiled" / "profiles")), path
        with open(path) as f:
            trace = json.load(f)
        assert trace["traceEvents"], f"rank {rank}: empty trace"
    summary = profile.ranks[0]
    assert summary["top_ops"] and summary["wall_s"] > 0
    assert summary["compute_s"] + summary["communication_s"] + summary[
        "data_wait_s"
    ] == pytest.approx(summary["wall_s"])
    assert summary["communication_s"] > 0  # DDP's all-reduce, under gloo
    text = profile.summary()
    assert "rank 2" in text and "complete" in text
    assert "<table>" in profile._repr_html_()

    job.wait(timeout=120)  # it kept running to its end
    assert job.status is cs.JobStatus.FINISHED
    assert _all_losses(job) == _all_losses(plain)
    assert [p.seq for p in job.profiles()] == [1]


def test_profile_of_a_paused_job_starts_at_resume(idle3, tmp_path):
    job = _launch(idle3, tmp_path, "paused", steps=30)
    wait_for(lambda: step_reached(job, 2), timeout=60)
    paused_at = job.pause()
    profile = job.profile(steps=2)
    assert not profile.complete and "starts when the job resumes" in profile.summary()
    job.resume()
    profile.wait(timeout=60)
    assert profile.complete
    assert {r["first_step"] for r in profile.ranks.values()} == {paused_at}
    job.wait(timeout=120)


def test_bad_profile_requests_say_what_is_wrong(idle3, tmp_path):
    job = _launch(idle3, tmp_path, "bad", steps=10, delay=0.05)
    wait_for(lambda: step_reached(job, 1), timeout=60)
    with pytest.raises(cs.SpecError, match=r"steps=0\): steps must be an int from 1"):
        job.profile(steps=0)
    job.wait(timeout=120)
    with pytest.raises(cs.InvalidTransitionError, match="is FINISHED; only a RUNNING or PAUSED"):
        job.profile(steps=3)


def test_phases_cover_every_step_and_rank_and_add_up(idle3, tmp_path):
    job = idle3.launch(
        workloads.train_ckpt,
        kwargs={"steps": 12, "delay": 0.01},
        world_size=WS,
        name="phases",
        checkpoint_dir=str(tmp_path / "phases"),
        checkpoint_every=4,
        async_checkpoint=False,
    )
    wait_for(lambda: step_reached(job, 2), timeout=60)
    job.pause()
    time.sleep(PAUSE)
    job.resume()
    job.wait(timeout=120)
    rows = job.phases()
    assert sorted((r["rank"], r["step"]) for r in rows) == [
        (r, s) for r in range(WS) for s in range(12)
    ]
    for row in rows:
        parts = sum(row[p] for p in PHASES if p != "total")
        assert all(row[p] >= 0 for p in PHASES)
        assert parts <= row["total"] * (1 + 1e-9) + 1e-9, row
        assert row["compute"] >= 0.01  # the sleep in the body
        assert row["total"] < PAUSE / 2, row  # the time paused is no step's
    saved = {(r["rank"], r["step"]) for r in rows if r["checkpoint"] > 0}
    assert saved == {(r, s) for r in range(WS) for s in (4, 8)}  # the periodic saves' steps
    assert job.phases(tail=WS) == rows[-WS:]


def test_the_dashboard_shows_the_phases_of_every_rank(idle3, tmp_path):
    pytest.importorskip("ipywidgets")
    from clustersdk.widgets.job import JobDashboard

    job = _launch(idle3, tmp_path, "dash", steps=8, delay=0.05)
    live = []
    job.on_event(
        lambda msg: live.extend((msg["rank"], int(row[0])) for row in msg.get("phases", ()))
    )
    job.wait(timeout=120)
    wait_for(lambda: len(live) >= WS)  # the phases travel with the live metrics too
    dash = JobDashboard(job)  # opened on a finished job: read back from the journal
    try:
        assert dash.view.phases.band("total")["steps"] == list(range(8))
        assert (
            "Step phases, 3 ranks" in dash.phases.value and "slowest: <b>rank" in dash.phases.value
        )
    finally:
        dash.close()
