"""Text, CSV and JSON for the job commands: pure functions of job records and rows.

>>> print(table([["a", "RUNNING"]], ["NAME", "STATUS"]))
NAME  STATUS
a     RUNNING
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..control import goodput
from ..protocol import what_runs

_ROW_KEYS = ("seq", "rank", "step", "time")


def table(rows: Sequence[Sequence[str]], headers: Sequence[str]) -> str:
    """Left-aligned columns, two spaces apart (the last column is not padded)."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def ago(then: float | None, now: float | None = None) -> str:
    """``5s``, ``3m``, ``2h``, ``4d`` since ``then``; ``-`` when unknown.

    >>> ago(100.0, now=400.0)
    '5m'
    """
    if then is None:
        return "-"
    seconds = max((time.time() if now is None else now) - then, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


JOB_HEADERS = ["NAME", "ID", "STATUS", "RANKS", "STRATEGY", "OWNER", "SUBMITTED", "CLUSTER"]


def job_row(record: Mapping[str, Any], cluster: str, now: float | None = None) -> list[str]:
    """One line of ``clustersdk jobs``."""
    spec = record.get("spec") or {}
    return [
        record["name"],
        record["id"],
        record["status"],
        str(spec.get("world_size", "?")),
        what_runs(spec),
        str(spec.get("owner") or "-"),
        f"{ago(record.get('submitted'), now)} ago",
        cluster,
    ]


def progress(rows: Iterable[Mapping[str, Any]], total_steps: int | None) -> dict[str, Any]:
    """Where a job is, from its history rows: steps done (the furthest rank), the total,
    and each scalar's mean over the ranks' newest rows.

    >>> progress([{"rank": 0, "step": 4, "loss": 1.0}, {"rank": 1, "step": 4, "loss": 3.0}], 10)
    {'steps': 5, 'total_steps': 10, 'scalars': {'loss': 2.0}}
    """
    newest: dict[int, Mapping[str, Any]] = {}
    for row in rows:
        newest[row["rank"]] = row
    scalars: dict[str, float] = {}
    names = sorted({k for row in newest.values() for k in row if k not in _ROW_KEYS})
    for name in names:
        values = [row[name] for row in newest.values() if _finite(row.get(name))]
        if values:
            scalars[name] = sum(values) / len(values)
    steps = max((row["step"] + 1 for row in newest.values()), default=0)
    return {"steps": steps, "total_steps": total_steps, "scalars": scalars}


def show(record: Mapping[str, Any], cluster: str, done: Mapping[str, Any]) -> str:
    """``clustersdk show``: the record, its progress, its ranks and what went wrong."""
    fields = _fields(record, cluster, done)
    width = max(len(k) for k, _ in fields)
    lines = [f"{k + ':':<{width + 1}} {v}" for k, v in fields]
    ranks = record.get("ranks") or []
    if ranks:
        lines.append("ranks:")
        rows = [[str(r["rank"]), r["host"], r["device"], r["worker"]] for r in ranks]
        lines.extend(
            "  " + line for line in table(rows, ["RANK", "HOST", "DEVICE", "WORKER"]).splitlines()
        )
    diagnosis = record.get("diagnosis")
    if diagnosis:  # what went wrong, in a sentence, and what to do
        lines.append(f"diagnosis: {diagnosis.get('summary')}")
        lines.append(f"what to do: {diagnosis.get('advice')}")
    error = record.get("error")
    if error:
        lines.append(
            f"error: rank {error.get('rank')}: {error.get('type')}: {error.get('message')}"
        )
        if error.get("traceback"):
            lines.append(error["traceback"].rstrip())
    return "\n".join(lines)


def _fields(
    record: Mapping[str, Any], cluster: str, done: Mapping[str, Any]
) -> list[tuple[str, str]]:
    spec = record.get("spec") or {}
    total = done.get("total_steps")
    steps = f"{done['steps']}" + (f" / {total}" if total else "")
    scalars = "  ".join(f"{k}={v:.4g}" for k, v in done["scalars"].items())
    reason = f" ({record['reason']})" if record.get("reason") else ""
    fields = [
        ("name", record["name"]),
        ("id", record["id"]),
        ("cluster", cluster),
        ("status", record["status"] + reason),
        ("owner", spec.get("owner") or "-"),
        ("strategy", f"{what_runs(spec)} on {spec.get('world_size')} rank(s)"),
        ("steps", steps + (f"  {scalars}" if scalars else "")),
        ("submitted", moment(record.get("submitted"))),
        ("started", moment(record.get("started"))),
        ("ended", moment(record.get("ended"))),
    ]
    if record.get("paused_at") is not None and record["status"] == "PAUSED":
        fields.append(("paused", f"before step {record['paused_at']}"))
    if record.get("restarts"):
        fields.append(("restarts", f"{record['restarts']} of {spec.get('max_restarts', '?')}"))
    if spec.get("checkpoint_dir"):
        newest, step = record.get("checkpoint"), record.get("checkpoint_step")
        fields.append(
            (
                "checkpoint",
                (f"{newest}" + (f" (step {step})" if step is not None else ""))
                if newest
                else f"none yet in {spec['checkpoint_dir']}",
            )
        )
    if record.get("checkpoint_error"):
        fields.append(("checkpoint error", record["checkpoint_error"]))
    where = goodput.describe(record.get("goodput"))
    if where:
        fields.append(("goodput", where.removeprefix("goodput ")))
    return fields


def history_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """Every row as CSV: seq, rank, step, time, then each scalar (empty where not logged)."""
    names = sorted({k for row in rows for k in row if k not in _ROW_KEYS})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*_ROW_KEYS, *names])
    for row in rows:
        writer.writerow(
            [row.get(k, "") for k in _ROW_KEYS]
            + ["" if row.get(n) is None else row[n] for n in names]
        )
    return out.getvalue()


def history_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a table, scalars to 6 significant digits."""
    names = sorted({k for row in rows for k in row if k not in _ROW_KEYS})
    body = [
        [
            str(row["seq"]),
            str(row["rank"]),
            str(row["step"]),
            _clock(row["time"]),
            *(_number(row.get(n)) for n in names),
        ]
        for row in rows
    ]
    return table(body, ["SEQ", "RANK", "STEP", "TIME", *(n.upper() for n in names)])


def log_line(line: Mapping[str, Any], prefix: bool) -> str:
    """One log line, as the rank wrote it, with ``[rank N]`` in front when several ranks mix."""
    return f"[rank {line['rank']}] {line['text']}" if prefix else str(line["text"])


def unmarked(text: str) -> str:
    """A docstring as a terminal shows it: without reStructuredText's markup (double
    backquotes around literals, roles such as :class:, a paragraph's closing ::).

    >>> unmarked("Run ``clustersdk jobs`` (see :class:`~clustersdk.Job`)::")
    'Run clustersdk jobs (see clustersdk.Job):'
    """
    text = re.sub(r"``(.+?)``", r"\1", text, flags=re.DOTALL)
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)


def to_json(value: Any) -> str:
    """JSON for scripts; what JSON can't hold (bytes, NaN) becomes null or text."""
    return json.dumps(_plain(value), indent=None, sort_keys=True)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bytes, bytearray)):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any) -> str:
    return "" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def moment(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"
