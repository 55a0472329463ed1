"""Goodput end to end on four local slots: a job warned by a SIGTERM loses no step, the
same job's worker then killed outright loses the steps since its checkpoint, and the
record says so: where the wall time went, the buckets adding up to it, the lost steps
counted (issue 42). The bookkeeping's rules are tested in tests/control/test_goodput.py."""

from __future__ import annotations

import os
import signal

from jupyter_clustersdk import metrics

import clustersdk as cs

from . import workloads
from .helpers import Statuses, assert_bitwise, cli, rows, step_reached, wait_for

KW = {"kind": "mlp", "steps": 40, "global_batch": 24}


def pid_of(cluster: cs.Cluster, job: cs.Job, index: int) -> int:
    worker = [s["worker"] for s in cluster.slots() if s["job"] == job.id][index]
    return cluster.client.run(os.getpid, workers=[worker])[worker]


def test_a_notice_loses_no_step_a_kill_loses_the_steps_since_the_checkpoint(idle4, tmp_path):
    want = idle4.launch(workloads.train_exact, kwargs=KW, world_size=2)
    want_state, want_rows = want.wait(timeout=120), rows(want)
    job = idle4.launch(
        workloads.train_exact,
        kwargs={**KW, "delay": 0.1},
        world_size=2,
        checkpoint_dir=str(tmp_path),
        max_restarts=1,
    )
    seen = Statuses(job)
    wait_for(lambda: step_reached(job, 4), timeout=60)
    os.kill(pid_of(idle4, job, 1), signal.SIGTERM)  # warned: it moves first
    wait_for(lambda: seen.after("QUEUED")[-1:] == ["RUNNING"], timeout=60)  # on other slots
    noticed = job.info()
    checkpoint = noticed["checkpoint_step"]
    assert noticed["goodput"]["lost_steps"] == 0

    wait_for(lambda: step_reached(job, checkpoint + 6), timeout=60)
    at = max(r["step"] for r in job.history())
    os.kill(pid_of(idle4, job, 0), signal.SIGKILL)  # no warning: back to the checkpoint
    got = job.wait(timeout=120)
    assert_bitwise(got, want_state, KW["steps"])
    assert rows(job) == want_rows
    assert job.restarts == 1

    g = job.info()["goodput"]
    seconds = g["seconds"]
    assert abs(sum(seconds.values()) - g["wall"]) < 0.01  # every second in one bucket
    assert g["steps"] == KW["steps"]  # each step stands once
    # the kill threw away what the second gang did after the notice's checkpoint
    assert at - checkpoint + 1 <= g["lost_steps"] <= KW["steps"] - checkpoint
    assert seconds["lost"] > 0 and seconds["queued"] > 0 and seconds["startup"] > 0
    # 0.1 s a step of sleep alone: the steps that stand are at least that long
    assert seconds["productive"] >= 0.1 * KW["steps"]
    assert g["goodput"] == round(seconds["productive"] / g["wall"], 4)
    events = [e["kind"] for e in job.events()]
    assert "preempted" in events and "restarted" in events

    # the same figures on the command line and on /metrics
    shown = cli(idle4.state_dir, "show", job.id, "--cluster", idle4.scheduler_address)
    line = [x for x in shown.stdout.splitlines() if x.startswith("goodput:")]
    assert line and f"({g['lost_steps']} steps)" in line[0], shown.stdout + shown.stderr
    exposed = metrics.render(
        {"clusters": [{"id": "c", "up": True, "jobs": [{"record": job.info()}]}]}
    ).decode()
    labels = f'cluster="c",job="{job.id}",name="{job.name}"'
    assert f"clustersdk_job_lost_steps_total{{{labels}}} {float(g['lost_steps'])}" in exposed
    assert f'clustersdk_job_time_seconds{{bucket="lost",{labels}}}' in exposed
