"""How a worker's process ended, told by its nanny: what a diagnosis of a lost worker needs.

The scheduler learns that a worker left, not why. The nanny that ran it
knows: its exit code (``-9``: SIGKILL, e.g. the kernel's OOM killer; ``-15``:
SIGTERM, e.g. the nanny's own memory monitor), its memory limit, and whether
the nanny terminated it for passing ``distributed.worker.memory.terminate``
of that limit. :class:`ExitReporter`, a ``NannyPlugin``, samples the
worker's RSS while it runs and logs one event on
:data:`~clustersdk.protocol.EXIT_TOPIC` when it ends; the control plane
(:mod:`clustersdk.control.evidence`) puts it beside the lost worker.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from distributed.diagnostics.plugin import NannyPlugin
from tornado.ioloop import PeriodicCallback

from ..protocol import EXIT_TOPIC

logger = logging.getLogger(__name__)

SAMPLE_MS = 200  # how often the worker's RSS is read (the nanny's own monitor: 100 ms)


class ExitReporter(NannyPlugin):
    """Report each exit of the nanny's worker process (registered by ``Cluster``)."""

    name = "clustersdk-exits"
    idempotent = True

    def setup(self, nanny: Any) -> None:
        self.nanny = nanny
        self.pid: int | None = None
        self.rss: int | None = None
        self._original = nanny._on_worker_exit_sync
        # the next process is made with the nanny's callback, the running one holds it already
        nanny._on_worker_exit_sync = self._exited
        if nanny.process is not None:
            nanny.process.on_exit = self._exited
        self._sampler = PeriodicCallback(self._sample, SAMPLE_MS)
        self._sampler.start()

    def teardown(self, nanny: Any) -> None:
        self._sampler.stop()
        nanny._on_worker_exit_sync = self._original
        if nanny.process is not None and nanny.process.on_exit == self._exited:
            nanny.process.on_exit = self._original

    def _sample(self) -> None:
        import psutil

        process = getattr(self.nanny.process, "process", None)
        pid = getattr(process, "pid", None)
        if pid is None:
            return
        try:
            rss = psutil.Process(pid).memory_info().rss
        except (psutil.Error, OSError):
            return
        if pid != self.pid:
            self.pid, self.rss = pid, None
        self.rss = rss

    def _exited(self, exitcode: int) -> None:
        try:
            self.nanny.log_event(EXIT_TOPIC, self.report(exitcode))
        except Exception:  # never in the way of the nanny's own handling
            logger.debug("clustersdk: could not report a worker's exit", exc_info=True)
        self._original(exitcode)

    def report(self, exitcode: int) -> dict[str, Any]:
        nanny = self.nanny
        memory = getattr(nanny, "memory_manager", None)
        killed_pid = getattr(memory, "_last_terminated_pid", None)
        return {
            "worker": nanny.worker_address,
            "pid": self.pid,
            "exitcode": exitcode,
            "memory_limit": getattr(memory, "memory_limit", None),
            "rss": self.rss,
            "terminate_fraction": getattr(memory, "memory_terminate_fraction", None) or None,
            "terminated_for_memory": killed_pid is not None and killed_pid == self.pid,
            "time": time.time(),
        }
