"""A rank's GPU samples, read through a stand-in for NVML (these machines have no GPU)."""

from __future__ import annotations

import sys
import types

import pytest

from clustersdk.runtime import telemetry

MIB = 1 << 20
TOTAL, RESERVED, ALLOCATED = 143_771 * MIB, 580 * MIB, 8_000 * MIB


def fake_nvml(has_v2: bool) -> types.ModuleType:
    """NVML as nvidia-ml-py exposes it, for one GPU with ``ALLOCATED`` bytes in use and the
    driver's ``RESERVED``: the first ``nvmlDeviceGetMemoryInfo`` counts the reservation as
    used (it is ``total - free``), the second (``version=nvmlMemory_v2``) does not, as
    nvidia-smi does not. ``has_v2=False``: a driver without the second one."""
    nv = types.ModuleType("pynvml")
    nv.nvmlMemory_v2 = 0x2000028
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetHandleByIndex = lambda index: ("gpu", index)
    nv.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=87, memory=40)

    def memory(handle: object, version: int | None = None) -> types.SimpleNamespace:
        free = TOTAL - RESERVED - ALLOCATED
        if not version:
            return types.SimpleNamespace(total=TOTAL, free=free, used=TOTAL - free)
        if not has_v2:
            raise RuntimeError("NVMLError_FunctionNotFound")
        return types.SimpleNamespace(total=TOTAL, free=free, reserved=RESERVED, used=ALLOCATED)

    nv.nvmlDeviceGetMemoryInfo = memory
    return nv


@pytest.mark.parametrize(
    "has_v2, used", [(True, ALLOCATED), (False, ALLOCATED + RESERVED)], ids=["v2", "v1-only driver"]
)
def test_gpu_memory_is_what_nvidia_smi_shows_where_nvml_can_tell(monkeypatch, has_v2, used):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(has_v2))
    sampler = telemetry.Sampler("cuda", 0)
    sample = sampler.sample()
    assert sampler.source == "nvml"
    assert sample["gpu_util"] == 87.0 and sample["gpu_mem_total"] == TOTAL
    assert sample["gpu_mem_used"] == used  # without the driver's reservation, where NVML has v2
