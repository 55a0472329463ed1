"""Checkpoints: DCP shards in atomic, fsynced step directories; the last K kept.

The package, by concern:

- :mod:`.files` (no torch): where checkpoints are, their manifest and commit,
  retention, space and write checks; what this module exports.
- :mod:`.remote` (fsspec, no torch): the same under a URL (``s3://bucket/run``), where
  the manifest written last is the commit (an object store has no rename).
- :mod:`.storage`: the writer DCP writes with and the commit, per root
  (:class:`~.storage.FileStorage`, :class:`~.storage.ObjectStorage`); tests swap in a
  storage that fails on purpose.
- :mod:`.state`: what a checkpoint holds, taken from the registered objects.
- :mod:`.staging`: copying the tensors of an async save in the background, and
  making what would change them wait for the copy.
- :mod:`.saver`: :class:`~.saver.Saver`, one rank's saves and restores.
- :mod:`.export`: the whole model as plain tensors on rank 0 (``ctx.full_state_dict``).
"""

from .files import (
    MANIFEST,
    TMP_PREFIX,
    CheckpointError,
    check_space,
    check_writable,
    clean_leftovers,
    commit,
    committed,
    committed_at,
    free_bytes,
    is_intact,
    is_url,
    latest,
    read_manifest,
    retain,
    step_dir,
    tmp_dir,
)

__all__ = [
    "MANIFEST",
    "TMP_PREFIX",
    "CheckpointError",
    "check_space",
    "check_writable",
    "clean_leftovers",
    "commit",
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
