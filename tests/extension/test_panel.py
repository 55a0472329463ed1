"""What the JupyterLab panel reads: the one-request overview and a job's checkpoints,
against the package's real LocalCluster through jp_fetch."""

from __future__ import annotations

import asyncio
import getpass
import json
import os

import pytest
from jupyter_clustersdk import checkpoints
from jupyter_clustersdk.models import checkpoints_model, cluster_id, overview_model

from .. import workloads
from .conftest import extension_config

DEAD = "tcp://127.0.0.1:9"


@pytest.fixture
def jp_server_config(sdk_state, spin_job):
    # the package's cluster from the registry, and a configured scheduler that is gone
    return extension_config(sdk_state, addresses=(DEAD,))


async def get(jp_fetch, *parts, **params):
    response = await jp_fetch("clustersdk", *parts, params=params)
    return json.loads(response.body)


async def test_overview_has_every_cluster_slot_and_job_with_progress_in_one_answer(
    jp_fetch, sdk_cluster, spin_job
):
    overview = await get(jp_fetch, "api", "overview")
    assert overview["unreachable"] == [cluster_id(DEAD)]
    by_address = {c["address"]: c for c in overview["clusters"]}
    dead = by_address[DEAD]
    assert dead["reachable"] is False and "could not connect" in dead["error"]
    cluster = by_address[sdk_cluster.scheduler_address]
    assert cluster["reachable"] is True and cluster["workers"] == 2
    assert [s["kind"] for s in cluster["slots"]] == ["cpu", "cpu"]
    busy = [s for s in cluster["slots"] if s["job"] == spin_job.id]
    assert len(busy) == 1

    job = next(j for j in overview["jobs"] if j["id"] == spin_job.id)
    assert (job["name"], job["status"], job["world_size"], job["strategy"]) == (
        "ext-spin",
        "RUNNING",
        1,
        "ddp",
    )
    assert job["owner"] == getpass.getuser()
    assert job["total_steps"] == 1_000_000  # ctx.loop's steps= of workloads.spin
    assert job["cluster"] == cluster["id"]
    assert job["progress"]["step"] >= 4 and job["progress"]["steps_per_second"] > 0

    # the rank's CPU telemetry reaches its slot (psutil: no GPU here)
    async def sampled():
        again = await get(jp_fetch, "api", "overview")
        slots = [
            s
            for c in again["clusters"]
            if c["reachable"]
            for s in c["slots"]
            if s["job"] == spin_job.id
        ]
        return slots[0]["telemetry"] if slots and slots[0]["telemetry"] else None

    telemetry = None
    for _ in range(100):
        telemetry = await sampled()
        if telemetry:
            break
        await asyncio.sleep(0.1)
    assert telemetry and telemetry["source"] == "psutil" and "cpu_percent" in telemetry

    await asyncio.sleep(0.5)
    later = await get(jp_fetch, "api", "overview")
    moved = next(j for j in later["jobs"] if j["id"] == spin_job.id)
    assert moved["progress"]["step"] > job["progress"]["step"]


async def test_checkpoints_lists_what_the_job_committed_newest_first(jp_fetch, free_slot, tmp_path):
    directory = tmp_path / "ckpt"
    job = await asyncio.to_thread(
        free_slot.launch,
        workloads.train_ckpt,
        kwargs={"steps": 30},
        world_size=1,
        name="ext-ckpts",
        checkpoint_dir=str(directory),
        checkpoint_every=10,
        keep=2,
        async_checkpoint=False,
    )
    await asyncio.to_thread(job.wait, 120)
    listed = await get(jp_fetch, "api", "jobs", "ext-ckpts", "checkpoints")
    on_disk = sorted(name for name in os.listdir(directory) if name.startswith("step-"))
    assert len(on_disk) == 2  # keep=2
    assert [os.path.basename(c["path"]) for c in listed["checkpoints"]] == on_disk[::-1]
    assert [c["step"] for c in listed["checkpoints"]] == [int(n[5:]) for n in on_disk[::-1]]
    newest = listed["checkpoints"][0]
    assert newest["newest"] is True
    assert listed["newest"] == newest["path"] == job.info()["checkpoint"]
    files = os.listdir(newest["path"])
    assert newest["bytes"] == sum(
        os.path.getsize(os.path.join(newest["path"], f)) for f in files if f != "manifest.json"
    )
    assert newest["world_size"] == 1 and newest["time"] > job.info()["started"]
    assert (listed["directory"], listed["readable"], listed["error"]) == (
        str(directory),
        True,
        None,
    )


async def test_checkpoints_of_a_job_without_checkpoint_dir_is_empty(jp_fetch, spin_job):
    listed = await get(jp_fetch, "api", "jobs", spin_job.id, "checkpoints")
    assert listed == {
        "job": spin_job.id,
        "directory": None,
        "readable": True,
        "error": None,
        "newest": None,
        "checkpoints": [],
    }


def test_scan_skips_what_is_not_a_committed_checkpoint(tmp_path):
    committed = tmp_path / "step-00000010"
    committed.mkdir()
    (committed / "__0_0.distcp").write_bytes(b"x" * 7)
    (committed / "manifest.json").write_text(
        json.dumps({"step": 10, "world_size": 2, "files": {"__0_0.distcp": 7}})
    )
    torn = tmp_path / "step-00000020"  # its manifest promises more than is there
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"x")
    (torn / "manifest.json").write_text(json.dumps({"step": 20, "files": {"__0_0.distcp": 9}}))
    (tmp_path / ".tmp-step-00000030-ab12").mkdir()  # a save in progress
    found = checkpoints.scan(str(tmp_path))
    assert [(c["step"], c["bytes"], c["world_size"]) for c in found] == [(10, 7, 2)]
    with pytest.raises(NotADirectoryError):
        checkpoints.scan(str(committed / "manifest.json"))


def test_checkpoints_model_names_why_a_directory_cannot_be_read():
    model = checkpoints_model("j1", "/data/ck", [], None, error="PermissionError")
    assert (model["readable"], model["error"], model["checkpoints"]) == (
        False,
        "PermissionError",
        [],
    )
    rows = [
        {"step": 5, "path": "/c/step-5", "bytes": 1, "time": 1.0},
        {"step": 9, "path": "/c/step-9", "bytes": 2, "time": 2.0},
    ]
    model = checkpoints_model("j1", "/c", rows, "/c/step-9")
    assert [(c["step"], c["newest"]) for c in model["checkpoints"]] == [(9, True), (5, False)]


def test_overview_model_lists_unreachable_clusters_and_orders_jobs():
    clusters = [{"id": "a", "reachable": True}, {"id": "b", "reachable": False}]
    jobs = [{"id": "2", "submitted": 2.0}, {"id": "1", "submitted": 1.0}]
    model = overview_model(clusters, jobs, now=5.0)
    assert model["unreachable"] == ["b"] and [j["id"] for j in model["jobs"]] == ["1", "2"]
    assert model["time"] == 5.0
