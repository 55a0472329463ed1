"""What a job dashboard shows, built from the job's events: no widgets, no Dask, no I/O.

A :class:`JobView` takes the messages :meth:`Job.on_event` delivers (and the
same rows read back from the journal when a dashboard opens on a running or
finished job) and keeps, per rank, bounded series for every chart, the last
lines of output and the progress figures. The live widget and the static HTML
both read from it, so they always agree.

>>> view = JobView(name="a", world_size=1, strategy="ddp", status="RUNNING")
>>> view.apply({"kind": "metrics", "rows": [{"rank": 0, "step": 0, "time": 1.0,
...             "scalars": {"loss": 2.5}}], "logs": [], "system": []})
>>> view.scalars["loss"][0].points()
([0.0], [2.5])

A job of many ranks comes as bands over its ranks instead (``"steps"`` messages,
see :class:`clustersdk.protocol.StepsMessage`), kept in :attr:`JobView.bands`:

>>> big = JobView(name="b", world_size=1024, strategy="ddp", status="RUNNING")
>>> big.apply({"kind": "steps", "attempt": 0, "steps": [{"step": 7, "time": 1.0, "oldest": 1.0,
...            "ranks": 1024, "scalars": {"loss": [1.5, 2.0, 2.5]}}], "system": None,
...            "phases": [], "logs": []})
>>> big.bands["loss"].points()
([7.0], [1.5], [2.0], [2.5])
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from typing import Any

from ..actions import BUTTONS
from ..protocol import what_runs
from .phases import PhaseView
from .series import MAX_POINTS, Band, Cutoff, RateMeter, Series  # noqa: F401 - re-exported

MAX_LOG_LINES = 300  # per rank
GIB = float(1 << 30)

#: The system charts per telemetry source: (chart id, sample field, title, unit, scale).
SYSTEM_CHARTS: dict[str, list[tuple[str, str, str, str, float]]] = {
    "nvml": [
        ("gpu_util", "gpu_util", "GPU utilisation", "%", 1.0),
        ("gpu_mem", "gpu_mem_used", "GPU memory used", "GiB", GIB),
    ],
    "psutil": [
        ("cpu", "cpu_percent", "Host CPU (no GPU: psutil)", "%", 1.0),
        ("rss", "rss", "Rank process memory (no GPU: psutil)", "GiB", GIB),
        ("net", "net_per_s", "Host network (no GPU: psutil)", "MB/s", 1e6),
    ],
}

STATUS_COLORS = {
    "QUEUED": "#6b7280",
    "STARTING": "#2563eb",
    "RUNNING": "#16a34a",
    "PAUSED": "#d97706",
    "HUNG": "#b91c1c",
    "HELD": "#c2410c",
    "RESTARTING": "#db2777",
    "SUSPENDING": "#7c3aed",
    "SUSPENDED": "#7c3aed",
    "STOPPING": "#ea580c",
    "FINISHED": "#0f766e",
    "FAILED": "#dc2626",
    "STOPPED": "#4b5563",
}
TERMINAL = frozenset({"FINISHED", "FAILED", "STOPPED"})

#: Which controls make sense in which state (the rest are greyed out).
ACTIONS: dict[str, frozenset[str]] = BUTTONS


class JobView:
    """Everything a job's dashboard draws; fed by :meth:`apply` and the ``load_*`` methods.

    ``dirty`` names what changed since :meth:`take_dirty` was last called:
    ``"status"``, ``"progress"``, ``"scalars"``, ``"rate"``, ``"system"``,
    ``"logs"``, ``"phases"``, ``"error"``, ``"diagnosis"`` or ``"updates"``
    (``job.update``'s changes, drawn at their step on the loss chart).
    """

    def __init__(
        self,
        *,
        name: str,
        world_size: int,
        strategy: str,
        status: str = "QUEUED",
        started: float | None = None,
        ended: float | None = None,
        total_steps: int | None = None,
        reason: str = "",
        error: dict | None = None,
        cap: int = MAX_POINTS,
        log_lines: int = MAX_LOG_LINES,
    ):
        self.name, self.world_size, self.strategy = name, world_size, strategy
        self.status, self.reason, self.error = status, reason, error
        self.started, self.ended, self.total_steps = started, ended, total_steps
        self.device = ""  # "CPU (no GPU) on 1 host", from the record's ranks
        self.checkpoint_dir: str | None = None  # checkpoints (and suspend) need one
        self.checkpoint: str | None = None  # the newest committed checkpoint
        self.controls: list[str] | None = None  # a script job's: what its ranks accept
        self.sharing = ""  # "alice · queue default · priority 50": who, where, how urgent
        self.events: list[dict[str, Any]] = []  # restarts, failures, preemptions (durable)
        self.stacks: dict[str, Any] = {}  # where each rank was when the job was found HUNG
        self.held: dict[str, Any] = {}  # the held ranks' failing frames (on_error="hold")
        self.updates: dict[int, dict[str, Any]] = {}  # job.update's changes: seq -> step, changes
        self.diagnoses: list[dict[str, Any]] = []  # what went wrong, what to do (oldest first)
        self.goodput: dict[str, Any] | None = None  # where its wall time went (as of the record)
        self.cap, self.log_lines = cap, log_lines
        self.ranks: set[int] = set()
        self.scalars: dict[str, dict[int, Series]] = {}
        # a big job's scalars and system readings: min / mean / max over its ranks
        self.bands: dict[str, Band] = {}
        self.system_bands: dict[str, Band] = {}
        self.band_step: int | None = None  # the newest step a band came for
        self.rate: dict[int, Series] = {}
        self.system: dict[str, dict[int, Series]] = {}
        self.source: str | None = None
        self.last_sample: dict[int, dict[str, Any]] = {}
        self.logs: dict[int, collections.deque] = {}
        self.last_row: dict[int, dict[str, Any]] = {}
        self.first_time: float | None = None
        self.rows_seen = 0
        self.phases = PhaseView(world_size)  # each step's phases, across ranks
        self.dirty: set[str] = set()
        self._meters: dict[int, RateMeter] = {}
        self._cut_rows, self._cut_system, self._cut_logs = Cutoff(), Cutoff(), Cutoff()

    @classmethod
    def from_record(cls, record: dict[str, Any], **options: Any) -> JobView:
        spec = record.get("spec") or {}
        view = cls(
            name=record["name"],
            world_size=int(spec.get("world_size", 1)),
            strategy=what_runs(spec),
            status=record.get("status", "QUEUED"),
            started=record.get("started"),
            ended=record.get("ended"),
            total_steps=total_steps_of(record),
            reason=record.get("reason") or "",
            error=record.get("error"),
            **options,
        )
        view.device = device_text(record)
        view.checkpoint_dir = spec.get("checkpoint_dir")
        view.checkpoint = record.get("checkpoint")
        view.controls = record.get("controls")
        view.sharing = sharing_text(spec)
        view.events = list(record.get("events") or [])
        view.stacks = dict(record.get("stacks") or {})
        view.held = dict(record.get("held") or {})
        view.add_updates(e for e in view.events if e.get("kind") == "updated")
        view.diagnoses = diagnoses_of(record)
        view.goodput = record.get("goodput")
        return view

    # feeding -------------------------------------------------------------------
    def apply(self, msg: dict[str, Any]) -> None:
        """One message from :meth:`Job.on_event`."""
        kind = msg.get("kind")
        if kind == "status":
            self.set_status(msg.get("status", self.status), msg)
        elif kind == "metrics":
            self.add_rows(
                r for r in msg.get("rows") or () if self._cut_rows.fresh(r["rank"], r["time"])
            )
            self.add_system(
                s for s in msg.get("system") or () if self._cut_system.fresh(s["rank"], s["time"])
            )
            self.add_logs(
                line for line in msg.get("logs") or () if self._cut_logs.fresh(line[0], line[1])
            )
            if msg.get("phases"):  # keyed by step and rank: a row read twice is one row
                self.phases.add(int(msg["rank"]), msg["phases"])
                self.dirty.add("phases")
        elif kind == "steps":
            self.add_steps(msg)
        elif kind == "rollback":
            self.roll_back(int(msg["step"]))
        elif kind == "updated":
            self.add_updates([msg])
        elif kind == "diagnosis" and msg.get("diagnosis"):
            self.add_diagnosis(dict(msg["diagnosis"]))
        if "total_steps" in msg and msg["total_steps"]:
            self.total_steps = int(msg["total_steps"])
            self.dirty.add("progress")

    def load_history(self, rows: Iterable[dict[str, Any]]) -> None:
        """Rows as :meth:`Job.history` returns them (scalars flattened)."""
        reserved = ("seq", "rank", "step", "time")
        for row in rows:
            self._cut_rows.load(row["rank"], row["time"])
            self.add_rows(
                [
                    {
                        "rank": row["rank"],
                        "step": row["step"],
                        "time": row["time"],
                        "scalars": {k: v for k, v in row.items() if k not in reserved},
                    }
                ]
            )

    def load_steps(self, rows: Iterable[dict[str, Any]]) -> None:
        """Per-step summaries as :meth:`Job.steps` returns them (a big job's history)."""
        self.add_steps(
            {
                "steps": [
                    {
                        "step": r["step"],
                        "time": r["time"],
                        "scalars": {
                            k: [v["min"], v["mean"], v["max"]] for k, v in r["scalars"].items()
                        },
                    }
                    for r in rows
                ]
            }
        )

    def load_phases(self, rows: Iterable[dict[str, Any]]) -> None:
        """Phase rows as :meth:`Job.phases` returns them."""
        rows = list(rows)
        if rows:
            self.phases.load(rows)
            self.dirty.add("phases")

    def load_system(self, samples: Iterable[dict[str, Any]]) -> None:
        """Samples as :meth:`Job.system` returns them (fields flattened)."""
        for s in samples:
            self._cut_system.load(s["rank"], s["time"])
            sample = {k: v for k, v in s.items() if k not in ("seq", "rank", "time")}
            self.add_system([{"rank": s["rank"], "time": s["time"], "sample": sample}])

    def load_logs(self, lines: Iterable[dict[str, Any]]) -> None:
        """Lines as the journal returns them: dicts with rank, time, stream, text."""
        for line in lines:
            self._cut_logs.load(line["rank"], line["time"])
            self.add_logs([(line["rank"], line["time"], line["stream"], line["text"])])

    def set_status(self, status: str, record: dict[str, Any] | None = None) -> None:
        """A new status, and whatever of reason, times, error and ranks ``record`` holds."""
        record = record or {}
        if status != self.status:
            self.status = status
            self.dirty.update(("status", "progress"))
        for key in ("started", "ended", "reason", "error"):
            if key in record and record[key] != getattr(self, key):
                setattr(self, key, record[key])
                self.dirty.add("error" if key == "error" else "status")
        total = total_steps_of(record)
        if total:
            self.total_steps = total
        device = device_text(record)
        if device and device != self.device:
            self.device = device
            self.dirty.add("status")
        spec = record.get("spec") or {}
        if (
            spec.get("world_size") and spec["world_size"] != self.world_size
        ):  # resumed at another size
            self.world_size = int(spec["world_size"])
            self.dirty.update(("status", "phases"))
            self._drop_gone_ranks()
            self.phases.drop_ranks(self.world_size)
        if record.get("goodput") and record["goodput"] != self.goodput:
            self.goodput = record["goodput"]
            self.dirty.add("goodput")
        if record.get("controls") != self.controls:  # a script's ranks opted in
            self.controls = record.get("controls")
            self.dirty.add("status")
        if record.get("checkpoint") and record["checkpoint"] != self.checkpoint:
            self.checkpoint = record["checkpoint"]
            self.dirty.add("status")
        if "events" in record and record["events"] != self.events:
            self.events = list(record["events"])
            self.dirty.add("status")
            self.add_updates(e for e in self.events if e.get("kind") == "updated")
        if "events" in record and diagnoses_of(record) != self.diagnoses:
            self.diagnoses = diagnoses_of(record)
            self.dirty.add("diagnosis")
        if record.get("stacks") and record["stacks"] != self.stacks:
            self.stacks = dict(record["stacks"])
            self.dirty.add("error")
        if record.get("held") and record["held"] != self.held:
            self.held = dict(record["held"])
            self.dirty.add("error")

    def add_diagnosis(self, diagnosis: dict[str, Any]) -> None:
        """A new diagnosis (a message; the record's events bring the same ones back)."""
        if diagnosis not in self.diagnoses:
            self.diagnoses.append(diagnosis)
            self.dirty.add("diagnosis")

    def markers(self, metric: str) -> tuple[list[float], list[float]]:
        """Steps and values to mark on the chart of ``metric``: the loss spikes."""
        spikes = [
            d
            for d in self.diagnoses
            if d.get("kind") == "loss_spike" and d.get("step") is not None and metric == "loss"
        ]
        return (
            [float(d["step"]) for d in spikes],
            [float((d.get("data") or {}).get("value", "nan")) for d in spikes],
        )

    def roll_back(self, step: int) -> None:
        """Steps from ``step`` on were rolled back (a restart replays them): drop their rows."""
        for per_rank in self.scalars.values():
            for series in per_rank.values():
                series.truncate(float(step))
        for band in self.bands.values():
            band.truncate(float(step))
        if self.band_step is not None and self.band_step >= step:
            self.band_step = step - 1 if step > 0 else None
        for rank in [r for r, row in self.last_row.items() if row["step"] >= step]:
            del self.last_row[rank]
        self.phases.roll_back(step)
        self.dirty.update(("scalars", "progress", "phases"))

    def add_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            rank, step, t = int(row["rank"]), int(row["step"]), float(row["time"])
            self._rank(rank)
            if self.first_time is None:
                self.first_time = t
            self.rows_seen += 1
            for key, value in row["scalars"].items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    series = self.scalars.setdefault(key, {}).setdefault(rank, Series(self.cap))
                    series.append(float(step), float(value))
            rate = self._meters.setdefault(rank, RateMeter()).add(step, t)
            if rate is not None:
                self.rate.setdefault(rank, Series(self.cap)).append(self.elapsed_at(t), rate)
                self.dirty.add("rate")
            if rank < self.world_size:
                self.last_row[rank] = {"step": step, "time": t, **row["scalars"]}
            self.dirty.update(("scalars", "progress"))

    def add_steps(self, msg: dict[str, Any]) -> None:
        """A :class:`~clustersdk.protocol.StepsMessage`: bands over the ranks."""
        newest = None
        for s in msg.get("steps") or ():
            step = int(s["step"])
            for name, (lo, mean, hi) in s["scalars"].items():
                self.bands.setdefault(name, Band(self.cap)).set(step, lo, mean, hi)
            if newest is None or step >= newest[0]:
                newest = (step, float(s["time"]))
            if self.first_time is None:
                self.first_time = float(s["time"])
        if newest is not None:
            self.dirty.update(("scalars", "progress"))
            if self.band_step is None or newest[0] > self.band_step:
                self.band_step = newest[0]
            rate = self._meters.setdefault(-1, RateMeter()).add(*newest)
            if rate is not None:  # the job's pace (rank -1: all ranks)
                self.rate.setdefault(-1, Series(self.cap)).append(self.elapsed_at(newest[1]), rate)
                self.dirty.add("rate")
        band = msg.get("system")
        if band:
            self.add_system_band(band)
        if msg.get("phases"):
            self.phases.add_bands(msg["phases"])
            self.dirty.add("phases")
        self.add_logs(
            line for line in msg.get("logs") or () if self._cut_logs.fresh(line[0], line[1])
        )

    def add_system_band(self, band: dict[str, Any]) -> None:
        fields = dict(band["fields"])
        if self.source is None:
            self.source = band.get("source", "psutil")
        if "net_sent_per_s" in fields:  # the sum's band: the sums of the bands (near enough)
            recv = fields.get("net_recv_per_s", [0.0, 0.0, 0.0])
            fields["net_per_s"] = [a + b for a, b in zip(fields["net_sent_per_s"], recv)]
        x = self.elapsed_at(float(band["time"]))
        for chart, field, _title, _unit, scale in SYSTEM_CHARTS.get(self.source or "", ()):
            if field in fields:
                lo, mean, hi = (v / scale for v in fields[field])
                self.system_bands.setdefault(chart, Band(self.cap)).set(x, lo, mean, hi)
        self.dirty.add("system")

    def add_updates(self, updates: Iterable[dict[str, Any]]) -> None:
        """``job.update``'s changes (a message or a durable event: seq, step, changes)."""
        for u in updates:
            seq = u.get("seq")
            if seq is None or seq in self.updates or u.get("step") is None:
                continue
            self.updates[int(seq)] = {
                "step": int(u["step"]),
                "changes": dict(u.get("changes") or {}),
            }
            self.dirty.add("updates")

    def update_marks(self) -> list[tuple[int, str]]:
        """Where the loss chart marks a change: (step, ``lr 0.01 → 0.001``), in step order."""
        from ..hparams import describe

        return sorted((u["step"], describe(u["changes"])) for u in self.updates.values())

    def add_system(self, samples: Iterable[dict[str, Any]]) -> None:
        for s in samples:
            rank, t, sample = int(s["rank"]), float(s["time"]), dict(s["sample"])
            self._rank(rank)
            source = sample.get("source", "psutil")
            if self.source is None:
                self.source = source
            if "net_sent_per_s" in sample:
                sample["net_per_s"] = sample["net_sent_per_s"] + sample.get("net_recv_per_s", 0.0)
            if rank < self.world_size:
                self.last_sample[rank] = sample
            for chart, field, _title, _unit, scale in SYSTEM_CHARTS.get(source, ()):
                if field in sample:
                    series = self.system.setdefault(chart, {}).setdefault(rank, Series(self.cap))
                    series.append(self.elapsed_at(t), float(sample[field]) / scale)
            self.dirty.add("system")

    def add_logs(self, lines: Iterable[Any]) -> None:
        for rank, _t, stream, text in lines:
            rank = int(rank)
            self._rank(rank)
            self.logs.setdefault(rank, collections.deque(maxlen=self.log_lines)).append(
                (stream, text)
            )
            self.dirty.add("logs")

    def take_dirty(self) -> set[str]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def _rank(self, rank: int) -> None:
        # a rank beyond the world size is history: a resume at fewer ranks left it out
        if rank not in self.ranks and rank < self.world_size:
            self.ranks.add(rank)
            self.dirty.add("ranks")

    def _drop_gone_ranks(self) -> None:
        """Ranks the current world size has no more leave the rank table and the picker
        (their lines stay in the charts: that is what they did)."""
        gone = {r for r in self.ranks if r >= self.world_size}
        if gone:
            self.ranks -= gone
            for table in (self.last_row, self.last_sample):
                for rank in gone:
                    table.pop(rank, None)
            self.dirty.add("ranks")

    # reading -------------------------------------------------------------------
    def elapsed_at(self, t: float) -> float:
        """Seconds since the job started (or since its first row, if that came first)."""
        origin = self.started if self.started is not None else self.first_time
        if origin is None:
            self.first_time = origin = t
        return max(t - origin, 0.0)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def metric_names(self) -> list[str]:
        """Logged scalar names, ``loss`` first."""
        return sorted({*self.scalars, *self.bands}, key=lambda k: (k != "loss", k))

    def steps_done(self) -> int:
        done = max((row["step"] + 1 for row in self.last_row.values()), default=0)
        return max(done, self.band_step + 1) if self.band_step is not None else done

    def steps_per_s(self) -> float | None:
        rates = [s.last()[1] for s in self.rate.values() if s.last() is not None]
        return sum(rates) / len(rates) if rates else None

    def progress(self, now: float | None = None) -> dict[str, Any]:
        """Step, total, rate, ETA and elapsed time, as numbers (``None`` where unknown)."""
        done, rate, total = self.steps_done(), self.steps_per_s(), self.total_steps
        if self.started is None:
            elapsed = None
        else:
            end = self.ended if self.ended is not None else (time.time() if now is None else now)
            elapsed = max(end - self.started, 0.0)
        eta = None
        if total and rate and not self.terminal and self.status != "PAUSED":
            eta = max(total - done, 0) / rate
        running = self.status in ("RUNNING", "STARTING")
        return {
            "step": done,
            "total": total,
            "rate": rate if running else None,
            "eta": eta,
            "elapsed": elapsed,
            "fraction": min(done / total, 1.0) if total else None,
        }

    def log_tail(self, rank: int, lines: int | None = None) -> list[tuple[str, str]]:
        tail = list(self.logs.get(rank, ()))
        return tail if lines is None else tail[-lines:]


def total_steps_of(record: dict[str, Any]) -> int | None:
    """The job's planned step count, wherever the control plane puts it (if anywhere yet)."""
    for place in (record, record.get("progress") or {}, record.get("spec") or {}):
        value = place.get("total_steps") if isinstance(place, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def device_text(record: dict[str, Any]) -> str:
    """Where the ranks run: ``GPU on 2 hosts``, ``CPU (no GPU) on 1 host``; empty before start."""
    ranks = record.get("ranks") or ()
    devices = {str(r.get("device", "")) for r in ranks}
    if not devices:
        return ""
    hosts = len({r.get("host") for r in ranks})
    kind = "GPU" if any(d.startswith("cuda") for d in devices) else "CPU (no GPU)"
    return f"{kind} on {hosts} host{'s' if hosts != 1 else ''}"


def sharing_text(spec: dict[str, Any]) -> str:
    """Who launched the job, its queue and priority, in one line (empty parts left out)."""
    parts = [str(spec["owner"])] if spec.get("owner") else []
    if spec.get("queue"):
        parts.append(f"queue {spec['queue']}")
    if spec.get("priority") is not None:
        parts.append(f"priority {spec['priority']}")
    if spec.get("preemptible") is False:
        parts.append("not preemptible")
    return " · ".join(parts)


def diagnoses_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A record's diagnoses, oldest first: its durable events of kind ``diagnosis`` (or,
    in a record without events, the newest one)."""
    if "events" not in record:
        return [record["diagnosis"]] if record.get("diagnosis") else []
    return [
        e["diagnosis"]
        for e in record.get("events") or ()
        if e.get("kind") == "diagnosis" and e.get("diagnosis")
    ]


def diagnosis_line(diagnosis: dict[str, Any]) -> str:
    """One line: where, what, and what to do."""
    at = f"step {diagnosis['step']} · " if diagnosis.get("step") is not None else ""
    return f"{at}{diagnosis.get('summary', '')} — {diagnosis.get('advice', '')}"


def event_lines(events: Iterable[dict[str, Any]], last: int = 3) -> list[str]:
    """The newest ``last`` durable events, oldest first, one line each."""
    out = []
    for e in list(events)[-last:]:
        at = f"step {e['step']} · " if e.get("step") is not None else ""
        out.append(f"{at}{e.get('kind', 'event')}: {e.get('message', '')}")
    return out
