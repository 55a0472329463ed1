"""Run the tutorial notebooks as tests (nbval), as part of the one test command.

``pytest`` (testpaths include ``notebooks``) executes every notebook here in a
fresh kernel of this environment, cell by cell; a cell that raises fails its
test. Outputs are compared only in cells marked ``# NBVAL_CHECK_OUTPUT``
(``--nbval-lax``), after the substitutions in ``sanitize.cfg`` (addresses,
timings, ids). The same by hand::

    pytest --nbval-lax --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg notebooks/
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CELL_TIMEOUT = 120  # seconds: every notebook must run in under 2 minutes on 2 cores


def pytest_configure(config):
    opt = config.option
    if getattr(opt, "nbval_lax", None) is None:
        return  # nbval is not installed (or disabled with -p no:nbval): nothing to run here
    if not opt.nbval:
        opt.nbval_lax = True
    opt.nbval_current_env = True
    opt.nbval_sanitize_with = opt.nbval_sanitize_with or str(HERE / "sanitize.cfg")
    if opt.nbval_cell_timeout == 2000:  # nbval's default: ours, unless given
        opt.nbval_cell_timeout = CELL_TIMEOUT
    config._clustersdk_nb_state = tempfile.mkdtemp(prefix="clustersdk-notebooks-")


def pytest_unconfigure(config):
    state = getattr(config, "_clustersdk_nb_state", None)
    if state:
        shutil.rmtree(state, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """The notebooks' kernels keep their job journals in a temp dir, not ~/.clustersdk.

    nbval starts a notebook's kernel while setting up its first cell; the
    kernel inherits this process's environment at that moment.
    """
    state = getattr(item.config, "_clustersdk_nb_state", None)
    if state is None or not str(item.fspath).endswith(".ipynb"):
        yield
        return
    old = os.environ.get("DASK_CLUSTERSDK__STATE_DIR")
    os.environ["DASK_CLUSTERSDK__STATE_DIR"] = state
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DASK_CLUSTERSDK__STATE_DIR", None)
        else:
            os.environ["DASK_CLUSTERSDK__STATE_DIR"] = old
