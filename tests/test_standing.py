"""A standing cluster (``clustersdk cluster up``) on this host: detached from the command
that started it, supervised, reached by name from other processes, taken down whole.

The cluster is started with the real CLI in a process of its own (the state directory a
temporary one) and always taken down, its processes killed if ``down`` fails.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil
import pytest

import clustersdk as cs
from clustersdk.standing.record import HostPaths, HostPlan, Paths, Process, read_json
from clustersdk.standing.supervisor import Supervisor

from . import workloads
from .helpers import (
    MOVING_KW,
    assert_bitwise,
    assert_same_run,
    cli,
    rows,
    running_beside_a_reference,
    step_reached,
    wait_for,
)

pytestmark = pytest.mark.slow

NAME = "team"


def cluster_pids(state: str) -> set[int]:
    """The supervisor's processes and everything they started (what `down` must end)."""
    found = read_json(Paths(state, NAME).host("localhost").pid_file)
    if not found:
        return set()
    try:
        root = psutil.Process(int(found["pid"]))
        return {root.pid} | {p.pid for p in root.children(recursive=True)}
    except psutil.Error:
        return set()


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    return str(tmp_path_factory.mktemp("standing"))


@pytest.fixture(scope="module")
def team(state):
    """``clustersdk cluster up team --local 2``, taken down (or killed) at the end."""
    started = time.monotonic()
    up = cli(state, "cluster", "up", NAME, "--local", "2", "--json")
    took = time.monotonic() - started
    pids = cluster_pids(state)
    try:
        assert up.returncode == 0, up.stderr
        yield {"record": json.loads(up.stdout), "seconds": took}
    finally:
        cli(state, "cluster", "down", NAME, "--now")
        for pid in pids | cluster_pids(state):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def connect(state: str) -> cs.Cluster:
    return cs.Cluster.connect(NAME, state_dir=state, timeout=30)


def supervised(state: str) -> dict:
    return (read_json(Paths(state, NAME).host("localhost").status) or {}).get("processes", {})


def test_up_returns_at_once_and_a_job_from_another_process_runs(team, state):
    assert team["seconds"] < 15, team
    record = team["record"]
    assert record["address"].startswith("tls://127.0.0.1:") and os.path.exists(
        record["credentials"]
    )
    # the command's process is gone; what it started runs in a session of its own
    supervisor = read_json(Paths(state, NAME).host("localhost").pid_file)["pid"]
    assert os.getsid(supervisor) == supervisor != os.getsid(0)
    with connect(state) as cluster:
        assert cluster.scheduler_address == record["address"]
        assert (
            cluster.launch(workloads.count_to, kwargs={"steps": 5}, world_size=2).wait(60) == "done"
        )
    again = cli(state, "cluster", "up", NAME, "--local", "2")  # idempotent: reports it
    assert again.returncode == 0 and "running at" in again.stderr
    status = cli(state, "cluster", "status", NAME, "--json")
    assert status.returncode == 0, status.stderr
    seen = json.loads(status.stdout)
    assert seen["reachable"] and len(seen["slots"]) == 2
    assert set(seen["hosts"]["localhost"]["processes"]) == {"scheduler", "worker-0", "worker-1"}


def test_a_killed_scheduler_comes_back_and_takes_its_jobs_over(team, state, tmp_path):
    address = team["record"]["address"]
    kwargs = {"steps": 40, "delay": 0.05}
    with connect(state) as cluster:
        reference = cluster.launch(workloads.train_ckpt, kwargs=kwargs, world_size=2).wait(120)
        running = cluster.launch(
            workloads.train_ckpt,
            kwargs=kwargs,
            world_size=2,
            name="running",
            checkpoint_dir=str(tmp_path / "ck"),
            checkpoint_every=5,
            max_restarts=1,
        )
        wait_for(lambda: step_reached(running, 12), timeout=60)
        queued = cluster.launch(
            workloads.count_to, kwargs={"steps": 3}, world_size=2, name="queued"
        )
        assert queued.status is cs.JobStatus.QUEUED
        scheduler = supervised(state)["scheduler"]["pid"]
        os.kill(scheduler, signal.SIGKILL)
        killed = time.monotonic()
    # back at the same address within 10 s (its workers follow it)
    back = wait_for(
        lambda: (
            (p := supervised(state)["scheduler"])["pid"] != scheduler and p["state"] == "running"
        ),
        timeout=10,
    )
    assert back and time.monotonic() - killed < 10
    with connect(state) as cluster:
        assert cluster.scheduler_address == address
        again = cs.Job.attach(cluster, "running")
        out = again.wait(timeout=180)
        assert_same_run(out, reference, exact=True)
        restarted = [e for e in again.events() if e["kind"] == "restarted"]
        assert (
            restarted
            and "the Dask scheduler stopped while the job was RUNNING" in restarted[0]["message"]
        )
        assert cs.Job.attach(cluster, "queued").wait(timeout=60) == "done"
        events = cluster.sync(cluster.control.cluster_events)
        assert any(
            e["kind"] == "restarted" and e["message"].startswith("scheduler ") for e in events
        ), events
    assert supervised(state)["scheduler"]["restarts"] >= 1


def test_a_killed_worker_is_back_within_ten_seconds(team, state):
    wait_for(lambda: all(p["state"] == "running" for p in supervised(state).values()), timeout=60)
    worker = supervised(state)["worker-1"]["pid"]
    os.kill(worker, signal.SIGKILL)
    killed = time.monotonic()
    with connect(state) as cluster:
        wait_for(
            lambda: len(cluster.slots()) == 2 and supervised(state)["worker-1"]["pid"] != worker,
            timeout=10,
        )
        assert time.monotonic() - killed < 10
        events = cluster.sync(cluster.control.cluster_events)
        assert any("died of SIGKILL" in e["message"] for e in events if e["kind"] == "restarted")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("to_the_worker_too", [False, True], ids=["systemd", "host-shutdown"])
def test_a_sigterm_to_a_nanny_moves_its_job_first_and_the_nanny_goes(
    team, state, tmp_path, to_the_worker_too
):
    """What systemd or Kubernetes do to a worker's service: SIGTERM to the process they
    started, its nanny (a host's shutdown: to every process, its worker too, whose
    agent takes the nanny's SIGTERM after its own for the same one). The job
    checkpoints, moves (to the worker the supervisor starts again) and loses no step;
    the nanny and its worker are gone."""
    wait_for(lambda: all(p["state"] == "running" for p in supervised(state).values()), timeout=60)
    with connect(state) as cluster:
        wait_for(lambda: len(cluster.slots()) == 2, timeout=30)
        (want_state, want_rows), job, seen = running_beside_a_reference(
            cluster, "nanny-noticed", tmp_path
        )
        nanny = psutil.Process(supervised(state)["worker-1"]["pid"])
        its = {p.pid for p in nanny.children(recursive=True)}
        ((leaving, worker),) = [
            (w, p) for w, p in cluster.client.run(os.getpid).items() if p in its
        ]
        at = max(r["step"] for r in job.history())
        nanny.send_signal(signal.SIGTERM)
        if to_the_worker_too:
            os.kill(worker, signal.SIGTERM)

        got = job.wait(timeout=120)
        assert seen.after("RUNNING")[:3] == ["RUNNING", "SUSPENDING", "QUEUED"]
        (notice,) = [e for e in job.events() if e["kind"] == "preempted"]
        assert f"worker {leaving} (host " in notice["message"]
        assert "received SIGTERM" in notice["message"]
        assert job.info()["checkpoint_step"] >= at and job.restarts == 0
        assert_bitwise(got, want_state, MOVING_KW["steps"])
        assert rows(job) == want_rows  # no step lost, none done twice
        assert gone(nanny.pid) and gone(worker)
        wait_for(lambda: len(cluster.slots()) == 2, timeout=60)  # its supervisor's new one


def test_a_person_added_from_the_cli_uses_the_cluster_as_themselves(team, state):
    added = cli(state, "cluster", "add-user", "bob", "--cluster", NAME, "--json")
    assert added.returncode == 0, added.stderr
    bob_file = json.loads(added.stdout)["credentials"]
    with connect(state) as admin:
        theirs = admin.launch(workloads.spin, world_size=1, name="admins-job")
        wait_for(lambda: theirs.status is cs.JobStatus.RUNNING, timeout=60)
        with cs.Cluster.connect(team["record"]["address"], credentials=bob_file) as bob:
            seen = cs.Job.attach(bob, "admins-job")
            assert seen.owner == admin.whoami()["name"]
            with pytest.raises(cs.AccessDeniedError, match=f"it belongs to '{seen.owner}'"):
                seen.stop()
            mine = bob.launch(workloads.count_to, kwargs={"steps": 2}, world_size=1, name="bobs")
            assert mine.wait(timeout=60) == "done" and mine.owner == "bob"
        theirs.stop()


def test_the_magic_and_the_cli_find_it_by_name_too(team, state):
    """``%cluster connect team`` and ``clustersdk jobs --cluster team`` reach the cluster
    that Cluster.connect("team") reaches, as its admin."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clustersdk")
    magics = shell.magics_manager.registry["ClusterMagics"]
    connected = shell.run_cell(f"%cluster connect {NAME} --state-dir {state}", store_history=False)
    try:
        assert connected.success, connected.error_in_exec
        assert magics.current.scheduler_address == team["record"]["address"]
        job = magics.current.launch(
            workloads.count_to, kwargs={"steps": 2}, world_size=2, name="by-magic"
        )
        assert job.wait(timeout=60) == "done"
    finally:
        if magics.current is not None:  # disconnects: the cluster stands
            shell.run_cell("%cluster close", store_history=False)
    assert cli(state, "cluster", "status", NAME).returncode == 0
    listed = cli(state, "jobs", "--all", "--cluster", NAME, "--json")
    assert listed.returncode == 0, listed.stderr
    assert "by-magic" in [j["name"] for j in json.loads(listed.stdout)]


def test_down_keeping_its_state_and_up_again_is_an_upgrade(team, state, tmp_path):
    """What an upgrade of clustersdk does: down with its jobs suspended and its state kept,
    up again at the same address, the job resumed from its checkpoint to the same end."""
    kwargs = {"steps": 120, "delay": 0.05}  # long enough to be suspended, not finished
    with connect(state) as cluster:
        reference = cluster.launch(workloads.train_ckpt, kwargs=kwargs, world_size=2).wait(120)
        job = cluster.launch(
            workloads.train_ckpt,
            kwargs=kwargs,
            world_size=2,
            name="long",
            checkpoint_dir=str(tmp_path / "ck"),
        )
        wait_for(lambda: step_reached(job, 8), timeout=60)
    down = cli(state, "cluster", "down", NAME, "--keep-state")
    assert down.returncode == 0, down.stderr
    assert "suspending job 'long'" in down.stderr and not cluster_pids(state)
    up = cli(state, "cluster", "up", NAME, "--json")
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout)["address"] == team["record"]["address"]
    with connect(state) as cluster:
        again = cs.Job.attach(cluster, "long")
        assert again.status is cs.JobStatus.SUSPENDED
        again.resume()
        assert_same_run(again.wait(timeout=180), reference, exact=True)


def test_down_now_is_quick_and_leaves_no_process_and_no_key(team, state):
    """Run last: it takes the module's cluster down, a job still running."""
    with connect(state) as cluster:
        # steps of a minute: a SIGTERM's notice would wait for it to reach a boundary
        job = cluster.launch(workloads.spin, kwargs={"sleep": 60}, world_size=2, name="slow")
        wait_for(lambda: job.status is cs.JobStatus.RUNNING, timeout=60)
    pids = cluster_pids(state)
    assert len(pids) >= 4  # a supervisor, a scheduler, two nannies (and their workers...)
    started = time.monotonic()
    down = cli(state, "cluster", "down", NAME, "--now")
    assert down.returncode == 0, down.stderr
    # its nannies close at once (SIGINT); a SIGTERM would let their workers wait for the
    # scheduler and the steps (about 8 s here, against 2.5 s)
    assert time.monotonic() - started < 5
    wait_for(
        lambda: (
            not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
        ),
        timeout=10,
    )
    assert not os.path.exists(Paths(state, NAME).root)
    assert not [e for e in os.listdir(os.path.join(state, "clusters")) if e.startswith("standing-")]
    with pytest.raises(cs.SpecError, match="no cluster named 'team'"):
        cs.Cluster.connect(NAME, state_dir=state)


# --- the supervisor alone -----------------------------------------------------------------------------
def test_a_process_that_keeps_failing_is_given_up_on_saying_why(tmp_path):
    paths = HostPaths(str(tmp_path / "loop"))
    plan = HostPlan(
        "loop",
        [Process("broken", [sys.executable, "-c", "import sys; print('no luck'); sys.exit(3)"])],
        max_quick_failures=3,
        quick_s=30,
    )
    supervisor = Supervisor(paths, plan)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and supervisor.running[0].state != "given up":
        supervisor.tend(time.time())
        time.sleep(0.05)
    entry = supervisor.running[0]
    assert entry.state == "given up" and entry.restarts.count == 2
    events = [json.loads(line) for line in open(paths.events)]
    assert [e["event"] for e in events] == [
        "started",
        "restarting",
        "started",
        "restarting",
        "started",
        "gave-up",
    ]
    assert (
        "exited with code 3" in events[-1]["message"]
        and "3 times in a row" in events[-1]["message"]
    )
    assert open(paths.log("broken")).read().count("no luck") == 3
