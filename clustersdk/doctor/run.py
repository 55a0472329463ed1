"""The doctor's orchestration: one async core (:func:`adoctor`), a sync bridge (:func:`doctor`).

It reads the slot inventory from the control plane, runs the probes on the
workers through ``client.run`` (which reaches a worker's event loop even while
its rank trains) and hands the facts to :mod:`.report`. The bandwidth sweep
uses one idle worker per host; a host whose every slot is busy is skipped.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

from .. import network
from ..client import ControlClient
from ..errors import ClusterSDKError
from . import bandwidth, probes
from .report import SIZES, Problem, Report, Sweep, analyse, security_problems


async def adoctor(
    client: Any,
    *,
    checkpoint_dir: str | None = None,
    bandwidth: bool = True,
    max_size: int | None = None,
    timeout: float = 60.0,
    port_timeout: float = 2.0,
    **limits: Any,
) -> Report:
    """Check the cluster behind ``client`` (asynchronous, or called through ``client.sync``).

    ``checkpoint_dir``: check free space, writes and sharing there. ``bandwidth``: the
    all-reduce sweep per pair of hosts, 1 KiB up to ``max_size`` bytes (256 MiB).
    ``limits`` go to :func:`.report.analyse` (``skew_limit``, ``min_free``).
    """
    slots = await asyncio.wait_for(ControlClient(client.scheduler).inventory(), timeout)
    workers = sorted({s["worker"] for s in slots})
    tls = _tls_here(client)
    if not workers:
        report = Report([], _here(), {}, {}, [], tls=tls)
        report.problems = security_problems(report) + [
            Problem(
                None,
                "workers",
                ("the cluster has no clustersdk workers: start some (or wait for them) first"),
            )
        ]
        return report
    facts = await _facts(client, workers, timeout)
    busy = {s["worker"] for s in slots if s.get("job")}
    kinds = {s["worker"]: s["kind"] for s in slots}
    by_host: dict[str, list[str]] = {}
    for w in sorted(facts, key=lambda w: (w["worker"] in busy, w["worker"])):
        by_host.setdefault(w["host"], []).append(w["worker"])
    one = {host: names[0] for host, names in by_host.items()}
    token = uuid.uuid4().hex[:10]
    disks = await _disks(client, one, checkpoint_dir, token, timeout) if checkpoint_dir else {}
    ports = await _ports(client, one, facts, token, port_timeout, timeout)
    sweeps: list[Sweep] = []
    skipped: list[str] = []
    if bandwidth and len(one) > 1:
        sizes = [s for s in SIZES if s <= (max_size or SIZES[-1])] or [SIZES[0]]
        idle = {h: w for h, w in one.items() if w not in busy}
        skipped = sorted(set(one) - set(idle))
        reachable = {
            h: sorted(set(p.get("listening", [])) - set(p.get("unreachable", {})))
            for h, p in ports.items()
        }
        sweeps = await _sweeps(client, idle, kinds, sizes, reachable, token, timeout)
    report = Report(facts, _here(), disks, ports, sweeps, tls=tls)
    report.problems = analyse(report, **limits) + [
        Problem(
            host,
            "bandwidth",
            (
                f"host {host}: every slot is busy, so its links were not measured: run the doctor "
                "again when it is idle"
            ),
        )
        for host in skipped
    ]
    return report


def doctor(client: Any, **options: Any) -> Report:
    """:func:`adoctor` for a synchronous ``client`` (what ``cluster.doctor()`` calls)."""
    return client.sync(adoctor, client, **options)


def _tls_here(client: Any) -> dict[str, Any]:
    """This side of TLS: the scheduler's address, the files this client reads and, for a
    cluster this account created, its certificate authority's."""
    import os

    from .. import registry
    from ..security.pki import file_facts

    address = client.scheduler.address
    files = probes.tls_files(getattr(client, "security", None))
    authority = registry.authority(address)
    if authority:
        files += file_facts(
            os.path.join(root, name)
            for root, _, names in os.walk(authority)
            for name in sorted(names)
            if name.endswith(".pem")
        )
        files.append(
            {
                "path": authority,
                "mode": os.stat(authority).st_mode & 0o777,
                "key": True,
                "not_after": None,
                "directory": True,
            }
        )
    return {"address": address, "files": files}


def _here() -> dict[str, Any]:
    """The notebook's own versions (its functions are pickled here)."""
    versions = probes.versions()
    return {k: v for k, v in versions.items() if k not in ("nccl", "cuda_driver")}


async def _run(
    client: Any, fn: Any, *args: Any, workers: list[str], timeout: float, **kwargs: Any
) -> dict[str, Any]:
    return await asyncio.wait_for(client.run(fn, *args, workers=workers, **kwargs), timeout)


async def _facts(client: Any, workers: list[str], timeout: float) -> list[dict[str, Any]]:
    """Each worker's facts, with its clock's offset from ours (from the fastest of 3 calls)."""
    facts = await _run(client, probes.worker_facts, workers=workers, timeout=timeout)
    best: dict[str, tuple[float, float]] = {}
    for _ in range(3):
        t0 = time.time()
        times = await _run(client, time.time, workers=workers, timeout=timeout)
        t1 = time.time()
        for worker, t in times.items():
            error = (t1 - t0) / 2
            if worker not in best or error < best[worker][1]:
                best[worker] = (t - (t0 + t1) / 2, error)
    out = []
    for worker, f in sorted(facts.items()):
        f["clock_offset"], f["clock_error"] = best.get(worker, (None, 0.0))
        out.append(f)
    return out


async def _disks(
    client: Any, one: dict[str, str], path: str, token: str, timeout: float
) -> dict[str, dict[str, Any]]:
    workers = list(one.values())
    wrote = await _run(client, probes.write_marker, path, token, workers=workers, timeout=timeout)
    host_of = {w: h for h, w in one.items()}
    disks = {host_of[w]: d for w, d in wrote.items()}
    writers = [h for h, d in disks.items() if not d.get("error")]
    unseen = await _run(
        client,
        probes.unseen_markers,
        path,
        token,
        writers,
        workers=[one[h] for h in writers],
        timeout=timeout,
    )
    for worker, missing in unseen.items():
        disks[host_of[worker]]["unseen"] = [h for h in missing if h != host_of[worker]]
    for host in writers:
        await _run(
            client,
            probes.remove_marker,
            disks[host]["marker"],
            workers=[one[host]],
            timeout=timeout,
        )
    return disks


async def _ports(
    client: Any,
    one: dict[str, str],
    facts: list[dict[str, Any]],
    token: str,
    port_timeout: float,
    timeout: float,
) -> dict[str, Any]:
    """Every host listens on its rendezvous range; every other host connects to each port."""
    ranges = {f["host"]: f.get("ports") for f in facts}
    out: dict[str, Any] = {}
    try:
        for host, worker in one.items():
            span = network.parse_ports(None if ranges[host] == "any free port" else ranges[host])
            opened = await _run(
                client, probes.listen, token, span, workers=[worker], timeout=timeout
            )
            out[host] = {"range": ranges[host], **opened[worker], "unreachable": {}}
        for source, worker in one.items():
            targets = {h: o["listening"] for h, o in out.items() if h != source}
            if not targets:
                continue
            failed = await _run(
                client,
                probes.connect,
                targets,
                port_timeout,
                workers=[worker],
                timeout=timeout + port_timeout * 4,
            )
            for host, ports in failed[worker].items():
                for port, why in ports.items():
                    out[host]["unreachable"].setdefault(int(port), {})[source] = why
    finally:
        await _run(
            client, probes.close_listeners, token, workers=list(one.values()), timeout=timeout
        )
    return out


async def _sweeps(
    client: Any,
    one: dict[str, str],
    kinds: dict[str, str],
    sizes: list[int],
    reachable: dict[str, list[int]],
    token: str,
    timeout: float,
) -> list[Sweep]:
    """One pair at a time (pairs at once would share NICs and switches). Rank 0's store
    goes on a port the port check found reachable: a blocked one is reported once."""
    sweeps = []
    for a, b in itertools.combinations(sorted(one), 2):
        wa, wb = one[a], one[b]
        backend = "nccl" if kinds.get(wa) == kinds.get(wb) == "cuda" else "gloo"
        sweep = Sweep((a, b), backend)
        key = f"{token}-{a}-{b}"
        try:
            good = [p for p in reachable.get(a, []) if p]  # port 0: "any free port"
            port = (
                await _run(
                    client,
                    bandwidth.open_store,
                    key,
                    timeout,
                    good[0] if good else None,
                    workers=[wa],
                    timeout=timeout,
                )
            )[wa]
            rows = await _run(
                client,
                bandwidth.sweep,
                key,
                (a, port),
                wa,
                sizes,
                backend,
                timeout,
                workers=[wa, wb],
                timeout=timeout * (len(sizes) + 1),
            )
            sweep.rows = [tuple(r) for r in rows[wa]]
            slower = rows[wb]  # each rank timed the same all-reduces: keep the slower view
            sweep.rows = [(s, max(t, u)) for (s, t), (_, u) in zip(sweep.rows, slower)]
        except (asyncio.TimeoutError, OSError, ClusterSDKError, RuntimeError) as e:
            sweep.error = f"{type(e).__name__}: {e}".rstrip(": ")
        sweeps.append(sweep)
    return sweeps
