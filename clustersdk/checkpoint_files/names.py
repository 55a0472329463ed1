"""What checkpoints are called: step directories, saves in progress, the manifest.

Pure (no I/O): shared by the directory side (:mod:`.local`) and the object-store
side (:mod:`.remote`), which resolve, commit and delete what these names name.
"""

from __future__ import annotations

import os
import re
import uuid

COMMITTED = re.compile(r"^step-(\d{8})$")  # a step's checkpoint, once committed
TMP_PREFIX = ".tmp-step-"  # a save in progress in a directory (renamed at the commit)
MANIFEST = "manifest.json"  # written last: step, world size, every file's size

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(://|::)")


def step_dir(root: str, step: int) -> str:
    """Where the checkpoint of ``step`` is under ``root`` (a directory or a URL).

    >>> step_dir("runs/a", 40)
    'runs/a/step-00000040'
    """
    return os.path.join(root, f"step-{step:08d}")


def tmp_dir(root: str, step: int, token: str) -> str:
    """Where a save of ``step`` writes before its commit (a directory root)."""
    return os.path.join(root, f"{TMP_PREFIX}{step:08d}-{token}")


def new_token() -> str:
    """A short random name part, so that two saves never share a path."""
    return uuid.uuid4().hex[:8]


def is_url(path: str) -> bool:
    """``path`` names a place through fsspec (``s3://...``), not a local directory.
    ``file://`` is local: the spec turns it into a plain path.

    >>> is_url("s3://bucket/run"), is_url("runs/a"), is_url("file:///tmp/a")
    (True, False, False)
    """
    return bool(_SCHEME.match(str(path))) and not str(path).startswith("file://")
