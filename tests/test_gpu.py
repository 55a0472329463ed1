"""GPU checks: run only where CUDA is available (skipped elsewhere by conftest)."""

from __future__ import annotations

import pytest
import torch

import clustersdk as cs

from . import workloads

pytestmark = pytest.mark.gpu


def test_every_worker_owns_a_distinct_gpu_and_nccl_ddp_matches_reference(tmp_path):
    n = min(torch.cuda.device_count(), 2)
    with cs.Cluster.local(state_dir=str(tmp_path)) as cluster:
        slots = cluster.slots()
        assert all(s["kind"] == "cuda" for s in slots)
        assert len({s["uuid"] for s in slots}) == len(slots)  # no two workers on one GPU
        out = cluster.launch(workloads.train_mlp, kwargs={"steps": 10}, world_size=n).wait(
            timeout=120
        )
    reference = workloads.reference_mlp(world_size=n, steps=10)
    for key, expected in reference.items():
        torch.testing.assert_close(out["params"][key].cpu(), expected, rtol=1e-5, atol=1e-5)
