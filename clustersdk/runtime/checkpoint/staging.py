"""The copy ("staging") of an async save's tensors, in the background.

An async save copies the tensors while the next step computes. Whatever would
change them before the copy is done must wait for it: :class:`Gate` hooks an
optimizer's ``step()`` and, for a model with buffers (batch norm's running
statistics change in forward), the model's forward. The copy and DCP's upload
thread run at a lower CPU priority than the ranks (Linux, per thread).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions

BACKGROUND_NICE = 10  # checkpoint threads yield the CPU to training


def background() -> None:
    """Lower the calling thread's CPU priority (where the OS has per-thread nice)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):  # not Linux, or not allowed: no harm
        pass


class CpuStager(AsyncStager):
    """Copies a CPU state dict in one lower-priority background thread, so that the
    ranks' own threads keep the cores while a save is staged."""

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self._copy = DefaultStager(
            StagingOptions(
                use_pinned_memory=False,
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=False,
            )
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="clustersdk-staging", initializer=background
        )

    def stage(self, state_dict: dict[str, Any]) -> concurrent.futures.Future:
        return self._pool.submit(self._copy.stage, state_dict)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._copy.close()


def stager_for(device: torch.device) -> AsyncStager:
    """On CUDA, pinned buffers (kept between saves) and a side stream; else :class:`CpuStager`."""
    if device.type == "cuda":
        return DefaultStager(
            StagingOptions(
                use_pinned_memory=True,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=True,
            )
        )
    return CpuStager()


class Gate:
    """Makes every change to the staged tensors wait for their copy."""

    def __init__(self) -> None:
        self._staging: concurrent.futures.Future | None = None
        self._hooked: set[int] = set()  # ids of the modules and optimizers hooked

    def close_over(
        self, model: torch.nn.Module | None, optimizers: Iterable[torch.optim.Optimizer]
    ) -> bool:
        """Hook ``optimizers`` (and ``model`` if it has buffers) once; False when there is
        no optimizer to hook: the parameters may then change anywhere."""
        hooked: list[Any] = list(optimizers)
        if not hooked:
            return False
        if model is not None and any(True for _ in model.buffers()):
            hooked.append(model)
        for obj in hooked:
            if id(obj) not in self._hooked:
                if isinstance(obj, torch.optim.Optimizer):
                    obj.register_step_pre_hook(self.wait)
                else:
                    obj.register_forward_pre_hook(self.wait)
                self._hooked.add(id(obj))
        return True

    def hold(self, staging: concurrent.futures.Future) -> None:
        """The copy in flight, that changes must wait for."""
        self._staging = staging

    def wait(self, *_: Any) -> None:
        """Until the tensors of the save in flight are copied (a failed copy fails the
        save, which reports it: training goes on)."""
        staging, self._staging = self._staging, None
        if staging is not None:
            concurrent.futures.wait([staging])
