"""Checkpoints under an fsspec URL (``s3://bucket/run``, ``gs://``, ``memory://``...).

An object store has no rename, so the commit is the manifest, written last.
Layout of a checkpoint root::

    s3://bucket/run/step-00000040/
        manifest.json              written last, one PUT: the commit. Step, world size,
                                   the save it commits ("data") and its files' sizes
        3f2a91c0-0-2/              one save's DCP files: .metadata  __0_0.distcp ...
        3f2a91c0-1-1/              another attempt's, killed midway: never referenced

Each save writes into a prefix of its own under its step (so a rank of an
earlier attempt, still stuck in a save, can only touch its own files), and rank
0 commits it once every rank wrote, by writing ``manifest.json``. An object
appears whole or not at all, so a step is a checkpoint only when its manifest
parses and every file it lists has its recorded size; a save killed before
that leaves files that resolution ignores and the next start removes. A new
save of a step already committed replaces the manifest in one PUT: the step
always has a complete checkpoint. Retention deletes a step's manifest first,
then the rest, so a half-deleted checkpoint is never taken for a complete one.

Credentials and endpoint come from where the protocol's library looks for them
(for S3: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``~/.aws``, an instance role) or from fsspec's configuration
(``FSSPEC_S3_ENDPOINT_URL=...``, ``~/.config/fsspec/*.json``), on every worker.
Pure file handling (fsspec, no torch), like :mod:`.local`.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from typing import Any

from ..errors import CheckpointError
from .names import COMMITTED, MANIFEST

INSTALL_HINT = (
    "pip install 'clustersdk[s3]' (fsspec and s3fs; for another protocol, its fsspec package)"
)


def filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for ``url`` and the path on it (no protocol)."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise CheckpointError(
            f"checkpoint_dir {url!r} is a URL, which needs fsspec: {INSTALL_HINT}"
        ) from None
    try:
        fs, path = url_to_fs(url)
    except ImportError as e:  # fsspec knows the protocol, its package is missing
        raise CheckpointError(
            f"checkpoint_dir {url!r} needs a package that is missing ({e}): {INSTALL_HINT}"
        ) from None
    except ValueError as e:  # a protocol fsspec does not know
        raise CheckpointError(
            f"checkpoint_dir {url!r}: {e}; use a local path or a URL "
            "that fsspec knows (s3://bucket/prefix...)"
        ) from None
    return fs, path.rstrip("/")


def _sizes(fs: Any, path: str) -> dict[str, int]:
    """Every object under ``path`` (its path below it) and its size, listed afresh
    (other processes wrote them: a cached listing would be stale)."""
    fs.invalidate_cache(path)
    try:
        found = fs.find(path, detail=True)
    except FileNotFoundError:
        return {}
    return {
        name[len(path) + 1 :]: int(info["size"])
        for name, info in found.items()
        if name.startswith(path + "/") and info.get("type") != "directory"
    }


def _manifest_path(path: str) -> str:
    return f"{path}/{MANIFEST}"


# --- resolution --------------------------------------------------------------------------
def committed(root: str) -> list[tuple[int, str]]:
    """Committed and intact checkpoints under ``root``, oldest first, as ``(step, url)``."""
    fs, base = filesystem(root)
    fs.invalidate_cache(base)
    try:
        names = fs.ls(base, detail=False)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        leaf = posixpath.basename(name.rstrip("/"))
        match = COMMITTED.match(leaf)
        if match and _intact(fs, f"{base}/{leaf}"):
            found.append((int(match.group(1)), f"{root.rstrip('/')}/{leaf}"))
    return sorted(found)


def is_intact(url: str) -> bool:
    """The manifest exists, parses, and every file it lists has its recorded size."""
    try:
        fs, path = filesystem(url)
    except CheckpointError:
        return False
    return _intact(fs, path)


def _intact(fs: Any, path: str) -> bool:
    """Any other error than a missing or torn manifest is raised: a store that fails to
    answer must not make ``resume="auto"`` quietly take an older checkpoint."""
    try:
        manifest = json.loads(fs.cat_file(_manifest_path(path)))
        sizes = _sizes(fs, path)
        return all(sizes.get(name) == size for name, size in manifest["files"].items())
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return False


def read_manifest(url: str) -> dict[str, Any]:
    """The manifest of the checkpoint at ``url``: step, world size, its save, files."""
    fs, path = filesystem(url)
    return json.loads(fs.cat_file(_manifest_path(path)))


def data_url(url: str) -> str:
    """Where the DCP files of the checkpoint ``url`` (a step's) are."""
    return f"{url}/{read_manifest(url)['data']}"


def committed_at(url: str) -> float | None:
    """When the checkpoint at ``url`` was committed (its manifest's time), if the store says."""
    fs, path = filesystem(url)
    try:
        return fs.modified(_manifest_path(path)).timestamp()
    except (NotImplementedError, AttributeError):
        return None


# --- committing, removing ----------------------------------------------------------------
def write_manifest(data: str, step: int, world_size: int) -> None:
    """Commit the save whose DCP files are under ``data`` (a prefix of its step's): the
    manifest of its files (every object's size), in its step's prefix, written last."""
    fs, path = filesystem(data)
    step_path, name = posixpath.split(path)
    files = {f"{name}/{rel}": size for rel, size in sorted(_sizes(fs, path).items())}
    manifest = {"step": step, "world_size": world_size, "data": name, "files": files}
    fs.pipe_file(_manifest_path(step_path), json.dumps(manifest, indent=1).encode())


def drop_stale(url: str) -> list[str]:
    """Delete the saves under the checkpoint ``url`` that its manifest does not name
    (killed or replaced attempts); their names."""
    fs, path = filesystem(url)
    keep = json.loads(fs.cat_file(_manifest_path(path)))["data"]
    stale = sorted({rel.split("/", 1)[0] for rel in _sizes(fs, path) if "/" in rel} - {keep})
    for name in stale:
        fs.rm(f"{path}/{name}", recursive=True)
    return stale


def remove(url: str) -> None:
    """Delete the checkpoint, save or leftover at ``url``: its manifest first, then the rest."""
    fs, path = filesystem(url)
    for target, recursive in ((_manifest_path(path), False), (path, True)):
        try:
            fs.rm(target, recursive=recursive)
        except FileNotFoundError:
            pass
    fs.invalidate_cache(path)


def clean_leftovers(root: str) -> list[str]:
    """Remove the step prefixes that killed saves left without a manifest; their names."""
    fs, base = filesystem(root)
    fs.invalidate_cache(base)
    try:
        names = [posixpath.basename(n.rstrip("/")) for n in fs.ls(base, detail=False)]
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        if not COMMITTED.match(name):
            continue
        url = f"{root.rstrip('/')}/{name}"
        if MANIFEST not in _sizes(fs, f"{base}/{name}"):
            remove(url)
            removed.append(name)
        else:
            try:
                removed.extend(f"{name}/{stale}" for stale in drop_stale(url))
            except (OSError, ValueError, KeyError):  # an unreadable manifest: left alone
                pass
    return removed


def retain(root: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` committed checkpoints, oldest first; their URLs."""
    found = committed(root)
    doomed = [url for _, url in found[:-keep]] if keep > 0 else []
    for url in doomed:
        remove(url)
    return doomed


def check_writable(root: str) -> None:
    """Prove an object can be written (and deleted) under ``root``."""
    fs, base = filesystem(root)
    probe = f"{base}/.probe-{uuid.uuid4().hex[:8]}"
    try:
        fs.pipe_file(probe, b"clustersdk")
        fs.rm(probe)
    except Exception as e:  # noqa: BLE001 - botocore's errors are not all OSErrors
        raise CheckpointError(
            f"checkpoint_dir {root!r} is not writable ({type(e).__name__}: {e}); check that the "
            "bucket exists and that every worker has its credentials and endpoint (for S3: "
            "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, or fsspec's config)"
        ) from e
