"""A SIGTERM to a process that runs nannies: their workers leave first.

systemd and Kubernetes signal the process they started: a standing
cluster's ``serve worker`` (:mod:`clustersdk.standing.serve`) or ``Cluster.ssh``'s
launcher (:mod:`clustersdk.cluster.remote`), where the nannies run. Closing a nanny
ends its worker at once, and its job loses the work since its last checkpoint. So the
first SIGTERM goes on to each worker process (its agent tells the scheduler; the job
checkpoints at its next step boundary and moves; then the worker exits), each nanny is
told not to start its worker again, and ``stop`` runs once every nanny has closed after
its worker, or after ``clustersdk.notice-grace`` plus :data:`LINGER_S`. SIGINT, or a
second SIGTERM, runs ``stop`` at once.

The SSH launcher imports this without torch: Dask and the config only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

from .. import config

logger = logging.getLogger(__name__)

LINGER_S = 5.0  # past the workers' own grace: their exits reach their nannies


class NannySignals:
    """SIGTERM and SIGINT of the process that runs ``nannies`` (on its event loop).

    >>> signals = NannySignals([nanny], stop=lambda: asyncio.ensure_future(nanny.close()))
    ...                                                   # doctest: +SKIP
    """

    def __init__(self, nannies: Sequence[Any], stop: Callable[[], object]):
        self.nannies = list(nannies)
        self.stop = stop
        self._leaving: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._terminate)
        loop.add_signal_handler(signal.SIGINT, self._now)

    @property
    def leaving(self) -> bool:
        """Whether a SIGTERM came and the workers are leaving."""
        return self._leaving is not None

    def _terminate(self) -> None:
        if self._leaving is None:
            self._leaving = asyncio.ensure_future(self._leave())
        else:
            self._now()

    def _now(self) -> None:
        if self._leaving is not None:
            self._leaving.cancel()
        self.stop()

    async def _leave(self) -> None:
        wait = float(config.get("notice-grace")) + LINGER_S
        logger.warning(
            "clustersdk: SIGTERM: %d worker(s) leave first (their jobs move); closing within "
            "%.0f s (again: at once)",
            len(self.nannies),
            wait,
        )
        for nanny in self.nannies:
            pid = nanny.pid
            nanny.close_gracefully("SIGTERM: its worker leaves first")  # not started again
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(
                asyncio.gather(*(nanny.finished() for nanny in self.nannies)), wait
            )
        except asyncio.TimeoutError:
            logger.warning("clustersdk: workers still there after %.0f s: closing them", wait)
        self.stop()
