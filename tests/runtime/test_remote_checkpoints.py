"""Checkpoints in object storage: ``checkpoint_dir="s3://bucket/run"`` against a real
S3 API server (moto's, on 127.0.0.1, started here), at world size 3.

An object store has no rename: a save writes straight into its step's prefix and
rank 0 commits it by writing the manifest last; only manifested checkpoints are
resolved, so a save killed midway leaves the previous one the newest.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

import clustersdk as cs
from clustersdk import checkpoint_files as ckpt

from .. import workloads
from ..helpers import assert_same_run, wait_for

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

BUCKET = "ckpt"
TRAIN = {"steps": 30, "delay": 0.01}


@pytest.fixture(scope="module")
def s3():
    """A real S3 API server (moto's, its own process) on a free port of 127.0.0.1, with
    one bucket; the workers find it the standard way (AWS_ENDPOINT_URL and keys in
    their environment, inherited when the cluster spawns them)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        wait_for(lambda: _listening(port), timeout=60, interval=0.1)
        import fsspec

        fs = fsspec.filesystem("s3")
        fs.mkdir(BUCKET)
        yield fs
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()  # none of them may outlive the server
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def cluster3(s3, tmp_path_factory):
    c = cs.Cluster.local(workers=3, state_dir=str(tmp_path_factory.mktemp("state3")))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def healed(cluster3):
    """All three slots present (the nanny restarts killed workers) and free."""
    wait_for(
        lambda: len(cluster3.slots()) == 3 and not any(s["job"] for s in cluster3.slots()),
        timeout=60,
    )
    yield cluster3
    for job in cluster3.jobs():
        if not job.status.terminal:
            job.stop(wait=False)


@pytest.fixture(scope="module")
def uninterrupted(cluster3):
    return cluster3.launch(
        workloads.train_ckpt, kwargs={"steps": TRAIN["steps"]}, world_size=3
    ).wait(timeout=120)


@pytest.fixture
def root(s3, request):
    """A fresh prefix of the bucket, emptied after the test."""
    url = f"s3://{BUCKET}/{request.node.name.replace('[', '-').rstrip(']')}"
    yield url
    try:
        s3.rm(url.removeprefix("s3://"), recursive=True)
    except FileNotFoundError:  # nothing was written there
        pass


def objects(s3, url: str) -> list[str]:
    s3.invalidate_cache()
    base = url.removeprefix("s3://")
    return sorted(p.removeprefix(base + "/") for p in s3.find(base))


@pytest.mark.parametrize("point", ["data", "manifest", "committed"])
def test_a_rank_killed_mid_save_resumes_auto_from_the_newest_complete_checkpoint(
    healed, uninterrupted, s3, root, point
):
    # "data": rank 0 dies once its shards are uploaded; "manifest" (rank 0 only): every
    # shard and DCP's metadata are there, the manifest is not; "committed": rank 0 dies
    # right after the manifest
    armed = (0,) if point == "data" else None
    before = {s["worker"] for s in healed.slots()}
    job = healed.launch(
        workloads.prepared,
        args=((workloads.inject_fault, (point, 2, armed)), workloads.train_ckpt),  # 2nd save
        kwargs=TRAIN,
        world_size=3,
        timeout=10,
        checkpoint_dir=root,
        checkpoint_every=5,
        async_checkpoint=False,
    )
    with pytest.raises(cs.JobFailedError, match="died of SIGKILL"):
        job.wait(timeout=120)
    assert {s["worker"] for s in healed.slots()} == before  # the workers stayed
    newest = 10 if point == "committed" else 5
    assert ckpt.latest(root) == ckpt.step_dir(root, newest)
    if point != "committed":  # the killed save's files are there, without a manifest
        left = [p for p in objects(s3, root) if p.startswith("step-00000010/")]
        assert left and "step-00000010/manifest.json" not in left
        assert not ckpt.is_intact(ckpt.step_dir(root, 10))
    again = healed.launch(
        workloads.train_ckpt,
        kwargs={"steps": TRAIN["steps"]},
        world_size=3,
        checkpoint_dir=root,
        checkpoint_every=5,
        resume="auto",
        keep=10,
    )
    assert_same_run(again.wait(timeout=120), uninterrupted, exact=True)
    assert f"resumed from {ckpt.step_dir(root, newest)} at step {newest}" in again.logs(0)
    # nothing is left of the killed save: every object belongs to the save a manifest names
    names = objects(s3, root)
    named = {
        p.split("/")[0]: ckpt.read_manifest(f"{root}/{p.split('/')[0]}")["data"]
        for p in names
        if p.endswith("/manifest.json")
    }
    assert [
        p
        for p in names
        if not p.endswith("/manifest.json") and p.split("/")[1] != named.get(p.split("/")[0])
    ] == []
    assert [step for step, _ in ckpt.committed(root)] == list(range(5, 31, 5)), (
        again.info().get("checkpoint_error"),
        [p for p in objects(s3, root) if p.startswith("step-00000010")],
        again.logs(0)[-3000:],
    )


def test_async_saves_keep_exactly_keep_and_a_resume_from_one_is_bitwise(
    healed, uninterrupted, s3, root
):
    job = healed.launch(
        workloads.train_ckpt,
        kwargs=TRAIN,
        world_size=3,
        checkpoint_dir=root,
        checkpoint_every=4,
        keep=2,
    )
    job.wait(timeout=120)
    assert [step for step, _ in ckpt.committed(root)] == [24, 28]  # and 30, saved at the end?
    assert job.info()["checkpoint"] == ckpt.step_dir(root, 28)
    names = objects(s3, root)
    assert {p.split("/")[0] for p in names} == {"step-00000024", "step-00000028"}
    manifest = ckpt.read_manifest(ckpt.step_dir(root, 28))
    assert manifest["world_size"] == 3 and f"{manifest['data']}/.metadata" in manifest["files"]
    assert sorted(manifest["files"]) == [
        p.removeprefix("step-00000028/")
        for p in names
        if p.startswith("step-00000028/") and not p.endswith("manifest.json")
    ]
    # from an explicit URL, saving under another prefix
    resumed = healed.launch(
        workloads.train_ckpt,
        kwargs={"steps": TRAIN["steps"]},
        world_size=3,
        resume=ckpt.step_dir(root, 24),
        checkpoint_dir=f"{root}/again",
    )
    assert_same_run(resumed.wait(timeout=120), uninterrupted, exact=True)


def test_the_servers_checkpoint_list_reads_the_bucket(healed, root):
    from jupyter_clustersdk.checkpoints import scan

    healed.launch(
        workloads.train_ckpt,
        kwargs={"steps": 10},
        world_size=3,
        checkpoint_dir=root,
        checkpoint_every=5,
        async_checkpoint=False,
    ).wait(timeout=120)
    rows = scan(root)
    assert [(r["step"], r["path"], r["world_size"]) for r in rows] == [
        (5, f"{root}/step-00000005", 3),
        (10, f"{root}/step-00000010", 3),
    ]
    assert all(r["bytes"] > 1000 and r["time"] for r in rows)


def test_a_bucket_that_does_not_exist_fails_at_launch(healed):
    with pytest.raises(
        cs.CheckpointError, match="is not writable.*bucket does not exist.*AWS_ENDPOINT_URL"
    ):
        healed.launch(workloads.train_ckpt, world_size=3, checkpoint_dir="s3://no-such-bucket/a")


def test_urls_are_kept_and_a_missing_package_names_the_install():
    spec = cs.JobSpec(fn=workloads.train_ckpt, world_size=1, checkpoint_dir="s3://b/run/")
    assert spec.checkpoint_dir == "s3://b/run"
    local = cs.JobSpec(fn=workloads.train_ckpt, world_size=1, checkpoint_dir="file:///tmp/r")
    assert local.checkpoint_dir == "/tmp/r"  # file:// is a directory: renamed commits
    with pytest.raises(cs.SpecError, match="names no bucket"):
        cs.JobSpec(fn=workloads.train_ckpt, world_size=1, checkpoint_dir="s3://")
    with pytest.raises(cs.CheckpointError, match=r"pip install 'clustersdk\[s3\]'"):
        ckpt.check_writable("gs://bucket/run")  # gcsfs is not installed
    with pytest.raises(cs.CheckpointError, match="use a local path or a URL"):
        ckpt.check_writable("nosuchprotocol://bucket/run")


def test_the_doctor_checks_writes_to_the_bucket_from_every_host(healed, root):
    report = healed.doctor(checkpoint_dir=root, bandwidth=False)
    assert not [p for p in report.problems if p.check == "disk"]
    assert f"writes to {root}" in str(report)
    broken = healed.doctor(checkpoint_dir="s3://no-such-bucket/a", bandwidth=False)
    assert any(
        p.check == "disk" and "cannot write to s3://no-such-bucket/a" in p.message
        for p in broken.problems
    )
