"""Bring up or attach to a Dask cluster."""

from .base import Cluster

__all__ = ["Cluster"]
