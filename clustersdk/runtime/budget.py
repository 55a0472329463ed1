"""Token-budget batches: ``ctx.shard(data, tokens_per_batch=N, length=...)``.

For sequences of different lengths a fixed number of samples per batch
either wastes memory on padding (short samples padded to a long one) or
runs out of it (a batch of long ones). A token budget bounds what a batch
costs instead: each data-parallel rank's batch is whole samples padded to
its longest, with ``samples x longest <= tokens_per_batch``.

The plan of an epoch is the same on every rank and at every world size:
the samples, shuffled (seed and epoch) and then sorted by length (so that
equal lengths are met in a random order), are cut greedily into batches
that fit the budget - similar lengths together, little padding - and the
batches are shuffled (so that steps do not go from short to long). Each
step, the ``dp_size`` data-parallel ranks take the next ``dp_size`` batches
of that list, rank ``r`` the ``r``-th. So the position is one number, the
batches consumed in the epoch, and a job resumed at another world size
continues with the very next batch: no sample twice, none skipped.

The epoch's last step, when fewer batches are left than there are ranks,
cuts what is left into one batch per rank (halving the largest batch until
there are enough: a part of a batch fits the budget too); only when fewer
*samples* are left than ranks are those few left out of the epoch (as a
fixed-size loader drops its last partial batch).

Micro-batches: a batch that ``grad_accum`` (and, under a pipeline,
``microbatches``) cuts into equal pieces must hold a multiple of their
number of samples. ``multiple_of`` (set so by ``ctx.shard``) makes every
batch such a multiple: each epoch leaves ``len(data) % multiple_of``
samples out, drawn at random, and the last step may leave out a few more
when what is left can't make a multiple for every rank.

Each rank logs, per step, ``padding`` (the fraction of its batch that is
padding) and ``tokens`` (its real tokens) with ``ctx.log``. A loader has no
``len()``: the number of steps in an epoch depends on the world size, so
``ctx.loop(..., epochs=E)`` ends each epoch when its batches run out (like a
stream); :meth:`TokenBudgetLoader.steps_in_epoch` tells how many at this
world size.

>>> lengths = [3, 1, 4, 1, 5, 9, 2, 6]
>>> plan = pack(sorted(range(8), key=lengths.__getitem__), lengths, budget=10)
>>> [[lengths[i] for i in batch] for batch in plan]
[[1, 1, 2], [3, 4], [5], [6], [9]]
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from .streams import Prefetcher, to_device

Plan = list[list[int]]  # batches of sample indices


def pack(order: Sequence[int], lengths: Sequence[int], budget: int, multiple: int = 1) -> Plan:
    """Cut ``order`` (sample indices, shortest first) into consecutive batches of at most
    ``budget`` padded tokens (``samples x longest``), each a multiple of ``multiple``
    samples but perhaps the last: a batch that is full gives the samples past its last
    multiple to the next one (which ``multiple x longest <= budget`` lets take them)."""
    batches: Plan = []
    batch: list[int] = []
    for i in order:
        # shortest first: the sample coming is the longest of the batch it joins
        if batch and lengths[i] * (len(batch) + 1) > budget:
            cut = len(batch) - len(batch) % multiple
            batches.append(batch[:cut])
            batch = batch[cut:]
        batch.append(i)
    if batch:
        batches.append(batch)
    return batches


def split(batches: Plan, parts: int, multiple: int = 1) -> Plan | None:
    """``batches`` as exactly ``parts`` non-empty batches, halving the one with the most
    samples (the first such; in multiples of ``multiple``) until there are enough; None
    when there are too few samples. A part of a batch never costs more than the batch."""
    out = [list(b) for b in batches if b]
    while len(out) < parts:
        i = max(range(len(out)), key=lambda k: (len(out[k]), -k), default=None)
        if i is None or len(out[i]) < 2 * multiple:
            return None
        half = (len(out[i]) // multiple + 1) // 2 * multiple
        out[i : i + 1] = [out[i][:half], out[i][half:]]
    return out


def pad_collate(pad: Any = 0) -> Callable[[list[Any]], Any]:
    """A ``collate_fn`` that pads each sample's tensors along their first dimension to the
    longest of the batch and stacks them.

    ``pad`` is the fill value: one for every field, or one per field of a tuple sample
    (``(0, -100)`` for token ids and targets: -100 is what ``cross_entropy`` ignores)
    or per key of a dict sample.

    >>> collate = pad_collate((0, -100))
    >>> x, y = collate([(torch.tensor([1, 2]), torch.tensor([2, 3])),
    ...                 (torch.tensor([4]), torch.tensor([5]))])
    >>> x.tolist(), y.tolist()
    ([[1, 2], [4, 0]], [[2, 3], [5, -100]])
    """

    def fill(key: Any) -> Any:
        if isinstance(pad, (tuple, list)):
            return pad[key]
        if isinstance(pad, dict):
            return pad.get(key, 0)
        return pad

    def stack(values: list[Any], value: Any) -> Any:
        if not isinstance(values[0], torch.Tensor):
            return values
        if values[0].dim() == 0:
            return torch.stack(values)
        return pad_sequence(values, batch_first=True, padding_value=value)

    def collate(samples: list[Any]) -> Any:
        first = samples[0]
        if isinstance(first, dict):
            return {k: stack([s[k] for s in samples], fill(k)) for k in first}
        if isinstance(first, (tuple, list)):
            return type(first)(stack([s[k] for s in samples], fill(k)) for k in range(len(first)))
        return stack(samples, fill(0))

    return collate


def sample_lengths(dataset: Any, length: Any) -> list[int]:
    """Each sample's length in tokens, from ``length``: a sequence of ints (one per
    sample), a function of a sample, a key of dict samples (or a column of a Hugging Face
    dataset), or None: the first dimension of the sample's (first) tensor."""
    n = len(dataset)
    if isinstance(length, str):
        names = getattr(dataset, "column_names", None)
        if names is not None and length in names:  # a column, read at once
            return [int(v) if isinstance(v, numbers.Integral) else len(v) for v in dataset[length]]
        key = length
        length = lambda sample: len(sample[key])  # noqa: E731
    if callable(length):
        return [int(length(dataset[i])) for i in range(n)]
    if length is None:
        return [_first_len(dataset[i], i) for i in range(n)]
    values = length.tolist() if hasattr(length, "tolist") else list(length)
    if len(values) != n:
        raise ValueError(f"length= has {len(values)} values for a dataset of {n} samples")
    return [int(v) for v in values]


def _first_len(sample: Any, index: int) -> int:
    value = sample
    while isinstance(value, (tuple, list)) and value:
        value = value[0]
    if isinstance(value, dict) and value:
        value = next(iter(value.values()))
    if isinstance(value, torch.Tensor) and value.dim() >= 1:
        return int(value.shape[0])
    if hasattr(value, "__len__"):
        return len(value)
    raise ValueError(
        f"sample {index} has no length to budget: pass length= (a function of "
        "a sample, a key, or one int per sample)"
    )


class TokenBudgetLoader:
    """One epoch of this rank's token-budget batches per ``iter()``, moved to ``device``
    (see the module docstring). Made by ``ctx.shard(data, tokens_per_batch=N)``."""

    def __init__(
        self,
        dataset: Any,
        tokens_per_batch: int,
        rank: int,
        world_size: int,
        device: torch.device,
        length: Any = None,
        shuffle: bool | None = True,
        seed: int = 0,
        collate_fn: Callable | None = None,
        pad: Any = 0,
        num_workers: int = 0,
        prefetch: int = 0,
        multiple_of: int = 1,
        log: Callable[..., None] | None = None,
    ):
        budget = tokens_per_batch
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise ValueError(f"tokens_per_batch must be a positive int, got {budget!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be a non-negative int (batches), got {prefetch!r}")
        self.dataset = dataset
        self.lengths = sample_lengths(dataset, length)
        for i, n in enumerate(self.lengths):
            if not 0 < n <= budget:
                raise ValueError(
                    f"sample {i} has {n} tokens, which does not fit tokens_per_batch={budget}"
                    if n > 0
                    else f"sample {i} has length {n}: every sample needs a token"
                )
        if isinstance(multiple_of, bool) or not isinstance(multiple_of, int) or multiple_of < 1:
            raise ValueError(f"multiple_of must be a positive int, got {multiple_of!r}")
        if multiple_of * max(self.lengths) > budget:
            raise ValueError(
                f"tokens_per_batch={budget} can't hold {multiple_of} samples (the "
                f"micro-batches each batch is cut into) of the longest sample's "
                f"{max(self.lengths)} tokens: give {multiple_of * max(self.lengths)} "
                "or more"
            )
        if len(self.lengths) < world_size:
            raise ValueError(
                f"the dataset has {len(self.lengths)} samples, fewer than the "
                f"{world_size} data-parallel ranks"
            )
        self.tokens_per_batch = budget
        self.multiple_of = multiple_of
        self.rank, self.world_size, self.device = rank, world_size, device
        self.shuffle = True if shuffle is None else shuffle
        self.seed = seed
        self.collate_fn = collate_fn or pad_collate(pad)
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.log = log
        self.epoch = 0
        self.consumed = 0  # batches of the epoch's plan taken by all ranks together
        self._plan: tuple[tuple[int, ...], Plan] | None = None  # what it was made of, the plan

    # --- the plan ---------------------------------------------------------------------
    def plan(self, epoch: int | None = None) -> Plan:
        """Every batch of ``epoch`` (default: the current one), in the order steps take
        them: the same list on every rank and at every world size."""
        epoch = self.epoch if epoch is None else epoch
        key = (epoch, self.seed, self.tokens_per_batch, self.multiple_of)
        if self._plan is not None and self._plan[0] == key:
            return self._plan[1]
        n = len(self.lengths)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=g).tolist() if self.shuffle else list(range(n))
        # whole multiples in all: every batch is one (the first few of a shuffled order out)
        order = order[n % self.multiple_of :]
        order.sort(key=self.lengths.__getitem__)  # stable: equal lengths stay shuffled
        batches = pack(order, self.lengths, self.tokens_per_batch, self.multiple_of)
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
        self._plan = (key, batches)
        return batches

    def step_at(self, consumed: int, epoch: int | None = None) -> tuple[Plan, int] | None:
        """The batches of every rank for the step that starts at ``consumed``, and the
        position after it; None when the epoch has no step left."""
        plan, ranks = self.plan(epoch), self.world_size
        if consumed + ranks <= len(plan):
            return plan[consumed : consumed + ranks], consumed + ranks
        tail = split(plan[consumed:], ranks, self.multiple_of)
        return (tail, len(plan)) if tail is not None else None

    def steps_in_epoch(self) -> int:
        """Steps in the current epoch at this world size, from its start."""
        count, at = 0, 0
        while (step := self.step_at(at)) is not None:
            count, at = count + 1, step[1]
        return count

    def end_of_epoch(self) -> bool:
        """Whether the batch taken last was its epoch's last."""
        return self.step_at(self.consumed) is None

    # --- iterating --------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self.end_of_epoch():  # saved right at an epoch's end
            self.epoch, self.consumed = self.epoch + 1, 0
        mine: list[list[int]] = []
        after: list[int] = []
        at = self.consumed
        while (step := self.step_at(at)) is not None:
            batches, at = step
            mine.append(batches[self.rank])
            after.append(at)
        seed = self.seed * 1_000_003 + self.epoch
        loader = DataLoader(
            self.dataset,
            batch_sampler=mine,
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(seed),
        )
        reader = Prefetcher(iter(loader), self.prefetch, name=f"clustersdk-data-rank{self.rank}")
        try:
            for k, batch in enumerate(reader):
                self.consumed = after[k]
                if self.log is not None:
                    self.log(**self.stats(mine[k]))
                yield to_device(batch, self.device)
        finally:
            reader.close()
        self.epoch += 1
        self.consumed = 0

    def stats(self, batch: list[int]) -> dict[str, float]:
        """``tokens``: the real tokens of ``batch``; ``padding``: the fraction of its padded
        size (``samples x longest``) that is padding."""
        lengths = [self.lengths[i] for i in batch]
        real = sum(lengths)
        return {"tokens": real, "padding": 1 - real / (len(lengths) * max(lengths))}

    # --- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "tokens_per_batch": self.tokens_per_batch,
            "multiple_of": self.multiple_of,
            "samples": len(self.lengths),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue where ``state`` left off, at this loader's world size.

        The budget and multiple of the saved run are kept (they decide the plan
        the position counts in), as a fixed-size loader keeps the saved global
        batch.
        """
        samples = state.get("samples", len(self.lengths))
        if samples != len(self.lengths):
            raise ValueError(
                f"the checkpoint's loader had {samples} samples, this dataset has "
                f"{len(self.lengths)}: its position means nothing here"
            )
        self.epoch, self.consumed, self.seed = state["epoch"], state["consumed"], state["seed"]
        self.tokens_per_batch = state.get("tokens_per_batch", self.tokens_per_batch)
        self.multiple_of = state.get("multiple_of", self.multiple_of)
