"""clustersdk: train PyTorch models on Dask-managed GPU workers from a notebook.

>>> import clustersdk as cs
>>> cluster = cs.Cluster.local(workers=2)            # doctest: +SKIP
>>> job = cluster.launch(train, world_size=2)        # doctest: +SKIP
"""

from __future__ import annotations

from . import config  # noqa: F401  (registers the clustersdk.* defaults)
from .cluster import Cluster
from .errors import (
    CapacityError,
    CheckpointError,
    ClusterSDKError,
    HostKeyError,
    InvalidTransitionError,
    JobFailedError,
    JobNotFoundError,
    JobStoppedError,
    JobTimeoutError,
    PluginMissingError,
    SpecError,
    StartError,
)
from .job import Job
from .runtime.context import TrainContext
from .runtime.training import warmup_cosine
from .spec import STRATEGIES, JobSpec
from .status import JobStatus

__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 - IPython's own type
    """``%load_ext clustersdk``: the %cluster, %%distributed, %jobs and %job magics."""
    from .magics import load_ipython_extension as load

    load(ipython)

__all__ = [
    "STRATEGIES",
    "CapacityError",
    "CheckpointError",
    "Cluster",
    "ClusterSDKError",
    "HostKeyError",
    "InvalidTransitionError",
    "Job",
    "JobFailedError",
    "JobNotFoundError",
    "JobSpec",
    "JobStatus",
    "JobStoppedError",
    "JobTimeoutError",
    "PluginMissingError",
    "SpecError",
    "StartError",
    "TrainContext",
    "warmup_cosine",
]
