"""The live job dashboard: charts per rank, progress, controls, log tail, error panel.

Events arrive on Dask's event-loop thread; :meth:`JobDashboard._on_event`
only queues them. The shared :mod:`.pump` thread applies them to the
:class:`~.model.JobView` and pushes what changed to the widgets, at most ten
times a second, so a fast job cannot flood the kernel or the browser. Series
are bounded (:class:`~.model.Series`), so neither can a long one.
"""

from __future__ import annotations

import collections
import html
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from ..errors import describe
from . import source
from .charts import LineChart
from .format import progress_text
from .model import ACTIONS, SYSTEM_CHARTS, JobView, event_lines
from .pump import Pump, pump
from .render import (
    badge,
    diagnosis_html,
    goodput_html,
    held_html,
    job_html,
    job_text,
    stacks_html,
)
from .straggler import phases_html
from .tree import close_tree

if TYPE_CHECKING:
    from ..job import Job

logger = logging.getLogger(__name__)

LOG_TAIL = 120  # lines shown in the log panel
RECORD_EVERY_S = 5.0  # how often a running job's record (its goodput) is read again
ENDED = frozenset({"FINISHED", "FAILED", "STOPPED"})
BUTTONS = (  # action, label, icon, style, tooltip
    (
        "pause",
        "Pause",
        "pause",
        "warning",
        "Hold every rank at the next step boundary (slots kept)",
    ),
    ("resume", "Resume", "play", "success", "Continue a paused or suspended job"),
    ("checkpoint", "Checkpoint", "save", "info", "Save a checkpoint at the next step boundary"),
    ("suspend", "Suspend", "moon-o", "", "Checkpoint, free the slots, wait to be resumed"),
    ("stop", "Stop", "stop", "danger", "Stop at the next step boundary"),
)


class JobDashboard:
    """A job's live dashboard; display it (or the job) in a notebook.

    >>> dash = JobDashboard(job)             # doctest: +SKIP
    >>> dash.charts["loss"].lines[0].y       # the plot model of rank 0's loss
    """

    def __init__(self, job: Job, *, pump_: Pump | None = None):
        self._job = weakref.ref(job)
        self._pump = pump_ or pump()
        self._lock = threading.RLock()
        self._pending: collections.deque = collections.deque()
        self._ready = False
        self._closed = False
        self._metric = "loss"
        self._message = ""
        self._busy: str | None = None
        self._syncing = False
        self._rank_picked = False
        self._record_read = time.monotonic()
        self.received: collections.deque = collections.deque(maxlen=10_000)
        self.delays: collections.deque = collections.deque(
            maxlen=10_000
        )  # ctx.log -> plot, seconds
        # someone else's job (a TLS cluster): every button greyed out, saying whose it is
        self._refusal = job.cluster.refusal(job.owner)
        self._dashboard_link = _dashboard_link(job.cluster)  # Dask's, linked in the header
        self._build()
        job.on_event(self._on_event)  # first, so that nothing between the read and now is lost
        self.view = JobView.from_record(job.info())
        source.load_into(self.view, job)
        with self._lock:
            self._ready = True
            self._render(self.view.take_dirty() | {"status", "ranks", "diagnosis", "goodput"})
            if self.view.status == "PAUSED" and "ctx.breakpoint()" in self.view.reason:
                self._show_console()  # displayed while a session is open
        if self._pending:
            self._pump.request(self)

    # widgets ------------------------------------------------------------------------
    def _build(self) -> None:
        self.header = w.HTML()
        self.diagnosis = w.HTML()  # the newest diagnosis: what went wrong, what to do
        self.progress = w.FloatProgress(
            value=0.0, min=0.0, max=1.0, layout=w.Layout(width="320px", display="none")
        )
        self.progress_label = w.HTML()
        self.goodput = w.HTML()  # where the wall time went, refreshed with the record
        self.buttons: dict[str, w.Button] = {}
        for action, label, icon, style, tip in BUTTONS:
            button = w.Button(
                description=label,
                icon=icon,
                button_style=style,
                tooltip=tip,
                disabled=True,
                layout=w.Layout(width="auto", min_width="96px"),
            )
            button.on_click(lambda _b, action=action: self._act(action))
            self.buttons[action] = button
        self.message = w.HTML(layout=w.Layout(margin="0 0 0 8px"))
        self.metric = w.Dropdown(
            options=["loss"],
            value="loss",
            description="metric",
            layout=w.Layout(width="220px", display="none"),
        )
        self.metric.observe(self._on_metric, names="value")
        self.charts: dict[str, LineChart] = {
            "loss": LineChart("loss", x_label="step", x_min=0.0, x_format="~s"),  # 1.5k
            "rate": LineChart(
                "Throughput (steps/s)", x_label="time (s)", x_min=0.0, y_min=0.0, legend=False
            ),
        }
        self.grid = w.GridBox(
            [self.charts["loss"].figure, self.charts["rate"].figure],
            layout=w.Layout(
                grid_template_columns="repeat(auto-fill, minmax(340px, 1fr))",
                grid_gap="2px 8px",
                width="100%",
            ),
        )
        self.rank = w.Dropdown(
            options=[("rank 0", 0)], value=0, description="log of", layout=w.Layout(width="180px")
        )
        self.rank.observe(self._on_rank, names="value")
        self.log = w.HTML(layout=w.Layout(width="100%"))
        self.phases = w.HTML(layout=w.Layout(width="100%"))  # the straggler view
        self.error = w.HTML(layout=w.Layout(display="none", width="100%"))
        self.console_box = w.VBox(layout=w.Layout(width="100%"))  # job.console(), once one opens
        self.widget = w.VBox(
            [
                self.header,
                self.diagnosis,
                w.HBox([self.progress, self.progress_label], layout=w.Layout(align_items="center")),
                self.goodput,
                w.HBox(
                    [*self.buttons.values(), self.message],
                    layout=w.Layout(align_items="center", flex_flow="row wrap"),
                ),
                self.error,
                self.console_box,
                self.metric,
                self.grid,
                self.phases,
                self.rank,
                self.log,
            ],
            layout=w.Layout(width="100%", padding="4px"),
        )
        self.widget.add_class("clustersdk-job")

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        return self.widget._repr_mimebundle_(**kwargs)

    def html(self) -> str:
        """The static summary of what the dashboard shows now."""
        with self._lock:
            return job_html(self.view)

    def text(self, header: str) -> str:
        with self._lock:
            return job_text(self.view, header)

    def close(self) -> None:
        """Stop updating and close the widgets (the job goes on)."""
        self._closed = True
        self._pump.forget(self)
        close_tree(self.widget)

    # events (Dask's thread) ------------------------------------------------------------
    def _on_event(self, msg: dict[str, Any]) -> None:
        try:
            if self._closed:
                return
            self._pending.append((time.time(), msg))
            if self._ready:
                self._pump.request(self)
        except Exception:  # never raise into Dask's event loop
            logger.debug("clustersdk: dropped a dashboard event", exc_info=True)

    # flush (the pump's thread) ----------------------------------------------------------
    def flush(self) -> None:
        if self._closed:
            return
        with self._lock:
            rows: list[dict] = []
            status_seen = console_seen = False
            while self._pending:
                received, msg = self._pending.popleft()
                try:
                    self.view.apply(msg)
                    # a script job's controls (what its ranks accept) live in the record too
                    status_seen = status_seen or msg.get("kind") in ("status", "controls")
                    console_seen = console_seen or msg.get("kind") == "console"
                    new = msg.get("rows") or ()
                    self.received.extend(received - r["time"] for r in new)
                    rows.extend(new)
                except Exception:  # one malformed message must not stall the dashboard
                    logger.warning(
                        "clustersdk: dashboard skipped a malformed event %.200r", msg, exc_info=True
                    )
            # the record on a status change, and its goodput now and then while it runs
            stale = time.monotonic() - self._record_read > RECORD_EVERY_S
            if status_seen or (stale and self.view.status not in ENDED):
                self._refresh_record()
            if console_seen:
                self._show_console()
            dirty = self.view.take_dirty()
            self._render(dirty)
            if "scalars" in dirty and rows:
                now = time.time()
                self.delays.extend(now - row["time"] for row in rows)

    def _refresh_record(self) -> None:
        """Status events say only the new status; reason, times and error come from the record."""
        job = self._job()
        if job is None:
            return
        self._record_read = time.monotonic()
        try:
            record = job.info()
        except Exception:  # the cluster went away: keep what we know
            logger.debug("clustersdk: could not refresh the job record", exc_info=True)
            return
        self.view.set_status(record["status"], record)

    # rendering ---------------------------------------------------------------------------
    def _render(self, dirty: set[str]) -> None:
        view = self.view
        if "status" in dirty:
            self._render_header()
            self._render_buttons()
        if "error" in dirty or "status" in dirty:
            self._render_error()
        if dirty & {"progress", "status", "scalars"}:
            self._render_progress()
        if "ranks" in dirty:
            options = [(f"rank {r}", r) for r in sorted(view.ranks or {0})]
            if options != list(self.rank.options):
                # the lowest rank, unless the user picked one
                keep = self._rank_picked and self.rank.value in view.ranks
                value = self.rank.value if keep else options[0][1]
                self._syncing = True
                try:
                    self.rank.options = options
                    self.rank.value = value
                finally:
                    self._syncing = False
        if "diagnosis" in dirty:
            self.diagnosis.value = diagnosis_html(view.diagnoses)
        if "goodput" in dirty:
            self.goodput.value = goodput_html(view.goodput)
        if "scalars" in dirty:
            self._render_metric_choice()
            self._render_scalars()
        if "updates" in dirty:  # job.update's changes, at their steps
            steps, labels = zip(*view.update_marks()) if view.updates else ((), ())
            self.charts["loss"].mark(steps, [f"step {s}: {t}" for s, t in zip(steps, labels)])
        if dirty & {"scalars", "diagnosis"}:
            self.charts["loss"].set_markers(*view.markers(self._metric))
        if "rate" in dirty:
            self._render_series(self.charts["rate"], view.rate)
        if "system" in dirty:
            self._render_system()
        if "logs" in dirty or "ranks" in dirty:
            self._render_logs()
        if "phases" in dirty:
            self.phases.value = phases_html(view.phases)

    def _render_header(self) -> None:
        v = self.view
        ranks = f"{v.world_size} rank{'s' if v.world_size != 1 else ''}"
        device = f" · {html.escape(v.device)}" if v.device else ""
        device += f" · {html.escape(v.sharing)}" if v.sharing else ""
        waiting = v.reason and v.status in ("QUEUED", "RESTARTING", "HUNG", "HELD", "PAUSED")
        reason = f" · <em>{html.escape(v.reason)}</em>" if waiting else ""
        if v.checkpoint:
            reason += f" · last checkpoint <code>{html.escape(_short_path(v.checkpoint))}</code>"
        events = "".join(
            f'<div style="color:#6b7280;font-size:12px;">{html.escape(line)}</div>'
            for line in event_lines(v.events)
        )
        link = (
            f'<a class="clustersdk-dask-dashboard" href="{html.escape(self._dashboard_link)}" '
            f'target="_blank" rel="noopener noreferrer" title="Dask\'s dashboard of the cluster" '
            f'style="font-size:12px;margin-left:auto;">Dask dashboard</a>'
            if self._dashboard_link
            else ""
        )
        self.header.value = (
            f'<div style="display:flex;align-items:center;gap:8px;font-size:13px;">'
            f'<strong style="font-size:14px;">Job {html.escape(v.name)}</strong> {badge(v.status)}'
            f'<span style="color:#6b7280;">{html.escape(v.strategy)} · {ranks}{device}{reason}</span>'
            f"{link}</div>{events}"
        )

    def _render_progress(self) -> None:
        p = self.view.progress()
        if p["fraction"] is not None:
            self.progress.layout.display = ""
            self.progress.value = p["fraction"]
            self.progress.bar_style = {
                "FINISHED": "success",
                "FAILED": "danger",
                "PAUSED": "warning",
                "RESTARTING": "warning",
            }.get(self.view.status, "info")
        self.progress_label.value = (
            f'<span style="font-size:13px;color:#374151;">{html.escape(progress_text(p))}</span>'
        )

    def _render_buttons(self) -> None:
        job = self._job()
        status = self.view.status
        for action, button in self.buttons.items():
            available = job is not None and callable(getattr(job, action, None))
            controls = self.view.controls  # a script job's: what its ranks accept
            if self._refusal:
                available = False
                button.tooltip = self._refusal[0].upper() + self._refusal[1:]
            elif controls is not None and action in ("pause", "checkpoint"):
                if action not in controls:
                    available = False
                    button.tooltip = (
                        f"The script does not accept {action} requests: it calls "
                        "no clustersdk.script.step(), nor uses ClusterSDKCallback"
                    )
            elif (
                action in ("checkpoint", "suspend")
                and not self.view.checkpoint_dir
                and controls is None
            ):
                available = False
                button.tooltip = (
                    f"{action.capitalize()} needs a job launched with checkpoint_dir=..."
                )
            button.disabled = (
                self._busy is not None or not available or status not in ACTIONS[action]
            )
        self.message.value = self._message

    def _render_error(self) -> None:
        e = self.view.error if self.view.status == "FAILED" else None
        stacks = stacks_html(self.view.stacks) if self.view.status in ("HUNG", "FAILED") else ""
        if self.view.status in ("HELD", "FAILED"):
            stacks += held_html(self.view.held)
        if not e and not stacks:
            self.error.layout.display = "none"
            return
        self.error.layout.display = ""
        if not e:
            self.error.value = stacks
            return
        self.error.value = stacks + (
            '<div style="border-left:4px solid #dc2626;background:#fef2f2;padding:6px 10px;">'
            f"<strong>{html.escape(describe(e))}</strong>"
            '<pre style="white-space:pre-wrap;font-size:12px;margin:6px 0 0 0;max-height:320px;'
            f'overflow:auto;">{html.escape(e.get("traceback") or "")}</pre></div>'
        )

    def _show_console(self) -> None:
        """A breakpoint's pdb session opened: show the job's console (once)."""
        job = self._job()
        if job is None or self.console_box.children:
            return
        try:
            self.console_box.children = [job.console().widget]
        except Exception:  # the console is a convenience: never break the dashboard
            logger.warning("clustersdk: could not show the job's console", exc_info=True)

    def _render_metric_choice(self) -> None:
        names = self.view.metric_names()
        if not names:
            return
        if self._metric not in names:
            self._metric = names[0]
        if list(self.metric.options) != names:
            self._syncing = True
            try:
                self.metric.options = names
                self.metric.value = self._metric
            finally:
                self._syncing = False
            self.metric.layout.display = "" if len(names) > 1 else "none"
        self.charts["loss"].retitle(self._metric)

    def _on_metric(self, change: dict) -> None:
        if self._syncing:
            return
        with self._lock:
            if change["new"] and change["new"] != self._metric:
                self._metric = change["new"]
                self.charts["loss"].clear()
                self.charts["loss"].retitle(self._metric)
                self._render_scalars()
                self.charts["loss"].set_markers(*self.view.markers(self._metric))

    def _on_rank(self, _change: dict) -> None:
        if not self._syncing:
            self._rank_picked = True
        with self._lock:
            self._render_logs()

    def _render_scalars(self) -> None:
        """The chosen metric: a line per rank, or a big job's band over its ranks."""
        band = self.view.bands.get(self._metric)
        if band is not None:
            self.charts["loss"].set_band(*band.points())
        else:
            self._render_series(self.charts["loss"], self.view.scalars.get(self._metric, {}))

    def _render_series(self, chart: LineChart, series: dict) -> None:
        for rank in sorted(series):
            chart.set(rank, *series[rank].points())

    def _render_system(self) -> None:
        source_ = self.view.source
        for chart_id, _field, title, unit, _scale in SYSTEM_CHARTS.get(source_ or "", ()):
            chart = self.charts.get(chart_id)
            if chart is None:
                chart = LineChart(
                    f"{title} ({unit})",
                    x_label="time (s)",
                    x_min=0.0,
                    y_min=0.0,
                    y_max=100.0 if unit == "%" else None,
                    legend=False,
                )
                self.charts[chart_id] = chart
                self.grid.children = [*self.grid.children, chart.figure]
            band = self.view.system_bands.get(chart_id)
            if band is not None:
                chart.set_band(*band.points())
            else:
                self._render_series(chart, self.view.system.get(chart_id, {}))

    def _render_logs(self) -> None:
        rank = self.rank.value
        tail = self.view.log_tail(rank, LOG_TAIL)
        colors = {"stderr": "#b91c1c", "log": "#92400e"}
        lines = (
            "\n".join(
                f'<span style="color:{colors[s]};">{html.escape(t)}</span>'
                if s in colors
                else html.escape(t)
                for s, t in tail
            )
            or '<span style="color:#9ca3af;">(no output yet)</span>'
        )
        # column-reverse keeps the newest line in view as lines come in
        self.log.value = (
            '<div style="display:flex;flex-direction:column-reverse;max-height:180px;overflow:auto;'
            'border:1px solid #e5e7eb;border-radius:4px;background:#f9fafb;">'
            f'<pre style="margin:0;padding:4px 8px;font-size:12px;line-height:1.35;">{lines}</pre></div>'
        )

    # controls (the kernel's thread, then a worker thread) ------------------------------------
    def _act(self, action: str) -> None:
        job = self._job()
        if job is None or self._busy is not None:
            return
        self._busy = action
        self._set_message(f"{action}…", "#374151")

        def run() -> None:
            try:
                text, color = _describe(action, getattr(job, action)()), "#374151"
            except Exception as e:  # shown on the dashboard; the kernel goes on
                text, color = f"{action} failed: {e}", "#b91c1c"
            self._busy = None
            self._set_message(text, color)

        # pause() and friends wait for the ranks: not on the kernel's thread, which
        # must stay free to deliver the next click and run cells.
        threading.Thread(target=run, name=f"clustersdk-{action}", daemon=True).start()

    def _set_message(self, text: str, color: str) -> None:
        with self._lock:
            self._message = (
                f'<span style="font-size:12px;color:{color};">{html.escape(text)}</span>'
            )
            self._render_buttons()


def _describe(action: str, result: Any) -> str:
    if action == "pause":
        return f"paused before step {result}"
    if action == "checkpoint":
        return f"checkpoint saved: {result}"
    if action == "suspend":
        return f"suspended; will resume from {result}"
    if action == "stop":
        return f"stop requested ({result})"
    return f"{action}: {result}"


def _short_path(path: str, keep: int = 2) -> str:
    """The last ``keep`` parts of a path: enough to tell checkpoints apart."""
    parts = path.rstrip("/").split("/")
    return "/".join(parts[-keep:]) if len(parts) > keep else path


def _dashboard_link(cluster: Any) -> str | None:
    """The cluster's Dask dashboard URL; None where there is none or it can't be asked
    (a dashboard without the link is still a dashboard)."""
    try:
        return cluster.dashboard_link
    except Exception:  # noqa: BLE001 - the scheduler did not answer: no link
        logger.debug("clustersdk: no dashboard link", exc_info=True)
        return None
