"""A command running on a host over one of :mod:`.sshconn`'s connections.

Its stdout and stderr are read by threads, so that it never blocks on a full
pipe; stdout carries the launcher's JSON lines (:mod:`.remote`), stderr's last
lines explain a failure.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

import paramiko

from ..errors import StartError

if TYPE_CHECKING:
    from .sshconn import Connection

logger = logging.getLogger(__name__)


class RemoteProcess:
    """A command running on a host, its output read by threads (so it never blocks on a
    full pipe). stdout carries JSON lines; stderr's last lines explain a failure."""

    def __init__(self, connection: Connection, command: str):
        self.connection, self.command = connection, command
        self.host = connection.target.label
        transport = connection.client.get_transport()
        if transport is None or not transport.is_active():
            raise StartError(f"host {self.host}: the SSH connection is closed", host=self.host)
        try:
            self.channel = transport.open_session(timeout=connection.options.connect_timeout)
            self.channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise StartError(
                f"host {self.host}: could not run a command over SSH: {e}", host=self.host
            ) from e
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._stdout: list[str] = []
        self._stderr: collections.deque[str] = collections.deque(maxlen=60)
        self.info: dict[str, Any] = {}  # the JSON lines seen so far, merged
        pumps = (
            (self.channel.makefile("rb"), self._on_stdout, lambda: self.lines.put(None)),
            (self.channel.makefile_stderr("rb"), self._stderr.append, lambda: None),
        )
        self._pumps = [
            threading.Thread(target=_pump, args=p, daemon=True, name=f"clustersdk-ssh-{self.host}")
            for p in pumps
        ]
        for pump in self._pumps:
            pump.start()

    def _on_stdout(self, line: str) -> None:
        self._stdout.append(line)
        self.lines.put(line)

    @property
    def pid(self) -> int | None:
        return self.info.get("pid")

    def wait_for(self, key: str, timeout: float, what: str) -> Any:
        """Read stdout's JSON lines until one has ``key``; its value. A StartError naming
        the host (with the last lines of stderr) if the process ends or time runs out."""
        deadline = time.monotonic() + timeout
        while key not in self.info:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0)) if left > 0 else None
            except queue.Empty:
                line = None
            if line is None:
                reason = (
                    f"did not {what} within {timeout:g} s"
                    if time.monotonic() >= deadline
                    else f"exited before it could {what} ({self._status_text()})"
                )
                raise StartError(f"host {self.host}: {reason}{self._tail()}", host=self.host)
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                self.info.update(message)
        return self.info[key]

    def _status_text(self) -> str:
        if not self.connection.alive:
            return "the SSH connection dropped"
        if self.channel.exit_status_ready():
            status = self.channel.recv_exit_status()
            return "command not found" if status == 127 else f"exit status {status}"
        return "its output ended"

    def _tail(self) -> str:
        text = self.stderr_text().strip()
        return f"; its last output:\n{text}" if text else ""

    def wait(self, timeout: float) -> int:
        """The exit status, or -1 if none came within ``timeout``; its output is read."""
        deadline = time.monotonic() + timeout
        if not self.channel.status_event.wait(timeout):
            return -1
        for pump in self._pumps:
            pump.join(max(0.1, deadline - time.monotonic()))
        return self.channel.recv_exit_status()

    @property
    def running(self) -> bool:
        return self.connection.alive and not self.channel.exit_status_ready()

    def stop(self, grace: float) -> None:
        """End the process and everything it started: close its stdin (the launcher then
        stops its servers and kills its process group), and after ``grace`` seconds
        kill the group. A dead host or connection is given up on at once."""
        if not self.running:
            self.channel.close()
            return
        try:
            self.channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass
        if self.wait(grace) < 0 and self.connection.alive and self.info.get("pgid"):
            try:
                self.connection.run(f"kill -KILL -- -{int(self.info['pgid'])}", timeout=grace)
            except StartError:
                logger.warning(
                    "clustersdk: could not kill process group %s on %s",
                    self.info["pgid"],
                    self.host,
                )
            self.wait(grace)
        self.channel.close()

    def stdout_text(self) -> str:
        return "".join(self._stdout)

    def stderr_text(self) -> str:
        return "".join(self._stderr)


def _pump(stream: Any, sink: Any, on_eof: Any) -> None:
    try:
        for raw in iter(stream.readline, b""):
            sink(raw.decode(errors="replace"))
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        on_eof()
