"""Which CPU cores each worker on a host runs on.

A host's workers each get a disjoint share of the cores the host lets them use
(``os.sched_getaffinity``: under Slurm or a container's cpuset, only the granted
ones), whole physical cores where there are enough (hyper-thread siblings stay
together), in core order. A worker binds every thread of its process to its
share when it starts; what it starts later (its zygote, and so every rank
process, their data-loader processes) inherits the binding. A rank then never waits for a core
while another worker's threads run on it, and its caches stay its own. It is
what ``torchrun --numa-binding`` and Slurm's ``--cpu-bind`` do for a process per
GPU.

Gloo's collective helper threads are the exception (:func:`free_helpers`): as each
``ctx.loop`` begins (in a script job, within a second of their start), they may run
on any CPU the host allows. The rank's compute and its connections stay on its
share, while the reductions of its collectives go to whichever core is idle instead
of waiting for its own rank's backward pass.

Measured on a 2-core machine, one core per worker: with every thread on the share,
a DDP MLP of 6 ms steps (``benchmarks/launch.py``) ran 0.946x torchrun's steps/s;
freeing the helpers ran the same cluster 1.09x faster on it, 1.21x on TP, 1.07x on
FSDP, 1.03-1.04x on DDP, PP and expert parallel (paired rounds of one cluster).
Against torchrun (``benchmarks/parallel.py``, medians of 3 paired rounds): DDP
1.03, FSDP 1.03, TP 1.11, PP 1.09, expert parallel 1.08; ``launch.py`` 1.024x
torchrun and 1.006x notebook_launcher.

With more workers than CPUs no worker is bound: a core shared by two workers
would sit idle whenever a job ran on only one of them. The share is given to
each worker's process in :data:`ENV` as a Linux CPU list (``"0-3,8-11"``).

A job that has more ranks on such a host than the host has CPUs keeps every core
busy whichever way its ranks are spread, so there each rank runs on one physical
core, round robin (:func:`rank_share`), for as long as it runs: its process
and every thread it starts. Left to the kernel, its ranks kept moving between
cores, each move with cold caches.
``bind_cpus=False`` (:data:`OFF`) turns this off too.
Measured on 2 cores, 4 ranks, against the same code unpinned (medians of 3 paired
rounds, a fresh cluster each): tensor parallel 1.70x, 2-D (FSDP x TP) 1.14x,
pipeline 1.08x, DDP 0.98x (rounds 0.94 to 1.15).

This module is plain standard library: ``cluster/remote.py`` loads it on hosts
where it runs as a file, without importing the package.

>>> split([[0, 4], [1, 5], [2, 6], [3, 7]], 2)
[[0, 1, 4, 5], [2, 3, 6, 7]]
>>> cpulist([0, 1, 2, 3, 8])
'0-3,8'
"""

from __future__ import annotations

import os

ENV = "CLUSTERSDK_CPUS"  # the worker's share, as a CPU list; absent: not bound
OFF = "off"  # ENV's value under bind_cpus=False: nothing bound, no rank pinned either
# Threads that carry out the collectives of a rank rather than its compute: gloo's
# collective workers, by the name torch gives them. They may run on any allowed CPU.
HELPERS = ("pt_gloo_runloop",)


def split(cores: list[list[int]], slots: int) -> list[list[int]] | None:
    """``slots`` disjoint shares of ``cores`` (each a physical core's logical CPUs, in
    order): contiguous runs of whole cores, the first ones one core larger when they
    don't divide evenly; of logical CPUs when there are fewer cores than slots but
    enough CPUs. ``None`` with fewer CPUs than slots."""
    if slots <= 0:
        raise ValueError(f"slots must be positive, got {slots}")
    if len(cores) < slots:
        cores = [[cpu] for core in cores for cpu in core]
        if len(cores) < slots:
            return None
    size, extra = divmod(len(cores), slots)
    shares, start = [], 0
    for i in range(slots):
        end = start + size + (i < extra)
        shares.append(sorted(cpu for core in cores[start:end] for cpu in core))
        start = end
    return shares


def cpulist(cpus: list[int]) -> str:
    """Linux's CPU-list text for ``cpus``: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def parse_cpulist(text: str) -> list[int]:
    """The CPUs of a CPU list: ``"0-2,5"`` -> ``[0, 1, 2, 5]``."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"not a CPU list: {text!r} (expected e.g. '0-3,8')") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"not a CPU list: {text!r} (expected e.g. '0-3,8')")
        cpus.update(range(lo, hi + 1))
    if not cpus:
        raise ValueError(f"not a CPU list: {text!r} (expected e.g. '0-3,8')")
    return sorted(cpus)


def host_cores(allowed: set[int] | None = None) -> list[list[int]]:
    """The allowed logical CPUs of this host grouped by physical core (from sysfs; each
    CPU its own core where sysfs does not say), ordered by socket and core."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    by_core: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(allowed):
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{topology}/physical_package_id") as f:
                package = int(f.read())
            with open(f"{topology}/core_id") as f:
                core = int(f.read())
        except (OSError, ValueError):
            package, core = -1, cpu
        by_core.setdefault((package, core), []).append(cpu)
    return [by_core[key] for key in sorted(by_core, key=lambda k: (k[0], min(by_core[k])))]


def shares(slots: int, allowed: set[int] | None = None) -> list[str] | None:
    """Each of this host's ``slots`` workers' share as a CPU list (of ``allowed``, by
    default the CPUs this process may use), or ``None`` with fewer CPUs than workers
    (nothing is bound)."""
    parts = split(host_cores(allowed), slots)
    return None if parts is None else [cpulist(p) for p in parts]


def bind_process(text: str) -> list[int]:
    """Bind every thread of this process to the CPUs of CPU list ``text`` (threads it
    starts later inherit it); the CPUs."""
    cpus = parse_cpulist(text)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile
    return cpus


def rank_share(
    hosts: list[str], rank: int, cores: list[list[int]] | None = None
) -> list[int] | None:
    """The CPUs rank ``rank`` of a job whose ranks run on ``hosts`` (one host per rank)
    keeps to on an unbound host with ``cores`` (physical cores' logical CPUs, by default
    :func:`host_cores`): ``None`` when the job's ranks on this host are no more than its
    CPUs; else the host's ``i``-th rank gets core ``i`` mod the cores, all of its CPUs.

    >>> rank_share(["a", "a", "a", "a"], 2, [[0], [1]])
    [0]
    >>> [rank_share(["a", "b", "a", "b", "a"], r, [[0, 2], [1, 3]]) for r in (0, 2, 4)]
    [None, None, None]
    >>> [rank_share(["a"] * 5 + ["b"], r, [[0, 2], [1, 3]]) for r in (0, 1, 4, 5)]
    [[0, 2], [1, 3], [0, 2], None]
    """
    cores = host_cores() if cores is None else cores
    local = [r for r, host in enumerate(hosts) if host == hosts[rank]]
    if not cores or len(local) <= sum(len(core) for core in cores):
        return None
    return sorted(cores[local.index(rank) % len(cores)])


def free_helpers(allowed: list[int], pid: int | None = None) -> int:
    """Let the collective helper threads (:data:`HELPERS`) of process ``pid`` (this one
    by default) run on any of ``allowed`` (every CPU the host lets its workers use); how
    many there were.

    A bound rank keeps its compute and its connections on its own share, while the
    reductions of its collectives go to whichever core is idle: with one core per
    worker, a DDP all-reduce no longer waits for its own rank's backward pass."""
    tasks = f"/proc/{pid or 'self'}/task"
    freed = 0
    try:
        tids = os.listdir(tasks)
    except OSError:
        return 0  # the process is gone
    for tid in tids:
        try:
            with open(f"{tasks}/{tid}/comm") as f:
                name = f.read().strip()
            if name.startswith(HELPERS):
                os.sched_setaffinity(int(tid), allowed)
                freed += 1
        except OSError:
            pass  # a thread that ended meanwhile
    return freed


def leave_starter() -> None:
    """Take this worker's process out of the process group of whatever started its nanny
    (a notebook's kernel, the script that called ``Cluster.local``).

    Jupyter interrupts a kernel by signalling its whole process group, as a terminal's
    Ctrl-C does: each worker took the SIGINT as its own KeyboardInterrupt, and left the
    cluster with its job. The worker stays in its starter's session. A session of its
    own per worker, as torchrun starts each rank, would also give it a CPU scheduling
    group of its own (Linux's autogroup, on by default, shares the cores between
    sessions first). Measured on 2 cores, paired rounds: 2 workers bound to one core
    each ran DDP 1.13x slower so (their freed collective helpers got only a session's
    share of a peer's core); 4 unbound workers ran a pipeline 1.04x faster, DDP 0.96x
    and 2-D 0.94x.

    Called only in a worker that a nanny started: a worker in the user's own process
    must not take that process out of its terminal's job. The worker still ends with its
    nanny (Dask's worker exits when the pipe from its parent closes)."""
    try:
        os.setpgid(0, 0)  # a group's leader already: nothing changes
    except OSError:  # a session's leader, or a sandbox that forbids it: left as started
        pass
