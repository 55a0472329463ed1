"""Helpers for the control-plane tests: lifecycles of small gangs and what they return;
small clusters, scheduling configs, requests."""

from __future__ import annotations

import itertools
from typing import Any

from clustersdk.control import events as ev
from clustersdk.control.lifecycle import Lifecycle
from clustersdk.control.scheduling import PolicyConfig, Request, Scheduler, Slot
from clustersdk.protocol import ExitStatus, WireSpec, Word, no_words
from clustersdk.status import JobStatus

_seq = itertools.count(1)


def gpus(hosts: int = 1, per_host: int = 4, prefix: str = "h") -> list[Slot]:
    return [
        Slot(f"tcp://{prefix}{h}:{9000 + i}", f"{prefix}{h}", "cuda", i, f"GPU-{prefix}{h}-{i}")
        for h in range(hosts)
        for i in range(per_host)
    ]


def config(**settings: Any) -> PolicyConfig:
    """``config(per_user_cap=4, queues={...})``: keyword names with _ for -."""
    return PolicyConfig.from_dict({k.replace("_", "-"): v for k, v in settings.items()})


def req(job: str, n: int, priority: int | str = "normal", **kw: Any) -> Request:
    """A request in submission order (each call is submitted after the previous one)."""
    prio = PolicyConfig.from_dict({}).priority(priority)
    kw.setdefault("owner", "alice")
    return Request(job, n, priority=prio, seq=next(_seq), **kw)


def scheduler(
    slots: list[Slot] | None = None,
    cfg: PolicyConfig | None = None,
    *requests: Request,
    now: float = 0.0,
) -> Scheduler:
    s = Scheduler(cfg or config(), slots if slots is not None else gpus())
    for r in requests:
        s.submit(r)
    return s


def started(decision) -> dict[str, int]:
    """job -> world size, for the jobs a decision starts."""
    return {s.job: s.world_size for s in decision.start}


# --- lifecycles -------------------------------------------------------------------------
def make(world_size: int = 2, **options) -> Lifecycle:
    return Lifecycle(
        WireSpec(id="j1", name="j", world_size=world_size, **options), failure_grace=3.0
    )


def gang(n: int) -> ev.Allocated:
    return ev.Allocated(tuple(ev.RankSlot(f"w{i}", f"h{i}", "cpu") for i in range(n)))


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def of(actions, kind) -> list:
    return [a for a in actions if isinstance(a, kind)]


def statuses(actions) -> list[str]:
    return [a.fields["status"] for a in of(actions, ev.Journal) if "status" in a.fields]


def vector(**words: int) -> tuple[int, ...]:
    """A control vector with these words raised (the others 0)."""
    out = no_words()
    for name, value in words.items():
        out[Word[name.upper()]] = value
    return tuple(out)


def running(world_size: int = 2, **options) -> Lifecycle:
    job = make(world_size, **options)
    job.handle(gang(world_size), 0.0)
    for rank in range(world_size):
        job.handle(ev.Started(rank, job.attempt), 1.0)
    assert job.status is JobStatus.RUNNING
    return job


def exit_all(job: Lifecycle, status: ExitStatus = ExitStatus.OK, ranks=None) -> list:
    actions = []
    for rank in ranks if ranks is not None else range(job.world_size):
        actions += job.handle(
            ev.Exited(rank, job.attempt, status, b"result" if rank == 0 else None), 5.0
        )
    return actions
