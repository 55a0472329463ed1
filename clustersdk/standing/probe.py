"""Whether a standing cluster's scheduler answers, and knows a worker: Kubernetes' probes.

::

    python -m clustersdk.standing.probe scheduler tls://127.0.0.1:8786 --tls DIR
    python -m clustersdk.standing.probe worker tls://team-scheduler.ml.svc:8786 --tls DIR

Each opens one TLS connection to the scheduler with the cluster's files in ``--tls``
(its own certificate the role's, ``scheduler.pem`` or ``worker.pem``), asks Dask's
``identity`` and exits 0 if the scheduler answered (``worker``: and has a worker named
``--name``, by default ``$POD_NAME``, the pod's own), else 1 with the reason on stderr.

A ``tcpSocket`` probe would check less (that something listens) and cost a line in
the scheduler's log each time (a TLS handshake cut short is a warning); a complete
request costs none. It costs this process's start and Dask's import (about 0.7 s of
CPU), so the manifests probe every 15 to 30 seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

OK, FAILED = 0, 1
TIMEOUT_S = 5.0  # within the 10 s a probe has in the manifests


async def identity(address: str, tls: str, role: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """The scheduler's answer to ``identity``, asked as ``role`` with the files in ``tls``."""
    from distributed.core import rpc

    from ..security.tls import ClusterSecurity

    security = ClusterSecurity.in_directory(tls, client=os.path.join(tls, f"{role}.pem"))
    async with rpc(
        address, connection_args=security.get_connection_args("client"), timeout=timeout
    ) as scheduler:
        return await asyncio.wait_for(scheduler.identity(), timeout)


def check(role: str, address: str, tls: str, name: str | None, timeout: float) -> str | None:
    """Why the probe fails (None: it passes)."""
    try:
        found = asyncio.run(identity(address, tls, role, timeout))
    except (OSError, asyncio.TimeoutError) as e:
        return f"the scheduler at {address} does not answer: {e or f'not within {timeout:g} s'}"
    if role == "worker":
        names = [str(w.get("name")) for w in (found.get("workers") or {}).values()]
        if name not in names:
            return f"the scheduler at {address} has no worker named {name!r} (it has {names})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clustersdk.standing.probe")
    parser.add_argument("role", choices=("scheduler", "worker"), help="the container's role")
    parser.add_argument("address", help="the scheduler's address, tls://HOST:PORT")
    parser.add_argument("--tls", required=True, help="the directory of the cluster's TLS files")
    parser.add_argument(
        "--name",
        default=os.environ.get("POD_NAME"),
        help="worker: the worker's name (default: $POD_NAME)",
    )
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds (5)")
    args = parser.parse_args(argv)
    if args.role == "worker" and not args.name:
        parser.error("worker: give --name, or set POD_NAME")
    why = check(args.role, args.address, args.tls, args.name, args.timeout)
    if why is not None:
        print(f"clustersdk probe: {why}", file=sys.stderr)
        return FAILED
    return OK


if __name__ == "__main__":
    sys.exit(main())
