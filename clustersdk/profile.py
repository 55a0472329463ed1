"""What ``job.profile(steps=N)`` returns: every rank's trace file and summary.

>>> profile = job.profile(steps=5)          # doctest: +SKIP
>>> profile                                 # per-rank table in a notebook    # doctest: +SKIP
>>> profile.traces                          # {rank: "/.../rank0.pt.trace.json"}  # doctest: +SKIP

Open a trace in https://ui.perfetto.dev (or ``chrome://tracing``), or point
TensorBoard at its directory (with the ``torch-tb-profiler`` plugin).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .job import Job


class Profile:
    """One profile request of a job: its ranks' summaries, as far as they have come."""

    def __init__(self, job: Job, entry: dict[str, Any]):
        self.job = job
        self._entry = entry

    @property
    def seq(self) -> int:
        return int(self._entry["seq"])

    @property
    def steps(self) -> int:
        """How many steps were asked for."""
        return int(self._entry["steps"])

    @property
    def complete(self) -> bool:
        """Every rank wrote its trace."""
        return bool(self._entry["complete"])

    @property
    def ranks(self) -> dict[int, dict[str, Any]]:
        """Each reporting rank's summary: first_step, steps, path, wall_s, data_wait_s,
        communication_s, compute_s, top_ops (or ``error``)."""
        return {int(r["rank"]): r for r in self._entry["ranks"]}

    @property
    def traces(self) -> dict[int, str]:
        """The Chrome trace JSON file of each rank (Perfetto and TensorBoard open them)."""
        return {rank: r["path"] for rank, r in self.ranks.items() if r.get("path")}

    @property
    def directory(self) -> str | None:
        paths = list(self.traces.values())
        if not paths:
            return None
        import os

        return os.path.dirname(paths[0])

    def wait(self, timeout: float | None = None) -> Profile:
        """Until every rank wrote its trace (or the job ended or restarted first)."""
        cluster = self.job.cluster
        self._entry = cluster.sync(cluster.control.profile_wait, self.job.id, self.seq,
                                   timeout=timeout)
        return self

    # --- display ----------------------------------------------------------------------------
    def summary(self, top: int = 5) -> str:
        """Per rank: the split of the profiled steps' time and the top operators."""
        lines = [self._headline()]
        for rank, r in sorted(self.ranks.items()):
            if r.get("error"):
                lines.append(f"  rank {rank}: failed: {r['error']}")
                continue
            lines.append(f"  rank {rank}: steps {r['first_step']}-{r['first_step'] + r['steps'] - 1}"
                         f"  {_split(r)}  trace {r['path']}")
            for op in r.get("top_ops", [])[:top]:
                lines.append(f"      {_ms(_self_time(op)):>9}  x{op['calls']:<5} {op['name']}")
        return "\n".join(lines)

    def _headline(self) -> str:
        n, ws = len(self.ranks), int(self._entry.get("world_size", 0))
        state = "complete" if self.complete else f"{n} of {ws} ranks reported"
        waiting = ("; starts when the job resumes" if self._entry.get("status") == "PAUSED"
                   and not n else "")
        return f"profile #{self.seq} of job {self.job.name!r}: {self.steps} steps, {state}{waiting}"

    def _repr_html_(self) -> str:
        rows = []
        for rank, r in sorted(self.ranks.items()):
            if r.get("error"):
                rows.append(f"<tr><td>{rank}</td><td colspan='5'>failed: "
                            f"{html.escape(r['error'])}</td></tr>")
                continue
            ops = "<br>".join(f"{_ms(_self_time(op))} &times;{op['calls']} "
                              f"<code>{html.escape(op['name'])}</code>"
                              for op in r.get("top_ops", [])[:5])
            wall = r["wall_s"] or 1.0
            bar = "".join(
                f"<span title='{label} {_ms(r[key])}' style='display:inline-block;height:10px;"
                f"width:{100 * r[key] / wall:.1f}px;background:{color}'></span>"
                for key, label, color in _PARTS)
            rows.append(f"<tr><td>{rank}</td><td>{r['first_step']}&ndash;"
                        f"{r['first_step'] + r['steps'] - 1}</td><td>{bar}<br>"
                        f"<small>{html.escape(_split(r))}</small></td><td>{ops}</td>"
                        f"<td><code>{html.escape(r['path'])}</code></td></tr>")
        return (f"<div><b>{html.escape(self._headline())}</b>"
                "<table><tr><th>rank</th><th>steps</th><th>time</th><th>top ops (self time)</th>"
                "<th>trace (Perfetto / TensorBoard)</th></tr>" + "".join(rows) + "</table></div>")

    def __repr__(self) -> str:
        return self.summary()


_PARTS = (("compute_s", "compute", "#2563eb"), ("communication_s", "communication", "#d97706"),
          ("data_wait_s", "data wait", "#dc2626"))


def _split(r: dict[str, Any]) -> str:
    wall = r["wall_s"] or 1.0
    return (f"{_ms(r['wall_s'])}: " + ", ".join(
        f"{label} {100 * r[key] / wall:.0f}%" for key, label, _ in _PARTS))


def _self_time(op: dict[str, Any]) -> float:
    return op["device_s"] or op["self_s"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
