"""What a script rank runs: a ``launch_script`` job's program, as torchrun would start it.

A script job's rank is a process of its own, like every rank (:class:`~.rank.Rank`):
the zygote forks it and it ``exec``s ``python -u script *args`` (or ``-m module``, or a
console command) with torchrun's environment (:mod:`.environ`). ``MASTER_ADDR:MASTER_PORT``
is the rendezvous store rank 0's worker holds for the job, as torchrun's agent holds
one (``TORCHELASTIC_USE_AGENT_STORE=True``: the processes connect to it as clients).
What the script sends through :mod:`clustersdk.script` (rows, its step boundaries, a
pause, a saved checkpoint) comes over the rank's channel (:mod:`.channel`), a Unix socket
it finds in ``CLUSTERSDK_CONTROL``; every line it prints is a log line of the rank.

Here: the payload of a script job (:func:`script_payload`), the program it runs
(:func:`command`), the error torch's ``@record`` wrote (:func:`read_error_file`), and
how to read a process's stack from outside (:func:`py_spy_dump`, :func:`process_state`:
a frozen process, or one that holds its interpreter lock, does not answer itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from ..protocol import WireSpec

PY_SPY_TIMEOUT = 2.5  # seconds py-spy has to read a rank's stack

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


def command(
    spec: WireSpec, code: dict[str, Any], env: dict[str, str], worker: str
) -> tuple[list[str], str | None]:
    """What a script rank's process runs: its argv and working directory. ``code`` is
    the unpickled :func:`script_payload`; shipped code is unpacked here, its modules put
    first on the ``PYTHONPATH`` of ``env`` (changed in place)."""
    from .shipping import unpack

    root = None
    if code.get("archive"):
        root = unpack(code["archive"], code["digest"])
    if root is not None and code.get("modules"):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    cwd = root if root is not None and code.get("chdir") else None
    args = list(spec.args or ())
    if spec.script:
        inside = code.get("script")
        path = os.path.join(root, inside) if root is not None and inside else spec.script
        return [sys.executable, "-u", path, *args], cwd
    if spec.module:
        return [sys.executable, "-u", "-m", spec.module, *args], cwd
    assert spec.command
    search = os.pathsep.join((env.get("PATH", ""), os.path.dirname(sys.executable)))
    found = shutil.which(spec.command, path=search)
    if found is None:
        raise FileNotFoundError(
            f"command {spec.command!r} is not on worker {worker}'s PATH ({search}); "
            "install it there, or give its path"
        )
    return [found, *args], cwd


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
