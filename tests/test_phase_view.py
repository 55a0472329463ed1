"""The straggler view's data model (widgets/phases.py) and its HTML, without a cluster."""

from __future__ import annotations

import re

from clustersdk.protocol import PHASES
from clustersdk.widgets.model import JobView
from clustersdk.widgets.phases import LINES_UP_TO, PhaseView
from clustersdk.widgets.render import job_html
from clustersdk.widgets.straggler import phases_html


def _row(step, compute, sync=0.0, data=0.001):
    values = {"data": data, "compute": compute, "optimizer": 0.002, "checkpoint": 0.0, "sync": sync}
    values["total"] = sum(values.values())
    return [step, *(values[p] for p in PHASES)]


def _feed(view, ranks, steps, slow=None):
    for rank in range(ranks):
        # the slow rank computes 3x longer; its peers then wait for it at the sync
        view.add(
            rank,
            [
                _row(s, 0.03 if rank == slow else 0.01, 0.0 if rank == slow else 0.02)
                for s in range(steps)
            ],
        )


def test_bands_aggregate_every_rank_and_the_slowest_rank_is_named():
    view = PhaseView(world_size=4)
    _feed(view, 4, 20, slow=2)
    band = view.band("compute")
    assert band["steps"] == list(range(20))
    assert band["min"] == [0.01] * 20 and band["max"] == [0.03] * 20
    assert band["mean"][0] == sum([0.01, 0.01, 0.03, 0.01]) / 4
    slow = view.slowest()
    assert slow["rank"] == 2 and slow["ratio"] > 2  # its own work, not the peers' wait
    assert view.mode == "lines" and sorted(view.lines("total")) == [0, 1, 2, 3]


def test_at_64_ranks_a_heatmap_replaces_the_lines_and_stays_small():
    view = PhaseView(world_size=64)
    _feed(view, 64, 300, slow=41)
    assert view.mode == "heatmap"
    heat = view.heatmap("compute", columns=60)
    assert len(heat["values"]) == 64 and all(len(row) == 60 for row in heat["values"])
    assert heat["steps"][:2] == [0, 5]  # 300 steps in bins of 5
    hottest = max(range(64), key=lambda r: heat["values"][r][0])
    assert hottest == 41 and view.slowest()["rank"] == 41
    html = phases_html(view)
    assert "slowest: <b>rank 41</b>" in html
    assert html.count("<polyline") == len(PHASES)  # one aggregated line per phase, not 64 each
    assert len(re.findall("<rect", html)) == 64 * 60


def test_up_to_eight_ranks_draw_one_line_each():
    view = PhaseView(world_size=LINES_UP_TO)
    _feed(view, LINES_UP_TO, 10)
    html = phases_html(view)
    assert "<rect" not in html and html.count("<polyline") == len(PHASES) + LINES_UP_TO


def test_the_view_keeps_the_newest_steps_in_order_and_rows_read_twice_count_once():
    view = PhaseView(world_size=2, keep=50)
    _feed(view, 2, 120)
    assert len(view) == 50 and view.band("total")["steps"] == list(range(70, 120))
    view.add(0, [_row(119, 0.5)])  # the same step again (journal, then event): replaced
    assert len(view) == 50 and view.band("compute")["max"][-1] == 0.5
    view.add(1, [_row(10, 0.5)])  # older than anything kept: ignored
    assert view.band("total")["steps"][0] == 70
    view.roll_back(100)
    assert view.band("total")["steps"][-1] == 99


def test_a_job_view_takes_phases_from_events_and_the_journal():
    view = JobView(name="a", world_size=2, strategy="ddp", status="RUNNING")
    view.load_phases([{"rank": 0, "step": 0, **dict(zip(PHASES, _row(0, 0.01)[1:]))}])
    view.apply(
        {
            "kind": "metrics",
            "rank": 1,
            "rows": [],
            "logs": [],
            "system": [],
            "phases": [_row(0, 0.02), _row(1, 0.02)],
        }
    )
    assert "phases" in view.take_dirty()
    assert view.phases.band("compute") == {
        "steps": [0, 1],
        "min": [0.01, 0.02],
        "mean": [0.015, 0.02],
        "max": [0.02, 0.02],
    }
    assert view.phases.slowest()["rank"] == 1
    assert "Step phases, 2 ranks" in job_html(view)
    view.set_status("RUNNING", {"spec": {"world_size": 1}})  # resumed at one rank
    assert view.phases.lines("total").keys() == {0}
