"""Multi-host launch: Cluster.ssh vs torchrun started on each host over SSH, in one run.

On the namespace bed (tests/multihost/netbed.py: 3 hosts, each its own network
namespace and sshd, eth0 between them), as root:

- ``Cluster.ssh`` to ready slots: from the call until every slot has its worker
  (3 hosts x 2 CPU slots), and the first launch on the fresh cluster;
- warm launch to first step: the DDP workload of ``_workload.py`` at 6 ranks
  across the hosts, on the cluster started above (a job has run before);
- torchrun, the way it is done by hand today: ``ssh HOST torchrun --nnodes 3
  --node-rank i --master-addr h1 ...`` on every host at once (OpenSSH's client),
  with GLOO_SOCKET_IFNAME=eth0 set by hand; timed to rank 0's first step.

Medians, with ratios; rounds interleave the two ways.

    sudo .venv/bin/python benchmarks/multihost.py               # 5 rounds of 100 steps
    sudo .venv/bin/python benchmarks/multihost.py --repeats 1 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")

import _workload  # noqa: E402
import cloudpickle  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the bed lives in tests/
from tests.multihost import netbed  # noqa: E402

cloudpickle.register_pickle_by_value(_workload)

HOSTS, SLOTS = 3, 2
WORLD = HOSTS * SLOTS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps <= _workload.WARMUP_STEPS:
        parser.error(f"--repeats must be >= 1 and --steps > {_workload.WARMUP_STEPS}")
    return args


def start_cluster(bed: netbed.Bed, state: str):
    import clustersdk as cs

    t0 = time.perf_counter()
    cluster = cs.Cluster.ssh(
        [h.address for h in bed.hosts],
        slots_per_host=SLOTS,
        key_file=bed.key_file,
        known_hosts=bed.known_hosts,
        python=sys.executable,
        state_dir=state,
    )
    ready = time.perf_counter() - t0
    assert len(cluster.slots()) == WORLD
    return cluster, ready


def time_clustersdk(cluster, steps: int) -> tuple[float, float]:
    t0 = time.time()
    result = cluster.launch(_workload.train_clustersdk, args=(steps,), world_size=WORLD).wait()
    return result["first_step"] - t0, result["steps_per_s"]


def time_torchrun(bed: netbed.Bed, steps: int, tmp: str, port: int) -> tuple[float, float]:
    """torchrun on every host through ``ssh``, as a person would type it."""
    out = os.path.join(tmp, "torchrun.json")  # one filesystem: rank 0 writes, we read
    master = bed.hosts[0].address
    procs = []
    t0 = time.time()
    for rank, host in enumerate(bed.hosts):
        remote = (
            f"cd {tmp} && GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 {sys.executable} -m "
            f"torch.distributed.run --nnodes={HOSTS} --nproc-per-node={SLOTS} "
            f"--node-rank={rank} --master-addr={master} --master-port={port} "
            f"{_workload.__file__} {out} {steps}"
        )
        procs.append(
            subprocess.Popen(
                [
                    "ssh",
                    "-i",
                    bed.key_file,
                    "-o",
                    f"UserKnownHostsFile={bed.known_hosts}",
                    "-o",
                    "BatchMode=yes",
                    f"root@{host.address}",
                    remote,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun over ssh exited with {proc.returncode}:\n{err[-3000:]}")
    with open(out) as f:
        timings = json.load(f)
    os.remove(out)
    return timings["first_step"] - t0, timings["steps_per_s"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    reason = netbed.missing()
    if reason:
        sys.exit(reason)
    runs: dict[str, list[tuple[float, float]]] = {"torchrun over ssh": [], "clustersdk (warm)": []}
    with netbed.Bed(HOSTS) as bed, tempfile.TemporaryDirectory() as tmp:
        cluster, ready = start_cluster(bed, os.path.join(tmp, "state"))
        try:
            first = time_clustersdk(cluster, args.steps)  # the cold cluster's first job
            for i in range(args.repeats):
                runs["torchrun over ssh"].append(time_torchrun(bed, args.steps, tmp, 29600 + i))
                runs["clustersdk (warm)"].append(time_clustersdk(cluster, args.steps))
                print(
                    f"round {i + 1}/{args.repeats}: "
                    + "  ".join(
                        f"{way} {r[-1][0]:.3f}s {r[-1][1]:.0f}/s" for way, r in runs.items()
                    ),
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            cluster.close()
    med = {
        way: {
            "first_step_s": statistics.median(r[0] for r in rs),
            "steps_per_s": statistics.median(r[1] for r in rs),
        }
        for way, rs in runs.items()
    }
    base, ours = med["torchrun over ssh"], med["clustersdk (warm)"]
    print(
        f"\n{HOSTS} hosts x {SLOTS} CPU slots ({WORLD} ranks, gloo over veth), {args.steps} "
        f"steps, median of {args.repeats}\n"
    )
    print(f"Cluster.ssh to ready slots          {ready:8.2f} s")
    print(
        f"  then its first launch to step 0   {first[0]:8.2f} s "
        f"(cold total {ready + first[0]:.2f} s)"
    )
    print(f"{'':<36}{'first step (s)':>15}{'steps/s':>10}")
    for way, m in med.items():
        print(f"{way:<36}{m['first_step_s']:>15.3f}{m['steps_per_s']:>10.1f}")
    speedup = base["first_step_s"] / ours["first_step_s"]
    ratio = ours["steps_per_s"] / base["steps_per_s"]
    print(
        f"\nwarm launch to first step: {speedup:.1f}x faster than torchrun over ssh; "
        f"cold (Cluster.ssh + first launch) vs torchrun: "
        f"{base['first_step_s'] / (ready + first[0]):.2f}x; steps/s ratio {ratio:.3f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "ready_s": ready,
                    "first_launch": first,
                    "medians": med,
                    "runs": runs,
                    "speedup_first_step": speedup,
                    "steps_ratio": ratio,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
