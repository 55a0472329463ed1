"""Where a job's checkpoints are written: the DCP writer and the commit, per root.

:class:`FileStorage` is a directory every rank can see: DCP writes each
rank's shards with fsync into a fresh hidden directory, and rank 0 commits it
by writing the manifest last and renaming the directory into place.
:class:`ObjectStorage` is an fsspec URL (``s3://bucket/run``): DCP's fsspec
writer puts the shards straight into the step's prefix, and rank 0 commits it
by writing the manifest last (:mod:`clustersdk.checkpoint_files.remote`: an object
store has no rename).
:func:`storage` picks the one for a root; tests install one that fails on
purpose with :func:`override` (e.g. a process killed between two steps of a
commit), so the production path carries no test hooks.
"""

from __future__ import annotations

import errno
import functools
import logging
import shutil
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed.checkpoint as dcp

from ...checkpoint_files import is_url, local, remote, step_dir, tmp_dir
from ...errors import CheckpointError
from .staging import background

logger = logging.getLogger(__name__)


class FileStorage:
    """Checkpoints in a directory of a filesystem every rank sees."""

    def workdir(self, root: str, step: int, token: str) -> str:
        """Where the save of ``step`` writes: a fresh hidden directory, renamed at the commit."""
        return tmp_dir(root, step, token)

    def discard(self, path: str) -> None:
        """What a failed save wrote (rank 0)."""
        shutil.rmtree(path, ignore_errors=True)

    def writer(self, path: str) -> dcp.StorageWriter:
        """What DCP writes ``path`` with: files fsynced, two threads per rank."""
        quiet_disk_full()
        return Writer(path, sync_files=True, thread_count=2)

    def reader(self, path: str) -> dcp.StorageReader:
        return dcp.FileSystemReader(path)

    def commit(self, tmp: str, final: str, step: int, world_size: int) -> str:
        """Make the finished ``tmp`` the checkpoint ``final`` (rank 0, once every rank wrote)."""
        self.write_manifest(tmp, step, world_size)
        self.publish(tmp, final)
        return final

    def write_manifest(self, tmp: str, step: int, world_size: int) -> None:
        local.write_manifest(tmp, step, world_size)

    def publish(self, tmp: str, final: str) -> None:
        local.publish(tmp, final)


class ObjectStorage(FileStorage):
    """Checkpoints under an fsspec URL: written in place, committed by the manifest."""

    def workdir(self, root: str, step: int, token: str) -> str:
        """A prefix of the step's own to this save (see :mod:`clustersdk.checkpoint_files.remote`)."""
        return f"{step_dir(root, step)}/{token}"

    def discard(self, path: str) -> None:
        remote.remove(path)

    def writer(self, path: str) -> dcp.StorageWriter:
        """DCP's fsspec writer; an object is durable once its upload returns (no fsync)."""
        remote.filesystem(path)  # a missing package: a CheckpointError with the install hint
        return object_writer()(path, sync_files=False, thread_count=2)

    def reader(self, path: str) -> dcp.StorageReader:
        """The checkpoint ``path`` (a step's), read from the save its manifest names."""
        data = remote.data_url(path)
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(data)

    def write_manifest(self, tmp: str, step: int, world_size: int) -> None:
        remote.write_manifest(tmp, step, world_size)

    def publish(self, tmp: str, final: str) -> None:
        """The manifest was the commit: delete the saves of the step it does not name."""
        try:
            remote.drop_stale(final)
        except Exception:  # noqa: BLE001 - leftovers only: the next start removes them
            logger.warning("clustersdk: could not clean up under %s", final, exc_info=True)


class LowPriorityUploads:
    """Mixed into a DCP writer: an async save's upload thread runs at a lower CPU priority."""

    def set_up_storage_writer(self, *args: Any, **kwargs: Any) -> None:
        if threading.current_thread().name.startswith("AsyncCheckpointExecutor"):
            background()  # DCP's upload thread of an async save (never a rank's own thread)
        super().set_up_storage_writer(*args, **kwargs)  # type: ignore[misc]


class Writer(LowPriorityUploads, dcp.FileSystemWriter):
    """DCP's file writer; an async save's upload thread runs at a lower CPU priority."""


_WRITER_THREAD = "(_write_files_from_queue)"  # how Python names DCP's extra writer threads


@functools.cache
def quiet_disk_full() -> None:
    """Keep DCP's extra writer threads from printing a traceback each when the disk is
    full: the save already fails as a whole, and the job's checkpoint error says so in one
    line (``no space left on the device ...``). Other exceptions print as before."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        error: BaseException | None = args.exc_value
        full = False
        while error is not None and not full:
            full = isinstance(error, OSError) and error.errno == errno.ENOSPC
            error = error.__cause__ or error.__context__
        if full and args.thread is not None and args.thread.name.endswith(_WRITER_THREAD):
            logger.debug(
                "clustersdk: a DCP writer thread hit a full disk",
                exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
            )
            return
        previous(args)

    threading.excepthook = hook


@functools.cache
def object_writer() -> type:
    """DCP's fsspec writer (an optional package: made on first use), at a lower priority
    in an async save's upload thread."""
    try:  # torch 2.13 names it privately; importing it needs fsspec
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
    except ImportError as e:
        raise CheckpointError(
            f"checkpoints under a URL need fsspec ({e}): {remote.INSTALL_HINT}"
        ) from None

    class ObjectWriter(LowPriorityUploads, FsspecWriter):
        """DCP's fsspec writer; an async save's upload thread at a lower CPU priority."""

    return ObjectWriter


def for_root(root: str) -> FileStorage:
    """The storage of the checkpoints under ``root``: a URL's or a directory's."""
    return ObjectStorage() if is_url(root) else FileStorage()


_factory: Callable[[str], FileStorage] = for_root


def storage(root: str) -> FileStorage:
    """The storage a save (or a restore) under ``root`` uses now."""
    return _factory(root)


def override(factory: Callable[[str], FileStorage] | None) -> None:
    """Make saves in this process use ``factory(root)`` (None: back to :func:`for_root`)."""
    global _factory
    _factory = factory or for_root
