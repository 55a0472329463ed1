"""Spot and preemptible VM notices (clustersdk.runtime.cloud): each provider's protocol
read from a real HTTP server standing in for the VM's metadata endpoint, and, end to end
on four local slots, a spot interruption announced to one worker only: its job moves to
other slots before the VM's end and finishes bitwise equal to the run nobody moved, and
the slot takes no new ranks."""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dask.config
import pytest

import clustersdk as cs
from clustersdk.runtime import cloud

from . import workloads
from .helpers import (
    MOVING_KW,
    assert_bitwise,
    free_port,
    rows,
    running_beside_a_reference,
    wait_for,
    workers_of,
)

TOKEN = "AQAEAtoken=="
NOW = datetime.datetime(2026, 12, 7, 20, 21, 0, tzinfo=datetime.timezone.utc).timestamp()

Answer = tuple[int, str] | Callable[[dict[str, str]], tuple[int, str]]


class Endpoint:
    """What the stand-in endpoint answers: ``routes[(method, path)]``, a (status, body)
    or a function of the request's headers; 404 for the rest. ``seen`` lists requests."""

    def __init__(self, url: str):
        self.url = url
        self.routes: dict[tuple[str, str], Answer] = {}
        self.seen: list[tuple[str, str, dict[str, str]]] = []

    def answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        self.seen.append((method, path, headers))
        route = self.routes.get((method, path), (404, "Not Found"))
        return route(headers) if callable(route) else route


class Handler(BaseHTTPRequestHandler):
    def _reply(self) -> None:
        status, body = self.server.endpoint.answer(  # type: ignore[attr-defined]
            self.command,
            self.path,
            self.headers,  # case-insensitive, as HTTP's are
        )
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = _reply

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    """A metadata endpoint on a free port of 127.0.0.1, shut down after the test."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.endpoint = Endpoint(f"http://127.0.0.1:{server.server_port}")  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.endpoint  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def fetch(endpoint: Endpoint) -> cloud.Fetch:
    return cloud.http_fetch(endpoint.url, "clustersdk-agent (test)")


def aws(endpoint: Endpoint, action: tuple[int, str] | None = None) -> None:
    """IMDSv2: a token for a PUT that asks for one; the notice only with that token."""

    def token(headers: dict[str, str]) -> tuple[int, str]:
        asked = "X-aws-ec2-metadata-token-ttl-seconds" in headers
        return (200, TOKEN) if asked else (400, "Bad Request")

    def notice(headers: dict[str, str]) -> tuple[int, str]:
        if headers.get("X-aws-ec2-metadata-token") != TOKEN:
            return 401, "Unauthorized"
        return action or (404, "Not Found")

    endpoint.routes[("PUT", "/latest/api/token")] = token
    endpoint.routes[("GET", "/latest/meta-data/spot/instance-action")] = notice


# --- AWS ---------------------------------------------------------------------------------------
def test_aws_says_nothing_until_a_spot_interruption_then_when(endpoint):
    provider, read = cloud.AWS(), fetch(endpoint)
    aws(endpoint)
    assert provider.check(read, NOW) is None
    assert provider.check(read, NOW + 5) is None
    aws(endpoint, (200, json.dumps({"action": "terminate", "time": "2026-12-07T20:23:00Z"})))
    notice = provider.check(read, NOW + 10)
    assert notice == cloud.Notice(NOW + 120, "AWS spot interruption (terminate at 20:23:00 UTC)")
    # one token for all three polls, sent with each
    assert [m for m, _, _ in endpoint.seen] == ["PUT", "GET", "GET", "GET"]
    assert endpoint.seen[0][2]["X-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    assert all(h["User-Agent"] == "clustersdk-agent (test)" for _, _, h in endpoint.seen)


def test_aws_stop_and_hibernate_are_notices_too_and_a_bad_answer_is_no_notice(endpoint):
    provider, read = cloud.AWS(), fetch(endpoint)
    aws(endpoint, (200, json.dumps({"action": "hibernate", "time": "2026-12-07T20:21:30Z"})))
    assert provider.check(read, NOW).why == "AWS spot interruption (hibernate at 20:21:30 UTC)"
    for body in ("{not json", json.dumps({"action": "stop"}), json.dumps(["terminate"])):
        aws(endpoint, (200, body))
        with pytest.raises(cloud.PollError, match="spot/instance-action said"):
            provider.check(read, NOW)


def test_aws_gets_a_new_token_when_the_old_one_is_refused(endpoint):
    provider, read = cloud.AWS(), fetch(endpoint)
    aws(endpoint)
    assert provider.check(read, NOW) is None
    refused = endpoint.routes[("GET", "/latest/meta-data/spot/instance-action")]
    endpoint.routes[("GET", "/latest/meta-data/spot/instance-action")] = lambda h: (401, "")
    with pytest.raises(cloud.PollError, match="HTTP 401"):
        provider.check(read, NOW + 5)
    endpoint.routes[("GET", "/latest/meta-data/spot/instance-action")] = refused
    assert provider.check(read, NOW + 10) is None
    assert [m for m, _, _ in endpoint.seen] == ["PUT", "GET", "GET", "PUT", "GET"]


# --- GCP ---------------------------------------------------------------------------------------
def test_gcp_preempted_true_leaves_thirty_seconds(endpoint):
    provider, read = cloud.GCP(), fetch(endpoint)
    said = {"now": "FALSE"}

    def preempted(headers: dict[str, str]) -> tuple[int, str]:
        if headers.get("Metadata-Flavor") != "Google":
            return 403, "Forbidden"
        return 200, said["now"]

    endpoint.routes[("GET", "/computeMetadata/v1/instance/preempted")] = preempted
    assert provider.check(read, NOW) is None
    said["now"] = "TRUE"
    assert provider.check(read, NOW) == cloud.Notice(
        NOW + 30, "GCP preemption (stop at about 20:21:30 UTC)"
    )
    said["now"] = "maybe"
    with pytest.raises(cloud.PollError, match="not TRUE or FALSE"):
        provider.check(read, NOW)


# --- Azure -------------------------------------------------------------------------------------
def azure(endpoint: Endpoint, events: list[dict] | str) -> None:
    def guarded(answer: tuple[int, str]) -> Callable[[dict[str, str]], tuple[int, str]]:
        return lambda h: answer if h.get("Metadata") == "true" else (400, "Bad Request")

    body = events if isinstance(events, str) else json.dumps({"Events": events})
    endpoint.routes[
        ("GET", "/metadata/instance/compute/name?api-version=2021-02-01&format=text")
    ] = guarded((200, "gpu-vm-7"))
    endpoint.routes[("GET", "/metadata/scheduledevents?api-version=2020-07-01")] = guarded(
        (200, body)
    )


def event(kind: str, vms: list[str], not_before: float | None) -> dict:
    when = "" if not_before is None else email.utils.formatdate(not_before, usegmt=True)
    return {
        "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": vms,
        "EventStatus": "Scheduled" if when else "Started",
        "NotBefore": when,
    }


def test_azure_reads_the_preempt_events_of_this_vm_only(endpoint):
    provider, read = cloud.Azure(), fetch(endpoint)
    azure(endpoint, [])
    assert provider.check(read, NOW) is None
    azure(endpoint, [event("Preempt", ["other-vm"], NOW + 30), event("Freeze", ["gpu-vm-7"], NOW)])
    assert provider.check(read, NOW) is None
    azure(
        endpoint,
        [event("Terminate", ["gpu-vm-7"], NOW + 300), event("Preempt", ["gpu-vm-7"], NOW + 30)],
    )
    assert provider.check(read, NOW) == cloud.Notice(
        NOW + 30, "Azure Preempt event (not before 20:21:30 UTC)"
    )
    azure(endpoint, [event("Preempt", ["gpu-vm-7"], None)])  # started: now
    assert provider.check(read, NOW).at == NOW
    names = [p for _, p, _ in endpoint.seen if "compute/name" in p]
    assert len(names) == 1  # the VM's name is asked once
    azure(endpoint, "<html>busy</html>")
    with pytest.raises(cloud.PollError, match="scheduledevents said"):
        provider.check(read, NOW)


# --- no endpoint, settings, detection ---------------------------------------------------------
def test_a_poller_without_an_endpoint_logs_once_and_sends_nothing(caplog):
    sent: list[cloud.Notice] = []

    async def send(notice: cloud.Notice) -> None:
        sent.append(notice)

    async def poll_a_while() -> cloud.Poller:
        read = cloud.http_fetch(f"http://127.0.0.1:{free_port()}", "test", timeout=0.5)
        poller = cloud.Poller(cloud.AWS(), read, 0.05, send)
        await asyncio.sleep(0.6)
        poller.stop()
        return poller

    with caplog.at_level(logging.WARNING, logger="clustersdk.runtime.cloud"):
        poller = asyncio.run(poll_a_while())
    assert sent == [] and poller.notice is None
    failed = [r for r in caplog.records if "could not read aws's preemption notices" in r.message]
    assert len(failed) == 1, caplog.text


def test_a_poller_sends_the_first_notice_once(endpoint):
    sent: list[cloud.Notice] = []

    async def send(notice: cloud.Notice) -> None:
        sent.append(notice)

    async def until_sent() -> None:
        poller = cloud.Poller(cloud.GCP(), fetch(endpoint), 0.02, send)
        await asyncio.sleep(0.3)
        assert poller._task.done() and poller.notice == sent[0]

    endpoint.routes[("GET", "/computeMetadata/v1/instance/preempted")] = (200, "TRUE")
    asyncio.run(until_sent())
    assert len(sent) == 1 and sent[0].why.startswith("GCP preemption")


def test_settings_name_what_is_wrong():
    with pytest.raises(cs.SpecError, match=r"provider 'ec2' is not one of auto, off, aws, gcp"):
        cloud.Settings("ec2")
    with pytest.raises(cs.SpecError, match=r"url 'http://x' needs a named provider"):
        cloud.Settings("auto", url="http://x")
    with pytest.raises(cs.SpecError, match=r"interval 0 is not a positive number"):
        cloud.Settings("aws", interval=0)
    with dask.config.set({"clustersdk.cloud-notices": {"provider": False, "pace": 3}}):
        with pytest.raises(cs.SpecError, match=r"has no setting 'pace'"):
            cloud.Settings.from_config()
    with dask.config.set({"clustersdk.cloud-notices.provider": False}):  # YAML's bare off
        assert cloud.Settings.from_config().provider_here() is None


@pytest.mark.parametrize(
    "files, cloud_name",
    [
        ({"sys_vendor": "Amazon EC2", "product_name": "g5.xlarge"}, "aws"),
        ({"sys_vendor": "Google", "product_name": "Google Compute Engine"}, "gcp"),
        (
            {
                "sys_vendor": "Microsoft Corporation",
                "product_name": "Virtual Machine",
                "chassis_asset_tag": cloud.AZURE_ASSET_TAG,
            },
            "azure",
        ),
        ({"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine"}, None),
        ({"sys_vendor": "Dell Inc.", "product_name": "PowerEdge R750xa"}, None),
        ({}, None),
    ],
)
def test_auto_finds_the_cloud_in_the_firmware_and_nothing_elsewhere(tmp_path, files, cloud_name):
    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n")
    assert cloud.detect(str(tmp_path)) == cloud_name
    found = cloud.Settings("auto").provider_here(str(tmp_path))
    assert (found.name if found else None) == cloud_name


# --- end to end ---------------------------------------------------------------------------------
@pytest.fixture
def spot4(endpoint, tmp_path):
    """Four local slots whose workers poll ``endpoint`` as AWS every 0.3 s."""
    aws(endpoint)
    notices = {"provider": "aws", "url": endpoint.url, "interval": 0.3}
    with dask.config.set({"clustersdk.cloud-notices": notices}):
        c = cs.Cluster.local(workers=4, state_dir=str(tmp_path / "state"))
    try:
        yield c
    finally:
        c.close()


def test_a_spot_interruption_moves_the_job_before_the_vm_goes(spot4, endpoint, tmp_path):
    (want_state, want_rows), job, seen = running_beside_a_reference(spot4, "spot", tmp_path / "ck")
    leaving = workers_of(spot4, job)[1]
    at = max(r["step"] for r in job.history())
    ends = time.time() + 20
    action = {"action": "terminate", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ends))}

    def instance_action(headers: dict[str, str]) -> tuple[int, str]:
        if headers.get("X-aws-ec2-metadata-token") != TOKEN:
            return 401, ""
        # this VM's worker alone is told (each agent names its worker)
        return (200, json.dumps(action)) if leaving in headers["User-Agent"] else (404, "")

    endpoint.routes[("GET", "/latest/meta-data/spot/instance-action")] = instance_action
    # off that slot and running on two others before the VM's end
    wait_for(
        lambda: job.status is cs.JobStatus.RUNNING and "QUEUED" in seen,
        timeout=ends - time.time(),
    )
    assert leaving not in workers_of(spot4, job) and time.time() < ends

    got = job.wait(timeout=120)
    assert seen.after("RUNNING")[:3] == ["RUNNING", "SUSPENDING", "QUEUED"]
    (notice,) = [e for e in job.events() if e["kind"] == "preempted"]
    assert f"worker {leaving} (host " in notice["message"]
    assert "received AWS spot interruption (terminate at " in notice["message"]
    assert job.info()["checkpoint_step"] >= at and job.restarts == 0
    assert_bitwise(got, want_state, MOVING_KW["steps"])
    assert rows(job) == want_rows  # no step lost, none done twice

    # the worker stays (the VM goes by itself) and takes no new ranks: four wait for it
    slots = {s["worker"]: s for s in spot4.slots()}
    assert len(slots) == 4 and slots[leaving]["job"] is None
    full = spot4.launch(workloads.ticker, kwargs={"steps": 3, "sleep": 0.01}, world_size=4)
    time.sleep(1.5)
    assert full.status is cs.JobStatus.QUEUED
    full.stop(wait=False)
