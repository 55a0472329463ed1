"""Token-budget batches (``ctx.shard(data, tokens_per_batch=N)``), without a cluster: every
rank's loader is built here, as each rank builds its own (the job-level resume at
another world size is in ``test_threed.py``, which has the ranks)."""

from __future__ import annotations

import pytest
import torch

from clustersdk.runtime.budget import TokenBudgetLoader, pad_collate, split
from clustersdk.runtime.data import make_loader

from ..workloads_parallel import SkewedText

CPU = torch.device("cpu")
BUDGET = 64


def loaders(world_size: int, data=None, **options) -> list[TokenBudgetLoader]:
    data = data if data is not None else SkewedText(n=200)
    return [
        make_loader(
            data, None, r, world_size, CPU, tokens_per_batch=BUDGET, pad=(0, -100, -1), **options
        )
        for r in range(world_size)
    ]


def take(ranks: list[TokenBudgetLoader], steps: int | None = None) -> list[list[torch.Tensor]]:
    """Steps of all ranks in lockstep (as a job runs them): per step, each rank's batch."""
    its = [iter(r) for r in ranks]
    out = []
    while steps is None or len(out) < steps:
        batches = [next(it, None) for it in its]
        if all(b is None for b in batches):
            return out
        assert None not in batches, "the ranks ran out at different steps"
        out.append(batches)
    return out


def ids(steps: list[list]) -> list[int]:
    return [int(i) for step in steps for (_x, _y, idx) in step for i in idx]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_no_batch_exceeds_the_budget_and_every_sample_comes_once_per_epoch(world_size):
    data = SkewedText(n=200)
    ranks = loaders(world_size, data=data)
    for _epoch in range(2):
        steps = take(ranks)
        assert steps and len(steps) == ranks[0].steps_in_epoch()
        for step in steps:
            for x, y, idx in step:
                assert x.numel() <= BUDGET and len(x) > 0  # samples x longest, padded
                lengths = [data.lengths[i] for i in idx]
                assert x.shape[1] == max(lengths)
                for row, n in zip(y, lengths):  # padding exactly where the sample ended
                    assert (row[n:] == -100).all() and (row[:n] != -100).all()
        seen = ids(steps)
        assert sorted(seen) == list(range(200))
    assert ranks[0].epoch == 2


def test_every_rank_and_world_size_follows_one_plan():
    one = loaders(1)[0]
    assert all(r.plan() == one.plan() for r in loaders(3))  # the same on every rank
    # at any world size the steps take the plan's batches in order, rank r the r-th
    three = take(loaders(3))
    assert ids(three) == [i for batch in one.plan() for i in batch]
    assert one.plan(1) != one.plan(0)  # reshuffled each epoch
    assert loaders(1, seed=1)[0].plan() != one.plan()


def test_a_resume_mid_epoch_at_another_world_size_repeats_and_skips_nothing():
    two = loaders(2)
    first = take(two, steps=7)
    saved = two[0].state_dict()
    assert (
        saved
        == two[1].state_dict()
        == {
            "epoch": 0,
            "consumed": 14,
            "seed": 0,
            "tokens_per_batch": BUDGET,
            "multiple_of": 1,
            "samples": 200,
        }
    )
    three = loaders(3, data=SkewedText(n=200))
    for loader in three:
        loader.load_state_dict(saved)
    rest = take(three)
    assert sorted(ids(first) + ids(rest)) == list(range(200))
    assert [r.epoch for r in three] == [1, 1, 1]
    assert sorted(ids(take(three))) == list(range(200))  # and the next epoch whole


def test_a_resumed_loader_keeps_the_saved_budget_and_refuses_other_data():
    saved = loaders(1)[0].state_dict()
    other = make_loader(SkewedText(n=200), None, 0, 1, CPU, tokens_per_batch=2 * BUDGET)
    other.load_state_dict(saved)
    assert other.plan() == loaders(1)[0].plan()
    with pytest.raises(ValueError, match="loader had 200 samples, this dataset has 150"):
        loaders(1, data=SkewedText(n=150))[0].load_state_dict(saved)


def test_the_last_step_splits_what_is_left_over_the_ranks():
    assert split([[1, 2, 3, 4], [5]], 4) == [[1], [2], [3, 4], [5]]
    assert split([[1], [2]], 3) is None  # fewer samples than ranks: left out
    assert split([[1, 2, 3, 4], [5, 6]], 3, multiple=2) == [[1, 2], [3, 4], [5, 6]]
    assert split([[1, 2]], 2, multiple=2) is None
    # 5 samples, 3 per batch at most: batches [0,1,2] [3,4] for 1 rank; 4 ranks get 4 parts
    data = [
        (torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long), torch.tensor(i))
        for i in range(5)
    ]
    ranks = [
        make_loader(data, None, r, 4, CPU, tokens_per_batch=12, shuffle=False) for r in range(4)
    ]
    assert ranks[0].plan() == [[0, 1, 2], [3, 4]]
    steps = take(ranks)
    assert [[b[2].tolist() for b in step] for step in steps] == [[[0], [1], [2], [3, 4]]]


@pytest.mark.parametrize("world_size", [2, 3])
def test_batches_hold_whole_micro_batches_when_asked(world_size):
    """``ctx.shard`` asks for multiples of grad_accum x a pipeline's microbatches."""
    data = SkewedText(n=203)
    ranks = loaders(world_size, data=data, multiple_of=4)
    plan = ranks[0].plan()
    assert all(len(b) % 4 == 0 for b in plan)
    assert all(max(data.lengths[i] for i in b) * len(b) <= BUDGET for b in plan)
    steps = take(ranks)
    assert all(len(x) % 4 == 0 for step in steps for x, _y, _i in step)
    seen = ids(steps)
    assert (
        len(seen) == len(set(seen)) >= 203 - 3 - (4 * world_size - 1)
    )  # 203 % 4 left out, and a tail
    with pytest.raises(
        ValueError,
        match=r"tokens_per_batch=32 can't hold 4 samples .* of the "
        r"longest sample's 16 tokens: give 64 or more",
    ):
        make_loader(data, None, 0, 1, CPU, tokens_per_batch=32, multiple_of=4)


def test_budget_batches_pad_far_less_than_fixed_batches_on_skewed_lengths():
    data = SkewedText(n=200)
    budget = loaders(1, data=data)[0]
    padding = [budget.stats(b)["padding"] for b in budget.plan()]
    fixed = make_loader(data, 8, 0, 1, CPU, collate_fn=pad_collate((0, -100, -1)))
    real = sum(data.lengths)
    padded = sum(x.numel() for x, _y, _i in fixed)
    assert 1 - real / padded > 0.4  # random batches of 8: mostly padding
    assert sum(padding) / len(padding) < 0.1  # sorted, budgeted: little


def test_each_step_logs_its_padding_and_tokens():
    logged = []
    loader = make_loader(
        SkewedText(n=40),
        None,
        0,
        1,
        CPU,
        tokens_per_batch=BUDGET,
        pad=(0, -100, -1),
        log=lambda **row: logged.append(row),
    )
    batches = list(loader)
    assert len(logged) == len(batches)
    for row, (x, _y, _idx) in zip(logged, batches, strict=True):
        assert row["tokens"] == int((_y != -100).sum())
        assert row["padding"] == pytest.approx(1 - row["tokens"] / x.numel())


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: make_loader(SkewedText(n=20), 4, 0, 1, CPU, tokens_per_batch=64),
            "give batch_size= .* or tokens_per_batch= .* not both",
        ),
        (
            lambda: make_loader(SkewedText(n=20), None, 0, 1, CPU, tokens_per_batch=8),
            r"sample \d+ has \d+ tokens, which does not fit tokens_per_batch=8",
        ),
        (
            lambda: make_loader(iter([1, 2]), None, 0, 1, CPU, tokens_per_batch=8),
            "tokens_per_batch= .* needs a map-style dataset",
        ),
        (
            lambda: make_loader(SkewedText(n=20), None, 0, 1, CPU, tokens_per_batch=0),
            "tokens_per_batch must be a positive int, got 0",
        ),
        (
            lambda: make_loader(SkewedText(n=20), 4, 0, 1, CPU, length=[1] * 20),
            "length= goes with tokens_per_batch=",
        ),
        (
            lambda: make_loader(SkewedText(n=20), None, 0, 1, CPU, tokens_per_batch=64, length=[3]),
            "length= has 1 values for a dataset of 20 samples",
        ),
        (
            lambda: make_loader(SkewedText(n=20), None, 0, 1, CPU),
            "needs batch_size= .* or tokens_per_batch=",
        ),
    ],
)
def test_misuse_names_the_values(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_lengths_come_from_a_function_a_key_or_a_list():
    rows = [{"ids": list(range(n)), "n": n} for n in (3, 1, 2)]
    by_key = make_loader(rows, None, 0, 1, CPU, tokens_per_batch=4, length="ids")
    by_fn = make_loader(rows, None, 0, 1, CPU, tokens_per_batch=4, length=lambda r: r["n"])
    by_list = make_loader(rows, None, 0, 1, CPU, tokens_per_batch=4, length=[3, 1, 2])
    assert by_key.lengths == by_fn.lengths == by_list.lengths == [3, 1, 2]
