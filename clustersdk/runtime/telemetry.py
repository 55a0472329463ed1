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

import logging
import time
from collections.abc import Callable
from typing import Any

from .. import config

logger = logging.getLogger(__name__)


class Sampler:
    """Samples the device a rank uses (``index`` is the physical GPU, or -1 for CPU); the
    host's figures with the memory of process ``pid`` (the rank's, once it runs)."""

    def __init__(self, kind: str, index: int, pid: int | None = None):
        self.pid = pid
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
        out: dict[str, Any] = {
            "source": "psutil",
            "cpu_percent": float(psutil.cpu_percent(interval=None)),
            "mem_used": float(vm.total - vm.available),
            "mem_total": float(vm.total),
        }
        try:
            out["rss"] = float(psutil.Process(self.pid).memory_info().rss)
        except psutil.Error:  # the rank's process just ended
            pass
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


class Pace:
    """When a rank's worker ships its next message, and its next system sample.

    A message is due every ``interval()`` seconds (the job's metrics interval, which
    the control plane stretches on a busy cluster); a sample goes with one at most
    every ``telemetry-interval`` seconds, and never more often than messages go.
    """

    def __init__(self, rank: int, interval: Callable[[], float], sampler: Sampler):
        self.rank = rank
        self.interval = interval
        self.sampler = sampler
        self.telemetry_interval = float(config.get("telemetry-interval"))
        self._last_flush = self._last_sample = 0.0

    def due(self) -> bool:
        """Whether a message is due now (it then counts as sent)."""
        now = time.monotonic()
        if now - self._last_flush >= self.interval():
            self._last_flush = now
            return True
        return False

    def sent(self) -> None:
        """A message went just now (its rank shipped rows of its own accord)."""
        self._last_flush = time.monotonic()

    def until_due(self) -> float:
        """Seconds until :meth:`due` (at most the interval; 0 or less: now)."""
        return self._last_flush + self.interval() - time.monotonic()

    def samples(self, final: bool = False) -> list[dict[str, Any]]:
        """The system sample due with this message, if any (none with a rank's last)."""
        now = time.monotonic()
        if final or now - self._last_sample < max(self.telemetry_interval, self.interval()):
            return []
        self._last_sample = now
        try:
            return [{"rank": self.rank, "time": time.time(), "sample": self.sampler.sample()}]
        except Exception:  # telemetry must never hurt the job
            logger.debug("clustersdk: telemetry sample failed", exc_info=True)
            return []
