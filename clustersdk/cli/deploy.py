"""``clustersdk cluster unit | kubernetes NAME``: a standing cluster under systemd, or on Kubernetes.

::

    clustersdk cluster unit team [--out DIR] [--user USER] [--host HOST]
    clustersdk cluster kubernetes team --image IMAGE [--namespace NS] [--workers N]
        [--gpus-per-worker 1] [--storage-class SC] [--storage SIZE] [--no-secret] [--out FILE]

``unit`` writes systemd units for the processes a cluster that ``clustersdk cluster
up`` started runs on this host (:mod:`clustersdk.standing.units`), and prints the
commands that hand them over to systemd. ``kubernetes`` writes the manifests of a
cluster on Kubernetes with its own certificate authority
(:mod:`clustersdk.standing.kubernetes`) to ``--out`` or to stdout, and says how to
connect on stderr.
"""

from __future__ import annotations

import argparse
import sys

OK = 0


def unit(args: argparse.Namespace) -> int:
    from ..standing.units import write_units

    written = write_units(args.name, out=args.out, user=args.user, host=args.host)
    print(f"{args.name}: systemd units for its processes on {written.host}:")
    for path in written.files:
        print(f"  {path}")
    print("then, to run them under systemd (and again after every reboot):")
    for command in written.commands:
        print(f"  {command}")
    return OK


def kubernetes(args: argparse.Namespace) -> int:
    from ..standing.kubernetes import KubernetesSpec, flags, generate

    spec = KubernetesSpec(args.name, **{field: getattr(args, field) for field, *_ in flags()})
    made = generate(spec, secret=not args.no_secret, out=args.out)
    if made.out is None:
        sys.stdout.write(made.text)
    else:
        _say(f"{spec.name}: wrote {made.out}")
    if made.credentials is None:
        _say(f"{spec.name}: no Secret; without --no-secret the command writes it too")
        return OK
    target = made.out or "-"
    _say(
        f"{spec.name}: admin credentials: {made.credentials}\n"
        f"  kubectl apply -f {target}\n"
        f"  kubectl -n {spec.namespace} port-forward svc/{spec.scheduler} 8786:8786\n"
        f'  cs.Cluster.connect("tls://127.0.0.1:8786", credentials="{made.credentials}")\n'
        f"  (inside the Kubernetes cluster: {spec.address})"
    )
    return OK


def add_commands(inner: argparse._SubParsersAction) -> None:
    """``clustersdk cluster unit | kubernetes``."""
    from ..standing.kubernetes import flags

    units = inner.add_parser(
        "unit",
        help="write systemd units for a standing cluster's processes on this host",
        description="Write a systemd service for each process a standing cluster (from "
        "`clustersdk cluster up`) runs on this host, with its exact command line, and a "
        "target that groups them; print the commands that hand them to systemd, which "
        "then restarts them, and starts them after a reboot.",
    )
    units.add_argument("name", help="the standing cluster's name")
    units.add_argument("--out", default=".", metavar="DIR", help="where to write them (.)")
    units.add_argument(
        "--user", help="the account they run as (default: the owner of the cluster's files)"
    )
    units.add_argument(
        "--host", help="this machine's host in the cluster, where several share a home"
    )
    units.set_defaults(run=unit, verb="cluster unit")

    kube = inner.add_parser(
        "kubernetes",
        help="write Kubernetes manifests for a standing cluster with its own certificates",
        description="Write the manifests of a standing cluster on Kubernetes: a Secret with "
        "its certificates (its certificate authority made here, or reused), a volume for "
        "its journal and checkpoints, the scheduler's Deployment and Service, and a "
        "StatefulSet of GPU workers, every connection mutual TLS. To stdout unless --out.",
    )
    kube.add_argument("name", help="the cluster's name: its objects' prefix (a DNS label)")
    for field, flag, options in flags():
        kube.add_argument(flag, dest=field, **options)
    kube.add_argument(
        "--no-secret",
        action="store_true",
        help="leave the Secret out (to commit the manifests): no certificate authority is made",
    )
    kube.add_argument(
        "--out", metavar="FILE", help="write there (0600 with the Secret) instead of to stdout"
    )
    kube.set_defaults(run=kubernetes, verb="cluster kubernetes")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
