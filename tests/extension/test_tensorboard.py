"""clustersdk.control.tensorboard: ctx.log rows as TensorBoard scalar events.

Read back with TensorBoard's own EventAccumulator, as TensorBoard would.
"""

from __future__ import annotations

import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from clustersdk.control.tensorboard import Aggregator, ScalarWriter, aggregate

from .. import workloads
from .conftest import idle_cluster


def read(logdir) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, value, wall_time)] as TensorBoard reads the run in ``logdir``."""
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }


def rows(rank, steps, base=0.0):
    return [
        {
            "rank": rank,
            "step": s,
            "time": 1000.0 + s + rank / 10,
            "scalars": {"loss": base + s, "lr": 0.1},
        }
        for s in steps
    ]


def test_a_rank_writer_writes_every_scalar_at_its_step_and_time(tmp_path):
    with ScalarWriter(tmp_path, rank=1) as writer:
        writer.write(rows(1, range(5)))
        writer.write([])
    assert writer.logdir == str(tmp_path / "rank-1")
    scalars = read(tmp_path / "rank-1")
    assert sorted(scalars) == ["loss", "lr"]
    assert [(s, v) for s, v, _ in scalars["loss"]] == [(s, float(s)) for s in range(5)]
    assert [t for _, _, t in scalars["loss"]] == pytest.approx([1000.1 + s for s in range(5)])
    assert [v for _, v, _ in scalars["lr"]] == pytest.approx([0.1] * 5)
    writer.close()  # idempotent


def test_the_aggregated_writer_writes_to_the_logdir_itself(tmp_path):
    merged = aggregate(rows(0, range(4)) + rows(1, range(3), base=2.0))
    with ScalarWriter(tmp_path, rank=None) as writer:
        writer.write(merged)
    scalars = read(tmp_path)
    # steps 0-2 have both ranks; step 3 only rank 0, so it is not there yet
    assert [(s, v) for s, v, _ in scalars["loss"]] == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert [t for _, _, t in scalars["loss"]] == pytest.approx([1000.1, 1001.1, 1002.1])


def test_a_rank_writer_refuses_rows_of_another_rank(tmp_path):
    with ScalarWriter(tmp_path, rank=0) as writer, pytest.raises(ValueError, match="rank 1"):
        writer.write(rows(1, [0]))


def test_aggregate_means_over_ranks_of_complete_steps_only():
    assert aggregate([]) == []
    out = aggregate(rows(0, range(3)) + rows(1, range(2), base=2.0), world_size=2)
    assert [(r["step"], r["scalars"]["loss"]) for r in out] == [(0, 1.0), (1, 2.0)]
    assert all(r["rank"] is None for r in out)
    # with world_size=3 no step is complete
    assert aggregate(rows(0, range(3)) + rows(1, range(3)), world_size=3) == []
    # a second log at the same step of the same rank updates it rather than counting twice
    twice = rows(0, [0]) + [{"rank": 0, "step": 0, "time": 1001.0, "scalars": {"acc": 0.5}}]
    (row,) = aggregate(twice)
    assert row["scalars"] == {"acc": 0.5, "loss": 0.0, "lr": 0.1} and row["time"] == 1001.0


def test_the_streaming_aggregator_holds_a_step_until_every_rank_reported():
    agg = Aggregator(world_size=2)
    assert agg.add(rows(0, range(3))) == []
    done = agg.add(rows(1, range(2), base=2.0))
    assert [(r["step"], r["scalars"]["loss"]) for r in done] == [(0, 1.0), (1, 2.0)]
    assert [r["step"] for r in agg.add(rows(1, [2]))] == [2]
    with pytest.raises(ValueError):
        Aggregator(world_size=0)


def test_launch_with_tensorboard_dir_writes_per_rank_and_aggregated_runs(sdk_cluster, tmp_path):
    """End to end: `cluster.launch(..., tensorboard_dir=...)` on two ranks."""
    cluster = idle_cluster(sdk_cluster)
    job = cluster.launch(
        workloads.train_mlp,
        kwargs={"steps": 12},
        world_size=2,
        name="ext-tensorboard",
        tensorboard_dir=str(tmp_path),
    )
    out = job.wait(timeout=120)
    history = job.history()
    for rank in (0, 1):
        loss = read(tmp_path / f"rank-{rank}")["loss"]
        assert [s for s, _, _ in loss] == list(range(12))
        logged = [r for r in history if r["rank"] == rank]
        assert [v for _, v, _ in loss] == pytest.approx([r["loss"] for r in logged], rel=1e-6)
        assert [t for _, _, t in loss] == pytest.approx([r["time"] for r in logged])
    assert [v for _, v, _ in read(tmp_path / "rank-0")["loss"]] == pytest.approx(
        out["losses"], rel=1e-6
    )
    mean = read(tmp_path)["loss"]  # the aggregated run: the mean over both ranks, per step
    expected = aggregate(
        [
            {
                "rank": r["rank"],
                "step": r["step"],
                "time": r["time"],
                "scalars": {"loss": r["loss"]},
            }
            for r in history
        ]
    )
    assert [s for s, _, _ in mean] == [r["step"] for r in expected] == list(range(12))
    assert [v for _, v, _ in mean] == pytest.approx(
        [r["scalars"]["loss"] for r in expected], rel=1e-6
    )
    assert not [
        n for n in os.listdir(tmp_path) if n.startswith("rank-") and n not in ("rank-0", "rank-1")
    ]
