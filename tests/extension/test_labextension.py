"""The JupyterLab extension as it is built and shipped: its TypeScript models' unit tests
(Node's test runner), the prebuilt files inside a real wheel, and JupyterLab seeing it.

It is built by ``./dev setup`` (npm packages from the registry); in CI a missing build
fails these tests, elsewhere it skips them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "extension" / "labextension"
BUILT = ROOT / "extension" / "jupyter_clustersdk" / "labextension"
NAME = "jupyterlab-clustersdk"
DATA = f"share/jupyter/labextensions/{NAME}"


def _missing(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (./dev setup builds it with npm)")
    pytest.skip(reason)


def _jupyter(*args: str, **env: str) -> str:
    out = subprocess.run([sys.executable, "-m", "jupyter", *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)  # no colour codes


def test_typescript_models_pass_their_unit_tests():
    if not (SOURCE / "node_modules" / "typescript").is_dir() or not shutil.which("npm"):
        _missing("the lab extension's npm packages are not installed")
    run = subprocess.run(["npm", "test", "--silent"], cwd=SOURCE, capture_output=True, text=True,
                         timeout=300)
    print(run.stdout[-4000:])
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    passed = int(re.search(r"^# pass (\d+)$", run.stdout, re.M).group(1))
    failed = int(re.search(r"^# fail (\d+)$", run.stdout, re.M).group(1))
    assert failed == 0 and passed >= 20


def test_the_wheel_ships_the_prebuilt_labextension_and_jupyterlab_sees_it(tmp_path):
    if not (BUILT / "package.json").is_file():
        _missing(f"the lab extension is not built ({BUILT} is missing)")
    source = tmp_path / "source"  # setuptools builds in the tree: not in the shared checkout
    source.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "node_modules", "lib", "test-lib", "*.egg-info")
    for name in ("pyproject.toml", "README.md", "clustersdk", "extension"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=skip)
        else:
            shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(source)],
                   check=True, capture_output=True, timeout=300, cwd=tmp_path)
    (wheel,) = tmp_path.glob("clustersdk-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        prefix = next(n.split("/data/")[0] + "/data/" for n in names if "/data/" in n)
        shipped = sorted(n[len(prefix):] for n in names if n.startswith(prefix + DATA))
        package = json.loads(zf.read(f"{prefix}{DATA}/package.json"))
        zf.extractall(tmp_path / "unpacked", [n for n in names if n.startswith(prefix)])
    built = sorted(f"{DATA}/{p.relative_to(BUILT)}" for p in BUILT.rglob("*")
                   if p.is_file() and p.name != ".sources")
    assert shipped == built  # every built file, nothing else
    assert f"{DATA}/{package['jupyterlab']['_build']['load']}" in shipped  # its entry point
    assert f"{DATA}/schemas/{NAME}/plugin.json" in shipped  # the settings entry
    assert not [n for n in names if n.startswith("jupyter_clustersdk/labextension/")]  # no copy

    # JupyterLab finds it where pip puts it, and would load it
    data = tmp_path / "unpacked" / prefix / "share" / "jupyter"
    listing = _jupyter("labextension", "list", JUPYTER_PATH=str(data))
    section = listing.split(f"{data / 'labextensions'}\n", 1)[1].split("\n/", 1)[0]
    assert re.search(rf"{NAME} v0\.1\.0 enabled\s+OK \(python, clustersdk\)", section), listing


def test_the_dev_environment_shows_the_labextension_enabled():
    """./dev links the build into .venv (an editable install ships no data files)."""
    if not (BUILT / "package.json").is_file():
        _missing(f"the lab extension is not built ({BUILT} is missing)")
    listing = _jupyter("labextension", "list")
    section = listing.split(f"{Path(sys.prefix) / 'share' / 'jupyter' / 'labextensions'}\n", 1)[1]
    assert re.search(rf"{NAME} v0\.1\.0 enabled\s+OK", section), listing
