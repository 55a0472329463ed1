"""Command line: ``python -m clustersdk demo|jobs|show|pause|resume|checkpoint|suspend|stop|logs|history``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clustersdk", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train a small model with DDP on a local cluster")
    demo.add_argument("--workers", type=int, default=2, help="ranks (default: 2)")
    demo.add_argument("--steps", type=int, default=2000, help="training steps (default: 2000)")

    from . import cli

    cli.add_commands(sub)  # jobs, show, pause, resume, checkpoint, suspend, stop, logs, history

    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run

        run(workers=args.workers, steps=args.steps)
        return 0
    return cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
