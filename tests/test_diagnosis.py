"""Diagnoses end to end, on real clusters: a rank that eats its worker's memory, a NaN at a
chosen step (reported, paused at, rolled back over), a loss spike (diagnosed, marked on the
dashboard, paused at), a port already in use, and ordinary training that gets none.

The NaN and the spike come from one poisoned sample of the data, not from a step number:
the test finds where ``ctx.shard``'s permutation puts it.
"""

from __future__ import annotations

import math
import os
import socket

import cloudpickle
import pytest

import clustersdk as cs
from clustersdk.cli.render import show
from clustersdk.widgets.job import JobDashboard
from clustersdk.widgets.model import JobView
from clustersdk.widgets.render import job_html

from . import workloads, workloads_diag
from .helpers import losses, wait_for

cloudpickle.register_pickle_by_value(workloads_diag)

GIB = 2**30


def sample_at(step: int, rank: int, world_size: int = 2, batch: int = workloads_diag.BATCH) -> int:
    """The first sample of ``rank``'s batch at ``step`` (in the first epoch)."""
    import torch

    perm = torch.randperm(len(workloads.dataset()), generator=torch.Generator().manual_seed(0))
    return int(perm[step * batch * world_size + rank * batch])


def kinds(job) -> list[str]:
    return [d.kind for d in job.diagnoses()]


# --- host out of memory -------------------------------------------------------------------
@pytest.fixture
def small(tmp_path):
    """Two workers of 1.5 GiB each: a worker kills its rank when the rank's processes pass
    95% of it."""
    c = cs.Cluster.local(workers=2, memory_limit="1.5 GiB", state_dir=str(tmp_path / "state"))
    try:
        yield c
    finally:
        c.close()


def test_a_rank_that_eats_its_workers_memory_is_killed_and_diagnosed_host_oom(small):
    pids = small.client.run(os.getpid)
    job = small.launch(
        workloads_diag.hog, kwargs={"rank": 1, "at_step": 3}, world_size=2, timeout=20
    )
    with pytest.raises(cs.JobFailedError) as failed:
        job.wait(timeout=120)
    e = failed.value
    assert e.exc_type == "RankExit" and e.rank == 1
    assert "rank 1 (host 127.0.0.1, CPU) was killed by its worker: its memory" in str(e)
    d = job.diagnosis
    assert d is not None and d.kind == "host_oom" and e.diagnosis == d
    assert d.rank == 1
    assert d.data["memory_limit"] == int(1.5 * GIB)
    assert d.data["rss"] >= 0.9 * d.data["memory_limit"]  # the last RSS its worker saw
    assert "was killed by its worker" in d.summary and "memory_limit" in d.advice
    assert f"Diagnosis: {d.summary}" in str(e)  # before the traceback
    assert kinds(job) == ["host_oom"]
    assert "clustersdk diagnosis: host out of memory" in job.logs(rank=1)
    assert small.client.run(os.getpid) == pids  # the rank went, its worker stayed


# --- non-finite losses ----------------------------------------------------------------------
NAN = float("nan")


def test_a_nan_is_reported_and_the_job_goes_on(idle):
    sample = sample_at(5, rank=1)
    job = idle.launch(
        workloads_diag.train_poisoned, kwargs={"sample": sample, "x": NAN}, world_size=2
    )
    out = job.wait(timeout=120)
    assert out["steps"] == list(range(14)) and not out["finite"]  # it went on, diverged
    d = job.diagnosis  # the first NaN (rows of a later one may have come first)
    assert (d.kind, d.step, d.rank, d.data["values"]) == ("nonfinite", 5, 1, {"loss": "nan"})
    assert len(losses(job, rank=0)) == 14 and math.isnan(losses(job, rank=0)[13])
    assert set(kinds(job)) == {"nonfinite"} and len(kinds(job)) <= 2  # not one per NaN row
    shown = show(job.info(), "local", {"steps": 14, "total_steps": 14, "scalars": {}})
    assert f"diagnosis: {d.summary}\nwhat to do: {d.advice}" in shown


def test_on_nan_pause_holds_the_job_before_the_next_step(idle):
    sample = sample_at(5, rank=1)
    job = idle.launch(
        workloads_diag.train_poisoned,
        kwargs={"sample": sample, "x": NAN, "steps": 100},
        world_size=2,
        on_nan="pause",
    )
    wait_for(lambda: job.status is cs.JobStatus.PAUSED, timeout=60)
    assert job.info()["paused_at"] == 6  # the very next boundary
    d = job.diagnosis
    assert (d.kind, d.step, d.rank) == ("nonfinite", 5, 1)
    assert "paused before step 6" in d.detail
    history = job.history()
    assert max(r["step"] for r in history) == 5 and math.isnan(losses(job, rank=1)[5])
    assert job.stop() is cs.JobStatus.STOPPED


def test_on_nan_rollback_finishes_without_the_poisoned_batch(idle, tmp_path):
    clean = idle.launch(workloads_diag.train_poisoned, world_size=2)
    clean.wait(timeout=120)
    sample = sample_at(9, rank=0)
    job = idle.launch(
        workloads_diag.train_poisoned,
        kwargs={"sample": sample, "x": NAN},
        world_size=2,
        on_nan="rollback",
        checkpoint_dir=str(tmp_path),
        checkpoint_every=4,
        timeout=20,
    )
    out = job.wait(timeout=180)
    assert out["finite"] and out["steps"][-1] == 13
    # rolled back once, from the checkpoint of step 8 (none taken after the NaN was)
    assert [d.kind for d in job.diagnoses()] == ["nonfinite"] and job.diagnosis.step == 9
    assert [e["kind"] for e in job.events()].count("rolled back") == 1
    assert list(job.spec.skip_steps) == [9] and job.restarts == 0
    assert "step 9: its batch is dropped" in job.logs(rank=0)
    for rank in (0, 1):
        mine = losses(job, rank)  # every step once
        assert sorted(mine) == list(range(14)) and all(math.isfinite(v) for v in mine.values())
        same = losses(clean, rank)
        assert [mine[s] for s in range(9)] == [same[s] for s in range(9)]  # replayed exactly
        assert mine[9] != same[9]  # step 9 trained on the next batch


# --- loss spikes ------------------------------------------------------------------------------
def test_ordinary_training_gets_no_diagnosis(idle):
    job = idle.launch(workloads.train_mlp, kwargs={"steps": 300}, world_size=2)
    job.wait(timeout=180)
    assert len(losses(job)) == 300
    assert job.diagnoses() == [] and job.diagnosis is None


def test_small_batches_make_no_spike_of_the_jobs_loss_nor_of_one_ranks_slice():
    """Ordinary training on small slices of the batch (3 ranks x 8 samples, in process):
    each rank's loss is heavy-tailed (a hard slice costs several times the median), so
    judged rank by rank it would "spike" again and again; the job's loss, the mean of
    its ranks' at each step, which the control plane judges, does not."""
    import torch

    from clustersdk.signals import SpikeDetector, StepMeans

    data, net = workloads.dataset(), workloads.model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=25, gamma=0.9)
    shuffle = torch.Generator().manual_seed(0)
    per_rank, means, job = [SpikeDetector() for _ in range(3)], StepMeans(3), SpikeDetector()
    alone = judged = 0
    for step in range(1500):
        at = step % (len(data) // 24) * 24
        if at == 0:  # a new epoch, a new order
            order = torch.randperm(len(data), generator=shuffle)
        x, y = data[order[at : at + 24]]
        out = net(x)
        losses = [
            torch.nn.functional.mse_loss(out[8 * r : 8 * r + 8], y[8 * r : 8 * r + 8]).item()
            for r in range(3)
        ]
        torch.nn.functional.mse_loss(out, y).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        alone += sum(d.add(step, v) is not None for d, v in zip(per_rank, losses))
        for rank, value in enumerate(losses):
            judged += sum(job.add(s.step, s.mean) is not None for s in means.add(rank, step, value))
    # judged against how high the last steps went, not the median alone, not even one
    # rank's slice (whose hard batches cost several times the median) makes a spike
    assert alone == 0 and judged == 0, (alone, judged)


def demo_job_losses(
    seed: int, steps: int = 2000, ranks: int = 2, batch: int = 64, spike_at: int | None = None
) -> list[float]:
    """The job loss (the mean over ``ranks`` ranks' slices of ``batch``) of the demo's
    spirals classifier trained to convergence, in process; ``spike_at``: that step's
    batch is mislabeled, every sample of it."""
    import torch

    from clustersdk.demo import spirals

    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 3),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = spirals(seed=seed).tensors
    order = torch.Generator().manual_seed(seed)
    out, perm, at, size = [], torch.randperm(len(x), generator=order), 0, ranks * batch
    for step in range(steps):
        if at + size > len(x):
            perm, at = torch.randperm(len(x), generator=order), 0
        index, at = perm[at : at + size], at + size
        target = (y[index] + 1) % 3 if step == spike_at else y[index]
        loss = torch.nn.functional.cross_entropy(model(x[index]), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def tutorial02_job_losses(seed: int, steps: int = 2000, batch: int = 128) -> list[float]:
    """notebooks/02's regression (AdamW, a halving StepLR), in process, 2 ranks x 64."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=500, gamma=0.5)
    order = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, 8, generator=order)
    y = x.sum(dim=1, keepdim=True).sin()
    out, perm, at = [], torch.randperm(len(x), generator=order), 0
    for _ in range(steps):
        if at + batch > len(x):
            perm, at = torch.randperm(len(x), generator=order), 0
        index, at = perm[at : at + batch], at + batch
        loss = torch.nn.functional.mse_loss(model(x[index]), y[index])
        loss.backward()
        opt.step()
        schedule.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def spikes(job_losses: list[float]) -> list[int]:
    from clustersdk.signals import SpikeDetector

    detector = SpikeDetector()  # the defaults of clustersdk.yaml
    return [s.step for s in (detector.add(i, v) for i, v in enumerate(job_losses)) if s]


@pytest.mark.slow
def test_the_demo_trained_to_convergence_makes_no_spike_over_five_seeds_but_a_real_one_is_found():
    """Near convergence a mini-batch with a few hard samples costs 10 to 40 times the median
    loss: no user calls that a spike (a bar of 1.25x the median reported 0 to 20 per run).
    Tutorial 02's regression too, whose hard batches reach the figures of a real spike
    once reported missed (20x the median, 7.6x the highest of the window)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is the fastest
    try:
        runs = [demo_job_losses(seed) for seed in range(5)]
        planted = demo_job_losses(0, steps=1600, spike_at=1500)
        # tutorial 02's regression: hard batches at 10 to 24 times the median, ordinary
        runs += [tutorial02_job_losses(seed) for seed in range(4)]
    finally:
        torch.set_num_threads(threads)
    for i, run in enumerate(runs):
        assert spikes(run) == [], i
    # a whole batch mislabeled after convergence: the loss jumps far above its recent scale
    assert spikes(planted) == [1500]


def test_a_loss_spike_is_diagnosed_marked_and_pauses_with_on_spike_pause(idle):
    import torch

    batch = 4
    step, rank = 40, 1
    perm = torch.randperm(512, generator=torch.Generator().manual_seed(0))
    sample = int(perm[step * batch * 2 + rank * batch])
    job = idle.launch(
        workloads_diag.train_poisoned,
        kwargs={"sample": sample, "y_scale": 20.0, "steps": 500, "batch": batch, "delay": 0.01},
        world_size=2,
        on_spike="pause",
    )
    wait_for(lambda: job.status is cs.JobStatus.PAUSED, timeout=60)
    # the poisoned batch's (its update may spike a later step too, and the ranks' rows
    # arrive in any order)
    d = next(d for d in job.diagnoses() if d.step == step)
    assert (d.kind, d.step, d.rank) == ("loss_spike", step, rank)
    assert d.data["value"] > 10 * d.data["median"] and d.data["score"] >= 10
    assert losses(job, rank)[step] == d.data["value"]
    assert job.info()["paused_at"] > step
    view = JobView.from_record(job.info())
    marked = dict(zip(*view.markers("loss")))
    assert marked[float(step)] == d.data["value"]
    view.load_history(job.history())
    assert "<title>loss spike</title>" in job_html(view) and "Diagnosis:" in job_html(view)
    dash = JobDashboard(job)  # the live one: a ring on the loss chart, the diagnosis above
    try:
        assert float(step) in list(dash.charts["loss"].markers.x)
        assert "loss spike at step" in dash.diagnosis.value
    finally:
        dash.close()
    job.stop()


# --- ports ------------------------------------------------------------------------------------
@pytest.fixture
def held_port(idle):
    """A port this test listens on, made the workers' whole rendezvous range."""
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = holder.getsockname()[1]
    idle.client.run(workloads_diag.rendezvous_ports, f"{port}-{port}")
    try:
        yield port
    finally:
        idle.client.run(workloads_diag.rendezvous_ports, None)
        holder.close()


def test_a_rendezvous_port_already_in_use_is_diagnosed(idle, held_port):
    job = idle.launch(workloads.spin, world_size=2)
    with pytest.raises(cs.JobFailedError, match=f"range {held_port}-{held_port}") as failed:
        job.wait(timeout=60)
    d = failed.value.diagnosis
    assert d.kind == "port_in_use" and d.data["port"] == f"{held_port}-{held_port}"
    assert d.host == "127.0.0.1" and d.rank == 0
    assert job.diagnosis == d


def test_a_port_the_training_function_cannot_bind_is_diagnosed(idle):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        port = holder.getsockname()[1]
        job = idle.launch(workloads_diag.serve_on, kwargs={"port": port}, world_size=2)
        with pytest.raises(cs.JobFailedError):
            job.wait(timeout=60)
    finally:
        holder.close()
    d = job.diagnosis
    assert d.kind == "port_in_use" and d.data["port"] == str(port) and d.rank == 0
