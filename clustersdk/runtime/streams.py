"""``ctx.shard`` of a stream: an ``IterableDataset``, a streaming Hugging Face dataset, any iterable.

A stream has one global order and, usually, no length. Global batch ``b`` is
its samples ``[b*G, (b+1)*G)`` (``G = batch_size * world_size``) and rank
``r`` keeps its ``r``-th slice of them, as for a map-style dataset, so the
batches of a step are the same whatever the world size. Every rank reads the
whole stream to get there (a stream can't be split without knowing how it
is built; Parquet files are, see :mod:`.parquet`).

The position is the samples taken in the current pass. A resume continues
there: through the dataset's own ``state_dict()`` / ``load_state_dict()``
when it has them (Hugging Face ``datasets`` since 2.18; a shuffle buffer
starts empty again after a resume), else by reading the pass again from its
start and skipping what was taken (exact for any stream that repeats itself).

Reading runs ``prefetch`` global batches ahead in a background thread, so
that it overlaps the step; what was read ahead is not part of the position.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import default_collate

from ..errors import SpecError

_DONE = object()  # the pass is over
_NOTHING = object()  # nothing peeked yet


class Prefetcher:
    """Items of ``source``, produced ``depth`` ahead by a background thread (``depth=0``:
    on the caller's thread, one item of lookahead for :meth:`peek`)."""

    def __init__(self, source: Iterator[Any], depth: int, name: str = "clustersdk-prefetch"):
        self._source = source
        self._peeked: Any = _NOTHING
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        if depth > 0:
            self._queue: queue.Queue = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._produce, name=name, daemon=True)
            self._thread.start()

    def _produce(self) -> None:
        try:
            for item in self._source:
                if not self._put((True, item)):
                    return
            self._put((True, _DONE))
        except BaseException as e:  # noqa: BLE001 - the consumer raises it
            self._put((False, e))

    def _put(self, item: tuple[bool, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def peek(self) -> Any:
        """The next item without taking it (``_DONE`` at the end)."""
        if self._peeked is _NOTHING:
            if self._thread is None:
                self._peeked = next(self._source, _DONE)
            else:
                ok, value = self._queue.get()
                if not ok:
                    self._peeked = _DONE
                    raise value
                self._peeked = value
        return self._peeked

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        item = self.peek()
        if item is _DONE:
            raise StopIteration
        self._peeked = _NOTHING
        return item

    def close(self) -> None:
        """Stop reading ahead and let the thread end."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._queue.get(timeout=0.1)
                except queue.Empty:
                    pass
            self._thread = None


class StreamLoader:
    """Iterates one pass of the stream per ``iter()``: this rank's batches, on ``device``."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device,
        collate_fn: Callable | None = None,
        prefetch: int = 2,
        shuffle: bool | None = None,
        seed: int = 0,
    ):
        if shuffle:
            raise SpecError(
                f"ctx.shard can't shuffle a stream ({type(dataset).__name__}): shuffle it at its "
                "source (Hugging Face datasets: ds.shuffle(seed=..., buffer_size=...)); its "
                "set_epoch(epoch) is called at every pass"
            )
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise SpecError(f"prefetch must be a non-negative int (batches), got {prefetch!r}")
        self.dataset = dataset
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.device = device
        self.collate_fn = collate_fn or default_collate
        self.prefetch = prefetch
        self.seed = seed
        self.epoch = 0
        self.consumed = 0  # samples of the current pass taken by all ranks together
        # a stream that saves its own position: its state after the last batch taken
        self.resumable = callable(getattr(dataset, "state_dict", None)) and callable(
            getattr(dataset, "load_state_dict", None)
        )
        self._start = dataset.state_dict() if self.resumable else None
        self._state: Any = None
        self._reader: Prefetcher | None = None

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        """Batches per pass, if the stream knows its length."""
        try:
            n = len(self.dataset)
        except TypeError:
            raise TypeError(
                f"this stream ({type(self.dataset).__name__}) has no length: loop with steps=, "
                "or with epochs= (an epoch ends when the stream runs out)"
            ) from None
        return n // self.global_batch

    def end_of_epoch(self) -> bool:
        """Whether the batch taken last is the pass's last (reads ahead one batch)."""
        reader = self._reader
        return reader is None or reader.peek() is _DONE

    def __iter__(self) -> Iterator[Any]:
        reader = self._reader = Prefetcher(
            self._global_batches(), self.prefetch, name=f"clustersdk-stream-rank{self.rank}"
        )
        try:
            for batch, state in reader:
                self.consumed += self.global_batch
                self._state = state
                yield to_device(batch, self.device)
        finally:
            reader.close()
            if self._reader is reader:
                self._reader = None
        self.epoch, self.consumed, self._state = self.epoch + 1, 0, None

    def _global_batches(self) -> Iterator[tuple[Any, Any]]:
        """(this rank's collated slice, the stream's state after it), one per global batch."""
        samples = self._open()
        G, B, r = self.global_batch, self.batch_size, self.rank
        while True:
            batch = list(itertools.islice(samples, G))
            if len(batch) < G:  # the last partial global batch is dropped, as with len()
                return
            state = _encode(self.dataset.state_dict()) if self.resumable else None
            yield self.collate_fn(batch[r * B : (r + 1) * B]), state

    def _open(self) -> Iterator[Any]:
        """The stream's samples from the saved position on."""
        ds = self.dataset
        if self.resumable:
            ds.load_state_dict(
                _decode(self._state) if self.consumed and self._state else self._start
            )
        if callable(getattr(ds, "set_epoch", None)):
            ds.set_epoch(self.epoch)
        samples = iter(ds)
        if self.consumed and not (self.resumable and self._state):
            samples = itertools.islice(samples, self.consumed, None)  # read again, skip
        return samples

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "global_batch": self.global_batch,
            "stream": self._state or "",
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off; the saved global batch is kept."""
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        self._state = state.get("stream") or None
        self.batch_size = split_global_batch(int(state["global_batch"]), self.world_size)


def split_global_batch(global_batch: int, world_size: int) -> int:
    """Each rank's share of a checkpoint's global batch at this world size."""
    if global_batch % world_size:
        raise ValueError(
            f"the checkpoint's global batch of {global_batch} can't be split evenly over "
            f"{world_size} ranks; resume at a world size that divides it"
        )
    return global_batch // world_size


def _encode(state: Any) -> str:
    return json.dumps(state, sort_keys=True)


def _decode(state: str) -> Any:
    return json.loads(state)


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
