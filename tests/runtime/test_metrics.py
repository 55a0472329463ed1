"""ctx.log's rows in one process: one row per step, shipped once the step is over."""

from __future__ import annotations

import threading

import pytest
import torch

from clustersdk import SpecError
from clustersdk.runtime.metrics import Metrics


def drained_elsewhere(metrics: Metrics) -> list[dict]:
    """A drain from another thread, as the worker's event loop does."""
    out: list = []
    thread = threading.Thread(target=lambda: out.extend(metrics.drain()))
    thread.start()
    thread.join()
    return out


def test_calls_of_one_step_make_one_row_shipped_when_the_step_ends():
    m = Metrics(rank=0, world_size=1, group=None)
    m.log(3, {"loss": torch.tensor(0.5)})
    m.log(3, {"acc": 0.9, "loss": 0.25})  # a later value of a name wins
    assert drained_elsewhere(m) == []  # the step still runs
    m.end_step()
    rows = drained_elsewhere(m)
    assert [(r["step"], r["scalars"]) for r in rows] == [(3, {"loss": 0.25, "acc": 0.9})]


def test_the_ranks_own_thread_takes_the_open_row_unless_the_ranks_are_agreeing():
    m = Metrics(rank=1, world_size=1, group=None)
    m.log(0, {"a": 1.0})
    with m.holding():  # a pause inside an evaluation: the step is not over
        assert m.drain() == []
    assert [r["scalars"] for r in m.drain()] == [{"a": 1.0}]  # e.g. the rank failed
    m.log(1, {"b": 2.0})
    m.log(2, {"c": 3.0})  # a new step closes the old row
    assert [r["step"] for r in drained_elsewhere(m)] == [1]


def test_an_evaluation_accumulates_and_logs_once_at_its_step():
    m = Metrics(rank=0, world_size=1, group=None)
    with m.evaluating() as evaluation:
        for value in (1.0, 2.0, 6.0):
            m.log(5, {"val": value, "skipped": None}, reduce="mean")
            m.log(5, {"worst": value}, reduce="max")
            m.log(5, {"count": 1.0}, reduce="sum")
        with pytest.raises(SpecError, match="one reduction per name"):
            m.log(5, {"val": 1.0}, reduce="sum")
        with pytest.raises(SpecError, match="can't nest"):
            with m.evaluating():
                pass
        assert m.drain() == []  # nothing logged until the pass is over
        row = m.finish(5, evaluation)
    assert row == {"val": 3.0, "worst": 6.0, "count": 3.0}  # "skipped": no value anywhere
    assert [r["scalars"] for r in m.drain()] == [row]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: m.log(0, {"x": 1.0}, reduce="median"), "reduce='median'.*mean"),
        (lambda m: m.log(0, {"step": 1.0}), "recorded with every row already"),
        (
            lambda m: m.log(0, {"x": torch.ones(2)}),
            "one-element tensor, got a tensor of shape \\(2,\\)",
        ),
        (lambda m: m.log(0, {"x": "high"}), "needs a number, got str"),
    ],
)
def test_misuse_names_the_value(call, message):
    with pytest.raises(SpecError, match=message):
        call(Metrics(rank=0, world_size=1, group=None))
