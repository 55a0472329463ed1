"""A Dask worker preload for ``gpu_check.py``'s duplicate-GPU section: this worker's
GPU reports no UUID.

clustersdk never puts two ranks of a gang on one physical GPU: slots that report
the same UUID count as one device. To reach NCCL's own "Duplicate GPU" error
through a job, one of the hand-started workers on GPU 0 must look like a distinct
device, as it would to a torch that cannot read device UUIDs. Only that worker
loads this (``dask worker --preload benchmarks/_gpu_hide_uuid.py``).
"""

from __future__ import annotations

from typing import Any

import torch

# Dask may import a preload twice (as a file it copied, and by name): patch once, and
# always wrap the original (wrapping the wrapper recursed for ever on the first GPU run)
_properties = getattr(
    torch.cuda.get_device_properties, "original", torch.cuda.get_device_properties
)


class _WithoutUUID:
    """The device's properties, less ``uuid``."""

    def __init__(self, properties: Any):
        self._properties = properties

    def __getattr__(self, name: str) -> Any:
        if name == "uuid":
            raise AttributeError(name)
        return getattr(self._properties, name)


def _without_uuid(device: Any = None) -> Any:
    return _WithoutUUID(_properties(device))


_without_uuid.original = _properties  # type: ignore[attr-defined]
torch.cuda.get_device_properties = _without_uuid
