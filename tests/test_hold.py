"""Post-mortem on a failed rank: ``on_error="hold"`` end to end, and the safe rendering of
the failing frames' locals.

A rank that raises under hold keeps the job HELD: ``job.debug(rank)`` shows its failing
stack with its locals, ``job.stop()`` ends it (FAILED with the original error) and frees
every slot, ``job.restart_from_checkpoint()`` continues from the checkpoint, and the hold
timeout fails it. The module has a cluster of its own: a rank that never gets out of a
collective has its worker restarted.
"""

from __future__ import annotations

import threading

import cloudpickle
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import clustersdk as cs
from clustersdk import widgets
from clustersdk.protocol import RankEvent, WireSpec, Word, no_words
from clustersdk.runtime import holds
from clustersdk.runtime.context import TrainContext
from clustersdk.runtime.control_words import Control
from clustersdk.widgets import render
from clustersdk.widgets.model import JobView

from . import workloads, workloads_debug
from .helpers import Statuses, assert_same_run, checkpointed_at, losses, wait_for

cloudpickle.register_pickle_by_value(workloads_debug)


def held_ranks(job) -> set[str]:
    return set(((job.info().get("held") or {}).get("ranks") or {}))


# --- end to end -------------------------------------------------------------------------
def test_a_rank_that_raises_is_held_with_its_frames_and_stop_frees_every_slot(healed, capsys):
    job = healed.launch(workloads_debug.raise_at, kwargs={"rank": 1, "step": 5}, world_size=2,
                        timeout=3, on_error="hold", name="held")
    seen = Statuses(job)
    dash = widgets.dashboard(job)
    wait_for(lambda: job.status is cs.JobStatus.HELD, timeout=90)
    assert job.reason.startswith("held: rank 1 raised ValueError at step 5: bad batch at step 5 "
                                 "on rank 1; job.debug(1) shows its stack, job.run(fn, "
                                 "ranks=[1]) inspects it; job.stop() or ")
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
        job.restart_from_checkpoint()
    with pytest.raises(cs.SpecError, match=r"rank 7 of job 'held' is not held; held rank\(s\): 1"):
        job.debug(7)
    with pytest.raises(cs.InvalidTransitionError, match="is HELD; it cannot become PAUSED"):
        job.pause(timeout=5)
    assert job.status is cs.JobStatus.HELD and job.debug().step == 5

    # job.run reaches the held rank, in its own thread: its exception, the failing frame's
    # live locals, its model; and a function that raises there leaves the job HELD
    assert job.run(workloads_debug.look_at_failure, ranks=[1], timeout=30) == {
        1: {"error": "ValueError", "nans": 16, "step": 5, "secret": 10_000,
            "params": sum(p.numel() for p in workloads.model().parameters())}}
    with pytest.raises(cs.RunError, match="rank 1: KeyError: 'missing'") as refused:
        job.run(lambda ctx: {}["missing"], ranks=[1], timeout=30)
    assert "During handling" not in str(refused.value)  # not chained to the held error
    with pytest.raises(cs.InvalidTransitionError,
                       match="is HELD; job.update needs a RUNNING or PAUSED job"):
        job.update(lr=0.1)  # the ranks can't agree on a step boundary while held
    assert job.status is cs.JobStatus.HELD and job.debug().step == 5

    # rank 0 waited for rank 1 in a collective: after timeout=3 s it raised, and holds too,
    # as a consequence: the cause stays rank 1's own error
    wait_for(lambda: "0" in held_ranks(job), timeout=60)
    assert job.info()["held"]["cause"] == 1 and job.reason.startswith("held: rank 1 raised")
    assert "Timed out" in job.debug(0).error["message"]
    # of a HELD job, job.run's default ranks are the held ones
    assert job.run(lambda ctx: type(ctx.error).__name__, timeout=30) == {
        0: job.debug(0).error["type"], 1: "ValueError"}

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
    assert [e["kind"] for e in job.events()] == ["held", "released", "failed"]
    assert "job.stop()" in job.debug(1).text  # kept with the record after the end
    shell.user_ns.pop("hold_cluster", None)


def test_stop_frees_the_slot_of_a_peer_still_waiting_in_a_collective(healed):
    job = healed.launch(workloads_debug.raise_at, kwargs={"rank": 0, "step": 3}, world_size=2,
                        timeout=120, on_error="hold", name="stuck-peer")
    wait_for(lambda: job.status is cs.JobStatus.HELD, timeout=90)
    assert held_ranks(job) == {"0"}  # rank 1 waits in a collective for 120 s
    assert "raise_at" in job.stacks()[1]
    assert job.stop(timeout=90) is cs.JobStatus.FAILED
    assert job.info()["error"]["rank"] == 0
    wait_for(lambda: not any(s["job"] for s in healed.slots()), timeout=60)


def test_restart_from_checkpoint_continues_from_the_checkpoint_and_finishes(healed, tmp_path):
    options = dict(world_size=2, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=4,
                   timeout=120)
    plain = healed.launch(workloads_debug.raise_at, kwargs={"rank": 5, "steps": 12},
                          **options, name="uninterrupted").wait(timeout=120)
    marker = tmp_path / "raised-once"
    job = healed.launch(workloads_debug.raise_at,
                        kwargs={"rank": 0, "step": 6, "steps": 12, "marker": str(marker)},
                        on_error="hold", **{**options, "checkpoint_dir": str(tmp_path / "h")},
                        name="restarted")
    wait_for(lambda: job.status is cs.JobStatus.HELD, timeout=90)
    wait_for(lambda: checkpointed_at(job, 4), timeout=30)
    assert job.restart_from_checkpoint() is cs.JobStatus.RESTARTING
    result = job.wait(timeout=120)
    assert_same_run(result, plain, exact=True)  # bitwise: 2 ranks
    assert job.restarts == 0  # the owner's restart does not use max_restarts
    assert "resumed from" in job.logs(0) and "at step 4" in job.logs(0)
    assert sorted(losses(job, 0)) == list(range(12))  # each step once
    kinds = [e["kind"] for e in job.events()]
    assert kinds == ["held", "released"], kinds
    assert "job.restart_from_checkpoint()" in job.events()[1]["message"]


def test_the_hold_timeout_fails_the_job(healed):
    job = healed.launch(workloads_debug.raise_at, kwargs={"rank": 1, "step": 2}, world_size=2,
                        timeout=120, on_error="hold", hold_timeout=3, name="timed-out")
    with pytest.raises(cs.JobFailedError, match="rank 1 raised ValueError: bad batch at step 2"):
        job.wait(timeout=120)
    released = [e for e in job.events() if e["kind"] == "released"]
    assert len(released) == 1 and "hold_timeout: nobody ended it within 3 s" in \
        released[0]["message"]
    wait_for(lambda: not any(s["job"] for s in healed.slots()), timeout=60)


def test_without_hold_a_rank_that_raises_fails_the_job_at_once(healed):
    job = healed.launch(workloads_debug.raise_at, kwargs={"rank": 1, "step": 2}, world_size=2,
                        timeout=120, name="not-held")
    with pytest.raises(cs.JobFailedError, match="bad batch at step 2"):
        job.wait(timeout=120)
    assert not job.info().get("held") and "held" not in [e["kind"] for e in job.events()]
    with pytest.raises(cs.InvalidTransitionError, match="has no held rank"):
        job.debug(1)


# --- the hold, in process -----------------------------------------------------------------
def test_a_held_rank_keeps_its_exception_for_ctx_error_and_serves_each_new_word():
    reports, served = [], []
    spec = WireSpec(id="j", name="j", world_size=1, strategy="none")
    control = Control()

    def report(event, **data):
        reports.append((event, data))

    hold = holds.Hold(control=control, report=report, rank=0, timeout=spec.hold_timeout)
    ctx = TrainContext(job="j", name="j", rank=0, world_size=1, local_rank=0,
                       device=torch.device("cpu"), strategy="none", spec=spec,
                       control=control, report=report, hold=hold)
    try:
        weights = torch.ones(3)  # noqa: F841 - a local of the failing frame
        raise KeyError("missing")
    except KeyError as e:
        error = {"rank": 0, "type": "KeyError", "message": str(e), "traceback": ""}

        def serve_runs(words):
            served.append((list(words), ctx.error))

        holder = threading.Thread(target=hold.wait, args=(e, error),
                                  kwargs={"step": ctx.step, "serve_runs": serve_runs})
        holder.start()
        wait_for(lambda: reports, timeout=30)
        pause = no_words()
        pause[Word.PAUSE] = 1
        control.merge(pause)
        wait_for(lambda: served, timeout=30)
        stop = no_words()
        stop[Word.STOP] = 1
        control.merge(stop)
        holder.join(timeout=30)
        assert not holder.is_alive()
        assert served == [(pause, e)]  # the hook saw the word, and ctx.error the exception
    (event, data), = reports
    assert event is RankEvent.HELD and data["error"] is error and ctx.phase == "held"
    frame = data["frames"][-1]
    assert frame["function"] == "test_a_held_rank_keeps_its_exception_for_ctx_error_and_serves_each_new_word"
    assert frame["locals"]["weights"] == "Tensor(shape=[3], dtype=float32, device=cpu, values=[1.0, 1.0, 1.0])"


# --- rendering locals safely ----------------------------------------------------------------
class Raises:
    def __repr__(self):
        raise RuntimeError("no repr for you")


class Spins:
    def __repr__(self):
        while True:
            pass


class Blocks:
    gate = threading.Event()

    def __repr__(self):
        self.gate.wait()  # blocked outside Python code, until the test lets it go
        return "let go"


def test_reprs_that_raise_or_spin_are_named_and_long_ones_cut():
    assert holds.safe_repr(Raises()) == \
        "<Raises object; its repr raised RuntimeError: no repr for you>"
    assert holds.safe_repr(Spins(), seconds=0.2) == \
        "<Spins object; its repr took longer than 0.2 s>"
    text = holds.safe_repr({"k": ["a" * 1000] * 50})
    assert len(text) <= holds.VALUE_LIMIT and text.startswith("{'k': ['aaa")
    assert holds.safe_repr([torch.zeros(2, 1000)]) == \
        "[Tensor(shape=[2, 1000], dtype=float32, device=cpu, nan=False, min=0, max=0, mean=0)]"
    assert "inf=True" in holds.safe_repr(torch.tensor([1.0, float("inf")] * 4))
    meta = holds.safe_repr(torch.empty(8, 8, device="meta"))
    assert meta == "Tensor(shape=[8, 8], dtype=float32, device=meta)"
    assert holds.safe_repr("two\nlines") == "'two\\nlines'"


def test_a_repr_blocked_outside_python_is_abandoned(monkeypatch):
    monkeypatch.setattr(holds, "TOTAL_SECONDS", 1.0)

    def fail(blocked, after):
        raise ValueError("boom")

    try:
        fail(Blocks(), 42)
    except ValueError as e:
        frames = holds.render_frames(e.__traceback__)
    finally:
        Blocks.gate.set()  # the abandoned rendering thread ends
    assert frames[-1]["locals"] == {
        "blocked": "<not rendered: the locals took longer than 1 s>",
        "after": "<not rendered: the locals took longer than 1 s>"}


def test_the_locals_of_every_frame_share_one_budget_the_failing_frame_first(monkeypatch):
    monkeypatch.setattr(holds, "TOTAL_LIMIT", 300)

    def fail(a, b, c, d, e, f, g, h):
        raise ValueError("boom")

    def outer():
        kept = "o" * 100  # noqa: F841 - the outer frame comes after the failing one
        fail(*["v" * 100] * 8)

    try:
        outer()
    except ValueError as err:
        frames = holds.render_frames(err.__traceback__)
    failing, caller = frames[-1], frames[-2]
    assert list(failing["locals"]) == ["a", "b", "c"] and failing["omitted"] == 5
    assert caller["function"] == "outer" and caller["locals"] == {}
    assert caller["omitted"] == 2  # kept, and fail (a free variable of outer)


def test_the_static_view_of_a_held_job_shows_its_reason_and_failing_frames():
    frames = [{"file": "train.py", "line": 9, "function": "train", "code": "raise ValueError(s)",
               "ours": False, "locals": {"s": "'<b>'"}, "omitted": 0}]
    record = {"id": "j", "name": "a", "status": "HELD", "reason": "held: rank 1 raised ValueError",
              "spec": {"world_size": 2, "strategy": "ddp"},
              "held": {"cause": 1, "since": 1.0, "ended": "", "ranks": {"1": {
                  "rank": 1, "step": 4, "time": 1.0, "frames": frames,
                  "error": {"type": "ValueError", "message": "m", "traceback": ""}}}}}
    html = render.job_html(JobView.from_record(record))
    assert ">HELD<" in html and "held: rank 1 raised ValueError" in html
    assert "Held: rank 1's failing frames" in html and "raise ValueError(s)" in html
    assert "&#x27;&lt;b&gt;&#x27;" in html  # the locals are escaped


@pytest.mark.gpu
def test_cuda_tensors_are_summarized_on_their_device():
    x = torch.ones(4, 4, device="cuda")
    x[0, 0] = float("nan")
    text = holds.safe_repr(x)
    assert text.startswith("Tensor(shape=[4, 4], dtype=float32, device=cuda:0, nan=True")
    assert holds.safe_repr(torch.ones(2, device="cuda")) == \
        "Tensor(shape=[2], dtype=float32, device=cuda:0, values=[1.0, 1.0])"
