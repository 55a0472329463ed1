"""Checkpoints in a directory of a filesystem: resolution, commit, retention.

Layout of a checkpoint root::

    step-00000040/              committed (the rename is the commit)
        .metadata  __0_0.distcp  __1_0.distcp   torch.distributed.checkpoint
                                (including each rank's RNG states)
        manifest.json           written last before the rename: step, world size, file sizes
    .tmp-step-00000050-ab12/    a save in progress (or the leftover of a killed one)

A save writes everything into a fresh ``.tmp-`` directory and renames it into
place only after the data, DCP's metadata and the manifest are on disk and
fsynced, so an interrupted save never touches the previous checkpoint, and
resolution never returns a directory whose manifest does not match its files.
Pure file handling (no torch). :mod:`clustersdk.checkpoint_files` picks this
module or :mod:`.remote` for a root.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from ..errors import CheckpointError
from .names import COMMITTED, MANIFEST, TMP_PREFIX, new_token


# --- resolution -----------------------------------------------------------------------------
def committed(root: str) -> list[tuple[int, str]]:
    """Committed and intact checkpoints, oldest first, as ``(step, path)``."""
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


def is_intact(path: str) -> bool:
    """The manifest exists, parses, and every file it lists has its recorded size."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
        return all(
            os.path.getsize(os.path.join(path, name)) == size
            for name, size in manifest["files"].items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path``: step, world size, files."""
    with open(os.path.join(path, MANIFEST)) as f:
        return json.load(f)


def clean_leftovers(root: str) -> list[str]:
    """Remove what interrupted saves left behind; return what was removed."""
    removed = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        if name.startswith(TMP_PREFIX):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
    return removed


def retain(root: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` committed checkpoints; return the deleted paths."""
    found = committed(root)
    doomed = [path for _, path in found[:-keep]] if keep > 0 else []
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def check_writable(root: str) -> None:
    """Create ``root`` if needed and prove a file can be written and fsynced there."""
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


def free_bytes(root: str) -> int:
    """Free space on the filesystem of ``root``."""
    return shutil.disk_usage(root).free


def committed_at(path: str) -> float | None:
    """When the checkpoint at ``path`` was committed (its manifest's time)."""
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
    files = {
        name: os.path.getsize(os.path.join(tmp, name))
        for name in sorted(os.listdir(tmp))
        if name != MANIFEST
    }
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
