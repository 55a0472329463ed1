"""The zygote: one warm process per worker from which every rank process is forked.

A rank of a job runs in a process of its own, so that a segfault, an ``os._exit``, a
fatal CUDA error or NCCL's watchdog abort ends that rank and nothing else, and the
next job starts in a clean process. It must start as fast as a thread did: importing
torch takes seconds. So each worker starts, when it starts, one single-threaded
process that imports torch, ``torch._dynamo`` and the rank runtime (and never
initialises CUDA: a process forked after CUDA is up cannot use it), then waits. Each
rank is a ``fork()`` of it: a few milliseconds, with everything imported.

What was measured against the alternatives (``benchmarks/rank_start.py``, on the
2-core CPU machines of this project; the figures are in the architecture page):

- **a fresh interpreter per rank** (``python -c``, as torchrun and
  ``multiprocessing``'s spawn do): pays the imports at every launch (seconds);
- **a spare process per slot, started ahead**: as fast as a fork for one launch, but a
  rank that dies right away (or a job that follows at once) waits for the next
  spare to import torch again, and every slot holds one more interpreter;
- **multiprocessing's forkserver**: the same idea, but its children cannot start
  from a daemonic Dask worker (``daemonic processes are not allowed to have
  children``), and it gives no way to pass the rank's pipes or learn how it died.

The zygote talks with its worker over a ``SOCK_SEQPACKET`` socket pair (one message
per request, the rank's file descriptors passed with it), using the framing of
:mod:`.channel`:

- worker -> zygote: ``fork`` (``id``; ``exec``: argv, env, cwd of a script, or None
  for a function rank; the rank's stdout, stderr, and for a function rank its channel
  and log pipe, as passed descriptors);
- zygote -> worker: ``ready`` (this slot's device and the versions the ranks run),
  ``forked`` (``id``, ``pid`` or ``error``), ``exited`` (``pid``, its wait status).

The zygote reaps its children and says how each ended (a rank process is the
zygote's child, not the worker's). It dies with its worker (``PR_SET_PDEATHSIG``,
and the socket's end), and kills its ranks as it goes; each rank dies with the
zygote in the same way.

Run as ``python -m clustersdk.runtime.zygote FD`` by :class:`Zygote`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import traceback
from typing import Any

from .channel import decode, encode

logger = logging.getLogger(__name__)

MAX_FDS = 8
MAX_MESSAGE = 1 << 20
READY_TIMEOUT = 300.0  # seconds a zygote may take to import torch (a cold NFS home...)
# what the zygote imports before it forks anything: what every rank needs
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",  # the first DDP(...) pays 1-1.5 s for it otherwise
    "torch.distributed.pipelining",
    "clustersdk.runtime.inside",
    "clustersdk.runtime.context",  # 0.25 s: the strategies, checkpoints, data...
    "clustersdk.runtime.strategies.ddp",
    "clustersdk.runtime.strategies.fsdp",
    "clustersdk.runtime.strategies.tensor",
    "clustersdk.runtime.strategies.pipeline",
    "clustersdk.runtime.strategies.expert",
    "clustersdk.runtime.strategies.hybrid",
    "clustersdk.runtime.strategies.threed",
)
_PR_SET_PDEATHSIG = 1


# --- the zygote's own process -----------------------------------------------------------------
def main() -> None:
    """The zygote: import, say ready, then fork ranks and reap them until the worker goes."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    die_with_parent()
    # torch's CUDA check through NVML does not initialise CUDA: the forked ranks still can
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import gc
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    # the hundreds of thousands of objects torch makes at import: out of the collector's
    # reach (each rank's collections then cost milliseconds), and shared with every fork
    gc.collect()
    gc.freeze()
    slot = _probe()
    from .versions import versions

    _send(sock, {"op": "ready", "pid": os.getpid(), "slot": slot, "versions": versions()})
    _serve(sock)


def _serve(sock: socket.socket) -> None:
    import selectors

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up byte is what counts
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "worker")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    children: set[int] = set()
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "child":
                    with contextlib.suppress(OSError):
                        os.read(wake_r, 4096)
                    _reap(sock, children)
                    continue
                try:
                    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
                except OSError:
                    data, fds = b"", []
                if not data:  # the worker is gone: so are its ranks
                    return
                request = decode(data[4:])
                if request.get("op") == "fork":
                    pid = _fork(request, fds, sock, (wake_r, wake_w))
                    if pid:
                        children.add(pid)
                        _send(sock, {"op": "forked", "id": request["id"], "pid": pid})
                else:
                    for fd in fds:
                        os.close(fd)
            _reap(sock, children)  # a SIGCHLD may have come between two selects
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _reap(sock: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send(sock, {"op": "exited", "pid": pid, "status": status})


def _fork(
    request: dict[str, Any], fds: list[int], sock: socket.socket, wake: tuple[int, int]
) -> int:
    """Fork one rank; in the child, set it up and run it (never returns there)."""
    try:
        pid = os.fork()
    except OSError as e:
        for fd in fds:
            os.close(fd)
        _send(sock, {"op": "forked", "id": request["id"], "error": f"fork failed: {e}"})
        return 0
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    code = 1
    try:
        zygote = os.getppid()
        # its own process group: what it starts (data loaders) goes when it is killed
        os.setpgid(0, 0)
        die_with_parent()
        if os.getppid() != zygote:  # the zygote died before the line above
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.close(wake[0])
        os.close(wake[1])
        sock.close()
        stdout, stderr, *rest = fds
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.close(stdout)
        os.close(stderr)
        if request.get("cpus"):  # an oversubscribed host: one core, round robin (cpus.py)
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, request["cpus"])
        spec = request.get("exec")
        if spec is not None:
            _exec(spec)
        from .inside import main as run_rank

        code = run_rank(*rest)
    except BaseException:  # noqa: BLE001 - said on the rank's stderr, where its worker reads
        with contextlib.suppress(Exception):
            os.write(2, traceback.format_exc().encode())
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return 0  # pragma: no cover - never reached


def _exec(spec: dict[str, Any]) -> None:
    """A script rank: its program replaces this process (its stdout and stderr set)."""
    if spec.get("cwd"):
        os.chdir(spec["cwd"])
    try:
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as e:
        os.write(2, f"clustersdk: could not start {spec['argv'][0]!r}: {e}\n".encode())
        os._exit(127)


def _probe() -> dict[str, Any]:
    """This slot's device, seen without initialising CUDA here: a child of the zygote
    asks CUDA for the GPU's UUID (and leaves with its context)."""
    import torch

    if not torch.cuda.is_available():  # NVML-based: no CUDA context made
        return {"kind": "cpu", "index": -1, "uuid": ""}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    index = int(visible) if visible.isdigit() else 0
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))
            os.write(write, uuid.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        uuid = f.read().decode()
    os.waitpid(pid, 0)
    return {"kind": "cuda", "index": index, "uuid": uuid}


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        sock.send(encode(message))


def die_with_parent() -> None:
    """Make the kernel SIGKILL this process when the thread that started it ends (Linux;
    elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# --- the worker's side ------------------------------------------------------------------------
class ZygoteGone(RuntimeError):
    """The zygote died (or never came up): its ranks with it."""


class Zygote:
    """A worker's handle on its zygote (on the worker's event loop).

    >>> zygote = Zygote()                           # doctest: +SKIP
    >>> await zygote.start()                        # doctest: +SKIP
    >>> pid = await zygote.fork([out, err, chan, log])   # doctest: +SKIP
    >>> status = await zygote.exited(pid)           # doctest: +SKIP
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.slot: dict[str, Any] = {}
        self.versions: dict[str, Any] = {}
        self._ids = 0
        self._forks: dict[int, asyncio.Future] = {}
        self._exits: dict[int, asyncio.Future] = {}
        self._ready: asyncio.Future | None = None
        self._reader: asyncio.Task | None = None
        self.gone: str | None = None  # why it is gone, once it is

    async def start(self, env: dict[str, str] | None = None) -> None:
        """Start the zygote and wait until it is warm (its imports done)."""
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        environ = dict(os.environ if env is None else env)
        # the worker's import path (a shipped package, a worker's upload_file...)
        environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            # preexec_fn with threads around: it only calls prctl, resolved before the fork
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "clustersdk.runtime.zygote", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                env=environ,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,  # noqa: PLW1509
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self.gone = None
        self._ready = loop.create_future()
        loop.add_reader(ours.fileno(), self._readable)
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), READY_TIMEOUT)
        except asyncio.TimeoutError:
            self.close()
            raise ZygoteGone(f"the rank zygote did not start within {READY_TIMEOUT:g} s") from None

    async def fork(
        self, fds: list[int], exec: dict[str, Any] | None = None, cpus: list[int] | None = None
    ) -> int:
        """A new rank process with ``fds`` (stdout, stderr, then what it runs with); its
        pid. ``exec``: the argv, env and cwd of a program to run instead; ``cpus``: the
        CPUs it keeps to (None: those of the zygote)."""
        if self.sock is None or self.gone:
            raise ZygoteGone(self.gone or "the rank zygote is not running")
        self._ids += 1
        future = asyncio.get_running_loop().create_future()
        self._forks[self._ids] = future
        request = {"op": "fork", "id": self._ids, "exec": exec, "cpus": cpus}
        _send_fds(self.sock, encode(request), fds)
        return await future

    async def exited(self, pid: int) -> int | None:
        """How rank process ``pid`` ended, as ``Popen.returncode`` says it (negative: the
        signal); None if the zygote died first (the rank died with it)."""
        future = self._exits.get(pid)
        if future is None and self.gone:
            return None
        if future is None:
            future = self._exits[pid] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.shield(future)
        finally:
            if future.done():
                self._exits.pop(pid, None)

    def ended(self, pid: int) -> bool:
        """Whether rank process ``pid`` is known to have ended."""
        future = self._exits.get(pid)
        return bool(self.gone) or (future is not None and future.done())

    def close(self) -> None:
        """End the zygote (and with it every rank it still has)."""
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(sock.fileno())
            with contextlib.suppress(OSError):
                sock.close()
        self._fail("the rank zygote was closed")
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(5)

    def _readable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        while True:
            try:
                data = sock.recv(MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._died()
                return
            self._heard(decode(data[4:]))

    def _heard(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        loop = asyncio.get_running_loop()
        if op == "ready":
            self.slot, self.versions = message["slot"], message["versions"]
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(True)
        elif op == "forked":
            future = self._forks.pop(message["id"], None)
            if message.get("error"):
                if future is not None and not future.done():
                    future.set_exception(ZygoteGone(message["error"]))
                return
            # its exit may be in the same read as this: its future exists from now on
            self._exits.setdefault(message["pid"], loop.create_future())
            if future is not None and not future.done():
                future.set_result(message["pid"])
        elif op == "exited":
            pid = message["pid"]
            done = self._exits.get(pid)
            if done is None:
                done = self._exits[pid] = loop.create_future()
            if not done.done():
                done.set_result(os.waitstatus_to_exitcode(message["status"]))

    def _died(self) -> None:
        loop = asyncio.get_running_loop()
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(Exception):
                loop.remove_reader(sock.fileno())
            sock.close()
        code = self.proc.poll() if self.proc is not None else None
        self._fail(f"the rank zygote died (exit code {code})")

    def _fail(self, why: str) -> None:
        self.gone = why
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(ZygoteGone(why))
        for future in list(self._forks.values()):
            if not future.done():
                future.set_exception(ZygoteGone(why))
        self._forks.clear()
        for future in list(self._exits.values()):
            if not future.done():
                future.set_result(None)


def _send_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """One request with its descriptors (blocking: the zygote reads at once)."""
    sock.setblocking(True)
    try:
        socket.send_fds(sock, [data], fds)
    finally:
        sock.setblocking(False)


if __name__ == "__main__":
    main()
