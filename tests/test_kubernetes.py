"""deploy/kubernetes/clustersdk.yaml: it parses, asks for GPUs, and its probes hit real routes.

No Kubernetes here: the containers' own command lines are run with the real
``dask`` CLI (ports made free, the scheduler's address filled in), and each
probe is sent where the kubelet would send it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from .helpers import free_port

MANIFEST = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "clustersdk.yaml"
DASK = os.path.join(os.path.dirname(sys.executable), "dask")


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    with open(MANIFEST) as f:
        return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(f)}


def container(docs, name: str) -> dict:
    [c] = docs[f"Deployment/clustersdk-{name}"]["spec"]["template"]["spec"]["containers"]
    return c


def test_the_manifest_has_a_scheduler_its_service_and_gpu_workers(docs):
    assert set(docs) == {
        "Deployment/clustersdk-scheduler",
        "Service/clustersdk-scheduler",
        "Deployment/clustersdk-worker",
    }
    for name in ("scheduler", "worker"):
        deployment = docs[f"Deployment/clustersdk-{name}"]
        assert deployment["apiVersion"] == "apps/v1"
        assert (
            deployment["spec"]["selector"]["matchLabels"].items()
            <= deployment["spec"]["template"]["metadata"]["labels"].items()
        )
    worker = container(docs, "worker")
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert worker["args"][3:5] == ["--nthreads", "1"]  # one rank per worker thread
    service = docs["Service/clustersdk-scheduler"]
    assert worker["args"][2] == f"tcp://{service['metadata']['name']}:8786"
    assert {p["port"] for p in service["spec"]["ports"]} == {8786, 8787}
    assert "readinessProbe" in container(docs, "scheduler") and "livenessProbe" in worker


def probes(c: dict) -> list[tuple[str, str, int]]:
    """(kind, path, container port) of each HTTP probe, named ports resolved."""
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    out = []
    for kind in ("readinessProbe", "livenessProbe"):
        if kind in c:
            get = c[kind]["httpGet"]
            out.append((kind, get["path"], ports.get(get["port"], get["port"])))
    return out


def dashboard_port(c: dict) -> int:
    return int(c["args"][c["args"].index("--dashboard-address") + 1].rsplit(":", 1)[1])


def answers(url: str, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as e:  # the server is up and says no: no retrying
            return e.code
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_probes_point_at_routes_the_real_dask_servers_serve(docs, tmp_path):
    scheduler, worker = container(docs, "scheduler"), container(docs, "worker")
    for c in (scheduler, worker):
        assert {port for _, _, port in probes(c)} == {dashboard_port(c)}  # the HTTP server's port
    comm, s_http, w_http = free_port(), free_port(), free_port()
    s_args = [
        a.replace("8786", str(comm)).replace(":8787", f"127.0.0.1:{s_http}")
        for a in scheduler["args"]
    ]
    w_args = [
        a.replace("clustersdk-scheduler:8786", f"127.0.0.1:{comm}")
        .replace(":8788", f"127.0.0.1:{w_http}")
        .replace("$(POD_NAME)", "w0")
        for a in worker["args"]
    ]
    assert s_args[0] == w_args[0] == "dask"
    env = {**os.environ, "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "warning"}
    procs = []
    try:
        with open(tmp_path / "dask.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [DASK, *s_args[1:], "--host", "127.0.0.1"], stdout=log, stderr=log, env=env
                )
            )
            for kind, path, _ in probes(scheduler):
                assert answers(f"http://127.0.0.1:{s_http}{path}") == 200, kind
            procs.append(
                subprocess.Popen(
                    [DASK, *w_args[1:], "--host", "127.0.0.1"], stdout=log, stderr=log, env=env
                )
            )
            for kind, path, _ in probes(worker):
                assert answers(f"http://127.0.0.1:{w_http}{path}") == 200, kind
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
