"""One rank's checkpoints: saves (sync or async, at most one in flight) and restores.

A save goes through DCP into a fresh hidden directory of the root, this rank's
RNG states included, so that a failure on any rank (a full disk...) reaches
every rank as one ``CheckpointException`` and all of them carry on alike; rank
0 then commits it (:mod:`.storage`) and keeps the newest ``keep``. The
:class:`Saver` is given what it saves (the registered objects, the step) on
each call; it knows only its rank's place in the job.
"""

from __future__ import annotations

import copy
import errno
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from ... import checkpoint_files as files
from ...errors import CheckpointError
from ...protocol import RankEvent
from .staging import Gate, stager_for
from .state import Parts, check_matches, restore_rng, rng_state, shapes
from .storage import storage

logger = logging.getLogger(__name__)


class Saver:
    """Checkpoints of one job on one rank, under ``root``.

    ``report(event, **data)`` tells the control plane (rank 0 reports commits and
    failures); ``group`` is the process group DCP plans on (never the training
    group: an async save's collectives run in a background thread).
    """

    def __init__(
        self,
        root: str,
        *,
        keep: int,
        group: Any,
        report: Callable[..., None],
        rank: int,
        world_size: int,
        job: str,
        device: torch.device,
        pipeline: bool = False,
        attempt: int = 0,
    ):
        self.root, self.keep, self.group, self.report = root, keep, group, report
        self.rank, self.world_size, self.job = rank, world_size, job
        self.device, self.pipeline, self.attempt = device, pipeline, attempt
        self.last_step: int | None = None
        self._saves = 0
        self._nbytes = 1 << 16
        self._inflight: threading.Event | None = None
        self._stager: Any = None  # made on the first async save, kept (pinned buffers on CUDA)
        self._gate = Gate()

    def nbytes(self, stateful: Mapping[str, Any]) -> int:
        """About how many bytes one checkpoint of ``stateful`` takes."""
        return Parts.of(stateful).nbytes()

    # --- saving ------------------------------------------------------------------------
    def save(self, stateful: Mapping[str, Any], step: int, seq: int, blocking: bool) -> None:
        """Checkpoint ``stateful`` at ``step``; async unless ``blocking``. Rank 0 commits."""
        self.wait()
        if self.last_step == step:
            if self.rank == 0:
                self.report(
                    RankEvent.CHECKPOINT, step=step, path=files.step_dir(self.root, step), seq=seq
                )
            return
        self._saves += 1
        # The rows this rank logged before this step reach the journal before the
        # checkpoint can commit (rank 0 commits after every rank entered the save):
        # a restart from it then finds each earlier step's row, even from a rank that
        # dies right after.
        self.report(RankEvent.METRICS)
        parts = Parts.of(stateful)
        self._nbytes = parts.nbytes()
        place = storage(self.root)
        # the same on every rank, and another in each attempt (a rank of an earlier one
        # may still be stuck in its save)
        tmp = place.workdir(self.root, step, f"{self.job[:8]}-{self.attempt}-{self._saves}")
        state = parts.state()
        state["ranks"] = {str(self.rank): rng_state(step)}
        if blocking:
            try:
                dcp.save(state, storage_writer=place.writer(tmp), process_group=self.group)
            except BaseException as e:  # CheckpointException is a BaseException
                self._failed(place, step, tmp, e, seq)
                raise CheckpointError(
                    f"checkpoint at step {step} failed: {self._reason(e)}; the previous one is kept"
                ) from None
            self._done(place, step, tmp, seq)
            return
        done = threading.Event()
        self._inflight = done
        gated = self._gate.close_over(parts.model, parts.optimizers)
        try:  # python objects are copied now (a background copy could see them half-changed)
            state["extra"] = copy.deepcopy(state["extra"])
        except Exception:  # noqa: BLE001 - not copyable: stage all of it before going on
            gated = False
        if self._stager is None:
            self._stager = stager_for(self.device)
        response = dcp.async_save(
            state,
            storage_writer=place.writer(tmp),
            process_group=self.group,
            async_stager=self._stager,
        )
        self._gate.hold(response.staging_completion)
        if not gated:  # nothing tells us before the tensors change: copy them now
            self._gate.wait()

        def finished(f: Any) -> None:  # a concurrent.futures.Future
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001 - report, keep training
                self._failed(place, step, tmp, e, seq)
            else:
                self._done(place, step, tmp, seq)
            finally:
                done.set()

        response.upload_completion.add_done_callback(finished)

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed or has failed."""
        self._gate.wait()
        if self._inflight is not None:
            self._inflight.wait()
            self._inflight = None

    def close(self) -> None:
        """After the loop: the save in flight is over; free the staging thread and buffers."""
        self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def _done(self, place: Any, step: int, tmp: str, seq: int) -> None:
        self.last_step = step
        if self.rank != 0:
            return
        try:
            path = place.commit(tmp, files.step_dir(self.root, step), step, self.world_size)
        except Exception as e:  # noqa: BLE001 - an object store's errors are not all OSErrors
            self._failed(place, step, tmp, e, seq)
            return
        try:  # committed: a retention that fails must not undo that
            files.retain(self.root, self.keep)
        except Exception:  # noqa: BLE001 - the next commit retries it
            logger.warning("clustersdk: retention under %s failed", self.root, exc_info=True)
        self.report(RankEvent.CHECKPOINT, step=step, path=path, seq=seq)

    def _failed(self, place: Any, step: int, tmp: str, error: BaseException, seq: int) -> None:
        if self.rank == 0:
            try:
                place.discard(tmp)
            except Exception:  # noqa: BLE001 - a leftover: the next start removes it
                logger.warning("clustersdk: could not remove %s", tmp, exc_info=True)
            self.report(
                RankEvent.CHECKPOINT_FAILED, step=step, message=self._reason(error), seq=seq
            )

    def _reason(self, error: BaseException) -> str:
        """One line: the root cause, found inside DCP's CheckpointException if need be."""
        causes = [error]
        failures = getattr(error, "failures", None)
        if isinstance(failures, dict):  # DCP: rank -> (exception, stack summary)
            causes = [pair[0] for pair in failures.values()]
        free, needed = files.free_bytes(self.root), self._nbytes  # None: an object store
        # torch's own writers hide ENOSPC behind messages like "unexpected pos"
        if free is not None and (
            free < needed or any(isinstance(c, OSError) and c.errno == errno.ENOSPC for c in causes)
        ):
            return (
                f"no space left on the device ({free / 1024:.0f} KiB free, a checkpoint "
                f"needs about {needed / 1024:.0f} KiB)"
            )
        cause = causes[0]
        lines = str(cause).strip().splitlines()
        return f"{type(cause).__name__}: {lines[-1][:300] if lines else ''}"

    # --- restoring ---------------------------------------------------------------------
    def restore(self, stateful: Mapping[str, Any], path: str, skip: Collection[str] = ()) -> int:
        """Load ``path`` into ``stateful`` but the objects named in ``skip`` (restored
        already, by whoever made them); return the step it holds."""
        manifest = files.read_manifest(path)
        parts = Parts.of(stateful, skip=tuple(skip))
        place = storage(path)
        meta = place.reader(path).read_metadata().state_dict_metadata
        state = parts.state(
            with_optim=bool(parts.optimizers) and any(k.startswith("optim.") for k in meta)
        )
        check_matches(
            path,
            shapes(state, pipeline=self.pipeline, world_size=self.world_size, group=self.group),
            meta,
        )
        source = str(self.rank % manifest["world_size"])  # another world size: borrow
        state["ranks"] = {source: b""}
        dcp.load(state, storage_reader=place.reader(path), process_group=self.group)
        parts.load(state)
        restore_rng(state["ranks"][source])
        self.last_step = manifest["step"]
        return manifest["step"]
