"""One background thread that flushes dashboards, each at most every ``interval`` seconds.

Events reach a dashboard on Dask's event-loop thread, many per second. The
dashboard only queues them and asks the pump for a flush; the pump calls
``flush()`` on its own thread, right away if the dashboard's last flush is at
least ``interval`` old (so a quiet job's update shows at once), otherwise when
it will be. Requests in between coalesce into that one flush: the kernel gets
at most ``1 / interval`` updates per second per dashboard, however busy the job.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Protocol

logger = logging.getLogger(__name__)

# seconds: at most 10 updates per second per dashboard. Ranks ship metrics every
# 0.2 s by default; a slower pump would add most of its interval to the delay
# from ctx.log to the chart (benchmarks/telemetry.py measures it).
INTERVAL = 0.1


class Flushable(Protocol):
    def flush(self) -> None: ...


class Pump:
    """Calls ``target.flush()`` on its thread, rate-limited per target.

    >>> pump = Pump(interval=0.2)        # doctest: +SKIP
    >>> pump.request(dashboard)          # from any thread; cheap
    """

    def __init__(self, interval: float = INTERVAL):
        self.interval = interval
        self._due: dict[Flushable, float] = {}
        # weak: a dashboard nobody holds any more must not live on here
        self._last: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def request(self, target: Flushable) -> None:
        """Flush ``target`` as soon as its rate allows (no-op if already due)."""
        with self._cond:
            if target in self._due:
                return
            self._due[target] = max(time.monotonic(), self._last.get(target, 0.0) + self.interval)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="clustersdk-dashboards", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def forget(self, target: Flushable) -> None:
        """Drop ``target``'s pending flush and rate state (it is closing)."""
        with self._cond:
            self._due.pop(target, None)
            self._last.pop(target, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due:
                    self._cond.wait()
                target, due = min(self._due.items(), key=lambda item: item[1])
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue  # something earlier may have come in
                del self._due[target]
                self._last[target] = time.monotonic()
            try:
                target.flush()
            except Exception:  # a broken dashboard must not stop the others
                logger.exception("clustersdk: dashboard update failed")


_pump: Pump | None = None
_pump_lock = threading.Lock()


def pump() -> Pump:
    """The process's shared pump."""
    global _pump
    with _pump_lock:
        if _pump is None:
            _pump = Pump()
        return _pump
