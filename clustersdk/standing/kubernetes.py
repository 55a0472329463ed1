"""A standing cluster on Kubernetes: its manifests, with its own certificate authority.

``clustersdk cluster kubernetes team --image IMAGE`` makes (or, run again, reuses) the
cluster's certificate authority under this account's state directory
(``standing/team/tls``, beside a record of kind ``kubernetes``), and writes one
multi-document YAML file for ``kubectl apply -f``:

- ``Secret/team-tls``: ``ca.pem``, ``crl.pem``, ``scheduler.pem``, ``worker.pem``
  (never the CA's key, which stays here); each pod mounts its role's files alone, and
  an init container copies them into a memory-backed ``emptyDir`` at
  ``/etc/clustersdk/tls``, where the control plane writes a new revocation list;
- ``PersistentVolumeClaim/team-data`` (``ReadWriteMany``): the control plane's journal
  under ``state/``, mounted by the scheduler at ``/var/lib/clustersdk``, and the jobs'
  checkpoints under ``checkpoints/``, mounted by every worker at ``/checkpoints``;
- ``Deployment/team-scheduler`` (one replica, ``Recreate``), running::

      python -m clustersdk.standing.serve scheduler --tls /etc/clustersdk/tls \\
          --state /var/lib/clustersdk --host 0.0.0.0 --port 8786

  so the control plane is loaded from its first moment and journals to the volume;
- ``Service/team-scheduler``: port 8786, ``tls://team-scheduler.NS.svc:8786``;
- ``StatefulSet/team-worker`` (pods ``team-worker-0``, ``-1``...; started in parallel),
  each with ``nvidia.com/gpu: 1`` and running::

      python -m clustersdk.standing.serve worker tls://team-scheduler.NS.svc:8786 \\
          --tls /etc/clustersdk/tls --name $(POD_NAME) --gpu 0

Pods run as user and group 1000 (``runAsNonRoot``; an image whose Python that user can
run), with no privilege escalation, no capabilities, the runtime's seccomp profile and
no service-account token. Their probes (:mod:`.probe`) ask the scheduler over TLS:
the scheduler's whether it answers, a worker's readiness whether it is among the
scheduler's workers. A worker has no liveness probe: its nanny restarts its worker
process, the pod's container ends (and is restarted) when the nanny does, and a
probe through the scheduler would restart every worker whenever the scheduler is
away. Dask's certificates are not checked against host names (``check_hostname`` is
off: the cluster's own CA is the only one trusted), so the scheduler's certificate
needs no DNS names and a port-forward to ``127.0.0.1`` works.

:func:`manifests` is pure (a spec and the Secret's files in, Kubernetes objects out);
:func:`generate` adds the authority and the record, and writes the file.

>>> spec = KubernetesSpec("team", image="ghcr.io/acme/train:1", namespace="ml")
>>> spec.address
'tls://team-scheduler.ml.svc:8786'
>>> [f"{o['kind']}/{o['metadata']['name']}" for o in manifests(spec)]
['PersistentVolumeClaim/team-data', 'Deployment/team-scheduler', 'Service/team-scheduler', 'Service/team-workers', 'StatefulSet/team-worker']
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import shlex
import shutil
import time
from typing import Any

import yaml

from .. import config
from ..errors import SpecError
from .record import Paths, Record, RecordError, check_name, read_json, write_json

__all__ = ["Generated", "KubernetesSpec", "flags", "generate", "manifests", "render"]

PORT = 8786
TLS = "/etc/clustersdk/tls"  # the role's files, copied there (writable: revocation lists)
SECRET = "/etc/clustersdk/secret"  # the Secret's files, read-only
STATE = "/var/lib/clustersdk"
CHECKPOINTS = "/checkpoints"
UID = 1000
RENDEZVOUS_PORTS = "29400-29499"  # rank 0's store listens in this range (for NetworkPolicies)
SECRET_FILES = ("ca.pem", "crl.pem", "scheduler.pem", "worker.pem")
PYTHON = "python"
_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # an RFC 1035 label: a Service's name
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # an RFC 1123 label
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # an RFC 1123 subdomain
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE])?$")
# the init container, as `cp FILE... DIRECTORY`: the role's files from the read-only
# Secret to the writable emptyDir (an image need not have a shell)
_COPY = "import shutil, sys; [shutil.copy(f, sys.argv[-1]) for f in sys.argv[1:-1]]"


class _Dumper(yaml.SafeDumper):
    """YAML as a person writes it: a list of plain values on one line, no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(isinstance(v, (str, int)) and "\n" not in str(v) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _list)


def _option(flag: str, help: str, **argparse: Any) -> dict[str, Any]:
    """A spec field's command-line flag (the CLI's arguments and the header's command
    are both made from these)."""
    return {"flag": flag, "help": help, "argparse": argparse}


@dataclasses.dataclass(frozen=True)
class KubernetesSpec:
    """What ``clustersdk cluster kubernetes`` makes: the cluster ``name`` (its objects'
    prefix), the ``image`` (with clustersdk and torch installed) every container runs,
    the ``namespace``, how many ``workers`` and GPUs per worker (0: CPU workers), and
    the volume's ``storage`` size and ``storage_class``.

    >>> KubernetesSpec("team_a", image="x")
    Traceback (most recent call last):
    ...
    clustersdk.errors.SpecError: on Kubernetes a cluster's name must be a DNS label ...
    """

    name: str
    image: str = dataclasses.field(
        metadata=_option("--image", "the image every container runs (clustersdk installed)")
    )
    namespace: str = dataclasses.field(
        default="default",
        metadata=_option("--namespace", "the namespace (default: default)", metavar="NS"),
    )
    workers: int = dataclasses.field(
        default=2, metadata=_option("--workers", "how many worker pods (2)", type=int, metavar="N")
    )
    gpus_per_worker: int = dataclasses.field(
        default=1,
        metadata=_option(
            "--gpus-per-worker",
            "nvidia.com/gpu of each worker (1; 0: CPU workers)",
            type=int,
            metavar="N",
        ),
    )
    storage_class: str | None = dataclasses.field(
        default=None,
        metadata=_option(
            "--storage-class",
            "the volume's StorageClass, one that offers ReadWriteMany (default: the "
            "cluster's default class)",
            metavar="SC",
        ),
    )
    storage: str = dataclasses.field(
        default="100Gi",
        metadata=_option(
            "--storage", "the volume's size: journal and checkpoints (100Gi)", metavar="SIZE"
        ),
    )

    def __post_init__(self) -> None:
        try:
            check_name(self.name)
        except RecordError as e:
            raise SpecError(str(e)) from None
        if not _LABEL.match(self.name):
            raise SpecError(
                f"on Kubernetes a cluster's name must be a DNS label (lower-case letters, "
                f"digits and '-', starting with a letter), got {self.name!r}"
            )
        if not _NAMESPACE.match(self.namespace) or len(self.namespace) > 63:
            raise SpecError(f"namespace must be a DNS label, got {self.namespace!r}")
        if not self.image or any(c.isspace() for c in self.image):
            raise SpecError(f"image must be an image reference, got {self.image!r}")
        for field in ("workers", "gpus_per_worker"):
            value = getattr(self, field)
            least = 1 if field == "workers" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise SpecError(f"{field} must be an integer >= {least}, got {value!r}")
        if not _QUANTITY.match(self.storage):
            raise SpecError(
                f"storage must be a Kubernetes quantity such as 100Gi, got {self.storage!r}"
            )
        if self.storage_class is not None and not _SUBDOMAIN.match(self.storage_class):
            raise SpecError(
                f"storage_class must be a StorageClass's name, got {self.storage_class!r}"
            )

    @property
    def scheduler(self) -> str:
        """The scheduler's Deployment and Service."""
        return f"{self.name}-scheduler"

    @property
    def address(self) -> str:
        """The scheduler's address inside the Kubernetes cluster."""
        return f"tls://{self.scheduler}.{self.namespace}.svc:{PORT}"

    def command(self, secret: bool = True) -> str:
        """The ``clustersdk cluster kubernetes`` command that writes these manifests."""
        words = ["clustersdk", "cluster", "kubernetes", self.name]
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.metadata and (field.default is dataclasses.MISSING or value != field.default):
                words += [field.metadata["flag"], str(value)]
        return shlex.join(words + ([] if secret else ["--no-secret"]))

    def options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata}


def flags() -> list[tuple[str, str, dict[str, Any]]]:
    """``(field, flag, argparse keywords)`` of each of the spec's options: its help, its
    type, and its default (or ``required``)."""
    out = []
    for f in dataclasses.fields(KubernetesSpec):
        if f.metadata:
            options = {"help": f.metadata["help"], **f.metadata["argparse"]}
            if f.default is dataclasses.MISSING:
                options["required"] = True
            else:
                options["default"] = f.default
            out.append((f.name, f.metadata["flag"], options))
    return out


# --- the objects (pure) --------------------------------------------------------------------
def manifests(spec: KubernetesSpec, secret: dict[str, bytes] | None = None) -> list[dict[str, Any]]:
    """The cluster's Kubernetes objects, in the order ``kubectl apply`` makes them;
    ``secret``: the TLS files (``SECRET_FILES``) for the Secret (None: no Secret)."""
    objects = []
    if secret is not None:
        if set(secret) != set(SECRET_FILES):
            raise SpecError(
                f"the Secret holds exactly {', '.join(SECRET_FILES)}; got {sorted(secret)}"
            )
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": _metadata(spec, f"{spec.name}-tls", None),
                "type": "Opaque",
                "data": {f: base64.b64encode(secret[f]).decode() for f in SECRET_FILES},
            }
        )
    claim: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": spec.storage}},
    }
    if spec.storage_class:
        claim["storageClassName"] = spec.storage_class
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": _metadata(spec, f"{spec.name}-data", None),
            "spec": claim,
        }
    )
    objects += [_scheduler(spec), _service(spec), _workers_service(spec), _workers(spec)]
    return objects


def _labels(spec: KubernetesSpec, component: str | None) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": "clustersdk", "app.kubernetes.io/instance": spec.name}
    if component:
        labels["app.kubernetes.io/component"] = component
    return labels


def _metadata(spec: KubernetesSpec, name: str, component: str | None) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": _labels(spec, component)}


def _selector(spec: KubernetesSpec, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
    }


def _probe(role: str, address: str, period: int) -> dict[str, Any]:
    command = [PYTHON, "-m", "clustersdk.standing.probe", role, address, "--tls", TLS]
    return {
        "exec": {"command": command},
        "periodSeconds": period,
        "timeoutSeconds": 10,
    }


def _locked_down() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _pod(
    spec: KubernetesSpec, role: str, container: dict[str, Any], volumes: list[dict[str, Any]]
) -> dict[str, Any]:
    """A pod of ``role`` running ``container``, with the role's TLS files."""
    files = ["ca.pem", "crl.pem", f"{role}.pem"]
    copy = {
        "name": "tls",
        "image": spec.image,
        "command": [PYTHON, "-c", _COPY, *(f"{SECRET}/{f}" for f in files), TLS],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": _locked_down(),
        "volumeMounts": [
            {"name": "secret", "mountPath": SECRET, "readOnly": True},
            {"name": "tls", "mountPath": TLS},
        ],
    }
    container["securityContext"] = _locked_down()
    container["volumeMounts"] = [{"name": "tls", "mountPath": TLS}, *container["volumeMounts"]]
    return {
        "metadata": {"labels": _labels(spec, role)},
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,  # no *_SERVICE_HOST variables (DASK_* ones included)
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": UID,
                "runAsGroup": UID,
                "fsGroup": UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "terminationGracePeriodSeconds": 60,
            "initContainers": [copy],
            "containers": [container],
            "volumes": [
                {
                    "name": "secret",
                    "secret": {
                        "secretName": f"{spec.name}-tls",
                        "defaultMode": 0o440,
                        "items": [{"key": f, "path": f} for f in files],
                    },
                },
                {"name": "tls", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                *volumes,
            ],
        },
    }


def _data(sub_path: str, mount: str) -> dict[str, Any]:
    return {"name": "data", "mountPath": mount, "subPath": sub_path}


def _scheduler(spec: KubernetesSpec) -> dict[str, Any]:
    command = [PYTHON, "-m", "clustersdk.standing.serve", "scheduler", "--tls", TLS]
    command += ["--state", STATE, "--host", "0.0.0.0", "--port", str(PORT)]
    here = f"tls://127.0.0.1:{PORT}"
    container = {
        "name": "scheduler",
        "image": spec.image,
        "command": command,
        "ports": [{"name": "comm", "containerPort": PORT}],
        "readinessProbe": {**_probe("scheduler", here, 15), "initialDelaySeconds": 5},
        "livenessProbe": {
            **_probe("scheduler", here, 30),
            "initialDelaySeconds": 30,
            "failureThreshold": 4,
        },
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "volumeMounts": [_data("state", STATE)],
    }
    claim = {"persistentVolumeClaim": {"claimName": f"{spec.name}-data"}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(spec, spec.scheduler, "scheduler"),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two schedulers on one journal
            "selector": {"matchLabels": _selector(spec, "scheduler")},
            "template": _pod(spec, "scheduler", container, [{"name": "data", **claim}]),
        },
    }


def _service(spec: KubernetesSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, spec.scheduler, "scheduler"),
        "spec": {
            "selector": _selector(spec, "scheduler"),
            "ports": [{"name": "comm", "port": PORT, "targetPort": "comm"}],
        },
    }


def _workers_service(spec: KubernetesSpec) -> dict[str, Any]:
    """The StatefulSet's governing Service: headless, its pods' DNS names (Kubernetes
    before 1.33 requires one)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, f"{spec.name}-workers", "worker"),
        "spec": {
            "clusterIP": "None",
            "selector": _selector(spec, "worker"),
            "publishNotReadyAddresses": True,
        },
    }


def _workers(spec: KubernetesSpec) -> dict[str, Any]:
    command = [PYTHON, "-m", "clustersdk.standing.serve", "worker", spec.address, "--tls", TLS]
    command += ["--name", "$(POD_NAME)"]
    limits: dict[str, Any] = {"memory": "32Gi"}
    if spec.gpus_per_worker:
        command += ["--gpu", ",".join(str(i) for i in range(spec.gpus_per_worker))]
        limits["nvidia.com/gpu"] = spec.gpus_per_worker
    container = {
        "name": "worker",
        "image": spec.image,
        "command": command,
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "DASK_CLUSTERSDK__RENDEZVOUS_PORTS", "value": RENDEZVOUS_PORTS},
        ],
        "readinessProbe": {
            **_probe("worker", spec.address, 30),
            "initialDelaySeconds": 10,
        },
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": limits},
        # NCCL needs more shared memory than a container's 64 MiB
        "volumeMounts": [
            _data("checkpoints", CHECKPOINTS),
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    volumes = [
        {"name": "data", "persistentVolumeClaim": {"claimName": f"{spec.name}-data"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
    ]
    pod = _pod(spec, "worker", container, volumes)
    if spec.gpus_per_worker:
        pod["spec"]["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(spec, f"{spec.name}-worker", "worker"),
        "spec": {
            "replicas": spec.workers,
            "podManagementPolicy": "Parallel",  # every worker at once, not one by one
            "serviceName": f"{spec.name}-workers",
            "selector": {"matchLabels": _selector(spec, "worker")},
            "template": pod,
        },
    }


def render(spec: KubernetesSpec, secret: dict[str, bytes] | None = None) -> str:
    """The manifests as one YAML file, under a header saying how it was made and how
    to use it."""
    left_out = [
        "#",
        f"# Its Secret {spec.name}-tls (the cluster's certificates: keep it out of a repository)",
        "# is not in this file, and its pods wait for it: the command without --no-secret",
        "# writes it with the rest (and makes the certificate authority).",
    ]
    header = [
        f"# clustersdk standing cluster {spec.name!r} on Kubernetes, written by",
        f"#   {spec.command(secret is not None)}",
        "# Run again (with other options too), it keeps the cluster's certificate authority,",
        "# in the state directory of the account that ran it with the admin's credentials.",
        *(left_out if secret is None else []),
        "#",
        *(
            [f"#   kubectl create namespace {spec.namespace}"]
            if spec.namespace != "default"
            else []
        ),
        "#   kubectl apply -f THIS_FILE",
        f"#   kubectl -n {spec.namespace} port-forward svc/{spec.scheduler} {PORT}:{PORT}",
        f'#   cs.Cluster.connect("tls://127.0.0.1:{PORT}", credentials=ADMIN_CREDENTIALS)',
        "#",
        f'# Jobs checkpoint under {CHECKPOINTS} (checkpoint_dir="{CHECKPOINTS}/RUN"), on the',
        f"# ReadWriteMany volume {spec.name}-data that every worker mounts.",
    ]
    documents = [
        yaml.dump(o, Dumper=_Dumper, sort_keys=False, width=100) for o in manifests(spec, secret)
    ]
    return "\n".join(header) + "\n---\n" + "---\n".join(documents)


# --- making them --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Generated:
    """What :func:`generate` made: the YAML ``text``, where it went (``out``), and the
    admin's ``credentials`` file (None when the Secret was left out)."""

    spec: KubernetesSpec
    text: str
    out: str | None
    credentials: str | None


def generate(
    spec: KubernetesSpec,
    *,
    secret: bool = True,
    out: str | None = None,
    state_dir: str | None = None,
) -> Generated:
    """The manifests of ``spec``, written to ``out`` (0600 with the Secret) when given.
    With ``secret``, the cluster's certificate authority is made under the state
    directory, or reused if this account made it before (a record of another kind of
    the same name is refused), and the Secret holds its files; without, nothing is
    made or written but ``out``."""
    credentials, files = _authority(spec, state_dir) if secret else (None, None)
    text = render(spec, files)
    if out is not None:
        from ..security.pki import private

        out = os.path.abspath(out)
        if files is not None:
            private(out, text)  # the Secret holds the processes' private keys
        else:
            with open(out, "w") as f:
                f.write(text)
    return Generated(spec, text, out, credentials)


def _authority(spec: KubernetesSpec, state_dir: str | None) -> tuple[str, dict[str, bytes]]:
    """The admin's credentials file and the Secret's files, from the cluster's authority
    (made now, or found); the record written."""
    from ..security.pki import Authority
    from ..security.tls import creator_name
    from ..version import __version__
    from . import DAYS

    paths = Paths(config.state_dir(state_dir), spec.name)
    found = read_json(paths.record)
    created = time.time()
    if found is not None:
        record = Record.from_dict(found)
        if record.kind != "kubernetes":
            raise SpecError(
                f"a standing cluster named {spec.name!r} ({record.kind}) exists here; "
                "give the one on Kubernetes another name"
            )
        if not os.path.isfile(os.path.join(paths.tls, "ca-key.pem")):
            raise SpecError(
                f"cluster {spec.name!r} has a record here but no certificate authority in "
                f"{paths.tls} (taken down with --keep-state?): remove {paths.root} to make a new one"
            )
        authority, created = Authority(paths.tls), record.created
        credentials = record.credentials
    else:
        if os.path.exists(paths.root):
            raise SpecError(
                f"{paths.root} exists but holds no cluster's record (a start that failed?): "
                "remove it, or choose another name"
            )
        os.makedirs(os.path.dirname(paths.root), mode=0o700, exist_ok=True)
        os.mkdir(paths.root, 0o700)
        try:
            admin = creator_name()
            authority = Authority.create(paths.tls, admin=admin, days=DAYS, cluster=spec.name)
            credentials = authority.credentials_file(admin)
        except BaseException:
            shutil.rmtree(paths.root, ignore_errors=True)
            raise
    record = Record(
        name=spec.name,
        kind="kubernetes",
        address=spec.address,
        port=PORT,
        scheduler_host=f"{spec.scheduler}.{spec.namespace}.svc",
        hosts={},
        credentials=credentials,
        created=created,
        options=spec.options(),
        version=__version__,
    )
    write_json(paths.record, record.as_dict())
    files = {}
    for name in SECRET_FILES:
        with open(os.path.join(authority.directory, name), "rb") as f:
            files[name] = f.read()
    return credentials, files
