"""The REST API against a real LocalCluster running a real job, through jp_fetch."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from tornado.httpclient import HTTPClientError

import clustersdk as cs
from clustersdk import cpus

from .. import workloads
from ..helpers import wait_for
from .conftest import extension_config


@pytest.fixture
def jp_server_config(sdk_state, spin_job):
    return extension_config(sdk_state)


async def get(jp_fetch, *parts, **params):
    response = await jp_fetch("clustersdk", *parts, params=params)
    assert response.headers["Content-Type"].startswith("application/json")
    return json.loads(response.body)


async def fails(jp_fetch, *parts, method="GET", body=None, **params):
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("clustersdk", *parts, method=method, body=body, params=params)
    response = info.value.response
    return response.code, json.loads(response.body)


async def post(jp_fetch, *parts, body=b""):
    response = await jp_fetch("clustersdk", *parts, method="POST", body=body, request_timeout=120)
    return json.loads(response.body)


async def test_clusters_lists_the_registered_cluster_with_its_busy_slot(
    jp_fetch, sdk_cluster, spin_job
):
    clusters = (await get(jp_fetch, "api", "clusters"))["clusters"]
    assert len(clusters) == 1
    cluster = clusters[0]
    assert cluster["address"] == sdk_cluster.scheduler_address
    assert (cluster["kind"], cluster["source"], cluster["reachable"]) == ("local", "registry", True)
    assert (cluster["workers"], cluster["hosts"], cluster["gpus"]) == (2, 1, 0)
    assert cluster["utilisation"]["slots"] == 2
    assert cluster["utilisation"]["busy"] >= 1
    assert cluster["jobs"]["RUNNING"] >= 1

    detail = await get(jp_fetch, "api", "clusters", cluster["id"])
    assert [s["kind"] for s in detail["slots"]] == ["cpu", "cpu"]
    # each worker's own cores (none on a machine with fewer CPUs than workers)
    assert sorted(s["cpus"] for s in detail["slots"]) == sorted(cpus.shares(2) or ["", ""])
    mine = [s for s in detail["slots"] if s["job"] == spin_job.id]
    assert len(mine) == 1
    workers = {w["address"] for w in detail["worker_details"]}
    assert workers == {s["worker"] for s in detail["slots"]}


async def test_a_restart_of_the_clusters_processes_shows_in_its_summary(jp_fetch, sdk_cluster):
    (before,) = (await get(jp_fetch, "api", "clusters"))["clusters"]
    assert before["restarts"] == {"count": 0, "recent": []}

    def restarted(dask_scheduler):  # what the scheduler does as a supervised worker comes back
        from clustersdk.control.plugin import PLUGIN_NAME

        restart = json.dumps({"process": "worker-1", "restarts": 1, "after": "died of SIGKILL"})
        dask_scheduler.plugins[PLUGIN_NAME].restarted("worker", "tls://10.0.0.9:4000", restart)

    sdk_cluster.client.run_on_scheduler(restarted)
    (after,) = (await get(jp_fetch, "api", "clusters"))["clusters"]
    assert after["restarts"]["count"] == 1
    (event,) = after["restarts"]["recent"]
    assert "worker tls://10.0.0.9:4000" in event["message"] and "SIGKILL" in event["message"]


async def test_a_clusters_summary_links_its_dask_dashboard(jp_fetch, sdk_cluster):
    link = sdk_cluster.dashboard_link
    assert link is not None  # Cluster.local serves one by default
    (summary,) = (await get(jp_fetch, "api", "clusters"))["clusters"]
    assert summary["dashboard_link"] == link
    assert (await get(jp_fetch, "api", "clusters", summary["id"]))["dashboard_link"] == link
    (shown,) = (await get(jp_fetch, "api", "overview"))["clusters"]  # what the lab panel reads
    assert shown["dashboard_link"] == link


async def test_jobs_lists_the_running_job_and_one_job_shows_its_progress(jp_fetch, spin_job):
    listed = await get(jp_fetch, "api", "jobs")
    assert listed["unreachable"] == []
    mine = [j for j in listed["jobs"] if j["id"] == spin_job.id]
    assert len(mine) == 1 and mine[0]["status"] == "RUNNING" and mine[0]["terminal"] is False
    assert mine[0]["world_size"] == 1 and mine[0]["name"] == "ext-spin"
    assert (mine[0]["queue"], mine[0]["priority"], mine[0]["preemptible"]) == ("default", 50, True)

    by_id = await get(jp_fetch, "api", "jobs", spin_job.id)
    by_name = await get(jp_fetch, "api", "jobs", "ext-spin")
    assert by_id["id"] == by_name["id"] == spin_job.id
    assert by_id["ranks"][0]["rank"] == 0 and by_id["ranks"][0]["device"] == "cpu"
    progress = by_id["progress"]
    assert progress["step"] >= 4
    assert "value" in progress["scalars"]
    assert progress["steps_per_second"] > 0

    await asyncio.sleep(0.5)
    later = await get(jp_fetch, "api", "jobs", spin_job.id)
    assert later["progress"]["step"] > progress["step"]  # the job goes on


async def test_history_reads_incrementally_with_since(jp_fetch, spin_job):
    first = await get(jp_fetch, "api", "jobs", spin_job.id, "history", limit="5")
    assert len(first["rows"]) == 5 and first["more"] is True
    assert [r["step"] for r in first["rows"]] == [0, 1, 2, 3, 4]
    assert all(r["rank"] == 0 and r["value"] == float(r["step"]) for r in first["rows"])
    second = await get(jp_fetch, "api", "jobs", spin_job.id, "history", since=str(first["last"]))
    assert second["rows"] and second["rows"][0]["step"] == 5
    assert all(r["seq"] > first["last"] for r in second["rows"])
    # by name too, and nothing after the newest row
    third = await get(
        jp_fetch, "api", "jobs", "ext-spin", "history", since=str(second["last"]), limit="10000"
    )
    assert all(r["seq"] > second["last"] for r in third["rows"])


async def test_logs_of_a_rank(jp_fetch, spin_job):
    logs = await get(jp_fetch, "api", "jobs", spin_job.id, "logs", rank="0")
    assert "rank 0 starting on cpu" in logs["text"]
    assert "says hello through logging" in logs["text"]
    assert {line["rank"] for line in logs["lines"]} == {0}
    newer = await get(jp_fetch, "api", "jobs", spin_job.id, "logs", since=str(logs["last"]))
    assert newer["lines"] == []
    nobody = await get(jp_fetch, "api", "jobs", spin_job.id, "logs", rank="7")
    assert nobody["lines"] == [] and nobody["text"] == ""


async def test_a_jobs_diagnosis_is_served_with_the_job(jp_fetch, free_slot):
    import cloudpickle

    from .. import workloads_diag

    cloudpickle.register_pickle_by_value(workloads_diag)
    job = free_slot.launch(workloads_diag.nan_at, world_size=1)
    job.wait(timeout=60)
    # the diagnosis is made from the last rows, which may land a moment after the end
    await asyncio.to_thread(wait_for, lambda: job.diagnosis is not None, 15)
    served = await get(jp_fetch, "api", "jobs", job.id)
    assert served["diagnosis"]["kind"] == "nonfinite" and served["diagnosis"]["step"] == 2
    assert served["diagnosis"]["advice"] == job.diagnosis.advice
    listed = [j for j in (await get(jp_fetch, "api", "jobs"))["jobs"] if j["id"] == job.id]
    assert listed[0]["diagnosis"]["summary"] == "non-finite loss=nan at step 2 on rank 0"


async def test_unknown_job_or_cluster_is_404_and_bad_parameters_are_400(jp_fetch, spin_job):
    code, body = await fails(jp_fetch, "api", "jobs", "no-such-job")
    assert (code, body["error"]) == (404, "job_not_found")
    assert "no-such-job" in body["message"]
    code, body = await fails(
        jp_fetch, "api", "jobs", "no-such-job", "stop", method="POST", body=b""
    )
    assert (code, body["error"]) == (404, "job_not_found")
    code, body = await fails(jp_fetch, "api", "clusters", "tcp-10.9.9.9-1")
    assert (code, body["error"]) == (404, "cluster_not_found")
    for params in ({"since": "soon"}, {"since": "-1"}, {"limit": "0"}, {"limit": "99999"}):
        code, body = await fails(jp_fetch, "api", "jobs", spin_job.id, "history", **params)
        assert (code, body["error"]) == (400, "bad_request"), params
    code, body = await fails(jp_fetch, "api", "jobs", spin_job.id, "logs", rank="x")
    assert code == 400 and "rank" in body["message"]
    code, body = await fails(
        jp_fetch, "api", "jobs", spin_job.id, "pause", method="POST", body=b'{"world_size": 2}'
    )
    assert code == 400 and "pause takes no fields" in body["message"]
    code, body = await fails(
        jp_fetch, "api", "jobs", spin_job.id, "resume", method="POST", body=b"[1]"
    )
    assert code == 400 and "JSON object" in body["message"]
    code, body = await fails(jp_fetch, "api", "jobs", spin_job.id, method="DELETE")
    assert (code, body["error"]) == (405, "method_not_allowed")


async def test_stop_over_rest_stops_the_job_and_a_second_stop_is_409(jp_fetch, free_slot):
    job = await asyncio.to_thread(
        free_slot.launch, workloads.spin, world_size=1, name="ext-stop-me"
    )
    await asyncio.to_thread(_wait_running, job)
    record = await post(jp_fetch, "api", "jobs", "ext-stop-me", "stop")
    assert record["id"] == job.id and record["status"] in ("STOPPING", "STOPPED")
    await asyncio.to_thread(job.stop)  # waits until it has stopped
    assert job.status is cs.JobStatus.STOPPED
    code, body = await fails(jp_fetch, "api", "jobs", job.id, "stop", method="POST", body=b"")
    assert (code, body["error"]) == (409, "invalid_transition")
    assert "STOPPED" in body["message"]


async def test_actions_the_job_cannot_take_are_400_or_409(jp_fetch, spin_job):
    # spin_job has no checkpoint_dir: checkpoint and suspend are refused before anything runs
    for action in ("checkpoint", "suspend"):
        code, body = await fails(
            jp_fetch, "api", "jobs", spin_job.id, action, method="POST", body=b""
        )
        assert (code, body["error"]) == (400, "bad_request"), action
        assert "checkpoint_dir" in body["message"]
    code, body = await fails(
        jp_fetch, "api", "jobs", spin_job.id, "resume", method="POST", body=b""
    )
    assert (code, body["error"]) == (409, "invalid_transition")  # it is RUNNING, not PAUSED


async def test_pause_and_resume_over_rest_and_the_job_obeys(jp_fetch, free_slot):
    job = await asyncio.to_thread(
        free_slot.launch, workloads.spin, world_size=1, name="ext-pause-me"
    )
    await asyncio.to_thread(_wait_running, job)

    paused = await post(jp_fetch, "api", "jobs", job.id, "pause")
    assert paused["status"] == "PAUSED"
    assert job.status is cs.JobStatus.PAUSED
    # the rows logged before the pause arrive with the next metrics batch; none after it
    last_step = paused["paused_at"] - 1
    for _ in range(50):
        steps = (await get(jp_fetch, "api", "jobs", job.id))["progress"]["step"]
        if steps == last_step:
            break
        await asyncio.sleep(0.1)
    assert steps == last_step
    await asyncio.sleep(0.6)
    held = await get(jp_fetch, "api", "jobs", job.id)
    assert held["status"] == "PAUSED" and held["progress"]["step"] == steps  # no step while paused
    assert held["progress"]["steps_per_second"] == 0.0
    code, body = await fails(jp_fetch, "api", "jobs", job.id, "pause", method="POST", body=b"")
    assert code == 409 and "PAUSED" in body["message"]

    resumed = await post(jp_fetch, "api", "jobs", job.id, "resume", body=b"{}")
    assert resumed["status"] == "RUNNING"
    await asyncio.sleep(0.6)
    moving = await get(jp_fetch, "api", "jobs", job.id)
    assert moving["status"] == "RUNNING" and moving["progress"]["step"] > steps
    assert job.status is cs.JobStatus.RUNNING


def _wait_running(job: cs.Job, timeout: float = 30.0) -> None:

    wait_for(lambda: job.status is cs.JobStatus.RUNNING and job.history(), timeout)


async def test_update_over_rest_changes_lr_on_every_rank_and_bad_changes_are_400(
    jp_fetch, free_slot
):
    import cloudpickle

    from .. import workloads_live

    cloudpickle.register_pickle_by_value(workloads_live)
    job = await asyncio.to_thread(
        free_slot.launch,
        workloads_live.train_live,
        kwargs={"steps": 100_000, "delay": 0.01},
        world_size=1,
        hparams={"scale": 1.0},
        name="ext-update-me",
    )
    await asyncio.to_thread(_wait_running, job)

    changed = await post(
        jp_fetch,
        "api",
        "jobs",
        job.name,
        "update",
        body=json.dumps({"lr": 0.01, "scale": 2}).encode(),
    )
    assert changed["applied"] and changed["job"] == job.id and changed["status"] == "RUNNING"
    assert changed["changes"] == {"lr": [0.05, 0.01], "scale": [1.0, 2.0]}
    step = changed["step"]
    assert await asyncio.to_thread(job.updates) == [
        {
            "seq": changed["seq"],
            "step": step,
            "time": job.updates()[0]["time"],
            "changes": {"lr": [0.05, 0.01], "scale": [1.0, 2.0]},
        }
    ]
    await asyncio.to_thread(wait_for, lambda: any(r["step"] > step for r in job.history()))
    rows = {r["step"]: r for r in job.history()}
    assert rows[step - 1]["lr"] == 0.05 and rows[step]["lr"] == 0.01  # from that step on

    refusals = [
        ({"lr": -1}, "lr must be a finite number >= 0"),
        ({"nope": 1}, "unknown key"),
        ({"scale": "big"}, "scale"),
        ({"lr": {"7": 0.1}}, "group 7 does not exist"),
    ]
    for body, message in refusals:
        code, error = await fails(
            jp_fetch, "api", "jobs", job.id, "update", method="POST", body=json.dumps(body).encode()
        )
        assert (code, error["error"]) == (400, "bad_request"), body
        assert message in error["message"], (body, error["message"])
    for raw in (b"", b"{}", b"[1]", b"lr=1"):
        code, error = await fails(
            jp_fetch, "api", "jobs", job.id, "update", method="POST", body=raw
        )
        assert code == 400 and "JSON object" in error["message"], raw
    assert [u["seq"] for u in await asyncio.to_thread(job.updates)] == [changed["seq"]]
    assert job.status is cs.JobStatus.RUNNING  # nothing refused reached the job

    # a job that is not HELD has no hold to end
    code, error = await fails(jp_fetch, "api", "jobs", job.id, "restart", method="POST", body=b"")
    assert code == 409 and "RUNNING" in error["message"]
    await asyncio.to_thread(job.stop)
    code, error = await fails(
        jp_fetch, "api", "jobs", job.id, "update", method="POST", body=b'{"lr": 0.1}'
    )
    assert code == 409 and "STOPPED" in error["message"]


async def test_stacks_over_rest_show_where_the_rank_is(jp_fetch, spin_job):
    found = await get(jp_fetch, "api", "jobs", spin_job.name, "stacks")
    assert found["job"] == spin_job.id and found["status"] == "RUNNING"
    (entry,) = found["ranks"].values()
    assert list(found["ranks"]) == ["0"] and entry["step"] >= 1
    assert "in spin" in entry["text"]  # the training function's frame
    every = await get(jp_fetch, "api", "jobs", spin_job.id, "stacks", all_threads="true")
    assert len(every["ranks"]["0"]["text"]) > len(entry["text"])
    code, error = await fails(jp_fetch, "api", "jobs", spin_job.id, "stacks", all_threads="some")
    assert code == 400 and "all_threads" in error["message"]


async def test_metrics_expose_the_running_job(jp_fetch, spin_job):
    response = await jp_fetch("clustersdk", "metrics")
    assert response.headers["Content-Type"].startswith("text/plain")
    text = response.body.decode()
    labels = f'cluster="{_cid(spin_job)}",job="{spin_job.id}",name="ext-spin"'
    assert f'clustersdk_job_state{{{labels},state="RUNNING"}} 1.0' in text
    step = _sample(text, f"clustersdk_job_step{{{labels}}}")
    assert step >= 4
    assert _sample(text, f"clustersdk_job_steps_per_second{{{labels}}}") > 0
    assert f'clustersdk_scheduler_up{{cluster="{_cid(spin_job)}"}} 1.0' in text
    assert f'clustersdk_slots{{cluster="{_cid(spin_job)}",kind="cpu"}} 2.0' in text
    assert "clustersdk_queue_length" in text and "clustersdk_job_restarts_total" in text
    # CPU ranks report psutil samples, not GPU ones
    assert "clustersdk_gpu_utilization_percent{" not in text
    # OpenMetrics when a scraper asks for it
    om = await jp_fetch(
        "clustersdk", "metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.body.decode().rstrip().endswith("# EOF")


async def test_the_queue_says_who_holds_what_and_why_a_job_waits(jp_fetch, free_slot, spin_job):
    holder = free_slot.launch(workloads.spin, world_size=1, name="ext-holder", priority="high")
    wait_for(lambda: holder.status is cs.JobStatus.RUNNING)
    waiter = free_slot.launch(workloads.count_to, world_size=2, name="ext-waiter", priority="low")
    deadline = asyncio.get_event_loop().time() + 30
    while True:
        view = await get(jp_fetch, "api", "queue", cluster=_cid(spin_job))
        (queue,) = view["clusters"][0]["queues"]
        if queue["waiting"] and queue["waiting"][0]["reason"]:
            break
        assert asyncio.get_event_loop().time() < deadline, view
        await asyncio.sleep(0.1)
    assert view["unreachable"] == [] and view["clusters"][0]["cluster"] == _cid(spin_job)
    assert sorted((h["name"], h["priority_name"]) for h in queue["holding"]) == [
        ("ext-holder", "high"),
        ("ext-spin", "normal"),
    ]
    (waiting,) = queue["waiting"]
    assert waiting["name"] == "ext-waiter" and waiting["reason"].startswith(
        "waiting for 2 slots to be free"
    )
    text = (await jp_fetch("clustersdk", "metrics")).body.decode()
    (labels,) = [
        dict(re.findall(r'(\w+)="([^"]*)"', line))
        for line in text.splitlines()
        if line.startswith("clustersdk_job_info{")
        and f'job="{holder.id}"' in line
        and line.endswith(" 1.0")
    ]
    assert labels == {
        "cluster": _cid(spin_job),
        "job": holder.id,
        "name": "ext-holder",
        "owner": spin_job.owner,
        "queue": "default",
        "priority": "100",
    }
    waiter.stop()
    holder.stop()


async def test_openapi_is_served_with_the_base_url(jp_fetch, jp_base_url):
    response = await jp_fetch("clustersdk", "api", "openapi.json")
    spec = json.loads(response.body)
    assert spec["openapi"].startswith("3.")
    assert spec["servers"] == [{"url": jp_base_url.rstrip("/")}]
    assert "/clustersdk/api/jobs/{job}/history" in spec["paths"]
    yaml_response = await jp_fetch("clustersdk", "api", "openapi.yaml")
    assert yaml_response.headers["Content-Type"].startswith("application/yaml")


async def test_healthz_is_200_when_the_scheduler_answers(jp_fetch):
    body = await get(jp_fetch, "healthz")
    assert body == {"status": "ok", "schedulers": 1, "reachable": 1}


class TestConfiguredAddresses:
    """Schedulers named in the config, one of them gone: served, listed, and unhealthy."""

    DEAD = "tcp://127.0.0.1:9"

    @pytest.fixture
    def jp_server_config(self, sdk_cluster, tmp_path):
        import dask.config

        # a configured TLS address: no registry here, so the server's own credentials come
        # from the clustersdk.credentials setting (DASK_CLUSTERSDK__CREDENTIALS)
        with dask.config.set({"clustersdk.credentials": sdk_cluster.credentials}):
            yield extension_config(
                tmp_path / "none", addresses=(sdk_cluster.scheduler_address, self.DEAD)
            )

    async def test_configured_clusters_are_served_and_a_dead_one_is_reported(
        self, jp_fetch, sdk_cluster, spin_job
    ):
        clusters = (await get(jp_fetch, "api", "clusters"))["clusters"]
        assert [(c["address"], c["source"], c["reachable"]) for c in clusters] == [
            (sdk_cluster.scheduler_address, "config", True),
            (self.DEAD, "config", False),
        ]
        assert "could not connect" in clusters[1]["error"]
        listed = await get(jp_fetch, "api", "jobs")
        assert listed["unreachable"] == ["tcp-127.0.0.1-9"]
        assert spin_job.id in [j["id"] for j in listed["jobs"]]
        code, body = await fails(jp_fetch, "healthz")
        assert code == 503 and body["status"] == "unavailable"
        assert body["reason"] == "cluster tcp-127.0.0.1-9: no answer"
        only = await get(jp_fetch, "api", "jobs", cluster="tcp-127.0.0.1-9")
        assert only == {"jobs": [], "unreachable": ["tcp-127.0.0.1-9"]}
        code, body = await fails(jp_fetch, "api", "jobs", cluster="tcp-0")
        assert (code, body["error"]) == (404, "cluster_not_found")


def _cid(job: cs.Job) -> str:
    from jupyter_clustersdk.models import cluster_id

    return cluster_id(job.cluster.scheduler_address)


def _sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in the metrics:\n{text}")


async def test_doctor_over_rest_reports_the_cluster(jp_fetch, spin_job, tmp_path):
    cid = _cid(spin_job)
    body = json.dumps({"checkpoint_dir": str(tmp_path / "ckpt"), "max_size": 4096}).encode()
    report = await post(jp_fetch, "api", "clusters", cid, "doctor", body=body)
    assert report["ok"] is True and report["problems"] == []
    assert report["hosts"] == ["127.0.0.1"] and len(report["workers"]) == 2
    assert report["disks"]["127.0.0.1"]["free"] > 0
    assert report["workers"][0]["versions"]["clustersdk"] == cs.__version__
    assert report["sweeps"] == []  # one host: no link to measure
    code, body = await fails(
        jp_fetch, "api", "clusters", cid, "doctor", method="POST", body=b'{"max_size": "big"}'
    )
    assert code == 400 and "max_size must be an integer" in body["message"]
    code, body = await fails(
        jp_fetch, "api", "clusters", "tcp-10.9.9.9-1", "doctor", method="POST", body=b""
    )
    assert (code, body["error"]) == (404, "cluster_not_found")


async def test_a_script_job_is_submitted_over_rest_and_bad_fields_are_400(
    jp_fetch, free_slot, tmp_path
):
    script = tmp_path / "hello.py"
    script.write_text("import os, sys\nprint('hello', os.environ['RANK'], sys.argv[1:])\n")
    response = await jp_fetch(
        "clustersdk",
        "api",
        "jobs",
        method="POST",
        body=json.dumps(
            {
                "world_size": 1,
                "script": str(script),
                "args": ["x"],
                "name": "ext-script",
                "grace": 5,
            }
        ),
        request_timeout=120,
    )
    assert response.code == 201
    record = json.loads(response.body)
    assert record["name"] == "ext-script" and record["spec"]["script"] == str(script)
    assert record["spec"]["args"] == ["x"] and record["spec"]["grace"] == 5
    job = cs.Job.attach(free_slot, "ext-script")
    assert await asyncio.to_thread(job.wait, 120) == 0
    logs = await get(jp_fetch, "api", "jobs", "ext-script", "logs")
    assert any(line["text"] == "hello 0 ['x']" for line in logs["lines"]), logs
    for body, word in (
        ({"world_size": 1, "script": str(script), "strategy": "fsdp"}, "strategy"),
        ({"script": str(script)}, "world_size"),
        ({"world_size": 1, "script": str(tmp_path / "nope.py")}, "nope.py"),
        ({"world_size": 1}, "script"),
    ):
        code, error = await fails(
            jp_fetch, "api", "jobs", method="POST", body=json.dumps(body).encode()
        )
        assert (code, error["error"]) == (400, "bad_request"), body
        assert word in error["message"], error


async def test_fork_over_rest_starts_a_job_from_the_jobs_state_and_bad_bodies_are_400(
    jp_fetch, free_slot, spin_job, tmp_path
):
    job = await asyncio.to_thread(
        free_slot.launch,
        workloads.ticker,
        kwargs={"steps": 1_000_000},
        world_size=1,
        name="ext-fork-me",
        checkpoint_dir=str(tmp_path / "ticks"),
    )
    try:
        await asyncio.to_thread(_wait_running, job)
        forked = await post(
            jp_fetch,
            "api",
            "jobs",
            job.name,
            "fork",
            body=json.dumps({"name": "ext-forked", "hparams": {"lr": 0.005}}).encode(),
        )
        assert forked["name"] == "ext-forked" and forked["spec"]["parent"] == job.id
        assert forked["spec"]["forked_at"] == (await asyncio.to_thread(job.info))["checkpoint_step"]
        assert forked["status"] == "QUEUED"  # the one free slot is the job's
        refusals = [
            ({"at": "soon"}, "at must be an integer, got 'soon'"),
            ({"bogus": 1}, "unknown field 'bogus'"),
            ({"hparams": {"lr": -1}}, "lr must be a finite number >= 0"),
        ]
        for body, message in refusals:
            code, error = await fails(
                jp_fetch,
                "api",
                "jobs",
                job.id,
                "fork",
                method="POST",
                body=json.dumps(body).encode(),
            )
            assert code == 400 and message in error["message"], (body, error)
        code, error = await fails(
            jp_fetch, "api", "jobs", spin_job.id, "fork", method="POST", body=b"{}"
        )
        assert code == 400 and "has no checkpoint_dir" in error["message"]
    finally:
        for one in await asyncio.to_thread(job.forks):
            await asyncio.to_thread(one.stop)
        await asyncio.to_thread(job.stop)
