"""A held rank in one process (``on_error="hold"``, :mod:`clustersdk.runtime.holds`): the
hold keeps its exception for ``ctx.error`` and serves each new control vector, and the
failing frames' locals are rendered safely (reprs that raise, spin, block or run long).
The hold end to end, on a cluster: ``tests/test_hold.py``."""

from __future__ import annotations

import threading

import pytest
import torch

from clustersdk.protocol import RankEvent, WireSpec, Word, no_words
from clustersdk.runtime import holds
from clustersdk.runtime.context import TrainContext
from clustersdk.runtime.control_words import Control

from ..helpers import wait_for


# --- the hold, in process -----------------------------------------------------------------
def test_a_held_rank_keeps_its_exception_for_ctx_error_and_serves_each_new_word():
    reports, served = [], []
    spec = WireSpec(id="j", name="j", world_size=1, strategy="none")
    control = Control()

    def report(event, **data):
        reports.append((event, data))

    hold = holds.Hold(control=control, report=report, rank=0, timeout=spec.hold_timeout)
    ctx = TrainContext(
        job="j",
        name="j",
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        strategy="none",
        spec=spec,
        control=control,
        report=report,
        hold=hold,
    )
    try:
        weights = torch.ones(3)  # noqa: F841 - a local of the failing frame
        raise KeyError("missing")
    except KeyError as e:
        error = {"rank": 0, "type": "KeyError", "message": str(e), "traceback": ""}

        def serve_runs(words):
            served.append((list(words), ctx.error))

        holder = threading.Thread(
            target=hold.wait, args=(e, error), kwargs={"step": ctx.step, "serve_runs": serve_runs}
        )
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
    ((event, data),) = reports
    assert event is RankEvent.HELD and data["error"] is error and ctx.phase == "held"
    frame = data["frames"][-1]
    assert (
        frame["function"]
        == "test_a_held_rank_keeps_its_exception_for_ctx_error_and_serves_each_new_word"
    )
    assert (
        frame["locals"]["weights"]
        == "Tensor(shape=[3], dtype=float32, device=cpu, values=[1.0, 1.0, 1.0])"
    )


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
    assert (
        holds.safe_repr(Raises())
        == "<Raises object; its repr raised RuntimeError: no repr for you>"
    )
    assert (
        holds.safe_repr(Spins(), seconds=0.2) == "<Spins object; its repr took longer than 0.2 s>"
    )
    text = holds.safe_repr({"k": ["a" * 1000] * 50})
    assert len(text) <= holds.VALUE_LIMIT and text.startswith("{'k': ['aaa")
    assert (
        holds.safe_repr([torch.zeros(2, 1000)])
        == "[Tensor(shape=[2, 1000], dtype=float32, device=cpu, nan=False, min=0, max=0, mean=0)]"
    )
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
        "after": "<not rendered: the locals took longer than 1 s>",
    }


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


@pytest.mark.gpu
def test_cuda_tensors_are_summarized_on_their_device():
    x = torch.ones(4, 4, device="cuda")
    x[0, 0] = float("nan")
    text = holds.safe_repr(x)
    assert text.startswith("Tensor(shape=[4, 4], dtype=float32, device=cuda:0, nan=True")
    assert (
        holds.safe_repr(torch.ones(2, device="cuda"))
        == "Tensor(shape=[2], dtype=float32, device=cuda:0, values=[1.0, 1.0])"
    )
