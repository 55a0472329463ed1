"""Epochs and evaluation on a real LocalCluster: lengths, epoch boundaries and the data
stream survive a suspend at 2 ranks and a resume at 1 or 2; evaluations are reduced over
the ranks, logged in their step's row, and under pause/stop control."""

from __future__ import annotations

import os

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import clustersdk as cs
from clustersdk.widgets import source
from clustersdk.widgets.model import JobView

from .. import workloads_data as W
from ..helpers import wait_for

cloudpickle.register_pickle_by_value(W)

EPOCHS, GLOBAL_BATCH = 3, 16
PER_EPOCH = W.N // GLOBAL_BATCH  # 15 steps


@pytest.fixture(scope="module")
def parquet_path(tmp_path_factory) -> str:
    """The samples of W.samples() in three Parquet files of 20-row groups."""
    root = tmp_path_factory.mktemp("parquet")
    ids, x, y = W.samples().tensors
    for i, part in enumerate(np.array_split(np.arange(W.N), 3)):
        table = pa.table({"id": ids[part].numpy(), "x": x[part].tolist(), "y": y[part].tolist()})
        pq.write_table(table, os.path.join(root, f"part-{i}.parquet"), row_group_size=20)
    return str(root)


def by_step(job) -> dict[int, dict]:
    """Rank 0's row of every step (each step once)."""
    rows = [r for r in job.history() if r["rank"] == 0]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), "a step has two rows"
    return {
        r["step"]: {k: v for k, v in r.items() if k not in ("seq", "time", "rank")} for r in rows
    }


@pytest.fixture(scope="module")
def references(cluster4, parquet_path):
    """The uninterrupted run at 2 ranks, per data source: (result, rows by step)."""
    made: dict[str, tuple] = {}

    def reference(kind: str) -> tuple:
        if kind not in made:
            job = cluster4.launch(
                W.train_epochs, kwargs={"kind": kind, "path": parquet_path}, world_size=2
            )
            made[kind] = (job.wait(timeout=120), by_step(job), job)
        return made[kind]

    return reference


def test_epochs_fix_the_total_the_epoch_of_each_step_and_where_evaluations_go(idle4, references):
    out, rows, job = references("map")
    total = EPOCHS * PER_EPOCH
    assert out["planned"] == out["step"] == job.info()["total_steps"] == total
    assert sorted(rows) == list(range(total))  # evaluations are not steps
    assert all(rows[s]["epoch"] == s // PER_EPOCH for s in rows)
    evaluated = [s for s in rows if "val_loss" in rows[s]]
    assert evaluated == [PER_EPOCH - 1, 2 * PER_EPOCH - 1, total - 1]
    ranks = {r["rank"]: r for r in job.history() if r["step"] == PER_EPOCH - 1}
    assert ranks[0]["val_loss"] == ranks[1]["val_loss"]  # one value: reduced over the ranks
    assert ranks[0]["loss"] != ranks[1]["loss"]  # in the row of each rank's own loss
    for step, row in rows.items():  # the global batch of the epoch's permutation (seed 0)
        epoch, b = divmod(step, PER_EPOCH)
        perm = torch.randperm(W.N, generator=torch.Generator().manual_seed(epoch))
        assert row["ids"] == perm[b * GLOBAL_BATCH : (b + 1) * GLOBAL_BATCH].sum().item(), step


@pytest.mark.parametrize(
    "kind, target",
    [("map", 1), ("parquet", 1), ("parquet", 2), ("stream", 1), ("stream", 2), ("hf", 1)],
)
def test_suspend_at_two_and_resume_keeps_lengths_epochs_and_the_data(
    idle4, references, parquet_path, tmp_path, kind, target
):
    reference, reference_rows, _ = references(kind)
    job = idle4.launch(
        W.train_epochs,
        world_size=2,
        checkpoint_dir=str(tmp_path),
        kwargs={"kind": kind, "path": parquet_path, "delay": 0.03},
    )
    wait_for(lambda: any(r["step"] >= 8 for r in job.history()), timeout=60)
    job.suspend()
    job.resume(world_size=target)
    out = job.wait(timeout=120)
    assert "resumed from" in job.logs(0)
    # len() of the shard was right before the loop, at the new world size
    assert out["planned"] == reference["planned"]
    assert out["step"] == reference["step"] and out["epoch"] == reference["epoch"]
    rows = by_step(job)
    assert sorted(rows) == sorted(reference_rows)
    for step, row in rows.items():  # every step saw the same global batch, epoch, evaluation
        want = reference_rows[step]
        assert (row["epoch"], row["ids"], "val_loss" in row) == (
            want["epoch"],
            want["ids"],
            "val_loss" in want,
        ), step
    for key, value in reference["params"].items():
        if target == 2:
            assert torch.equal(out["params"][key], value), key
        else:  # one rank averages its batch in another order than two
            torch.testing.assert_close(out["params"][key], value, rtol=1e-5, atol=1e-6)
    assert set(job.latest) == set(range(target))
    assert source.job_view(job).ranks == set(range(target))  # the dashboard's rank table


def test_a_dashboard_drops_the_ranks_a_smaller_resume_left_out():
    view = JobView(name="a", world_size=2, strategy="ddp")
    view.add_rows(
        [{"rank": r, "step": 5, "time": 1.0 + r, "scalars": {"loss": 1.0}} for r in (0, 1)]
    )
    assert view.ranks == {0, 1}
    view.set_status("QUEUED", {"spec": {"world_size": 1}})
    assert view.ranks == {0} and set(view.last_row) == {0}
    assert set(view.scalars["loss"]) == {0, 1}  # what rank 1 did stays in the charts
    view.add_rows([{"rank": 1, "step": 4, "time": 0.5, "scalars": {"loss": 2.0}}])  # history
    assert view.ranks == {0}


def test_three_ranks_reduce_evaluations_into_the_row_of_their_step(idle4):
    job = idle4.launch(W.three_ranks_report, world_size=3)
    assert job.wait(timeout=120) == {"step": 2}
    rows = job.history()
    assert sorted((r["rank"], r["step"]) for r in rows) == [
        (r, s) for r in range(3) for s in range(2)
    ]
    for row in rows:
        assert row["mine"] == row["rank"] and row["also"] == 1.0  # two calls, one row
        assert row["top"] == 20 + row["step"]  # max over the ranks
        assert row["score"] == pytest.approx(3.0, abs=1e-12)  # mean of i + rank
        assert row["total"] == 3 * sum(range(5))  # sum over ranks, pass
        assert row["only0"] == 7.0 and "nothing" not in row  # gathered names


def test_a_pause_holds_an_evaluation_and_a_stop_ends_it_and_the_loop(idle4):
    job = idle4.launch(W.long_evaluation, world_size=2)
    wait_for(lambda: "evaluating" in job.logs(0), timeout=60)
    assert job.pause() == 1  # inside the evaluation of step 1
    assert job.status is cs.JobStatus.PAUSED
    job.resume()
    job.stop()
    out = job.wait(timeout=60)
    assert out["stopped"] and out["step"] == 2  # step 1 finished; step 2 never ran
    assert out["evaluated"] < 400
    assert not [r for r in job.history() if "seen" in r]  # a stopped pass logs nothing
