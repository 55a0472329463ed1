"""Jobs on a real two-worker LocalCluster: results, failures, queueing, stop, attach."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import clustersdk as cs
from clustersdk.control.journal import Journal

from . import workloads
from .helpers import wait_for


def test_ddp_equals_single_process_reference(idle):
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 40}, world_size=2, name="ddp-ref")
    out = job.wait(timeout=120)
    reference = workloads.reference_mlp(world_size=2, steps=40)
    assert out["params"].keys() == reference.keys()
    for key, expected in reference.items():
        torch.testing.assert_close(out["params"][key], expected, rtol=0, atol=1e-6)
    assert job.status is cs.JobStatus.FINISHED


def test_history_has_every_step_of_every_rank(idle):
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 25}, world_size=2)
    out = job.wait(timeout=120)
    rows = job.history()
    assert sorted((r["rank"], r["step"]) for r in rows) == [
        (r, s) for r in (0, 1) for s in range(25)
    ]
    assert [r["loss"] for r in rows if r["rank"] == 0] == pytest.approx(out["losses"])
    assert all(isinstance(r["time"], float) for r in rows)
    # incremental reads: nothing new after the last sequence number
    assert job.history(since=rows[-1]["seq"]) == []


def test_rank_failure_reports_rank_type_message_traceback_and_frees_slots(idle):
    started = time.monotonic()
    job = idle.launch(workloads.fail_at, kwargs={"rank": 1, "step": 3}, world_size=2, timeout=10)
    with pytest.raises(cs.JobFailedError) as info:
        job.wait(timeout=60)
    err = info.value
    assert (err.rank, err.exc_type) == (1, "ValueError")
    assert err.message == "boom at step 3 on rank 1"
    assert "in fail_at" in err.traceback and err.traceback.rstrip().endswith(err.message)
    assert "rank 1 raised ValueError: boom at step 3" in str(err)
    assert job.status is cs.JobStatus.FAILED
    # wait() returns once every rank is torn down: the slots are free already
    assert [s["job"] for s in idle.slots()] == [None, None]
    assert time.monotonic() - started < 10
    # the warm workers are not poisoned: the next job runs normally
    out = idle.launch(workloads.train_mlp, kwargs={"steps": 5}, world_size=2).wait(timeout=60)
    assert len(out["losses"]) == 5


def test_two_jobs_in_a_row_on_warm_workers(idle):
    first = idle.launch(workloads.train_mlp, kwargs={"steps": 10}, world_size=2).wait(timeout=60)
    second = idle.launch(workloads.train_mlp, kwargs={"steps": 10}, world_size=2).wait(timeout=60)
    assert first["losses"] == second["losses"]  # same seeds, same data: same run


def test_one_rank_job_and_two_jobs_side_by_side(idle):
    a = idle.launch(workloads.train_mlp, kwargs={"steps": 8}, world_size=1, name="side-a")
    b = idle.launch(workloads.train_mlp, kwargs={"steps": 8}, world_size=1, name="side-b")
    ref = workloads.reference_mlp(world_size=1, steps=8)
    for job in (a, b):
        params = job.wait(timeout=60)["params"]
        for key, expected in ref.items():
            torch.testing.assert_close(params[key], expected, rtol=0, atol=1e-6)


def test_stop_acts_at_the_same_step_on_every_rank(idle):
    job = idle.launch(workloads.spin, world_size=2, name="spinner")
    wait_for(lambda: job.status is cs.JobStatus.RUNNING and len(job.history()) > 4)
    assert job.stop(timeout=30) is cs.JobStatus.STOPPED
    out = job.wait()
    assert out["stopped"] is True
    last = {}
    for row in job.history():
        last[row["rank"]] = max(last.get(row["rank"], -1), row["step"])
    assert last[0] == last[1] == out["stopped_at"] - 1
    with pytest.raises(cs.InvalidTransitionError, match="STOPPED"):
        job.stop()


def test_queued_job_says_what_it_waits_for_then_runs(idle):
    running = idle.launch(workloads.spin, world_size=2, name="hog")
    queued = idle.launch(workloads.train_mlp, kwargs={"steps": 3}, world_size=2, name="patient")
    wait_for(lambda: running.status is cs.JobStatus.RUNNING)
    assert queued.status is cs.JobStatus.QUEUED
    assert queued.reason == (
        "waiting for 2 slots to be free; no estimate of when (the jobs "
        "holding them gave no time_limit); slots are held for it as they "
        "free up"
    )
    running.stop()
    assert len(queued.wait(timeout=60)["losses"]) == 3


def test_stop_while_queued(idle):
    running = idle.launch(workloads.spin, world_size=2)
    queued = idle.launch(workloads.spin, world_size=1)
    assert queued.stop() is cs.JobStatus.STOPPED
    with pytest.raises(cs.JobStoppedError):
        queued.wait()
    running.stop()


def test_logs_capture_print_and_logging_per_rank(idle):
    job = idle.launch(workloads.chatty, world_size=2)
    assert job.wait(timeout=60) == "done"
    for rank in (0, 1):
        text = job.logs(rank)
        assert f"hello from rank {rank} of 2" in text
        assert "partial line without newline" in text
        assert f"a warning from rank {rank}" in text
        assert f"rank {1 - rank} of 2" not in text


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"world_size": 0}, "world_size must be at least 1, got 0"),
        ({"world_size": "2"}, "world_size must be an int, got '2'"),
        ({"world_size": 2.0}, "world_size must be an int, got 2.0"),
        ({"world_size": 2, "strategy": "zero"}, "unknown strategy 'zero'; valid strategies: 'ddp'"),
    ],
)
def test_bad_launch_arguments_fail_at_launch(idle, kwargs, match):
    before = len(idle.jobs())
    with pytest.raises(cs.SpecError, match=match):
        idle.launch(workloads.train_mlp, **kwargs)
    assert len(idle.jobs()) == before


def test_unpicklable_function_fails_at_launch(idle):
    lock = threading.Lock()

    def train(ctx):
        with lock:
            pass

    with pytest.raises(cs.SpecError, match="can't be pickled"):
        idle.launch(train, world_size=1)


def test_more_ranks_than_the_cluster_can_hold(idle):
    with pytest.raises(
        cs.CapacityError, match="world_size=3 is more than this cluster can ever hold: it has 2"
    ):
        idle.launch(workloads.train_mlp, world_size=3)


def test_unknown_job_name(idle):
    with pytest.raises(cs.JobNotFoundError, match="no job named 'nope'"):
        cs.Job.attach(idle, "nope")


def test_wait_timeout_leaves_the_job_running(idle):
    job = idle.launch(workloads.spin, world_size=1)
    with pytest.raises(cs.JobTimeoutError, match="still"):
        job.wait(timeout=0.3)
    assert job.status is cs.JobStatus.RUNNING
    job.stop()


ATTACH_SCRIPT = textwrap.dedent("""
    import json, sys, clustersdk as cs
    with cs.Cluster.connect(sys.argv[1], state_dir=sys.argv[3]) as cluster:
        job = cs.Job.attach(cluster, sys.argv[2])
        rows = job.history()
        print(json.dumps({"status": job.status.name, "id": job.id, "rows": len(rows),
                          "ranks": sorted({r["rank"] for r in rows}),
                          "jobs": [j.name for j in cluster.jobs()]}))
""")


def test_another_process_attaches_by_name(idle):
    job = idle.launch(workloads.spin, world_size=2, name="shared-run")
    wait_for(lambda: len(job.history()) >= 6)
    proc = subprocess.run(
        [sys.executable, "-c", ATTACH_SCRIPT, idle.scheduler_address, "shared-run", idle.state_dir],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["status"] == "RUNNING"
    assert seen["id"] == job.id
    assert seen["rows"] >= 6 and seen["ranks"] == [0, 1]
    assert "shared-run" in seen["jobs"]
    job.stop()


def test_job_records_outlive_the_cluster(tmp_path):
    with cs.Cluster.local(workers=1, state_dir=str(tmp_path)) as cluster:
        job = cluster.launch(workloads.train_mlp, kwargs={"steps": 3}, world_size=1, name="kept")
        job.wait(timeout=60)
    journal = Journal(os.path.join(tmp_path, "journal.sqlite"))
    try:
        record = next(r for r in journal.jobs(journal.get(job.id)["scheduler"]))
        assert (record["name"], record["status"]) == ("kept", "FINISHED")
        assert len(journal.history(job.id)) == 3
    finally:
        journal.close()


def test_connect_accepts_a_client_and_shares_the_registry(idle):
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 2}, world_size=1, name="via-client")
    job.wait(timeout=60)
    other = cs.Cluster.connect(idle.client, state_dir=idle.state_dir)
    try:
        assert "via-client" in [j.name for j in other.jobs()]
        assert "slots=2" in repr(other)
    finally:
        other.close()
    assert not idle.client.status == "closed"  # not ours to close


def test_live_view_follows_every_rank_and_metrics_are_rate_limited(idle):
    job = idle.launch(workloads.spin, kwargs={"sleep": 0.002}, world_size=2, metrics_interval=0.25)
    wait_for(lambda: set(job.latest) == {0, 1})

    # it keeps up: every rank's newer steps arrive (within a few flushes on a busy machine),
    # twice: two of each rank's metrics messages to measure the interval between
    def newer(seen: dict) -> bool:
        return all(job.latest[r]["step"] > seen[r]["step"] for r in (0, 1))

    for _ in range(2):
        seen = job.latest
        wait_for(lambda seen=seen: newer(seen), timeout=10)
    job.stop()
    rows = job.history()
    events = [
        e
        for _, e in idle.client.get_events(f"clustersdk-job-{job.id}")
        if e.get("kind") == "metrics"
    ]
    # hundreds of steps, but batched: between two flushes of one rank at least the
    # interval passes (a rank's own events, started/exit, carry what is left)
    assert len(rows) > 200
    for rank in (0, 1):
        sent = sorted(e["sent"] for e in events if e["rank"] == rank and e["event"] == "metrics")
        assert len(sent) >= 2
        assert min(b - a for a, b in zip(sent, sent[1:])) >= 0.25 - 0.01
        assert sum(len(e["rows"]) for e in events if e["rank"] == rank) == len(
            [r for r in rows if r["rank"] == rank]
        )
    assert sum(len(e["rows"]) for e in events) == len(rows)


def test_job_fails_when_a_worker_dies(tmp_path):
    with cs.Cluster.local(workers=2, state_dir=str(tmp_path)) as cluster:
        job = cluster.launch(workloads.spin, world_size=2, timeout=10)
        wait_for(lambda: job.status is cs.JobStatus.RUNNING)
        victim = next(s["worker"] for s in cluster.slots() if s["job"])
        pid = cluster.client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        victim_rank = next(r["rank"] for r in job.info()["ranks"] if r["worker"] == victim)
        # the cause, however the survivor's broken connection and Dask's notice race
        with pytest.raises(
            cs.JobFailedError,
            match=rf"failed: worker {victim} \(host [^)]+\) "
            rf"of rank {victim_rank} left the cluster",
        ) as info:
            job.wait(timeout=60)
        assert (info.value.rank, info.value.exc_type) == (victim_rank, "WorkerLost")
        assert job.status is cs.JobStatus.FAILED
        (event,) = job.events()  # findable later, with the survivor's error as a consequence
        assert event["kind"] == "failed" and victim in event["message"]
        assert [c["rank"] for c in event["consequences"]] in ([], [1 - victim_rank])
        # the nanny brings the worker back; its slot rejoins and takes new work
        wait_for(lambda: len(cluster.slots()) == 2, timeout=60)
        out = cluster.launch(workloads.train_mlp, kwargs={"steps": 3}, world_size=2).wait(
            timeout=60
        )
        assert len(out["losses"]) == 3


def test_system_samples_are_labelled_by_source(idle):
    job = idle.launch(workloads.spin, world_size=2)
    wait_for(lambda: {s["rank"] for s in job.system()} == {0, 1}, timeout=30)
    job.stop()
    for sample in job.system():
        if torch.cuda.is_available():
            assert sample["source"] == "nvml" and 0 <= sample["gpu_util"] <= 100
        else:  # no GPU: CPU and memory, never passed off as GPU numbers
            assert sample["source"] == "psutil" and "gpu_util" not in sample
            assert 0 < sample["mem_used"] <= sample["mem_total"]


def test_a_refused_action_is_an_exception_not_a_logged_crash(idle, caplog):
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 2}, world_size=1)
    job.wait(timeout=60)
    with caplog.at_level("INFO", logger="distributed"):
        with pytest.raises(cs.InvalidTransitionError, match="is FINISHED"):
            job.stop()
    assert not [r for r in caplog.records if "Exception while handling op" in r.getMessage()]


def test_stop_right_after_launch_is_not_lost(idle):
    job = idle.launch(workloads.spin, world_size=2)
    assert job.stop(timeout=60) is cs.JobStatus.STOPPED


def _subscribers(cluster, job_id: str) -> int:
    """How many clients the scheduler sends the job's events to."""

    def count(dask_scheduler, topic):
        found = dask_scheduler._broker._topics.get(topic)
        return len(found.subscribers) if found is not None else 0

    return cluster.client.run_on_scheduler(count, topic=f"clustersdk-job-{job_id}")


def test_handles_follow_events_only_while_they_are_alive(idle):
    import gc

    job = idle.launch(workloads.train_mlp, kwargs={"steps": 3}, world_size=2)
    job.wait(timeout=60)
    assert _subscribers(idle, job.id) == 1  # the launching handle follows its job
    listed = idle.jobs()  # plain handles: nothing subscribed for them
    attached = cs.Job.attach(idle, job.name)
    assert _subscribers(idle, job.id) == 1 and attached.latest == {}
    assert _subscribers(idle, job.id) == 1  # one subscription per job, shared by handles
    job.close()
    assert _subscribers(idle, job.id) == 1  # the attached handle still follows it
    del attached, listed
    gc.collect()
    wait_for(lambda: _subscribers(idle, job.id) == 0, timeout=10)
