"""The doctor for the REST API: a short-lived asynchronous client to one cluster.

The doctor is rare and takes seconds, so it gets its own connection rather
than the manager's shared client; the checks themselves are the SDK's
(:func:`clustersdk.doctor.adoctor`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .errors import SchedulerUnavailableError
from .models import Target


async def run(
    target: Target, *, connect_timeout: float = 5.0, credentials: str | None = None, **options: Any
) -> dict[str, Any]:
    """The doctor's report on ``target``, as JSON (with the request's ``credentials`` on a
    TLS cluster)."""
    from distributed import Client

    from clustersdk.doctor import adoctor

    security = None
    if credentials is not None:
        from clustersdk.security.tls import credentials_security

        security = credentials_security(credentials)
    client = Client(
        target.address,
        asynchronous=True,
        set_as_default=False,
        timeout=connect_timeout,
        name="jupyter-clustersdk-doctor",
        security=security,
    )
    try:
        await asyncio.wait_for(client, connect_timeout + 1)
    except Exception as e:
        await _close(client)
        raise SchedulerUnavailableError(
            f"could not connect to the scheduler of cluster {target.id} ({target.address}): "
            f"{type(e).__name__}: {e}".rstrip(": ")
        ) from e
    try:
        report = await adoctor(client, **options)
    except (OSError, asyncio.TimeoutError) as e:
        raise SchedulerUnavailableError(
            f"the doctor could not finish on cluster {target.id}: {type(e).__name__}: {e}".rstrip(
                ": "
            )
        ) from e
    finally:
        await _close(client)
    return report.to_dict()


async def _close(client: Any) -> None:
    try:
        await asyncio.wait_for(client.close(), 5)
    except Exception:  # a dead scheduler: the client is gone anyway
        pass
