"""What many test modules share: polling, the run comparisons of the exactness tests.

Cluster fixtures live in ``conftest.py``; the workload functions the ranks run
live in ``workloads.py`` / ``workloads_parallel.py`` (registered there to be
pickled by value: the workers do not have ``tests/`` on their path).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from . import workloads


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def wait_idle(cluster: Any, timeout: float = 30.0) -> None:
    """Until no slot of ``cluster`` runs a job."""
    try:
        wait_for(lambda: not any(s["job"] for s in cluster.slots()), timeout, interval=0.05)
    except AssertionError:
        busy = [s for s in cluster.slots() if s["job"]]
        raise AssertionError(f"slots still busy after {timeout} s: {busy}") from None


def losses(job: Any, rank: int = 0) -> dict[int, float]:
    """Each step's loss of ``rank``, checking that no step was logged twice."""
    rows = [r for r in job.history() if r["rank"] == rank]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), "a step was logged twice"
    return {r["step"]: r["loss"] for r in rows}


def step_reached(job: Any, step: int) -> bool:
    return any(r["step"] >= step for r in job.history())


def assert_same_run(a: dict, b: dict, exact: bool) -> None:
    """Two runs' results (step, params, optimizer state) are bitwise equal, or within 1e-6."""
    assert a["step"] == b["step"]
    for key in a["params"]:
        if exact:
            assert torch.equal(a["params"][key], b["params"][key]), key
        else:
            torch.testing.assert_close(a["params"][key], b["params"][key], rtol=0, atol=1e-6)
    if exact:
        for index, state in a["optim"]["state"].items():
            for name, value in state.items():
                assert torch.equal(value, b["optim"]["state"][index][name]), (index, name)
        assert a["optim"]["param_groups"] == b["optim"]["param_groups"]


def rows(job) -> dict[tuple[int, int], float]:
    """Every logged loss by (rank, step); a step logged twice by one rank fails."""
    out: dict[tuple[int, int], float] = {}
    for row in job.history():
        key = (row["rank"], row["step"])
        assert key not in out, f"rank {key[0]} logged step {key[1]} twice"
        out[key] = row["loss"]
    return out


def assert_bitwise(got: dict, want: dict, steps: int) -> None:
    """Two results of ``workloads.train_exact`` after ``steps`` steps: parameters,
    optimizer moments and step counts, and hyperparameters: the same bits."""
    assert got["step"] == want["step"] == steps
    got, want = got["state"], want["state"]
    assert got["model"].keys() == want["model"].keys()
    for key, value in want["model"].items():
        assert torch.equal(got["model"][key], value), (key, (got["model"][key] - value).abs().max())
    assert got["optim"]["state"].keys() == want["optim"]["state"].keys()
    for key, moments in want["optim"]["state"].items():
        for moment, value in moments.items():
            assert torch.equal(got["optim"]["state"][key][moment], value), (key, moment)
    assert got["optim"]["param_groups"] == want["optim"]["param_groups"]


def checkpointed_at(job, step: int) -> bool:
    return (job.info().get("checkpoint_step") or 0) >= step


def kill_worker_of(cluster, job, rank: int) -> str:
    """SIGKILL the worker process that runs ``rank`` of ``job``; its address."""
    worker = next(r["worker"] for r in job.info()["ranks"] if r["rank"] == rank)
    pid = cluster.client.run(os.getpid, workers=[worker])[worker]
    os.kill(pid, signal.SIGKILL)
    # until the scheduler knows: a later test must not count the dead worker as a slot
    wait_for(lambda: worker not in [s["worker"] for s in cluster.slots()], timeout=60)
    return worker


class Statuses:
    """Every status a job's event stream announces, in order."""

    def __init__(self, job: Any):
        self.seen: list[str] = []
        self._lock = threading.Lock()
        job.on_event(self._on_event)

    def _on_event(self, msg: dict) -> None:
        if msg.get("kind") == "status":
            with self._lock:
                self.seen.append(msg["status"])

    def __contains__(self, status: str) -> bool:
        with self._lock:
            return status in self.seen

    def after(self, status: str) -> list[str]:
        """The statuses from the first ``status`` on (none if it never came)."""
        with self._lock:
            return self.seen[self.seen.index(status) :] if status in self.seen else []


# What the tests of a job that moves (a drain, a SIGTERM or cloud notice) run: a small
# exact job, the same with a checkpoint_dir and slowed down, compared bitwise.
MOVING_KW = {"kind": "mlp", "steps": 20, "global_batch": 24}


def workers_of(cluster: Any, job: Any) -> list[str]:
    """The workers whose slots ``job`` holds now."""
    return [s["worker"] for s in cluster.slots() if s["job"] == job.id]


def running_beside_a_reference(cluster: Any, name: str, tmp_path: Any) -> tuple:
    """The uninterrupted run's state and rows; then the same job with a checkpoint_dir,
    slowed down, running past step 4 on two of the slots (and its status changes)."""
    want = cluster.launch(workloads.train_exact, kwargs=MOVING_KW, world_size=2)
    reference = want.wait(timeout=120), rows(want)
    job = cluster.launch(
        workloads.train_exact,
        kwargs={**MOVING_KW, "delay": 0.05},
        world_size=2,
        name=name,
        checkpoint_dir=str(tmp_path),
    )
    seen = Statuses(job)
    wait_for(lambda: step_reached(job, 4), timeout=60)
    return reference, job, seen


def cluster_processes(cluster) -> dict[str, dict]:
    """Each worker's process, its nanny's, and those it keeps for its ranks (its zygote,
    the rank process waiting for a job, each job's rank process)."""
    from clustersdk.runtime.agent import AGENT_NAME

    def seen(dask_worker) -> dict:
        out = {"worker": os.getpid(), "nanny": os.getppid()}
        out.update(dask_worker.plugins[AGENT_NAME].processes())
        return out

    return cluster.client.run(seen)


def cli(state: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``clustersdk ARGS`` in a process of its own, with ``state`` as its state directory."""
    env = {**os.environ, "DASK_CLUSTERSDK__STATE_DIR": state}
    return subprocess.run(
        [sys.executable, "-m", "clustersdk", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
