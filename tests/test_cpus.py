"""Each worker on a host gets a share of its cores of its own (clustersdk.cpus): the shares,
and a local cluster's workers and ranks bound to theirs."""

from __future__ import annotations

import json
import os
import threading

import pytest

import clustersdk as cs
from clustersdk import cpus


# --- shares -----------------------------------------------------------------------------------
def test_shares_are_whole_physical_cores_in_order():
    # 4 cores with hyper-thread siblings numbered as Linux does: (0, 4), (1, 5), ...
    cores = [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert cpus.split(cores, 1) == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert cpus.split(cores, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert cpus.split(cores, 3) == [[0, 1, 4, 5], [2, 6], [3, 7]]  # the first one core more
    assert cpus.split(cores, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_more_workers_than_cores_split_siblings_and_more_than_cpus_bind_nothing():
    cores = [[0, 2], [1, 3]]
    assert cpus.split(cores, 4) == [[0], [2], [1], [3]]
    assert cpus.split(cores, 5) is None
    assert cpus.split([[0], [1]], 3) is None
    with pytest.raises(ValueError, match="slots must be positive"):
        cpus.split(cores, 0)


def test_cpu_lists_read_and_write_as_linux_prints_them():
    assert cpus.cpulist([5, 0, 1, 2, 8, 9]) == "0-2,5,8-9"
    assert cpus.cpulist([3]) == "3"
    assert cpus.parse_cpulist("0-2,5,8-9") == [0, 1, 2, 5, 8, 9]
    assert cpus.parse_cpulist(cpus.cpulist([7, 1, 2])) == [1, 2, 7]
    for bad in ("", "a", "3-1", "-1", "1,,x"):
        with pytest.raises(ValueError, match="not a CPU list"):
            cpus.parse_cpulist(bad)


def test_a_host_shares_the_cpus_it_may_use_and_binds_nothing_with_too_few():
    allowed = set(range(9000, 9003))  # no sysfs topology: each CPU its own core
    assert cpus.shares(3, allowed) == ["9000", "9001", "9002"]
    assert cpus.shares(2, allowed) == ["9000-9001", "9002"]
    assert cpus.shares(4, allowed) is None


def test_this_hosts_cores_cover_exactly_the_cpus_it_may_use():
    allowed = os.sched_getaffinity(0)
    cores = cpus.host_cores()
    assert sorted(c for core in cores for c in core) == sorted(allowed)
    (share,) = cpus.shares(1)
    assert cpus.parse_cpulist(share) == sorted(allowed)
    shares = cpus.shares(len(allowed))
    assert sorted(c for s in shares for c in cpus.parse_cpulist(s)) == sorted(allowed)
    assert cpus.shares(len(allowed) + 1) is None


# --- a local cluster --------------------------------------------------------------------------
def _threads() -> list[tuple[int, str, list[int]]]:
    """Every thread of this process: its id, its name and the CPUs it may run on."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            out.append((int(tid), name, sorted(os.sched_getaffinity(int(tid)))))
        except OSError:
            continue  # a thread that ended meanwhile
    return out


def _affinity_of_every_thread() -> list[list[int]]:
    return [placed for _tid, _name, placed in _threads()]


def _rank_affinity(ctx) -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _threads_in_a_loop(ctx) -> dict:
    """In a training loop: this rank's share, and the CPUs of its thread, of gloo's
    collective helpers and of every other thread of its worker."""
    for _step, _ in ctx.loop(None, steps=2):
        pass
    me = threading.get_native_id()
    helpers, others = [], []
    for _tid, name, placed in _threads():
        (helpers if name.startswith(cpus.HELPERS) else others).append(placed)
    return {
        "share": os.environ.get(cpus.ENV, ""),
        "rank": sorted(os.sched_getaffinity(me)),
        "helpers": helpers,
        "others": others,
    }


def test_each_worker_and_its_ranks_run_on_their_own_cores(idle):
    """Two workers: bound to disjoint shares (unbound on a machine of one CPU); in a loop,
    the rank stays on its share and gloo's collective helpers may use every CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    expected = cpus.shares(2)
    slots = idle.slots()
    assert sorted(s["cpus"] for s in slots) == sorted(expected or ["", ""])
    threads = idle.client.run(_affinity_of_every_thread)
    for slot in slots:
        share = cpus.parse_cpulist(slot["cpus"]) if expected else allowed
        assert threads[slot["worker"]] and all(t == share for t in threads[slot["worker"]])
    job = idle.launch(_rank_affinity, world_size=2)
    assert job.wait(timeout=60) in ([cpus.parse_cpulist(s) for s in expected or []] or [allowed])

    seen = idle.launch(_threads_in_a_loop, world_size=2).wait(timeout=60)
    share = cpus.parse_cpulist(seen["share"]) if expected else allowed
    assert seen["share"] in (expected or [""])
    assert seen["rank"] == share
    assert len(seen["helpers"]) >= 2  # the default group's two, at least
    assert all(h == allowed for h in seen["helpers"])
    assert seen["others"] and all(t == share for t in seen["others"])


def _session() -> dict:
    return {"pid": os.getpid(), "pgrp": os.getpgrp(), "sid": os.getsid(0)}


def test_each_worker_leaves_the_notebooks_process_group(idle):
    """Out of the notebook's process group (its interrupts), in its session (the CPU
    scheduling group it shares with the notebook, see cpus.leave_starter)."""
    mine = _session()
    workers = idle.client.run(_session)
    assert len(workers) == 2
    for seen in workers.values():
        assert seen["pgrp"] == seen["pid"] != mine["pgrp"]
        assert seen["sid"] == mine["sid"]


THREADS_SCRIPT = """
import json, os, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
time.sleep(2.5)  # its worker frees the collective helpers within a second
helpers, others = [], []
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/comm") as f:
        name = f.read().strip()
    placed = sorted(os.sched_getaffinity(int(tid)))
    (helpers if name.startswith("pt_gloo_runloop") else others).append(placed)
with open(f"{sys.argv[1]}.{dist.get_rank()}", "w") as f:
    json.dump({"share": os.environ.get("CLUSTERSDK_CPUS", ""), "helpers": helpers,
               "others": others}, f)
dist.barrier()
dist.destroy_process_group()
"""


def test_a_script_ranks_collective_helpers_are_freed_too(idle, tmp_path):
    """A script job's process inherits its worker's share; its worker frees the gloo
    helpers the script's process group starts, as ctx.loop does for a rank thread."""
    allowed = sorted(os.sched_getaffinity(0))
    expected = cpus.shares(2)
    script = tmp_path / "threads.py"
    script.write_text(THREADS_SCRIPT)
    out = tmp_path / "seen"
    idle.launch_script(str(script), [str(out)], world_size=2).wait(timeout=120)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"seen.{rank}").read_text())
        share = cpus.parse_cpulist(seen["share"]) if expected else allowed
        assert seen["share"] in (expected or [""])
        assert len(seen["helpers"]) >= 2 and all(h == allowed for h in seen["helpers"])
        assert seen["others"] and all(t == share for t in seen["others"])


def _placement_of_every_rank(ctx) -> list[dict] | None:
    """In a loop, on every rank: the CPUs of the rank's main thread, of the threads of its
    process groups (gloo's), and of its process's other threads; rank 0 returns them all."""
    import torch.distributed as dist

    for _step, _ in ctx.loop(None, steps=2):
        pass
    me = threading.get_native_id()
    groups, others = [], []
    for tid, name, placed in _threads():
        if tid != me:
            (groups if "gloo" in name else others).append(placed)
    seen = {"rank": sorted(os.sched_getaffinity(me)), "groups": groups, "others": others}
    everyone: list = [None] * ctx.world_size
    dist.all_gather_object(everyone, seen)
    return everyone if ctx.rank == 0 else None


SCRIPT_AFFINITY = """
import os, sys
with open(f"{sys.argv[1]}.{os.environ['RANK']}", "w") as f:
    f.write(",".join(map(str, sorted(os.sched_getaffinity(0)))))
"""


def test_a_worker_alone_is_bound_to_every_cpu_and_more_workers_than_cpus_to_none(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) > 4:
        pytest.skip("starts one worker more than this machine has CPUs")
    alone = cs.Cluster.local(workers=1, state_dir=str(tmp_path / "one"))
    try:
        assert [s["cpus"] for s in alone.slots()] == [cpus.cpulist(allowed)]
        assert alone.launch(_rank_affinity, world_size=1).wait(timeout=60) == allowed
    finally:
        alone.close()
    crowded = cs.Cluster.local(workers=len(allowed) + 1, state_dir=str(tmp_path / "many"))
    try:
        assert {s["cpus"] for s in crowded.slots()} == {""}
        for threads in crowded.client.run(_affinity_of_every_thread).values():
            assert all(t == allowed for t in threads)
        # a job of more ranks than CPUs: each rank's process, every thread of it (its process
        # groups' too), on one core, round robin; the workers' own threads stay unbound
        cores = cpus.host_cores(set(allowed))
        ranks = len(allowed) + 1
        seen = crowded.launch(_placement_of_every_rank, world_size=ranks).wait(timeout=60)
        for rank, placed in enumerate(seen):
            core = sorted(cores[rank % len(cores)])
            assert placed["rank"] == core
            assert len(placed["groups"]) >= 3  # a connection thread and two helpers, at least
            assert all(t == core for t in placed["groups"])
            assert placed["others"] and all(t == core for t in placed["others"])
        for threads in crowded.client.run(_affinity_of_every_thread).values():
            assert all(t == allowed for t in threads)
        # a script rank's process too
        script = tmp_path / "affinity.py"
        script.write_text(SCRIPT_AFFINITY)
        crowded.launch_script(str(script), [str(tmp_path / "cpus")], world_size=ranks).wait(
            timeout=120
        )
        for rank in range(ranks):
            placed = (tmp_path / f"cpus.{rank}").read_text()
            assert cpus.parse_cpulist(placed) == sorted(cores[rank % len(cores)])
        # no more ranks than CPUs: left unbound, by a worker that ran a bound rank before
        seen = crowded.launch(_placement_of_every_rank, world_size=len(allowed)).wait(timeout=60)
        assert all(p["rank"] == allowed and p["groups"] for p in seen)
        assert all(t == allowed for p in seen for t in p["groups"] + p["others"])
    finally:
        crowded.close()


def test_bind_cpus_false_binds_no_worker_and_pins_no_rank(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) > 4:
        pytest.skip("starts one worker more than this machine has CPUs")
    ranks = len(allowed) + 1
    cluster = cs.Cluster.local(workers=ranks, bind_cpus=False, state_dir=str(tmp_path))
    try:
        assert {s["cpus"] for s in cluster.slots()} == {""}
        seen = cluster.launch(_placement_of_every_rank, world_size=ranks).wait(timeout=60)
        assert len(seen) == ranks
        assert all(p["rank"] == allowed for p in seen)
        assert all(t == allowed for p in seen for t in p["groups"] + p["others"])
    finally:
        cluster.close()
