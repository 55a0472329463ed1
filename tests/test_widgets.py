"""Dashboards: the pure view model, static HTML, and live widgets on a real cluster,
driven from Python the way a user's clicks drive them."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import clustersdk as cs
from clustersdk import widgets
from clustersdk.widgets import render
from clustersdk.widgets.cluster import ClusterDashboard
from clustersdk.widgets.format import fmt_duration, progress_text
from clustersdk.widgets.job import JobDashboard
from clustersdk.widgets.model import JobView
from clustersdk.widgets.pump import Pump
from clustersdk.widgets.series import Cutoff, RateMeter, Series

from . import workloads
from .helpers import wait_for

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def metrics(rank, step, t, **scalars):
    return {
        "kind": "metrics",
        "rows": [{"rank": rank, "step": step, "time": t, "scalars": scalars}],
        "logs": [],
        "system": [],
    }


# the view model (pure) ----------------------------------------------------------------------
def test_series_stays_bounded_covers_the_run_and_ends_at_the_newest_point():
    s = Series(cap=100)
    for i in range(100_000):
        s.append(float(i), float(i) * 2)
    xs, ys = s.points()
    assert len(xs) <= 102
    assert xs[0] == 0.0 and xs[-1] == 99_999.0 and ys[-1] == 199_998.0
    gaps = [b - a for a, b in zip(xs, xs[1:-1])]
    assert max(gaps) == min(gaps)  # evenly thinned, no hole in the history


def test_series_rewinds_when_a_job_resumes_from_an_older_step():
    s = Series()
    for i in range(10):
        s.append(float(i), 1.0)
    s.append(6.0, 0.5)  # resumed from the checkpoint of step 6
    xs, ys = s.points()
    assert xs == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0] and ys[-1] == 0.5


def test_a_rollback_drops_the_rows_a_restart_will_replay():
    view = JobView(name="j", world_size=2, strategy="ddp", status="RUNNING")
    for rank in (0, 1):
        view.apply(
            {
                "kind": "metrics",
                "rows": [
                    {
                        "rank": rank,
                        "step": step,
                        "time": 1.0 + step,
                        "scalars": {"loss": 1.0 / (step + 1)},
                    }
                    for step in range(rank * 2, 10)
                ],
            }
        )
    view.apply({"kind": "rollback", "step": 4})  # restarted from the checkpoint of step 4
    assert [view.scalars["loss"][r].points()[0] for r in (0, 1)] == [
        [0.0, 1.0, 2.0, 3.0],
        [2.0, 3.0],
    ]
    assert view.last_row == {}  # no rank's newest row survives the rollback


def test_rate_meter_measures_steps_per_second_over_windows():
    meter = RateMeter(window=1.0)
    rates = [meter.add(step, step * 0.01) for step in range(301)]
    measured = [r for r in rates if r is not None]
    assert measured == pytest.approx([100.0, 100.0, 100.0])


def test_cutoff_drops_what_the_journal_already_gave_even_with_equal_times():
    cut = Cutoff()
    for t in (1.0, 2.0, 2.0):  # two lines of one print share a time
        cut.load(0, t)
    assert [cut.fresh(0, t) for t in (1.0, 2.0, 2.0, 2.0, 3.0)] == [False, False, False, True, True]
    assert cut.fresh(1, 0.5)  # nothing loaded for rank 1


def test_view_takes_events_and_history_alike_without_duplicates():
    view = JobView(name="a", world_size=2, strategy="ddp", status="RUNNING", started=100.0)
    view.load_history(
        [
            {"seq": 1, "rank": 0, "step": 0, "time": 100.5, "loss": 2.0},
            {"seq": 2, "rank": 0, "step": 1, "time": 101.0, "loss": 1.5},
        ]
    )
    view.apply(metrics(0, 1, 101.0, loss=1.5))  # the same row, delivered again as an event
    view.apply(metrics(0, 2, 101.5, loss=1.0))
    view.apply(metrics(1, 2, 101.6, loss=1.1))
    assert view.scalars["loss"][0].points() == ([0.0, 1.0, 2.0], [2.0, 1.5, 1.0])
    assert view.ranks == {0, 1}
    assert view.steps_done() == 3
    assert {"scalars", "progress", "ranks"} <= view.take_dirty()
    assert view.take_dirty() == set()


def test_progress_shows_eta_only_when_the_total_is_known():
    view = JobView(name="a", world_size=1, strategy="ddp", status="RUNNING", started=0.0)
    for step in range(201):
        view.apply(metrics(0, step, step * 0.01, loss=1.0))
    p = view.progress(now=2.0)
    assert p["eta"] is None and p["rate"] == pytest.approx(100.0)
    assert progress_text(p) == "step 201 · 100 steps/s · 2.0 s elapsed"
    view.apply({"kind": "status", "status": "RUNNING", "total_steps": 1201})
    p = view.progress(now=2.0)
    assert p["eta"] == pytest.approx(10.0) and p["fraction"] == pytest.approx(201 / 1201)
    assert "ETA 10 s" in progress_text(p)
    assert fmt_duration(185) == "3 min 05 s"


def test_psutil_samples_are_labelled_as_cpu_never_as_gpu():
    view = JobView(name="a", world_size=1, strategy="ddp", status="RUNNING", started=0.0)
    view.apply(
        {
            "kind": "metrics",
            "rows": [],
            "logs": [],
            "system": [
                {
                    "rank": 0,
                    "time": 1.0,
                    "sample": {
                        "source": "psutil",
                        "cpu_percent": 50.0,
                        "mem_used": 1e9,
                        "mem_total": 8e9,
                        "rss": 2**30,
                        "net_sent_per_s": 1e6,
                        "net_recv_per_s": 1e6,
                    },
                }
            ],
        }
    )
    assert sorted(view.system) == ["cpu", "net", "rss"]
    assert view.system["rss"][0].points() == ([1.0], [1.0])
    html = render.job_html(view)
    assert "no GPU" in html and "GPU util" not in html


def test_static_html_escapes_and_shows_the_failed_ranks_traceback():
    error = {
        "rank": 1,
        "type": "ValueError",
        "message": "bad <b>",
        "traceback": "Traceback ...\nValueError: bad <b>",
    }
    view = JobView(name="a", world_size=2, strategy="ddp", status="FAILED", error=error)
    html = render.job_html(view)
    assert "rank 1 raised ValueError" in html and "bad &lt;b&gt;" in html and "<b>" not in html
    assert "FAILED" in html


def test_who_launched_a_job_its_queue_and_priority_are_shown():
    record = {
        "id": "j",
        "name": "big<run>",
        "status": "QUEUED",
        "reason": "preempted by job 'x'",
        "spec": {
            "world_size": 4,
            "strategy": "ddp",
            "owner": "alice",
            "queue": "research",
            "priority": 100,
            "preemptible": False,
        },
    }
    html = render.job_html(JobView.from_record(record))
    assert "alice · queue research · priority 100 · not preemptible" in html
    assert "big&lt;run&gt;" in html and "preempted by job" in html
    text = render.jobs_text([record], now=0)
    assert text.splitlines()[0].split()[4:7] == ["owner", "queue", "prio"]
    assert text.splitlines()[1].split()[4:7] == ["alice", "research", "100"]
    assert ">research<" in render.jobs_html([record], now=0)


def test_a_hung_job_shows_where_each_rank_was():
    stacks = {
        "0": {
            "rank": 0,
            "step": 5,
            "phase": "control",
            "answered": True,
            "text": '  File "train.py", line 3, in train <all_reduce>',
        },
        "1": {"rank": 1, "answered": False, "text": "worker tcp://w1 did not answer"},
    }
    record = {
        "id": "j",
        "name": "a",
        "status": "HUNG",
        "reason": "hung: no rank has finished",
        "stacks": stacks,
        "spec": {"world_size": 2, "strategy": "ddp"},
    }
    html = render.job_html(JobView.from_record(record))
    assert "HUNG" in html and "hung: no rank has finished" in html
    assert "rank 0 · step 5 · control" in html and "&lt;all_reduce&gt;" in html
    assert "rank 1 · no answer" in html and "did not answer" in html
    assert "Where each rank was" not in render.job_html(
        JobView.from_record({**record, "status": "RUNNING", "stacks": {}})
    )


def test_the_newest_durable_events_are_shown():
    events = [
        {
            "time": float(i),
            "step": 10 * i,
            "kind": "restarted",
            "message": f"worker tcp://w{i} (host h) of rank 1 left the cluster",
        }
        for i in range(5)
    ]
    record = {
        "id": "j",
        "name": "a",
        "status": "RUNNING",
        "reason": "",
        "events": events,
        "spec": {"world_size": 2, "strategy": "ddp"},
    }
    view = JobView.from_record(record)
    html = render.job_html(view)
    assert "step 40 · restarted: worker tcp://w4" in html and "tcp://w1 " not in html  # last 3
    view.take_dirty()
    view.set_status(
        "RUNNING",
        {
            **record,
            "events": [
                *events,
                {"time": 9.0, "step": None, "kind": "failed", "message": "rank 0: E: boom"},
            ],
        },
    )
    assert "status" in view.take_dirty() and "failed: rank 0: E: boom" in render.job_html(view)


def test_a_restarting_job_says_why():
    reason = "worker tcp://a:1 (host a) of rank 1 left the cluster; restart 1 of 3: the other ranks stop first"
    view = JobView(name="a", world_size=2, strategy="ddp", status="RESTARTING", reason=reason)
    html = render.job_html(view)
    assert "RESTARTING" in html and "restart 1 of 3" in html
    view.set_status("RUNNING", {"reason": ""})
    assert "restart 1 of 3" not in render.job_html(view)


def test_the_newest_diagnosis_is_shown_with_its_advice_and_spikes_are_marked():
    spike = {
        "kind": "loss_spike",
        "summary": "loss spike at step 3 on rank 0: 9 against a median of 1",
        "advice": "look at the batch of that step",
        "step": 3,
        "rank": 0,
        "data": {"value": 9.0},
    }
    record = {
        "id": "j",
        "name": "a",
        "status": "RUNNING",
        "reason": "",
        "spec": {"world_size": 1, "strategy": "ddp"},
        "events": [
            {
                "time": 1.0,
                "step": 3,
                "kind": "diagnosis",
                "message": spike["summary"],
                "diagnosis": spike,
            }
        ],
    }
    view = JobView.from_record(record)
    view.load_history(
        [
            {"seq": i + 1, "rank": 0, "step": i, "time": float(i), "loss": 9.0 if i == 3 else 1.0}
            for i in range(6)
        ]
    )
    assert view.markers("loss") == ([3.0], [9.0]) and view.markers("lr") == ([], [])
    html = render.job_html(view)
    assert "Diagnosis:</strong> step 3 · loss spike at step 3" in html
    assert "What to do:</strong> look at the batch" in html
    assert html.count("<title>loss spike</title>") == 1
    assert "diagnosis: step 3 · loss spike" in render.job_text(view, "<Job 'a'>")
    view.take_dirty()
    oom = {
        "kind": "cuda_oom",
        "summary": "CUDA out of memory on rank 0",
        "advice": "lower the micro-batch",
        "step": None,
    }
    view.apply({"kind": "diagnosis", "diagnosis": oom})  # live, before the record has it
    assert "diagnosis" in view.take_dirty() and view.diagnoses == [spike, oom]
    html = render.job_html(view)
    assert "CUDA out of memory on rank 0" in html and "1 earlier: job.diagnoses()" in html
    assert "#dc2626" in render.diagnosis_html(view.diagnoses)  # a failure's red
    assert render.diagnosis_html([]) == ""


def test_chart_axes_never_zoom_into_a_sliver_and_a_line_starts_at_the_second_point():
    """The reported chart: one throughput point drawn on an axis from 33.815 to 33.820."""
    from clustersdk.widgets.charts import LineChart

    rate = LineChart("Throughput (steps/s)", x_label="time (s)", x_min=0.0, legend=False)
    rate.set(0, [0.9], [33.8175])
    line = rate.lines[0]
    assert line.marker == "circle"  # one point: a dot, on an axis from 0
    assert (rate.y_scale.min, rate.y_scale.max) == (0.0, 33.8175)
    assert (rate.x_scale.min, rate.x_scale.max) == (0.0, 0.9)
    assert list(rate.y_axis.tick_values) == [0.0, 10.0, 20.0, 30.0]
    rate.set(0, [0.9, 1.9], [33.8175, 33.82])
    assert line.marker is None  # two points: a line, still from 0
    assert (rate.y_scale.min, rate.y_scale.max) == (0.0, 33.82)
    assert (rate.x_scale.min, rate.x_scale.max) == (0.0, 1.9)

    loss = LineChart("loss", x_label="step", x_min=0.0)
    loss.set(0, [0.0], [2.5])  # step 0: no x range, no y range of its own
    assert loss.lines[0].marker == "circle"
    assert (loss.x_scale.min, loss.x_scale.max) == (0.0, 1.0)
    assert (loss.y_scale.min, loss.y_scale.max) == (2.25, 2.75)  # +-10% of the level
    loss.set(0, [0.0, 1.0], [2.5, 2.5001])
    assert loss.lines[0].marker is None
    assert (loss.y_scale.min, loss.y_scale.max) == pytest.approx((2.25004, 2.75006))
    loss.set(0, [0.0, 1.0, 2.0], [2.5, 2.5001, 0.4])  # a real drop: the data's own range
    assert (loss.y_scale.min, loss.y_scale.max) == (0.4, 2.5001)
    loss.retitle("tokens_per_s")  # another metric, a throughput: from 0
    assert (loss.y_scale.min, loss.y_scale.max) == (0.0, 2.5001)


def test_cluster_model_bars_and_text():
    slots = [
        {"worker": "tcp://a:1", "host": "a", "kind": "cuda", "index": 0, "job": "j1"},
        {"worker": "tcp://a:2", "host": "a", "kind": "cuda", "index": 1, "job": None},
    ]
    jobs = [
        {
            "id": "j1",
            "name": "train",
            "status": "RUNNING",
            "spec": {"world_size": 1, "strategy": "ddp"},
            "submitted": 0.0,
            "started": 1.0,
            "ended": None,
            "reason": "",
        }
    ]
    samples = {
        "tcp://a:1": {
            "source": "nvml",
            "gpu_util": 93.0,
            "gpu_mem_used": 30 * 2**30,
            "gpu_mem_total": 80 * 2**30,
        }
    }
    model = render.cluster_model(
        kind="ssh", address="tcp://a:8786", slots=slots, jobs=jobs, samples=samples
    )
    assert model["slots"][0]["util"]["percent"] == 93.0 and model["slots"][1]["util"] is None
    html = render.cluster_html(model)
    assert "GPU 0" in html and "93%" in html and "30.0 / 80 GiB" in html and "idle" in html
    text = render.cluster_text(model)
    assert "2 GPU slots on 1 host · 1 busy · 1 active job(s)" in text and "train" in text


def test_pump_coalesces_bursts_and_survives_a_failing_target():
    class Target:
        def __init__(self):
            self.times = []

        def flush(self):
            self.times.append(time.monotonic())

    class Broken:
        def flush(self):
            raise RuntimeError("boom")

    pump, target = Pump(interval=0.1), Target()
    pump.request(Broken())
    start = time.monotonic()
    while time.monotonic() - start < 1.0:  # a burst: 1000s of requests a second
        pump.request(target)
        time.sleep(0.0005)
    time.sleep(0.15)
    # about 10 per second, not 1000s (fewer when a loaded box wakes the thread late)
    assert 6 <= len(target.times) <= 12
    assert target.times[0] - start < 0.09  # the first one at once, not an interval later
    gaps = [b - a for a, b in zip(target.times, target.times[1:])]
    assert min(gaps) >= 0.095


# live dashboards on a real cluster --------------------------------------------------------
@pytest.fixture
def show(monkeypatch):
    """Pretend we run in a Jupyter kernel, so that displays carry the live widget."""
    monkeypatch.setattr(widgets, "widgets_available", lambda: True)


def test_new_metrics_reach_the_plot_model_within_a_second(idle):
    job = idle.launch(workloads.spin, kwargs={"sleep": 0.005}, world_size=2, name="live-plot")
    dash = JobDashboard(job)
    seen: list[tuple[float, float]] = []  # (when the chart model had it, step)
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        line = dash.charts["loss"].lines.get(0)
        if line is not None and len(line.x) and (not seen or line.x[-1] != seen[-1][1]):
            seen.append((time.time(), float(line.x[-1])))
        time.sleep(0.01)
    job.stop()
    assert len(seen) >= 10, "the chart did not keep updating"
    logged = {row["step"]: row["time"] for row in job.history() if row["rank"] == 0}
    delays = [when - logged[int(step)] for when, step in seen[1:]]
    assert max(delays) < 1.0, f"ctx.log -> plot model took up to {max(delays):.2f} s"
    assert dash.charts["loss"].figure.title == "value"  # the logged scalar, named
    assert set(dash.charts["loss"].lines) == {0, 1}
    assert {"cpu", "rss", "net"} <= set(dash.charts)  # no GPU here: CPU charts, labelled
    assert "no GPU" in dash.charts["cpu"].title


def test_stop_button_stops_the_job_and_greys_out_the_controls(idle):
    job = idle.launch(workloads.spin, world_size=2, name="stop-by-click")
    dash = JobDashboard(job)
    wait_for(lambda: dash.view.status == "RUNNING")
    assert not dash.buttons["stop"].disabled and dash.buttons["resume"].disabled
    dash.buttons["stop"].click()
    wait_for(lambda: job.status is cs.JobStatus.STOPPED)
    wait_for(lambda: "STOPPED" in dash.header.value)
    assert all(b.disabled for b in dash.buttons.values())
    assert "stop requested" in dash.message.value


def test_the_header_links_the_clusters_dask_dashboard(idle):
    job = idle.launch(workloads.spin, world_size=1, name="dask-dashboard-link")
    try:
        dash = JobDashboard(job)
        link = idle.dashboard_link
        assert link is not None  # Cluster.local serves one by default
        assert f'href="{link}"' in dash.header.value and ">Dask dashboard</a>" in dash.header.value
        wait_for(lambda: "RUNNING" in dash.header.value)
        assert f'href="{link}"' in dash.header.value  # still there as the status changes
    finally:
        job.stop()
    dash.close()


def test_pause_and_resume_buttons(idle):
    job = idle.launch(workloads.spin, world_size=2, name="pause-by-click")
    dash = JobDashboard(job)
    wait_for(lambda: dash.view.status == "RUNNING")
    dash.buttons["pause"].click()
    wait_for(lambda: job.status is cs.JobStatus.PAUSED)
    wait_for(lambda: "PAUSED" in dash.header.value and "paused before step" in dash.message.value)
    assert dash.buttons["pause"].disabled and not dash.buttons["resume"].disabled
    steps = dash.view.steps_done()
    time.sleep(0.5)
    assert dash.view.steps_done() == steps  # paused means no new steps
    dash.buttons["resume"].click()
    wait_for(lambda: job.status is cs.JobStatus.RUNNING)
    wait_for(lambda: dash.view.steps_done() > steps)
    job.stop()


def test_checkpoint_and_suspend_buttons(idle, tmp_path):
    job = idle.launch(
        workloads.train_ckpt,
        kwargs={"steps": 100_000, "delay": 0.01},
        world_size=2,
        name="ckpt-by-click",
        checkpoint_dir=str(tmp_path / "ck"),
    )
    dash = JobDashboard(job)
    wait_for(lambda: dash.view.status == "RUNNING")
    dash.buttons["checkpoint"].click()
    wait_for(lambda: "checkpoint saved" in dash.message.value, timeout=60)
    dash.buttons["suspend"].click()
    wait_for(lambda: job.status is cs.JobStatus.SUSPENDED, timeout=60)
    wait_for(lambda: "SUSPENDED" in dash.header.value and "last checkpoint" in dash.header.value)
    assert not dash.buttons["resume"].disabled and dash.buttons["pause"].disabled
    job.stop()


def test_checkpoint_needs_a_checkpoint_dir(idle):
    job = idle.launch(workloads.spin, world_size=1, name="no-ckpt-dir")
    dash = JobDashboard(job)
    wait_for(lambda: dash.view.status == "RUNNING")
    assert (
        dash.buttons["checkpoint"].disabled
        and "checkpoint_dir" in dash.buttons["checkpoint"].tooltip
    )
    job.stop()


def test_failed_rank_shows_its_remote_traceback(idle):
    job = idle.launch(workloads.fail_at, kwargs={"rank": 1, "step": 3}, world_size=2, timeout=10)
    dash = JobDashboard(job)
    with pytest.raises(cs.JobFailedError):
        job.wait(timeout=60)
    wait_for(lambda: dash.error.layout.display != "none")
    assert "rank 1 raised ValueError" in dash.error.value
    assert "boom at step 3 on rank 1" in dash.error.value and "in fail_at" in dash.error.value
    assert "FAILED" in dash.html() and "rank 1 raised ValueError" in dash.text(repr(job))


def test_log_tail_follows_the_selected_rank(idle):
    job = idle.launch(workloads.chatty, world_size=2)
    dash = JobDashboard(job)
    job.wait(timeout=60)
    wait_for(lambda: "hello from rank 0 of 2" in dash.log.value)
    assert [label for label, _ in dash.rank.options] == ["rank 0", "rank 1"]
    dash.rank.value = 1  # rank 1's lines may reach the dashboard a moment after rank 0's
    wait_for(lambda: "hello from rank 1 of 2" in dash.log.value)
    assert "rank 0 of 2" not in dash.log.value
    assert "a warning from rank 1" in dash.log.value


def test_redisplay_is_the_same_widget_and_attach_shows_the_history(idle, show):
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 30}, world_size=2, name="redisplay")
    first = job._repr_mimebundle_()
    job.wait(timeout=60)
    second = job._repr_mimebundle_()
    assert first[WIDGET_MIME]["model_id"] == second[WIDGET_MIME]["model_id"]
    assert {"text/html", "text/plain"} <= set(second)
    attached = cs.Job.attach(idle, "redisplay")
    dash = widgets.dashboard(attached)
    assert dash is not widgets.dashboard(job)
    for rank in (0, 1):
        assert list(dash.charts["loss"].lines[rank].x) == [float(s) for s in range(30)]
    assert "FINISHED" in dash.header.value and "step 30" in dash.progress_label.value


def test_without_ipywidgets_the_display_is_static_html(idle, monkeypatch):
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 5}, world_size=1, name="static")
    job.wait(timeout=60)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # as if not installed
    assert not widgets.widgets_available()
    bundle = job._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain"}
    assert "Job static" in bundle["text/html"] and "FINISHED" in bundle["text/html"]
    assert "<polyline" in bundle["text/html"]  # the loss as a sparkline
    assert bundle["text/plain"].startswith("<Job 'static' FINISHED")
    cluster_bundle = idle._repr_mimebundle_()
    assert set(cluster_bundle) == {"text/html", "text/plain"}
    assert "static" in cluster_bundle["text/html"]


def test_cluster_dashboard_shows_slots_and_jobs_live(idle, show):
    dash = ClusterDashboard(idle, refresh=0.2)
    try:
        assert "idle" in dash.body.value
        job = idle.launch(workloads.spin, world_size=2, name="on-the-cluster")
        wait_for(lambda: "on-the-cluster" in dash.body.value and "host CPU" in dash.body.value)
        job.stop()
        wait_for(lambda: "STOPPED" in dash.body.value)
    finally:
        dash.close()
    bundle = idle._repr_mimebundle_()
    assert WIDGET_MIME in bundle and "2 CPU slots on 1 host" in bundle["text/plain"]


def test_events_never_raise_into_dasks_thread(idle):
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 3}, world_size=1)
    dash = JobDashboard(job)
    errors = []

    def deliver():  # as Dask's thread would: a None and a malformed metrics message
        try:
            for msg in (None, {"kind": "metrics", "rows": [{}]}):
                dash._on_event(msg)
        except Exception as e:  # what would have reached Dask's event loop
            errors.append(e)

    t = threading.Thread(target=deliver)
    t.start()
    t.join()
    assert not errors
    job.wait(timeout=60)
    wait_for(lambda: "FINISHED" in dash.header.value)  # a bad message did not stop the dashboard


@pytest.mark.slow
def test_telemetry_benchmark_smoke(tmp_path):
    """benchmarks/telemetry.py runs end to end and reports both of its numbers."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "telemetry.py"
    out = tmp_path / "telemetry.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--repeats", "1", "--steps", "150", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratio" in proc.stdout and "p50 / p95" in proc.stdout
    assert "with phase timing" in proc.stdout and "while capturing" in proc.stdout
    summary = json.loads(out.read_text())
    assert summary["steps_per_s_on"] > 0 and summary["steps_per_s_off"] > 0
    assert summary["rows"] > 0 and summary["delay_p95_ms"] < 5000
    assert summary["phase_ratio"] > 0 and summary["phase_in_process_ratio"] > 0
    assert summary["profile"]["steps"] > 0 and summary["profile"]["trace_mb"] > 0


def test_closing_a_dashboard_closes_its_widgets_and_no_others(idle):
    import ipywidgets

    bystander = ipywidgets.IntSlider()
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 5}, world_size=1)
    dash = JobDashboard(job)
    job.wait(timeout=60)
    wait_for(lambda: 0 in dash.charts["loss"].lines)
    parts = [
        dash.widget,
        dash.header,
        dash.buttons["stop"],
        dash.charts["loss"].figure,
        dash.charts["loss"].lines[0],
        dash.charts["loss"].x_scale,
        dash.widget.layout,
    ]
    assert all(p.comm is not None for p in parts)
    dash.close()
    assert all(p.comm is None for p in parts)
    assert bystander.comm is not None
    dash._on_event({"kind": "status", "status": "RUNNING"})  # late events are ignored
    dash.flush()


def test_the_static_summary_draws_a_lone_point_as_a_dot_and_a_line_once_there_are_two():
    view = JobView(name="j", world_size=2, strategy="ddp", status="RUNNING")
    view.add_rows(
        [{"rank": r, "step": 0, "time": 1.0, "scalars": {"loss": 2.0 - r}} for r in (0, 1)]
    )
    html = render.job_html(view)
    assert html.count('r="2.5"') == 2  # a dot per rank: a polyline of one point is invisible
    view.add_rows([{"rank": 0, "step": 1, "time": 2.0, "scalars": {"loss": 1.5}}])
    html = render.job_html(view)
    assert html.count('r="2.5"') == 1  # rank 0 has a line now; rank 1 still one point
    (line,) = [line for line in render.sparkline("loss", view.scalars["loss"])["lines"][:1]]
    assert len(line["points"].split()) == 2 and line["dot"] is None
