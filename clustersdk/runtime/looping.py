"""The step loop of ``TrainContext``: epochs, evaluation passes and control words.

:meth:`Looping.loop` walks the data (:mod:`.epochs`) and, at step
boundaries, has the ranks agree on the control vector (:mod:`.control`) and
act on it together: pause, checkpoint, suspend, stop. :meth:`Looping.evaluate`
runs a pass inside a step under the same control, without counting steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

import torch

from ..errors import SpecError
from ..protocol import RankEvent, Word, profile_request
from . import epochs as _epochs
from .anomalies import NanGuard
from .control_words import ControlCheck, JobSuspended
from .data import make_loader
from .phases import Timed

if TYPE_CHECKING:
    from .live import Live
    from .metrics import Metrics
    from .phases import PhaseClock
    from .profiling import Capture
    from .rebind import Rebinder


class Looping:
    """``ctx.loop``, ``ctx.evaluate`` and what they do at step boundaries (a part of
    :class:`~.context.TrainContext`, which provides the state they use)."""

    _metrics: Metrics
    _rebinder: Rebinder
    _batches: _epochs.Batches | None
    _phases: PhaseClock
    _capture: Capture | None
    _profiles_done: int
    _live: Live
    _nonfinite_done = 0  # the newest NONFINITE word acted on (on_nan)

    def loop(self, data: Iterable[Any] | None, steps: int | None = None, *,
             epochs: int | None = None) -> Iterator[tuple[int, Any]]:
        """Yield ``(step, batch)`` until ``steps`` steps or ``epochs`` passes over
        ``data`` are done (whichever comes first), or the job is stopped.

        ``ctx.epoch`` is the epoch of the batch just yielded and
        ``ctx.epoch_end`` says whether it was its epoch's last. With a length
        (a loader of ``ctx.shard``), the loop's total is ``epochs *
        len(data)`` from the start, and epoch boundaries stay at the same
        steps across a resume at another world size; a stream without one
        ends an epoch when it runs out. At step boundaries the ranks agree on
        the control vector (see :mod:`.control`), so that they all pause,
        checkpoint, suspend or stop at the same step. On the first call of a
        resumed job, everything that was registered is restored from the
        checkpoint before the first step.
        """
        _epochs.check_target(data, steps, epochs)
        first = not self._begun
        if first:
            self._begin()
        total = _epochs.total_steps(data, steps, epochs)
        if first and self.rank == 0 and total is not None:  # for progress bars and ETAs
            self._report(RankEvent.LOOP, total_steps=total)
        limit = total if total is not None else steps  # None: until the stream's epochs end
        batches = self._batches = _epochs.Batches(data, epochs, self.step) if data is not None else None
        # on_nan other than "report": every step checked, and agreed on before any save
        guard = NanGuard(self) if self.spec.on_nan != "report" else None
        skip = frozenset(self.spec.skip_steps or ())  # steps whose batch a rollback drops
        check = ControlCheck(self._control, self.step, self.world_size, self._control_group,
                             every_step=guard is not None)
        start = self.step
        clock = self._phases
        clock.bind()
        try:
            while limit is None or self.step < limit:
                clock.begin_step()
                if guard is not None and check.due(self.step):  # a NaN step is never saved
                    self.phase = "control"
                    if not self._act(check, check.agree(self.step), self.step):
                        self.stopped = True
                        return
                if self._every and self.step % self._every == 0 and self.step != start:
                    self.phase = "checkpoint"
                    self._save(self._checkpoints_done, blocking=not self._async)
                if check.due(self.step):
                    self.phase = "control"
                    if not self._act(check, check.agree(self.step), self.step):
                        self.stopped = True
                        return
                clock.before_data()
                batch = None
                if batches is not None:
                    self.phase = "data"
                    if self.step in skip and self._drop_batch(batches) is _epochs.END:
                        break
                    if self._capture is not None:
                        with self._capture.data():
                            batch = batches.next()
                    else:
                        batch = batches.next()
                    if batch is _epochs.END:
                        break
                    self.epoch = batches.epoch
                clock.after_data()
                self.phase = "step"
                yield self.step, batch
                clock.resumed(self.step)
                if guard is not None:
                    guard.after_step(self.step)
                if self.step == start:
                    self._first_step_done()
                    self._live.first_step(batch)  # what job.update may change here
                if self._capture is not None and self._capture.step_done():
                    self._finish_profile()
                self._metrics.end_step()
                self.step += 1
                self.ticks += 1
                if self.stopped:  # an evaluation in that step was told to stop
                    return
            if self._every and self.step % self._every == 0 and self.step != start:
                self.phase = "checkpoint"
                self._save(self._checkpoints_done, blocking=not self._async)
        finally:
            self.phase = "done"
            clock.abandon()
            if self._capture is not None:  # stopped, suspended or out of data: what it has
                self._finish_profile()
            self._metrics.end_step()
            if batches is not None:
                batches.close()
            self._batches = None
            if self._saver is not None:
                self._saver.close()

    @property
    def epoch_end(self) -> bool:
        """Whether the batch ``ctx.loop`` yielded last is its epoch's last (evaluate now)."""
        return self._batches is not None and self._batches.end_of_epoch()

    def evaluate(self, data: Any, batch_size: int | None = None, **options: Any) -> Iterator[Any]:
        """One pass over ``data``, under the job's control but not counted as steps.

        ``data`` is an iterable of batches (a loader of ``ctx.shard``), or a
        dataset with ``batch_size``: sharded as ``ctx.shard`` does, not
        shuffled, not saved in checkpoints. Every rank must get as many
        batches. ``ctx.log(..., reduce="mean")`` inside the pass accumulates;
        when the pass ends, the figures of every call on every rank are
        reduced and logged once, in the row of the current training step.
        Between batches the ranks agree on control words: a stop ends the
        evaluation (and ``ctx.loop`` before its next step), a pause holds
        it; a checkpoint or suspend asked meanwhile is taken at the next
        step boundary, after the evaluation.
        """
        if batch_size is not None:
            options.setdefault("shuffle", False)
            data = make_loader(data, batch_size, self.dp_rank, self.dp_size, self.device, **options)
        elif options:
            raise SpecError(f"ctx.evaluate({', '.join(options)}=...) needs batch_size= too")
        with self._metrics.evaluating() as evaluation:
            check = ControlCheck(self._control, 0, self.world_size, self._control_group)
            batches, index = iter(data), 0
            try:
                while True:
                    if check.due(index) and not self._act(check, check.agree(index), index,
                                                          evaluating=True):
                        self.stopped = True
                        return
                    self.phase = "evaluate"
                    batch = next(batches, _epochs.END)
                    if batch is _epochs.END:
                        break
                    yield batch
                    index += 1
                    self.ticks += 1  # an evaluation batch done is progress too
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()
            self._metrics.finish(self.step, evaluation)

    def _drop_batch(self, batches: _epochs.Batches) -> Any:
        """Draw the batch of a step that a rollback skips, and drop it."""
        dropped = batches.next()
        if self.rank == 0 and dropped is not _epochs.END:
            print(f"step {self.step}: its batch is dropped (it gave a non-finite value before "
                  "a rollback, on_nan='rollback')")
        return dropped

    def _first_step_done(self) -> None:
        """Misuse that only the first step shows: options left unused, a stale scheduler."""
        self._steps.check_used()
        optimizers = [o for o in self.stateful.values() if isinstance(o, torch.optim.Optimizer)]
        self._rebinder.check_schedulers(self.stateful, optimizers)
        if self.rank == 0:
            for note in self._rebinder.notes:
                print(note)
        self._rebinder.notes.clear()


    def _act(self, check: ControlCheck, words: list[int], at: int, evaluating: bool = False
             ) -> bool:
        """Carry out the agreed control vector; False means: leave the loop.

        ``at`` is the check's position (the step; in an evaluation, the batch).
        An evaluation runs inside a step, whose state is not a checkpoint's:
        a checkpoint or suspend waits for the next step boundary.
        """
        with self._metrics.holding():  # the step's row is not complete yet
            return self._act_on(check, words, at, evaluating)

    def _act_on(self, check: ControlCheck, words: list[int], at: int, evaluating: bool) -> bool:
        while True:
            if words[Word.STOP]:
                return False
            if words[Word.NONFINITE] > self._nonfinite_done:  # a rank saw a NaN or Inf
                self._nonfinite_done = words[Word.NONFINITE]
                if not NanGuard(self).act(words):
                    return False  # rollback or fail: the control plane takes it from here
            if words[Word.SUSPEND] and evaluating:
                return True  # finish the evaluation; suspend at the next step boundary
            if words[Word.SUSPEND]:
                self._need_saver("suspend")
                self.phase = "checkpoint"
                self._save(words[Word.CHECKPOINT], blocking=True)
                raise JobSuspended(f"suspended at step {self.step}")
            if words[Word.CHECKPOINT] > self._checkpoints_done and not evaluating:
                self._checkpoints_done = words[Word.CHECKPOINT]
                self._need_saver("checkpoint")
                self.phase = "checkpoint"
                self._save(words[Word.CHECKPOINT], blocking=not self._async)
            if self._live.due(words):  # job.run / job.update: a PAUSED job's too, at once
                self._live.act(words)
            if words[Word.PAUSE] <= words[Word.RESUME]:
                if self._paused:
                    self._paused = False
                    self._report(RankEvent.RESUMED, step=self.step)
                if not evaluating:
                    self._maybe_profile(words[Word.PROFILE])
                return True
            with Timed(self._phases, "paused"):
                if not self._paused:
                    self._paused = True
                    if self._saver is not None:
                        self._saver.wait()  # a paused job's last checkpoint is committed
                    self._report(RankEvent.PAUSED, step=self.step)
                self.phase = "paused"
                self._control.wait_beyond(words)
                self.phase = "control"
                words = check.agree(at)

    # profiling -----------------------------------------------------------------
    def _maybe_profile(self, word: int) -> None:
        """Start the capture a newer PROFILE word asks for (after the running one)."""
        seq, steps = profile_request(word)
        if seq <= self._profiles_done or self._capture is not None or steps < 1:
            return
        from .profiling import Capture, trace_dir

        self._profiles_done = seq
        try:
            self._capture = Capture(seq, steps, self.step, self.rank, trace_dir(self.spec, seq),
                                    self.device.type)
        except Exception as e:  # e.g. the training function runs a profiler of its own
            self._report(RankEvent.PROFILED, seq=seq, profile={
                "rank": self.rank, "seq": seq, "first_step": self.step, "steps": 0,
                "asked": steps, "error": f"{type(e).__name__}: {e}"})

    def _finish_profile(self) -> None:
        """Write this rank's trace and report it; a profile that fails never fails the job."""
        capture, self._capture = self._capture, None
        try:
            profile = capture.finish()
        except Exception as e:  # e.g. the disk is full
            profile = {"rank": self.rank, "seq": capture.seq, "first_step": capture.first,
                       "steps": capture.done, "asked": capture.steps,
                       "error": f"{type(e).__name__}: {e}"}
        self._report(RankEvent.PROFILED, seq=capture.seq, profile=profile)

    def _need_saver(self, action: str) -> None:
        if self._saver is None:
            raise SpecError(f"cannot {action}: this job has no checkpoint_dir")

    # metrics -------------------------------------------------------------------
