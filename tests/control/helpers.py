"""Helpers for the control-plane tests: small clusters, scheduling configs, requests."""

from __future__ import annotations

import itertools
from typing import Any

from clustersdk.control.scheduling import PolicyConfig, Request, Scheduler, Slot

_seq = itertools.count(1)


def gpus(hosts: int = 1, per_host: int = 4, prefix: str = "h") -> list[Slot]:
    return [Slot(f"tcp://{prefix}{h}:{9000 + i}", f"{prefix}{h}", "cuda", i, f"GPU-{prefix}{h}-{i}")
            for h in range(hosts) for i in range(per_host)]


def config(**settings: Any) -> PolicyConfig:
    """``config(per_user_cap=4, queues={...})``: keyword names with _ for -."""
    return PolicyConfig.from_dict({k.replace("_", "-"): v for k, v in settings.items()})


def req(job: str, n: int, priority: int | str = "normal", **kw: Any) -> Request:
    """A request in submission order (each call is submitted after the previous one)."""
    prio = PolicyConfig.from_dict({}).priority(priority)
    kw.setdefault("owner", "alice")
    return Request(job, n, priority=prio, seq=next(_seq), **kw)


def scheduler(slots: list[Slot] | None = None, cfg: PolicyConfig | None = None,
              *requests: Request, now: float = 0.0) -> Scheduler:
    s = Scheduler(cfg or config(), slots if slots is not None else gpus())
    for r in requests:
        s.submit(r)
    return s


def started(decision) -> dict[str, int]:
    """job -> world size, for the jobs a decision starts."""
    return {s.job: s.world_size for s in decision.start}
