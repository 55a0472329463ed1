"""What a worker runs: the versions that must agree across the ranks of a job, and NVML.

Read once when a worker's agent starts (the control plane compares the ranks'
versions when a gang starts: :func:`clustersdk.diagnosis.version_mismatch`) and by
the doctor on every worker.
"""

from __future__ import annotations

import platform
from typing import Any


def nvml() -> Any:
    """``pynvml``, initialised; None without nvidia-ml-py or without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no nvidia-ml-py, or no driver (NVMLError_LibraryNotFound)
        return None


def driver() -> str | None:
    """The NVIDIA driver's version, when NVML answers."""
    nv = nvml()
    if nv is None:
        return None
    value = nv.nvmlSystemGetDriverVersion()
    return value.decode() if isinstance(value, bytes) else value


def versions() -> dict[str, str | None]:
    """What must agree across hosts (and with the notebook)."""
    import cloudpickle
    import dask
    import distributed
    import torch

    from ..version import __version__

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # a torch built without NCCL
            nccl = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nccl": nccl,
        "cuda_driver": driver(),
        "clustersdk": __version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "cloudpickle": cloudpickle.__version__,
    }
