"""Pure parts of the extension: JSON models, Prometheus families, error mapping.

And the manager without a server: a test double stands in for the schedulers.
"""

from __future__ import annotations

import json
import math
import os

import pytest
from jupyter_clustersdk import errors, metrics, models
from jupyter_clustersdk.manager import ClusterManager
from jupyter_clustersdk.models import Target
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

import clustersdk as cs
from clustersdk import registry

TARGET = Target("tcp-127.0.0.1-8786", "tcp://127.0.0.1:8786", "local", "registry")
SLOTS = [
    {
        "worker": "tcp://h1:1",
        "host": "h1",
        "kind": "cuda",
        "index": 0,
        "uuid": "GPU-a",
        "job": "j1",
    },
    {
        "worker": "tcp://h1:2",
        "host": "h1",
        "kind": "cuda",
        "index": 1,
        "uuid": "GPU-b",
        "job": None,
    },
]
RECORD = {
    "id": "j1",
    "name": "train",
    "scheduler": "Scheduler-1",
    "status": "RUNNING",
    "spec": {"id": "j1", "name": "train", "world_size": 1, "strategy": "ddp"},
    "submitted": 10.0,
    "started": 11.0,
    "ended": None,
    "reason": "",
    "ranks": [{"rank": 0, "worker": "tcp://h1:1", "host": "h1", "device": "cuda:0"}],
    "error": None,
    "paused_at": None,
    "checkpoint": "/ck/step-10",
    "result": b"\x00",
}
NVML = {
    "seq": 3,
    "rank": 0,
    "time": 20.0,
    "source": "nvml",
    "gpu_util": 87.0,
    "gpu_mem_used": 2e9,
    "gpu_mem_total": 8e9,
    "gpu_power": 120.5,
}  # no temperature


# models ---------------------------------------------------------------------------------
def test_cluster_id_is_url_safe_and_stable():
    assert models.cluster_id("tcp://10.0.0.5:8786") == "tcp-10.0.0.5-8786"
    assert models.cluster_id("tls://[::1]:8786") == "tls-1-8786"
    assert models.cluster_id("tcp://a:1") == registry.safe_name("tcp://a:1")


def test_job_model_keeps_record_fields_drops_the_result_and_adds_derived_ones():
    job = models.job_model(RECORD, "c1")
    assert (job["cluster"], job["terminal"], job["world_size"], job["strategy"]) == (
        "c1",
        False,
        1,
        "ddp",
    )
    assert job["checkpoint"] == "/ck/step-10" and job["paused_at"] is None
    assert "result" not in job and "progress" not in job
    json.dumps(job)
    assert models.job_model({**RECORD, "status": "STOPPED"}, "c1")["terminal"] is True
    assert models.job_model({**RECORD, "status": "NEW_STATE"}, "c1")["terminal"] is False


def test_history_model_is_json_without_nan_and_says_where_to_read_on():
    rows = [
        {"seq": 5, "rank": 0, "step": 1, "time": 1.0, "loss": float("nan")},
        {"seq": 6, "rank": 1, "step": 1, "time": 1.1, "loss": 0.5},
    ]
    model = models.history_model("j1", rows, since=4, limit=2)
    assert model["rows"][0]["loss"] is None and model["last"] == 6 and model["more"] is True
    json.dumps(model, allow_nan=False)
    empty = models.history_model("j1", [], since=6, limit=100)
    assert (empty["last"], empty["more"]) == (6, False)


def test_logs_model_joins_lines():
    lines = [
        {"seq": 1, "rank": 0, "time": 1.0, "stream": "stdout", "text": "a"},
        {"seq": 2, "rank": 0, "time": 1.0, "stream": "stderr", "text": "b"},
    ]
    model = models.logs_model("j1", lines, since=0, rank=0)
    assert (model["text"], model["last"]) == ("a\nb\n", 2)


def test_progress_is_the_furthest_step_and_the_mean_of_each_ranks_newest_scalars():
    latest = {
        0: {"seq": 9, "rank": 0, "step": 7, "time": 2.0, "loss": 1.0, "acc": float("nan")},
        1: {"seq": 8, "rank": 1, "step": 6, "time": 1.9, "loss": 3.0},
    }
    p = models.progress_model(latest, 12.5, 3.0)
    assert (p["step"], p["scalars"], p["steps_per_second"]) == (7, {"loss": 2.0}, 12.5)
    assert p["ranks"] == {"0": {"step": 7, "time": 2.0}, "1": {"step": 6, "time": 1.9}}
    assert models.progress_model({}, 0.0, None)["step"] is None


@pytest.mark.parametrize(
    ("points", "now", "expected"),
    [
        ([(0.0, 0), (2.0, 20)], 2.0, 10.0),
        ([(0.0, 0)], 1.0, 0.0),  # one point: no pace
        ([(0.0, 0), (1.0, 10), (50.0, 20)], 50.0, 0.0),  # only one point in the window
        ([(0.0, 0), (2.0, 20)], 30.0, 0.0),  # stale: nothing new for 28 s
        ([(0.0, 5), (1.0, 2)], 1.0, 0.0),  # a restart went back in steps
    ],
)
def test_steps_per_second(points, now, expected):
    assert models.steps_per_second(points, now, window=30.0, stale=10.0) == expected


def test_cluster_model_counts_slots_busy_gpus_and_mean_gpu_utilisation():
    samples = models.newest_by_worker(RECORD, {0: NVML})
    jobs = [RECORD, {**RECORD, "id": "j2", "status": "QUEUED"}]
    summary = models.cluster_model(
        TARGET, inventory=SLOTS, jobs=jobs, samples=samples, scheduler_id="Scheduler-1"
    )
    assert (summary["workers"], summary["hosts"], summary["gpus"]) == (2, 1, 2)
    assert summary["utilisation"] == {
        "slots": 2,
        "busy": 1,
        "busy_fraction": 0.5,
        "gpu_util_mean": 87.0,
    }
    assert summary["queue_length"] == 1 and summary["jobs"]["RUNNING"] == 1
    assert "slots" not in summary
    detail = models.cluster_model(TARGET, inventory=SLOTS, jobs=jobs, samples=samples, detail=True)
    assert detail["slots"][0]["telemetry"]["gpu_util"] == 87.0
    assert detail["slots"][1]["telemetry"] is None
    assert [w["slots"] for w in detail["worker_details"]] == [[0], [1]]


def test_an_unreachable_cluster_says_why_and_nothing_else():
    model = models.cluster_model(TARGET, error="could not connect")
    assert model == {
        **{k: getattr(TARGET, k) for k in ("id", "address", "kind", "source")},
        "reachable": False,
        "error": "could not connect",
    }


def test_health_names_no_address_and_no_job():
    assert models.health_model({}) == (200, {"status": "ok", "schedulers": 0, "reachable": 0})
    status, body = models.health_model({"c1": None, "c2": "no answer"})
    assert status == 503 and body["reachable"] == 1
    assert body["reason"] == "cluster c2: no answer"


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (cs.SpecError("x"), 400, "bad_request"),
        (cs.CapacityError("x"), 400, "capacity"),
        (errors.BadRequestError("x"), 400, "bad_request"),
        (cs.JobNotFoundError("x"), 404, "job_not_found"),
        (errors.ClusterNotFoundError("x"), 404, "cluster_not_found"),
        (cs.InvalidTransitionError("x"), 409, "invalid_transition"),
        (errors.UnsupportedOperationError("x"), 502, "unsupported_operation"),
        (errors.SchedulerUnavailableError("x"), 502, "scheduler_unavailable"),
        (errors.UpstreamError("x"), 502, "scheduler_error"),
        (cs.JobTimeoutError("x"), 504, "timeout"),
        (RuntimeError("x"), 500, "internal"),
    ],
)
def test_http_status_of_each_error(error, status, code):
    assert errors.http_status(error) == (status, code)
    assert isinstance(error, errors.KNOWN_ERRORS) is (status != 500)


# metrics --------------------------------------------------------------------------------
def snapshot(system=None, up=True):
    job = {
        "record": RECORD,
        "system": {0: NVML} if system is None else system,
        "progress": models.progress_model(
            {0: {"rank": 0, "step": 41, "time": 20.0, "loss": 0.25, "lr": 1e-3}}, 9.5, 20.0
        ),
    }
    cluster = {
        "id": "c1",
        "up": True,
        "slots": SLOTS,
        "jobs": [job],
        "counts": {"RUNNING": 1, "QUEUED": 2, "FINISHED": 3},
    }
    return {"time": 21.0, "clusters": [cluster if up else {"id": "c1", "up": False, "error": "x"}]}


def samples(text: bytes, parser=parse_text):
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser(text.decode())
        for s in family.samples
    }


def value(found, _metric, **labels):
    return found[(_metric, tuple(sorted(labels.items())))]


def test_restarts_are_counted_per_job():
    snap = snapshot()
    snap["clusters"][0]["jobs"][0]["record"] = {**RECORD, "status": "RESTARTING", "restarts": 2}
    found = samples(metrics.render(snap))
    job = {"cluster": "c1", "job": "j1", "name": "train"}
    assert value(found, "clustersdk_job_restarts_total", **job) == 2
    assert value(found, "clustersdk_job_state", **job, state="RESTARTING") == 1
    assert value(found, "clustersdk_job_state", **job, state="RUNNING") == 0


def test_metrics_per_job_cluster_and_gpu():
    found = samples(metrics.render(snapshot()))
    job = {"cluster": "c1", "job": "j1", "name": "train"}
    assert value(found, "clustersdk_job_step", **job) == 41
    assert value(found, "clustersdk_job_loss", **job) == 0.25
    assert value(found, "clustersdk_job_steps_per_second", **job) == 9.5
    assert value(found, "clustersdk_job_scalar", **job, scalar="lr") == 1e-3
    assert value(found, "clustersdk_job_restarts_total", **job) == 0
    assert value(found, "clustersdk_job_state", **job, state="RUNNING") == 1
    assert value(found, "clustersdk_job_state", **job, state="PAUSED") == 0
    assert value(found, "clustersdk_queue_length", cluster="c1") == 2
    assert value(found, "clustersdk_jobs", cluster="c1", state="FINISHED") == 3
    assert value(found, "clustersdk_slots_busy", cluster="c1", kind="cuda") == 1
    assert value(found, "clustersdk_scheduler_up", cluster="c1") == 1
    gpu = {
        "cluster": "c1",
        "host": "h1",
        "worker": "tcp://h1:1",
        "gpu": "0",
        "uuid": "GPU-a",
        "job": "j1",
        "rank": "0",
    }
    assert value(found, "clustersdk_gpu_utilization_percent", **gpu) == 87.0
    assert value(found, "clustersdk_gpu_memory_total_bytes", **gpu) == 8e9
    assert value(found, "clustersdk_gpu_power_watts", **gpu) == 120.5
    # the board reported no temperature: no series, rather than a made-up 0
    assert not [k for k in found if k[0] == "clustersdk_gpu_temperature_celsius"]


def test_metrics_without_telemetry_or_with_cpu_samples():
    found = samples(metrics.render(snapshot(system={})))  # e.g. a scheduler without `system`
    assert not [k for k in found if k[0].startswith(("clustersdk_gpu_", "clustersdk_rank_"))]
    assert value(found, "clustersdk_job_step", cluster="c1", job="j1", name="train") == 41
    cpu = {0: {"rank": 0, "time": 1.0, "source": "psutil", "cpu_percent": 50.0, "rss": 1e8}}
    found = samples(metrics.render(snapshot(system=cpu)))
    assert (
        value(
            found,
            "clustersdk_rank_cpu_percent",
            cluster="c1",
            host="h1",
            worker="tcp://h1:1",
            job="j1",
            rank="0",
        )
        == 50.0
    )
    assert not [k for k in found if k[0].startswith("clustersdk_gpu_")]


def test_a_cluster_that_is_down_has_only_its_up_series():
    found = samples(metrics.render(snapshot(up=False)))
    assert found == {("clustersdk_scheduler_up", (("cluster", "c1"),)): 0.0}


def test_openmetrics_rendering_parses():
    from prometheus_client.exposition import choose_encoder

    encoder, _ = choose_encoder("application/openmetrics-text; version=1.0.0")
    found = samples(metrics.render(snapshot(), encoder), parser=parse_om)
    assert value(found, "clustersdk_job_step", cluster="c1", job="j1", name="train") == 41


def test_the_grafana_dashboard_queries_only_metrics_we_export():
    import re

    path = os.path.join(
        os.path.dirname(__file__), "..", "..", "dashboards", "grafana-clustersdk.json"
    )
    with open(path) as f:
        dashboard = json.load(f)
    cpu = {0: {"rank": 0, "time": 1.0, "source": "psutil", "cpu_percent": 1.0, "rss": 1.0}}
    gpu = {0: {**NVML, "gpu_temp": 60.0}}
    exported = {k[0] for system in (cpu, gpu) for k in samples(metrics.render(snapshot(system)))}
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    assert len(exprs) >= 10
    for expr in exprs:
        for name in re.findall(r"\bclustersdk_\w+", expr):
            assert name in exported, (name, expr)
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Step", "Steps per second", "Loss", "GPU utilisation", "Queue length"} <= titles


# the manager, with a test double for the schedulers ----------------------------------------
class FakeSchedulers(ClusterManager):
    """Answers ``call`` from canned data; ``system`` can be missing as on an older scheduler."""

    def __init__(self, *, has_system: bool = True, **kwargs):
        super().__init__(addresses=[TARGET.address], **kwargs)
        self.has_system = has_system
        self.calls: list[tuple[str, dict]] = []
        self.rows = [
            {"seq": i + 1, "rank": 0, "step": i, "time": 100.0 + i, "loss": 1.0 / (i + 1)}
            for i in range(12)
        ]

    async def call(self, target, op, *, call_timeout=None, **kwargs):
        self.calls.append((op, kwargs))
        if op == "inventory":
            return SLOTS
        if op == "jobs":
            return [RECORD]
        if op == "history":
            rows = [r for r in self.rows if r["seq"] > kwargs["since"]]
            return rows[: kwargs["limit"]] if kwargs.get("limit") else rows
        if op == "system":
            if not self.has_system:
                raise errors.UnsupportedOperationError("no system op")
            return [NVML] if kwargs["since"] < NVML["seq"] else []
        raise AssertionError(op)


async def test_snapshot_reads_history_incrementally():
    manager = FakeSchedulers()
    first = await manager.snapshot()
    job = first["clusters"][0]["jobs"][0]
    assert job["progress"]["step"] == 11 and job["system"] == {0: NVML}
    manager.rows.append({"seq": 13, "rank": 0, "step": 12, "time": 112.0, "loss": 0.01})
    manager.calls.clear()
    second = await manager.snapshot()
    assert second["clusters"][0]["jobs"][0]["progress"]["step"] == 12
    history_calls = [kw for op, kw in manager.calls if op == "history"]
    assert [kw["since"] for kw in history_calls] == [12]  # only what is new


async def test_without_the_system_op_gpu_gauges_are_skipped_and_not_asked_again():
    manager = FakeSchedulers(has_system=False)
    text = metrics.render(await manager.snapshot())
    assert b"clustersdk_job_step{" in text and b"clustersdk_gpu_utilization_percent{" not in text
    manager.calls.clear()
    await manager.snapshot()
    assert "system" not in [op for op, _ in manager.calls]


async def test_jobs_and_lookup_by_id_or_name():
    manager = FakeSchedulers()
    listed = await manager.jobs()
    assert [j["id"] for j in listed["jobs"]] == ["j1"] and listed["unreachable"] == []
    target, record = await manager.locate("train")
    assert (target.id, record["id"]) == (TARGET.id, "j1")
    with pytest.raises(cs.JobNotFoundError, match="no job with id or name 'nope'"):
        await manager.locate("nope")
    with pytest.raises(errors.ClusterNotFoundError, match="known clusters: tcp-127.0.0.1-8786"):
        manager.target("tcp-9")


def test_targets_come_from_config_then_the_registry_once_per_address(tmp_path):
    registry.register("tcp://127.0.0.1:8786", kind="local", local=True, state_dir=tmp_path)
    registry.register("tcp://127.0.0.1:9999", kind="connect", local=False, state_dir=tmp_path)
    manager = ClusterManager(state_dirs=[str(tmp_path)], addresses=["tcp://127.0.0.1:8786"])
    assert [(t.address, t.kind, t.source) for t in manager.targets()] == [
        ("tcp://127.0.0.1:8786", "remote", "config"),
        ("tcp://127.0.0.1:9999", "connect", "registry"),
    ]


async def test_an_unreachable_scheduler_is_an_upstream_error_and_unhealthy():
    manager = ClusterManager(addresses=["tcp://127.0.0.1:1"], connect_timeout=0.5)
    try:
        with pytest.raises(errors.SchedulerUnavailableError, match="could not connect"):
            await manager.call(manager.targets()[0], "jobs")
        status, body = await manager.health()
        assert status == 503 and "tcp://" not in json.dumps(body)
        clusters = await manager.clusters()
        assert clusters[0]["reachable"] is False and "could not connect" in clusters[0]["error"]
        assert (await manager.jobs())["unreachable"] == ["tcp-127.0.0.1-1"]
        snap = await manager.snapshot()
        assert snap["clusters"][0]["up"] is False
    finally:
        await manager.close()


async def test_a_scheduler_without_clustersdk_answers_unsupported_operation():
    from distributed import Scheduler

    async with Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address=":0") as s:
        manager = ClusterManager(addresses=[s.address])
        try:
            with pytest.raises(errors.UnsupportedOperationError, match="does not support 'pause'"):
                await manager.call(manager.targets()[0], "pause", job="j1")
            model = (await manager.clusters())[0]
            assert model["reachable"] is False and "does not support" in model["error"]
        finally:
            await manager.close()


def test_nan_is_never_sent():
    assert models._number(math.inf) is None and models._number(1.5) == 1.5


def test_a_jobs_diagnosis_is_served_as_the_openapi_description_says():
    import yaml
    from jupyter_clustersdk import app

    from clustersdk.diagnosis import Diagnosis

    found = Diagnosis(
        "host_oom",
        "host out of memory: ...",
        "lower the batch size",
        rank=1,
        worker="tcp://h1:1",
        host="h1",
        data={"rss": 1.5e9},
        time=12.0,
    )
    job = models.job_model({**RECORD, "diagnosis": found.as_dict()}, "c1")
    assert Diagnosis.from_dict(json.loads(json.dumps(job))["diagnosis"]) == found
    with open(os.path.join(os.path.dirname(app.__file__), "openapi.yaml")) as f:
        schemas = yaml.safe_load(f)["components"]["schemas"]
    described = schemas["Diagnosis"]
    assert list(described["properties"]) == list(found.as_dict())
    assert set(described["required"]) <= set(found.as_dict())
    assert schemas["Job"]["properties"]["diagnosis"]["allOf"] == [
        {"$ref": "#/components/schemas/Diagnosis"}
    ]
