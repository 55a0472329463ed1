"""Script ranks: one rank of a ``launch_script`` job, a child process of its slot's worker.

A function job's rank is a thread of the worker (:class:`~.agent.RankThread`); a script
job's rank is :class:`ScriptRank`, a thread that starts ``python -u script *args`` (or
``-m module``, or a console command) the way torchrun starts a worker, and reports to
the control plane what a rank thread reports, so that the control plane's rules
hardly know the difference:

- **started**: the process is running (``RankEvent.STARTED``);
- **logs**: every line the process writes to stdout or stderr is a log line of the
  rank, shipped with its metrics at the job's ``metrics_interval``;
- **rows and steps**: what the script sends through :mod:`clustersdk.script` (its
  ``log(step=..., **scalars)``, its step boundaries, a pause, a saved checkpoint)
  arrives over a Unix socket the rank gives the child (``CLUSTERSDK_CONTROL``);
- **exit**: the exit code or signal. A non-zero exit is the rank's failure
  (``RankEvent.FAILED``): its error record names the code or signal, the error the
  script wrote to ``TORCHELASTIC_ERROR_FILE`` (torch's ``@record``) and the last lines
  of its stderr.

The environment is torchrun's (:func:`torchrun_environ`). ``MASTER_ADDR:MASTER_PORT`` is
the rendezvous store rank 0's worker holds for the job, as torchrun's agent holds one
(``TORCHELASTIC_USE_AGENT_STORE=True``: the processes connect to it as clients).

Stop, suspend and preemption reach the process as SIGTERM (after the control words
went down the socket, for a script that opted into step boundaries), then SIGKILL to
its whole process group once ``grace`` seconds have passed, as Slurm and Kubernetes
do. ``job.stacks()`` reads the process's Python stack from outside with ``py-spy``
(``pip install 'clustersdk[scripts]'``), so a frozen process shows too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import json
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import cpus
from ..protocol import ExitStatus, RankEvent, WireSpec, Word, no_words
from . import capture, telemetry
from .control_words import Control

if TYPE_CHECKING:
    from .agent import Agent

logger = logging.getLogger(__name__)

STDERR_TAIL = 20  # lines of stderr kept for a failure's record
LINE_LIMIT = 64 * 1024  # a longer "line" (a progress bar without newlines) is cut
PY_SPY_TIMEOUT = 2.5  # seconds py-spy has to read a rank's stack
HELPERS_SWEEP_S = 1.0  # a bound script's new collective helpers wait at most this long
ENV_CONTROL = "CLUSTERSDK_CONTROL"  # the Unix socket of clustersdk.script

# what a stopped or running process is, by the state letter of /proc/PID/stat
PROCESS_STATES = {
    "T": "stopped (SIGSTOP)",
    "t": "stopped by a tracer",
    "D": "in uninterruptible I/O",
    "S": "sleeping",
    "R": "running",
    "Z": "a zombie",
}


def script_payload(
    archive: bytes | None,
    digest: str | None,
    script: str | None,
    modules: Sequence[str] = (),
    chdir: bool = False,
) -> bytes:
    """The payload of a script job: the shipped code (a zip archive and its hash, or
    None), the script's path inside it, the shipped modules and whether the archive
    becomes the ranks' working directory. Plain data: nothing to unpickle but bytes."""
    return pickle.dumps(
        {
            "archive": archive,
            "digest": digest,
            "script": script,
            "modules": list(modules),
            "chdir": chdir,
        }
    )


def torchrun_environ(
    rank: int,
    hosts: Sequence[str],
    master_addr: str,
    master_port: int,
    spec: WireSpec,
    cuda: bool,
    error_file: str,
    inherited: dict[str, str],
) -> dict[str, str]:
    """The variables torchrun (``torch.distributed.run``, its ``LocalElasticAgent``) gives
    a worker process, for rank ``rank`` of a gang whose ranks run on ``hosts`` (rank
    order: sorted by host, so each host's ranks are contiguous, as torchrun's are).

    A host is torchrun's node (its agent's group): ``GROUP_RANK`` its index,
    ``LOCAL_RANK`` the rank's index on it. A GPU slot's worker pins its GPU
    (``CUDA_VISIBLE_DEVICES``): there ``LOCAL_RANK`` is 0, as under
    ``torchrun --virtual-local-rank``, so that ``cuda:LOCAL_RANK`` is that GPU.
    ``OMP_NUM_THREADS`` is torchrun's: the job's ``env`` value, else 1 when more than one
    rank shares the host. The restart count is the gang start (a restart, a resume).

    >>> spec = WireSpec(id="j1", name="j", world_size=3, max_restarts=1, attempt=2)
    >>> env = torchrun_environ(2, ["a", "a", "b"], "a", 29500, spec, False, "/e", {})
    >>> [env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE",
    ...                   "TORCHELASTIC_RESTART_COUNT")]
    ['2', '0', '1', '1', '2']
    """
    host = hosts[rank]
    order = list(dict.fromkeys(hosts))  # hosts in rank order
    local = [r for r, h in enumerate(hosts) if h == host]
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": "0" if cuda else str(local.index(rank)),
        "WORLD_SIZE": str(len(hosts)),
        "LOCAL_WORLD_SIZE": str(len(local)),
        "GROUP_RANK": str(order.index(host)),
        "GROUP_WORLD_SIZE": str(len(order)),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(len(hosts)),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(spec.attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
        "TORCHELASTIC_RUN_ID": spec.id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": error_file,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": inherited.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    threads = (spec.env or {}).get("OMP_NUM_THREADS")
    if threads is None and len(local) > 1:
        threads = "1"
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    return env


class ScriptRank(threading.Thread):
    """One rank of a script job: the child process, its output, its channel, its exit.

    The agent treats it as it treats a rank thread: it merges control words into
    :attr:`control`, ships what :meth:`drain` gives when its :attr:`pace` says, and asks
    :meth:`stacks` where the rank is.
    """

    ctx = None  # no TrainContext: the rank's code is another process

    def __init__(
        self,
        agent: Agent,
        job: str,
        rank: int,
        spec: WireSpec,
        payload: bytes,
        master_addr: str,
        master_port: int,
        store: Any,
        hosts: Sequence[str] | None = None,
    ):
        super().__init__(name=f"clustersdk-{spec.name}-rank{rank}", daemon=True)
        self.agent, self.job, self.rank, self.spec = agent, job, rank, spec
        self.code: dict[str, Any] = pickle.loads(payload) if payload else {}
        self.store = store  # rank 0's rendezvous store: held while the job's processes run
        self.master = (master_addr, master_port)
        self.hosts = list(hosts) if hosts else [master_addr] * spec.world_size
        self.attempt = spec.attempt
        self.control = Control()
        self.outbox = asyncio.Lock()
        self.last_sent = 0.0
        self.channel: Any = None  # its own connection to the control plane (agent.send's)
        self.sink = capture.Sink(rank)
        sampler = telemetry.Sampler(agent.slot["kind"], agent.slot["index"])
        self.pace = telemetry.Pace(rank, self.interval, sampler)
        self.rows: collections.deque = collections.deque()
        self.stderr_tail: collections.deque = collections.deque(maxlen=STDERR_TAIL)
        self.proc: subprocess.Popen | None = None
        self.step: int | None = None
        self.phase = "setup"  # "step" from the first sign of life; "paused", "checkpoint"
        self.ticks = 0  # lines and steps: what the hang watch counts as progress
        self.asked = ""  # "stop" or "suspend" once a SIGTERM was sent for it
        self.killed = False  # SIGKILLed after the grace
        self.dir = ""
        self._server: socket.socket | None = None
        self._peers: list[socket.socket] = []
        self._peers_lock = threading.Lock()
        self._words = no_words()

    # --- what the agent asks -----------------------------------------------------------
    def interval(self) -> float:
        """Seconds between this rank's messages (the job's metrics_interval, which the
        control plane stretches on a busy cluster)."""
        return self.spec.metrics_interval

    def drain(self, final: bool = False) -> dict[str, Any]:
        rows = [self.rows.popleft() for _ in range(len(self.rows))]
        beacon = {"step": self.step or 0, "phase": self.phase, "ticks": self.ticks}
        return {
            "sent": time.time(),
            "rows": rows,
            "logs": self.sink.drain(final),
            "system": self.pace.samples(final),
            "phases": [],
            "beacon": beacon,
        }

    async def stacks(self, all_threads: bool = False) -> dict[str, Any]:
        """The process's Python stack (every thread's), read by py-spy without its help;
        what ``/proc`` says of the process beside it."""
        proc = self.proc
        head = {"rank": self.rank, "attempt": self.attempt, "step": self.step, "phase": self.phase}
        if proc is None or proc.poll() is not None:
            return {**head, "pid": None, "text": "(the rank's process is not running)"}
        state = process_state(proc.pid)
        text = await py_spy_dump(proc.pid, os.environ.get("PATH", ""))
        return {**head, "pid": proc.pid, "text": f"process {proc.pid}: {state}\n{text}"}

    # --- the rank's life -----------------------------------------------------------------
    def run(self) -> None:
        outcome: dict[str, Any] = {"status": ExitStatus.OK.value}
        try:
            argv, env, cwd = self._prepare()
            if self.agent.pin_ranks:  # as a rank thread's: its process inherits the core
                cpus.pin_rank(self.hosts, self.rank)
            self._spawn(argv, env, cwd)
            self.agent.report(
                self, RankEvent.STARTED, versions=getattr(self.agent, "versions", None)
            )
            self._supervise()
            outcome = self._outcome()
        except BaseException as e:  # noqa: BLE001 - could not start it: the rank failed
            outcome = {"status": ExitStatus.FAILED.value}
            error = {
                "rank": self.rank,
                "type": type(e).__name__,
                "message": str(e),
                "traceback": "",
            }
            self._report_failure(error)
        finally:
            self._cleanup()
            if self.agent.ranks.get(self.job) is self:
                del self.agent.ranks[self.job]
            try:
                self.agent.report(self, RankEvent.EXIT, final=True, **outcome)
            except Exception:  # the worker is closing: the scheduler learns it by itself
                logger.info(
                    "clustersdk: could not report the exit of rank %d", self.rank, exc_info=True
                )

    def _prepare(self) -> tuple[list[str], dict[str, str], str | None]:
        from .process_group import child_environ
        from .shipping import unpack

        spec = self.spec
        self.dir = tempfile.mkdtemp(prefix=f"clustersdk-{spec.name}-r{self.rank}-")
        root = None
        if self.code.get("archive"):
            root = unpack(self.code["archive"], self.code["digest"])
        inherited = child_environ(self.master[0], spec.env)
        cuda = self.agent.slot["kind"] == "cuda"
        env = {
            **inherited,
            **torchrun_environ(
                self.rank,
                self.hosts,
                *self.master,
                spec,
                cuda,
                os.path.join(self.dir, "error.json"),
                inherited,
            ),
        }
        if cuda:  # one GPU per rank: the worker's own
            env["CUDA_VISIBLE_DEVICES"] = os.environ.get(
                "CUDA_VISIBLE_DEVICES", str(max(self.agent.slot["index"], 0))
            ).split(",")[0]
        env["CLUSTERSDK_JOB"] = spec.name
        env[ENV_CONTROL] = self._listen()
        if spec.checkpoint_dir:
            env["CLUSTERSDK_CHECKPOINT_DIR"] = spec.checkpoint_dir
        if spec.resume:
            env["CLUSTERSDK_RESUME"] = spec.resume  # the newest checkpoint the script saved
        if root is not None and self.code.get("modules"):
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        cwd = root if root is not None and self.code.get("chdir") else None
        args = list(spec.args or ())
        if spec.script:
            inside = self.code.get("script")
            path = os.path.join(root, inside) if root is not None and inside else spec.script
            argv = [sys.executable, "-u", path, *args]
        elif spec.module:
            argv = [sys.executable, "-u", "-m", spec.module, *args]
        else:
            assert spec.command
            search = os.pathsep.join((env.get("PATH", ""), os.path.dirname(sys.executable)))
            found = shutil.which(spec.command, path=search)
            if found is None:
                raise FileNotFoundError(
                    f"command {spec.command!r} is not on worker {self.agent.slot['worker']}'s "
                    f"PATH ({search}); install it there, or give its path"
                )
            argv = [found, *args]
        return argv, env, cwd

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: str | None) -> None:
        # preexec_fn with threads around: it only calls prctl, resolved before the fork (no
        # lock, no allocation of Python's), which is what its warning is about
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )  # noqa: PLW1509
        for pipe, stream in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            threading.Thread(
                target=self._read, args=(pipe, stream), daemon=True, name=f"{self.name}-{stream}"
            ).start()

    def _supervise(self) -> None:
        """Until the process ends: pass new control words on, and turn a stop or a suspend
        into SIGTERM, then SIGKILL after the grace."""
        proc = self.proc
        assert proc is not None
        seen = no_words()
        kill_at: float | None = None
        host, swept = self.agent.host_cpus, 0.0
        while proc.poll() is None:
            self.control.wait_beyond(seen, timeout=0.1)
            if host and time.monotonic() - swept >= HELPERS_SWEEP_S:
                # as ctx.loop does for a rank thread: the script's process groups come
                # when it makes them, so their collective helpers are freed as they appear
                swept = time.monotonic()
                cpus.free_helpers(host, proc.pid)
            words = self.control.words()
            if words != seen:
                seen = words
                self._push(words)
                if (words[Word.STOP] or words[Word.SUSPEND]) and not self.asked:
                    self.asked = (
                        "suspend" if words[Word.SUSPEND] and not words[Word.STOP] else "stop"
                    )
                    self._signal(signal.SIGTERM)
                    self._signal(signal.SIGCONT)  # a stopped process must see it too
                    kill_at = time.monotonic() + self.spec.grace
            if kill_at is not None and time.monotonic() >= kill_at and proc.poll() is None:
                self.killed = True
                self._kill_group()
                kill_at = None
        proc.wait()

    def _outcome(self) -> dict[str, Any]:
        proc = self.proc
        assert proc is not None
        code = proc.returncode
        if self.asked:
            if code:
                how = (
                    f"killed after its grace of {self.spec.grace:g} s"
                    if self.killed
                    else _exit_text(code)
                )
                self.sink.write(
                    "log", f"clustersdk: rank {self.rank} left on SIGTERM ({self.asked}): {how}\n"
                )
            status = ExitStatus.SUSPENDED if self.asked == "suspend" else ExitStatus.STOPPED
            return {"status": status.value}
        if code == 0:
            out: dict[str, Any] = {"status": ExitStatus.OK.value}
            if self.rank == 0:
                import cloudpickle

                out["result"] = cloudpickle.dumps(0)  # job.wait(): the exit code
            return out
        self._report_failure(self._error(code))
        return {"status": ExitStatus.FAILED.value}

    def _error(self, code: int) -> dict[str, Any]:
        """The failure's record: the exit code or signal, the error the script wrote to
        TORCHELASTIC_ERROR_FILE (torch's @record), the last lines of its stderr."""
        how = _exit_text(code)
        err: dict[str, Any] = {
            "rank": self.rank,
            "type": "ScriptExit",
            "message": how,
            "traceback": "",
            "exit_code": code if code >= 0 else None,
            "signal": _signal_name(-code) if code < 0 else None,
        }
        recorded = read_error_file(os.path.join(self.dir, "error.json"))
        if recorded is not None:
            err["type"], message, err["traceback"] = recorded
            err["message"] = f"{message} ({how})"
        tail = list(self.stderr_tail)
        if tail:
            err["stderr"] = tail
            err["traceback"] = (
                (err["traceback"] + "\n" if err["traceback"] else "")
                + f"last {len(tail)} line(s) of its stderr:\n"
                + "\n".join(tail)
            )
        return err

    def _report_failure(self, error: dict[str, Any]) -> None:
        try:
            self.agent.report(self, RankEvent.FAILED, final=True, error=error)
        except Exception:
            logger.exception("clustersdk: could not report the failure of rank %d", self.rank)

    def _cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._kill_group()
            with contextlib.suppress(Exception):
                self.proc.wait(5)
        elif self.proc is not None:
            self._kill_group()  # what the script left behind (its own children)
        with self._peers_lock:
            peers, self._peers = self._peers, []
        for peer in peers:
            with contextlib.suppress(OSError):
                peer.close()
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.store = None

    # --- signals -----------------------------------------------------------------------------
    def _signal(self, sig: int) -> None:
        """``sig`` to the rank's process (not its children: a DataLoader's workers must
        live until the script has saved)."""
        with contextlib.suppress(ProcessLookupError, OSError):
            if self.proc is not None:
                os.kill(self.proc.pid, sig)

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            if self.proc is not None:
                os.killpg(self.proc.pid, signal.SIGKILL)

    # --- output ------------------------------------------------------------------------------
    def _read(self, pipe: Any, stream: str) -> None:
        with contextlib.suppress(Exception):
            while True:
                data = pipe.readline(LINE_LIMIT)
                if not data:
                    break
                text = data.decode("utf-8", "replace").rstrip("\n")
                self.sink.write(stream, text + "\n")
                if stream == "stderr":
                    self.stderr_tail.append(text)
                self._alive()
        with contextlib.suppress(Exception):
            pipe.close()

    def _alive(self) -> None:
        self.ticks += 1
        if self.phase == "setup":
            self.phase = "step"

    # --- the channel of clustersdk.script ---------------------------------------------------------
    def _listen(self) -> str:
        path = os.path.join(self.dir, "control.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(8)
        self._server = server
        threading.Thread(target=self._accept, daemon=True, name=f"{self.name}-control").start()
        return path

    def _accept(self) -> None:
        server = self._server
        while server is not None:
            try:
                peer, _ = server.accept()
            except OSError:
                return  # closed: the rank is over
            with self._peers_lock:
                self._peers.append(peer)
                words = list(self._words)
            self._send(peer, {"words": words})
            threading.Thread(
                target=self._serve, args=(peer,), daemon=True, name=f"{self.name}-channel"
            ).start()

    def _push(self, words: list[int]) -> None:
        with self._peers_lock:
            self._words = list(words)
            peers = list(self._peers)
        for peer in peers:
            self._send(peer, {"words": words})

    def _send(self, peer: socket.socket, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            peer.sendall(json.dumps(message).encode() + b"\n")

    def _serve(self, peer: socket.socket) -> None:
        with contextlib.suppress(OSError), peer.makefile("rb") as lines:
            for line in lines:
                try:
                    self._heard(json.loads(line))
                except Exception:  # a bad message must not end the rank's channel
                    logger.warning(
                        "clustersdk: bad message from rank %d's script: %r",
                        self.rank,
                        line[:200],
                        exc_info=True,
                    )

    def _heard(self, msg: dict[str, Any]) -> None:
        """A message of the script (see :mod:`clustersdk.script`)."""
        op = msg.get("op")
        step = msg.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            self.step = step if self.step is None else max(self.step, step)
        self._alive()
        if op == "log":  # at the step it names (else the newest one heard)
            at = step if isinstance(step, int) and not isinstance(step, bool) else self.step
            self.rows.append(
                {
                    "rank": self.rank,
                    "step": at or 0,
                    "time": float(msg.get("time") or time.time()),
                    "scalars": dict(msg.get("scalars") or {}),
                }
            )
        elif op == "controls":
            self.agent.report(self, RankEvent.CONTROLS, accepts=list(msg.get("accepts") or ()))
        elif op == "phase":
            self.phase = str(msg.get("phase") or "step")
        elif op == "paused":
            self.phase = "paused"
            self.agent.report(self, RankEvent.PAUSED, step=int(step or 0))
        elif op == "resumed":
            self.phase = "step"
            self.agent.report(self, RankEvent.RESUMED, step=int(step or 0))
        elif op == "saved":
            self.phase = "step"
            if self.rank == 0:  # as a function job's: rank 0 reports the commit
                self.agent.report(
                    self,
                    RankEvent.CHECKPOINT,
                    seq=int(msg.get("seq") or 0),
                    step=int(step or 0),
                    path=str(msg.get("path") or self.spec.checkpoint_dir or ""),
                )


# --- reading a rank from outside ----------------------------------------------------------------
def read_error_file(path: str) -> tuple[str, str, str] | None:
    """(type, message, traceback) of the error torch's ``@record`` wrote, or None.

    >>> read_error_file("/nonexistent") is None
    True
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        text = str(message.get("message", ""))
        stack = str((message.get("extraInfo") or {}).get("py_callstack", ""))
    else:
        text, stack = str(message or ""), ""
    kind, _, rest = text.partition(": ")
    if not kind.replace(".", "").replace("_", "").isalnum() or not rest:
        return "ScriptError", text, stack
    return kind.rsplit(".", 1)[-1], rest, stack


def process_state(pid: int) -> str:
    """What ``/proc`` says of process ``pid``: its state and where the kernel has it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            code = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip() or "-"
    except (OSError, IndexError):
        return "state unknown"
    return f"{PROCESS_STATES.get(code, code)} (wchan {wchan})"


async def py_spy_dump(pid: int, path: str) -> str:
    """``py-spy dump`` of process ``pid`` (without pausing it), or why there is none."""
    search = os.pathsep.join((path, os.path.dirname(sys.executable)))
    exe = shutil.which("py-spy", path=search)
    if exe is None:
        return (
            "(py-spy is not installed on this worker, so the stack of a script's "
            "process can't be read: pip install 'clustersdk[scripts]')"
        )
    proc = await asyncio.create_subprocess_exec(
        exe,
        "dump",
        "--pid",
        str(pid),
        "--nonblocking",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), PY_SPY_TIMEOUT)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return f"(py-spy did not answer within {PY_SPY_TIMEOUT} s)"
    return out.decode("utf-8", "replace")


def _exit_text(code: int) -> str:
    if code < 0:
        return f"killed by signal {_signal_name(-code)} ({-code})"
    return f"exited with code {code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _die_with_parent() -> Any:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when the thread that
    started it ends (its worker died: no orphan keeps a GPU). Linux only; None elsewhere.
    It runs between fork and exec, so it only calls a function resolved before."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return preexec
