"""Gang allocation and rank order: pure functions, no cluster."""

from __future__ import annotations

import random

import pytest

from clustersdk.control.policy import Slot, pick_gang, rank_order


def gpu(host: str, index: int, uuid: str | None = None, worker: str | None = None) -> Slot:
    return Slot(
        worker=worker or f"tcp://{host}:{9000 + index}",
        host=host,
        kind="cuda",
        index=index,
        uuid=uuid if uuid is not None else f"GPU-{host}-{index}",
    )


def cluster(hosts: int = 2, per_host: int = 2) -> list[Slot]:
    return [gpu(f"node{h}", i) for h in range(hosts) for i in range(per_host)]


def test_rank_order_is_by_host_then_device():
    slots = cluster(hosts=2, per_host=3)
    shuffled = random.Random(0).sample(slots, len(slots))
    assert [(s.host, s.index) for s in rank_order(shuffled)] == [
        ("node0", 0),
        ("node0", 1),
        ("node0", 2),
        ("node1", 0),
        ("node1", 1),
        ("node1", 2),
    ]


def test_rank_order_breaks_ties_by_worker():
    cpus = [Slot(worker=w, host="h", kind="cpu", index=-1) for w in ("tcp://h:3", "tcp://h:1")]
    assert [s.worker for s in rank_order(cpus)] == ["tcp://h:1", "tcp://h:3"]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_pick_gang_takes_the_first_n_in_rank_order(n):
    slots = cluster()
    assert pick_gang(reversed(slots), n) == slots[:n]


def test_pick_gang_never_puts_two_slots_of_one_gpu_in_a_gang():
    # two workers share node0's GPU 0 (same uuid)
    shared = gpu("node0", 0, worker="tcp://node0:9100")
    slots = [*cluster(hosts=1, per_host=2), shared]
    gang = pick_gang(slots, 2)
    assert gang is not None and len({s.uuid for s in gang}) == 2
    assert pick_gang(slots, 3) is None  # three slots, but only two GPUs


def test_pick_gang_treats_cpu_slots_without_uuid_as_distinct():
    cpus = [Slot(worker=f"tcp://h:{i}", host="h", kind="cpu", index=-1) for i in range(3)]
    assert pick_gang(cpus, 3) == rank_order(cpus)


@pytest.mark.parametrize("free, n", [([], 1), (cluster(1, 2), 3)])
def test_pick_gang_returns_none_when_not_enough(free, n):
    assert pick_gang(free, n) is None


def test_pick_gang_packs_onto_as_few_hosts_as_possible():
    free = [gpu("node0", 0), gpu("node1", 0), gpu("node1", 1)]
    assert {s.host for s in pick_gang(free, 2)} == {"node1"}


def test_policy_is_the_front_door_of_the_scheduling_package():
    from clustersdk.control import policy, scheduling

    assert policy.Slot is scheduling.Slot and policy.pick_gang is scheduling.pick_gang
    assert policy.Scheduler is scheduling.Scheduler and policy.decide is scheduling.decide
    assert policy.__all__ == sorted(policy.__all__)
    assert set(scheduling.__all__) <= set(policy.__all__)
