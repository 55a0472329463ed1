"""Model-parallel strategies: per-rank memory (DDP vs FSDP), steps/s (clustersdk vs
torchrun), and token-budget against fixed-size batches.

* **memory**: bytes of parameters + gradients + AdamW state each rank holds at
  their peak in a step, DDP against FSDP at 2 and 4 ranks (FSDP should hold
  about 1/N of DDP). A ~3.7M-parameter reference transformer.
* **steps/s**: every strategy (DDP, FSDP, TP, PP with GPipe, expert parallel
  on 2 and on 4 ranks; 2-D FSDP over TP on 4; 3-D, pipeline stages over FSDP x
  TP on a 2 x 2 x 2 mesh, on 8) trains the same reference transformer
  through ``ctx.prepare`` / ``ctx.train_step`` under clustersdk (a job on a
  warm local cluster of as many workers as the job has ranks, as torchrun
  starts as many processes) and under torchrun (``_parallel_workload.py``
  builds the ``TrainContext`` itself): the same code, another launcher. Each round
  runs every strategy under both, back to back (in alternating order), so
  that machine noise hits the pair alike; the ratio is the median of the
  rounds' paired ratios, printed with the target. ``--pair round`` pairs whole
  rounds instead (one torchrun start-up per round rather than per strategy:
  quicker, noisier).
* **token budgets**: the reference transformer (sequences up to 128 tokens)
  on a long-tailed length distribution (median ~26 tokens), DDP on 2 ranks,
  with fixed batches of 8 samples (each padded to its longest) against
  ``ctx.shard(data, tokens_per_batch=8 * 128)`` (the same worst case:
  8 samples of 128): the padding fraction, real tokens per step and per
  second, and the ratio of tokens/s. Under clustersdk only: the launcher is
  not what differs.

    python benchmarks/parallel.py                          # 3 rounds of 150 steps
    python benchmarks/parallel.py --repeats 1 --steps 12 --two-ranks-only --pair round  # smoke
    python benchmarks/parallel.py --only speed,tokens --cases 3-d   # the 3-D row and token budgets
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

# Before distributed is imported (here or in the workers, which inherit it).
os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")

import _parallel_workload as work  # noqa: E402
import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(work)  # Dask workers can't import benchmarks/

TARGET_STEPS_RATIO = 0.98  # clustersdk steps/s relative to torchrun's, every strategy
MiB = 2**20

# name -> world size, strategy, launch options (also the TrainContext spec under torchrun)
CASES: dict[str, tuple[int, str, dict[str, Any]]] = {
    "ddp": (2, "ddp", {}),
    "fsdp": (2, "fsdp", {}),
    "tp": (2, "tp", {}),
    "pp (gpipe, 4 mb)": (2, "pp", {"microbatches": 4}),
    "ep (4 experts)": (2, "ep", {}),
    "ddp x4": (4, "ddp", {}),
    "fsdp x4": (4, "fsdp", {}),
    "tp x4": (4, "tp", {}),
    "pp x4 (gpipe, 4 mb)": (4, "pp", {"microbatches": 4}),
    "ep x4 (4 experts)": (4, "ep", {}),
    "fsdp 2x2 (dp x tp)": (4, "fsdp", {"mesh": {"dp": 2, "tp": 2}}),
    "3-d 2x2x2 (pp x dp x tp)": (8, "fsdp", {"mesh": {"dp": 2, "tp": 2, "pp": 2}}),
}
SECTIONS = ("memory", "speed", "tokens")
TOKENS_RANKS = 2
MEMORY_CASES = [("ddp", 2), ("fsdp", 2), ("ddp", 4), ("fsdp", 4)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--steps", type=int, default=150, help="steps per timed run (default 150)")
    parser.add_argument(
        "--two-ranks-only",
        action="store_true",
        help="time only the 2-rank strategies (memory still at 2 and 4 ranks)",
    )
    parser.add_argument(
        "--pair",
        choices=("strategy", "round"),
        default="strategy",
        help="run the two launchers back to back per strategy (default) or per round",
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run, of {', '.join(SECTIONS)} (default: all)",
    )
    parser.add_argument(
        "--cases",
        default="",
        help="comma-separated beginnings of the strategy names to time "
        "(default: every strategy), e.g. '3-d,ddp' (ddp on 2 and on 4 ranks, and 3-D)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        parser.error(f"--only: unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.steps <= work.WARMUP_STEPS + 1:
        parser.error(
            f"--steps must exceed the {work.WARMUP_STEPS} warm-up steps by 2 or more, "
            f"got {args.steps}"
        )
    return args


# --- memory ---------------------------------------------------------------------------------
def measure_memory(cluster: Any) -> dict[str, dict[str, float]]:
    """Per case, the largest rank's MiB of each part (ranks differ by uneven shards)."""
    out = {}
    for strategy, ranks in MEMORY_CASES:
        per_rank = cluster.launch(work.memory, world_size=ranks, strategy=strategy).wait()
        biggest = max(per_rank, key=lambda r: r["params"] + r["grads"] + r["optim"])
        out[f"{strategy} x{ranks}"] = {k: v / MiB for k, v in biggest.items()}
    return out


def render_memory(mem: dict[str, dict[str, float]]) -> str:
    lines = [
        "per-rank memory (MiB): parameters + gradients + AdamW state, largest rank",
        f"{'strategy':<12}{'params':>9}{'grads':>9}{'optim':>9}{'total':>9}{'vs DDP':>9}{'1/N':>8}",
    ]
    for name, m in mem.items():
        strategy, ranks = name.split(" x")
        total = m["params"] + m["grads"] + m["optim"]
        ddp = mem[f"ddp x{ranks}"]
        ratio = total / (ddp["params"] + ddp["grads"] + ddp["optim"])
        lines.append(
            f"{name:<12}{m['params']:>9.2f}{m['grads']:>9.2f}{m['optim']:>9.2f}"
            f"{total:>9.2f}{ratio:>9.3f}{1 / int(ranks) if strategy == 'fsdp' else 1:>8.3f}"
        )
    return "\n".join(lines)


# --- steps/s --------------------------------------------------------------------------------
def time_clustersdk(cluster: Any, name: str, steps: int) -> float:
    ranks, strategy, options = CASES[name]
    job = cluster.launch(work.train, args=(steps,), world_size=ranks, strategy=strategy, **options)
    return job.wait()["steps_per_s"]


def time_torchrun(names: list[str], steps: int, tmp: str) -> dict[str, float]:
    """One torchrun per world size, running ``names`` in turn on its process group."""
    out: dict[str, float] = {}
    for ranks in sorted({CASES[n][0] for n in names}):
        cases = [
            {"name": n, "strategy": CASES[n][1], "spec": CASES[n][2]}
            for n in names
            if CASES[n][0] == ranks
        ]
        path = os.path.join(tmp, f"torchrun-{ranks}.json")
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            "--standalone",
            work.__file__,
            path,
            str(steps),
            json.dumps(cases),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
        with open(path) as f:
            out.update({n: r["steps_per_s"] for n, r in json.load(f).items()})
        os.remove(path)  # a stale file must never pass for the next round's result
    return out


def run_rounds(
    cluster: Any, names: list[str], repeats: int, steps: int, tmp: str, pair: str
) -> dict[str, dict[str, list[float]]]:
    runs: dict[str, dict[str, list[float]]] = {n: {"clustersdk": [], "torchrun": []} for n in names}
    for name in names:  # untimed: warm workers, as a notebook's second job finds them
        time_clustersdk(cluster, name, work.WARMUP_STEPS + 2)
    groups = [[n] for n in names] if pair == "strategy" else [names]
    for i in range(repeats):
        for group in groups:
            ways = {
                "clustersdk": lambda group=group: {
                    n: time_clustersdk(cluster, n, steps) for n in group
                },
                "torchrun": lambda group=group: time_torchrun(group, steps, tmp),
            }
            for way in list(ways) if i % 2 == 0 else list(ways)[::-1]:
                for name, speed in ways[way]().items():
                    runs[name][way].append(speed)
        line = "  ".join(
            f"{n} {r['clustersdk'][-1]:.0f}/{r['torchrun'][-1]:.0f}" for n, r in runs.items()
        )
        print(
            f"round {i + 1}/{repeats} (clustersdk/torchrun steps/s): {line}",
            file=sys.stderr,
            flush=True,
        )
    return runs


def summarize(runs: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Median steps/s of each way, and the median of the rounds' paired ratios."""
    return {
        n: {
            "clustersdk": statistics.median(r["clustersdk"]),
            "torchrun": statistics.median(r["torchrun"]),
            "ratio": statistics.median(a / b for a, b in zip(r["clustersdk"], r["torchrun"])),
        }
        for n, r in runs.items()
    }


def render_speed(med: dict[str, dict[str, float]]) -> str:
    lines = [f"{'strategy':<26}{'ranks':>6}{'clustersdk':>12}{'torchrun':>10}{'ratio':>8}"]
    for name, m in med.items():
        lines.append(
            f"{name:<26}{CASES[name][0]:>6}{m['clustersdk']:>12.1f}{m['torchrun']:>10.1f}"
            f"{m['ratio']:>8.3f}"
        )
    return "\n".join(lines)


# --- token budgets against fixed batches ------------------------------------------------------
def measure_tokens(cluster: Any, repeats: int, steps: int) -> dict[str, dict[str, list[float]]]:
    """Each way's figures per round (alternating which goes first)."""
    runs: dict[str, dict[str, list[float]]] = {"fixed": {}, "budget": {}}
    for way in runs:  # untimed: warm workers
        cluster.launch(
            work.train_tokens,
            args=(work.WARMUP_STEPS + 2, way == "budget"),
            world_size=TOKENS_RANKS,
            strategy="ddp",
        ).wait()
    for i in range(repeats):
        for way in ["fixed", "budget"] if i % 2 == 0 else ["budget", "fixed"]:
            got = cluster.launch(
                work.train_tokens,
                args=(steps, way == "budget"),
                world_size=TOKENS_RANKS,
                strategy="ddp",
            ).wait()
            for key, value in got.items():
                runs[way].setdefault(key, []).append(value)
        print(
            f"round {i + 1}/{repeats} (tokens/s fixed/budget): "
            f"{runs['fixed']['tokens_per_s'][-1]:.0f}/{runs['budget']['tokens_per_s'][-1]:.0f}",
            file=sys.stderr,
            flush=True,
        )
    return runs


def render_tokens(runs: dict[str, dict[str, list[float]]]) -> tuple[str, float]:
    """The table, and the median of the rounds' paired tokens/s ratios (budget / fixed)."""
    budget = work.BATCH * work.TOKENS_CONFIG.seq_len
    lines = [f"{'batches':<30}{'padding':>9}{'tokens/step':>13}{'steps/s':>9}{'tokens/s':>10}"]
    labels = {"fixed": f"fixed, {work.BATCH} samples", "budget": f"token budget, {budget} tokens"}
    for way, r in runs.items():
        med = {k: statistics.median(v) for k, v in r.items()}
        lines.append(
            f"{labels[way]:<30}{med['padding']:>9.3f}{med['tokens_per_step']:>13.0f}"
            f"{med['steps_per_s']:>9.1f}{med['tokens_per_s']:>10.0f}"
        )
    ratio = statistics.median(
        b / f for b, f in zip(runs["budget"]["tokens_per_s"], runs["fixed"]["tokens_per_s"])
    )
    lines.append(f"\ntokens/s, token budget / fixed batches: {ratio:.2f} x")
    return "\n".join(lines), ratio


def main(argv: list[str] | None = None) -> None:
    import clustersdk as cs

    args = parse_args(argv)
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    names = (
        [
            n
            for n in CASES
            if not (args.two_ranks_only and CASES[n][0] > 2)
            and (not wanted or any(n.startswith(w) for w in wanted))
        ]
        if "speed" in args.only
        else []
    )
    others = max(4 if "memory" in args.only else 0, TOKENS_RANKS if "tokens" in args.only else 0)
    result: dict[str, Any] = {"steps": args.steps, "repeats": args.repeats}
    memory = tokens = None
    runs: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # Each world size on a cluster of that many workers, as torchrun starts that many
        # processes (a bigger cluster's idle workers would wake beside the ranks).
        for ranks in sorted({CASES[n][0] for n in names}):
            group = [n for n in names if CASES[n][0] == ranks]
            state = os.path.join(tmp, f"state-{ranks}")
            with cs.Cluster.local(workers=ranks, state_dir=state) as cluster:
                runs.update(run_rounds(cluster, group, args.repeats, args.steps, tmp, args.pair))
        if others:
            state = os.path.join(tmp, "state")
            with cs.Cluster.local(workers=others, state_dir=state) as cluster:
                memory = measure_memory(cluster) if "memory" in args.only else None
                if "tokens" in args.only:
                    tokens = measure_tokens(cluster, args.repeats, args.steps)
    if memory is not None:
        print(f"\n{render_memory(memory)}\n")
        result["memory_mib"] = memory
    if names:
        med = summarize(runs)
        print(
            f"steps/s, median of {args.repeats} runs of {args.steps} steps "
            f"({work.WARMUP_STEPS} warm-up), gloo on CPU, 1 torch thread per rank, batch "
            f"{work.BATCH} per data-parallel rank\n"
        )
        print(render_speed(med))
        ratios = {n: m["ratio"] for n, m in med.items()}
        worst = min(ratios, key=ratios.get)
        met = ratios[worst] >= TARGET_STEPS_RATIO
        print(
            f"\ntarget: clustersdk steps/s >= {TARGET_STEPS_RATIO} x torchrun for every "
            f"strategy: lowest {ratios[worst]:.3f} x ({worst}) -> {'MET' if met else 'NOT MET'}"
        )
        result.update(runs=runs, medians=med, target_met=met)
    if tokens is not None:
        table, ratio = render_tokens(tokens)
        print(
            f"\ntoken budgets vs fixed batches, DDP on {TOKENS_RANKS} ranks, median of "
            f"{args.repeats} runs of {args.steps} steps, lengths 4-128 (long-tailed)\n"
        )
        print(table)
        result["tokens"] = {"runs": tokens, "tokens_per_s_ratio": ratio}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
