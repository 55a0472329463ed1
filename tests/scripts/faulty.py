"""A script whose rank --rank fails on the first attempt (TORCHELASTIC_RESTART_COUNT 0), or
on every one with --always: it exits with --code, or raises under torch's @record with
--raise (which writes the error to TORCHELASTIC_ERROR_FILE)."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--code", type=int, default=3)
    parser.add_argument("--always", action="store_true")
    parser.add_argument("--raise", dest="raise_", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"rank {rank} attempt {attempt}", flush=True)
    dist.barrier()
    if rank == args.rank and (attempt == 0 or args.always):
        print(f"rank {rank}: the disk is on fire", file=sys.stderr, flush=True)
        if args.raise_:
            raise ValueError("bad batch 7")
        os._exit(args.code)
    time.sleep(0.5)
    dist.barrier()
    print(f"rank {rank} finished attempt {attempt}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
