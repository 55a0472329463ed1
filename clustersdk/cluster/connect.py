"""``Cluster.connect``: attach to a running Dask cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import SpecError

if TYPE_CHECKING:
    from .base import Cluster


def connect(cls: type[Cluster], target: Any, *, state_dir: str | None = None,
            timeout: float = 10) -> Cluster:
    """Attach to a scheduler address, a Dask ``Cluster`` object or a ``Client``.

    The control plane is installed on the scheduler if it isn't there yet, so
    every process that connects sees the same jobs.

    >>> cluster = Cluster.connect("tcp://10.0.0.5:8786")   # doctest: +SKIP
    """
    from distributed import Client
    from distributed.deploy.cluster import Cluster as DaskCluster

    if isinstance(target, Client):
        return cls(target, kind="connect", owns_client=False, state_dir=state_dir)
    if isinstance(target, (str, DaskCluster)):
        try:
            client = Client(target, timeout=timeout)
        except OSError as e:
            raise SpecError(f"could not reach a Dask scheduler at {target!r}: {e}") from e
        try:
            return cls(client, kind="connect", state_dir=state_dir)
        except BaseException:
            client.close()
            raise
    raise SpecError(
        f"Cluster.connect expects a scheduler address, a dask Cluster or a Client, got "
        f"{type(target).__name__}"
    )
