"""What the control plane gathers to diagnose a job: the Dask side of :mod:`.anomalies`.

- **Lost workers.** Dask's ``remove_worker`` says only that a worker left. Each
  nanny says how its worker's process ended (:mod:`clustersdk.runtime.exits`:
  exit code, memory limit, last RSS, whether the nanny itself terminated it
  for memory) on the topic :data:`~clustersdk.protocol.EXIT_TOPIC`, and Dask's
  nanny reports a memory kill on ``worker-restart-memory``. Either may come
  before or after ``remove_worker``: the lost worker's event waits for its
  report at most ``clustersdk.diagnosis.exit-report-wait`` seconds (far
  less than ``failure-grace``, so a restart is still recognised as one).
- **Failures.** A rank's error record gets where every rank was (the hang
  watchdog's beacons: step and phase), for a collective timeout's diagnosis.
- **Rows.** With ``on_nan="report"`` the ranks check nothing: the first row
  with a NaN or Inf loss in a batch is found here. The mean ``loss`` of each
  step over the ranks (:class:`~clustersdk.signals.StepMeans`) goes through a
  :class:`~clustersdk.signals.SpikeDetector`.
- **Diagnosed** (the action): the newest diagnosis in the job's record, a
  durable event of kind ``diagnosis``, a line in the job's log and in the
  scheduler's, a message to the dashboards.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from .. import config
from ..protocol import EXIT_TOPIC, RankEvent
from ..signals import SpikeDetector, StepMeans, first_nonfinite
from . import events as ev
from .plane import Plane, Run

logger = logging.getLogger(__name__)

MEMORY_TOPIC = "worker-restart-memory"  # Dask's nanny: it terminates a worker over its limit
KEEP_REPORTS = 1000  # reports kept for workers not (yet) known as lost
FRESH = 60.0  # seconds a report stays a worker's


class Evidence:
    """The facts one control plane keeps for diagnoses."""

    def __init__(self, plane: Plane):
        self.plane = plane
        self.wait = float(config.get("diagnosis.exit-report-wait", 1.0))
        self.exits: dict[str, dict[str, Any]] = {}  # worker -> its nanny's report
        self.memory_kills: dict[str, dict[str, Any]] = {}  # worker -> Dask's memory kill
        self.pending: dict[str, tuple[Run, ev.WorkerLost]] = {}  # lost, waiting for a report
        self.closed = False

    # --- lost workers -------------------------------------------------------------------
    def lost(self, run: Run, event: ev.WorkerLost) -> None:
        """Feed ``event`` once the worker's nanny said how it ended (or the wait is over)."""
        if self._report(event.worker, self.exits) is not None or self.wait <= 0:
            self._feed_lost(run, event)
            return
        self.pending[event.worker] = (run, event)
        self.plane.call_later(self.wait, self._expire, event.worker)

    def heard(self, name: str, msg: Any) -> None:
        """An event logged on the scheduler (every topic passes here: return fast)."""
        if name != EXIT_TOPIC and name != MEMORY_TOPIC:
            return
        if not isinstance(msg, dict) or not msg.get("worker"):
            return
        kept = self.exits if name == EXIT_TOPIC else self.memory_kills
        if len(kept) >= KEEP_REPORTS:
            kept.pop(next(iter(kept)))
        kept[msg["worker"]] = {**msg, "heard": time.time()}
        if name == EXIT_TOPIC and msg["worker"] in self.pending:
            self._feed_lost(*self.pending.pop(msg["worker"]))

    def _expire(self, worker: str) -> None:
        item = self.pending.pop(worker, None)
        if item is not None:
            self._feed_lost(*item)

    def _feed_lost(self, run: Run, event: ev.WorkerLost) -> None:
        if self.closed or run.id not in self.plane.runs:
            return  # the plane is closing, or the job is over: nothing to tell
        self.plane.feed(run, dataclasses.replace(event, facts=self.facts(event.worker, event.host)))

    def facts(self, worker: str, host: str) -> dict[str, Any]:
        """How ``worker``'s process ended, as far as its nanny and Dask said."""
        out: dict[str, Any] = {"worker": worker, "host": host}
        report = self._report(worker, self.exits, pop=True) or {}
        for key in ("exitcode", "memory_limit", "rss", "terminate_fraction"):
            if report.get(key) is not None:
                out[key] = report[key]
        if report.get("terminated_for_memory"):
            out["terminated_for_memory"] = True
        kill = self._report(worker, self.memory_kills, pop=True)
        if kill is not None:  # Dask's own figure: the RSS it saw when it pulled the trigger
            out["terminated_for_memory"] = True
            if kill.get("rss") is not None:
                out["rss"] = kill["rss"]
        return out

    @staticmethod
    def _report(
        worker: str, kept: dict[str, dict[str, Any]], pop: bool = False
    ) -> dict[str, Any] | None:
        report = kept.pop(worker, None) if pop else kept.get(worker)
        if report is None or time.time() - report["heard"] > FRESH:
            return None
        return report

    # --- what ranks send --------------------------------------------------------------------
    def annotate(self, run: Run, kind: RankEvent, data: dict[str, Any]) -> None:
        """A rank's failure: add where every rank was (its step and phase) to its record."""
        error = data.get("error")
        if kind is not RankEvent.FAILED or not isinstance(error, dict):
            return
        where = {
            str(rank): {"step": b.step, "phase": b.phase}
            for rank, b in sorted(run.watch.beacons.items())
        }
        if where:
            error["facts"] = {**(error.get("facts") or {}), "where": where}

    def rows(self, run: Run, rows: list[dict[str, Any]]) -> None:
        """Look for a non-finite loss (``on_nan="report"``) and for loss spikes."""
        machine = run.machine
        attempt = machine.attempt
        if machine.spec.on_nan == "report":
            found = first_nonfinite(rows)
            if found is not None:
                rank, step, values = found
                self.plane.feed(run, ev.NonFinite(rank, attempt, step, values))
        if run.losses is None:
            run.losses, run.detector = StepMeans(machine.world_size), _detector()
        for row in rows:
            loss = row["scalars"].get("loss")
            if not isinstance(loss, (int, float)) or isinstance(loss, bool):
                continue
            for step in run.losses.add(int(row["rank"]), int(row["step"]), float(loss)):
                spike = run.detector.add(step.step, step.mean)
                if spike is not None:
                    self.plane.feed(
                        run,
                        ev.LossSpike(
                            step.worst,
                            attempt,
                            spike.step,
                            step.worst_value,
                            spike.median,
                            spike.mad,
                            spike.score,
                            run.detector.window,
                            spike.value,
                            step.ranks,
                            spike.scale,
                        ),
                    )

    # --- the Diagnosed action -----------------------------------------------------------------
    def diagnosed(self, run: Run, action: ev.Diagnosed) -> None:
        d = action.diagnosis
        now = time.time()
        line = f"clustersdk diagnosis: {d['summary']} — {d['advice']}"
        logger.warning("clustersdk: job %s: %s", run.machine.name, line)
        journal = self.plane.journal
        journal.update(run.id, diagnosis=d)
        step = d.get("step") if d.get("step") is not None else run.step
        journal.add_event(
            run.id, d.get("time") or now, step, "diagnosis", d["summary"], {"diagnosis": d}
        )
        rank = d["rank"] if d.get("rank") is not None else 0
        journal.add_logs(run.id, [(rank, now, "log", line)])
        publish = self.plane.publish
        publish(run.id, {"kind": "diagnosis", "diagnosis": d})
        publish(
            run.id,
            {
                "kind": "metrics",
                "rank": rank,
                "attempt": run.machine.attempt,
                "sent": now,
                "event": "diagnosis",
                "rows": [],
                "logs": [(rank, now, "log", line)],
                "system": [],
                "phases": [],
            },
        )


def _detector() -> SpikeDetector:
    get = config.get
    return SpikeDetector(
        window=int(get("diagnosis.spike-window")),
        min_steps=int(get("diagnosis.spike-min-steps")),
        threshold=float(get("diagnosis.spike-threshold")),
        ratio=float(get("diagnosis.spike-ratio")),
        reach=float(get("diagnosis.spike-reach")),
        memory=int(get("diagnosis.spike-memory")),
    )
