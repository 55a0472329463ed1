"""Static HTML and text for jobs and clusters (Jinja templates in ``templates/``).

These are what a notebook shows where no live widget can run: nbconvert, GitHub,
a kernel without ipywidgets. Every function here is pure: it reads a
:class:`~.model.JobView` or plain records and returns a string.
"""

from __future__ import annotations

import html
import math
import os
import time
from collections.abc import Iterable
from typing import Any

import jinja2
from markupsafe import Markup, escape

from ..control import goodput
from ..errors import describe
from ..protocol import what_runs
from .charts import axis_range, is_throughput
from .format import fmt_bytes, fmt_duration, fmt_number, progress_text, rank_color
from .model import GIB, STATUS_COLORS, SYSTEM_CHARTS, JobView, diagnosis_line, event_lines
from .straggler import phases_html

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
    autoescape=False,  # the templates escape with |e; badges and tables come in as Markup
    trim_blocks=True,
)


def template(name: str) -> jinja2.Template:
    """The Jinja template ``templates/<name>`` (e.g. ``"queue.html.j2"``)."""
    return _env.get_template(name)


def badge(status: str) -> Markup:
    """A coloured pill naming the status."""
    color = STATUS_COLORS.get(status, "#6b7280")
    return Markup(
        f'<span class="clustersdk-badge" style="background: {color}; color: white; '
        f"border-radius: 9px; padding: 1px 8px; font-size: 11px; font-weight: 600; "
        f'letter-spacing: 0.03em;">{escape(status)}</span>'
    )


# jobs --------------------------------------------------------------------------------
def job_html(view: JobView) -> str:
    """The static summary of a job: status, progress, per-rank table, loss sparkline, error."""
    metrics = view.metric_names()[:3]
    source = view.source
    charts = SYSTEM_CHARTS.get(source or "", [])[:2]
    ranks = []
    for rank in sorted(view.ranks):
        row = view.last_row.get(rank, {})
        sample = view.last_sample.get(rank, {})
        rate = view.rate.get(rank)
        ranks.append(
            {
                "rank": rank,
                "color": rank_color(rank),
                "step": fmt_number(row["step"] + 1) if "step" in row else "—",
                "metrics": [fmt_number(row[k]) if k in row else "—" for k in metrics],
                "rate": f"{rate.last()[1]:.3g}" if rate is not None and rate.last() else "—",
                "system": [_sample_text(sample, field, unit) for _c, field, _t, unit, _s in charts],
            }
        )
    progress = view.progress()
    return template("job.html.j2").render(
        name=view.name,
        badge=badge(view.status),
        color=STATUS_COLORS.get(view.status, "#6b7280"),
        strategy=view.strategy,
        world_size=view.world_size,
        device=" · ".join(p for p in (view.device, view.sharing) if p),
        progress=progress_text(progress),
        fraction=progress["fraction"],
        reason=view.reason if view.status in ("QUEUED", "RESTARTING", "HUNG", "HELD") else "",
        metrics=metrics,
        ranks=ranks,
        system_labels=[_short_label(c) for c in charts],
        system_note="System figures are host CPU and memory (psutil): these ranks have no GPU."
        if source == "psutil"
        else "",
        spark=sparkline(
            metrics[0], view.scalars.get(metrics[0], {}), markers=view.markers(metrics[0])
        )
        if metrics
        else None,
        diagnosis=Markup(diagnosis_html(view.diagnoses)),
        goodput=Markup(goodput_html(view.goodput)),
        error=view.error if view.status == "FAILED" else None,
        events=event_lines(view.events),
        stacks=Markup(
            (stacks_html(view.stacks) if view.status in ("HUNG", "FAILED", "STOPPED") else "")
            + (held_html(view.held) if view.status in ("HELD", "FAILED") else "")
        ),
        phases=Markup(phases_html(view.phases)),
    )


#: A diagnosis's colour: a failure's red, a warning's (the job goes on) amber.
FAILURE_KINDS = frozenset(
    {"cuda_oom", "host_oom", "collective_timeout", "duplicate_gpu", "port_in_use"}
)


def diagnosis_html(diagnoses: list[dict[str, Any]]) -> str:
    """The newest diagnosis, in a box: what went wrong and what to do."""
    if not diagnoses:
        return ""
    d = diagnoses[-1]
    red = d.get("kind") in FAILURE_KINDS
    border, background = ("#dc2626", "#fef2f2") if red else ("#d97706", "#fffbeb")
    at = f"step {d['step']} · " if d.get("step") is not None else ""
    more = (
        f' <span style="color:#6b7280;">({len(diagnoses) - 1} earlier: job.diagnoses())</span>'
        if len(diagnoses) > 1
        else ""
    )
    return (
        f'<div class="clustersdk-diagnosis" style="border-left:4px solid {border};'
        f'background:{background};padding:4px 10px;margin:4px 0;font-size:12px;">'
        f"<strong>Diagnosis:</strong> {html.escape(at + str(d.get('summary', '')))}{more}"
        f"<br><strong>What to do:</strong> {html.escape(str(d.get('advice', '')))}</div>"
    )


#: Each goodput bucket's colour (the lab panel's bar uses the same).
GOODPUT_COLORS = {
    "productive": "#16a34a",
    "checkpoint": "#2563eb",
    "lost": "#dc2626",
    "startup": "#9ca3af",
    "hung": "#f59e0b",
    "queued": "#a78bfa",
    "paused": "#fcd34d",
}


def goodput_html(summary: dict[str, Any] | None) -> str:
    """Where the job's wall time went: a bar of its buckets, and the line that says it."""
    if not summary or not summary.get("wall"):
        return ""
    wall = float(summary["wall"])
    seconds = summary.get("seconds") or {}
    segments = "".join(
        f'<div class="clustersdk-goodput-{bucket}" title="{html.escape(goodput.LABELS[bucket])}'
        f' {seconds[bucket]:.1f} s" style="width:{100 * seconds[bucket] / wall:.2f}%;'
        f'background:{GOODPUT_COLORS[bucket]};"></div>'
        for bucket in goodput.BUCKETS
        if seconds.get(bucket, 0) > 0
    )
    return (
        '<div class="clustersdk-goodput" style="margin:4px 0;font-size:12px;color:#374151;">'
        '<div style="display:flex;height:8px;max-width:420px;border-radius:3px;'
        f'overflow:hidden;background:#e5e7eb;">{segments}</div>'
        f"<div>{html.escape(goodput.describe(summary))}</div></div>"
    )


def stacks_html(stacks: dict[str, Any]) -> str:
    """Where each rank was when its job was found hung: one foldable stack per rank."""
    if not stacks:
        return ""
    parts = [
        '<div style="border-left:4px solid #b91c1c;background:#fef2f2;padding:6px 10px;'
        'margin-top:8px;"><strong>Where each rank was when the job was found hung</strong>'
    ]
    for key in sorted(stacks, key=int):
        entry = stacks[key]
        where = f"rank {key}"
        if entry.get("step") is not None:
            where += f" · step {entry['step']} · {entry.get('phase')}"
        if not entry.get("answered", True):
            where += " · no answer"
        parts.append(
            f'<details><summary>{html.escape(where)}</summary><pre style="white-space:'
            f'pre-wrap;font-size:12px;max-height:320px;overflow:auto;">'
            f"{html.escape(str(entry.get('text', '')))}</pre></details>"
        )
    return "".join(parts) + "</div>"


def held_html(held: dict[str, Any]) -> str:
    """The failing frames, with their locals, of the rank a held job was held for."""
    from ..postmortem import PostMortem

    entry = (held.get("ranks") or {}).get(str(held.get("cause")))
    if not entry:
        return ""
    post = PostMortem(
        {
            **entry,
            "name": "",
            "status": "held",
            "cause": held.get("cause"),
            "ended": held.get("ended", ""),
        }
    )
    return (
        '<div class="clustersdk-held" style="border-left:4px solid #c2410c;'
        'background:#fff7ed;padding:6px 10px;margin-top:8px;font-size:12px;">'
        f"<strong>Held: rank {post.rank}'s failing frames, with their locals "
        f"(job.debug({post.rank}))</strong>{post._repr_html_()}</div>"
    )


def job_text(view: JobView, header: str) -> str:
    """``repr(job)`` and one line of progress, for terminals and ``text/plain``."""
    line = progress_text(view.progress())
    metrics = view.metric_names()
    if metrics and 0 in view.last_row and metrics[0] in view.last_row[0]:
        line += f" · {metrics[0]} {fmt_number(view.last_row[0][metrics[0]])} (rank 0)"
    text = f"{header}\n{line}"
    if view.status == "FAILED" and view.error:
        e = view.error
        text += f"\n{describe(e)}"
    if view.diagnoses:
        text += f"\ndiagnosis: {diagnosis_line(view.diagnoses[-1])}"
    return text


def sparkline(
    title: str,
    series: dict[int, Any],
    width: int = 360,
    height: int = 80,
    markers: tuple[list[float], list[float]] = ([], []),
) -> dict | None:
    """SVG polylines for one metric, one per rank, sharing the axes (a rank with one
    point so far: a dot); ``markers`` (steps and values: the loss spikes) as red rings."""
    lines = {rank: s.points() for rank, s in series.items() if len(s)}
    if not lines:
        return None
    xs = [x for px, _ in lines.values() for x in px]
    ys = [y for _, py in lines.values() for y in py if math.isfinite(y)]
    if not ys:
        return None
    x0, x1, low, high = min(xs), max(xs), min(ys), max(ys)
    # the dashboard's axis rule: no sliver of an axis that makes noise look like a cliff
    y0, y1 = axis_range(low, high, start=0.0 if is_throughput(title) else None)
    sx = (width - 8) / ((x1 - x0) or 1.0)
    sy = (height - 8) / (y1 - y0)
    out = []
    for rank in sorted(lines):
        px, py = lines[rank]
        points = [
            (f"{4 + (x - x0) * sx:.1f}", f"{height - 4 - (y - y0) * sy:.1f}")
            for x, y in zip(px, py)
            if y == y
        ]
        out.append(
            {
                "color": rank_color(rank),
                "points": " ".join(f"{x},{y}" for x, y in points),
                # a line of one point draws nothing: that point is a dot until the next
                "dot": {"x": points[0][0], "y": points[0][1]} if len(points) == 1 else None,
            }
        )
    dots = [
        {"x": round(4 + (x - x0) * sx, 1), "y": round(height - 4 - (min(y, y1) - y0) * sy, 1)}
        for x, y in zip(*markers)
        if y == y and x0 <= x <= x1
    ]
    return {
        "title": title,
        "width": width,
        "height": height,
        "lines": out,
        "ymin": fmt_number(low),
        "ymax": fmt_number(high),
        "markers": dots,
    }


def _short_label(chart: tuple) -> str:
    return {
        "gpu_util": "GPU util",
        "gpu_mem": "GPU mem",
        "cpu": "host CPU",
        "rss": "RSS",
        "net": "net",
    }.get(chart[0], chart[2])


def _sample_text(sample: dict, field: str, unit: str) -> str:
    if field not in sample:
        return "—"
    value = float(sample[field])
    if unit == "%":
        return f"{value:.0f}%"
    if unit == "GiB":
        return fmt_bytes(value)
    return f"{value / 1e6:.2f} MB/s"


# clusters --------------------------------------------------------------------------------
def jobs_html(records: Iterable[dict[str, Any]], now: float | None = None) -> str:
    """A table of job records (``cluster.jobs()``'s records), oldest first."""
    return template("jobs.html.j2").render(jobs=[_job_row(r, now) for r in records])


def jobs_text(records: Iterable[dict[str, Any]], now: float | None = None) -> str:
    rows = [_job_row(r, now) for r in records]
    if not rows:
        return "No jobs yet."
    head = (
        f"{'job':<28} {'status':<10} {'ranks':>5}  {'strategy':<9} {'owner':<10} "
        f"{'queue':<10} {'prio':>4}  {'submitted':<10} {'ran':>9}  note"
    )
    lines = [head]
    for j in rows:
        lines.append(
            f"{j['name']:<28} {j['status']:<10} {j['world_size']:>5}  {j['strategy']:<9} "
            f"{j['owner']:<10} {j['queue']:<10} {j['priority']:>4}  "
            f"{j['submitted']:<10} {j['ran']:>9}  {j['note']}".rstrip()
        )
    return "\n".join(lines)


def _job_row(record: dict[str, Any], now: float | None) -> dict[str, Any]:
    now = time.time() if now is None else now
    spec = record.get("spec") or {}
    status = record.get("status", "?")
    started, ended = record.get("started"), record.get("ended")
    ran = fmt_duration((ended or now) - started) if started else "—"
    note = record.get("reason") or ""
    if status == "FAILED" and record.get("error"):
        e = record["error"]
        note = f"rank {e.get('rank')}: {e.get('type')}: {e.get('message')}"
    submitted = record.get("submitted")
    return {
        "name": record.get("name", "?"),
        "status": status,
        "badge": badge(status),
        "world_size": spec.get("world_size", "?"),
        "strategy": what_runs(spec),
        "owner": spec.get("owner") or "—",
        "queue": spec.get("queue") or "—",
        "priority": "—" if spec.get("priority") is None else spec["priority"],
        "submitted": time.strftime("%H:%M:%S", time.localtime(submitted)) if submitted else "—",
        "ran": ran,
        "note": note[:120],
    }


def cluster_model(
    *,
    kind: str,
    address: str,
    slots: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    samples: dict[str, dict[str, Any]],
    closed: bool = False,
) -> dict[str, Any]:
    """The JSON model of the cluster dashboard: slots with device bars, and jobs.

    ``samples`` maps a worker address to the newest system sample of the rank
    it runs (idle slots have none).
    """
    by_id = {j["id"]: j for j in jobs}
    kinds = sorted({s["kind"] for s in slots})
    hosts = sorted({s["host"] for s in slots})
    gpu = "cuda" in kinds
    rows = []
    for s in slots:
        job = by_id.get(s.get("job") or "")
        sample = samples.get(s["worker"]) or {}
        rows.append(
            {
                "label": f"GPU {s['index']}" if s["kind"] == "cuda" else "CPU slot",
                "host": s["host"],
                "worker": s["worker"],
                "job": job["name"] if job else None,
                "status": job["status"] if job else None,
                **_bars(sample),
            }
        )
    busy = sum(1 for r in rows if r["job"])
    summary = (
        f"{len(slots)} {'GPU' if gpu else 'CPU'} slot{'s' if len(slots) != 1 else ''} "
        f"on {len(hosts)} host{'s' if len(hosts) != 1 else ''} · {busy} busy · "
        f"{sum(1 for j in jobs if j['status'] not in ('FINISHED', 'FAILED', 'STOPPED'))} "
        f"active job(s)"
    )
    return {
        "kind": kind,
        "address": address,
        "closed": closed,
        "summary": summary,
        "gpu": gpu,
        "slots": rows,
        "jobs": jobs,
    }


def _bars(sample: dict[str, Any]) -> dict[str, Any]:
    if sample.get("source") == "nvml":
        util = sample.get("gpu_util")
        used, total = sample.get("gpu_mem_used"), sample.get("gpu_mem_total")
        return {
            "util": _bar(util, f"{util:.0f}%") if util is not None else None,
            "mem": _bar(100 * used / total, f"{used / GIB:.1f} / {total / GIB:.0f} GiB")
            if used is not None and total
            else None,
        }
    if sample.get("source") == "psutil":
        cpu, used, total = (
            sample.get("cpu_percent"),
            sample.get("mem_used"),
            sample.get("mem_total"),
        )
        return {
            "util": _bar(cpu, f"{cpu:.0f}% host CPU") if cpu is not None else None,
            "mem": _bar(100 * used / total, f"{used / GIB:.1f} / {total / GIB:.0f} GiB host")
            if used is not None and total
            else None,
        }
    return {"util": None, "mem": None}


def _bar(percent: float, text: str) -> dict[str, Any]:
    percent = max(0.0, min(float(percent), 100.0))
    color = "#16a34a" if percent < 70 else "#d97706" if percent < 90 else "#dc2626"
    return {"percent": round(percent, 1), "text": text, "color": color}


def cluster_html(model: dict[str, Any]) -> str:
    gpu = model["gpu"]
    slots = [{**s, "badge": badge(s["status"]) if s["status"] else ""} for s in model["slots"]]
    return template("cluster.html.j2").render(
        **{**model, "slots": slots},
        util_label="GPU utilisation" if gpu else "CPU (no GPU)",
        mem_label="GPU memory" if gpu else "host memory (no GPU)",
        note=""
        if gpu
        else "No GPU on these workers: the bars show host CPU and memory (psutil), "
        "sampled by the ranks of running jobs.",
        jobs_table=Markup(jobs_html(model["jobs"])),
    )


def cluster_text(model: dict[str, Any]) -> str:
    if model["closed"]:
        return f"Cluster {model['kind']} {model['address']} (closed)"
    lines = [f"Cluster {model['kind']} {model['address']}: {model['summary']}"]
    for s in model["slots"]:
        util = s["util"]["text"] if s["util"] else ""
        lines.append(f"  {s['label']:<9} {s['host']:<16} {s['job'] or 'idle':<28} {util}".rstrip())
    if model["jobs"]:
        lines.append(jobs_text(model["jobs"]))
    return "\n".join(lines)


class JobsTable:
    """Job records that display as a table (``%jobs``): HTML in Jupyter, text elsewhere."""

    def __init__(self, records: Iterable[dict[str, Any]]):
        self.records = list(records)

    def _repr_html_(self) -> str:
        return jobs_html(self.records)

    def __repr__(self) -> str:
        return jobs_text(self.records)
