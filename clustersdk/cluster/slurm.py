"""``Cluster.slurm``: workers as Slurm batch jobs, through dask-jobqueue's ``SLURMCluster``.

``pip install 'clustersdk[slurm]'``. Each worker is one Slurm job asking for
``--gres=gpu:N`` (one GPU by default where ``gpus_per_worker=1``; Slurm pins it
with ``CUDA_VISIBLE_DEVICES``) or one CPU slot. The scheduler runs in this
process. Workers come as launches need them: a launch of ``world_size`` ranks
scales the allocation to what the active jobs need (at most ``maximum``), and
after ``idle_timeout`` seconds with no active job the allocation shrinks back
to ``workers``. While Slurm has not placed a worker job, the clustersdk jobs
waiting for it are QUEUED with Slurm's reason (``squeue``'s ``%r``).
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

from .. import network
from ..client import ControlClient
from ..errors import SpecError, StartError
from ..options import check_env
from ..protocol import ENV_SLURM_NOTICE
from ..status import JobStatus

if TYPE_CHECKING:
    from .base import Cluster

logger = logging.getLogger(__name__)


def slurm(
    cls: type[Cluster],
    *,
    workers: int = 0,
    maximum: int = 64,
    gpus_per_worker: int = 0,
    cpus_per_worker: int = 1,
    memory: str = "4GiB",
    partition: str | None = None,
    account: str | None = None,
    walltime: str | None = "01:00:00",
    notice: int | None = 120,
    python: str | None = None,
    env: dict[str, str] | None = None,
    job_extra_directives: list[str] | tuple[str, ...] = (),
    idle_timeout: float = 300.0,
    interface: str | None = None,
    rendezvous_ports: Any = None,
    poll: float = 2.0,
    log_directory: str | None = None,
    state_dir: str | None = None,
    security: Any = "auto",
    **jobqueue_options: Any,
) -> Cluster:
    """Start a scheduler here and workers as Slurm jobs, one per GPU (or CPU slot).

    ``workers`` start now and stay; up to ``maximum`` more come as launches ask for
    ranks and go after ``idle_timeout`` idle seconds. Each worker job asks for
    ``gpus_per_worker`` GPUs (``--gres=gpu:N``; 0: a CPU slot), ``cpus_per_worker``
    CPUs and ``memory``, in ``partition`` under ``account`` for ``walltime``.
    Slurm warns a worker ``notice`` seconds before its walltime ends (``sbatch
    --signal=B:USR1@notice``; None: no warning): its job checkpoints at its next step
    boundary and moves to another worker, which a new worker job brings if need be, and
    the warned worker leaves (at the walltime itself Slurm's SIGTERM does the same, with
    ``KillWait`` seconds to go). ``python`` runs the workers (default: this one's path;
    it must see clustersdk),
    ``env`` is exported in their job scripts. Other keywords go to dask-jobqueue's
    ``SLURMCluster``. The job script is checked with ``sbatch --test-only`` first, so
    a partition or GRES Slurm does not have fails here, with sbatch's own words.

    ``security="auto"`` (the default): mutual TLS with the cluster's own certificate
    authority, made here under the state directory (which the worker jobs must see,
    as ``checkpoint_dir``); the worker jobs read the CA certificate and their key from a
    private directory of it (0700, files 0600), named in their job script. A
    ``distributed.Security`` of your own PKI, or ``False`` (plain tcp://), as elsewhere.

    >>> cluster = Cluster.slurm(gpus_per_worker=1, partition="gpu", maximum=16)  # doctest: +SKIP
    >>> cluster.launch(train, world_size=8)      # 8 worker jobs are submitted     # doctest: +SKIP
    """
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as e:
        raise ImportError(
            f"Cluster.slurm needs dask-jobqueue ({e}): pip install 'clustersdk[slurm]'"
        ) from e
    for name, value, low in (
        ("workers", workers, 0),
        ("maximum", maximum, 1),
        ("gpus_per_worker", gpus_per_worker, 0),
        ("cpus_per_worker", cpus_per_worker, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpecError(f"{name} must be an int of at least {low}, got {value!r}")
    if workers > maximum:
        raise SpecError(f"workers={workers} is more than maximum={maximum}")
    prologue = [f"export {k}={shlex.quote(v)}" for k, v in (check_env(env) or {}).items()]
    ports = network.parse_ports(rendezvous_ports)
    if ports:
        prologue.append(f"export DASK_CLUSTERSDK__RENDEZVOUS_PORTS={network.format_ports(ports)}")
    directives = [f"--gres=gpu:{gpus_per_worker}"] * bool(gpus_per_worker) + list(
        job_extra_directives
    )
    if notice is not None:
        if isinstance(notice, bool) or not isinstance(notice, int) or notice < 1:
            raise SpecError(
                f"notice must be seconds (an int of at least 1) or None, got {notice!r}"
            )
        # B: the batch shell alone, which the worker becomes (exec): steps are not signalled
        directives.append(f"--signal=B:USR1@{notice}")
        prologue.append(f"export {ENV_SLURM_NOTICE}={notice}")
    import dask.config

    from .. import config
    from ..security.tls import cluster_security
    from .local import http_routes

    prepared = cluster_security(security, state_dir=config.state_dir(state_dir), kind="slurm")
    try:
        tls = (
            {"security": _jobqueue_security(prepared), "protocol": "tls://"}
            if prepared.enabled
            else {}
        )
        with dask.config.set(http_routes(prepared.enabled)):
            jobqueue = SLURMCluster(
                queue=partition,
                account=account,
                walltime=walltime,
                cores=1,
                processes=1,
                job_cpu=cpus_per_worker,
                memory=memory,
                # exec: the worker is the job's batch shell, which Slurm's warning reaches
                python=f"exec {shlex.quote(python or sys.executable)}",
                job_extra_directives=directives,
                job_script_prologue=prologue,
                job_name="clustersdk",
                nanny=False,  # one worker per Slurm job: if it dies, Slurm's job is over anyway
                interface=interface,
                log_directory=log_directory,
                silence_logs=logging.WARNING,
                scheduler_options={"dashboard_address": ":0"},
                **tls,
                **jobqueue_options,
            )
    except BaseException:
        prepared.close()
        raise
    nodes = SlurmNodes(
        jobqueue, minimum=workers, maximum=maximum, idle_timeout=idle_timeout, poll=poll
    )
    try:
        nodes.check_script()
        from distributed import Client

        client = Client(jobqueue)
        cluster = cls(
            client,
            kind="slurm",
            dask_cluster=nodes,
            state_dir=state_dir,
            scaler=nodes,
            security=prepared,
        )
        nodes.start(client)
        return cluster
    except BaseException:
        nodes.close()
        prepared.close()
        raise


def _jobqueue_security(prepared: Any) -> Any:
    """One ``Security`` with every role, as dask-jobqueue takes it: the scheduler's and the
    creator's files from the authority, the workers' from the private directory their
    job scripts name (which holds nothing else: no CA key, no one's credentials)."""
    from ..security.tls import ClusterSecurity

    authority = prepared.authority
    if authority is None:
        return prepared.client
    workers = authority.worker_directory()
    return ClusterSecurity(
        tls_ca_file=authority.ca_file,
        tls_crl_file=authority.crl_file,
        tls_scheduler_cert=authority.scheduler_file,
        tls_scheduler_key=authority.scheduler_file,
        tls_worker_cert=os.path.join(workers, "worker.pem"),
        tls_worker_key=os.path.join(workers, "worker.pem"),
        tls_client_cert=prepared.credentials,
        tls_client_key=prepared.credentials,
    )


# the states of a worker job that still is, or will be, a worker
_ALIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "RESIZING"})


class SlurmNodes:
    """The worker jobs of a ``Cluster.slurm`` (its ``dask_cluster``): grows them for
    launches, shrinks them when idle, tells the control plane why jobs wait."""

    def __init__(
        self, jobqueue: Any, *, minimum: int, maximum: int, idle_timeout: float, poll: float
    ):
        self.jobqueue, self.minimum, self.maximum = jobqueue, minimum, maximum
        self.idle_timeout, self.poll = idle_timeout, poll
        self.client: Any = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._note: str | None = None
        self._idle_since: float | None = None
        self._thread: threading.Thread | None = None

    # set-up ------------------------------------------------------------------------------
    def check_script(self) -> None:
        """``sbatch --test-only``: Slurm says now whether it could ever run a worker job."""
        script = self.jobqueue.job_script()
        with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
            f.write(script)
            f.flush()
            try:
                proc = subprocess.run(
                    ["sbatch", "--test-only", f.name], capture_output=True, text=True, timeout=60
                )
            except FileNotFoundError:
                raise StartError(
                    "sbatch is not on PATH: run this where Slurm's commands are "
                    "(a login node), or set SLURM_CONF"
                ) from None
        if proc.returncode != 0:
            raise StartError(
                f"Slurm refuses the worker job: {proc.stderr.strip()}\n(the job script:\n{script})"
            )

    def start(self, client: Any) -> None:
        self.client = client
        self._tell(note="")
        if self.minimum:
            self._scale(self.minimum)
        self._thread = threading.Thread(target=self._watch, daemon=True, name="clustersdk-slurm")
        self._thread.start()

    # scaling -----------------------------------------------------------------------------
    @property
    def target(self) -> int:
        return len(self.jobqueue.worker_spec)

    def want(self, world_size: int) -> None:
        """Before a launch of ``world_size`` ranks: enough worker jobs for every active job."""
        with self._lock:
            self._idle_since = None
            self._scale(self._demand() + world_size)

    def _demand(self) -> int:
        """Ranks the active jobs hold or wait for (a SUSPENDED job holds none)."""
        records = self.client.sync(ControlClient(self.client.scheduler).jobs)
        return sum(
            r["spec"]["world_size"]
            for r in records
            if not JobStatus[r["status"]].terminal and r["status"] != "SUSPENDED"
        )

    def _scale(self, n: int) -> None:
        n = max(self.minimum, min(self.maximum, n))
        if n == self.target:
            return
        self.jobqueue.scale(n)
        try:  # submit now: sbatch's refusal is the caller's error, not a log line
            self.jobqueue.sync(self.jobqueue._correct_state)
        except Exception as e:
            raise StartError(f"Slurm refused a worker job: {e}") from e

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                with self._lock:
                    self._tick()
            except Exception:  # the next tick tries again; closing ends the loop
                if not self._stop.is_set() and self.client.status == "running":
                    logger.warning("clustersdk: the Slurm watcher failed", exc_info=True)

    def _tick(self) -> None:
        self._forget_ended()
        demand = self._demand()
        if demand > self.target:  # e.g. a suspended job resumed
            self._scale(demand)
        if demand == 0 and self.target > self.minimum:
            now = time.monotonic()
            self._idle_since = self._idle_since or now
            if now - self._idle_since >= self.idle_timeout:
                logger.info(
                    "clustersdk: idle for %.0f s: releasing %d Slurm worker job(s)",
                    self.idle_timeout,
                    self.target - self.minimum,
                )
                self._scale(self.minimum)
                self._idle_since = None
        elif demand:
            self._idle_since = None
        self._tell(note=self._pending_note())

    def job_ids(self) -> list[str]:
        return [
            str(job.job_id)
            for job in self.jobqueue.workers.values()
            if getattr(job, "job_id", None)
        ]

    def pending(self) -> dict[str, str]:
        """Slurm's reason for each worker job it has not started (``squeue`` ``%r``)."""
        known = self._squeue()
        return {job: reason for job, (state, reason) in (known or {}).items() if state == "PENDING"}

    def _squeue(self) -> dict[str, tuple[str, str]] | None:
        """Each worker job Slurm still lists: its state and reason (None: squeue failed)."""
        ids = self.job_ids()
        if not ids:
            return {}
        proc = subprocess.run(
            ["squeue", "-h", "-o", "%i|%T|%r", "-j", ",".join(ids)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr:  # every one ended
            return None
        out = {}
        for line in proc.stdout.splitlines():
            job, state, reason = (line.split("|", 2) + ["", ""])[:3]
            out[job] = (state, reason)
        return out

    def _forget_ended(self) -> None:
        """Worker jobs that ended by themselves (a walltime, a worker warned of it that
        left, a node lost) are forgotten, so that the next scaling asks for new ones (out
        of ``workers`` too: dask-jobqueue may give a new job the same name, which it would
        then take for the old one, already there)."""
        known = self._squeue()
        if known is None:
            return
        for name, job in list(self.jobqueue.workers.items()):
            job_id = str(getattr(job, "job_id", None) or "")
            state = known.get(job_id, ("", ""))[0]
            if job_id and state not in _ALIVE and not state.startswith("REQUEUE"):
                logger.info("clustersdk: Slurm worker job %s ended (%s)", job_id, state or "gone")
                self.jobqueue.worker_spec.pop(name, None)
                self.jobqueue.workers.pop(name, None)

    def _pending_note(self) -> str:
        pending = self.pending()
        if not pending:
            return ""
        jobs = ", ".join(f"{job} ({reason})" for job, reason in sorted(pending.items()))
        return f"Slurm has not started worker job(s) {jobs}"

    def _tell(self, note: str) -> None:
        """The most slots this cluster can grow to, and what queued jobs wait for."""
        if note != self._note:
            self.client.sync(
                ControlClient(self.client.scheduler).set_capacity, self.maximum, note=note
            )
            self._note = note

    # the rest ----------------------------------------------------------------------------
    def job_script(self) -> str:
        return self.jobqueue.job_script()

    def close(self, timeout: float = 30.0) -> None:
        """Stop watching, cancel every worker job (``scancel``) and wait until Slurm has
        ended them (``squeue`` no longer lists them, not even COMPLETING)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll + 30)
        ids = self.job_ids()
        self.jobqueue.close()
        deadline = time.monotonic() + timeout
        while ids and time.monotonic() < deadline:
            proc = subprocess.run(
                ["squeue", "-h", "-o", "%i", "-j", ",".join(ids)],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if not proc.stdout.split():
                return
            time.sleep(0.2)
        if ids and time.monotonic() >= deadline:
            logger.warning(
                "clustersdk: Slurm still lists worker job(s) %s %.0f s after scancel",
                ",".join(ids),
                timeout,
            )

    def __repr__(self) -> str:
        return f"<SlurmNodes {self.target} worker job(s) of at most {self.maximum}>"
