"""Two Jupyter identities on one server, one TLS cluster: each REST request acts as its
Jupyter user (their own clustersdk credentials), so bob sees alice's job but may not
change it, and the panel's model says so. A real LocalCluster, real TLS, jp_fetch."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

import clustersdk as cs

from .. import workloads
from ..helpers import wait_for
from .conftest import extension_config
from .people import TokenPeople

TOKENS = {"alice-token": "alice", "bob-token": "bob", "carol-token": "carol"}


@pytest.fixture(scope="module")
def people(sdk_cluster, tmp_path_factory):
    """alice (an admin) and bob, each with credentials and an SDK connection of their own."""
    home = tmp_path_factory.mktemp("people")
    files = {
        "alice": sdk_cluster.add_user("alice", admin=True, path=str(home / "alice.pem")),
        "bob": sdk_cluster.add_user("bob", path=str(home / "bob.pem")),
    }
    clusters = {
        name: cs.Cluster.connect(
            sdk_cluster.scheduler_address, credentials=path, state_dir=str(home / name)
        )
        for name, path in files.items()
    }
    try:
        yield files, clusters
    finally:
        for cluster in clusters.values():
            for job in cluster.jobs():
                if not job.status.terminal:
                    job.stop(wait=False)
            cluster.close()
        for name in files:
            sdk_cluster.remove_user(name)


@pytest.fixture
def jp_server_config(sdk_state, people):
    files, _ = people
    config = extension_config(sdk_state, identity_provider_class=TokenPeople)
    config.TokenPeople.tokens = TOKENS
    config.ClusterSDKApp.credentials = files  # each Jupyter user's own clustersdk credentials
    return config


def as_user(name: str) -> dict[str, str]:
    return {"Authorization": f"token {name}-token"}


async def call(jp_fetch, user, *parts, method="GET", body=None):
    try:
        response = await jp_fetch(
            "clustersdk",
            *parts,
            method=method,
            body=body,
            headers=as_user(user),
            request_timeout=120,
        )
    except HTTPClientError as e:
        return e.response.code, json.loads(e.response.body)
    return response.code, json.loads(response.body)


async def test_bob_sees_alices_job_over_rest_and_may_not_change_it(jp_fetch, people, sdk_cluster):
    _, clusters = people
    job = clusters["alice"].launch(workloads.spin, world_size=1, name="alice-rest")
    mine = clusters["bob"].launch(workloads.spin, world_size=1, name="bob-rest")
    wait_for(lambda: job.status is mine.status is cs.JobStatus.RUNNING, timeout=60)

    code, listed = await call(jp_fetch, "bob", "api", "jobs")
    assert code == 200
    seen = {j["name"]: j for j in listed["jobs"]}
    assert seen["alice-rest"]["owner"] == "alice" and seen["alice-rest"]["may_change"] is False
    assert seen["alice-rest"]["refusal"] == (
        "this job belongs to 'alice'; only its owner or an admin may change it (you are 'bob')"
    )
    assert seen["bob-rest"]["may_change"] is True
    overview = (await call(jp_fetch, "bob", "api", "overview"))[1]
    assert {j["name"]: j["may_change"] for j in overview["jobs"]}["alice-rest"] is False

    for action in ("pause", "stop", "suspend", "checkpoint"):
        code, body = await call(
            jp_fetch, "bob", "api", "jobs", job.id, action, method="POST", body=b""
        )
        assert (code, body["error"]) == (403, "forbidden"), body
        assert body["message"].startswith(f"'bob' may not {action} job 'alice-rest'")
        assert "it belongs to 'alice'" in body["message"]
    code, body = await call(
        jp_fetch, "bob", "api", "jobs", job.id, "update", method="POST", body=b'{"lr": 0.1}'
    )
    assert (code, body["error"]) == (403, "forbidden")
    assert job.status is cs.JobStatus.RUNNING  # nothing changed

    # a Jupyter user with no clustersdk credentials gets nothing of the TLS cluster
    code, body = await call(
        jp_fetch, "carol", "api", "jobs", job.id, "stop", method="POST", body=b""
    )
    assert code in (403, 404) and job.status is cs.JobStatus.RUNNING

    # bob's own job is his to change; alice, an admin, may stop anyone's
    code, body = await call(
        jp_fetch, "bob", "api", "jobs", mine.id, "pause", method="POST", body=b""
    )
    assert code == 200 and body["status"] == "PAUSED"
    code, body = await call(
        jp_fetch, "alice", "api", "jobs", mine.id, "stop", method="POST", body=b""
    )
    assert code == 200 and body["status"] in ("STOPPING", "STOPPED")
    wait_for(lambda: mine.status is cs.JobStatus.STOPPED, timeout=60)
    asked = [(e["op"], e["by"]) for e in mine.events() if e["kind"] == "request"]
    assert asked == [("pause", "bob"), ("stop", "alice")]

    # the metrics' owner label is who launched, by their certificate
    text = (await jp_fetch("clustersdk", "metrics", headers=as_user("bob"))).body.decode()
    info = [
        line
        for line in text.splitlines()
        if line.startswith("clustersdk_job_info{") and 'name="alice-rest"' in line
    ]
    assert info and 'owner="alice"' in info[0], info
    code, body = await call(
        jp_fetch, "alice", "api", "jobs", job.id, "stop", method="POST", body=b""
    )
    assert code == 200 and body["status"] in ("STOPPING", "STOPPED")
    wait_for(lambda: job.status is cs.JobStatus.STOPPED, timeout=60)


TICKER = (
    "import time\nfor i in range(3000):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"
)


async def test_a_script_job_posted_over_rest_is_its_jupyter_users(
    jp_fetch, people, sdk_cluster, tmp_path
):
    _, clusters = people
    script = tmp_path / "ticker.py"
    script.write_text(TICKER)
    body = {"world_size": 1, "script": str(script), "name": "alice-posted"}
    code, theirs = await call(
        jp_fetch, "alice", "api", "jobs", method="POST", body=json.dumps(body).encode()
    )
    assert code == 201, theirs
    assert theirs["owner"] == "alice" and theirs["may_change"] is True
    # an owner is who asks, never a field of the request
    claim = {**body, "name": "bob-claims", "owner": "alice"}
    code, refused = await call(
        jp_fetch, "bob", "api", "jobs", method="POST", body=json.dumps(claim).encode()
    )
    assert code == 400 and "owner" in refused["message"], refused
    code, mine = await call(
        jp_fetch,
        "bob",
        "api",
        "jobs",
        method="POST",
        body=json.dumps({**body, "name": "bob-posted"}).encode(),
    )
    assert code == 201 and mine["owner"] == "bob" and mine["may_change"] is True, mine
    job = cs.Job.attach(clusters["alice"], "alice-posted")
    wait_for(lambda: "tick 2" in job.logs(), timeout=90)

    code, seen = await call(jp_fetch, "bob", "api", "jobs", theirs["id"])
    assert code == 200 and seen["may_change"] is False and "belongs to 'alice'" in seen["refusal"]
    for action in ("stop", "suspend", "pause"):
        code, answer = await call(
            jp_fetch, "bob", "api", "jobs", theirs["id"], action, method="POST", body=b""
        )
        assert (code, answer["error"]) == (403, "forbidden"), answer
        assert answer["message"].startswith(f"'bob' may not {action} job 'alice-posted'")
    assert job.status is cs.JobStatus.RUNNING  # nothing changed

    code, answer = await call(
        jp_fetch, "bob", "api", "jobs", mine["id"], "stop", method="POST", body=b""
    )
    assert code == 200 and answer["status"] in ("STOPPING", "STOPPED"), answer
    code, answer = await call(
        jp_fetch, "alice", "api", "jobs", theirs["id"], "stop", method="POST", body=b""
    )
    assert code == 200 and answer["status"] in ("STOPPING", "STOPPED"), answer
    wait_for(lambda: job.status is cs.JobStatus.STOPPED, timeout=60)
    ended = cs.Job.attach(clusters["alice"], "bob-posted")
    wait_for(lambda: ended.status is cs.JobStatus.STOPPED, timeout=60)
    asked = [(e["op"], e["by"]) for e in ended.events() if e["kind"] == "request"]
    assert asked == [("stop", "bob")]
