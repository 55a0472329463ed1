"""Importing is cheap: the package root, the pure modules and the server extension load
neither torch nor (for the pure ones) Dask. Each check runs in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "distributed", "dask", "numpy", "tornado")

PURE = [
    "clustersdk.protocol",
    "clustersdk.options",
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
    "clustersdk.control.signals",
    "clustersdk.control.anomalies",
    "clustersdk.client",
    "clustersdk.script",  # imported by training scripts: cheap, and no torch of its own
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


# the client tier never imports the tiers above it -------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
CLIENT = sorted([*(ROOT / "clustersdk" / "cluster").glob("*.py"),
                 *(ROOT / "clustersdk" / name for name in (
                     "job.py", "client.py", "spec.py", "registry.py", "hooks.py",
                     "postmortem.py"))])
ABOVE = ("clustersdk.widgets", "clustersdk.magics", "clustersdk.cells", "clustersdk.cli",
         "clustersdk.doctor", "clustersdk.demo", "clustersdk.__main__",
         "IPython", "ipywidgets", "bqplot", "jinja2")


def imported_names(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement of ``path`` names (at any depth: inside functions
    and under ``TYPE_CHECKING`` too), with its line; ``from a import b`` names ``a`` and
    ``a.b``."""
    return imported_names_of(path.read_text(encoding="utf-8"), path)


def imported_names_of(source: str, path: Path) -> list[tuple[int, str]]:
    """:func:`imported_names` of ``source``, as if it were the file at ``path``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1]  # a package's __init__ is in its own package too
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_the_client_api_imports_no_presentation_and_not_the_doctor():
    assert len(CLIENT) >= 15  # cluster/*, job, client, spec, registry, hooks, postmortem
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}" for path in CLIENT
             for line, name in imported_names(path)
             if any(name == above or name.startswith(above + ".") for above in ABOVE)]
    assert wrong == []


def test_imported_names_sees_relative_imports_inside_functions():
    # the check above must be able to fail: a relative import in a method is caught
    probe = ROOT / "clustersdk" / "cluster" / "base.py"  # only its path is used
    names = [name for _, name in imported_names_of(
        "class C:\n    def f(self):\n        from ..widgets import console\n", probe)]
    assert names == ["clustersdk.widgets", "clustersdk.widgets.console"]


def test_using_cluster_and_job_loads_no_presentation():
    code = ("import sys, clustersdk.cluster.base, clustersdk.job\n"
            "print([m for m in sys.modules if m.split('.')[:2] in (['clustersdk', 'widgets'], "
            "['clustersdk', 'doctor'], ['clustersdk', 'magics'], ['clustersdk', 'cli'])])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
