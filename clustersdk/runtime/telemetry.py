"""System samples for a rank: its GPU through NVML, or CPU, memory and network.

NVML comes from the nvidia-ml-py package (``import pynvml``). Without a GPU,
``nvmlInit`` raises ``NVMLError_LibraryNotFound`` and samples come from psutil
instead, labelled ``source="psutil"`` so that no chart passes CPU numbers off
as GPU numbers.

GPU memory is read as ``nvidia-smi`` shows it: ``nvmlDeviceGetMemoryInfo_v2``,
whose ``used`` leaves out what the driver reserves (the first version counts it,
several hundred MiB more on every GPU); the first version where the driver or
nvidia-ml-py has no second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class Sampler:
    """Samples the device a rank uses (``index`` is the physical GPU, or -1 for CPU)."""

    def __init__(self, kind: str, index: int):
        self._nvml = None
        self._handle = None
        if kind == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(max(index, 0))
                self._memory = memory_reader(pynvml, self._handle)
                self._nvml = pynvml
            except Exception:  # no NVML library, no package, or no such device
                self._nvml = None
        self._net = None
        self._net_time = 0.0

    @property
    def source(self) -> str:
        return "nvml" if self._nvml is not None else "psutil"

    def sample(self) -> dict[str, Any]:
        return self._gpu() if self._nvml is not None else self._host()

    def _gpu(self) -> dict[str, Any]:
        nv, h = self._nvml, self._handle
        util = nv.nvmlDeviceGetUtilizationRates(h)
        mem = self._memory()
        out: dict[str, Any] = {
            "source": "nvml",
            "gpu_util": float(util.gpu),
            "gpu_mem_used": float(mem.used),
            "gpu_mem_total": float(mem.total),
        }
        for key, read in (
            ("gpu_temp", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            ("gpu_power", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
        ):
            try:  # not every board reports these
                out[key] = float(read())
            except Exception:
                pass
        return out

    def _host(self) -> dict[str, Any]:
        import psutil

        vm = psutil.virtual_memory()
        proc = psutil.Process()
        out: dict[str, Any] = {
            "source": "psutil",
            "cpu_percent": float(psutil.cpu_percent(interval=None)),
            "mem_used": float(vm.total - vm.available),
            "mem_total": float(vm.total),
            "rss": float(proc.memory_info().rss),
        }
        net, now = psutil.net_io_counters(), time.monotonic()
        if self._net is not None and now > self._net_time:
            dt = now - self._net_time
            out["net_sent_per_s"] = (net.bytes_sent - self._net.bytes_sent) / dt
            out["net_recv_per_s"] = (net.bytes_recv - self._net.bytes_recv) / dt
        self._net, self._net_time = net, now
        return out


def memory_reader(nv: Any, handle: Any) -> Callable[[], Any]:
    """How to read the device's memory: NVML's second version if it answers here, else
    the first (see the module docstring)."""
    version = getattr(nv, "nvmlMemory_v2", None)
    if version is not None:
        try:
            nv.nvmlDeviceGetMemoryInfo(handle, version=version)
        except Exception:  # an older driver (NVMLError_FunctionNotFound) or binding
            pass
        else:
            return lambda: nv.nvmlDeviceGetMemoryInfo(handle, version=version)
    return lambda: nv.nvmlDeviceGetMemoryInfo(handle)
