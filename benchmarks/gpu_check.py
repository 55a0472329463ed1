"""What clustersdk promises about GPUs, checked on one real GPU in one run (about 5 minutes).

Through the public API on ``Cluster.local`` (one worker, pinned to the GPU):

* ``doctor``: driver, CUDA, NCCL versions and GPU health as the doctor reports them;
* ``nccl``: the job's process group is NCCL; DDP (as ``ctx.prepare`` makes it at one
  rank, and clustersdk's fixed-bucket DDP forced at one rank), FSDP2 and FSDP2 with
  ``cpu_offload`` (pinned) train the reference transformer with losses equal to a
  plain single-GPU loop of the same model and data;
* ``telemetry``: GPU utilisation and memory in ``job.system()`` and in the dashboard's
  GPU charts, against ``nvidia-smi`` read at the same moments, while a job holds the
  GPU idle, busy, half busy and idle again;
* ``bf16``: GPT-2 (124M, transformers, no download) with ``precision="bf16"`` through
  clustersdk against a plain ``torch.autocast`` loop on the same GPU, alternated in
  paired rounds: steps/s ratio (target >= 0.98) and peak memory ratio;
* ``checkpoint``: from GPU memory (a few GB of state): loop time blocked by an async
  save against a sync save, DCP save and load throughput in GB/s;
* ``cuda_oom``: a rank allocating past the card's memory gets the ``cuda_oom``
  diagnosis with its peak and the advice; the worker then runs a job fine;
* ``rank_process``: each rank a process of its own: a warm launch to the first step
  on CUDA against torchrun's (target <= 1 s); a device-side assert named as a CUDA
  error (``cuda_error``), with the same worker serving the next job on the GPU; NCCL's
  watchdog abort of a collective hung behind a busy stream named as such
  (``collective_timeout``), the worker staying;
* ``duplicate_gpu``: workers started by hand on the same GPU, attached with
  ``Cluster.connect``: the gang rule, and NCCL's own error as the ``duplicate_gpu``
  diagnosis (the raw NCCL text is kept, also from two plain processes);
* ``gpu_tests``: ``pytest -m gpu`` on the test suite's GPU tests.

Each section is timed, has a time budget, and records its error and traceback
without stopping the others; ``DIR/gpu_check.json`` is rewritten after every
section (a run cut short keeps what finished) and ``DIR/gpu_check.log`` has the log.

On the GPU machine (the repository root; the wheels of dask, distributed and what they
need that the machine lacks are carried in ``.whl/``), the one command::

    set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD:$PWD/extension PYTHONUNBUFFERED=1 || exit; nvidia-smi > $OUT/nvidia-smi.txt 2>&1; python3 benchmarks/gpu_check.py --out $OUT 2>&1 | tee $OUT/gpu_check.out

(``run`` with ``carry=[".whl"]`` and ``timeout_s=500``; ``--only nccl,bf16`` reruns
chosen sections, ``--budget bf16=200`` changes a section's budget, ``--deadline``
the whole run's, 420 s by default: no section runs past it, and those left are skipped.)
Expected on an H200: about 5 minutes; doctor 15 s (with the cluster's start), nccl 30,
telemetry 25, bf16 70, checkpoint 45, cuda_oom 10, rank_process 60, duplicate_gpu 45,
gpu_tests 60.

Without CUDA it exits at once with status 2, its last line naming what is missing.
``--rehearse`` runs every section on this machine's CPU instead: gloo for NCCL,
psutil for nvidia-smi, host memory for CUDA memory, a small GPT-2 (or the reference
transformer where transformers is missing); every figure is then marked as a
rehearsal (``"mode": "rehearsal"``, and each section names its stand-ins).
``--quick`` makes the rehearsal smaller still (the test suite's run).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import multiprocessing
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import _gpu_workload as W  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
SECTIONS = (
    "doctor",
    "nccl",
    "telemetry",
    "bf16",
    "checkpoint",
    "cuda_oom",
    "rank_process",
    "duplicate_gpu",
    "gpu_tests",
)
NEEDS_CLUSTER = {"doctor", "nccl", "telemetry", "bf16", "checkpoint", "cuda_oom", "rank_process"}
BUDGET_S = {
    "doctor": 45,
    "nccl": 100,
    "telemetry": 60,
    "bf16": 150,
    "checkpoint": 120,
    "cuda_oom": 60,
    "rank_process": 90,
    "duplicate_gpu": 120,
    "gpu_tests": 200,
}
DEADLINE_S = 420
# tests/multihost/test_cluster_ssh.py's gpu test is left out: it needs the namespace bed
# (root, openssh-server, paramiko), which the GPU machine does not have
GPU_TEST_FILES = (
    "tests/test_gpu.py",
    "tests/runtime/test_holds.py",
    "tests/runtime/test_parallel.py",
)

# Losses of the same model, data and kernels in the same order are expected bitwise equal
# (``bitwise`` in the figures says whether they were): DDP at one rank is the plain model; a
# forced DDP and FSDP add exact copies and a sum over one rank. The tolerance leaves float
# rounding, not a bug, room: 1e-6 relative; cpu_offload runs AdamW on the CPU (other
# kernels, another FMA contraction), a few ulps per step: 1e-5.
LOSS_RTOL = {"ddp": 1e-6, "ddp_wrapped": 1e-6, "fsdp": 1e-6, "fsdp_cpu_offload": 1e-5}
STEPS_RATIO_TARGET = 0.98
UTIL_POINTS = 5.0  # telemetry: |util - nvidia-smi| in steady phases, percentage points
MEM_REL = 0.03  # telemetry: |memory - nvidia-smi| / nvidia-smi in steady phases
MEM_ABS_MIB = 256  # ... or at most this much

# Sizes per mode: "gpu" on the H200, "rehearse" on a CPU, "quick" for the test suite.
SIZES: dict[str, dict[str, Any]] = {
    "gpu": {
        "nccl": {
            "model_cfg": {"vocab": 512, "d_model": 256, "n_heads": 8, "n_layers": 4, "seq_len": 64},
            "data_cfg": {"n": 1024, "seq_len": 64, "vocab": 512, "seed": 0},
            "steps": 20,
            "batch": 32,
            "lr": 3e-3,
            "warmup": 3,
        },
        "telemetry": {
            "size": 8192,
            "settle": 1.2,
            "phases": [
                {"name": "idle", "seconds": 3.5, "busy": 0.0, "hold_gib": 0},
                {"name": "busy", "seconds": 4.5, "busy": 1.0, "hold_gib": 8},
                # utilisation is judged in the idle and busy phases only: NVML averages over
                # 1/6 s to 1 s, so at a 50% duty cycle two reads 0.1 s apart may differ a lot
                {"name": "half", "seconds": 4.5, "busy": 0.5, "hold_gib": 2, "judge_util": False},
                {"name": "idle-after", "seconds": 3.5, "busy": 0.0, "hold_gib": 0},
            ],
        },
        "bf16": {
            "cfg": {
                "vocab_size": 50257,
                "n_positions": 1024,
                "n_embd": 768,
                "n_layer": 12,
                "n_head": 12,
            },
            "batch": 16,
            "warmup": 5,
            "steps": 30,
            "rounds": 4,
        },
        "checkpoint": {
            "width": 8192,
            "depth": 3,
            "batch": 64,
            "every": 4,
            "saves": 2,
            "step_s": 1.0,
        },
        "cuda_oom": {"first_gib": 1.0},
        "rank_process": {
            "rounds": 3,
            "gap_s": 2.0,
            "torchrun_rounds": 2,
            "stall_s": 30.0,
            "timeout": 8,
        },
        "duplicate_gpu": {"workers": 3},
    },
    "rehearse": {
        "nccl": {
            "model_cfg": {},
            "data_cfg": {"n": 256, "seq_len": 16, "vocab": 64, "seed": 0},
            "steps": 8,
            "batch": 8,
            "lr": 1e-2,
            "warmup": 2,
        },
        "telemetry": {
            "size": 128,
            "settle": 0.3,
            "phases": [
                {"name": "idle", "seconds": 2.5, "busy": 0.0, "hold_gib": 0},
                {"name": "busy", "seconds": 2.5, "busy": 1.0, "hold_gib": 0.25},
                {"name": "idle-after", "seconds": 2.5, "busy": 0.0, "hold_gib": 0},
            ],
        },
        "bf16": {
            "cfg": {"vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 2},
            "batch": 4,
            "warmup": 2,
            "steps": 10,
            "rounds": 2,
        },
        "checkpoint": {
            "width": 256,
            "depth": 3,
            "batch": 16,
            "every": 3,
            "saves": 2,
            "step_s": 0.05,
        },
        "cuda_oom": {"first_gib": 0.01},
        "rank_process": {
            "rounds": 2,
            "gap_s": 1.0,
            "torchrun_rounds": 1,
            "stall_s": 5.0,
            "timeout": 8,
        },
        "duplicate_gpu": {"workers": 2},
    },
}
SIZES["quick"] = {
    **SIZES["rehearse"],
    "telemetry": {
        "size": 64,
        "settle": 0.3,
        "phases": [
            {"name": "idle", "seconds": 2.0, "busy": 0.0, "hold_gib": 0},
            {"name": "busy", "seconds": 2.0, "busy": 1.0, "hold_gib": 0.1},
        ],
    },
    "bf16": {**SIZES["rehearse"]["bf16"], "steps": 4, "rounds": 1},
}

STAND_INS = {
    "doctor": "CPU slots: no GPU, NCCL or driver to report",
    "nccl": "gloo on CPU for NCCL; FSDP2's cpu_offload without pinned memory",
    "telemetry": "psutil (host CPU %, the worker's RSS) for NVML, and psutil read by this "
    "process for nvidia-smi",
    "bf16": "bf16 autocast on CPU; a small GPT-2 (or the reference transformer without "
    "transformers)",
    "checkpoint": "state in host memory, small",
    "cuda_oom": "a host allocation past the address space (host_oom) for CUDA memory",
    "rank_process": "gloo on CPU for NCCL; the rank raises CUDA's device-side assert message "
    "itself, and writes NCCL's watchdog line and aborts itself",
    "duplicate_gpu": "CPU workers (no UUIDs): the job raises NCCL's message itself; no raw "
    "NCCL pair",
    "gpu_tests": "no GPU: every gpu-marked test is skipped",
}


class SectionTimeout(BaseException):
    """A section ran past its budget (a BaseException, so that no ``except Exception``
    in library code swallows it)."""


# --- the run: log, JSON, cluster, plain process --------------------------------------------
class Section:
    """One section's record: figures, checks, and how it ended."""

    def __init__(self, name: str, budget: float, rehearse: bool = False):
        self.name, self.budget, self.rehearse = name, budget, rehearse
        self.figures: dict[str, Any] = {}
        self.checks: dict[str, dict[str, Any]] = {}
        self.status, self.seconds = "pending", 0.0
        self.error: str | None = None
        self.tb: str | None = None

    def check(
        self, name: str, ok: bool, value: Any, target: Any = None, gpu_target: bool = False
    ) -> bool:
        """Record a check; ``gpu_target``: a figure only a GPU run can judge (in a
        rehearsal it is recorded as informational, and never counts as failed)."""
        self.checks[name] = {"ok": bool(ok), "value": value, "target": target}
        if gpu_target and self.rehearse:
            self.checks[name]["informational"] = True
        return bool(ok)

    def failed(self) -> list[str]:
        return [k for k, c in self.checks.items() if not c["ok"] and not c.get("informational")]

    def as_dict(self, rehearse: bool) -> dict[str, Any]:
        out = {
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "budget_s": self.budget,
            "figures": self.figures,
            "checks": self.checks,
        }
        if rehearse:
            out["stand_in"] = STAND_INS[self.name]
        if self.error:
            out["error"], out["traceback"] = self.error, self.tb
        return out


class Run:
    """Shared by the sections: options, the output files, the cluster and the plain process."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rehearse = args.rehearse
        self.mode = "quick" if args.quick else "rehearse" if args.rehearse else "gpu"
        self.sizes = SIZES[self.mode]
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.deadline
        self.tmp = tempfile.mkdtemp(prefix="gpu_check-")
        # open for the whole run (line-buffered): a run cut short keeps its log
        self._log = open(self.out / "gpu_check.log", "a", buffering=1)  # noqa: SIM115
        self.sections: dict[str, Section] = {}
        self.machine: dict[str, Any] = {}
        self.started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self._cluster: Any = None
        self._plain: PlainRunner | None = None
        self.jobs: list[Any] = []  # launched by the running section: stopped if it fails

    # output ------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {message}"
        print(line, flush=True)
        self._log.write(line + "\n")

    def log(self, text: str) -> None:
        """Into the log file only (long texts: tracebacks, job logs, pytest's output)."""
        self._log.write(text.rstrip("\n") + "\n")

    def save(self) -> None:
        data = {
            "script": "benchmarks/gpu_check.py",
            "mode": "rehearsal" if self.rehearse else "gpu",
            "rehearsal": self.rehearse,
            "started": self.started,
            "elapsed_s": round(time.monotonic() - self.t0, 1),
            "argv": sys.argv[1:],
            "machine": self.machine,
            "plain_process": self._plain.info if self._plain else None,
            "sections": {n: s.as_dict(self.rehearse) for n, s in self.sections.items()},
        }
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(data, indent=1, default=_jsonable))
        os.replace(tmp, self.out / "gpu_check.json")

    # the cluster and the plain process (made when a section first needs them) -------------
    @property
    def cluster(self) -> Any:
        if self._cluster is None:
            import clustersdk as cs

            t0 = time.monotonic()
            self._cluster = cs.Cluster.local(
                workers=1, gpus=not self.rehearse, state_dir=os.path.join(self.tmp, "state")
            )
            self.machine["cluster_start_s"] = round(time.monotonic() - t0, 1)
            self.machine["slots"] = self._cluster.slots()
            self.say(
                f"cluster up in {self.machine['cluster_start_s']} s: "
                f"{[(s['kind'], s['index']) for s in self.machine['slots']]}"
            )
        return self._cluster

    def close_cluster(self) -> None:
        if self._cluster is not None:
            cluster, self._cluster = self._cluster, None
            cluster.close()

    @property
    def plain(self) -> PlainRunner:
        if self._plain is None or not self._plain.alive():
            self._plain = PlainRunner()
        return self._plain

    def worker(self) -> dict[str, Any]:
        """The cluster's slot, once it is there and free (a worker that died comes back
        through its nanny: the sections after it wait for that)."""
        cluster = self.cluster
        return wait_until(
            lambda: next((s for s in cluster.slots() if not s["job"]), None),
            120,
            "the cluster's worker, free",
        )

    def launch(self, fn: Callable[..., Any], **options: Any) -> Any:
        """``cluster.launch`` (one rank unless told), remembered for the clean-up."""
        options.setdefault("world_size", 1)
        self.worker()
        job = self.cluster.launch(fn, py_modules=[W], **options)  # benchmarks/ isn't there
        self.jobs.append(job)
        return job

    def stop_jobs(self) -> None:
        for job in self.jobs:
            with contextlib.suppress(Exception):
                if not job.status.terminal:
                    job.stop(timeout=30)
        self.jobs.clear()

    def close(self) -> None:
        if self._plain is not None:
            self._plain.close()
        with contextlib.suppress(Exception):
            self.close_cluster()
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)
        self._log.close()

    # sections --------------------------------------------------------------------------------
    def section(self, name: str, fn: Callable[[Run, Section], None]) -> Section:
        left = self.deadline - time.monotonic()
        sec = self.sections[name] = Section(
            name, min(self.budget(name), max(left, 0)), self.rehearse
        )
        if left < 10:
            sec.status, sec.error = "skipped", f"out of time: {left:.0f} s left of the deadline"
            self.say(f"== {name}: skipped ({sec.error})")
            self.save()
            return sec
        self.say(f"== {name} (budget {sec.budget:.0f} s)")
        t0 = time.monotonic()

        def expire(signum: int, frame: Any) -> None:
            raise SectionTimeout(f"{name} ran past its budget of {sec.budget:.0f} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, sec.budget)
        try:
            fn(self, sec)
            sec.status = "ok"
        except BaseException as e:  # one section's failure is recorded, not fatal
            if isinstance(e, KeyboardInterrupt):
                raise
            sec.status = "timeout" if isinstance(e, SectionTimeout) else "error"
            error, tb = f"{type(e).__name__}: {e}", traceback.format_exc()
            sec.error, sec.tb = error, tb
            self.say(f"{name}: {sec.status}: {error.splitlines()[0][:300]}")
            self.log(tb)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            sec.seconds = time.monotonic() - t0
            if sec.status != "ok":
                self.stop_jobs()
                if self._plain is not None and sec.status == "timeout":
                    self._plain.close()  # it may be in the middle of a call
            self.jobs.clear()
            failed = sec.failed()
            self.say(
                f"== {name}: {sec.status} in {sec.seconds:.1f} s; checks "
                f"{len(sec.checks) - len(failed)}/{len(sec.checks)} ok"
                + (f", failed: {', '.join(failed)}" if failed else "")
            )
            self.save()
        return sec

    def budget(self, name: str) -> float:
        return float(self.args.budget.get(name, BUDGET_S[name]))

    def left(self, sec: Section, t0: float) -> float:
        """Seconds left of ``sec``'s budget, the section having started at ``t0``."""
        return sec.budget - (time.monotonic() - t0)


class PlainRunner:
    """One plain Python process (no clustersdk) that runs ``_gpu_workload``'s plain loops on
    the same device, kept warm between calls."""

    def __init__(self, threads: int = 1) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
        self.conn, child = ctx.Pipe()
        # one intra-op thread, as Dask's nanny gives its workers (OMP_NUM_THREADS=1): the
        # same CPU-side kernels on both sides
        self.process = ctx.Process(
            target=W.serve, args=(child, threads), name="gpu_check-plain", daemon=True
        )
        self.process.start()
        child.close()
        self.info: dict[str, Any] | None = None

    def alive(self) -> bool:
        return self.process.is_alive()

    def call(self, name: str, timeout: float = 300, **kwargs: Any) -> Any:
        if self.info is None:
            self.info = self._receive(120, "start")
        self.conn.send((name, kwargs))
        return self._receive(timeout, name)

    def _receive(self, timeout: float, what: str) -> Any:
        if not self.conn.poll(timeout):
            self.close()
            raise TimeoutError(f"the plain process gave no answer to {what} in {timeout} s")
        status, value = self.conn.recv()
        if status == "error":
            raise RuntimeError(f"the plain loop {what} failed:\n{value}")
        return value

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(None)
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


# --- small helpers --------------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, tuple)):
        return list(value)
    if hasattr(value, "as_dict"):
        return value.as_dict()
    return repr(value)


def median(values: list[float]) -> float | None:
    """The median of what there is (None when nothing: a report, not a computation)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def med(values: list[float]) -> float:
    """The median, for figures computed from it (an empty list is a bug: it raises)."""
    return statistics.median(values)


def smi(*fields: str) -> list[str] | None:
    """One ``nvidia-smi --query-gpu`` answer for GPU 0, or None without nvidia-smi."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                f"--query-gpu={','.join(fields)}",
                "-i",
                "0",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]


def versions(run: Run) -> dict[str, Any]:
    import cloudpickle
    import dask
    import distributed
    import torch

    import clustersdk

    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "cloudpickle": cloudpickle.__version__,
        "clustersdk": clustersdk.__version__,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / GIB, 2),
            capability=f"{props.major}.{props.minor}",
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            cudnn=torch.backends.cudnn.version(),
        )
        fields = smi("name", "driver_version", "memory.total", "uuid")
        if fields:
            info.update(
                smi_name=fields[0], driver=fields[1], smi_memory_mib=fields[2], uuid=fields[3]
            )
    return info


@contextlib.contextmanager
def stopped(job: Any) -> Iterator[Any]:
    """The job, stopped on the way out however the section ended."""
    try:
        yield job
    finally:
        with contextlib.suppress(Exception):
            if not job.status.terminal:
                job.stop(timeout=30)


# --- sections -------------------------------------------------------------------------------
def section_doctor(run: Run, sec: Section) -> None:
    """``cluster.doctor()`` on the GPU worker: versions, the GPU NVML sees and its health."""
    report = run.cluster.doctor(bandwidth=True, timeout=60)
    data = report.to_dict()
    worker = data["workers"][0] if data["workers"] else {}
    versions_, gpus = worker.get("versions") or {}, worker.get("gpus") or []
    sec.figures.update(
        ok=report.ok,
        problems=[p["message"] for p in data["problems"]],
        versions=versions_,
        gpus=gpus,
        slot_kind=worker.get("slot_kind"),
        text=str(report),
    )
    run.say(f"doctor: {versions_} gpus={[g.get('name') for g in gpus]} ok={report.ok}")
    sec.check("no_problems", report.ok, sec.figures["problems"], "none")
    if run.rehearse:
        sec.check(
            "cpu_slot_no_gpu",
            not gpus and worker.get("slot_kind") == "cpu",
            [worker.get("slot_kind"), gpus],
            "cpu slot, no GPU",
        )
        return
    sec.check(
        "versions",
        all(versions_.get(k) for k in ("torch", "nccl", "cuda_driver")),
        {k: versions_.get(k) for k in ("torch", "nccl", "cuda_driver")},
        "all known",
    )
    sec.check(
        "gpu_health",
        bool(gpus) and all("error" not in g and not g.get("ecc_uncorrected") for g in gpus),
        gpus,
        "NVML sees the GPU, no uncorrected ECC errors",
    )


def section_nccl(run: Run, sec: Section) -> None:
    """The reference transformer under each layout at one rank, against the plain loop."""
    s = run.sizes["nccl"]
    ref = run.plain.call("plain_lm", **s)
    sec.figures["reference"] = ref
    run.say(
        f"nccl: plain loop on {ref['device']}: {ref['step_ms']:.1f} ms/step, "
        f"losses {ref['losses'][0]:.4f} .. {ref['losses'][-1]:.4f}"
    )
    variants: dict[str, tuple[dict[str, Any], bool]] = {  # launch options, forced DDP
        "ddp": ({}, False),
        "ddp_wrapped": ({}, True),
        "fsdp": ({"strategy": "fsdp"}, False),
        "fsdp_cpu_offload": ({"strategy": "fsdp", "cpu_offload": True}, False),
    }
    backend = "gloo" if run.rehearse else "nccl"
    for name, (options, wrap) in variants.items():
        job = run.launch(
            W.lm_job, kwargs={**s, "wrap_ddp": wrap}, name=f"nccl-{name}", timeout=120, **options
        )
        with stopped(job):
            out = job.wait(timeout=180)
        diffs = [abs(a - b) for a, b in zip(out["losses"], ref["losses"])]
        rel = max(d / max(abs(b), 1e-12) for d, b in zip(diffs, ref["losses"]))
        out.update(max_abs_diff=max(diffs), max_rel_diff=rel, bitwise=max(diffs) == 0.0)
        sec.figures[name] = out
        run.say(
            f"nccl: {name}: {out['backend']} on {out['device']}, {out['model_type']}, "
            f"params on {out['param_device']}, {out['step_ms']:.1f} ms/step, max |dloss| "
            f"{out['max_abs_diff']:.3g} (rel {rel:.3g}{', bitwise' if out['bitwise'] else ''})"
            f", torch threads {out['torch_threads']}"
        )
        sec.check(
            f"{name}_losses",
            len(diffs) == s["steps"] and rel <= LOSS_RTOL[name],
            out["max_rel_diff"],
            f"relative <= {LOSS_RTOL[name]:g} over {s['steps']} steps",
        )
        sec.check(
            f"{name}_backend",
            out["backend"] == backend and out["allreduce"] == 1.0,
            [out["backend"], out["allreduce"]],
            [backend, 1.0],
        )
        run.save()
    sec.check(
        "offload_params_on_cpu",
        sec.figures["fsdp_cpu_offload"]["param_device"] == "cpu",
        sec.figures["fsdp_cpu_offload"]["param_device"],
        "cpu",
    )


def section_telemetry(run: Run, sec: Section) -> None:
    """``job.system()`` and the dashboard's charts against nvidia-smi at the same moments."""
    from clustersdk.widgets import source
    from clustersdk.widgets.model import JobView

    s = run.sizes["telemetry"]
    fields = ("cpu_percent", "rss") if run.rehearse else ("gpu_util", "gpu_mem_used")
    charts = ("cpu", "rss") if run.rehearse else ("gpu_util", "gpu_mem")
    worker = run.worker()["worker"]
    pid = run.cluster.client.run(os.getpid, workers=[worker])[worker]
    reader = Reader(run.rehearse, pid)
    before = reader.read()
    reader.start()
    try:
        job = run.launch(
            W.telemetry_job, kwargs={"phases": s["phases"], "size": s["size"]}, name="telemetry"
        )
        live = JobView.from_record(job.info())
        job.on_event(live.apply)  # the live dashboard's feed
        with stopped(job):
            out = job.wait(timeout=120)
        time.sleep(2.5)  # the idle worker after the job: its memory given back?
        after = reader.read()
    finally:
        reader.stop()
    # (a sample taken as the rank's process ended has no rss: it is not a reading of it)
    samples = [x for x in job.system() if all(f in x for f in fields)]
    pairs = pair_samples(samples, reader.reads, out["marks"], fields, settle=s["settle"])
    steady = [p for p in pairs if p["steady"]]
    judged = {m["name"] for m in s["phases"] if m.get("judge_util", True)}
    util = [abs(p["util"] - p["ref_util"]) for p in steady if p["phase"] in judged]
    mem = [abs(p["mem_mib"] - p["ref_mem_mib"]) for p in steady]
    mem_ok = [d <= max(MEM_REL * p["ref_mem_mib"], MEM_ABS_MIB) for d, p in zip(mem, steady)]
    view = source.job_view(job)  # what the dashboard draws when it opens
    loaded = {c: chart_values(view, c) for c in charts}
    live_ys = {c: chart_values(live, c) for c in charts}
    expected = {
        charts[0]: [x[fields[0]] for x in samples],
        charts[1]: [x[fields[1]] / GIB for x in samples],
    }
    sec.figures.update(
        samples=len(samples),
        reads=len(reader.reads),
        pairs=pairs,
        marks=out["marks"],
        util_abs_diff={
            "median": median(util),
            "max": max(util, default=None),
            "phases": sorted(judged),
        },
        by_phase={
            m["name"]: phase_stats([p for p in steady if p["phase"] == m["name"]])
            for m in s["phases"]
        },
        mem_abs_diff_mib={"median": median(mem), "max": max(mem, default=None)},
        before=before,
        after=after,
        nvml_memory=nvml_memory(),
        chart_points={c: len(loaded[c]) for c in charts},
        live_chart_points={c: len(live_ys[c]) for c in charts},
    )
    run.say(
        f"telemetry: {len(samples)} samples, {len(reader.reads)} reference reads, "
        f"{len(steady)} steady pairs; |dutil| median {median(util)} max "
        f"{max(util, default=None)}; |dmem| MiB median {median(mem)} max "
        f"{max(mem, default=None)}; memory before {before} after {after}"
    )
    sec.check(
        "steady_pairs", len(steady) >= (2 if run.rehearse else 6), len(steady), ">= 6 (rehearsal 2)"
    )
    sec.check(
        "util_matches",
        bool(util) and max(util) <= UTIL_POINTS,
        max(util, default=None),
        f"<= {UTIL_POINTS} points in steady phases",
        gpu_target=True,
    )
    sec.check(
        "memory_matches",
        bool(mem_ok) and all(mem_ok),
        max(mem, default=None),
        f"<= {MEM_REL:.0%} or {MEM_ABS_MIB} MiB in steady phases",
    )
    sec.check(
        "chart_is_system",
        all(_close(loaded[c], expected[c]) for c in charts),
        {c: len(loaded[c]) for c in charts},
        "the charts draw job.system()'s values",
    )
    sec.check(
        "live_chart_matches",
        all(live_ys[c] and _close(live_ys[c], loaded[c][-len(live_ys[c]) :]) for c in charts),
        {c: len(live_ys[c]) for c in charts},
        "the live feed draws the same values",
    )
    if not run.rehearse:
        sec.check(
            "memory_freed_after_job",
            after["mem_mib"] - before["mem_mib"] <= 1024,
            after["mem_mib"] - before["mem_mib"],
            "<= 1024 MiB more than before the job",
        )


def chart_values(view: Any, chart: str) -> list[float]:
    """What a dashboard's system chart draws for rank 0."""
    series = view.system.get(chart, {}).get(0)
    return series.points()[1] if series is not None else []


def phase_stats(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase's steady pairs: how many, and the largest differences."""
    return {
        "pairs": len(pairs),
        "util": [p["util"] for p in pairs],
        "ref_util": [p["ref_util"] for p in pairs],
        "max_util_diff": max((abs(p["util"] - p["ref_util"]) for p in pairs), default=None),
        "max_mem_diff_mib": max(
            (abs(p["mem_mib"] - p["ref_mem_mib"]) for p in pairs), default=None
        ),
    }


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-9 * max(1.0, abs(y)) for x, y in zip(a, b))


class Reader:
    """What the telemetry is compared with, read every ~0.2 s in a thread: nvidia-smi's
    utilization.gpu and memory.used (rehearsal: the host's CPU % and the worker's RSS)."""

    def __init__(self, rehearse: bool, worker_pid: int):
        self.rehearse, self.pid = rehearse, worker_pid
        self.reads: list[dict[str, float]] = []
        self._nvml = None if rehearse else nvml_handle()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu_check-reader", daemon=True)

    def read(self) -> dict[str, float]:
        t0 = time.time()
        if self.rehearse:
            import psutil

            util = psutil.cpu_percent(interval=None)
            mem = psutil.Process(self.pid).memory_info().rss / MIB
        else:
            fields = smi("utilization.gpu", "memory.used")
            if fields is None:
                raise RuntimeError("nvidia-smi --query-gpu=utilization.gpu,memory.used failed")
            util, mem = float(fields[0]), float(fields[1])
        t1 = time.time()
        read = {"time": (t0 + t1) / 2, "took_s": t1 - t0, "util": util, "mem_mib": mem}
        if self._nvml is not None:  # which of NVML's two answers nvidia-smi agrees with
            nv, handle = self._nvml
            with contextlib.suppress(Exception):
                read["nvml_v1_mib"] = nv.nvmlDeviceGetMemoryInfo(handle).used / MIB
                read["nvml_v2_mib"] = (
                    nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2).used / MIB
                )
        return read

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.reads.append(self.read())
            self._stop.wait(0.2)


def pair_samples(
    samples: list[dict[str, Any]],
    reads: list[dict[str, float]],
    marks: list[dict[str, Any]],
    fields: tuple[str, str],
    window: float = 0.35,
    settle: float = 1.2,
) -> list[dict[str, Any]]:
    """Each telemetry sample beside the reference read nearest in time (within ``window``
    seconds); ``steady`` when it lies inside a phase, ``settle`` s after it began (NVML's
    utilisation averages over up to a second) and before it ended."""
    pairs = []
    for s in samples:
        t = s["time"]
        near = min(reads, key=lambda r: abs(r["time"] - t), default=None)
        if near is None or abs(near["time"] - t) > window:
            continue
        phase = next((m for m in marks if m["began"] + settle <= t <= m["ended"] - 0.2), None)
        pairs.append(
            {
                "time": t,
                "dt": near["time"] - t,
                "util": s[fields[0]],
                "ref_util": near["util"],
                "mem_mib": s[fields[1]] / MIB,
                "ref_mem_mib": near["mem_mib"],
                "steady": phase is not None,
                "phase": phase["name"] if phase else None,
                **{k: v for k, v in near.items() if k.startswith("nvml_")},
            }
        )
    return pairs


def nvml_handle() -> tuple[Any, Any] | None:
    """pynvml and GPU 0's handle, in this process (None without NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001 - no NVML here
        return None


def nvml_memory() -> dict[str, Any] | None:
    """GPU 0's memory through NVML's v1 and v2 calls (v2 leaves the driver's reservation out
    of ``used``, as newer nvidia-smi does): what explains a constant memory offset."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
        out: dict[str, Any] = {"v1_used_mib": v1.used / MIB, "v1_total_mib": v1.total / MIB}
        with contextlib.suppress(Exception):
            v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            out.update(v2_used_mib=v2.used / MIB, v2_reserved_mib=v2.reserved / MIB)
        return out
    except Exception as e:  # noqa: BLE001 - no NVML here
        return {"error": f"{type(e).__name__}: {e}"}


def section_bf16(run: Run, sec: Section) -> None:
    """GPT-2 with precision="bf16" through clustersdk against a plain autocast loop, in
    alternating rounds; ``cs_resident`` feeds one batch kept on the device (the loop alone,
    without ctx.shard's loader)."""
    s = run.sizes["bf16"]
    t0 = time.monotonic()
    kwargs = {k: s[k] for k in ("cfg", "batch", "warmup", "steps")}
    variants = ["cs", "plain", "cs_resident"]
    rounds: list[dict[str, Any]] = []
    for i in range(s["rounds"]):
        if rounds and run.left(sec, t0) < 1.5 * rounds[-1]["seconds"] + 5:
            run.say(f"bf16: {len(rounds)} rounds: the budget has no room for another")
            break
        r0, r = time.monotonic(), {}
        for v in variants[i % 3 :] + variants[: i % 3]:  # each variant leads a round in turn
            if v == "plain":
                r[v] = run.plain.call("plain_gpt2", **kwargs, precision="bf16")
            else:
                job = run.launch(
                    W.gpt2_job,
                    kwargs={**kwargs, "resident": v == "cs_resident"},
                    precision="bf16",
                    name=f"bf16-{v}-{i}",
                )
                with stopped(job):
                    r[v] = job.wait(timeout=240)
        r["seconds"] = time.monotonic() - r0
        rounds.append(r)
        run.say(
            "bf16: round {}: steps/s {}".format(
                i + 1, ", ".join(f"{v} {r[v]['steps_per_s']:.3f}" for v in variants)
            )
        )
        sec.figures["rounds"] = rounds
        run.save()
    rate = {v: med([r[v]["steps_per_s"] for r in rounds]) for v in variants}
    paired = {
        v: med([r[v]["steps_per_s"] / r["plain"]["steps_per_s"] for r in rounds])
        for v in ("cs", "cs_resident")
    }
    mem = {
        k: {v: median([r[v][k] for r in rounds]) for v in variants}
        for k in ("peak_allocated_gib", "peak_reserved_gib")
    }
    mem_ratio = {
        k: (m["cs"] / m["plain"] if m["cs"] and m["plain"] else None) for k, m in mem.items()
    }
    overhead_us = {v: 1e6 * (1 / rate[v] - 1 / rate["plain"]) for v in ("cs", "cs_resident")}
    sec.figures.update(
        params=rounds[0]["cs"]["params"],
        medians_steps_per_s=rate,
        paired_ratio=paired,
        ratio_of_medians={v: rate[v] / rate["plain"] for v in ("cs", "cs_resident")},
        peak_memory_gib=mem,
        peak_memory_ratio=mem_ratio,
        overhead_us_per_step=overhead_us,
        sizes=kwargs,
    )
    run.say(
        f"bf16: {rounds[0]['cs']['params'] / 1e6:.1f}M parameters; steps/s cs/plain "
        f"{paired['cs']:.4f} (loop alone {paired['cs_resident']:.4f}), peak memory "
        f"cs/plain {mem_ratio}; cs costs {overhead_us['cs']:.0f} us/step more"
    )
    sec.check(
        "steps_ratio",
        paired["cs"] >= STEPS_RATIO_TARGET,
        paired["cs"],
        f">= {STEPS_RATIO_TARGET}",
        gpu_target=True,
    )
    if not run.rehearse:
        ratio = mem_ratio["peak_allocated_gib"]
        sec.check("memory_ratio", ratio is not None and ratio <= 1.05, ratio, "<= 1.05")


def section_checkpoint(run: Run, sec: Section) -> None:
    """Loop time blocked by async and sync saves from device memory; save and load GB/s."""
    from clustersdk import checkpoint_files as ckpt

    s = run.sizes["checkpoint"]
    steps = s["every"] * s["saves"] + 1
    kwargs = {k: s[k] for k in ("width", "depth", "batch", "step_s")}
    dirs = {}
    for mode in ("sync", "async"):
        dirs[mode] = os.path.join(run.tmp, f"ckpt-{mode}")
        job = run.launch(
            W.ckpt_job,
            kwargs={**kwargs, "steps": steps},
            name=f"ckpt-{mode}",
            checkpoint_dir=dirs[mode],
            checkpoint_every=s["every"],
            keep=2,
            async_checkpoint=mode == "async",
        )
        with stopped(job):
            out = job.wait(timeout=300)
        nbytes = sum(ckpt.read_manifest(newest(ckpt, dirs[mode]))["files"].values())
        sec.figures[mode] = {
            **blocked_times(out["starts"], out["works"], s["every"]),
            "nbytes": nbytes,
            "state_bytes": out["state_bytes"],
        }
        f = sec.figures[mode]
        run.say(
            f"checkpoint: {mode}: {nbytes / 1e9:.2f} GB per save; loop blocked "
            f"{[round(b, 3) for b in f['blocked_s']]} s, next step +"
            f"{[round(b, 3) for b in f['next_extra_s']]} s (a step works "
            f"{f['work_s']:.4f} s)"
        )
        run.save()
    sync_, async_ = sec.figures["sync"], sec.figures["async"]
    save_s = med(sync_["blocked_s"])
    sec.figures["save_gb_s"] = sync_["nbytes"] / save_s / 1e9
    a_total = med([b + n for b, n in zip(async_["blocked_s"], async_["next_extra_s"])])
    sec.figures["async_over_sync"] = {
        "blocked": med(async_["blocked_s"]) / save_s,
        "blocked_and_next_step": a_total / save_s,
    }
    for temperature in ("warm", "cold"):
        dropped = temperature == "warm" or drop_caches()
        if not dropped:
            sec.figures["load_cold"] = "page cache could not be dropped (needs root)"
            continue
        last = ckpt.read_manifest(newest(ckpt, dirs["sync"]))["step"]
        job = run.launch(
            W.ckpt_job,
            kwargs={**kwargs, "steps": last + 2, "step_s": 0.0},
            name=f"ckpt-load-{temperature}",
            checkpoint_dir=dirs["sync"],
            checkpoint_every=s["every"],
            keep=2,
            resume="auto",
        )
        with stopped(job):
            out = job.wait(timeout=300)
        load_s = out["first_step_after_s"]
        sec.figures[f"load_{temperature}"] = {
            "seconds": load_s,
            "resumed_at": out["first"],
            "gb_s": sync_["nbytes"] / load_s / 1e9,
        }
        run.say(
            f"checkpoint: load ({temperature} page cache) {load_s:.3f} s at step "
            f"{out['first']}: {sync_['nbytes'] / load_s / 1e9:.2f} GB/s"
        )
    sec.figures["dir_filesystem"] = filesystem_of(run.tmp)
    run.say(
        f"checkpoint: sync save {sec.figures['save_gb_s']:.2f} GB/s; async/sync blocked "
        f"{sec.figures['async_over_sync']}"
    )
    sec.check(
        "async_blocks_less",
        sec.figures["async_over_sync"]["blocked"] <= 0.10,
        sec.figures["async_over_sync"]["blocked"],
        "<= 0.10 of a sync save",
        gpu_target=True,
    )
    sec.check(
        "resumed",
        sec.figures["load_warm"]["resumed_at"] == s["every"] * s["saves"],
        sec.figures["load_warm"]["resumed_at"],
        s["every"] * s["saves"],
    )
    if not run.rehearse:
        sec.check("state_size", sync_["nbytes"] >= 2e9, sync_["nbytes"], ">= 2 GB")


def newest(ckpt: Any, root: str) -> str:
    """The newest committed checkpoint under ``root`` (there must be one)."""
    path = ckpt.latest(root)
    if path is None:
        raise RuntimeError(f"no committed checkpoint under {root}")
    return path


def blocked_times(starts: list[float], works: list[float], every: int) -> dict[str, Any]:
    """How long the loop stood still at each checkpoint boundary (the gap ending at step
    ``b`` minus an ordinary gap), and how much longer the step at the boundary worked than
    an ordinary step (an async save's copy makes ``optimizer.step()`` wait for it)."""
    gaps = [0.0] + [b - a for a, b in itertools.pairwise(starts)]  # gaps[s] ends at step s
    bounds = [b for b in range(1, len(gaps)) if b % every == 0]
    plain = [g for i, g in enumerate(gaps) if i >= 1 and i % every and (i - 1) % every]
    gap = statistics.median(plain) if plain else 0.0
    work = statistics.median(w for i, w in enumerate(works) if i and i % every) if works else 0.0
    return {
        "step_s": gap,
        "work_s": work,
        "blocked_s": [gaps[b] - gap for b in bounds],
        "next_extra_s": [works[b] - work if b < len(works) else 0.0 for b in bounds],
    }


def drop_caches() -> bool:
    """Flush and drop the page cache (root only), for a load from the disk itself."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def filesystem_of(path: str) -> str | None:
    best: tuple[str, str | None] = ("", None)
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and path.startswith(parts[1]) and len(parts[1]) > len(best[0]):
                best = (parts[1], f"{parts[2]} at {parts[1]}")
    return best[1]


def section_cuda_oom(run: Run, sec: Section) -> None:
    """A rank asking for more than the device has: the diagnosis, then a job that works."""
    import clustersdk as cs

    s = run.sizes["cuda_oom"]
    expected = "host_oom" if run.rehearse else "cuda_oom"
    worker = run.worker()["worker"]
    if not run.rehearse:  # the idle worker, after the big jobs of the sections before
        pid = run.cluster.client.run(os.getpid, workers=[worker])[worker]
        used = process_gpu_mib(pid)
        sec.figures["idle_worker_gpu_mib"] = used
        sec.check(
            "idle_worker_memory",
            not used,
            used,
            "none: the worker makes no CUDA context (its ranks are processes of their own; "
            "the one waiting for the next job holds one, clustersdk.warm-cuda)",
        )
    job = run.launch(W.oom_job, kwargs=s, name="oom", timeout=60)
    try:
        with stopped(job):
            job.wait(timeout=120)
        raise AssertionError("the job that allocates past the device's memory finished")
    except cs.JobFailedError as e:
        sec.figures["error"] = {"type": e.exc_type, "message": e.message[:4000]}
    diagnosis = job.diagnosis
    d = diagnosis.as_dict() if diagnosis is not None else None
    sec.figures["diagnosis"] = d
    run.say(
        f"cuda_oom: {sec.figures['error']['type']}: diagnosis "
        f"{d and d['kind']}: {d and d['summary']}"
    )
    sec.check("kind", d is not None and d["kind"] == expected, d and d["kind"], expected)
    sec.check(
        "advice",
        d is not None and "grad_accum" in d["advice"]
        if expected == "cuda_oom"
        else d is not None and bool(d["advice"]),
        d and d["advice"][:200],
        "names grad_accum= (and fsdp, checkpointing, bf16)",
    )
    if not run.rehearse:
        peak = (d or {}).get("data", {}).get("max_allocated")
        sec.check(
            "peak_is_this_jobs",
            peak is not None and s["first_gib"] <= peak / GIB < s["first_gib"] + 0.5,
            peak and peak / GIB,
            f"about {s['first_gib']} GiB: this job's own peak, not "
            "an earlier job's on the same warm worker",
        )
        sec.check(
            "total_known",
            bool((d or {}).get("data", {}).get("total")),
            (d or {}).get("data"),
            "the device's total memory",
        )
    small = run.launch(W.small_job, name="after-oom")
    with stopped(small):
        after = small.wait(timeout=60)
    sec.figures["after"] = {**after, "worker": run.cluster.slots()[0]["worker"]}
    sec.check(
        "worker_usable",
        after["finite"] and sec.figures["after"]["worker"] == worker,
        sec.figures["after"],
        "a small job finishes on the same worker",
    )


def section_rank_process(run: Run, sec: Section) -> None:
    """Every rank a process of its own, on the GPU: a warm launch to the first step
    against torchrun's; a device-side assert named as a CUDA error, and the same worker
    serving the next job on the GPU; NCCL's watchdog abort of a hung collective named."""
    import clustersdk as cs

    s = run.sizes["rank_process"]
    worker = run.worker()["worker"]
    ours = []
    for i in range(s["rounds"] + 1):  # the first is untimed: "warm" means a job ran before
        time.sleep(s["gap_s"])  # as between a person's launches: the slot's spare is ready
        t0 = time.time()
        job = run.launch(W.first_step_job, name=f"first-step-{i}")
        with stopped(job):
            done = job.wait(timeout=120)
        if i:
            ours.append(done - t0)
    theirs = [torchrun_first_step(run) for _ in range(s["torchrun_rounds"])]
    sec.figures["first_step_s"] = {"clustersdk": med(ours), "torchrun": med(theirs)}
    run.say(f"rank_process: first step {med(ours):.3f} s, torchrun {med(theirs):.3f} s")
    sec.check("warm_launch", med(ours) <= 1.0, round(med(ours), 3), "<= 1 s", gpu_target=True)
    sec.check("faster_than_torchrun", med(ours) < med(theirs), sec.figures["first_step_s"])

    job = run.launch(W.device_assert_job, name="device-assert")
    try:
        with stopped(job):
            job.wait(timeout=120)
        raise AssertionError("the job with a device-side assert finished")
    except cs.JobFailedError as e:
        sec.figures["assert"] = {"type": e.exc_type, "message": e.message[:2000]}
    d = job.diagnosis
    sec.figures["assert"]["diagnosis"] = d and d.as_dict()
    sec.check(
        "assert_named", d is not None and d.kind == "cuda_error", d and d.summary, "cuda_error"
    )
    after = run.launch(W.small_job, name="after-assert")
    with stopped(after):
        result = after.wait(timeout=60)
    slot = run.cluster.slots()[0]["worker"]
    sec.check(
        "worker_serves_the_next_job",
        result["finite"] and slot == worker,
        {**result, "worker": slot},
        "a small job finishes on the same worker, on the GPU",
    )

    job = run.launch(
        W.watchdog_job, kwargs={"stall_s": s["stall_s"]}, name="watchdog", timeout=s["timeout"]
    )
    try:
        with stopped(job):
            job.wait(timeout=120)
        raise AssertionError("the job with a hung collective finished")
    except cs.JobFailedError as e:
        sec.figures["watchdog"] = {"type": e.exc_type, "message": e.message[:2000]}
        named = "NCCL's watchdog" in e.message and "SIGABRT" in e.message
    d = job.diagnosis
    sec.figures["watchdog"]["diagnosis"] = d and d.as_dict()
    sec.check(
        "watchdog_named",
        named,
        sec.figures["watchdog"]["message"][:300],
        "died of SIGABRT: NCCL's watchdog",
    )
    sec.check(
        "watchdog_diagnosed",
        d is not None and d.kind == "collective_timeout",
        d and d.summary,
        "collective_timeout",
    )
    sec.check("worker_stays", run.worker()["worker"] == worker, worker, "the same worker")


def torchrun_first_step(run: Run) -> float:
    """torchrun's launch to its first step of the same model (one rank, NCCL on CUDA)."""
    out = os.path.join(run.tmp, "torchrun-first-step.json")
    code = (
        f"import sys; sys.path.insert(0, {str(HERE)!r}); import _gpu_workload as W; "
        "W.first_step_torchrun(sys.argv[1])"
    )
    script = os.path.join(run.tmp, "first_step.py")
    Path(script).write_text(code.replace("; ", "\n"))
    t0 = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=1",
            script,
            out,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)["first_step"] - t0


def process_gpu_mib(pid: int) -> float | None:
    """GPU memory nvidia-smi attributes to process ``pid`` (None where it lists no
    processes, as in some containers)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            return float(fields[1])
    return None


def section_duplicate_gpu(run: Run, sec: Section) -> None:
    """Workers started by hand on one GPU, attached with Cluster.connect."""
    import clustersdk as cs
    from clustersdk.diagnosis import diagnose

    n = run.sizes["duplicate_gpu"]["workers"]
    standin = (
        None
        if not run.rehearse
        else (
            "NCCL error in: ProcessGroupNCCL.cpp, invalid usage (run with NCCL_DEBUG=WARN for "
            "details)\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
            "Last error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1e000"
        )
    )
    with HandCluster(run, n) as hand:
        cluster = cs.Cluster.connect(hand.address, state_dir=os.path.join(run.tmp, "dup"))
        try:
            wait_until(lambda: len(cluster.slots()) == n, 120, f"{n} hand-started workers")
            slots = cluster.slots()
            sec.figures["slots"] = slots
            uuids = [s["uuid"] for s in slots]
            run.say(f"duplicate_gpu: slots {[(s['kind'], s['index'], s['uuid']) for s in slots]}")
            if not run.rehearse and gang_rule(run, sec, cluster, n, uuids) < 2:
                raise RuntimeError(
                    f"the slots' UUIDs {uuids} leave fewer than 2 devices to "
                    "the gang rule: no 2-rank job can start on them"
                )
            # NCCL_DEBUG=WARN: NCCL's own lines go to the workers' logs (kept below)
            job = cluster.launch(
                W.pair_job,
                kwargs={"standin": standin},
                world_size=2,
                name="duplicate",
                timeout=60,
                py_modules=[W],
                env={"NCCL_DEBUG": "WARN"},
            )
            with stopped(job):
                try:
                    out = job.wait(timeout=90)
                    sec.figures["job"] = {"finished": out}
                except cs.JobFailedError as e:
                    sec.figures["job"] = {
                        "type": e.exc_type,
                        "message": e.message[:6000],
                        "consequences": e.consequences,
                        "traceback": e.traceback[-6000:],
                    }
                except cs.JobTimeoutError as e:
                    sec.figures["job"] = {
                        "type": "JobTimeoutError",
                        "message": str(e),
                        "status": job.status.name,
                        "reason": job.reason,
                    }
            d = job.diagnosis
            sec.figures["diagnosis"] = d.as_dict() if d is not None else None
            run.say(
                f"duplicate_gpu: the job: {sec.figures['job'].get('type', 'FINISHED')}: "
                f"diagnosis {d and d.kind}: {d and d.summary}"
            )
            sec.check(
                "diagnosis",
                d is not None and d.kind == "duplicate_gpu",
                d and d.kind,
                "duplicate_gpu",
            )
            sec.check(
                "advice",
                d is not None and "CUDA_VISIBLE_DEVICES" in d.advice,
                d and d.advice[:200],
                "one worker per GPU (CUDA_VISIBLE_DEVICES)",
            )
            report = cluster.doctor(bandwidth=False, timeout=60)
            sec.figures["doctor_problems"] = [p.message for p in report.problems]
        finally:
            cluster.close()
            sec.figures["worker_logs"] = hand.tails()
    if run.rehearse:
        d = diagnose({"rank": 1, "type": "DistBackendError", "message": standin})
        sec.figures["raw_nccl"] = {"stand_in_message": standin, "diagnosis": d and d.as_dict()}
        return
    raw = raw_nccl_pair()
    errors = [r for r in raw if not r["ok"]]
    diagnoses = [
        diagnose({"rank": r["rank"], "type": r["type"], "message": r["message"]}) for r in errors
    ]
    sec.figures["raw_nccl"] = {"ranks": raw, "diagnoses": [d and d.as_dict() for d in diagnoses]}
    run.say(
        f"duplicate_gpu: two plain NCCL ranks on cuda:0: "
        f"{[(r['rank'], r.get('type'), r.get('message', '')[:160]) for r in raw]}"
    )
    sec.check(
        "raw_nccl_classified",
        bool(errors) and all(d is not None and d.kind == "duplicate_gpu" for d in diagnoses),
        [d and d.kind for d in diagnoses],
        "NCCL's own words classify as duplicate_gpu",
    )


def gang_rule(run: Run, sec: Section, cluster: Any, n: int, uuids: list[str]) -> int:
    """Slots that report one GPU's UUID are one device to the scheduler: a gang larger than
    the distinct devices waits (QUEUED) instead of putting two ranks on one GPU. Returns
    how many distinct devices the slots are to it."""
    distinct = len({u for u in uuids if u}) + sum(1 for u in uuids if not u)
    sec.check(
        "same_uuid_seen",
        len({u for u in uuids if u}) == 1 and uuids.count("") == 1,
        uuids,
        "the two plain workers report GPU 0's UUID; the third none",
    )
    job = cluster.launch(
        W.pair_job, world_size=distinct + 1, name="gang-rule", timeout=60, py_modules=[W]
    )
    with stopped(job):
        time.sleep(4)
        sec.figures["gang_rule"] = {
            "world_size": distinct + 1,
            "status": job.status.name,
            "reason": job.reason,
        }
    run.say(
        f"duplicate_gpu: a {distinct + 1}-rank job on {n} slots of {distinct} distinct "
        f"devices: {job.status.name}: {job.reason}"
    )
    sec.check(
        "gang_waits",
        sec.figures["gang_rule"]["status"] == "QUEUED",
        sec.figures["gang_rule"]["status"],
        "QUEUED (never two ranks on one UUID)",
    )
    return distinct


class HandCluster:
    """A scheduler and ``n`` workers started by hand (``python -m distributed.cli...``), all
    on GPU 0 (``CUDA_VISIBLE_DEVICES=0``; in rehearsal none); the last one's GPU reports no
    UUID (``_gpu_hide_uuid.py`` preloaded). Each in its own process group, ended on exit."""

    def __init__(self, run: Run, n: int):
        self.run, self.n = run, n
        self.dir = tempfile.mkdtemp(prefix="hand-", dir=run.tmp)
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.address = ""

    def __enter__(self) -> HandCluster:
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": "" if self.run.rehearse else "0",
            "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "warning",
        }
        file = os.path.join(self.dir, "scheduler.json")
        try:
            self._start(
                "scheduler",
                [
                    "distributed.cli.dask_scheduler",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--dashboard-address",
                    "127.0.0.1:0",
                    "--scheduler-file",
                    file,
                ],
                env,
            )
            wait_until(lambda: os.path.exists(file), 60, "the hand-started scheduler")
            time.sleep(0.2)
            self.address = json.loads(Path(file).read_text())["address"]
            for i in range(self.n):
                preload = ["--preload", str(HERE / "_gpu_hide_uuid.py")] if i == self.n - 1 else []
                self._start(
                    f"worker-{i}",
                    [
                        "distributed.cli.dask_worker",
                        "--scheduler-file",
                        file,
                        "--nthreads",
                        "1",
                        "--host",
                        "127.0.0.1",
                        "--name",
                        f"hand-{i}",
                        "--no-dashboard",
                        *preload,
                    ],
                    env,
                )
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(os.path.join(self.dir, f"{name}.log"), "w") as log:  # the child keeps it
            proc = subprocess.Popen(
                [sys.executable, "-m", *argv],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=ROOT,
            )
        self.procs.append((name, proc))

    def tails(self, chars: int = 3000) -> dict[str, str]:
        out = {}
        for name, _ in self.procs:
            with contextlib.suppress(OSError):
                text = Path(self.dir, f"{name}.log").read_text(errors="replace")
                out[name] = text[-chars:]
                self.run.log(f"--- {name} log ---\n{text[-20000:]}")
        return out

    def close(self) -> None:
        for _, proc in reversed(self.procs):  # workers first, then the scheduler
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def __exit__(self, *exc: object) -> None:
        self.close()


def raw_nccl_pair() -> list[dict[str, Any]]:
    """NCCL's own words when two plain processes both put a rank on cuda:0."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        ctx.Process(target=W.raw_nccl_rank, args=(rank, port, queue), daemon=True)
        for rank in range(2)
    ]
    for p in procs:
        p.start()
    results = []
    deadline = time.monotonic() + 75  # each rank's own timeouts are 60 s
    with contextlib.suppress(Exception):
        for _ in procs:
            results.append(queue.get(timeout=max(deadline - time.monotonic(), 0.1)))
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    return sorted(results, key=lambda r: r["rank"])


def section_gpu_tests(run: Run, sec: Section) -> None:
    """``pytest -m gpu`` on the suite's GPU tests, in a process of its own (its tests start
    their own local clusters)."""
    xml = os.path.join(run.tmp, "gpu_tests.xml")
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        *GPU_TEST_FILES,
        "-p",
        "no:cacheprovider",
        "-q",
        "-rs",
        f"--junitxml={xml}",
    ]
    sec.figures["command"] = " ".join(argv[1:])
    proc = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=max(sec.budget - 10, 30),
    )
    output = proc.stdout + proc.stderr
    run.log(f"--- pytest -m gpu (exit {proc.returncode}) ---\n{output}")
    tests = junit_outcomes(xml) if os.path.exists(xml) else []
    counts = {
        k: sum(1 for t in tests if t["outcome"] == k)
        for k in ("passed", "failed", "error", "skipped")
    }
    sec.figures.update(
        exit=proc.returncode,
        tests=tests,
        counts=counts,
        summary=output.strip().splitlines()[-1] if output.strip() else "",
    )
    run.say(f"gpu_tests: {sec.figures['summary']}")
    sec.check(
        "collected",
        len(tests) == len(GPU_TEST_FILES),
        len(tests),
        f"{len(GPU_TEST_FILES)} gpu-marked tests",
    )
    if run.rehearse:
        sec.check("all_skipped", counts["skipped"] == len(tests), counts, "skipped without a GPU")
        return
    sec.check(
        "passed",
        bool(tests) and all(t["outcome"] == "passed" for t in tests),
        counts,
        "every gpu test passes",
    )


def junit_outcomes(path: str) -> list[dict[str, Any]]:
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = "failed" if kind == "failure" else kind
                message = (node.get("message") or "")[:500]
        out.append(
            {
                "name": f"{case.get('classname')}::{case.get('name')}",
                "outcome": outcome,
                "seconds": float(case.get("time") or 0),
                "message": message,
            }
        )
    return out


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            value = predicate()
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.25)


RUNNERS: dict[str, Callable[[Run, Section], None]] = {
    "doctor": section_doctor,
    "nccl": section_nccl,
    "telemetry": section_telemetry,
    "bf16": section_bf16,
    "checkpoint": section_checkpoint,
    "cuda_oom": section_cuda_oom,
    "rank_process": section_rank_process,
    "duplicate_gpu": section_duplicate_gpu,
    "gpu_tests": section_gpu_tests,
}


# --- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for gpu_check.json and .log")
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="no GPU: run every section on the CPU with stand-ins",
    )
    parser.add_argument("--quick", action="store_true", help="with --rehearse: smaller still")
    parser.add_argument("--only", default="", help=f"sections to run, of {','.join(SECTIONS)}")
    parser.add_argument("--budget", default="", help="per-section budgets, e.g. bf16=200,nccl=60")
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help=f"seconds for the whole run (default {DEADLINE_S}; rehearsal 900)",
    )
    args = parser.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        parser.error(
            f"--only: unknown section(s) {', '.join(unknown)}; expected some of "
            f"{', '.join(SECTIONS)}"
        )
    args.sections = [s for s in SECTIONS if not only or s in only]
    budgets = {}
    for item in filter(None, args.budget.split(",")):
        name, _, seconds = item.partition("=")
        if name not in SECTIONS or not seconds.replace(".", "", 1).isdigit():
            parser.error(
                f"--budget: expected NAME=SECONDS with NAME one of {', '.join(SECTIONS)}, "
                f"got {item!r}"
            )
        budgets[name] = float(seconds)
    args.budget = budgets
    if args.quick and not args.rehearse:
        parser.error("--quick is for --rehearse (the GPU run has its own sizes)")
    if args.deadline is None:
        args.deadline = 900.0 if args.rehearse else float(DEADLINE_S)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not args.rehearse and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        print(
            f"gpu_check: no CUDA device: torch {torch.__version__} ({build}) sees no GPU; "
            "run it on a GPU machine, or --rehearse here",
            file=sys.stderr,
            flush=True,
        )
        return 2
    os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")
    # GPT-2 is built from its config: nothing may wait on the Hugging Face hub (the GPU
    # machine reaches no network); the workers and the plain process inherit these
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    run = Run(args)
    mode = "rehearsal on the CPU: every figure is a stand-in" if run.rehearse else "GPU"
    run.say(
        f"gpu_check ({mode}), "
        f"sections {','.join(args.sections)}, deadline {args.deadline:.0f} s, out {run.out}"
    )
    try:
        run.machine.update(versions(run))
        run.say(f"machine: {run.machine}")
        run.save()
        for name in args.sections:
            if name not in NEEDS_CLUSTER:
                run.close_cluster()  # the sections after start their own clusters
            run.section(name, RUNNERS[name])
    finally:
        run.close()
    bad = [n for n, s in run.sections.items() if s.status != "ok"]
    failed = [f"{n}.{c}" for n, s in run.sections.items() for c in s.failed()]
    print(
        f"gpu_check: {len(run.sections) - len(bad)}/{len(run.sections)} sections ran"
        + (f" ({', '.join(f'{n}: {run.sections[n].status}' for n in bad)})" if bad else "")
        + f"; failed checks: {', '.join(failed) or 'none'}; "
        f"{'REHEARSAL: no GPU figures' if run.rehearse else 'GPU figures'} in "
        f"{run.out / 'gpu_check.json'}",
        flush=True,
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
