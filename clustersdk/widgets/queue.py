"""``cluster.queue()``'s text and table: the queues of a shared cluster.

Pure: it renders the model the control plane answers (see
:func:`clustersdk.control.placement.queue_view`), which a
:class:`clustersdk.cluster.base.QueueView` carries; ``clustersdk`` provides these
as the ``queue_text`` and ``queue_html`` hooks.
"""

from __future__ import annotations

import time
from typing import Any

from .render import badge, template


def _summary(data: dict[str, Any]) -> str:
    cap = data.get("per_user_cap")
    users = ", ".join(f"{u or '?'} {n}" for u, n in sorted(data.get("users", {}).items()))
    return (
        f"{data['slots']} slots, {data['free']} free"
        + (f" · per user at most {cap}" if cap else "")
        + (f" · in use by {users}" if users else "")
    )


def _quota(q: dict[str, Any]) -> str:
    limit = "no limit" if q["limit"] is None else f"at most {q['limit']}"
    return f"{q['guaranteed']} guaranteed, {limit}; {q['used']} in use"


def _rows(q: dict[str, Any], now: float) -> list[dict[str, Any]]:
    rows = []
    for j in q["holding"]:
        until = ""
        if j.get("ends_by"):
            until = f"time_limit ends in {max(0, j['ends_by'] - now) / 60:.0f} min"
        rows.append(
            {
                "name": j["name"],
                "owner": j["owner"],
                "priority": j["priority_name"],
                "slots": j["slots"],
                "status": j["status"].upper(),
                "note": until,
            }
        )
    for j in q["waiting"]:
        note = j["reason"]
        if j.get("estimated_start"):
            note += f" (expected to start {_when(j['estimated_start'], now)})"
        rows.append(
            {
                "name": j["name"],
                "owner": j["owner"],
                "priority": j["priority_name"],
                "slots": j["world_size"],
                "status": "QUEUED",
                "note": note,
            }
        )
    return rows


def _when(t: float, now: float) -> str:
    left = t - now
    if left <= 0:
        return "any moment now"
    return f"in {left / 60:.0f} min" if left >= 60 else f"in {left:.0f} s"


def queue_html(data: dict[str, Any], now: float | None = None) -> str:
    now = time.time() if now is None else now
    queues = [
        {
            "name": q["name"],
            "quota": _quota(q),
            "rows": [{**row, "badge": badge(row["status"])} for row in _rows(q, now)],
        }
        for q in data["queues"]
    ]
    return template("queue.html.j2").render(summary=_summary(data), queues=queues)


def queue_text(data: dict[str, Any], now: float | None = None) -> str:
    now = time.time() if now is None else now
    lines = [_summary(data)]
    for q in data["queues"]:
        lines.append(f"queue {q['name']}: {_quota(q)}")
        for row in _rows(q, now):
            lines.append(
                f"  {row['name']:<24} {row['owner']:<10} {row['priority']:<8} "
                f"{row['slots']:>3}  {row['status']:<10} {row['note']}".rstrip()
            )
    return "\n".join(lines)
