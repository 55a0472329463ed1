"""Command line: ``python -m clustersdk demo|jobs``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clustersdk", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train a small model with DDP on a local cluster")
    demo.add_argument("--workers", type=int, default=2, help="ranks (default: 2)")
    demo.add_argument("--steps", type=int, default=2000, help="training steps (default: 2000)")

    jobs = sub.add_parser("jobs", help="list the jobs of a running cluster")
    jobs.add_argument("scheduler", help="the Dask scheduler address, e.g. tcp://10.0.0.5:8786")

    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run

        run(workers=args.workers, steps=args.steps)
    elif args.command == "jobs":
        _jobs(args.scheduler)
    return 0


def _jobs(address: str) -> None:
    import clustersdk as cs

    with cs.Cluster.connect(address) as cluster:
        print(f"{'name':<28} {'status':<10} {'ranks':>5}  strategy")
        for record in cluster.job_records():
            spec = record["spec"]
            print(f"{record['name']:<28} {record['status']:<10} {spec['world_size']:>5}  "
                  f"{spec['strategy']}")


if __name__ == "__main__":
    sys.exit(main())
