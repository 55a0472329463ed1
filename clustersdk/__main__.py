"""Command line: ``clustersdk jobs|queue|show|pause|resume|...|submit|doctor|demo``
(or ``python -m clustersdk ...``); ``clustersdk COMMAND --help`` tells more."""

from __future__ import annotations

import argparse
import re
import sys


def main(argv: list[str] | None = None) -> int:
    from . import cli

    args = parse(sys.argv[1:] if argv is None else argv)
    if args.command == "demo":
        from .demo import run

        run(workers=args.workers, steps=args.steps)
        return 0
    return cli.run(args)


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed. What follows ``--`` is a submitted script's own arguments, also
    when flags of ``submit`` come after the script's name (``train.py --follow -- --lr 1``)."""
    top = parser()
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    args = top.parse_args(argv)
    if rest:
        if getattr(args, "script_args", None) is None:
            top.error("only `clustersdk submit` takes arguments after --: the script's own")
        args.script_args = [*args.script_args, *rest]
    return args


def parser() -> argparse.ArgumentParser:
    """The ``clustersdk`` command's parser, every subcommand in it."""
    from . import cli
    from .cli.render import unmarked
    from .version import __version__

    top = argparse.ArgumentParser(prog="clustersdk", description=unmarked(__doc__ or ""))
    top.add_argument("--version", action="version", version=f"clustersdk {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train a small model with DDP on a local cluster")
    demo.add_argument("--workers", type=int, default=2, help="ranks (default: 2)")
    demo.add_argument("--steps", type=int, default=2000, help="training steps (default: 2000)")

    cli.add_commands(sub)  # jobs, show, pause, resume, checkpoint, suspend, stop, logs, history

    doctor = sub.add_parser(
        "doctor",
        parents=[cli.cluster_flags(cli.ONE)],
        help="pre-flight checks of a running cluster; exit 1 on any problem",
    )
    doctor.add_argument(
        "scheduler",
        nargs="?",
        metavar="NAME|ADDRESS",
        help="the cluster, as --cluster takes it, e.g. tls://10.0.0.5:8786",
    )
    doctor.add_argument(
        "--checkpoint-dir", default=None, help="check free space, writes and sharing there"
    )
    doctor.add_argument("--no-bandwidth", action="store_true", help="skip the all-reduce sweep")
    doctor.add_argument(
        "--max-size",
        type=_bytes,
        default=None,
        help="largest all-reduce, e.g. 64MiB (default 256MiB)",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(run=_doctor)
    return top


def _bytes(text: str) -> int:
    """``"64MiB"``, ``"1M"``, ``"4096"`` -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 64MiB")
    return int(
        float(match[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match[2].lower()]
    )


def _doctor(args: argparse.Namespace) -> int:
    import json

    from .cli.commands import Clusters
    from .errors import SpecError

    if args.scheduler and args.cluster and args.scheduler != args.cluster:
        raise SpecError(f"doctor: {args.scheduler} or --cluster {args.cluster}, not both")
    with Clusters(args.scheduler or args.cluster, args.credentials) as clusters:
        report = clusters.one("doctor").doctor(
            checkpoint_dir=args.checkpoint_dir,
            bandwidth=not args.no_bandwidth,
            max_size=args.max_size,
        )
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
