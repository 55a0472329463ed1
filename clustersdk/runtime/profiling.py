"""``job.profile(steps=N)`` on a rank: ``torch.profiler`` over exactly N steps.

The request travels as the control vector's PROFILE word
(:func:`clustersdk.protocol.profile_word`), so every rank starts at the same
agreed step boundary and stops N steps later, without a restart. Each rank
writes its trace as Chrome trace JSON (``rank<R>.pt.trace.json``: Perfetto
and TensorBoard's profiler plugin open it) and reports a small summary: the
top operators and the profiled steps' wall time split into data wait,
communication and compute.

The traces go beside the job: under ``<checkpoint_dir>/profiles/`` when
the job has a local checkpoint directory, else beside its journal, under the
control plane's ``<state-dir>/profiles/<job name>/`` (on a cluster of several
hosts without a shared file system, each host keeps its ranks' traces
there), in a directory ``<job id>-<request>``.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from typing import Any

from .. import config
from ..protocol import RankEvent, WireSpec, profile_request

TOP_OPS = 15
DATA_WAIT = "clustersdk.data_wait"  # the record_function around the loader's next()
# operators that move data between ranks (gloo, NCCL, c10d functional collectives)
_COMM = (
    "allreduce",
    "all_reduce",
    "allgather",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "alltoall",
    "all_to_all",
    "nccl",
    "gloo",
    "c10d::",
    "record_param_comms",
    "send",
    "recv",
    "barrier",
)


def trace_dir(spec: WireSpec, seq: int) -> str:
    """Where request ``seq``'s traces go (the same on every rank)."""
    root = spec.checkpoint_dir
    if root and "://" not in root:
        base = os.path.join(os.path.abspath(root), "profiles")
    else:
        base = os.path.join(spec.profile_dir or config.state_dir(), "profiles", spec.name)
    return os.path.join(base, f"{spec.id[:8]}-{seq:04d}")


class Profiler:
    """One rank's side of ``job.profile``: the capture running (``capture``, or None) and
    the newest request acted on. ``report`` tells the control plane each rank's result."""

    def __init__(self, *, rank: int, device_type: str, report: Callable[..., None]):
        self.rank, self.device_type, self.report = rank, device_type, report
        self.capture: Capture | None = None
        self.done = 0  # the newest PROFILE request acted on

    def start(self, word: int, step: int, spec: WireSpec) -> None:
        """Start the capture a newer PROFILE word asks for (after the running one), at
        ``step``."""
        seq, steps = profile_request(word)
        if seq <= self.done or self.capture is not None or steps < 1:
            return
        self.done = seq
        try:
            self.capture = Capture(
                seq, steps, step, self.rank, trace_dir(spec, seq), self.device_type
            )
        except Exception as e:  # e.g. the training function runs a profiler of its own
            self.report(
                RankEvent.PROFILED,
                seq=seq,
                profile={
                    "rank": self.rank,
                    "seq": seq,
                    "first_step": step,
                    "steps": 0,
                    "asked": steps,
                    "error": f"{type(e).__name__}: {e}",
                },
            )

    def step_done(self) -> None:
        """A step is over: finish the capture once it has all its steps."""
        capture = self.capture
        if capture is not None and capture.step_done():
            self.finish()

    def finish(self) -> None:
        """Write this rank's trace and report it (also after fewer steps: the loop ended);
        a profile that fails never fails the job."""
        capture, self.capture = self.capture, None
        if capture is None:
            return
        try:
            profile = capture.finish()
        except Exception as e:  # e.g. the disk is full
            profile = {
                "rank": self.rank,
                "seq": capture.seq,
                "first_step": capture.first,
                "steps": capture.done,
                "asked": capture.steps,
                "error": f"{type(e).__name__}: {e}",
            }
        self.report(RankEvent.PROFILED, seq=capture.seq, profile=profile)


class Capture:
    """One rank's profile of ``steps`` steps from ``first``; :meth:`step_done` after each."""

    def __init__(
        self, seq: int, steps: int, first: int, rank: int, directory: str, device_type: str
    ):
        import torch.profiler as tp

        self.seq, self.steps, self.first, self.rank = seq, steps, first, rank
        self.directory = directory
        self.path = os.path.join(directory, f"rank{rank}.pt.trace.json")
        self.done = 0
        self.data_wait = 0.0
        activities = [tp.ProfilerActivity.CPU]
        if device_type == "cuda":
            activities.append(tp.ProfilerActivity.CUDA)
        self.cuda = device_type == "cuda"
        with warnings.catch_warnings():  # "won't be using warmup": the steps are the user's
            warnings.simplefilter("ignore")
            self._prof = tp.profile(
                activities=activities,
                record_shapes=False,
                schedule=tp.schedule(wait=0, warmup=0, active=steps, repeat=1),
            )
            self._prof.start()
        self._t0 = time.perf_counter()
        self._wall = 0.0

    def data(self) -> Any:
        """The context to wrap the loader's ``next()`` in while capturing."""
        import torch.profiler as tp

        return tp.record_function(DATA_WAIT)

    def step_done(self) -> bool:
        """A profiled step is over; True once all ``steps`` are (then call :meth:`finish`)."""
        self.done += 1
        if self.done >= self.steps:
            self._wall = time.perf_counter() - self._t0
            return True
        self._prof.step()
        return False

    def finish(self) -> dict[str, Any]:
        """Stop, write the trace, and summarize what was captured (also after fewer steps)."""
        if not self._wall:
            self._wall = time.perf_counter() - self._t0
        self._prof.stop()
        os.makedirs(self.directory, exist_ok=True)
        self._prof.export_chrome_trace(self.path)
        return {
            "rank": self.rank,
            "seq": self.seq,
            "first_step": self.first,
            "steps": self.done,
            "asked": self.steps,
            "path": self.path,
            **summarize(self._prof.key_averages(), self._wall, self.cuda),
        }


def summarize(averages: Any, wall: float, cuda: bool = False) -> dict[str, Any]:
    """Top operators by self time, and ``wall`` split into data wait, communication and
    compute (compute: the rest; on a GPU, communication is the NCCL kernels' time)."""
    ops, data_wait, comm = [], 0.0, 0.0
    for avg in averages:
        name = avg.key
        self_cpu = avg.self_cpu_time_total / 1e6
        device = getattr(avg, "self_device_time_total", 0.0) / 1e6 if cuda else 0.0
        if name == DATA_WAIT:
            data_wait += avg.cpu_time_total / 1e6
            continue
        if name.startswith("ProfilerStep"):
            continue
        lowered = name.lower()
        if any(tag in lowered for tag in _COMM):
            comm += device if cuda and device else self_cpu
        ops.append(
            {
                "name": name,
                "calls": int(avg.count),
                "self_s": self_cpu,
                "total_s": avg.cpu_time_total / 1e6,
                "device_s": device,
            }
        )
    key = "device_s" if cuda else "self_s"
    ops.sort(key=lambda o: o[key], reverse=True)
    comm = min(comm, max(wall - data_wait, 0.0))
    return {
        "wall_s": wall,
        "data_wait_s": data_wait,
        "communication_s": comm,
        "compute_s": max(wall - data_wait - comm, 0.0),
        "top_ops": ops[:TOP_OPS],
    }
