"""How ``ctx.loop`` walks its data: batches across epochs, the epoch, and when to stop.

A loop ends after ``steps`` steps, or after ``epochs`` passes over its data,
whichever comes first. When the data has a length (batches per epoch), the
loop's total is known from the start (``epochs * len(data)``, or fewer
``steps``) and epoch ``e`` is steps ``[e * len, (e + 1) * len)``: a loader of
``ctx.shard`` keeps its global batch across a resume at another world size,
so its length, the total and every epoch boundary stay where they were.
A stream without a length ends an epoch when it runs out.

Loaders made by ``ctx.shard`` carry their own position (epoch and batches
taken); for any other iterable the loop counts passes itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import SpecError

END = object()  # the last epoch is over


def length_of(data: Any) -> int | None:
    """Batches per epoch, or None for a stream that does not know."""
    if data is None:
        return None
    try:
        return len(data)
    except TypeError:
        return None


def check_target(data: Any, steps: Any, epochs: Any) -> None:
    """Refuse a loop with no end, or with an end that is not a count."""
    for name, value in (("steps", steps), ("epochs", epochs)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise SpecError(f"{name} must be a non-negative int, got {value!r}")
    if steps is None and epochs is None:
        raise SpecError("ctx.loop needs steps= or epochs= (or both: it stops at the first)")
    if epochs is not None and data is None:
        raise SpecError("ctx.loop(None, epochs=...) has no data to count epochs in; use steps=")


def total_steps(data: Any, steps: int | None, epochs: int | None) -> int | None:
    """The step the loop ends before, when it is known now."""
    if epochs is None:
        return steps
    length = length_of(data)
    if length is None:  # a stream ends when it runs out, maybe before steps=
        return None
    return epochs * length if steps is None else min(steps, epochs * length)


class Batches:
    """The loop's iterator over ``data``, epoch after epoch (``next()`` returns :data:`END`
    once ``epochs`` passes are over)."""

    def __init__(self, data: Any, epochs: int | None, start_step: int):
        self.data = data
        self.epochs = epochs
        self.length = length_of(data)
        # a loader of ctx.shard knows its epoch; for anything else count passes, from
        # where the step count says this run begins (such data restarts from its start)
        self.own_epoch = hasattr(data, "end_of_epoch")
        self.passes = start_step // self.length if self.length else 0
        self.in_pass = 0
        self._it: Iterator[Any] | None = None

    @property
    def epoch(self) -> int:
        return self.data.epoch if self.own_epoch else self.passes

    def end_of_epoch(self) -> bool:
        """Whether the batch just taken is its epoch's last."""
        if self.own_epoch:
            return bool(self.data.end_of_epoch())
        return self.length is not None and self.in_pass >= self.length

    def next(self) -> Any:
        empty_passes = 0
        while True:
            if self._it is None:
                if self.epochs is not None and self.epoch >= self.epochs:
                    return END
                self._it = iter(self.data)
                self.in_pass = 0
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = None
                if self.in_pass:  # a pass that gave batches is simply over
                    if not self.own_epoch:
                        self.passes += 1
                    empty_passes = 0
                    self.in_pass = 0
                    continue
                empty_passes += 1
                # a loader resumed right at the end of a pass has nothing left of it, once
                if empty_passes > (1 if self.own_epoch else 0):
                    raise SpecError("ctx.loop got an empty data iterable") from None
                if not self.own_epoch:
                    self.passes += 1
                continue
            self.in_pass += 1
            return batch

    def close(self) -> None:
        """Stop the data's background reading, if any (the loop is over)."""
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if close is not None:
            close()
