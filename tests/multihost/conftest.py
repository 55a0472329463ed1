"""Fixtures of the multi-host tests: the namespace bed (:mod:`.netbed`) and clusters on it.

The bed needs root (CI runs as root) and Debian's openssh-server; without them
these tests skip, saying why. Under CI a missing package fails them instead.
"""

from __future__ import annotations

import os
import sys
import time

import cloudpickle
import pytest

from .. import workloads
from . import jobs, netbed

# The workers import the training functions by value: tests/ is not on their path.
cloudpickle.register_pickle_by_value(workloads)
cloudpickle.register_pickle_by_value(jobs)


def need_bed() -> None:
    reason = netbed.missing()
    if reason is None:
        return
    if os.environ.get("CI") and os.geteuid() == 0:
        pytest.fail(reason + "; CI installs it from .ci/apt-packages")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def bed():
    """Three hosts, shared by the multi-host tests; torn down even when they fail."""
    need_bed()
    with netbed.Bed(3) as b:
        yield b


def ssh_options(b: netbed.Bed, **more) -> dict:
    """What Cluster.ssh needs to log into the bed's hosts."""
    return {"key_file": b.key_file, "known_hosts": b.known_hosts, "python": sys.executable,
            "connect_timeout": 5, **more}


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
    return [pid for pid in b.pids(host) if "sshd" not in cmdline(pid)]


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def gone(pids: list[int]) -> bool:
    return not any(os.path.exists(f"/proc/{pid}") for pid in pids)
