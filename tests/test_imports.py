"""Importing is cheap: the package root, the pure modules and the server extension load
neither torch nor (for the pure ones) Dask. Each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "distributed", "dask", "numpy", "tornado")

PURE = [
    "clustersdk.protocol",
    "clustersdk.errors",
    "clustersdk.status",
    "clustersdk.layout",
    "clustersdk.control.policy",
    "clustersdk.control.scheduling",
    "clustersdk.control.sharing",
    "clustersdk.control.placement",
    "clustersdk.control.faults",
    "clustersdk.control.hangs",
    "clustersdk.control.lifecycle",
    "clustersdk.control.events",
    "clustersdk.control.live",
    "clustersdk.hparams",
    "clustersdk.diagnosis",
    "clustersdk.signals",
    "clustersdk.control.anomalies",
    "clustersdk.client",
]


def loaded_after(statement: str) -> set[str]:
    code = (f"import sys, json\n{statement}\n"
            f"print(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_nothing_heavy(module):
    assert loaded_after(f"import {module}") == set()


def test_the_package_root_does_not_import_torch_or_dask():
    assert loaded_after("import clustersdk; clustersdk.JobStatus; clustersdk.SpecError") == set()


def test_the_server_extension_does_not_import_torch():
    assert "torch" not in loaded_after("import jupyter_clustersdk.app, jupyter_clustersdk.handlers")


def test_a_public_name_loads_its_module_on_first_use():
    assert "torch" in loaded_after("import clustersdk; clustersdk.TrainContext")
