"""The supervisor of a standing cluster's processes on one host.

``clustersdk cluster up`` starts one per host (:mod:`.host`), detached (a session of
its own, its output to ``logs/supervisor.log`` of the host's directory), and returns. It starts what the host's plan says
(``host.json``: the scheduler where it runs here, the host's workers, each a Dask nanny
with one worker), each in a process group of its own with its output appended to
``logs/NAME.log``, and keeps them running:

- a process that ends is started again after a short wait (:class:`Restarts`: 0.5 s,
  doubling while it keeps failing fast, at most 10 s); it gets ``CLUSTERSDK_RESTART``
  in its environment (what ended and how), which a scheduler journals as it starts
  and a worker's agent reports with its slot, so the restart shows in ``clustersdk
  cluster status`` and the lab panel;
- one that fails ``max_quick_failures`` times in a row, each within ``quick_s`` of
  its start, is given up on, saying so (its last lines are in its log);
- SIGTERM (``clustersdk cluster down``, systemd's stop) stops every process at once
  (SIGINT: a nanny closes its worker without the SIGTERM notice, as ``down`` suspended
  the jobs first, or was asked ``--now``; then SIGKILL to whatever of theirs is left
  after :data:`GRACE_S`) and ends it.

Every start, exit, restart and give-up is a line of ``events.jsonl``, and
``run/status.json`` says what runs now. The supervisor itself is watched by nothing:
``clustersdk cluster up`` starts a new one where it is gone. Under systemd
(``clustersdk cluster unit``) there is no supervisor: each process is a unit of its
own, which systemd restarts.

Run as ``python -m clustersdk.standing.supervisor HOST_ROOT`` (the host's directory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from ..protocol import ENV_RESTART
from .record import HostPaths, HostPlan, Process, read_json, write_json

GRACE_S = 20.0  # what a stopped process has to end before it (and what it started) is killed
POLL_S = 0.2


class Restarts:
    """When a process that ended starts again, or is given up on (pure).

    >>> policy = Restarts(max_quick_failures=3, quick_s=30)
    >>> [policy.ended(uptime=1.0) for _ in range(3)]
    [0.5, 1.0, None]
    >>> policy = Restarts(max_quick_failures=3, quick_s=30)
    >>> policy.ended(uptime=1.0), policy.ended(uptime=600.0), policy.ended(uptime=1.0)
    (0.5, 0.5, 0.5)
    >>> policy.count
    3
    """

    FIRST_S = 0.5
    MAX_S = 10.0

    def __init__(self, max_quick_failures: int = 5, quick_s: float = 30.0):
        self.max_quick_failures = max_quick_failures
        self.quick_s = quick_s
        self.quick = 0  # failures in a row, each soon after its start
        self.count = 0  # restarts so far

    def ended(self, uptime: float) -> float | None:
        """A run of ``uptime`` seconds ended: the wait before the next start, or None
        (given up: it keeps failing as soon as it starts)."""
        if uptime >= self.quick_s:
            self.quick = 0  # it ran a good while: this is news, not a crash loop
            self.count += 1
            return self.FIRST_S
        self.quick += 1
        if self.quick >= self.max_quick_failures:
            return None
        self.count += 1
        return min(self.MAX_S, self.FIRST_S * 2 ** (self.quick - 1))


@dataclasses.dataclass
class Running:
    """One process of the plan, as the supervisor keeps it."""

    process: Process
    restarts: Restarts
    popen: subprocess.Popen | None = None
    started: float = 0.0
    start_at: float | None = 0.0  # when to start it (again); None: not to be started
    state: str = "starting"  # running, restarting, given up, stopped
    last: str = ""  # how its last run ended


class Supervisor:
    """Runs one host's plan until told to stop."""

    def __init__(self, paths: HostPaths, plan: HostPlan):
        self.paths, self.plan = paths, plan
        self.running = [
            Running(p, Restarts(plan.max_quick_failures, plan.quick_s)) for p in plan.processes
        ]
        self.stopping = False
        os.makedirs(paths.logs, mode=0o700, exist_ok=True)

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._stop)
        write_json(self.paths.pid_file, {"pid": os.getpid(), "started": time.time()})
        self.event("supervisor", "started", f"supervising {len(self.running)} process(es)")
        try:
            while not self.stopping:
                self.tend(time.time())
                time.sleep(POLL_S)
        finally:
            self._stop_all()
            self.event("supervisor", "stopped", "every process stopped")
            with contextlib.suppress(OSError):
                os.remove(self.paths.pid_file)

    def _stop(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def tend(self, now: float) -> None:
        """One look at every process: note those that ended, start those that are due."""
        for entry in self.running:
            self._tend(entry, now)

    def _tend(self, entry: Running, now: float) -> None:
        popen = entry.popen
        if popen is not None:
            code = popen.poll()
            if code is None:
                return
            self._ended(entry, code, now)
        if entry.start_at is not None and now >= entry.start_at and not self.stopping:
            self._start(entry)

    def _start(self, entry: Running) -> None:
        process = entry.process
        env = {**os.environ, **process.env}
        if entry.restarts.count:
            env[ENV_RESTART] = json.dumps(
                {
                    "process": process.name,
                    "restarts": entry.restarts.count,
                    "after": entry.last,
                    "host": os.uname().nodename,
                }
            )
        log = open(self.paths.log(process.name), "ab")  # noqa: SIM115 - the child holds it
        try:
            entry.popen = subprocess.Popen(
                process.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its group: stopped with whatever it started
                cwd=self.paths.root,
            )
        except OSError as e:
            entry.popen = None
            self._ended(entry, None, time.time(), why=f"could not start: {e}")
            return
        finally:
            log.close()
        entry.started, entry.start_at, entry.state = time.time(), None, "running"
        self.event(process.name, "started", f"pid {entry.popen.pid}", pid=entry.popen.pid)

    def _ended(self, entry: Running, code: int | None, now: float, why: str = "") -> None:
        entry.popen = None
        uptime = now - entry.started if entry.started else 0.0
        entry.last = why or f"{_exit_text(code)} after {uptime:.0f} s"
        wait = entry.restarts.ended(uptime)
        name = entry.process.name
        if wait is None:
            entry.start_at, entry.state = None, "given up"
            self.event(
                name,
                "gave-up",
                f"{entry.last}: it failed {entry.restarts.quick} times in a row, each within "
                f"{self.plan.quick_s:.0f} s of its start; not started again (its log: "
                f"{self.paths.log(name)})",
                code=code,
            )
            return
        entry.start_at, entry.state = now + wait, "restarting"
        self.event(
            name,
            "restarting",
            f"{entry.last}; restart {entry.restarts.count} in {wait:g} s",
            code=code,
            restarts=entry.restarts.count,
        )

    def _stop_all(self) -> None:
        """SIGINT to every process (the scheduler last: its workers leave first), then
        SIGKILL to whatever of them and theirs is left after the grace."""
        family = _descendants()
        live = [e for e in self.running if e.popen is not None]
        for entry in sorted(live, key=lambda e: e.process.name == "scheduler"):
            with contextlib.suppress(OSError):
                os.killpg(entry.popen.pid, signal.SIGINT)  # type: ignore[union-attr]
        deadline = time.time() + GRACE_S
        while time.time() < deadline and any(e.popen.poll() is None for e in live):  # type: ignore[union-attr]
            time.sleep(POLL_S)
        for entry in live:
            with contextlib.suppress(OSError):
                os.killpg(entry.popen.pid, signal.SIGKILL)  # type: ignore[union-attr]
            entry.state = "stopped"
            with contextlib.suppress(Exception):
                entry.popen.wait(5)  # type: ignore[union-attr]
        for pid in family | _descendants():  # what they started in groups of their own
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self._write_status()

    # --- what it tells -------------------------------------------------------------------------
    def event(self, process: str, kind: str, message: str, **data: Any) -> None:
        line = {"time": time.time(), "process": process, "event": kind, "message": message, **data}
        with open(self.paths.events, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {process}: {kind}: {message}", flush=True)
        self._write_status()

    def _write_status(self) -> None:
        write_json(
            self.paths.status,
            {
                "supervisor": os.getpid(),
                "time": time.time(),
                "processes": {
                    e.process.name: {
                        "state": e.state,
                        "pid": e.popen.pid if e.popen is not None else None,
                        "since": e.started,
                        "restarts": e.restarts.count,
                        "last": e.last,
                    }
                    for e in self.running
                },
            },
        )


def _descendants() -> set[int]:
    try:
        import psutil
    except ImportError:  # distributed brings it; without it the process groups must do
        return set()
    with contextlib.suppress(psutil.Error):
        return {p.pid for p in psutil.Process().children(recursive=True)}
    return set()


def _exit_text(code: int | None) -> str:
    if code is None:
        return "did not start"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"died of {name}"
    return f"exited with code {code}"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m clustersdk.standing.supervisor HOST_ROOT")
    paths = HostPaths(os.path.abspath(args[0]))
    plan = read_json(paths.plan)
    if plan is None:
        raise SystemExit(f"no plan at {paths.plan}")
    Supervisor(paths, HostPlan.from_dict(plan)).run()


if __name__ == "__main__":
    main()
