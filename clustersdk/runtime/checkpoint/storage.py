"""Where a job's checkpoints are written: the DCP writer and the commit, per root.

:class:`FileStorage` is a directory every rank can see: DCP writes each
rank's shards with fsync into a fresh hidden directory, and rank 0 commits it
by writing the manifest last and renaming the directory into place.
:func:`storage` makes the one a save uses; tests install one that fails on
purpose with :func:`override` (e.g. a process killed between two steps of a
commit), so the production path carries no test hooks.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch.distributed.checkpoint as dcp

from . import files
from .staging import background


class FileStorage:
    """Checkpoints in a directory of a filesystem every rank sees."""

    def writer(self, path: str) -> dcp.StorageWriter:
        """What DCP writes ``path`` with: files fsynced, two threads per rank."""
        return Writer(path, sync_files=True, thread_count=2)

    def reader(self, path: str) -> dcp.StorageReader:
        return dcp.FileSystemReader(path)

    def commit(self, tmp: str, final: str, step: int, world_size: int) -> str:
        """Make the finished ``tmp`` the checkpoint ``final`` (rank 0, once every rank wrote)."""
        self.write_manifest(tmp, step, world_size)
        self.publish(tmp, final)
        return final

    def write_manifest(self, tmp: str, step: int, world_size: int) -> None:
        files.write_manifest(tmp, step, world_size)

    def publish(self, tmp: str, final: str) -> None:
        files.publish(tmp, final)


class Writer(dcp.FileSystemWriter):
    """DCP's file writer; an async save's upload thread runs at a lower CPU priority."""

    def set_up_storage_writer(self, *args: Any, **kwargs: Any) -> None:
        if threading.current_thread().name.startswith("AsyncCheckpointExecutor"):
            background()  # DCP's upload thread of an async save (never a rank's own thread)
        super().set_up_storage_writer(*args, **kwargs)


_factory: Callable[[], FileStorage] = FileStorage


def storage() -> FileStorage:
    """The storage a save uses now."""
    return _factory()


def override(factory: Callable[[], FileStorage] | None) -> None:
    """Make saves in this process use ``factory()`` (None: back to :class:`FileStorage`)."""
    global _factory
    _factory = factory or FileStorage
