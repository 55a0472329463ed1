"""``clustersdk cluster add-user | remove-user | users``: who may use a TLS cluster.

The cluster's certificate authority lies in the state directory of the account
that created it (its registry entry names it); these commands run there::

    clustersdk cluster add-user bob [--admin] [--out bob.pem] [--cluster NAME|ADDRESS]
    clustersdk cluster remove-user bob [--cluster NAME|ADDRESS] [--credentials FILE]
    clustersdk cluster users [--cluster NAME|ADDRESS] [--json]

``add-user`` writes a credentials file (0600) and prints its path: hand it to the
person privately. ``remove-user`` revokes it on the running cluster at once.
"""

from __future__ import annotations

import argparse
import datetime

from .. import registry
from ..errors import SpecError
from . import commands, render

OK = 0


def _address(args: argparse.Namespace) -> str:
    """The cluster named by --cluster (an address, or a standing cluster's name), or the
    one cluster of the registry whose authority this account holds."""
    named = commands.address(args.cluster)
    if named is not None:
        return named
    mine = [e["address"] for e in registry.entries() if e.get("authority")]
    if len(mine) != 1:
        raise SpecError(
            f"--cluster NAME|ADDRESS is needed: this account created "
            f"{len(mine)} running TLS cluster(s){': ' if mine else ''}"
            f"{', '.join(mine)}"
        )
    return mine[0]


def _authority(address: str):  # noqa: ANN202 - pki.Authority, imported on use
    from ..security.pki import Authority

    found = registry.authority(address)
    if found is None:
        raise SpecError(
            f"this account does not hold the certificate authority of {address}: "
            "run this as the account that created the cluster"
        )
    return Authority(found)


def add_user(args: argparse.Namespace) -> int:
    """Credentials for a person; prints the file's path."""
    address = _address(args)
    path = _authority(address).add_user(args.name, admin=args.admin, path=args.out)
    if args.json:
        print(
            render.to_json(
                {"name": args.name, "admin": args.admin, "credentials": path, "cluster": address}
            )
        )
    else:
        role = "an admin" if args.admin else "a user"
        print(
            f"{path}\n(credentials of {args.name!r}, {role} of {address}: hand the file over "
            f"privately; they connect with Cluster.connect({address!r}, "
            f"credentials='<the file>'), or DASK_CLUSTERSDK__CREDENTIALS=<the file>)"
        )
    return OK


def remove_user(args: argparse.Namespace) -> int:
    """Revoke a person's credentials on the running cluster."""
    address = _address(args)
    _authority(address)  # a clear refusal before connecting
    with commands.connect(address, args.credentials) as cluster:
        cluster.remove_user(args.name)
    print(f"revoked the credentials of {args.name!r} on {address}: refused from now on")
    return OK


def users(args: argparse.Namespace) -> int:
    """Everyone ever given credentials, and whether they still hold them."""
    address = _address(args)
    found = _authority(address).users()
    if args.json:
        print(render.to_json(found))
        return OK
    rows = [
        [
            name,
            entry["role"],
            "revoked" if entry["revoked"] else "active",
            datetime.datetime.fromtimestamp(entry["expires"]).strftime("%Y-%m-%d %H:%M"),
            entry["file"],
        ]
        for name, entry in sorted(found.items())
    ]
    print(render.table(rows, ["NAME", "ROLE", "STATE", "EXPIRES", "FILE"]))
    return OK


def add_commands(inner: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``clustersdk cluster add-user | remove-user | users``."""
    add = inner.add_parser(
        "add-user", parents=[common], help="write credentials for a person (prints the file's path)"
    )
    add.add_argument("name", help="their name, as jobs will show it")
    add.add_argument("--admin", action="store_true", help="may change every job")
    add.add_argument(
        "--out",
        metavar="PATH",
        help="where to write the file (default: in the cluster's authority directory)",
    )
    add.set_defaults(run=add_user)
    remove = inner.add_parser(
        "remove-user", parents=[common], help="revoke a person's credentials at once"
    )
    remove.add_argument("name")
    remove.set_defaults(run=remove_user)
    listed = inner.add_parser("users", parents=[common], help="who holds credentials")
    listed.set_defaults(run=users)
