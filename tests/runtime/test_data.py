"""ShardedLoader: the ranks' batches at a step make up one global batch, whatever W."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import TensorDataset

from clustersdk.runtime.data import ShardedLoader

CPU = torch.device("cpu")
N = 40


def dataset(n: int = N) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def epoch(loader: ShardedLoader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def global_batches(world_size: int, batch_size: int, **kw) -> list[list[int]]:
    """Each step's batches of ranks 0..W-1, concatenated in rank order."""
    ds = dataset()
    ranks = [
        epoch(ShardedLoader(ds, batch_size, r, world_size, CPU, **kw)) for r in range(world_size)
    ]
    assert len({len(steps) for steps in ranks}) == 1  # every rank takes the same number of steps
    return [list(itertools.chain(*step)) for step in zip(*ranks)]


@pytest.mark.parametrize("world_size, batch_size", [(1, 8), (2, 4), (4, 2), (3, 3)])
def test_ranks_together_take_consecutive_slices_of_one_permutation(world_size, batch_size):
    G = world_size * batch_size
    unshuffled = global_batches(world_size, batch_size, shuffle=False)
    assert unshuffled == [list(range(b * G, (b + 1) * G)) for b in range(N // G)]

    shuffled = global_batches(world_size, batch_size, seed=3)
    seen = list(itertools.chain(*shuffled))
    assert len(shuffled) == N // G and all(len(b) == G for b in shuffled)
    assert len(set(seen)) == len(seen) == (N // G) * G  # no sample twice in an epoch
    assert seen != sorted(seen)


def test_global_batches_do_not_depend_on_world_size():
    # B * W = 8 throughout
    runs = [global_batches(w, 8 // w, seed=7) for w in (1, 2, 4)]
    assert runs[0] == runs[1] == runs[2]


def test_shuffle_is_seeded_and_changes_every_epoch():
    a = ShardedLoader(dataset(), 4, 0, 1, CPU, seed=1)
    b = ShardedLoader(dataset(), 4, 0, 1, CPU, seed=1)
    a0, a1 = epoch(a), epoch(a)
    assert a0 != a1
    assert (epoch(b), epoch(b)) == (a0, a1)
    assert epoch(ShardedLoader(dataset(), 4, 0, 1, CPU, seed=2)) != a0


@pytest.mark.parametrize("epochs_before", [0, 1])
def test_state_dict_resumes_mid_epoch(epochs_before):
    make = lambda: ShardedLoader(dataset(), 2, 1, 2, CPU, seed=5)  # noqa: E731
    loader = make()
    for _ in range(epochs_before):
        epoch(loader)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    rest = [batch[0].tolist() for batch in it]

    resumed = make()
    resumed.load_state_dict(state)
    assert epoch(resumed) == rest
    end = {"epoch": epochs_before + 1, "consumed": 0, "seed": 5, "global_batch": 4}
    assert resumed.state_dict() == loader.state_dict() == end


def test_a_dataset_smaller_than_one_global_batch_is_refused():
    with pytest.raises(ValueError, match=r"7 samples.*\(4 x 2 ranks = 8\)"):
        ShardedLoader(dataset(7), 4, 0, 2, CPU)


@pytest.mark.parametrize("batch_size", [0, -1, 2.0, True])
def test_batch_size_must_be_a_positive_int(batch_size):
    with pytest.raises(ValueError, match=f"batch_size .*got {batch_size!r}"):
        ShardedLoader(dataset(), batch_size, 0, 1, CPU)


def test_resuming_at_another_world_size_keeps_the_global_batch():
    two = [ShardedLoader(dataset(), 4, r, 2, CPU, seed=3) for r in range(2)]
    iters = [iter(loader) for loader in two]
    for it in iters:
        next(it)  # one global batch of 8 consumed
    state = two[0].state_dict()
    one = ShardedLoader(dataset(), 4, 0, 1, CPU, seed=3)
    one.load_state_dict(state)
    assert one.batch_size == 8
    merged = torch.cat([next(it)[0] for it in iters])
    assert torch.equal(next(iter(one))[0], merged)


def test_a_global_batch_that_does_not_split_is_refused():
    loader = ShardedLoader(dataset(), 2, 0, 3, CPU)
    with pytest.raises(ValueError, match="global batch of 8 can't be split evenly over 3 ranks"):
        loader.load_state_dict({"epoch": 0, "consumed": 0, "seed": 0, "global_batch": 8})
