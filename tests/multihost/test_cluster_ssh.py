"""Training across three hosts of the namespace bed, started by Cluster.ssh.

Each host has two CPU slots and two interfaces: eth0 joins the hosts; eth1
joins nothing, and the machine's name resolves to it (see netbed.py). Ranks
really talk over eth0, not over loopback.
"""

from __future__ import annotations

import pytest
import torch

import clustersdk as cs
from clustersdk import cpus

from .. import workloads
from ..helpers import Statuses, cli, wait_for
from . import jobs, netbed
from .helpers import addresses, ssh_options

pytestmark = pytest.mark.timeout(240)

PORTS = (29400, 29499)
TRAIN = {"steps": 60, "delay": 0.03}


@pytest.fixture(scope="module")
def cluster(bed, tmp_path_factory):
    """3 hosts x 2 CPU slots; the scheduler runs on the first host."""
    c = cs.Cluster.ssh(
        addresses(bed),
        slots_per_host=2,
        rendezvous_ports="29400-29499",
        state_dir=str(tmp_path_factory.mktemp("ssh-state")),
        **ssh_options(bed),
    )
    try:
        yield c
    finally:
        c.close()
        for host in bed.hosts:  # hosts the tests killed come back for the next modules
            if host.sshd is None or host.sshd.poll() is not None:
                bed.start_sshd(host)


@pytest.fixture
def idle(cluster):
    wait_for(lambda: not any(s["job"] for s in cluster.slots()), timeout=60)
    yield cluster
    for job in cluster.jobs():
        if not job.status.terminal:
            job.stop(wait=False)
    wait_for(lambda: not any(s["job"] for s in cluster.slots()), timeout=60)


@pytest.fixture(scope="module")
def uninterrupted4(cluster):
    """The reference run at world size 4, never stopped."""
    job = cluster.launch(workloads.train_ckpt, kwargs={"steps": TRAIN["steps"]}, world_size=4)
    return job.wait(timeout=180), losses(job)


def losses(job, rank: int = 0) -> dict[int, float]:
    rows = [r for r in job.history() if r["rank"] == rank]
    assert len({r["step"] for r in rows}) == len(rows), "a step was logged twice"
    return {r["step"]: r["loss"] for r in rows}


def assert_close_run(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for key in a["params"]:
        torch.testing.assert_close(a["params"][key], b["params"][key], rtol=0, atol=1e-6)


def hosts_of(job) -> list[str]:
    return [r["host"] for r in sorted(job.info()["ranks"], key=lambda r: r["rank"])]


def step_reached(job, step: int) -> bool:
    return any(r["step"] >= step for r in job.history())


# ---------------------------------------------------------------------------------------------
def test_each_host_brings_two_slots_at_its_own_address(cluster, bed):
    slots = cluster.slots()
    assert [s["host"] for s in slots] == sorted(addresses(bed) * 2)
    assert {s["kind"] for s in slots} == {"cpu"}
    # each host's launcher gives its two workers disjoint shares of its cores (the hosts
    # are this machine's network namespaces, so the shares of its CPUs)
    expected = sorted(cpus.shares(2) or ["", ""])
    for host in addresses(bed):
        assert sorted(s["cpus"] for s in slots if s["host"] == host) == expected, slots
    assert cluster.scheduler_address.startswith(f"tls://{bed.hosts[0].address}:")


def test_ddp_at_world_size_6_across_three_hosts_equals_one_process(idle, bed):
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 20}, world_size=6)
    out = job.wait(timeout=180)
    assert sorted(set(hosts_of(job))) == addresses(bed)
    reference = workloads.reference_mlp(6, steps=20)
    for key, value in reference.items():
        torch.testing.assert_close(out["params"][key], value, rtol=0, atol=1e-6)


def test_ranks_bind_to_the_interface_towards_rank_0_and_get_the_launch_env(idle, bed):
    idle.env = {"NCCL_DEBUG": "WARN", "X_CLUSTER": "1"}
    try:
        job = idle.launch(
            jobs.report_env,
            world_size=6,
            env={"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1", "NCCL_BUFFSIZE": 4194304},
        )
        out = job.wait(timeout=120)
    finally:
        idle.env = {}
    assert out["sum"] == 6
    master = hosts_of(job)[0]
    for rank in out["ranks"]:
        env = rank["env"]
        assert env["MASTER_ADDR"] == master  # rank 0's worker address, on eth0
        assert PORTS[0] <= int(env["MASTER_PORT"]) <= PORTS[1]  # the rendezvous range
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert (
            env["NCCL_DEBUG"],
            env["NCCL_IB_DISABLE"],
            env["NCCL_BUFFSIZE"],
            env["X_CLUSTER"],
        ) == ("INFO", "1", "4194304", "1")  # the launch's value wins over the cluster's
        # the host name points at eth1, which reaches no other host: gloo's own default
        assert rank["hostname_resolves_to"].startswith(netbed.SIDE_NET + ".")
    after = idle.launch(jobs.report_env, world_size=6).wait(timeout=120)  # nothing leaks into it
    assert {r["env"]["NCCL_DEBUG"] for r in after["ranks"]} == {None}


def test_a_job_bound_to_the_isolated_interface_fails_within_its_timeout(idle):
    job = idle.launch(jobs.report_env, world_size=6, timeout=3, env={"GLOO_SOCKET_IFNAME": "eth1"})
    with pytest.raises(cs.JobFailedError):
        job.wait(timeout=120)
    # and the workers are fine for the next job
    assert idle.launch(jobs.report_env, world_size=6).wait(timeout=120)["sum"] == 6


def test_pause_suspend_and_resume_at_world_size_4_move_across_hosts(idle, uninterrupted4, tmp_path):
    reference, reference_losses = uninterrupted4
    job = idle.launch(
        workloads.train_ckpt, kwargs=TRAIN, world_size=4, checkpoint_dir=str(tmp_path / "ckpt")
    )
    wait_for(lambda: step_reached(job, 10), timeout=120)
    job.pause()
    job.resume()
    wait_for(lambda: step_reached(job, 25), timeout=120)
    before = hosts_of(job)
    job.suspend()
    # a two-rank job takes the first host, so the resumed ranks must go elsewhere
    blocker = idle.launch(workloads.spin, world_size=2)
    wait_for(lambda: blocker.status is cs.JobStatus.RUNNING, timeout=60)
    job.resume(world_size=4)
    out = job.wait(timeout=180)
    blocker.stop()
    assert hosts_of(job) != before and before[0] in hosts_of(blocker)
    assert_close_run(out, reference)
    got = losses(job)
    assert got.keys() == reference_losses.keys()
    for step, loss in got.items():
        assert loss == pytest.approx(reference_losses[step], abs=1e-6)


def test_clustersdk_drain_moves_a_hosts_ranks_to_the_others_and_undrain_returns_it(
    idle, uninterrupted4, tmp_path
):
    reference, reference_losses = uninterrupted4
    job = idle.launch(
        workloads.train_ckpt, kwargs=TRAIN, world_size=4, checkpoint_dir=str(tmp_path / "ckpt")
    )
    wait_for(lambda: step_reached(job, 10), timeout=120)
    host = hosts_of(job)[-1]
    drained = cli(
        idle.state_dir, "drain", host, "--reason", "bed maintenance",
        "--cluster", idle.scheduler_address,
    )  # fmt: skip
    try:
        assert drained.returncode == 0, drained.stderr
        assert drained.stdout.startswith(f"drained {host} (2 worker(s)): it takes no new ranks")
        out = job.wait(timeout=180)
        assert host not in hosts_of(job)  # its ranks went to the other two hosts
        assert {s["drained"] for s in idle.slots() if s["host"] == host} == {"bed maintenance"}
        assert_close_run(out, reference)
        assert losses(job) == pytest.approx(reference_losses, abs=1e-6)
        assert job.goodput["lost_steps"] == 0
    finally:
        idle.undrain(host)
    assert {s["drained"] for s in idle.slots()} == {None}


def host_named(bed, address: str):
    return next(h for h in bed.hosts if h.address == address)


def test_a_host_that_dies_mid_run_restarts_the_job_from_its_checkpoint(
    idle, bed, uninterrupted4, tmp_path
):
    """Every process of one host is killed (sshd, nanny, workers): as with Cluster.local,
    the job restarts within its budget on the slots that are left, from its checkpoint."""
    reference, reference_losses = uninterrupted4
    job = idle.launch(
        workloads.train_ckpt,
        kwargs=TRAIN,
        world_size=4,
        timeout=10,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=10,
        max_restarts=1,
    )
    statuses = Statuses(job)
    wait_for(lambda: (job.info().get("checkpoint_step") or 0) >= 20, timeout=120)
    scheduler_host = bed.hosts[0].address
    victim = next(h for h in reversed(hosts_of(job)) if h != scheduler_host)
    bed.kill_host(host_named(bed, victim))
    out = job.wait(timeout=180)
    wait_for(lambda: "FINISHED" in statuses.seen)
    assert statuses.after("RESTARTING") == [
        "RESTARTING",
        "QUEUED",
        "STARTING",
        "RUNNING",
        "FINISHED",
    ]
    assert job.restarts == 1 and victim not in hosts_of(job)
    assert_close_run(out, reference)
    assert losses(job).keys() == reference_losses.keys()  # each step once
    wait_for(lambda: len(idle.slots()) == 4, timeout=60)


def test_a_host_that_dies_without_restarts_left_fails_the_job_naming_it(idle, bed):
    job = idle.launch(workloads.spin, world_size=4, timeout=10)
    wait_for(lambda: job.status is cs.JobStatus.RUNNING and len(job.history()) > 5, timeout=60)
    victim = next(h for h in reversed(hosts_of(job)) if h != bed.hosts[0].address)
    bed.kill_host(host_named(bed, victim))
    with pytest.raises(cs.JobFailedError) as info:
        job.wait(timeout=60)
    # whichever the control plane hears first: Dask's "worker left" or a peer's gloo
    # error on the dead connection; both name the host (as with Cluster.local)
    assert victim in str(info.value)
    assert info.value.exc_type in ("WorkerLost", "RuntimeError")


@pytest.mark.gpu
def test_one_worker_per_gpu_each_pinned_to_its_own(bed):
    """Where there are GPUs: each host's workers own one GPU each, as with Cluster.local."""
    n = torch.cuda.device_count()
    with cs.Cluster.ssh([bed.hosts[0].address], **ssh_options(bed)) as cluster:
        slots = cluster.slots()
        assert [s["kind"] for s in slots] == ["cuda"] * n
        assert sorted(s["index"] for s in slots) == list(range(n))
        assert len({s["uuid"] for s in slots}) == n  # never two ranks on one GPU
