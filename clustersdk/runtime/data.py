"""``ctx.shard``: each rank's part of every global batch, with a saveable position.

:func:`make_loader` picks the loader for what it is given: Parquet files or a
pyarrow dataset (:mod:`.parquet`), a stream such as an ``IterableDataset``
(:mod:`.streams`), token-budget batches of variable-length samples
(``tokens_per_batch=``, :mod:`.budget`), or, here, a map-style dataset
(``len`` and indexing: a torch ``Dataset``, a Hugging Face
``datasets.Dataset``, a list).

A map-style dataset is permuted once per epoch (seeded, identical on every rank);
global batch ``b`` is ``perm[b*G:(b+1)*G]`` with ``G = batch_size * world_size``
and rank ``r`` takes its ``r``-th slice of it. So the union of the ranks'
batches at a step is the same whatever the world size, and the position is
one number: samples consumed in the current epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from .streams import Prefetcher, split_global_batch, to_device


def make_loader(
    dataset: Any,
    batch_size: int | None,
    rank: int,
    world_size: int,
    device: torch.device,
    **options: Any,
) -> Any:
    """The loader for ``dataset``: Parquet, stream or map-style (see the module docstring),
    or token-budget batches of a map-style dataset with ``tokens_per_batch=`` (see
    :mod:`.budget`). ``log``: where a loader logs its per-step figures (``ctx.log``)."""
    from .parquet import ParquetLoader, is_parquet

    tokens = options.pop("tokens_per_batch", None)
    log = options.pop("log", None)
    if tokens is not None:
        if batch_size is not None:
            raise ValueError(
                f"give batch_size= (samples) or tokens_per_batch= (a token budget) "
                f"per batch, not both: got batch_size={batch_size!r}, "
                f"tokens_per_batch={tokens!r}"
            )
        if is_parquet(dataset) or is_stream(dataset):
            raise ValueError(
                "tokens_per_batch= plans each epoch from every sample's length: it "
                f"needs a map-style dataset (len and indexing), not "
                f"{type(dataset).__name__}"
            )
        from .budget import TokenBudgetLoader

        return TokenBudgetLoader(dataset, tokens, rank, world_size, device, log=log, **options)
    for name in ("length", "pad"):
        if name in options:
            raise ValueError(f"{name}= goes with tokens_per_batch= (token-budget batches)")
    if batch_size is None:
        raise ValueError(
            "ctx.shard needs batch_size= (samples per data-parallel rank) or "
            "tokens_per_batch= (a token budget per batch, with length=)"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")

    if is_parquet(dataset):
        return ParquetLoader(dataset, batch_size, rank, world_size, device, **options)
    if is_stream(dataset):
        from .streams import StreamLoader

        options.pop("num_workers", None)  # a stream is read by its own background thread
        return StreamLoader(dataset, batch_size, rank, world_size, device, **options)
    options.setdefault("shuffle", True)
    if options["shuffle"] is None:
        options["shuffle"] = True
    return ShardedLoader(dataset, batch_size, rank, world_size, device, **options)


def is_stream(dataset: Any) -> bool:
    """An iterable without random access (a streaming Hugging Face dataset is one)."""
    if isinstance(dataset, IterableDataset):
        return True
    return hasattr(dataset, "__iter__") and not (
        hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
    )


class ShardedLoader:
    """Iterates one epoch of this rank's batches per ``iter()``, moved to ``device``."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device,
        shuffle: bool = True,
        seed: int = 0,
        collate_fn: Callable | None = None,
        num_workers: int = 0,
        prefetch: int = 0,
    ):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        n = len(dataset)
        if n < batch_size * world_size:
            raise ValueError(
                f"the dataset has {n} samples, fewer than one global batch "
                f"({batch_size} x {world_size} ranks = {batch_size * world_size})"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.shuffle = shuffle
        self.seed = seed
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be a non-negative int (batches), got {prefetch!r}")
        self.prefetch = prefetch  # batches read ahead by a background thread
        self.epoch = 0
        self.consumed = 0  # samples of the current epoch consumed by all ranks together

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        """Batches per epoch (the last partial global batch is dropped)."""
        return len(self.dataset) // self.global_batch

    def end_of_epoch(self) -> bool:
        """Whether the batch taken last was its epoch's last."""
        return self.consumed >= len(self) * self.global_batch

    def _batches(self) -> list[list[int]]:
        n = len(self.dataset)
        if self.shuffle:
            # distinct (seed, epoch) pairs never share a permutation
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            perm = torch.randperm(n, generator=g).tolist()
        else:
            perm = list(range(n))
        G, B, r = self.global_batch, self.batch_size, self.rank
        start = self.consumed // G
        return [perm[b * G + r * B : b * G + (r + 1) * B] for b in range(start, len(self))]

    def __iter__(self) -> Iterator[Any]:
        if self.consumed >= len(self) * self.global_batch:  # saved right at an epoch's end
            self.epoch, self.consumed = self.epoch + 1, 0
        # A DataLoader draws its workers' base seed from the global RNG at every
        # iter(); its own generator keeps the training RNG stream (dropout...)
        # the same whether or not the run was interrupted and resumed.
        seed = self.seed * 1_000_003 + self.epoch
        loader = DataLoader(
            self.dataset,
            batch_sampler=self._batches(),
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(seed),
        )
        reader = Prefetcher(iter(loader), self.prefetch, name=f"clustersdk-data-rank{self.rank}")
        try:
            for batch in reader:
                self.consumed += self.global_batch
                yield to_device(batch, self.device)
        finally:
            reader.close()
        self.epoch += 1
        self.consumed = 0

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "global_batch": self.global_batch,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue where ``state`` left off, at this loader's world size.

        The global batch of the saved run is kept (so that a run resumed at
        another world size sees the same batches); each rank's batch becomes
        ``global_batch / world_size``.
        """
        self.epoch, self.consumed, self.seed = state["epoch"], state["consumed"], state["seed"]
        self.batch_size = split_global_batch(
            state.get("global_batch", self.global_batch), self.world_size
        )
