"""One rank of a job as its worker sees it: a process of its own, its line, its end.

Every rank, of a training function or of a script, is a process forked from its
worker's zygote (:mod:`.zygote`); the Dask worker supervises it and stays alive
whatever the rank does. :class:`Rank` is that supervision, the same for both kinds:

- **start**: the process's stdout and stderr are pipes the rank reads into a
  :class:`~.capture.Sink` (every line a log line of the rank); a function rank also gets
  a ``log`` pipe (its ``logging``) and its channel (:mod:`.channel`), over which it is
  sent what to run (:mod:`.inside`); a script gets a Unix socket to find in
  ``CLUSTERSDK_CONTROL`` (:mod:`clustersdk.script`). Both run with torchrun's
  environment (:mod:`.environ`), pinned to a core where the host is oversubscribed
  (:mod:`clustersdk.cpus`);
- **what it says**: reports (started, paused, a checkpoint, a failure...) go to the
  control plane through the worker's agent, in order, with the rows logged before
  them; rows come at the job's metrics interval; ``job.run``/``job.update`` requests
  are fetched for it;
- **what it is told**: control words, as they change; a stop or suspend of a script
  is also SIGTERM, then SIGKILL after the job's ``grace``, as Slurm and Kubernetes do
  (a function rank acts on the words at its next step boundary);
- **its end**: how the process ended. A function rank says its outcome (and its
  result) before it exits; a rank that dies without one (a segfault, ``os._exit``,
  the OOM killer, NCCL's watchdog abort, a script's non-zero exit) is reported as
  failed by its worker: "rank 1 (host h, GPU 0) died of SIGSEGV", with the Python
  stacks ``faulthandler`` wrote and the last lines of its stderr. The exit goes to
  the control plane once the process is gone, so the slot is free for the next job
  at once, in a fresh process (a process with a poisoned CUDA context is never used
  again).

It also watches the process's memory: a rank whose processes together pass the
worker's ``memory_limit`` times ``distributed.worker.memory.terminate`` is killed,
and its failure says so (the nanny watches the worker's own process only).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from .. import cpus
from ..protocol import ExitStatus, RankEvent, WireSpec, Word
from . import capture, scripts, telemetry
from .channel import HEADER, decode, encode
from .control_words import Control
from .environ import ENV_CONTROL, rank_environ

if TYPE_CHECKING:
    from .agent import Agent
    from .zygote import Zygote

logger = logging.getLogger(__name__)

OUTPUT_WAIT_S = 1.0  # once the process is gone: how long its pipes may still be read
STACKS_WAIT_S = 1.0  # how long a function rank has to say where it is (else py-spy reads it)
WATCH_S = 0.2  # how often the rank's memory is read (the nanny's own monitor: 0.1 s)
CHILDREN_S = 2.0  # ... and the list of its child processes (data loaders) refreshed
HELPERS_SWEEP_S = 1.0  # a bound script's new collective helpers wait at most this long
READ_BYTES = 1 << 16


class Rank:
    """One rank of one job on this worker: its process and everything it says.

    The agent merges control words into it (:meth:`merge`), ships what :meth:`drain`
    gives when its :attr:`pace` says, asks :meth:`stacks` where the rank is, and
    :meth:`kill` ends a rank that will not stop.
    """

    def __init__(
        self,
        agent: Agent,
        job: str,
        rank: int,
        spec: WireSpec,
        payload: bytes,
        master: tuple[str, int],
        hosts: list[str] | None = None,
    ):
        self.agent, self.job, self.rank, self.spec = agent, job, rank, spec
        self.script = spec.kind == "script"
        self.attempt = spec.attempt
        self.payload = payload
        self.master = master
        self.hosts = list(hosts) if hosts else [master[0]] * spec.world_size
        self.control = Control()  # the words known here, passed on as they change
        self.outbox = asyncio.Lock()  # what this rank sends goes out one message at a time
        self.last_sent = 0.0  # monotonic time of the last message to the control plane
        self.uplink: Any = None  # the rank's own connection to the control plane (an rpc)
        self.sink = capture.Sink(rank)
        slot = agent.slot
        self.sampler = telemetry.Sampler(slot["kind"], slot["index"])
        self.pace = telemetry.Pace(rank, self.interval, self.sampler)
        self.rows: collections.deque = collections.deque()
        self.phases: collections.deque = collections.deque()
        self.pid: int | None = None
        self.started = False  # the rank's code runs (a function's context exists)
        self.step: int | None = None
        self.phase = "setup"
        self.ticks = 0  # steps done (a script's: its lines and messages): hang watch progress
        self.outcome: dict[str, Any] | None = None  # how a function said it ended
        self.asked = ""  # a script: "stop" or "suspend" once SIGTERM was sent for it
        self.killed = ""  # why its worker killed it, if it did
        self.ended = False  # the control plane ended it (a hung rank): no failure of its own
        self.memory: dict[str, Any] = {}  # its memory, for a failure's record
        self.dir = ""
        self.store: Any = None  # rank 0's: the job's rendezvous store, held while it runs
        self.task: asyncio.Task | None = None
        self._interval = spec.metrics_interval
        self._writers: list[asyncio.StreamWriter] = []
        self._server: Any = None
        self._readers: list[asyncio.Task] = []
        self._replies: dict[int, asyncio.Future] = {}
        self._ids = 0
        self._children: list[int] = []

    # --- what the agent asks -------------------------------------------------------------------
    def interval(self) -> float:
        """Seconds between this rank's messages (its job's metrics_interval, which the
        control plane stretches on a busy cluster; job.update may change it)."""
        return self._interval

    def drain(self, final: bool = False) -> dict[str, Any]:
        rows = [self.rows.popleft() for _ in range(len(self.rows))]
        phases = [self.phases.popleft() for _ in range(len(self.phases))]
        return {
            "sent": time.time(),
            "rows": rows,
            "logs": self.sink.drain(final),
            "system": self.pace.samples(final),
            "phases": phases,
            "beacon": self.beacon(),
        }

    def beacon(self) -> dict[str, Any] | None:
        """Where the rank is: its step, phase and progress (the hang watch's)."""
        if self.script:
            return {"step": self.step or 0, "phase": self.phase, "ticks": self.ticks}
        if self.step is None:
            return None  # no context yet
        return {"step": self.step, "phase": self.phase, "ticks": self.ticks}

    def merge(self, words: list[int]) -> None:
        """New control words: kept, and passed on to the process."""
        before = self.control.words()
        self.control.merge(words)
        now = self.control.words()
        if now == before:
            return
        self._tell({"op": "words", "words": now})
        if self.script and self.pid is not None:
            self._terminate_if_asked(now)

    def console(self, text: str) -> bool:
        """A line for the rank's pdb session (``ctx.breakpoint()``)."""
        if self.script or not self.started:
            return False
        self._tell({"op": "console", "text": text})
        return True

    async def stacks(self, all_threads: bool = False) -> dict[str, Any]:
        """Where the rank is: a function rank says it (its main thread's Python stack,
        every thread's with ``all_threads``); a script's process, or a rank that does not
        answer (stuck holding its interpreter lock, stopped), is read by py-spy."""
        head = {"rank": self.rank, "attempt": self.attempt, "step": self.step, "phase": self.phase}
        note = ""
        if not self.script and self._writers:
            try:
                return await asyncio.wait_for(
                    self._ask({"op": "stacks", "all": all_threads}), STACKS_WAIT_S
                )
            except (asyncio.TimeoutError, ConnectionError):
                note = f"(the rank did not answer within {STACKS_WAIT_S:g} s: py-spy's view)\n"
        pid = self.pid
        if pid is None or not _alive(pid):
            return {**head, "pid": None, "text": "(the rank's process is not running)"}
        state = scripts.process_state(pid)
        text = await scripts.py_spy_dump(pid, os.environ.get("PATH", ""))
        return {**head, "pid": pid, "text": f"{note}process {pid}: {state}\n{text}"}

    def kill(self, reason: str, ended: bool = False) -> None:
        """End the rank's processes now (SIGKILL to its process group); ``reason`` goes in
        its failure, unless the control plane ``ended`` it (it knows why)."""
        self.killed = self.killed or reason
        self.ended = self.ended or ended
        self._kill_group()

    # --- the rank's life ----------------------------------------------------------------------------
    async def run(self) -> None:
        outcome: dict[str, Any] = {"status": ExitStatus.OK.value}
        watch: asyncio.Task | None = None
        try:
            await self._spawn()
            watch = asyncio.ensure_future(self._watch())
            if self.script:  # a function rank says it itself, from inside its function
                await self.agent.send(self, RankEvent.STARTED, {"versions": self.agent.versions})
            assert self.pid is not None
            code = await self.agent.zygote.exited(self.pid)
            watch.cancel()
            self._kill_group()  # what it left behind (a script's children, data loaders)
            await self._read_to_the_end()
            outcome = self._outcome(code)
            if self.agent.closing:  # its worker's loss says it, once Dask sees it gone
                return
            if outcome.get("error"):
                await self.agent.send(
                    self, RankEvent.FAILED, {"error": outcome.pop("error")}, final=True
                )
        except asyncio.CancelledError:
            outcome = {"status": ExitStatus.FAILED.value}
            raise
        except BaseException as e:  # noqa: BLE001 - could not start it: the rank failed
            outcome = {"status": ExitStatus.FAILED.value}
            error = {
                "rank": self.rank,
                "type": type(e).__name__,
                "message": str(e),
                "traceback": "",
            }
            if not self.agent.closing:
                with contextlib.suppress(Exception):
                    await self.agent.send(self, RankEvent.FAILED, {"error": error}, final=True)
        finally:
            if watch is not None:
                watch.cancel()
            self._cleanup()
            self.agent.forget(self)
            if not self.agent.closing:  # else the worker's loss, once Dask sees it gone
                await self._report_exit(outcome)

    async def _report_exit(self, outcome: dict[str, Any]) -> None:
        try:
            await self.agent.send(self, RankEvent.EXIT, outcome, final=True)
        except Exception:  # the worker is closing: the scheduler learns it by itself
            logger.info(
                "clustersdk: could not report the exit of rank %d", self.rank, exc_info=True
            )

    async def _spawn(self) -> None:
        spec, agent = self.spec, self.agent
        self.dir = tempfile.mkdtemp(prefix=f"clustersdk-{spec.name}-r{self.rank}-")
        slot = agent.slot
        gpu = slot["index"] if slot["kind"] == "cuda" else None
        env = rank_environ(
            self.rank,
            self.hosts,
            *self.master,
            spec,
            gpu,
            os.path.join(self.dir, "error.json"),
        )
        share = cpus.rank_share(self.hosts, self.rank) if agent.pin_ranks else None
        if self.script:
            code = pickle.loads(self.payload) if self.payload else {}
            env[ENV_CONTROL] = await self._listen()
            argv, cwd = scripts.command(spec, code, env, slot["worker"])
            await agent.zygote_alive()
            forked = await fork(agent.zygote, {"argv": argv, "env": env, "cwd": cwd}, share)
        else:
            forked = await agent.function_process()
        self.pid = forked.pid
        self.sampler.pid = self.pid
        loop = asyncio.get_running_loop()
        for fd, stream in forked.outputs:
            self._readers.append(loop.create_task(self._read_output(fd, stream)))
        if forked.channel is not None:
            reader, writer = await asyncio.open_unix_connection(sock=forked.channel)
            self._readers.append(loop.create_task(self._serve(reader, writer)))
            self._writers.append(writer)
            writer.write(encode(self._start_message(env, share)))
        else:
            self._terminate_if_asked(self.control.words())

    def _start_message(self, env: dict[str, str], share: list[int] | None) -> dict[str, Any]:
        agent = self.agent
        return {
            "op": "start",
            "job": self.job,
            "rank": self.rank,
            "spec": self.spec.as_dict(),
            "payload": self.payload,
            "master": list(self.master),
            "hosts": self.hosts,
            "words": self.control.words(),
            "env": env,
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "versions": agent.versions,
            "slot_kind": agent.slot["kind"],
            "host_cpus": agent.host_cpus,
            "cpus": share,
            "fault_file": os.path.join(self.dir, "fault.txt"),
        }

    async def _listen(self) -> str:
        """A script's line: a Unix socket in the rank's own directory (``CLUSTERSDK_CONTROL``;
        the script and the processes it starts may each connect)."""
        path = os.path.join(self.dir, "control.sock")
        self._server = await asyncio.start_unix_server(self._connected, path=path)
        return path

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        writer.write(encode({"op": "words", "words": self.control.words()}))
        await self._serve(reader, writer)

    # --- what the process says ----------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    header = await reader.readexactly(HEADER.size)
                    (size,) = HEADER.unpack(header)
                    body = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                try:
                    self._heard(decode(body), writer)
                except Exception:  # a bad message must not end the rank's line
                    logger.warning("clustersdk: bad message from rank %d", self.rank, exc_info=True)
        finally:
            if writer in self._writers:
                self._writers.remove(writer)
            with contextlib.suppress(Exception):
                writer.close()

    def _heard(self, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        op = message.get("op")
        self._take_rows(message)
        if op == "report":
            event = RankEvent(message["event"])
            if event is RankEvent.STARTED:
                self.started = True
            elif self.script:
                self._script_event(event, message.get("data") or {})
            asyncio.ensure_future(self._report(event, message, writer))
        elif op == "rows" and not self.script:  # a function rank ships at its job's interval
            self.pace.sent()
            self._ship()
        elif op == "fetch":
            asyncio.ensure_future(self._fetch(message, writer))
        elif op == "outcome":
            self.outcome = message
        elif op == "reply":
            future = self._replies.pop(message.get("id"), None)
            if future is not None and not future.done():
                future.set_result(message.get("value"))

    def _take_rows(self, message: dict[str, Any]) -> None:
        """The rows, phase rows and whereabouts a message carries."""
        rows = message.get("rows")
        if rows and self.script:  # a script's rows are its rank's, whatever they say
            rows = [{**row, "rank": self.rank} for row in rows]
        if rows:
            self.rows.extend(rows)
        phases = message.get("phases")
        if phases:
            self.phases.extend(phases)
        if message.get("interval"):
            self._interval = float(message["interval"])
        beacon = message.get("beacon")
        if self.script:  # every message of a script is a sign of life
            self._alive()
            step = (beacon or {}).get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                self.step = step if self.step is None else max(self.step, step)
            if beacon and beacon.get("phase"):
                self.phase = beacon["phase"]
        elif beacon:
            self.step, self.phase, self.ticks = beacon["step"], beacon["phase"], beacon["ticks"]

    def _script_event(self, event: RankEvent, data: dict[str, Any]) -> None:
        if event is RankEvent.PAUSED:
            self.phase = "paused"
        elif event in (RankEvent.RESUMED, RankEvent.CHECKPOINT):
            self.phase = "step"

    def _alive(self) -> None:
        self.ticks += 1
        if self.phase == "setup":
            self.phase = "step"

    async def _report(
        self, event: RankEvent, message: dict[str, Any], writer: asyncio.StreamWriter
    ) -> None:
        error = None
        try:
            await self.agent.send(self, event, message.get("data") or {})
        except Exception as e:  # noqa: BLE001 - the rank hears why
            error = f"{type(e).__name__}: {e}"
            logger.info(
                "clustersdk: rank %d could not report %s", self.rank, event.value, exc_info=True
            )
        if message.get("id") is not None:
            self._write(writer, {"op": "reply", "id": message["id"], "error": error})

    async def _fetch(self, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        value, error = None, None
        try:
            value = await self.agent.fetch(self, **(message.get("ranges") or {}))
        except Exception as e:  # noqa: BLE001 - the rank hears why
            error = f"{type(e).__name__}: {e}"
        self._write(writer, {"op": "reply", "id": message["id"], "value": value, "error": error})

    def _ship(self) -> None:
        """Send on what the rank shipped (a send that finds nothing new sends nothing)."""
        asyncio.ensure_future(self.agent.send(self, RankEvent.METRICS, {}))

    async def _ask(self, message: dict[str, Any]) -> Any:
        self._ids += 1
        future = asyncio.get_running_loop().create_future()
        self._replies[self._ids] = future
        if not self._tell({**message, "id": self._ids}):
            self._replies.pop(self._ids, None)
            raise ConnectionError("the rank's channel is closed")
        return await future

    def _tell(self, message: dict[str, Any]) -> bool:
        writers = list(self._writers)
        for writer in writers:
            self._write(writer, message)
        return bool(writers)

    @staticmethod
    def _write(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        if writer.is_closing():
            return
        with contextlib.suppress(Exception):
            writer.write(encode(message))

    async def _read_output(self, fd: int, stream: str) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=READ_BYTES)
        pipe = os.fdopen(fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
        try:
            while True:
                data = await reader.read(READ_BYTES)
                if not data:
                    return
                lines = self.sink.write_bytes(stream, data)
                if self.script and lines:
                    for _ in range(lines):
                        self._alive()
        finally:
            transport.close()

    async def _read_to_the_end(self) -> None:
        """The output and messages the process left (its channel and pipes close with it)."""
        readers = [t for t in self._readers if not t.done()]
        if readers:
            await asyncio.wait(readers, timeout=OUTPUT_WAIT_S)

    # --- its end ----------------------------------------------------------------------------------------
    def _outcome(self, code: int | None) -> dict[str, Any]:
        """The rank's exit report (with ``error``: its failure, when it died of it)."""
        said = self.outcome
        if said is not None and not self.killed:
            return {k: said[k] for k in ("status", "result") if k in said}
        if self.ended:  # a hung rank the control plane ended: it knows
            return {"status": ExitStatus.FAILED.value}
        if self.script and self.asked:
            if code:
                how = (
                    f"killed after its grace of {self.spec.grace:g} s"
                    if self.killed
                    else exit_text(code)
                )
                self.sink.write(
                    "log", f"clustersdk: rank {self.rank} left on SIGTERM ({self.asked}): {how}\n"
                )
            status = ExitStatus.SUSPENDED if self.asked == "suspend" else ExitStatus.STOPPED
            return {"status": status.value}
        if self.script and code == 0:
            import cloudpickle

            out: dict[str, Any] = {"status": ExitStatus.OK.value}
            if self.rank == 0:
                out["result"] = cloudpickle.dumps(0)  # job.wait(): the exit code
            return out
        return {"status": ExitStatus.FAILED.value, "error": self.death(code)}

    def death(self, code: int | None) -> dict[str, Any]:
        """The failure record of a rank whose process ended without saying how: the exit
        code or signal (or why its worker killed it), where it ran, what ``faulthandler``
        wrote, a script's ``@record`` error, the last lines of its stderr."""
        slot = self.agent.slot
        device = f"GPU {slot['index']}" if slot["kind"] == "cuda" else "CPU"
        tail = self.sink.tail("stderr")
        how = exit_text(code) if code is not None else "died with its worker's rank zygote"
        if self.killed:
            how = f"was killed by its worker: {self.killed}"
        elif code is not None and code < 0 and _nccl_abort(tail):
            how += ": NCCL's watchdog aborted it (a collective timed out or a peer failed)"
        elif self.outcome is None and code == 0 and not self.script:
            how = "exited with code 0 before its function returned (sys.exit(0) or os._exit(0))"
        err: dict[str, Any] = {
            "rank": self.rank,
            "type": "ScriptExit" if self.script else "RankExit",
            "message": how,
            "where": f"host {slot.get('host') or '?'}, {device}",
            "traceback": "",
            "exit_code": code if code is not None and code >= 0 else None,
            "signal": signal_name(-code) if code is not None and code < 0 else None,
        }
        recorded = scripts.read_error_file(os.path.join(self.dir, "error.json"))
        if recorded is not None:  # torch's @record: the script's own exception
            err["type"], message, err["traceback"] = recorded
            err["message"] = f"{message} ({how})"
        fault = _read(os.path.join(self.dir, "fault.txt")).strip()
        if fault:
            err["traceback"] = fault
        if tail:
            err["stderr"] = tail
            err["traceback"] = (
                (err["traceback"] + "\n\n" if err["traceback"] else "")
                + f"last {len(tail)} line(s) of its stderr:\n"
                + "\n".join(tail)
            )
        process = {"pid": self.pid, **self.memory}
        err["facts"] = {"process": {k: v for k, v in process.items() if v is not None}}
        return err

    def _cleanup(self) -> None:
        for task in self._readers:
            task.cancel()
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.close()
        self._writers.clear()
        if self._server is not None:
            self._server.close()
        for future in self._replies.values():
            if not future.done():
                future.set_exception(ConnectionError("the rank is gone"))
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- signals and memory -------------------------------------------------------------------------
    def _terminate_if_asked(self, words: list[int]) -> None:
        """A script asked to stop or suspend: SIGTERM now, SIGKILL after the grace."""
        if not (words[Word.STOP] or words[Word.SUSPEND]) or self.asked or self.pid is None:
            return
        self.asked = "suspend" if words[Word.SUSPEND] and not words[Word.STOP] else "stop"
        for sig in (signal.SIGTERM, signal.SIGCONT):  # a stopped process must see it too
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)
        asyncio.get_running_loop().call_later(self.spec.grace, self._overdue)

    def _overdue(self) -> None:
        if self.pid is not None and _alive(self.pid) and not self.killed:
            self.kill(f"it did not leave within its grace of {self.spec.grace:g} s")

    def _kill_group(self) -> None:
        if self.pid is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)

    async def _watch(self) -> None:
        """Every :data:`WATCH_S`: the memory of the rank's processes against the worker's
        limit; a bound script's collective helpers freed."""
        import psutil

        limit = self.agent.memory_limit
        fraction = self.agent.memory_terminate
        pid = self.pid
        assert pid is not None
        children_at = swept = 0.0
        while True:
            await asyncio.sleep(WATCH_S)
            now = time.monotonic()
            if self.script and self.agent.host_cpus and now - swept >= HELPERS_SWEEP_S:
                swept = now
                cpus.free_helpers(self.agent.host_cpus, pid)
            if not limit:
                continue
            if now - children_at >= CHILDREN_S:
                children_at = now
                with contextlib.suppress(psutil.Error):
                    self._children = [c.pid for c in psutil.Process(pid).children(recursive=True)]
            rss = _rss([pid, *self._children])
            if rss is None:
                return
            self.memory = {
                "rss": rss,
                "peak_rss": max(rss, self.memory.get("peak_rss", 0)),
                "memory_limit": limit,
                "terminate_fraction": fraction,
            }
            if fraction and rss >= fraction * limit:
                self.memory["killed_for_memory"] = True
                self.kill(
                    f"its memory ({_gib(rss)}) passed {100 * fraction:.0f}% of the worker's "
                    f"memory_limit ({_gib(limit)})"
                )
                return


@dataclasses.dataclass
class Forked:
    """A rank process just forked: its pid, this side's ends of its output pipes, and of
    its channel (a function rank's)."""

    pid: int
    outputs: list[tuple[int, str]]
    channel: socket.socket | None = None

    def close(self) -> None:
        for fd, _ in self.outputs:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.channel is not None:
            self.channel.close()


async def fork(
    zygote: Zygote, launch: dict[str, Any] | None = None, share: list[int] | None = None
) -> Forked:
    """A new rank process: a function rank (``launch`` None), which waits for its job's
    ``start``, or the program ``launch`` names (a script's argv, env and cwd)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ends = [out_w, err_w]
    outputs = [(out_r, "stdout"), (err_r, "stderr")]
    ours = None
    try:
        if launch is None:
            ours, theirs = socket.socketpair()
            log_r, log_w = os.pipe()
            ends += [theirs.detach(), log_w]
            outputs.append((log_r, "log"))
        pid = await zygote.fork(ends, launch, cpus=share)
    except BaseException:
        Forked(0, outputs, ours).close()
        raise
    finally:
        for fd in ends:
            os.close(fd)
    return Forked(pid, outputs, ours)


def exit_text(code: int) -> str:
    """``"exited with code 3"``, ``"died of SIGSEGV (signal 11)"``."""
    if code < 0:
        return f"died of {signal_name(-code)} (signal {-code})"
    return f"exited with code {code}"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _nccl_abort(stderr: list[str]) -> bool:
    text = "\n".join(stderr)
    return "ProcessGroupNCCL" in text and ("Watchdog" in text or "watchdog" in text)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _rss(pids: list[int]) -> int | None:
    """The resident memory of ``pids`` together (None: the first is gone)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for i, pid in enumerate(pids):
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            if i == 0:
                return None
    return total


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
