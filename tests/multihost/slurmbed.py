"""A real single-node Slurm for tests: munged, slurmctld and slurmd from Debian's
``slurm-wlm`` packages, with a generated ``slurm.conf``, all under one temporary
directory. The node declares two GPUs whose device files are ``/dev/null``-like
character devices made for the bed, so Slurm schedules ``--gres=gpu:1`` for
real (and sets ``CUDA_VISIBLE_DEVICES``) on a machine without GPUs.

By hand (as root)::

    sudo .venv/bin/python tests/multihost/slurmbed.py     # prints SLURM_CONF; Ctrl-C stops it

:meth:`SlurmBed.down` cancels every job, waits for them, stops the daemons by
pid and kills any job step left over (found by a marker in its environment).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ..helpers import free_port

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
MARKER = "CLUSTERSDK_SLURM_BED"
CPUS, GPUS = 4, 2


def missing() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm bed needs root (slurmd runs jobs as their user); CI runs as root"
    for daemon in DAEMONS:
        if not os.path.exists(daemon):
            return (
                f"{daemon} is not installed (apt-get install slurmctld slurmd slurm-client munge)"
            )
    if shutil.which("sbatch") is None:
        return "sbatch is not installed (apt-get install slurm-client)"
    return None


class SlurmBed:
    """One node (this machine, 127.0.0.1) with CPUS CPUs and GPUS fake GPUs."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="clustersdk-slurm-")
        os.chmod(self.dir, 0o755)  # munged wants its socket's directory searchable by all
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.node = socket.gethostname()
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "SLURM_CONF": self.conf, MARKER: self.dir}

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    def up(self) -> SlurmBed:
        try:
            self._write_config()
            self._start(
                "munged",
                DAEMONS[0],
                "-F",
                f"--key-file={self.path('munge.key')}",
                f"--socket={self.path('munge.socket')}",
                f"--pid-file={self.path('munged.pid')}",
                f"--seed-file={self.path('munge.seed')}",
                f"--log-file={self.path('munged.log')}",
            )
            self._wait(lambda: os.path.exists(self.path("munge.socket")), "munged")
            self._start("slurmctld", DAEMONS[1], "-D", "-f", self.conf)
            self._wait(lambda: self.sh("sinfo", "-h").returncode == 0, "slurmctld")
            self._start("slurmd", DAEMONS[2], "-D", "-f", self.conf, "-N", self.node)
            self._wait(
                lambda: self.sh("sinfo", "-h", "-o", "%T").stdout.strip() == "idle",
                "slurmd (the node idle)",
            )
        except BaseException:
            self.down()
            raise
        return self

    def _write_config(self) -> None:
        for sub in ("state", "spool", "log"):
            os.makedirs(self.path(sub))
        with open(self.path("munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(self.path("munge.key"), 0o600)
        devices = [self.path(f"gpu{i}") for i in range(GPUS)]
        for device in devices:
            os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, as null
        lines = [
            "ClusterName=clustersdk",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.path('munge.socket')}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.path('state')}",
            f"SlurmdSpoolDir={self.path('spool')}",
            f"SlurmctldPidFile={self.path('slurmctld.pid')}",
            f"SlurmdPidFile={self.path('slurmd.pid')}",
            f"SlurmctldLogFile={self.path('log', 'slurmctld.log')}",
            f"SlurmdLogFile={self.path('log', 'slurmd.log')}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",
            "GresTypes=gpu",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "SchedulerParameters=sched_interval=1",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory=16000 "
            f"Gres=gpu:{GPUS} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(self.path("gres.conf"), "w") as f:
            f.write(f"AutoDetect=off\nNodeName={self.node} Name=gpu File={','.join(devices)}\n")

    def _start(self, name: str, *argv: str) -> None:
        log = open(self.path("log", f"{name}.out"), "ab")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=log, env=self.env)

    def _wait(self, ready, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs.values()):
                break
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{what} did not come up:\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for name in os.listdir(self.path("log")):
            with open(self.path("log", name), errors="replace") as f:
                out.append(f"--- {name}\n{f.read()[-3000:]}")
        return "\n".join(out)

    def sh(self, *argv: str) -> subprocess.CompletedProcess:
        """A Slurm command against this bed."""
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=30)

    def jobs(self) -> list[str]:
        """``squeue``: every job Slurm knows, as 'ID STATE REASON'."""
        return self.sh("squeue", "-h", "-o", "%i %T %r").stdout.splitlines()

    def down(self) -> None:
        if "slurmctld" in self.procs:
            self.sh("scancel", "--full", "--user=root")
            deadline = time.monotonic() + 20
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for pid in self._leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def _leftovers(self) -> list[int]:
        """Job steps and scripts of this bed still alive (slurmstepd daemonizes)."""
        mark = f"{MARKER}={self.dir}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if mark in f.read().split(b"\0"):
                            found.append(int(entry))
                except OSError:
                    continue
        return found

    def __enter__(self) -> SlurmBed:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def main() -> int:
    reason = missing()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with SlurmBed() as bed:
        print(
            f"Slurm is up: export SLURM_CONF={bed.conf}\n{bed.sh('sinfo').stdout}Ctrl-C stops it."
        )
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
