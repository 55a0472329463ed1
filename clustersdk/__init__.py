"""clustersdk: train PyTorch models on Dask-managed GPU workers from a notebook.

>>> import clustersdk as cs
>>> cluster = cs.Cluster.local(workers=2)            # doctest: +SKIP
>>> job = cluster.launch(train, world_size=2)        # doctest: +SKIP

Importing the package is cheap: each public name loads its module (Dask,
torch...) on first use, so the pure parts (``clustersdk.protocol``,
``clustersdk.control.policy``...) and the server extension never pay for them.

This face also wires the presentation (dashboards, the console, the queue's
tables) and the doctor into the client API's hooks (:mod:`clustersdk.hooks`):
``Cluster`` and ``Job`` never import the tiers above them. Each provider imports
its module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import hooks
from .version import __version__ as __version__  # re-exported

# public name -> the module that defines it
_EXPORTS = {
    "STRATEGIES": "options",
    "AccessDeniedError": "errors",
    "CapacityError": "errors",
    "CheckpointError": "errors",
    "Cluster": "cluster.base",
    "ClusterClosedError": "errors",
    "ClusterSDKError": "errors",
    "Diagnosis": "diagnosis",
    "HostKeyError": "errors",
    "InsecureClusterWarning": "security.tls",
    "InvalidTransitionError": "errors",
    "Job": "job",
    "JobFailedError": "errors",
    "JobNotFoundError": "errors",
    "JobSpec": "spec",
    "JobStatus": "status",
    "JobStoppedError": "errors",
    "JobTimeoutError": "errors",
    "PluginMissingError": "errors",
    "ProtocolError": "errors",
    "RunError": "errors",
    "SpecError": "errors",
    "StartError": "errors",
    "TrainContext": "runtime.context",
    "warmup_cosine": "runtime.training",
}

__all__ = [
    "STRATEGIES",
    "AccessDeniedError",
    "CapacityError",
    "CheckpointError",
    "Cluster",
    "ClusterClosedError",
    "ClusterSDKError",
    "Diagnosis",
    "HostKeyError",
    "InsecureClusterWarning",
    "InvalidTransitionError",
    "Job",
    "JobFailedError",
    "JobNotFoundError",
    "JobSpec",
    "JobStatus",
    "JobStoppedError",
    "JobTimeoutError",
    "PluginMissingError",
    "ProtocolError",
    "RunError",
    "SpecError",
    "StartError",
    "TrainContext",
    "warmup_cosine",
]

if TYPE_CHECKING:
    from .cluster.base import Cluster
    from .diagnosis import Diagnosis
    from .errors import (
        AccessDeniedError,
        CapacityError,
        CheckpointError,
        ClusterClosedError,
        ClusterSDKError,
        HostKeyError,
        InvalidTransitionError,
        JobFailedError,
        JobNotFoundError,
        JobStoppedError,
        JobTimeoutError,
        PluginMissingError,
        ProtocolError,
        RunError,
        SpecError,
        StartError,
    )
    from .job import Job
    from .options import STRATEGIES
    from .runtime.context import TrainContext
    from .runtime.training import warmup_cosine
    from .security.tls import InsecureClusterWarning
    from .spec import JobSpec
    from .status import JobStatus


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'clustersdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 - IPython's own type
    """``%load_ext clustersdk``: the %cluster, %%distributed, %jobs and %job magics."""
    from .magics import load_ipython_extension as load

    load(ipython)


# hooks: what the client API asks of the tiers above it (see clustersdk.hooks) ---------------
def _job_display(job: Job, include: Any = None, exclude: Any = None) -> dict[str, Any]:
    from .widgets import job_mimebundle

    return job_mimebundle(job, include=include, exclude=exclude)


def _cluster_display(cluster: Cluster, include: Any = None, exclude: Any = None) -> dict[str, Any]:
    from .widgets import cluster_mimebundle

    return cluster_mimebundle(cluster, include=include, exclude=exclude)


def _job_console(job: Job, rank: int | None) -> Any:
    from .widgets.console import console

    return console(job, rank)


def _queue_text(data: dict[str, Any]) -> str:
    from .widgets.queue import queue_text

    return queue_text(data)


def _queue_html(data: dict[str, Any]) -> str:
    from .widgets.queue import queue_html

    return queue_html(data)


def _doctor(client: Any, **options: Any) -> Any:
    from .doctor import doctor

    return doctor(client, **options)


for _name, _provider in (
    ("job_display", _job_display),
    ("cluster_display", _cluster_display),
    ("job_console", _job_console),
    ("queue_text", _queue_text),
    ("queue_html", _queue_html),
    ("doctor", _doctor),
):
    hooks.provide(_name, _provider)
del _name, _provider
