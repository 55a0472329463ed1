"""Fixtures of the multi-host tests: the namespace bed (:mod:`.netbed`) and clusters on it.

The bed needs root (CI runs as root) and Debian's openssh-server; without them
these tests skip, saying why. Under CI a missing package fails them instead.
"""

from __future__ import annotations

import os

import cloudpickle
import pytest

from . import jobs, netbed, slurmbed
from .helpers import need_bed

# The workers import the training functions by value: tests/ is not on their path.
cloudpickle.register_pickle_by_value(jobs)


@pytest.fixture(scope="session")
def bed():
    """Three hosts, shared by the multi-host tests; torn down even when they fail."""
    need_bed()
    with netbed.Bed(3) as b:
        yield b


@pytest.fixture(scope="module")
def slurm():
    reason = slurmbed.missing()
    if reason:
        if os.environ.get("CI") and os.geteuid() == 0:
            pytest.fail(reason + "; CI installs it from .ci/apt-packages")
        pytest.skip(reason)
    with slurmbed.SlurmBed() as bed:
        # sbatch and squeue (run by dask-jobqueue here) find the bed; its jobs carry the
        # marker, so that no process of theirs can outlive the bed
        saved = {k: os.environ.get(k) for k in ("SLURM_CONF", slurmbed.MARKER)}
        os.environ.update({"SLURM_CONF": bed.conf, slurmbed.MARKER: bed.dir})
        try:
            yield bed
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
