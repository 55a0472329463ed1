"""Defaults under ``dask.config["clustersdk"]``.

Override in code (``dask.config.set({"clustersdk.state-dir": ...})``), in a Dask
YAML file, or with environment variables such as ``DASK_CLUSTERSDK__STATE_DIR``.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml

_here = os.path.dirname(__file__)
with open(os.path.join(_here, "clustersdk.yaml")) as f:
    dask.config.update_defaults(yaml.safe_load(f))


def get(key: str, default: Any = None) -> Any:
    """``dask.config.get("clustersdk." + key)``."""
    return dask.config.get(f"clustersdk.{key}", default=default)


def state_dir(path: str | os.PathLike | None = None) -> str:
    """The state directory: ``path`` if given, else the configured one, expanded."""
    chosen = path if path is not None else get("state-dir")
    return os.path.abspath(os.path.expanduser(os.fspath(chosen)))
