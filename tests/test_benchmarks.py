"""The benchmark scripts still run end to end (their numbers are read by people, not here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_benchmark(
    script: str | Path, *args: object, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python benchmarks/<script> *args`` (or the script at that path) in a process of its
    own, its output captured; the caller judges the exit code."""
    path = script if isinstance(script, Path) else ROOT / "benchmarks" / script
    return subprocess.run(
        [sys.executable, str(path), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


@pytest.mark.slow
def test_launch_benchmark_smoke(tmp_path):
    out = tmp_path / "launch.json"
    proc = run_benchmark(
        "launch.py", "--repeats", "1", "--steps", "20", "--json", str(out), timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "clustersdk (warm)" in proc.stdout and "torchrun" in proc.stdout
    medians = json.loads(out.read_text())
    assert medians, "no medians written"


@pytest.mark.slow
def test_security_benchmark_smoke(tmp_path):
    out = tmp_path / "security.json"
    proc = run_benchmark(
        "security.py",
        "--starts",
        "1",
        "--repeats",
        "1",
        "--steps",
        "20",
        "--json",
        str(out),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TLS steps/s vs plain" in proc.stdout and "cluster start (s)" in proc.stdout
    figures = json.loads(out.read_text())
    assert (
        set(figures["medians"]) == {"tls", "plain"} and len(figures["runs"]["tls"]["start_s"]) == 1
    )


@pytest.mark.slow
def test_scripts_benchmark_smoke(tmp_path):
    out = tmp_path / "scripts.json"
    proc = run_benchmark(
        "scripts.py",
        "--repeats",
        "1",
        "--steps",
        "10",
        "--calls",
        "500",
        "--json",
        str(out),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["max_param_diff"] <= 1e-6 and result["logs_complete"]
    assert set(result["medians"]) == {"torchrun", "launch_script"}


@pytest.mark.slow
def test_checkpoint_benchmark_smoke(tmp_path):
    out = tmp_path / "checkpoint.json"
    proc = run_benchmark(
        "checkpoint.py", "--repeats", "1", "--model-mb", "4", "--json", str(out), timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pause latency" in proc.stdout and "resume to first step" in proc.stdout
    result = json.loads(out.read_text())
    medians = result["medians"]
    assert all(p["latency_s"] > 0 for p in medians["pause"].values())
    assert set(medians["saves"]) == {"async", "sync"} and medians["checkpoint_mb"] > 0
    assert all(0 < t < 60 for t in medians["resume_s"].values())
    assert set(medians["resume_s"]) == {"2->2", "2->1"}
    assert set(result["targets_met"]) >= {"blocked", "throughput"}


@pytest.mark.slow
def test_object_storage_benchmark_smoke(tmp_path):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    out = tmp_path / "object.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # its own server
    proc = run_benchmark(
        "object_storage.py", "--repeats", "1", "--mb", "4", "--json", str(out), timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratio save/upload" in proc.stdout
    result = json.loads(out.read_text())
    assert result["save_over_upload"] > 0 and result["medians_s"]["commit"] > 0


@pytest.mark.slow
def test_parallel_benchmark_smoke(tmp_path):
    out = tmp_path / "parallel.json"
    proc = run_benchmark(
        "parallel.py",
        "--repeats",
        "1",
        "--steps",
        "12",
        "--two-ranks-only",
        "--pair",
        "round",
        "--json",
        str(out),
        timeout=180,  # ~40 s; slack for a loaded machine
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "per-rank memory" in proc.stdout
        and "clustersdk" in proc.stdout
        and "torchrun" in proc.stdout
    )
    assert "tokens/s, token budget / fixed batches" in proc.stdout
    result = json.loads(out.read_text())
    memory = result["memory_mib"]
    for ranks in (2, 4):  # FSDP holds about 1/N of what DDP holds
        ddp, fsdp = (
            sum(memory[f"{s} x{ranks}"][k] for k in ("params", "grads", "optim"))
            for s in ("ddp", "fsdp")
        )
        assert fsdp / ddp == pytest.approx(1 / ranks, rel=0.05)
    assert set(result["medians"]) == {"ddp", "fsdp", "tp", "pp (gpipe, 4 mb)", "ep (4 experts)"}
    assert all(m["clustersdk"] > 0 and m["torchrun"] > 0 for m in result["medians"].values())
    tokens = result["tokens"]["runs"]  # long-tailed lengths: fixed batches are mostly padding
    assert tokens["budget"]["padding"][0] < 0.1 < 0.4 < tokens["fixed"]["padding"][0]


@pytest.mark.slow
def test_data_benchmark_smoke():
    proc = run_benchmark("data.py", "--repeats", "1", "--rows", "20000", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prefetch=2 / prefetch=0" in proc.stdout and "prefetch=2 / datasets" in proc.stdout


@pytest.mark.slow
def test_scheduler_benchmark_smoke(tmp_path):
    out = tmp_path / "scheduler.json"
    proc = run_benchmark(
        "scheduler.py",
        "--repeats",
        "1",
        "--events",
        "5",
        "--queued",
        "300",
        "--nodes",
        "30",
        "--preemption",
        "1",
        "--json",
        str(out),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "one arrival" in proc.stdout and "one completion" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["medians_s"]) == {"fill", "cold", "warm", "tick", "arrival", "completion"}
    assert all(t > 0 for t in result["medians_s"].values())
    assert "preemption, live on 4 local CPU slots" in proc.stdout
    assert all(t > 0 for t in result["preemption_s"].values())


@pytest.mark.slow
def test_chaos_benchmark_smoke(tmp_path):
    out = tmp_path / "chaos.json"
    proc = run_benchmark(
        "chaos.py",
        "--steps",
        "40",
        "--kills",
        "1",
        "--stops",
        "1",
        "--raises",
        "1",
        "--fills",
        "1",
        "--stop-seconds",
        "1",
        "--json",
        str(out),
        timeout=300,  # ~40 s; slack for a loaded machine
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "bitwise    ok" in proc.stdout and "recovery after kill" in proc.stdout
    assert "threads/ports ok" in proc.stdout  # no rank thread, no extra thread or port left
    result = json.loads(out.read_text())
    assert not any(result["problems"].values())
    # the disk filled up (a checkpoint failed for want of space), was freed, and the next
    # checkpoint committed; the job trained on throughout
    assert sorted(e["kind"] for e in result["events"]) == ["fill", "kill", "raise", "stop"]
    (fill,) = [e for e in result["events"] if e["kind"] == "fill"]
    assert "no space left" in fill["error"].lower()
    assert all(0 < t < 120 for t in result["recovery_s"]["kill"] + result["recovery_s"]["fill"])


@pytest.mark.slow
def test_live_overhead_benchmark_smoke(tmp_path):
    out = tmp_path / "live.json"
    # ~40 s; the timeout is slack for a loaded machine
    proc = run_benchmark(
        "live_overhead.py", "--repeats", "1", "--steps", "60", "--json", str(out), timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "steps/s without the live hooks" in proc.stdout and "run paused" in proc.stdout
    result = json.loads(out.read_text())
    assert result["steps_per_s_without"] > 0 and result["steps_per_s_with"] > 0
    assert "on the cluster, 2 ranks, hooks on and off at alternate steps" in proc.stdout
    assert 0.5 < result["cluster_paired_ratio"] < 2 and 0.5 < result["in_process_ratio"] < 2
    assert all(
        0 < result[k] < 60
        for k in ("run_running_s", "run_paused_s", "update_running_s", "update_paused_s")
    )


GPU_CHECK = ROOT / "benchmarks" / "gpu_check.py"


def test_gpu_check_without_cuda_exits_at_once_naming_what_is_missing(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the check would run")
    proc = run_benchmark(GPU_CHECK, "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert last.startswith("gpu_check: no CUDA device") and "--rehearse" in last
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing written


def test_gpu_check_refuses_an_unknown_section_naming_the_known_ones(tmp_path):
    proc = run_benchmark(
        GPU_CHECK, "--rehearse", "--only", "nccl,gpus", "--out", str(tmp_path), timeout=120
    )
    assert proc.returncode == 2
    assert "unknown section(s) gpus" in proc.stderr and "duplicate_gpu" in proc.stderr


def test_gpu_check_pairs_telemetry_with_the_nearest_reference_read_in_steady_phases():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    marks = [
        {"name": "idle", "began": 100.0, "ended": 104.0},
        {"name": "busy", "began": 104.0, "ended": 108.0},
    ]
    samples = [
        {"time": t, "gpu_util": u, "gpu_mem_used": m * 2**20}
        for t, u, m in (
            (100.5, 0, 500),
            (102.0, 0, 500),
            (104.6, 90, 8500),
            (106.0, 100, 8700),
            (109.5, 0, 600),
        )
    ]
    reads = [
        {"time": t, "util": u, "mem_mib": m}
        for t, u, m in ((101.9, 1, 501), (102.3, 40, 900), (106.2, 97, 8700), (104.5, 30, 8400))
    ]
    pairs = gpu_check.pair_samples(samples, reads, marks, ("gpu_util", "gpu_mem_used"))
    # 100.5 and 109.5 have no read within 0.35 s; 104.6 is paired but still settling
    assert [(p["time"], p["ref_util"], p["steady"], p["phase"]) for p in pairs] == [
        (102.0, 1, True, "idle"),
        (104.6, 30, False, None),
        (106.0, 97, True, "busy"),
    ]
    assert pairs[2]["mem_mib"] == 8700 and pairs[2]["ref_mem_mib"] == 8700


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_gpu_check_rehearsal_runs_every_section_on_the_cpu(tmp_path):
    """The whole script on this machine's CPU, stand-ins for the GPU: every section runs,
    the JSON holds them all, marked as a rehearsal (100-200 s on a loaded 2-core VM: three
    local clusters come up, and pytest in a process of its own)."""
    proc = run_benchmark(GPU_CHECK, "--rehearse", "--quick", "--out", str(tmp_path), timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "REHEARSAL: no GPU figures" in proc.stdout.strip().splitlines()[-1]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["mode"] == "rehearsal" and result["rehearsal"] is True
    sections = result["sections"]
    assert list(sections) == [
        "doctor",
        "nccl",
        "telemetry",
        "bf16",
        "checkpoint",
        "cuda_oom",
        "rank_process",
        "duplicate_gpu",
        "gpu_tests",
    ]
    for name, section in sections.items():
        assert section["status"] == "ok" and section["stand_in"], (name, section.get("error"))
        failed = [
            k for k, c in section["checks"].items() if not c["ok"] and not c.get("informational")
        ]
        assert not failed, (name, failed)
    nccl = sections["nccl"]["figures"]
    assert nccl["ddp"]["backend"] == "gloo" and nccl["ddp"]["bitwise"]  # same CPU kernels
    assert nccl["fsdp_cpu_offload"]["model_type"].startswith("FSDP")
    assert sections["duplicate_gpu"]["figures"]["diagnosis"]["kind"] == "duplicate_gpu"
    assert sections["cuda_oom"]["figures"]["diagnosis"]["kind"] == "host_oom"
    assert sections["cuda_oom"]["figures"]["after"]["finite"]
    ranks = sections["rank_process"]["figures"]
    assert ranks["assert"]["diagnosis"]["kind"] == "cuda_error"
    assert ranks["watchdog"]["diagnosis"]["kind"] == "collective_timeout"
    assert "died of SIGABRT (signal 6): NCCL's watchdog aborted it" in ranks["watchdog"]["message"]
    assert ranks["first_step_s"]["clustersdk"] < ranks["first_step_s"]["torchrun"]
    assert sections["telemetry"]["figures"]["chart_points"]["rss"] >= 2
    assert sections["bf16"]["figures"]["medians_steps_per_s"]["plain"] > 0
    assert sections["checkpoint"]["figures"]["load_warm"]["resumed_at"] > 0
    assert sections["gpu_tests"]["figures"]["counts"]["skipped"] == 3
    log = (tmp_path / "gpu_check.log").read_text()
    assert all(f"== {name}: ok" in log for name in sections)


def test_gpu_check_hides_the_uuid_once_when_dask_imports_its_preload_twice():
    """The first GPU run's duplicate-GPU section never started: Dask imported the preload
    twice, the second import wrapped the first wrapper, and every call recursed."""
    code = (
        "import importlib.util, torch\n"
        "orig = torch.cuda.get_device_properties\n"
        "for name in ('copied', '_gpu_hide_uuid'):\n"
        "    spec = importlib.util.spec_from_file_location(name, 'benchmarks/_gpu_hide_uuid.py')\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "assert torch.cuda.get_device_properties.original is orig\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


@pytest.mark.slow
def test_preemption_benchmark_smoke(tmp_path):
    out = tmp_path / "preemption.json"
    proc = run_benchmark(
        "preemption.py",
        *("--repeats", 1, "--steps", 120, "--every", 50, "--at", 90, "--json", out),
        timeout=300,  # ~35 s
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "bitwise    ok" in proc.stdout
    medians = json.loads(out.read_text())["medians"]
    assert medians["notice"]["lost_steps"] == 0  # checkpointed at the next step boundary
    assert medians["no notice"]["lost_steps"] >= 90 - 50  # back to the checkpoint of step 50
