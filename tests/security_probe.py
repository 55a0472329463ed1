"""A stranger's attempts on a cluster's ports, run as a script where the stranger is
(inside a namespace of the bed, or on this machine against a local cluster)::

    python tests/security_probe.py --marker /tmp/m --other-credentials x.pem ROLE=ADDRESS...

For each address (ROLE: scheduler, worker or nanny; any scheme) it tries
three ways in: plain ``tcp://``, ``tls://`` presenting no certificate, and ``tls://``
with a certificate of another CA. Each, once connected, asks the server to run a
function that creates the marker file (the scheduler's ``run_function`` and the
workers' and nannies' ``run``, as ``client.run_on_scheduler`` and ``client.run`` do).
Prints one JSON object: ``{"address way": "refused: ..." | "ANSWERED: ..."}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
from typing import Any


def make_marker(path: str) -> str:
    with open(path, "w") as f:
        f.write("the stranger's code ran here\n")
    return path


async def attempt(role: str, address: str, way: str, marker: str, other: str | None) -> str:
    from distributed.comm import connect
    from distributed.core import send_recv
    from distributed.protocol.pickle import dumps
    from distributed.security import Security

    host = address.split("://", 1)[-1]
    if way == "tcp":
        target, args = f"tcp://{host}", {}
    elif way == "tls-no-certificate":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # trust whatever answers; show nothing
        target, args = f"tls://{host}", {"ssl_context": context, "require_encryption": True}
    else:
        target = f"tls://{host}"
        args = Security(
            tls_ca_file=other, tls_client_cert=other, tls_client_key=other, require_encryption=True
        ).get_connection_args("client")
    try:
        comm = await connect(target, timeout=3, **args)
    except Exception as e:  # noqa: BLE001 - what refused it is the answer
        return f"refused: {type(e).__name__}: {str(e)[:160]}"
    try:
        function = dumps(make_marker)
        if role == "scheduler":  # client.run_on_scheduler
            message = {"op": "run_function", "function": function, "args": dumps((marker,))}
        else:  # client.run, on a worker or a nanny
            message = {"op": "run", "function": function, "args": dumps((marker,))}
        answer = await asyncio.wait_for(send_recv(comm, **message), 5)
        return f"ANSWERED: {str(answer)[:160]}"
    except Exception as e:  # noqa: BLE001 - the handshake failed once data flowed
        return f"refused: {type(e).__name__}: {str(e)[:160]}"
    finally:
        comm.abort()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for target in args.targets:
        role, _, address = target.partition("=")
        for way in ("tcp", "tls-no-certificate", "tls-other-ca"):
            if way == "tls-other-ca" and not args.other_credentials:
                continue
            out[f"{role} {address} {way}"] = await attempt(
                role, address, way, args.marker, args.other_credentials
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("targets", nargs="+", help="ROLE=ADDRESS (scheduler, worker, nanny)")
    parser.add_argument("--marker", required=True)
    parser.add_argument("--other-credentials", default=None)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(main_async(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
