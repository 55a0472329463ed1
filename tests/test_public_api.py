"""The public surface is exactly this list; changing it is a deliberate act."""

from __future__ import annotations

import clustersdk

PUBLIC = [
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


def test_all_is_pinned():
    assert clustersdk.__all__ == PUBLIC


def test_all_is_sorted_constants_first():
    # isort style (ruff RUF022): SCREAMING_CASE names, then the rest, each alphabetical
    assert PUBLIC == sorted(PUBLIC, key=lambda name: (not name.isupper(), name))


def test_every_exported_name_exists():
    assert all(hasattr(clustersdk, name) for name in clustersdk.__all__)
