"""Fixtures of the multi-host tests: the namespace bed (:mod:`.netbed`) and clusters on it.

The bed needs root (CI runs as root) and Debian's openssh-server; without them
these tests skip, saying why. Under CI a missing package fails them instead.
"""

from __future__ import annotations

import cloudpickle
import pytest

from . import jobs, netbed
from .helpers import need_bed

# The workers import the training functions by value: tests/ is not on their path.
cloudpickle.register_pickle_by_value(jobs)


@pytest.fixture(scope="session")
def bed():
    """Three hosts, shared by the multi-host tests; torn down even when they fail."""
    need_bed()
    with netbed.Bed(3) as b:
        yield b
