"""Post-mortem on a failed rank: ``on_error="hold"`` end to end (the hold in one process and
the safe rendering of the failing frames' locals: ``tests/runtime/test_holds.py``).

A rank that raises under hold keeps the job HELD: ``job.debug(rank)`` shows its failing
stack with its locals, ``job.stop()`` ends it (FAILED with the original error) and frees
every slot, ``job.restart()`` continues from the checkpoint, and the hold
timeout fails it. The module has a cluster of its own: a rank that never gets out of a
collective has its worker restarted.
"""

from __future__ import annotations

import cloudpickle
import pytest

import clustersdk as cs
from clustersdk import widgets
from clustersdk.runtime import holds
from clustersdk.widgets import render
from clustersdk.widgets.model import JobView

from . import workloads, workloads_debug
from .helpers import Statuses, assert_same_run, checkpointed_at, losses, wait_for

cloudpickle.register_pickle_by_value(workloads_debug)


def held_ranks(job) -> set[str]:
    return set((job.info().get("held") or {}).get("ranks") or {})


# --- end to end -------------------------------------------------------------------------
def test_a_rank_that_raises_is_held_with_its_frames_and_stop_frees_every_slot(healed, capsys):
    job = healed.launch(
        workloads_debug.raise_at,
        kwargs={"rank": 1, "step": 5},
        world_size=2,
        timeout=3,
        on_error="hold",
        name="held",
    )
    seen = Statuses(job)
    dash = widgets.dashboard(job)
    wait_for(lambda: job.status is cs.JobStatus.HELD, timeout=90)
    assert job.reason.startswith(
        "held: rank 1 raised ValueError at step 5: bad batch at step 5 "
        "on rank 1; job.debug(1) shows its stack, job.run(fn, "
        "ranks=[1]) inspects it; job.stop() or "
    )
    assert sorted(s["job"] for s in healed.slots()) == [job.id, job.id]  # the slots are kept

    post = job.debug()  # the rank whose error is the cause
    assert post.rank == 1 and post.step == 5 and post.error["type"] == "ValueError"
    failing = post.frames[-1]
    assert failing["function"] == "raise_at"
    local = failing["locals"]
    assert local["s"] == "5" and local["rank"] == "1"
    assert local["bad"].startswith("Tensor(shape=[4, 4], dtype=float32, device=cpu")
    assert "nan=True" in local["bad"]
    assert local["secret"].startswith("'xxxx") and len(local["secret"]) <= holds.VALUE_LIMIT
    assert local["ctx"].startswith("<TrainContext job='held' rank=1/2")
    assert local["net"].startswith("<") and "parameters on cpu>" in local["net"]
    assert all(not f["locals"] for f in post.frames if f["ours"])  # clustersdk's own: no locals
    assert post.text.splitlines()[-1] == "ValueError: bad batch at step 5 on rank 1"
    assert "      bad = Tensor(shape=[4, 4]" in post.text and "<details open>" in post._repr_html_()
    wait_for(lambda: "Held: rank 1's failing frames" in dash.error.value, timeout=30)
    assert ">HELD<" in dash.header.value and "held: rank 1 raised ValueError" in dash.header.value
    assert not dash.buttons["stop"].disabled and dash.buttons["pause"].disabled

    # bad input changes nothing: the job stays HELD, its cause and step kept
    with pytest.raises(cs.SpecError, match="has no committed checkpoint to restart from"):
        job.restart()
    with pytest.raises(cs.SpecError, match=r"rank 7 of job 'held' is not held; held rank\(s\): 1"):
        job.debug(7)
    with pytest.raises(cs.InvalidTransitionError, match="is HELD; it cannot become PAUSED"):
        job.pause(timeout=5)
    assert job.status is cs.JobStatus.HELD and job.debug().step == 5

    # job.run reaches the held rank, in its own thread: its exception, the failing frame's
    # live locals, its model; and a function that raises there leaves the job HELD
    assert job.run(workloads_debug.look_at_failure, ranks=[1], timeout=30) == {
        1: {
            "error": "ValueError",
            "nans": 16,
            "step": 5,
            "secret": 10_000,
            "params": sum(p.numel() for p in workloads.model().parameters()),
        }
    }
    with pytest.raises(cs.RunError, match="rank 1: KeyError: 'missing'") as refused:
        job.run(lambda ctx: {}["missing"], ranks=[1], timeout=30)
    assert "During handling" not in str(refused.value)  # not chained to the held error
    with pytest.raises(
        cs.InvalidTransitionError, match="is HELD; job.update needs a RUNNING or PAUSED job"
    ):
        job.update(lr=0.1)  # the ranks can't agree on a step boundary while held
    assert job.status is cs.JobStatus.HELD and job.debug().step == 5

    # rank 0 waited for rank 1 in a collective: after timeout=3 s it raised, and holds too,
    # as a consequence: the cause stays rank 1's own error
    wait_for(lambda: "0" in held_ranks(job), timeout=60)
    assert job.info()["held"]["cause"] == 1 and job.reason.startswith("held: rank 1 raised")
    assert "Timed out" in job.debug(0).error["message"]
    # of a HELD job, job.run's default ranks are the held ones
    assert job.run(lambda ctx: type(ctx.error).__name__, timeout=30) == {
        0: job.debug(0).error["type"],
        1: "ValueError",
    }

    # imported here: the module's GPU test runs where IPython is not installed (the GPU
    # machine of benchmarks/gpu_check.py)
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()  # %job debug NAME RANK prints the same stack
    shell.run_line_magic("load_ext", "clustersdk")
    shell.user_ns["hold_cluster"] = healed
    capsys.readouterr()
    shell.run_line_magic("job", "debug held 1 --cluster hold_cluster")
    assert capsys.readouterr().out.strip() == post.text

    assert job.stop(timeout=60) is cs.JobStatus.FAILED  # it did fail: the stop ends the wait
    with pytest.raises(cs.JobFailedError) as failed:
        job.wait(timeout=30)
    assert (failed.value.rank, failed.value.exc_type) == (1, "ValueError")
    assert [c["rank"] for c in failed.value.consequences] == [0]
    assert seen.after("HELD") == ["HELD", "STOPPING", "FAILED"]
    assert not any(s["job"] for s in healed.slots())
    kinds = [e["kind"] for e in job.events()]
    assert [k for k in kinds if k != "request"] == ["held", "released", "failed"], kinds
    # the stop is journaled with the identity that asked (the creator: the cluster's admin)
    (stop,) = [e for e in job.events() if e["kind"] == "request" and e["op"] == "stop"]
    assert stop["by"] == job.owner and stop["message"] == f"stop asked by {job.owner}"
    assert "job.stop()" in job.debug(1).text  # kept with the record after the end
    shell.user_ns.pop("hold_cluster", None)


def test_stop_frees_the_slot_of_a_peer_still_waiting_in_a_collective(healed):
    job = healed.launch(
        workloads_debug.raise_at,
        kwargs={"rank": 0, "step": 3},
        world_size=2,
        timeout=120,
        on_error="hold",
        name="stuck-peer",
    )
    wait_for(lambda: job.status is cs.JobStatus.HELD, timeout=90)
    assert held_ranks(job) == {"0"}  # rank 1 waits in a collective for 120 s
    assert "raise_at" in job.stacks()[1]
    assert job.stop(timeout=90) is cs.JobStatus.FAILED
    assert job.info()["error"]["rank"] == 0
    wait_for(lambda: not any(s["job"] for s in healed.slots()), timeout=60)


def test_restart_from_checkpoint_continues_from_the_checkpoint_and_finishes(healed, tmp_path):
    options = dict(
        world_size=2, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=4, timeout=120
    )
    plain = healed.launch(
        workloads_debug.raise_at, kwargs={"rank": 5, "steps": 12}, **options, name="uninterrupted"
    ).wait(timeout=120)
    marker = tmp_path / "raised-once"
    job = healed.launch(
        workloads_debug.raise_at,
        kwargs={"rank": 0, "step": 6, "steps": 12, "marker": str(marker)},
        on_error="hold",
        **{**options, "checkpoint_dir": str(tmp_path / "h")},
        name="restarted",
    )
    wait_for(lambda: job.status is cs.JobStatus.HELD, timeout=90)
    wait_for(lambda: checkpointed_at(job, 4), timeout=30)
    assert job.restart() is cs.JobStatus.RESTARTING
    result = job.wait(timeout=120)
    assert_same_run(result, plain, exact=True)  # bitwise: 2 ranks
    assert job.restarts == 0  # the owner's restart does not use max_restarts
    assert "resumed from" in job.logs(0) and "at step 4" in job.logs(0)
    assert sorted(losses(job, 0)) == list(range(12))  # each step once
    events = [e for e in job.events() if e["kind"] != "request"]
    assert [e["kind"] for e in events] == ["held", "released"], events
    assert "job.restart()" in events[1]["message"]


def test_the_hold_timeout_fails_the_job(healed):
    job = healed.launch(
        workloads_debug.raise_at,
        kwargs={"rank": 1, "step": 2},
        world_size=2,
        timeout=120,
        on_error="hold",
        hold_timeout=3,
        name="timed-out",
    )
    with pytest.raises(cs.JobFailedError, match="rank 1 raised ValueError: bad batch at step 2"):
        job.wait(timeout=120)
    released = [e for e in job.events() if e["kind"] == "released"]
    assert (
        len(released) == 1 and "hold_timeout: nobody ended it within 3 s" in released[0]["message"]
    )
    wait_for(lambda: not any(s["job"] for s in healed.slots()), timeout=60)


def test_without_hold_a_rank_that_raises_fails_the_job_at_once(healed):
    job = healed.launch(
        workloads_debug.raise_at,
        kwargs={"rank": 1, "step": 2},
        world_size=2,
        timeout=120,
        name="not-held",
    )
    with pytest.raises(cs.JobFailedError, match="bad batch at step 2"):
        job.wait(timeout=120)
    assert not job.info().get("held") and "held" not in [e["kind"] for e in job.events()]
    with pytest.raises(cs.InvalidTransitionError, match="has no held rank"):
        job.debug(1)


# --- the static view ------------------------------------------------------------------------
def test_the_static_view_of_a_held_job_shows_its_reason_and_failing_frames():
    frames = [
        {
            "file": "train.py",
            "line": 9,
            "function": "train",
            "code": "raise ValueError(s)",
            "ours": False,
            "locals": {"s": "'<b>'"},
            "omitted": 0,
        }
    ]
    record = {
        "id": "j",
        "name": "a",
        "status": "HELD",
        "reason": "held: rank 1 raised ValueError",
        "spec": {"world_size": 2, "strategy": "ddp"},
        "held": {
            "cause": 1,
            "since": 1.0,
            "ended": "",
            "ranks": {
                "1": {
                    "rank": 1,
                    "step": 4,
                    "time": 1.0,
                    "frames": frames,
                    "error": {"type": "ValueError", "message": "m", "traceback": ""},
                }
            },
        },
    }
    html = render.job_html(JobView.from_record(record))
    assert ">HELD<" in html and "held: rank 1 raised ValueError" in html
    assert "Held: rank 1's failing frames" in html and "raise ValueError(s)" in html
    assert "&#x27;&lt;b&gt;&#x27;" in html  # the locals are escaped
