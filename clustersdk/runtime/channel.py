"""The line between a worker and one of its rank processes: framed messages on a socket.

Every rank of a job is a process of its own (:mod:`.rank`); its worker and it talk over
one Unix stream socket, whatever the rank runs (a training function, a script using
:mod:`clustersdk.script`). A message is a dict with an ``"op"``; on the wire it is a
4-byte big-endian length, then the dict pickled. Both ends belong to the same user on
the same host (the socket is a socket pair, or lies in a directory only that user can
open), so pickle's reach is no wider than the rank's own code.

What goes each way (the worker's side is :class:`~.rank.Rank`, a function rank's
:class:`~.inside.Inside`, a script's :mod:`clustersdk.script`):

======================  ====================================================================
rank -> worker          ``report`` (an event for the control plane; with an ``id``, the
                        sender waits for its ``reply``), ``rows`` (metrics so far, where the
                        rank is), ``fetch`` (the ``job.run``/``job.update`` requests it must
                        carry out), ``outcome`` (how the function ended, its result),
                        ``reply`` (to ``stacks``)
worker -> rank          ``start`` (what a function rank runs), ``words`` (the control vector),
                        ``console`` (a line for a pdb session), ``stacks``, ``reply``
======================  ====================================================================

Standard library only: :mod:`clustersdk.script` loads it in a script's process.

>>> a, b = socket.socketpair()
>>> Channel(a).send({"op": "words", "words": [0, 1]})
True
>>> Channel(b).recv()
{'op': 'words', 'words': [0, 1]}
"""

from __future__ import annotations

import pickle
import select
import socket
import struct
import threading
import time
from typing import Any

HEADER = struct.Struct("!I")
MAX_MESSAGE = 1 << 30  # a longer frame is a broken peer, not a message
PROTOCOL = 5  # pickle's: Python 3.8 and newer (a script's interpreter may differ)
TIMEOUT = object()  # what recv returns when nothing came in time


def encode(message: dict[str, Any]) -> bytes:
    """``message`` as one frame."""
    body = pickle.dumps(message, protocol=PROTOCOL)
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    message = pickle.loads(body)
    if not isinstance(message, dict):
        raise ValueError(f"a channel message must be a dict, got {type(message).__name__}")
    return message


class Channel:
    """Blocking frames on a connected stream socket: any thread sends, one thread reads."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._lock = threading.Lock()
        self._buffer = b""
        self.closed = False

    def send(self, message: dict[str, Any]) -> bool:
        """Send ``message``; False when the other end is gone."""
        data = encode(message)
        with self._lock:
            try:
                self.sock.sendall(data)
            except OSError:
                return False
        return True

    def recv(self, timeout: float | None = None) -> Any:
        """The next message; None once the other end closed; :data:`TIMEOUT` when none
        came within ``timeout`` seconds (None: wait)."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            if len(self._buffer) >= HEADER.size:
                (size,) = HEADER.unpack_from(self._buffer)
                if size > MAX_MESSAGE:
                    raise ValueError(f"a channel frame of {size} bytes: the peer is broken")
                end = HEADER.size + size
                if len(self._buffer) >= end:
                    body, self._buffer = self._buffer[HEADER.size : end], self._buffer[end:]
                    return decode(body)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                    return TIMEOUT
            try:
                chunk = self.sock.recv(1 << 20)
            except InterruptedError:  # pragma: no cover - retried by Python itself
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            self._buffer += chunk

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
