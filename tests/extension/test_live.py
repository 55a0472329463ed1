"""A real ``jupyter server`` process with the extension, as operators run it.

- schemathesis fuzzes the API from the OpenAPI description the server serves:
  no 5xx, every response matches the description;
- Debian's ``prometheus`` scrapes ``/clustersdk/metrics`` with the token, and a
  query through Prometheus' HTTP API returns the running job's step;
- ``jupyter server extension list`` shows the extension enabled on install (what the
  wheel ships, built from a clean checkout: ``test_labextension.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from jupyter_clustersdk.handlers import openapi_spec
from jupyter_clustersdk.models import cluster_id
from schemathesis import GenerationMode

from ..helpers import free_port

START_TIMEOUT = 90.0


@dataclasses.dataclass
class LiveServer:
    port: int
    token: str
    log: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}


def stop_process(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)


@pytest.fixture(scope="module")
def live_server(sdk_state, spin_job):
    """``python -m jupyter_server`` on a free port, serving the package's cluster."""
    with tempfile.TemporaryDirectory(prefix="clustersdk-jupyter-") as root:
        config = os.path.join(root, "config")
        os.makedirs(config)
        with open(os.path.join(config, "jupyter_server_config.json"), "w") as f:
            json.dump(
                {
                    "ServerApp": {"jpserver_extensions": {"jupyter_clustersdk": True}},
                    "ClusterSDKApp": {"state_dirs": [str(sdk_state)]},
                },
                f,
            )
        server = LiveServer(
            port=free_port(), token=secrets.token_hex(16), log=os.path.join(root, "server.log")
        )
        env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": config,
            "JUPYTER_DATA_DIR": os.path.join(root, "data"),
            "JUPYTER_RUNTIME_DIR": os.path.join(root, "runtime"),
        }
        with open(server.log, "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "jupyter_server",
                    "--ServerApp.ip=127.0.0.1",
                    f"--ServerApp.port={server.port}",
                    "--ServerApp.port_retries=0",
                    "--ServerApp.open_browser=False",
                    "--ServerApp.allow_root=True",
                    f"--ServerApp.root_dir={root}",
                    f"--IdentityProvider.token={server.token}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=root,
                start_new_session=True,
            )
        try:
            _wait_healthy(server, proc)
            yield server
        finally:
            stop_process(proc)


def _wait_healthy(server: LiveServer, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if requests.get(server.url + "/clustersdk/healthz", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    with open(server.log) as f:
        pytest.fail(f"jupyter server did not become healthy:\n{f.read()[-5000:]}")


# schemathesis ------------------------------------------------------------------------------
# Driven through Hypothesis directly: schemathesis' lazy pytest loader (`from_fixture`)
# needs pytest < 9, and a schema loaded at import time needs a server at collection.
OPERATIONS = [
    (method.upper(), path)
    for path, item in openapi_spec()["paths"].items()
    for method in item
    if method in ("get", "post")
]


def _takes_input(method: str, path: str) -> bool:
    item = openapi_spec()["paths"][path]
    operation = item[method.lower()]
    return bool(
        item.get("parameters") or operation.get("parameters") or operation.get("requestBody")
    )


# invalid input only where there is input to spoil
CASES = [
    (m, p, mode)
    for m, p in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or _takes_input(m, p)
]
FUZZ = settings(
    max_examples=10,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def api_schema(live_server):
    """The description as the running server serves it (with its base URL)."""
    return schemathesis.openapi.from_url(
        live_server.url + "/clustersdk/api/openapi.json", headers=live_server.headers, timeout=10
    )


# Operations whose schema-valid input may still be refused (400): a script job's script
# must exist on the server, its queue and priority be known, its world size fit the
# cluster: no schema can say so. Their answers are still checked (status, shape, no 5xx).
DEPENDS_ON_STATE = {("POST", "/clustersdk/api/jobs")}


def _http_accepts(name: str, value: str) -> bool:
    """Whether tornado's HTTP layer takes this header (a valid name and value)."""
    from tornado.httputil import HTTPHeaders, HTTPInputError

    try:
        HTTPHeaders().add(name, value)
    except (HTTPInputError, TypeError):
        return False
    return True


def fuzz(operation, live_server, mode, **fixed) -> None:
    """Hypothesis cases for one operation; each is sent and its response validated."""
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    excluded = (
        [positive_data_acceptance]
        if (operation.method.upper(), operation.path) in DEPENDS_ON_STATE
        else []
    )

    @given(case=operation.as_strategy(generation_mode=mode, **fixed))
    @FUZZ
    def check(case):
        # the API declares no header parameters; a generated header tornado's HTTP layer
        # refuses (a Host that is no host, a name that is no token) gets its bare 400
        # before any handler runs, which is no answer of this API's to check
        if case.headers:
            for name in [
                n for n, v in case.headers.items() if n.lower() == "host" or not _http_accepts(n, v)
            ]:
                del case.headers[name]
        case.call_and_validate(headers=live_server.headers, timeout=30, excluded_checks=excluded)

    check()


@pytest.mark.parametrize(
    ("method", "path", "mode"), CASES, ids=[f"{m} {p} {mode.value}" for m, p, mode in CASES]
)
def test_api_conforms_to_its_openapi_description(api_schema, live_server, method, path, mode):
    """Random ids, parameters and bodies: no 5xx, only documented statuses and shapes."""
    fuzz(api_schema[path][method], live_server, mode)


@pytest.mark.parametrize(
    ("method", "path"),
    [op for op in OPERATIONS if op[0] == "GET" and "{" in op[1]],
    ids=lambda v: v,
)
def test_reads_of_the_running_job_and_its_cluster_conform(
    api_schema, live_server, spin_job, method, path
):
    """The same for reads of the real job and cluster, with fuzzed query parameters."""
    fixed = {"job": spin_job.id, "cluster": cluster_id(spin_job.cluster.scheduler_address)}
    operation = api_schema[path][method]
    names = {p.name for p in operation.path_parameters}
    fuzz(
        operation,
        live_server,
        GenerationMode.POSITIVE,
        path_parameters={k: v for k, v in fixed.items() if k in names},
    )


# Prometheus -------------------------------------------------------------------------------
def test_prometheus_scrapes_the_running_jobs_step_and_goodput(live_server, spin_job):
    binary = shutil.which("prometheus")
    if binary is None:
        message = "Debian's prometheus is not installed (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI installs it from .ci/apt-packages")
        pytest.skip(message)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="clustersdk-prometheus-") as root:
        config = os.path.join(root, "prometheus.yml")
        with open(config, "w") as f:
            json.dump(
                {  # JSON is YAML
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": "clustersdk",
                            "metrics_path": "/clustersdk/metrics",
                            "honor_labels": True,  # our `job` label (a job id) beats the scrape job's name
                            "authorization": {"type": "token", "credentials": live_server.token},
                            "static_configs": [{"targets": [f"127.0.0.1:{live_server.port}"]}],
                        }
                    ],
                },
                f,
            )
        log_path = os.path.join(root, "prometheus.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={root}/data",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=root,
                start_new_session=True,
            )
        base = f"http://127.0.0.1:{port}"
        try:
            step = _query(base, f'clustersdk_job_step{{job="{spin_job.id}"}}', proc, log_path)
            # where its time went: a share, and seconds per bucket that add up to its wall
            ratio = _query(
                base, f'clustersdk_job_goodput_ratio{{job="{spin_job.id}"}}', proc, log_path
            )
            buckets = _query(
                base, f'count(clustersdk_job_time_seconds{{job="{spin_job.id}"}})', proc, log_path
            )
            target = _target_health(base)
        finally:
            stop_process(proc)
    assert target == "up"
    assert 0.5 < ratio <= 1.0  # a job that has done nothing but steps since it started
    assert buckets == 7
    now = requests.get(
        f"{live_server.url}/clustersdk/api/jobs/{spin_job.id}",
        headers=live_server.headers,
        timeout=10,
    ).json()["progress"]["step"]
    assert 0 < step <= now


def _query(
    base: str, query: str, proc: subprocess.Popen, log_path: str, timeout: float = 60.0
) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            answer = requests.get(f"{base}/api/v1/query", params={"query": query}, timeout=5)
            result = answer.json()["data"]["result"] if answer.ok else []
        except requests.ConnectionError:
            result = []
        if result:
            return float(result[0]["value"][1])
        time.sleep(0.5)
    try:
        targets = requests.get(f"{base}/api/v1/targets", timeout=5).json()
    except (requests.RequestException, ValueError) as e:
        targets = repr(e)
    with open(log_path) as f:
        pytest.fail(
            f"Prometheus returned nothing for {query} within {timeout} s; targets: "
            f"{targets}\nlog:\n{f.read()[-3000:]}"
        )


def _target_health(base: str) -> str:
    targets = requests.get(f"{base}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    return targets[0]["health"]


# installation -----------------------------------------------------------------------------
def test_the_extension_is_enabled_on_install(tmp_path):
    """What `pip install` sets up: the sys-prefix config enables the extension."""
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path)}  # no user-level config
    jupyter = os.path.join(os.path.dirname(sys.executable), "jupyter")
    out = subprocess.run(
        [jupyter, "server", "extension", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    text = out.stdout + out.stderr
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)  # without the colours
    assert "jupyter_clustersdk enabled" in plain, text
    assert re.search(r"jupyter_clustersdk 0\.1\.0\s+OK", plain), text
