"""What the doctor found, and what it means: pure functions, no Dask, torch or I/O.

The probes (:mod:`.probes`, :mod:`.bandwidth`) gather facts; this module turns
them into :class:`Problem` lines that each name a host (or a pair of hosts)
and say what to do, and formats the whole :class:`Report`.

Bus bandwidth follows nccl-tests (``doc/PERFORMANCE.md``): for an all-reduce of
``S`` bytes over ``n`` ranks taking ``t`` seconds, ``algbw = S / t`` and
``busbw = algbw * 2 (n - 1) / n``, the rate each link must carry.

>>> algbw, busbw = bus_bandwidth(1 << 20, 0.001, 2)
>>> round(algbw / 1e9, 3), round(busbw / 1e9, 3)
(1.049, 1.049)
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Iterable
from typing import Any

VERSION_KEYS = (
    "python",
    "torch",
    "nccl",
    "cuda_driver",
    "clustersdk",
    "dask",
    "distributed",
    "cloudpickle",
)
SLOW_LINK = 0.5  # a pair below this fraction of the best pair's bus bandwidth is slow
EXPIRY_WARNING_S = 7 * 86400  # a certificate closer than this to its end is a problem
CLOCK_SKEW_S = 1.0  # more than this apart from the notebook's clock is a problem
MIN_FREE_BYTES = 1 << 30  # at a checkpoint directory
GPU_HOT_C = 85
SIZES = tuple(1 << p for p in range(10, 29, 2))  # 1 KiB, 4 KiB ... 256 MiB


@dataclasses.dataclass
class Problem:
    """One thing to fix: where, which check, and a line that says what to do."""

    host: str | None  # a host, "A-B" for a link, or None for the notebook's side
    check: str  # versions | gpu | ports | disk | clock | bandwidth | workers
    message: str

    def __str__(self) -> str:
        return self.message


@dataclasses.dataclass
class Sweep:
    """One pair's all-reduce timings: ``rows`` of (bytes, seconds per all-reduce)."""

    hosts: tuple[str, str]
    backend: str
    rows: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    error: str | None = None
    ranks: int = 2

    def busbw(self) -> list[tuple[int, float, float]]:
        """(bytes, algbw, busbw) per size, in bytes/s."""
        return [(size, *bus_bandwidth(size, t, self.ranks)) for size, t in self.rows if t > 0]

    def peak(self) -> float:
        return max((b for _, _, b in self.busbw()), default=0.0)


@dataclasses.dataclass
class Report:
    """Everything the doctor saw; ``problems`` is what needs doing (empty: all good)."""

    workers: list[dict[str, Any]]  # facts per worker (see probes.worker_facts)
    here: dict[str, Any]  # the notebook's versions
    disks: dict[str, dict[str, Any]]  # host -> checkpoint directory check
    ports: dict[str, Any]  # host -> {"range", "listening", "busy", "unreachable"}
    sweeps: list[Sweep]
    problems: list[Problem] = dataclasses.field(default_factory=list)
    tls: dict[str, Any] = dataclasses.field(default_factory=dict)  # address, this side's files

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def hosts(self) -> list[str]:
        return sorted({w["host"] for w in self.workers})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (the REST route's answer)."""
        out = dataclasses.asdict(self)
        for sweep, raw in zip(self.sweeps, out["sweeps"]):
            raw["busbw"] = [{"bytes": s, "algbw": a, "busbw": b} for s, a, b in sweep.busbw()]
        out["ok"], out["hosts"] = self.ok, self.hosts
        return out

    def __str__(self) -> str:
        return format_report(self)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(format_report(self))}</pre>"


def bus_bandwidth(size: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) of an all-reduce, in bytes/s (nccl-tests' definitions)."""
    algbw = size / seconds
    return algbw, algbw * 2 * (ranks - 1) / ranks


def analyse(
    report: Report, *, skew_limit: float = CLOCK_SKEW_S, min_free: int = MIN_FREE_BYTES
) -> list[Problem]:
    """Every problem in the report, hosts in order within each check."""
    return [
        *security_problems(report),
        *version_problems(report.workers, report.here),
        *gpu_problems(report.workers),
        *port_problems(report.ports),
        *disk_problems(report.disks, min_free),
        *clock_problems(report.workers, skew_limit),
        *bandwidth_problems(report.sweeps),
    ]


def security_problems(report: Report, now: float | None = None) -> list[Problem]:
    """A cluster on plain tcp://, key files others can read, certificates that expire
    within :data:`EXPIRY_WARNING_S` (here and on every host)."""
    now = time.time() if now is None else now
    problems = []
    address = report.tls.get("address", "")
    if address and not address.startswith("tls://"):
        problems.append(
            Problem(
                None,
                "security",
                (
                    f"the scheduler at {address} listens on plain {address.split('://')[0]}://: "
                    "anyone who reaches its ports (or the workers') can run code on every worker and "
                    "stop or change any job; start the cluster with security='auto' (the default)"
                ),
            )
        )
    places: list[tuple[str | None, list[dict[str, Any]]]] = [(None, report.tls.get("files", []))]
    places += [(w["host"], w.get("tls") or []) for w in report.workers]
    seen: set[tuple[str | None, str]] = set()
    for host, files in places:
        where = f"host {host}: " if host else ""
        for f in files:
            if (host, f["path"]) in seen:
                continue
            seen.add((host, f["path"]))
            if f.get("key") and f["mode"] & 0o077:
                fix = "chmod 700" if f.get("directory") else "chmod 600"
                problems.append(
                    Problem(
                        host,
                        "security",
                        (
                            f"{where}{f['path']} holds a private key and can be read by other users "
                            f"(mode {f['mode']:o}): whoever reads it acts as its holder; {fix} "
                            f"{f['path']}"
                        ),
                    )
                )
            left = None if f.get("not_after") is None else f["not_after"] - now
            if left is not None and left < EXPIRY_WARNING_S:
                when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(f["not_after"]))
                state = "has expired" if left <= 0 else f"expires in {left / 86400:.1f} days"
                problems.append(
                    Problem(
                        host,
                        "security",
                        (
                            f"{where}a certificate in {f['path']} {state} ({when}): connections with "
                            "it will be refused; start a new cluster (its certificates last "
                            "clustersdk.security.days), or have its admin issue new credentials"
                        ),
                    )
                )
    return problems


def _majority(values: Iterable[Any], prefer: Any) -> Any:
    counts = collections.Counter(values)
    best = max(counts.values())
    tied = [v for v, c in counts.items() if c == best]
    return prefer if prefer in tied else tied[0]


def version_problems(workers: list[dict[str, Any]], here: dict[str, Any]) -> list[Problem]:
    """Hosts (or this notebook) whose versions differ from what most have."""
    problems = []
    for key in VERSION_KEYS:
        by_host = {w["host"]: w["versions"].get(key) for w in workers}
        seen = [v for v in by_host.values() if v is not None]
        if not seen:
            continue
        usual = _majority(seen, here.get(key))
        for host, value in sorted(by_host.items()):
            if value is not None and value != usual:
                problems.append(
                    Problem(
                        host,
                        "versions",
                        (
                            f"host {host}: {key} {value}, but {usual} on the other hosts: install "
                            f"{_install(key, usual)} there (or the other way round everywhere)"
                        ),
                    )
                )
        mine = here.get(key)
        if mine is not None and mine != usual and key not in ("nccl", "cuda_driver"):
            problems.append(
                Problem(
                    None,
                    "versions",
                    (
                        f"this notebook: {key} {mine}, but the workers have {usual}: functions are "
                        f"pickled here and run there; install {_install(key, usual)} here"
                    ),
                )
            )
    return problems


def _install(key: str, version: str) -> str:
    if key == "python":
        return f"Python {version}"
    if key == "cuda_driver":
        return f"NVIDIA driver {version}"
    if key == "nccl":
        return f"the torch build with NCCL {version}"
    return f"{key}=={version}"


def gpu_problems(workers: list[dict[str, Any]]) -> list[Problem]:
    problems = []
    for w in workers:
        for gpu in w.get("gpus") or []:
            where = f"host {w['host']}: GPU {gpu.get('index')} ({gpu.get('name', '?')})"
            if gpu.get("error"):
                problems.append(
                    Problem(
                        w["host"],
                        "gpu",
                        f"{where} can't be read: {gpu['error']}: check `nvidia-smi` there",
                    )
                )
            if (gpu.get("ecc_uncorrected") or 0) > 0:
                problems.append(
                    Problem(
                        w["host"],
                        "gpu",
                        (
                            f"{where} has {gpu['ecc_uncorrected']} uncorrected ECC errors: drain it and "
                            "check `nvidia-smi -q -d ECC`; a reset or a replacement may be needed"
                        ),
                    )
                )
            if (gpu.get("temperature") or 0) >= GPU_HOT_C:
                problems.append(
                    Problem(
                        w["host"],
                        "gpu",
                        (f"{where} is at {gpu['temperature']} C while idle: check its cooling"),
                    )
                )
        if w.get("slot_kind") == "cuda" and w.get("gpus") == []:
            problems.append(
                Problem(
                    w["host"],
                    "gpu",
                    (
                        f"host {w['host']}: worker {w['worker']} has a CUDA slot but NVML sees no GPU: "
                        "check the driver (`nvidia-smi`)"
                    ),
                )
            )
    return problems


def _ranges(ports: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    runs: list[list[int]] = []
    for port in sorted(ports):
        if runs and runs[-1][1] == port - 1:
            runs[-1][1] = port
        else:
            runs.append([port, port])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def port_problems(ports: dict[str, Any]) -> list[Problem]:
    """Per listening host: ports another host could not reach, and ports already taken."""
    problems = []
    for host, info in sorted(ports.items()):
        span = info.get("range") or "any free port"
        blocked: dict[int, dict[str, str]] = info.get("unreachable") or {}
        by_sources: dict[tuple[str, ...], list[int]] = collections.defaultdict(list)
        for port, sources in blocked.items():
            by_sources[tuple(sorted(sources))].append(int(port))
        for sources, which in sorted(by_sources.items()):
            why = sorted({blocked[which[0]][s] for s in sources})
            s = "s" if len(which) > 1 else ""
            problems.append(
                Problem(
                    host,
                    "ports",
                    (
                        f"host {host}: port{s} {_ranges(which)} of the rendezvous range ({span}) "
                        f"unreachable from {', '.join(sources)} ({'; '.join(why)}): a firewall there or "
                        f"between them drops it; open {span}/tcp between the hosts, or set "
                        "rendezvous_ports= to a range that is open"
                    ),
                )
            )
        busy = info.get("busy") or []
        if busy and len(busy) == info.get("size"):
            problems.append(
                Problem(
                    host,
                    "ports",
                    (
                        f"host {host}: every port of the rendezvous range ({span}) is in use there: "
                        "no job can start its store; widen the range"
                    ),
                )
            )
    return problems


def disk_problems(disks: dict[str, dict[str, Any]], min_free: int) -> list[Problem]:
    problems = []
    for host, disk in sorted(disks.items()):
        path = disk.get("path")
        if disk.get("error"):
            problems.append(
                Problem(
                    host,
                    "disk",
                    (
                        f"host {host}: cannot write to {path} ({disk['error']}): fix its permissions, or "
                        "pick a checkpoint_dir= every host can write"
                    ),
                )
            )
            continue
        if disk.get("free", min_free) < min_free:
            problems.append(
                Problem(
                    host,
                    "disk",
                    (
                        f"host {host}: only {disk['free'] / 2**20:.0f} MiB free at {path}: free space, "
                        "or checkpoint somewhere larger"
                    ),
                )
            )
        missing = disk.get("unseen") or []
        if missing:
            problems.append(
                Problem(
                    host,
                    "disk",
                    (
                        f"host {host}: does not see the files {', '.join(missing)} wrote in {path}: "
                        "checkpoint_dir must be one shared filesystem (NFS, Lustre...) for a job to "
                        "resume on other hosts"
                    ),
                )
            )
    return problems


def clock_problems(workers: list[dict[str, Any]], limit: float) -> list[Problem]:
    problems, seen = [], set()
    for w in sorted(workers, key=lambda w: w["host"]):
        offset = w.get("clock_offset")
        if offset is None or w["host"] in seen or abs(offset) - w.get("clock_error", 0) <= limit:
            continue
        seen.add(w["host"])
        way = "ahead of" if offset > 0 else "behind"
        problems.append(
            Problem(
                w["host"],
                "clock",
                (
                    f"host {w['host']}: its clock is {abs(offset):.1f} s {way} this machine's: run "
                    "chrony (or ntpd) there; timestamps of metrics and logs are off by that much"
                ),
            )
        )
    return problems


def bandwidth_problems(sweeps: list[Sweep]) -> list[Problem]:
    """Failed pairs, and pairs much slower than the best: a host if all its pairs are."""
    problems = [
        Problem(
            "-".join(s.hosts),
            "bandwidth",
            (
                f"hosts {s.hosts[0]} and {s.hosts[1]}: an all-reduce between them failed ({s.error}): "
                "their process group can't connect; check the firewall for their ephemeral ports "
                "and GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME"
            ),
        )
        for s in sweeps
        if s.error
    ]
    measured = [s for s in sweeps if not s.error and s.rows]
    if len(measured) < 2:
        return problems
    best = max(s.peak() for s in measured)
    slow = [s for s in measured if s.peak() < SLOW_LINK * best]
    hosts = {h for s in measured for h in s.hosts}
    named: set[str] = set()
    for host in sorted(hosts):
        mine = [s for s in measured if host in s.hosts]
        if len(mine) >= 2 and all(s in slow for s in mine) and len(mine) < len(measured):
            ratio = max(s.peak() for s in mine) / best
            named.add(host)
            problems.append(
                Problem(
                    host,
                    "bandwidth",
                    (
                        f"host {host}: its links reach {ratio:.2f}x the best pair's bus bandwidth "
                        f"({_rate(max(s.peak() for s in mine))} vs {_rate(best)}): check its NIC, cable "
                        "and switch port (ethtool), and that NCCL uses the fast interface "
                        "(NCCL_SOCKET_IFNAME, NCCL_IB_HCA)"
                    ),
                )
            )
    for s in slow:
        if not named.intersection(s.hosts):
            problems.append(
                Problem(
                    "-".join(s.hosts),
                    "bandwidth",
                    (
                        f"hosts {s.hosts[0]} and {s.hosts[1]}: their link reaches {s.peak() / best:.2f}x "
                        f"the best pair's bus bandwidth ({_rate(s.peak())} vs {_rate(best)}): check the "
                        "route and switches between them"
                    ),
                )
            )
    return problems


def _rate(bytes_per_s: float) -> str:
    return (
        f"{bytes_per_s / 1e9:.2f} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:.0f} MB/s"
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def format_report(report: Report) -> str:
    """The report as text: per host, then the bandwidth table, then the problems."""
    lines = [f"clustersdk doctor: {len(report.hosts)} host(s), {len(report.workers)} worker(s)"]
    versions = report.workers[0]["versions"] if report.workers else {}
    lines.append("  " + ", ".join(f"{k} {versions[k]}" for k in VERSION_KEYS if versions.get(k)))
    for host in report.hosts:
        mine = [w for w in report.workers if w["host"] == host]
        gpus = sum(len(w.get("gpus") or []) for w in mine[:1])
        parts = [f"{len(mine)} worker(s)", f"{gpus} GPU(s)" if gpus else "no GPU"]
        if mine and mine[0].get("clock_offset") is not None:
            parts.append(f"clock {mine[0]['clock_offset']:+.3f} s")
        disk = report.disks.get(host)
        if disk and not disk.get("error"):
            parts.append(
                f"{disk['free'] / 2**30:.1f} GiB free at {disk['path']}"
                if "free" in disk
                else f"writes to {disk['path']}"
            )
        ports = report.ports.get(host)
        if ports:
            parts.append(
                f"ports {ports.get('range')}: {len(ports.get('unreachable') or {})} unreachable"
            )
        lines.append(f"  {host}: " + ", ".join(parts))
    measured = [s for s in report.sweeps if s.rows]
    if measured:
        lines.append(f"  all-reduce bus bandwidth ({measured[0].backend}, 2 ranks per pair, GB/s):")
        lines.append(
            "    " + f"{'size':>9}" + "".join(f"{'-'.join(s.hosts):>30}" for s in measured)
        )
        for i, (size, _) in enumerate(measured[0].rows):
            cells = [
                s.busbw()[i][2] / 1e9 if i < len(s.busbw()) else float("nan") for s in measured
            ]
            lines.append("    " + f"{_size(size):>9}" + "".join(f"{c:>30.3f}" for c in cells))
    if report.problems:
        lines.append(f"problems ({len(report.problems)}):")
        lines.extend(f"  {p.message}" for p in report.problems)
    else:
        lines.append("no problems found")
    return "\n".join(lines)
