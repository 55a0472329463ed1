"""Checkpoint directories on a filesystem: where they are, their commit, their retention.

Pure file handling (no torch), so that the server extension can list a job's
checkpoints too. Layout of a checkpoint root::

    step-00000040/              committed (the rename is the commit)
        .metadata  __0_0.distcp  __1_0.distcp   torch.distributed.checkpoint
                                (including each rank's RNG states)
        manifest.json           written last before the rename: step, world size, file sizes
    .tmp-step-00000050-ab12/    a save in progress (or the leftover of a killed one)

A save writes everything into a fresh ``.tmp-`` directory and renames it into
place only after the data, DCP's metadata and the manifest are on disk and
fsynced, so an interrupted save never touches the previous checkpoint, and
:func:`latest` never returns a directory whose manifest does not match its files.

A root that is a URL (``s3://bucket/run``) is an object store's, with no rename:
every function here hands it to :mod:`.remote`, where the manifest written last
is the commit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from typing import Any

from ...errors import CheckpointError
from . import remote
from .remote import is_url as is_url  # re-exported

COMMITTED = re.compile(r"^step-(\d{8})$")
TMP_PREFIX = ".tmp-step-"
MANIFEST = "manifest.json"


# --- where checkpoints are -------------------------------------------------------------
def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:08d}")


def tmp_dir(root: str, step: int, token: str) -> str:
    return os.path.join(root, f"{TMP_PREFIX}{step:08d}-{token}")


def new_token() -> str:
    return uuid.uuid4().hex[:8]


def committed(root: str) -> list[tuple[int, str]]:
    """Committed and intact checkpoints, oldest first, as ``(step, path)``."""
    if is_url(root):
        return remote.committed(root)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = COMMITTED.match(name)
        if match and is_intact(os.path.join(root, name)):
            found.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(found)


def latest(root: str) -> str | None:
    """The newest committed, intact checkpoint under ``root``, or None."""
    found = committed(root)
    return found[-1][1] if found else None


def is_intact(path: str) -> bool:
    """The manifest exists, parses, and every file it lists has its recorded size."""
    if is_url(path):
        return remote.is_intact(path)
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
        return all(os.path.getsize(os.path.join(path, name)) == size
                   for name, size in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def read_manifest(path: str) -> dict[str, Any]:
    if is_url(path):
        return remote.read_manifest(path)
    with open(os.path.join(path, MANIFEST)) as f:
        return json.load(f)


def clean_leftovers(root: str) -> list[str]:
    """Remove what interrupted saves left behind; return what was removed."""
    if is_url(root):
        return remote.clean_leftovers(root)
    removed = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        if name.startswith(TMP_PREFIX):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
    return removed


def retain(root: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` committed checkpoints; return the deleted paths."""
    if is_url(root):
        return remote.retain(root, keep)
    found = committed(root)
    doomed = [path for _, path in found[:-keep]] if keep > 0 else []
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def check_writable(root: str) -> None:
    """Create ``root`` if needed and prove a file can be written and fsynced there."""
    if is_url(root):
        return remote.check_writable(root)
    probe = os.path.join(root, f".probe-{new_token()}")
    try:
        os.makedirs(root, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"clustersdk")
            f.flush()
            os.fsync(f.fileno())
        os.remove(probe)
    except OSError as e:
        raise CheckpointError(
            f"checkpoint_dir {root!r} is not writable ({type(e).__name__}: {e.strerror or e}); "
            "pick a directory every rank can write to"
        ) from e


def free_bytes(root: str) -> int | None:
    """Free space where ``root`` is (None for an object store: it has no such limit)."""
    return None if is_url(root) else shutil.disk_usage(root).free


def check_space(root: str, needed: int) -> None:
    free = free_bytes(root)
    if free is not None and free < needed:
        raise CheckpointError(
            f"checkpoint_dir {root!r} has {free / 2**20:.1f} MiB free, but one checkpoint of this "
            f"job needs about {needed / 2**20:.1f} MiB"
        )


def committed_at(path: str) -> float | None:
    """When the checkpoint at ``path`` was committed (its manifest's time)."""
    if is_url(path):
        return remote.committed_at(path)
    return os.stat(os.path.join(path, MANIFEST)).st_mtime


# --- committing ------------------------------------------------------------------------------
def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_manifest(tmp: str, step: int, world_size: int) -> None:
    """The manifest of what ``tmp`` holds (every file's size), fsynced: written last."""
    files = {name: os.path.getsize(os.path.join(tmp, name))
             for name in sorted(os.listdir(tmp)) if name != MANIFEST}
    manifest = {"step": step, "world_size": world_size, "files": files}
    write_file(os.path.join(tmp, MANIFEST), json.dumps(manifest, indent=1).encode())
    fsync_dir(tmp)


def publish(tmp: str, final: str) -> None:
    """Rename the finished ``tmp`` into place: the commit."""
    os.rename(tmp, final)
    fsync_dir(os.path.dirname(final))


def commit(tmp: str, final: str, step: int, world_size: int) -> str:
    """Write the manifest and rename ``tmp`` to ``final``, fsyncing on the way."""
    write_manifest(tmp, step, world_size)
    publish(tmp, final)
    return final
