"""Where a job's checkpoints are and which of them count: names, manifests, resolution,
retention. Pure file handling (no torch, no Dask), so that every tier may use it: the
ranks save and resume with it (:mod:`clustersdk.runtime.checkpoint`), the launch checks
a directory with it, and the server extension lists a job's checkpoints with it.

A checkpoint root is a directory (:mod:`.local`: a save is renamed into place) or an
fsspec URL such as ``s3://bucket/run`` (:mod:`.remote`: an object store has no rename,
so the manifest written last is the commit). Every function here takes either and
hands it to the module for its kind; :mod:`.names` says what things are called.

>>> committed("runs/a")                         # doctest: +SKIP
[(40, 'runs/a/step-00000040'), (50, 'runs/a/step-00000050')]
>>> latest("s3://bucket/run")                   # doctest: +SKIP
's3://bucket/run/step-00000050'
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..errors import CheckpointError
from . import local, remote
from .names import COMMITTED, MANIFEST, TMP_PREFIX, is_url, step_dir, tmp_dir

__all__ = [
    "COMMITTED",
    "MANIFEST",
    "TMP_PREFIX",
    "check_space",
    "check_writable",
    "clean_leftovers",
    "committed",
    "committed_at",
    "free_bytes",
    "is_intact",
    "is_url",
    "latest",
    "read_manifest",
    "retain",
    "step_dir",
    "tmp_dir",
]


def _kind(path: str) -> ModuleType:
    """The module that handles roots like ``path``: :mod:`.remote` or :mod:`.local`."""
    return remote if is_url(path) else local


def committed(root: str) -> list[tuple[int, str]]:
    """Committed and intact checkpoints under ``root``, oldest first, as ``(step, path)``."""
    return _kind(root).committed(root)


def latest(root: str) -> str | None:
    """The newest committed, intact checkpoint under ``root``, or None."""
    found = committed(root)
    return found[-1][1] if found else None


def is_intact(path: str) -> bool:
    """The manifest exists, parses, and every file it lists has its recorded size."""
    return _kind(path).is_intact(path)


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path``: its ``step``, ``world_size`` and
    ``files`` (name -> size)."""
    return _kind(path).read_manifest(path)


def committed_at(path: str) -> float | None:
    """When the checkpoint at ``path`` was committed (its manifest's time), if known."""
    return _kind(path).committed_at(path)


def clean_leftovers(root: str) -> list[str]:
    """Remove what interrupted saves left behind under ``root``; what was removed."""
    return _kind(root).clean_leftovers(root)


def retain(root: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` committed checkpoints; the deleted paths."""
    return _kind(root).retain(root, keep)


def check_writable(root: str) -> None:
    """Prove that a file can be written under ``root`` (a directory is created if need
    be), or raise a :class:`~clustersdk.errors.CheckpointError` naming it."""
    _kind(root).check_writable(root)


def free_bytes(root: str) -> int | None:
    """Free space where ``root`` is (None for an object store: it has no such limit)."""
    return None if is_url(root) else local.free_bytes(root)


def check_space(root: str, needed: int) -> None:
    """Raise a :class:`~clustersdk.errors.CheckpointError` if ``root`` has less than
    ``needed`` bytes free."""
    free = free_bytes(root)
    if free is not None and free < needed:
        raise CheckpointError(
            f"checkpoint_dir {root!r} has {free / 2**20:.1f} MiB free, but one checkpoint of this "
            f"job needs about {needed / 2**20:.1f} MiB"
        )
