"""What the multi-host tests share (fixtures are in ``conftest.py``)."""

from __future__ import annotations

import os
import sys

import pytest

from . import netbed


def need_bed() -> None:
    reason = netbed.missing()
    if reason is None:
        return
    if os.environ.get("CI") and os.geteuid() == 0:
        pytest.fail(reason + "; CI installs it from .ci/apt-packages")
    pytest.skip(reason)


def ssh_options(b: netbed.Bed, **more) -> dict:
    """What Cluster.ssh needs to log into the bed's hosts."""
    return {
        "key_file": b.key_file,
        "known_hosts": b.known_hosts,
        "python": python(b),
        "connect_timeout": 5,
        **more,
    }


def python(b: netbed.Bed) -> str:
    """This interpreter, for the hosts. Where this process has a PYTHONPATH (a checkout
    tested beside an editable install of another), a wrapper that appends it to the
    host's own, so that the hosts run the code under test too."""
    path = os.environ.get("PYTHONPATH")
    if not path:
        return sys.executable
    wrapper = os.path.join(b.dir, "python")
    if not os.path.exists(wrapper):
        with open(wrapper, "w") as f:
            f.write(
                f'#!/bin/sh\nexport PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{path}"\n'
                f'exec {sys.executable} "$@"\n'
            )
        os.chmod(wrapper, 0o755)
    return wrapper


def addresses(b: netbed.Bed) -> list[str]:
    return [h.address for h in b.hosts]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def started_on(b: netbed.Bed, host: netbed.Host) -> list[int]:
    """The host's processes other than its sshd (and sshd's per-connection children)."""
    return [pid for pid in b.pids(host) if alive(pid) and "sshd" not in cmdline(pid)]


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (killed, its parent gone, not yet reaped by
    init) has stopped running and counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def gone(pids: list[int]) -> bool:
    return not any(alive(pid) for pid in pids)
