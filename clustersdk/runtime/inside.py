"""Inside a function rank's process: the training function on its main thread.

The zygote forks the process (:mod:`.zygote`) with torch and this runtime imported; its
worker's :class:`~.rank.Rank` sends it what to run (``start``: the spec, the pickled
function, rank 0's address, the environment) over its channel (:mod:`.channel`).
:class:`Inside` then does what a rank does: process groups up, a
:class:`~.context.TrainContext`, the user's function called on the main thread (so
``signal.signal`` works, and ``threading.current_thread()`` is the main thread), its
outcome sent back. The process then ends with ``os._exit``: whatever the job left
(threads, open files, CUDA memory, module globals) ends with it, and gloo objects never
reach interpreter finalization (where they abort the process).

One thread besides the rank's own listens on the channel: control words (merged into
the rank's :class:`~.control_words.Control`), lines for a pdb session, requests for
the rank's stack, replies to its reports; and every ``metrics_interval`` it ships the
rows the rank logged (the worker's :class:`~.rank.Rank` sends them on). When the
worker goes (the channel closes), the rank and what it started are killed at once.

The rank's stdout and stderr are pipes its worker reads (also what C code and
``faulthandler`` write there); ``logging`` goes to a third pipe, as the rank's ``log``
stream. A crash (SIGSEGV, SIGABRT...) writes every thread's Python stack to a file
the worker reads (``faulthandler``).
"""

from __future__ import annotations

import faulthandler
import functools
import itertools
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

import cloudpickle

from .. import checkpoint_files, cpus
from ..protocol import NOTICES, ExitStatus, RankEvent, WireSpec, Word
from .anomalies import failure_facts
from .breakpoints import Console
from .channel import TIMEOUT, Channel
from .control_words import Control, JobStopped, JobSuspended
from .environ import ENV_WARM_CUDA

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # a rank with nothing to ship still says where it is this often (hangs)
WARM_UP_AFTER_S = 0.5  # a process forked ahead warms up once it waited this long for a job
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


class ReportRefused(RuntimeError):
    """The worker could not tell the control plane (it says why)."""


def main(channel_fd: int, log_fd: int) -> int:
    """A function rank's life, in the process the zygote forked; its exit code.

    The process may be forked before its job is known (a worker keeps one ready per
    slot): it readies what every job needs, then waits for its ``start``."""
    inside = Inside(Channel(socket.socket(fileno=channel_fd)), log_fd)
    if not inside.wait_for_start():
        return 1  # its worker went away before telling it anything
    return inside.run()


class Inside:
    """One function rank, inside its own process."""

    def __init__(self, channel: Channel, log_fd: int):
        self.channel = channel
        self.log_fd = log_fd
        self.start: dict[str, Any] = {}
        self._started = threading.Event()
        self.job, self.rank = "", -1
        self.spec = WireSpec(id="", name="", world_size=1)
        self.control = Control()  # the words the worker passes on, merged
        self.console = Console()  # the input of a pdb session at ctx.breakpoint()
        self.ctx: Any = None
        self._out = threading.Lock()  # rows are drained and sent together, in order
        self._ids = itertools.count(1)
        self._waiting: dict[int, list[Any]] = {}  # request id -> [Event, reply]
        self._shipped = time.monotonic()  # of the last message with rows
        self._beat = 0.0  # ... and of the last one sent by ship()
        self._fault: Any = None

    # --- the rank's life ---------------------------------------------------------------------
    def wait_for_start(self) -> bool:
        """Ready the process for any job (its output, a first backward pass), then wait
        until its worker says what to run; False if the worker went away first."""
        self._capture()
        _reseed()
        threading.Thread(target=self._listen, name="clustersdk-channel", daemon=True).start()
        # a job that comes at once (one launched right after another) is not kept waiting
        # for the warm-up, nor shares the cores with it
        if not self._started.wait(WARM_UP_AFTER_S):
            _warm_up()
            self._started.wait()
        return bool(self.start)

    def _begin(self, start: dict[str, Any]) -> None:
        """The job's ``start`` message (on the listening thread)."""
        self.job, self.rank = start["job"], start["rank"]
        self.spec = WireSpec.from_dict(start["spec"])
        self.control.merge(start.get("words") or [])
        self.start = start
        self._started.set()

    def run(self) -> int:
        self._environment()
        outcome = self._train()
        self._finish(outcome)
        return 0

    def _environment(self) -> None:
        """The worker's view of the world at this launch (its environment with the job's
        and torchrun's variables, its import path and directory), and the rank's threads."""
        start = self.start
        if start.get("cpus"):  # an oversubscribed host: one core, round robin (cpus.py)
            try:
                cpus.bind_process(cpus.cpulist(start["cpus"]))
            except OSError:  # a sandbox that forbids it: the rank runs unbound
                pass
        fault = start.get("fault_file")
        if fault:
            self._fault = open(fault, "w")  # noqa: SIM115 - open as long as the process
            faulthandler.enable(file=self._fault, all_threads=True)
        os.environ.clear()
        os.environ.update(start["env"])
        sys.path[:] = start["sys_path"]
        try:
            os.chdir(start["cwd"])
        except OSError:
            pass
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads and threads.isdigit() and int(threads) > 0:
            import torch

            # torch read OMP_NUM_THREADS when the zygote imported it: say it again here
            torch.set_num_threads(int(threads))

    def _capture(self) -> None:
        """stdout line by line (a pipe is block-buffered otherwise); logging to the rank's
        ``log`` stream (a crash's Python stacks go to the file the job's start names)."""
        for stream in (sys.stdout, sys.stderr):
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                reconfigure(line_buffering=True)
        handler = logging.StreamHandler(os.fdopen(self.log_fd, "w", buffering=1))
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(handler)

    def _train(self) -> dict[str, Any]:
        from . import process_group as pg
        from .context import TrainContext
        from .holds import Hold
        from .live import Live

        spec, rank, ws = self.spec, self.rank, self.spec.world_size
        start = self.start
        outcome: dict[str, Any] = {"status": ExitStatus.OK.value}
        device = None
        live = hold = None
        try:
            device = pg.rank_device(start["slot_kind"])
            addr, port = start["master"]
            store = pg.join_store(addr, port, ws, spec.timeout)
            control_group, checkpoint_group = pg.init(
                store, rank, ws, device, spec.timeout, checkpoints=bool(spec.checkpoint_dir)
            )
            fn, args, kwargs, objects = cloudpickle.loads(start["payload"])
            host = start.get("host_cpus")
            live = Live(
                fetch=self.fetch,
                report=self.report,
                group=control_group,
                rank=rank,
                world_size=ws,
                hparams=spec.hparams,
            )
            hold = Hold(
                control=self.control, report=self.report, rank=rank, timeout=spec.hold_timeout
            )
            self.ctx = TrainContext(
                job=self.job,
                name=spec.name,
                rank=rank,
                world_size=ws,
                local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                device=device,
                strategy=spec.strategy,
                control=self.control,
                control_group=control_group,
                checkpoint_group=checkpoint_group,
                checkpoint=checkpoint_options(spec, rank),
                report=self.report,
                spec=spec,
                objects=objects,
                console=self.console,
                live=live,
                hold=hold,
                # once its process groups exist, each loop frees their helper threads
                on_loop=functools.partial(cpus.free_helpers, host) if host else None,
            )
            self.report(RankEvent.STARTED, versions=start.get("versions"))
            result = fn(self.ctx, *args, **kwargs)
            if self.ctx.stopped:
                outcome["status"] = ExitStatus.STOPPED.value
            if rank == 0:
                outcome["result"] = cloudpickle.dumps(result)
        except JobSuspended:
            outcome = {"status": ExitStatus.SUSPENDED.value}
        except JobStopped:  # stopped before its first step: nothing after the loop ran
            outcome = {"status": ExitStatus.STOPPED.value}
        except BaseException as e:  # noqa: BLE001 - every failure must reach the user
            outcome = {"status": ExitStatus.FAILED.value}
            error = {
                "rank": rank,
                "type": type(e).__name__,
                "message": str(e),
                "traceback": "".join(traceback.format_exception(e)),
            }
            facts = failure_facts(e, device)  # e.g. CUDA memory peaks, for its diagnosis
            if facts:
                error["facts"] = facts
            try:
                if not self._hold(e, error, live, hold):
                    self.report(RankEvent.FAILED, error=error)
            except Exception:
                logger.exception("clustersdk: could not report the failure of rank %d", rank)
        return outcome

    def _hold(self, e: BaseException, error: dict[str, Any], live: Any, hold: Any) -> bool:
        """Under ``on_error="hold"``: report HELD and wait, alive, until told to stop
        (:meth:`.holds.Hold.wait`), serving ``job.run`` meanwhile; False when the failure
        takes the usual path."""
        ctx = self.ctx
        if (
            self.spec.on_error != "hold"
            or ctx is None
            or live is None
            or hold is None
            or self.control.words()[Word.STOP]
        ):
            return False
        hold.wait(e, error, step=ctx.step, serve_runs=lambda words: live.act_alone(words, ctx))
        return True

    def _finish(self, outcome: dict[str, Any]) -> None:
        """The outcome, with the rows logged since the last message: the worker reports
        the rank's exit once its process is gone."""
        with self._out:
            self.channel.send({"op": "outcome", **outcome, **self._drained()})
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass

    # --- what the rank tells its worker --------------------------------------------------------
    def report(self, event: RankEvent, **data: Any) -> None:
        """Tell the control plane ``event`` (with the rows logged so far, so that a paused
        job's history is complete when pause() returns), and wait until it heard; a notice
        (:data:`~clustersdk.protocol.NOTICES`: started, the loop's length...) is not waited
        for, and its worker still sends it before anything the rank says later."""
        message = {"op": "report", "event": event.value, "data": data}
        self._request(message, rows=True, wait=event not in NOTICES)

    def fetch(self, **ranges: Any) -> list[dict[str, Any]]:
        """The ``job.run`` / ``job.update`` requests in ``ranges``, from the control plane."""
        return self._request({"op": "fetch", "ranges": ranges}, rows=False)

    def _request(self, message: dict[str, Any], rows: bool, wait: bool = True) -> Any:
        key = next(self._ids) if wait else None
        waiter: list[Any] = [threading.Event(), None]
        if key is not None:
            self._waiting[key] = waiter
        with self._out:
            extra = self._drained() if rows else {}
            sent = self.channel.send({**message, **extra, "id": key})
        if not sent:
            self._waiting.pop(key, None)  # type: ignore[arg-type]
            raise ReportRefused("the rank's worker is gone")
        if key is None:
            return None
        waiter[0].wait()
        reply = waiter[1] or {}
        if reply.get("error"):
            raise ReportRefused(reply["error"])
        return reply.get("value")

    def _drained(self) -> dict[str, Any]:
        """The rows and phases logged since the last message, and where the rank is."""
        ctx = self.ctx
        self._shipped = time.monotonic()
        if ctx is None:
            return {"rows": [], "phases": [], "beacon": None}
        return {
            "rows": ctx.drain_rows(),
            "phases": ctx.drain_phases(),
            "beacon": {"step": ctx.step, "phase": ctx.phase, "ticks": ctx.ticks},
            "interval": ctx.spec.metrics_interval,  # job.update may have changed it
        }

    def ship(self) -> None:
        """The rows logged since the last message, at the job's metrics interval (and
        where the rank is, at least once a second: the hang watch counts on it)."""
        with self._out:
            if self.ctx is None:
                self._shipped = time.monotonic()
                return
            drained = self._drained()
            if drained["rows"] or drained["phases"] or time.monotonic() - self._beat >= HEARTBEAT_S:
                self._beat = time.monotonic()
                self.channel.send({"op": "rows", **drained})

    def interval(self) -> float:
        ctx = self.ctx
        return float((ctx.spec if ctx is not None else self.spec).metrics_interval)

    # --- what the worker tells the rank ---------------------------------------------------------
    def _listen(self) -> None:
        """The channel's other direction, and the metrics' pace."""
        try:
            while True:
                wait = self._shipped + self.interval() - time.monotonic()
                message = self.channel.recv(timeout=max(wait, 0.0) if self.start else None)
                if message is None:
                    break  # the worker is gone
                if message is not TIMEOUT:
                    self._heard(message)
                if time.monotonic() - self._shipped >= self.interval():
                    self.ship()
        except Exception:  # a broken channel: as if the worker were gone
            logger.exception("clustersdk: rank %d lost its channel", self.rank)
        # nobody is left to report to: the rank and what it started end now
        self._started.set()
        try:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            os._exit(1)

    def _heard(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "start":
            self._begin(message)
        elif op == "words":
            self.control.merge(message["words"])
        elif op == "console":
            self.console.feed(message["text"])
        elif op == "stacks":
            self.channel.send(
                {"op": "reply", "id": message["id"], "value": self.stacks(message.get("all"))}
            )
        elif op == "reply":
            waiter = self._waiting.pop(message["id"], None)
            if waiter is not None:
                waiter[1] = message
                waiter[0].set()

    def stacks(self, all_threads: bool = False) -> dict[str, Any]:
        """Where the rank is: its main thread's Python stack (every thread's with
        ``all_threads``), step and phase."""
        frames = sys._current_frames()
        main = threading.main_thread()
        threads = threading.enumerate() if all_threads else [main]
        text = []
        for thread in threads:
            frame = frames.get(thread.ident) if thread.ident is not None else None
            if frame is None:
                continue
            stack = traceback.extract_stack(frame)
            if thread is main:  # from the job's own function down (not the zygote's frames)
                entry = [
                    i for i, f in enumerate(stack) if f.name == "_train" and f.filename == __file__
                ]
                stack = traceback.StackSummary.from_list(stack[entry[-1] + 1 :] if entry else stack)
            head = f'Thread "{thread.name}"' + (" (the rank's)" if thread is main else "")
            text.append(head + ":\n" + "".join(stack.format()))
        ctx = self.ctx
        return {
            "rank": self.rank,
            "attempt": self.spec.attempt,
            "pid": os.getpid(),
            "step": getattr(ctx, "step", None),
            "phase": getattr(ctx, "phase", "setup"),
            "text": "\n".join(text),
        }


def _reseed() -> None:
    """What a fresh process has and a fork shares with its siblings: numpy's global
    random state is seeded anew (Python's ``random`` reseeds itself after a fork;
    torch's default generator starts from its fixed default seed in every process)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _warm_up() -> None:
    """A few training steps of a small model: what a process pays for on its first
    step (the autograd engine, the dispatcher's caches, the allocator), paid before
    the job comes; on a GPU slot, its CUDA context made too (``clustersdk.warm-cuda``).
    torch's random state is left as it was."""
    import torch

    state = torch.get_rng_state()
    if os.environ.get(ENV_WARM_CUDA) == "1" and torch.cuda.is_available():
        torch.cuda.init()  # a second or so on a real GPU: not in the job's launch
        torch.empty(1, device="cuda")
    try:
        net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        torch.set_rng_state(state)


def checkpoint_options(spec: WireSpec, rank: int) -> dict[str, Any] | None:
    """Check the checkpoint directory before any training; clean up killed saves."""
    root = spec.checkpoint_dir
    if not root:
        return None
    checkpoint_files.check_writable(root)
    if rank == 0:
        checkpoint_files.clean_leftovers(root)
    return {
        "dir": root,
        "every": spec.checkpoint_every,
        "keep": spec.keep,
        "async": spec.async_checkpoint,
        "resume": spec.resume,
        "attempt": spec.attempt,
    }
