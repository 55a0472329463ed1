"""A job's committed checkpoints, read from its ``checkpoint_dir`` on this server's disk.

The SDK writes each checkpoint as ``<checkpoint_dir>/step-XXXXXXXX/`` with a
``manifest.json`` written last (see :mod:`clustersdk.checkpoint_files`);
this reads that layout through the SDK's own functions, so that what the panel
lists is what ``resume="auto"`` would consider. It works where the server sees
the directory the ranks write to (a local cluster, a shared filesystem, an
object store under a URL such as ``s3://bucket/run`` that this server has
credentials for); elsewhere the caller reports why not.

>>> scan("/no/such/dir")
[]
"""

from __future__ import annotations

from typing import Any

from clustersdk.checkpoint_files import committed, committed_at, read_manifest


def scan(directory: str) -> list[dict[str, Any]]:
    """Committed, intact checkpoints under ``directory``, oldest first:
    step, path, bytes (the sum of the manifest's files), time (when it was committed)
    and the world size it was saved at. A missing directory has none."""
    found = []
    for step, path in committed(directory):
        try:
            manifest = read_manifest(path)
            when = committed_at(path)
        except (OSError, ValueError):  # removed by retention since it was listed
            continue
        found.append(
            {
                "step": step,
                "path": path,
                "time": when,
                "bytes": sum(int(size) for size in manifest.get("files", {}).values()),
                "world_size": manifest.get("world_size"),
            }
        )
    return found
