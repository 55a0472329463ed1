"""``clustersdk cluster unit | kubernetes``: a standing cluster under systemd, or on Kubernetes.

Neither systemd nor Kubernetes runs here. The units of a real ``standing.up`` cluster
pass ``systemd-analyze verify`` (which is shown to fail a broken unit); the manifests
validate offline against the Kubernetes API's schemas (``kubernetes-validate``), their
Secret's certificates against its CA, and their containers' exact commands (the
Secret's files in a temporary directory for its volume, 127.0.0.1 and a free port for
the Service) form a TLS cluster here that refuses whoever has no certificate of the
cluster and runs a 2-rank job for its admin. Every process started is killed with its
process group, every directory removed, also when a test fails.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

import clustersdk as cs
from clustersdk import standing
from clustersdk.security.pki import Authority
from clustersdk.security.tls import credentials_security
from clustersdk.standing.record import HostPlan, Paths, Process, read_json
from clustersdk.standing.units import exec_line, render_units

from . import workloads
from .helpers import cli, free_port, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "kubernetes" / "clustersdk.yaml"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
IMAGE = "registry.example.com/ml/clustersdk:1"


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory removed at the end, whatever happens (processes write into it)."""
    path = Path(tempfile.mkdtemp(prefix="clustersdk-deploy-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- systemd ------------------------------------------------------------------------------
def verify(*units: Path) -> str:
    """What ``systemd-analyze verify`` says of ``units`` ('' when it finds nothing);
    its exit status is in the text when it is not 0."""
    if SYSTEMD_ANALYZE is None:
        pytest.skip("systemd-analyze is missing: apt-get install systemd (.ci/apt-packages)")
    done = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", *map(str, units)], capture_output=True, text=True, timeout=60
    )
    said = (done.stdout + done.stderr).strip()
    return said if done.returncode == 0 else f"{said}\n(exit status {done.returncode})"


def systemd_words(line: str) -> list[str]:
    """An ``ExecStart=`` line's words as systemd reads them (what :func:`exec_line`
    writes: double quotes with backslash escapes, ``%%`` and ``$$``)."""
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line)]


@pytest.fixture
def team(scratch: Path) -> Iterator[tuple[str, standing.Record]]:
    """A standing cluster ``team`` of 2 workers, up for one test and taken down after."""
    state = str(scratch / "state")
    pids: set[int] = set()
    try:
        record = standing.up(
            "team", local=2, state_dir=state, memory_limit="4 GiB", say=lambda _: None
        )
        pids = family(state)
        yield state, record
    finally:
        pids |= family(state)
        try:
            with contextlib.suppress(
                cs.ClusterSDKError
            ):  # up failed: there is nothing to take down
                standing.down("team", now=True, state_dir=state, say=lambda _: None)
        finally:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def family(state: str) -> set[int]:
    """The supervisor of ``team`` and every process under it."""
    found = read_json(Paths(state, "team").host("localhost").pid_file)
    try:
        root = psutil.Process(int(found["pid"])) if found else None
        return {root.pid, *(p.pid for p in root.children(recursive=True))} if root else set()
    except psutil.Error:
        return set()


def test_the_units_of_a_running_cluster_pass_systemd_verify_with_its_exact_commands(team, scratch):
    state, _record = team
    out = scratch / "units"
    made = cli(state, "cluster", "unit", "team", "--out", str(out))
    assert made.returncode == 0, made.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "clustersdk-team-scheduler.service",
        "clustersdk-team-worker-0.service",
        "clustersdk-team-worker-1.service",
        "clustersdk-team.target",
    ]
    assert verify(*sorted(out.iterdir())) == ""
    # what it printed: each file, the running supervisor to stop first, then systemctl
    assert all(str(out / n) in made.stdout for n in names)
    lines = made.stdout.splitlines()
    stop = next(i for i, line in enumerate(lines) if "clustersdk.standing.host stop" in line)
    enable = next(i for i, line in enumerate(lines) if "systemctl enable --now" in line)
    assert stop < enable and lines[enable].strip() == (
        "sudo systemctl enable --now clustersdk-team.target"
    )
    plan = HostPlan.from_dict(read_json(Paths(state, "team").host("localhost").plan))
    for process in plan.processes:
        text = (out / f"clustersdk-team-{process.name}.service").read_text()
        settings = dict(
            line.split("=", 1) for line in text.splitlines() if "=" in line and line[0] != "#"
        )
        assert systemd_words(settings["ExecStart"]) == process.argv  # "4 GiB" quoted
        assert settings["Restart"] == "always" and int(settings["StartLimitBurst"]) >= 1
        assert "clustersdk-team.target" in settings["PartOf"]
        if process.name != "scheduler":
            for key in ("After", "Wants"):
                assert "clustersdk-team-scheduler.service" in settings[key].split()
    target = (out / "clustersdk-team.target").read_text()
    assert "WantedBy=multi-user.target" in target


def test_systemd_verify_fails_a_broken_unit_and_quoting_survives_odd_arguments(scratch):
    python = sys.executable
    odd = ["--memory-limit", "16 GiB", "100%", "$HOME", 'say "hi"', "back\\slash", "it's"]
    plan = HostPlan(
        "odd",
        [Process("scheduler", [python, "-c", "pass"]), Process("worker-0", [python, *odd])],
    )
    units = render_units("odd", plan, str(scratch), user="root")
    for name, text in units.items():
        (scratch / name).write_text(text)
    good = sorted(scratch / name for name in units)
    assert verify(*good) == ""
    worker = (scratch / "clustersdk-odd-worker-0.service").read_text()
    [line] = [x for x in worker.splitlines() if x.startswith("ExecStart=")]
    assert systemd_words(line.removeprefix("ExecStart=")) == [python, *odd]
    assert exec_line([python, *odd]) == line.removeprefix("ExecStart=")
    # the check can fail: a misspelt key, a restart policy systemd does not know
    broken = scratch / "clustersdk-odd-broken.service"
    broken.write_text(worker.replace("Restart=always", "Restart=sometimes\nRestrat=always"))
    said = verify(broken)
    assert "Restrat" in said and "sometimes" in said, said


# --- Kubernetes ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kube() -> Iterator[dict]:
    """``clustersdk cluster kubernetes team --namespace ml --out FILE`` in a state
    directory of its own: the file's objects by kind/name, the state directory, what
    it printed."""
    state = tempfile.mkdtemp(prefix="clustersdk-kube-")
    try:
        out = os.path.join(state, "team.yaml")
        made = cli(
            state, "cluster", "kubernetes", "team", "--image", IMAGE, "--namespace", "ml",
            "--out", out,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        with open(out) as f:
            text = f.read()
        objects = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(text)}
        yield {"objects": objects, "state": state, "out": out, "text": text, "said": made.stderr}
    finally:
        shutil.rmtree(state, ignore_errors=True)


def container(objects: dict, kind_name: str, init: bool = False) -> dict:
    spec = objects[kind_name]["spec"]["template"]["spec"]
    [c] = spec["initContainers" if init else "containers"]
    return c


def secret_files(objects: dict) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in objects["Secret/team-tls"]["data"].items()}


def test_the_manifests_validate_against_the_kubernetes_api_schemas(kube):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install -e '.[test]' installs kubernetes-validate"
    )
    objects = kube["objects"]
    assert list(objects) == [
        "Secret/team-tls",
        "PersistentVolumeClaim/team-data",
        "Deployment/team-scheduler",
        "Service/team-scheduler",
        "Service/team-workers",
        "StatefulSet/team-worker",
    ]
    for version in ("1.30.0", kubernetes_validate.latest_version()):
        for name, obj in objects.items():
            assert obj["metadata"]["namespace"] == "ml", name
            kubernetes_validate.validate(obj, version, strict=True)  # raises with the reason
    assert os.stat(kube["out"]).st_mode & 0o777 == 0o600  # it holds private keys
    scheduler = objects["Deployment/team-scheduler"]["spec"]
    assert scheduler["replicas"] == 1 and scheduler["strategy"] == {"type": "Recreate"}
    assert container(objects, "Deployment/team-scheduler")["command"] == [
        "python", "-m", "clustersdk.standing.serve", "scheduler", "--tls", "/etc/clustersdk/tls",
        "--state", "/var/lib/clustersdk", "--host", "0.0.0.0", "--port", "8786",
    ]  # fmt: skip
    worker = container(objects, "StatefulSet/team-worker")
    assert worker["command"] == [
        "python", "-m", "clustersdk.standing.serve", "worker",
        "tls://team-scheduler.ml.svc:8786", "--tls", "/etc/clustersdk/tls",
        "--name", "$(POD_NAME)", "--gpu", "0",
    ]  # fmt: skip
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert objects["StatefulSet/team-worker"]["spec"]["replicas"] == 2
    service = objects["Service/team-scheduler"]["spec"]
    assert service["ports"][0]["port"] == 8786
    assert service["selector"].items() <= scheduler["template"]["metadata"]["labels"].items()
    for name in ("Deployment/team-scheduler", "StatefulSet/team-worker"):
        pod = objects[name]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] and "readinessProbe" in pod["containers"][0]
    said = kube["said"]
    credentials = read_json(Paths(kube["state"], "team").record)["credentials"]
    assert credentials in said and "port-forward svc/team-scheduler 8786:8786" in said


def test_the_secret_holds_certificates_its_ca_signed_and_never_the_cas_key(kube):
    objects = kube["objects"]
    files = secret_files(objects)
    assert set(files) == {"ca.pem", "crl.pem", "scheduler.pem", "worker.pem"}
    ca = x509.load_pem_x509_certificate(files["ca.pem"])
    for role in ("scheduler", "worker"):
        cert, *_ = x509.load_pem_x509_certificates(files[f"{role}.pem"])
        cert.verify_directly_issued_by(ca)  # raises unless the CA signed it
        key = serialization.load_pem_private_key(files[f"{role}.pem"], password=None)
        assert key.public_key() == cert.public_key()  # its own key, not the CA's
        [unit] = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
        assert unit.value == role
    crl = x509.load_pem_x509_crl(files["crl.pem"])
    assert crl.is_signature_valid(ca.public_key())
    ca_key = Path(Paths(kube["state"], "team").tls, "ca-key.pem").read_bytes()
    assert ca_key.strip() not in kube["text"].encode() and all(
        ca_key.strip() not in data for data in files.values()
    )
    # each pod gets its own role's files alone
    for kind_name, role in (
        ("Deployment/team-scheduler", "scheduler"),
        ("StatefulSet/team-worker", "worker"),
    ):
        volumes = objects[kind_name]["spec"]["template"]["spec"]["volumes"]
        [secret] = [v["secret"] for v in volumes if "secret" in v]
        assert [i["key"] for i in secret["items"]] == ["ca.pem", "crl.pem", f"{role}.pem"]


def test_run_again_it_keeps_its_authority_and_the_committed_example_is_its_output(kube, scratch):
    before = secret_files(kube["objects"])["ca.pem"]
    again = cli(kube["state"], "cluster", "kubernetes", "team", "--image", IMAGE, "--namespace",
                "ml", "--workers", "3")  # fmt: skip
    assert again.returncode == 0, again.stderr
    objects = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(again.stdout)}
    assert secret_files(objects)["ca.pem"] == before
    assert objects["StatefulSet/team-worker"]["spec"]["replicas"] == 3
    # deploy/kubernetes/clustersdk.yaml is what the command in its header writes
    committed = EXAMPLE.read_text()
    command = shlex.split(committed.splitlines()[1].removeprefix("#"))
    assert command[:3] == ["clustersdk", "cluster", "kubernetes"] and "--no-secret" in command
    state = str(scratch / "state")
    made = cli(state, *command[1:])
    assert made.returncode == 0, made.stderr
    assert made.stdout == committed
    assert not os.path.exists(state)  # --no-secret makes no authority
    assert "PRIVATE KEY" not in committed and "kind: Secret" not in committed


# the containers, run here ----------------------------------------------------------------------
class Pods:
    """The manifests' containers as local processes: each pod's /etc/clustersdk/tls a
    directory of its own, the Secret's volume one directory, the Service 127.0.0.1 and
    a free port. Every process is in a session of its own, killed with it at the end."""

    def __init__(self, objects: dict, root: Path):
        self.objects, self.root = objects, root
        self.port = free_port()
        self.address = f"tls://127.0.0.1:{self.port}"
        self.secret = root / "secret"
        self.secret.mkdir()
        (root / "state").mkdir()  # the volume's subPath, which the kubelet makes
        for name, data in secret_files(objects).items():
            (self.secret / name).write_bytes(data)
            (self.secret / name).chmod(0o440)  # the volume's defaultMode
        self.procs: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "DASK_CLUSTERSDK__STATE_DIR": str(root / "home"),
            "DASK_TEMPORARY_DIRECTORY": str(root / "tmp"),  # the workers' scratch space
        }

    def local(self, argv: list[str], pod: str) -> list[str]:
        """``argv`` of a container of ``pod`` as it runs here."""
        here = {
            "python": sys.executable,
            "8786": str(self.port),
            "0.0.0.0": "127.0.0.1",
            "tls://127.0.0.1:8786": self.address,
            "tls://team-scheduler.ml.svc:8786": self.address,
            "$(POD_NAME)": pod,
        }
        out = []
        for arg in argv:
            arg = here.get(arg, arg)
            for path, local in (
                ("/etc/clustersdk/secret", str(self.secret)),
                ("/etc/clustersdk/tls", str(self.root / pod / "tls")),
                ("/var/lib/clustersdk", str(self.root / "state")),
            ):
                arg = arg.replace(path, local) if arg.startswith(path) else arg
            out.append(arg)
        return out

    def environment(self, c: dict, pod: str) -> dict[str, str]:
        env = dict(self.env)
        for var in c.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
            else:
                assert var["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
                env[var["name"]] = pod
        return env

    def start(self, kind_name: str, pod: str) -> dict:
        """Run the pod's init container, then start its container; the container."""
        (self.root / pod / "tls").mkdir(parents=True)
        init = container(self.objects, kind_name, init=True)
        subprocess.run(self.local(init["command"], pod), env=self.env, check=True, timeout=60)
        c = container(self.objects, kind_name)
        log = open(self.root / f"{pod}.log", "wb")  # noqa: SIM115 - the child holds it
        with log:
            self.procs.append(
                subprocess.Popen(
                    self.local(c["command"], pod),
                    env=self.environment(c, pod),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        return c

    def probe(self, c: dict, pod: str, kind: str = "readinessProbe") -> bool:
        done = subprocess.run(
            self.local(c[kind]["exec"]["command"], pod),
            env=self.environment(c, pod),
            capture_output=True,
            timeout=60,
        )
        return done.returncode == 0

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # whatever it started, too
            proc.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.root.glob("*.log"))
        )


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def refused_without_a_certificate(address: str, ca: bytes) -> bool:
    """A TLS client that trusts the CA but shows no certificate gets no answer."""
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    context = ssl.create_default_context(cadata=ca.decode())
    context.check_hostname = False
    try:
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            with context.wrap_socket(raw) as s:
                s.sendall(b"\0" * 8)
                return s.recv(1) == b""  # closed: TLS 1.3 reports the refusal on a read
    except (ssl.SSLError, ConnectionError):
        return True


def test_the_containers_commands_form_a_tls_cluster_that_runs_a_job_for_its_admin_alone(
    kube, scratch
):
    from distributed import Client

    objects = kube["objects"]
    pods = Pods(objects, scratch)
    try:
        scheduler = pods.start("Deployment/team-scheduler", "team-scheduler-0")
        assert wait_for(lambda: pods.probe(scheduler, "team-scheduler-0"), timeout=60, interval=1)
        assert pods.probe(scheduler, "team-scheduler-0", "livenessProbe")
        workers = {
            n: pods.start("StatefulSet/team-worker", n) for n in ("team-worker-0", "team-worker-1")
        }
        for name, c in workers.items():
            assert wait_for(functools.partial(pods.probe, c, name), timeout=90, interval=1), name
        # each pod's TLS directory holds its role's files, and the CA's key is nowhere
        assert sorted(os.listdir(scratch / "team-worker-0" / "tls")) == [
            "ca.pem", "crl.pem", "worker.pem",
        ]  # fmt: skip
        assert not list(scratch.rglob("ca-key.pem"))

        # whoever has no certificate of the cluster is refused
        with pytest.raises((OSError, TimeoutError)):
            Client(f"tcp://127.0.0.1:{pods.port}", timeout=3)
        assert refused_without_a_certificate(pods.address, secret_files(objects)["ca.pem"])
        stranger = Authority.create(str(scratch / "other-ca"), admin="mallory", cluster="other")
        with pytest.raises((OSError, TimeoutError)):
            Client(
                pods.address,
                timeout=3,
                security=credentials_security(stranger.credentials_file("mallory")),
            )

        # the admin's credentials: a 2-rank training job
        credentials = read_json(Paths(kube["state"], "team").record)["credentials"]
        with cs.Cluster.connect(
            pods.address, credentials=credentials, state_dir=str(scratch / "home"), timeout=30
        ) as cluster:
            wait_for(lambda: len(cluster.slots()) == 2, timeout=60, interval=0.5)
            job = cluster.launch(workloads.train_mlp, kwargs={"steps": 3}, world_size=2)
            result = job.wait(timeout=180)
            assert job.status is cs.JobStatus.FINISHED
            assert len(result["losses"]) == 3
    except BaseException:
        print(pods.logs())
        raise
    finally:
        pods.stop()
