"""``Cluster.connect``: attach to a running Dask cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import config, registry
from ..errors import SpecError

if TYPE_CHECKING:
    from .base import Cluster


def connect(
    cls: type[Cluster],
    target: Any,
    *,
    state_dir: str | None = None,
    timeout: float = 10,
    credentials: str | None = None,
    security: Any = None,
) -> Cluster:
    """Attach to a scheduler address, a standing cluster's name (``clustersdk cluster up
    NAME`` registered it), a Dask ``Cluster`` object or a ``Client``.

    The control plane is installed on the scheduler if it isn't there yet, so
    every process that connects sees the same jobs.

    A ``tls://`` scheduler wants credentials: ``credentials=`` (a file from
    ``cluster.add_user`` or ``clustersdk cluster add-user``), else the
    ``clustersdk.credentials`` setting (``DASK_CLUSTERSDK__CREDENTIALS``), else the
    registry's entry for that address (a cluster this account created or connected
    to). ``security=`` takes a ``distributed.Security`` of your own PKI instead.

    >>> cluster = Cluster.connect("tls://10.0.0.5:8786", credentials="~/bob.pem")  # doctest: +SKIP
    >>> cluster = Cluster.connect("team")   # a standing cluster of this account  # doctest: +SKIP
    """
    from distributed import Client
    from distributed.deploy.cluster import Cluster as DaskCluster

    if isinstance(target, Client):
        return cls(target, kind="connect", owns_client=False, state_dir=state_dir)
    if isinstance(target, str):  # a standing cluster's name: its address in the registry
        try:
            target = registry.resolve(target, state_dir)
        except KeyError as e:
            raise SpecError(str(e.args[0])) from None
    if isinstance(target, (str, DaskCluster)):
        path = None
        if isinstance(target, str) and security is None:
            security, path = _security_for(target, credentials, state_dir)
        try:
            client = Client(target, timeout=timeout, security=security)
        except OSError as e:
            hint = (
                " (refused during the TLS handshake? the credentials may be revoked, "
                "expired or of another cluster)"
                if str(target).startswith("tls://")
                else ""
            )
            raise SpecError(f"could not reach a Dask scheduler at {target!r}: {e}{hint}") from e
        try:
            return cls(client, kind="connect", state_dir=state_dir, credentials=path)
        except BaseException:
            client.close()
            raise
    raise SpecError(
        f"Cluster.connect expects a scheduler address, a dask Cluster or a Client, got "
        f"{type(target).__name__}"
    )


def _security_for(
    address: str, credentials: str | None, state_dir: str | None
) -> tuple[Any, str | None]:
    """The ``Security`` to reach ``address`` with, and the credentials file it came from."""
    if not address.startswith("tls://"):
        if credentials:
            raise SpecError(
                f"credentials are for tls:// schedulers, but {address!r} is plain "
                "(a cluster started with security=False)"
            )
        return None, None
    from ..security.tls import credentials_security

    path = credentials or config.get("credentials") or registry.credentials(address, state_dir)
    if not path:
        raise SpecError(
            f"the scheduler at {address} wants credentials (mutual TLS): pass "
            "credentials='path/to/file.pem' (its admin makes one with cluster.add_user(name) "
            "or `clustersdk cluster add-user NAME`), or set DASK_CLUSTERSDK__CREDENTIALS"
        )
    return credentials_security(path), path
