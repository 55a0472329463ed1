"""Importing is cheap: the package root, the pure modules and the server extension load
neither torch nor (for the pure ones) Dask. Each check runs in a fresh interpreter.

And the tiers hold, read from the source (imports inside functions count;
``if TYPE_CHECKING:`` imports, for annotations only, do not): the runtime (in the
workers) and the control plane (in the scheduler) never import each other, the base
tier that every tier shares imports nothing above it, and no test module imports
another test module; the client API imports no presentation and not the doctor.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
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
    "clustersdk.signals",
    "clustersdk.checkpoint_files",
    "clustersdk.checkpoint_files.remote",
    "clustersdk.control.anomalies",
    "clustersdk.control.access",
    "clustersdk.security.identity",
    "clustersdk.client",
    "clustersdk.script",  # imported by training scripts: cheap, and no torch of its own
]


def loaded_after(statement: str) -> set[str]:
    code = (
        f"import sys, json\n{statement}\n"
        f"print(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
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


# --- the tiers, read from the source ------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def import_statements(
    source: str, path: Path, root: Path = ROOT
) -> Iterator[tuple[int, str, list[str] | None, bool]]:
    """``(line, module, names, for_annotations)`` for each import of ``source`` (read as the
    file at ``path`` under ``root``), at any depth: ``names`` is None for ``import module``,
    what ``from module import ...`` takes otherwise; ``for_annotations``: the import is
    under ``if TYPE_CHECKING:``. Relative imports are resolved."""
    tree = ast.parse(source)
    annotations_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts[:-1]  # a package's __init__ is in its own package too
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None, id(node) in annotations_only
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield (
                node.lineno,
                module,
                [alias.name for alias in node.names],
                id(node) in annotations_only,
            )


# the client tier never imports the tiers above it -------------------------------------------
CLIENT = sorted(
    [
        *(ROOT / "clustersdk" / "cluster").glob("*.py"),
        *(
            ROOT / "clustersdk" / name
            for name in (
                "job.py",
                "client.py",
                "spec.py",
                "registry.py",
                "hooks.py",
                "postmortem.py",
            )
        ),
    ]
)
ABOVE = (
    "clustersdk.widgets",
    "clustersdk.magics",
    "clustersdk.cells",
    "clustersdk.cli",
    "clustersdk.doctor",
    "clustersdk.demo",
    "clustersdk.__main__",
    "IPython",
    "ipywidgets",
    "bqplot",
    "jinja2",
)


def imported_names(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement of ``path`` names (at any depth: inside functions
    and under ``TYPE_CHECKING`` too), with its line; ``from a import b`` names ``a`` and
    ``a.b``."""
    return imported_names_of(path.read_text(encoding="utf-8"), path)


def imported_names_of(source: str, path: Path) -> list[tuple[int, str]]:
    """:func:`imported_names` of ``source``, as if it were the file at ``path``."""
    found = []
    for line, module, names, _annotations in import_statements(source, path):
        found.append((line, module))
        found += [(line, f"{module}.{name}") for name in names or ()]
    return found


def test_the_client_api_imports_no_presentation_and_not_the_doctor():
    assert len(CLIENT) >= 15  # cluster/*, job, client, spec, registry, hooks, postmortem
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in CLIENT
        for line, name in imported_names(path)
        if any(name == above or name.startswith(above + ".") for above in ABOVE)
    ]
    assert wrong == []


def test_imported_names_sees_relative_imports_inside_functions():
    # the check above must be able to fail: a relative import in a method is caught
    probe = ROOT / "clustersdk" / "cluster" / "base.py"  # only its path is used
    names = [
        name
        for _, name in imported_names_of(
            "class C:\n    def f(self):\n        from ..widgets import console\n", probe
        )
    ]
    assert names == ["clustersdk.widgets", "clustersdk.widgets.console"]


def test_using_cluster_and_job_loads_no_presentation():
    code = (
        "import sys, clustersdk.cluster.base, clustersdk.job\n"
        "print([m for m in sys.modules if m.split('.')[:2] in (['clustersdk', 'widgets'], "
        "['clustersdk', 'doctor'], ['clustersdk', 'magics'], ['clustersdk', 'cli'])])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


# the runtime and the control plane never import each other; the base tier nothing above it
#: the base tier: pure rules every tier may import (modules, or packages with all they hold)
BASE = (
    "clustersdk.protocol",
    "clustersdk.status",
    "clustersdk.errors",
    "clustersdk.layout",
    "clustersdk.config",
    "clustersdk.hparams",
    "clustersdk.diagnosis",
    "clustersdk.signals",
    "clustersdk.checkpoint_files",
    "clustersdk.options",
    "clustersdk.network",
    "clustersdk.cpus",
    "clustersdk.version",
    "clustersdk.security",
)


def module_of(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: str, root: Path = ROOT) -> dict[str, Path]:
    """Every module of ``package`` (a dotted name under ``root``), by name."""
    top = root.joinpath(*package.split("."))
    paths = sorted(top.rglob("*.py")) if top.is_dir() else [top.with_suffix(".py")]
    return {module_of(p, root): p for p in paths if p.exists()}


def imported(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """The modules ``path`` imports (``from m import name`` counts as ``m.name`` when that
    is a module of ``known``, else as ``m``), leaving out what it imports only under
    ``if TYPE_CHECKING:``."""
    found = set()
    for _line, module, names, for_annotations in import_statements(
        path.read_text(encoding="utf-8"), path, root
    ):
        if for_annotations:
            continue
        if names is None:
            found.add(module)
        for name in names or ():
            found.add(f"{module}.{name}" if f"{module}.{name}" in known else module)
    return found


def offences(package: str, allowed, root: Path = ROOT) -> list[str]:
    """``module -> imported`` for each import of a ``clustersdk`` module by a module of
    ``package`` that ``allowed(imported)`` refuses."""
    known = set(modules("clustersdk", root))
    return sorted(
        f"{name} -> {target}"
        for name, path in modules(package, root).items()
        for target in imported(path, known, root)
        if target.split(".")[0] == "clustersdk" and not allowed(target)
    )


def under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_runtime_imports_only_itself_the_base_tier_and_the_reference_models():
    allowed = (*BASE, "clustersdk.runtime", "clustersdk.models")
    assert offences("clustersdk.runtime", lambda m: under(m, *allowed)) == []


def test_the_control_plane_imports_only_itself_and_the_base_tier():
    assert offences("clustersdk.control", lambda m: under(m, *BASE, "clustersdk.control")) == []


def test_the_reference_models_import_only_themselves_and_the_base_tier():
    assert offences("clustersdk.models", lambda m: under(m, *BASE, "clustersdk.models")) == []


@pytest.mark.parametrize("package", [p for p in BASE if modules(p)])
def test_the_base_tier_imports_only_the_base_tier(package):
    assert offences(package, lambda m: under(m, *BASE)) == []


def test_the_tier_checks_see_imports_inside_functions_but_not_annotation_only_ones(tmp_path):
    """The reading above, on a package made for it (the checks must be able to fail)."""
    for name in (
        "__init__",
        "runtime/__init__",
        "control/__init__",
        "control/journal",
        "control/plugin",
    ):
        (tmp_path / "clustersdk" / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "clustersdk" / f"{name}.py").write_text("")
    (tmp_path / "clustersdk" / "runtime" / "agent.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..control import plugin\n"
        "def f():\n    from ..control.journal import Journal\n"
    )
    assert offences(
        "clustersdk.runtime", lambda m: not under(m, "clustersdk.control"), root=tmp_path
    ) == ["clustersdk.runtime.agent -> clustersdk.control.journal"]


def test_no_test_module_imports_another_test_module():
    known = set(modules("tests"))
    importers = {
        name
        for name, path in modules("tests").items()
        if name.rpartition(".")[2].startswith("test_")
        and any(
            t in known and t.rpartition(".")[2].startswith("test_") for t in imported(path, known)
        )
    }
    assert importers == set()


def test_every_import_of_a_clustersdk_module_names_one_that_exists():
    """An import inside a function runs only when called: a module renamed without it
    fails at that moment (a script job's first step did, once)."""
    known = set(modules("clustersdk")) | set(modules("jupyter_clustersdk", ROOT / "extension"))
    missing = []
    for root, package in ((ROOT, "clustersdk"), (ROOT / "extension", "jupyter_clustersdk")):
        for name, path in modules(package, root).items():
            for line, module, _names, _ in import_statements(
                path.read_text(encoding="utf-8"), path, root
            ):
                if module.split(".")[0] not in ("clustersdk", "jupyter_clustersdk"):
                    continue
                if module not in known:
                    missing.append(f"{name}:{line} imports {module}")
    assert missing == []
