"""The JupyterLab extension as it is built and shipped: its TypeScript models' unit tests
(Node's test runner), the wheel that ``python -m build`` makes of a clean checkout (its build
hook builds the lab extension with npm), both extensions enabled where that wheel is
installed, and the dev environment's link to the checkout's build.

``./dev setup`` builds the extension in the checkout (npm packages from the registry); the
wheel tests build their own from a copy of what git tracks. In CI a missing npm fails
these tests, elsewhere it skips them.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from clustersdk.version import __version__

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "extension" / "labextension"
BUILT = ROOT / "extension" / "jupyter_clustersdk" / "labextension"
NAME = "jupyterlab-clustersdk"
DATA = f"share/jupyter/labextensions/{NAME}"
SERVER_CONFIG = "etc/jupyter/jupyter_server_config.d/jupyter_clustersdk.json"
# the packages' files and where the wheel puts them
PACKAGES = {"clustersdk/": "clustersdk/", "extension/jupyter_clustersdk/": "jupyter_clustersdk/"}


def _missing(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (./dev setup builds it with npm)")
    pytest.skip(reason)


def _jupyter(*args: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "jupyter", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert out.returncode == 0, out.stderr
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)  # no colour codes


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points into the checkout or at other
    Jupyter files (PYTHONPATH, JUPYTER_*), or would skip the build hook's npm build."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "SKIP_JUPYTER_BUILDER", "HATCH_JUPYTER_BUILDER_SKIP_NPM")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("JUPYTER")}
    return {**env, **extra}


@dataclass
class Build:
    """What ``python -m build`` made of a clean checkout."""

    source: Path  # the checkout it built, with the lab extension built in it
    files: list[str]  # the checkout's files (relative paths), before the build
    output: str  # everything it printed
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Iterator[Build]:
    """``python -m build`` of a copy of the files git tracks (and new ones it does not
    ignore): no node_modules, no lab extension build, as in a fresh clone. One build (npm
    packages and all, about a minute) for the module's tests."""
    if not shutil.which("npm"):
        _missing("npm is not installed: the wheel's build hook needs it")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    root = tmp_path_factory.mktemp("wheel")  # the working directory: not the checkout's build/
    if (
        subprocess.run(
            [sys.executable, "-m", "build", "--version"], cwd=root, capture_output=True
        ).returncode
        != 0
    ):
        _missing("the `build` package is missing (the test extra has it: ./dev setup)")
    source = root / "clustersdk"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    files = [n for n in listed.split("\0") if n and (ROOT / n).is_file()]  # not deleted ones
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    run = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(root / "dist"), str(source)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=540,
        env=_clean_env(),
        cwd=root,
    )
    if run.returncode != 0:
        pytest.fail(f"python -m build failed:\n{run.stdout[-8000:]}")
    (sdist,) = (root / "dist").glob("clustersdk-*.tar.gz")
    (wheel,) = (root / "dist").glob("clustersdk-*.whl")
    yield Build(source, files, run.stdout, sdist, wheel)
    shutil.rmtree(source)  # (its node_modules hold some 450 MB)


def test_typescript_models_pass_their_unit_tests():
    if not (SOURCE / "node_modules" / "typescript").is_dir() or not shutil.which("npm"):
        _missing("the lab extension's npm packages are not installed")
    run = subprocess.run(
        ["npm", "test", "--silent"], cwd=SOURCE, capture_output=True, text=True, timeout=300
    )
    print(run.stdout[-4000:])
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    passed = int(re.search(r"^# pass (\d+)$", run.stdout, re.M).group(1))
    failed = int(re.search(r"^# fail (\d+)$", run.stdout, re.M).group(1))
    assert failed == 0 and passed >= 20


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_python_m_build_of_a_clean_checkout_builds_the_lab_extension_without_a_warning(built):
    print(built.output[-3000:])
    assert built.wheel.name == f"clustersdk-{__version__}-py3-none-any.whl"
    # the hook built the extension with npm (a clean checkout has no build to reuse)...
    assert "Installing build dependencies with npm" in built.output
    assert "Rspack" in built.output and "compiled successfully" in built.output
    # ...quietly: no deprecation, no "would be ignored", no warning of any kind
    noisy = [
        line
        for line in built.output.splitlines()
        if re.search(r"(?i)warn|deprecat|would be ignored", line)
    ]
    assert not noisy, "\n".join(noisy)
    # npm installed what package-lock.json says, and left it as it was
    lock = "extension/labextension/package-lock.json"
    assert (built.source / lock).read_bytes() == (ROOT / lock).read_bytes()
    # the sdist carries the build, so a wheel made from it needs no npm
    with tarfile.open(built.sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert "extension/jupyter_clustersdk/labextension/package.json" in names
    assert "extension/jupyter_clustersdk/labextension/static/style.js" in names
    assert "extension/labextension/package-lock.json" in names
    assert not [n for n in names if "node_modules" in n]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_holds_both_packages_with_their_files_and_both_extensions(built):
    with zipfile.ZipFile(built.wheel) as zf:
        names = set(zf.namelist())
        data = f"clustersdk-{__version__}.data/data/"
        metadata = email.message_from_bytes(zf.read(f"clustersdk-{__version__}.dist-info/METADATA"))
        entry_points = zf.read(f"clustersdk-{__version__}.dist-info/entry_points.txt").decode()
        config = json.loads(zf.read(data + SERVER_CONFIG))
        package = json.loads(zf.read(f"{data}{DATA}/package.json"))
        licence = zf.read(f"clustersdk-{__version__}.dist-info/licenses/LICENSE")

    # every file of both packages (modules, clustersdk.yaml, the widgets' templates,
    # openapi.yaml...), and nothing else: not a second copy of the lab extension's build
    expected = {
        to + name[len(frm) :]
        for name in built.files
        for frm, to in PACKAGES.items()
        if name.startswith(frm)
    }
    shipped = {n for n in names if n.startswith(tuple(PACKAGES.values()))}
    assert shipped == expected
    for name in (
        "clustersdk/clustersdk.yaml",
        "clustersdk/widgets/templates/job.html.j2",
        "jupyter_clustersdk/openapi.yaml",
        "jupyter_clustersdk/app.py",
        "clustersdk/py.typed",  # PEP 561: type checkers read the package's hints
    ):
        assert name in shipped

    # the data files: every file of the lab extension's build, and the server's config
    out = built.source / BUILT.relative_to(ROOT)
    shared = sorted(n[len(data) :] for n in names if n.startswith(data))
    assert shared == sorted(
        [SERVER_CONFIG] + [f"{DATA}/{p.relative_to(out)}" for p in out.rglob("*") if p.is_file()]
    )
    assert f"{DATA}/{package['jupyterlab']['_build']['load']}" in shared  # its entry point
    assert f"{DATA}/schemas/{NAME}/plugin.json" in shared  # the settings entry
    assert f"{DATA}/install.json" in shared  # "(python, clustersdk)" in the listing
    assert config == {"ServerApp": {"jpserver_extensions": {"jupyter_clustersdk": True}}}

    # the metadata: an SPDX licence and its file (the Apache License's text), classifiers,
    # tqdm only in an extra, the version of clustersdk/version.py (the lab extension's
    # too), the command
    assert metadata["License-Expression"] == "Apache-2.0" and "License" not in metadata
    assert metadata["License-File"] == "LICENSE"
    assert licence == (ROOT / "LICENSE").read_bytes() and b"Apache License" in licence
    assert b"Version 2.0, January 2004" in licence
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3.10" in classifiers
    assert "Typing :: Typed" in classifiers
    assert not [
        r for r in metadata.get_all("Requires-Dist") if r.startswith("tqdm") and "extra" not in r
    ]
    assert metadata["Version"] == package["version"] == __version__
    assert any(r.startswith("torch") for r in metadata.get_all("Requires-Dist"))
    assert "clustersdk = clustersdk.__main__:main" in entry_points


@dataclass
class Venv:
    """A fresh venv with the built wheel installed, its dependencies from this environment."""

    path: Path
    site: Path  # its site-packages, where the wheel went
    home: Path  # its HOME: no user-level Jupyter config or extensions
    hidden: list[str]  # the modules that only extras install: hidden with run(..., bare=True)

    def run(self, *args: str, bare: bool = False, timeout: float = 120) -> str:
        """``python *args`` there (``bare``: as if installed without extras); its output."""
        out = subprocess.run(
            [str(self.path / "bin" / "python"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(bare),
            cwd=self.home,
        )  # (not the checkout: `python -c` imports from cwd)
        assert out.returncode == 0, out.stdout + out.stderr
        return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)  # no colour codes

    def env(self, bare: bool = False) -> dict[str, str]:
        return _clean_env(HOME=str(self.home), **({HIDE: ",".join(self.hidden)} if bare else {}))


HIDE = "CLUSTERSDK_TEST_HIDE"
# a .pth line runs this at start-up: the modules named in $CLUSTERSDK_TEST_HIDE can't be imported
HIDER = f"""import os, sys
class _Hidden:
    names = set(filter(None, os.environ.get({HIDE!r}, "").split(",")))
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by the test)", name=name)
sys.meta_path.insert(0, _Hidden())
"""


def _extras_only(wheel: Path) -> list[str]:
    """The top-level modules of the distributions that only the wheel's extras require:
    neither a dependency nor Jupyter Server (which a user installs for JupyterLab) needs
    them, directly or not. (prometheus_client is not among them: Jupyter Server requires it.)"""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with zipfile.ZipFile(wheel) as zf:
        meta = email.message_from_bytes(zf.read(f"clustersdk-{__version__}.dist-info/METADATA"))
    wants = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    core = [r.name for r in wants if not r.marker]
    extras = {canonicalize_name(r.name) for r in wants if r.marker} - {"clustersdk"}

    def closure(names: list[str]) -> set[str]:
        seen: set[str] = set()
        while names:
            name = canonicalize_name(names.pop())
            if name in seen:
                continue
            seen.add(name)
            try:
                requires = metadata.requires(name) or []
            except metadata.PackageNotFoundError:
                continue
            wanted = map(Requirement, requires)
            names += [r.name for r in wanted if not r.marker or r.marker.evaluate({"extra": ""})]
        return seen

    needed = closure([*core, "jupyter_server"])
    modules = {
        module
        for module, dists in metadata.packages_distributions().items()
        if all(canonicalize_name(d) in extras - needed for d in dists)
    }
    return sorted(m for m in modules if m.isidentifier())


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> Venv:
    root = tmp_path_factory.mktemp("venv")
    path = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120
    )
    python = str(path / "bin" / "python")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(built.wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # Its dependencies (torch, jupyter_server, jupyterlab...) come from this environment, not
    # a download: a path line, so this environment's .pth files (its editable install of
    # the checkout) do not run there.
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site) / "_test_dependencies.pth").write_text("\n".join(ours) + "\n")
    (Path(site) / "_test_hider.py").write_text(HIDER)
    (Path(site) / "_test_hider.pth").write_text("import _test_hider\n")
    home = root / "home"
    home.mkdir()
    return Venv(path, Path(site), home, _extras_only(built.wheel))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_installed_in_a_fresh_venv_both_extensions_are_listed_enabled(venv):
    # both packages come from the wheel
    where = venv.run(
        "-c",
        "import clustersdk, jupyter_clustersdk as j; print(clustersdk.__file__)\nprint(j.__file__)",
    )
    assert all(path.startswith(str(venv.site)) for path in where.split()), where

    # `jupyter labextension list` (the module it runs, in the fresh venv's Python)
    listing = venv.run("-m", "jupyterlab.labextensions", "list")
    section = listing.split(f"{venv.path / 'share' / 'jupyter' / 'labextensions'}\n", 1)[1]
    assert re.search(
        rf"^\s+{NAME} v{re.escape(__version__)} enabled\s+OK \(python, clustersdk\)$", section, re.M
    ), listing

    # `jupyter server extension list`: enabled by the wheel's config file, and importable
    listing = venv.run("-m", "jupyter_server.extension.serverextension", "list")
    section = listing.split(f"Config dir: {venv.path / 'etc' / 'jupyter'}\n", 1)[1]
    section = section.split("Config dir:")[0]
    assert re.search(r"^\s+jupyter_clustersdk enabled$", section, re.M), listing
    version = re.escape(__version__)
    assert re.search(rf"^\s+jupyter_clustersdk {version} OK$", section, re.M), listing


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_installed_without_extras_it_imports_and_a_jupyter_server_loads_it_cleanly(venv):
    """A plain ``pip install clustersdk`` (the extras' modules hidden) beside a Jupyter Server
    the user installed: the SDK imports, the demo's progress degrades, the server
    extension loads without an error or a traceback."""
    assert "tqdm" in venv.hidden and "paramiko" in venv.hidden and "ipywidgets" in venv.hidden
    out = venv.run(
        "-c",
        "import clustersdk as cs, clustersdk.demo as d\n"
        "try:\n    import tqdm\nexcept ImportError:\n    print('no tqdm')\n"
        "print(cs.Cluster.__name__, cs.JobSpec.__name__)\n"
        "bar = d._bar(total=3, desc='demo'); bar.update(3); bar.close()",
        bare=True,
    )
    assert "no tqdm\nCluster JobSpec" in out, out
    assert "pip install 'clustersdk[demo]' for a progress bar" in out and "step 3/3" in out

    server = subprocess.Popen(
        [
            str(venv.path / "bin" / "python"),
            "-m",
            "jupyter_server",
            "--no-browser",
            "--allow-root",  # (a container's CI runs as root)
            "--ServerApp.port=0",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.root_dir={venv.home}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=venv.env(bare=True),
        cwd=venv.home,
    )
    lines = []
    try:
        for line in server.stdout:  # until it serves (or ends)
            lines.append(line)
            if "is running at" in line or "http://127.0.0.1:" in line:
                break
    finally:
        server.terminate()
        rest, _ = server.communicate(timeout=60)
    log = "".join(lines) + rest
    assert "jupyter_clustersdk | extension was successfully loaded" in log, log
    assert "clustersdk: serving" in log, log
    # (Jupyter logs its URL banner and a SIGTERM at level C: not errors)
    bad = [
        line
        for line in log.splitlines()
        if line.startswith("[E ")
        or "Traceback" in line
        or (line.startswith("[W ") and "clustersdk" in line)
    ]
    assert not bad, log


def test_the_dev_environment_shows_both_extensions_enabled():
    """./dev's editable install enables the server extension; ./dev links the checkout's lab
    extension build into .venv in place of the install's copy (a rebuild shows at once)."""
    if not (BUILT / "package.json").is_file():
        _missing(f"the lab extension is not built ({BUILT} is missing)")
    link = Path(sys.prefix) / DATA
    assert link.is_symlink() and (link / "package.json").is_file(), f"{link}: not ./dev's link"
    listing = _jupyter("labextension", "list")
    section = listing.split(f"{Path(sys.prefix) / 'share' / 'jupyter' / 'labextensions'}\n", 1)[1]
    assert re.search(rf"{NAME} v{re.escape(__version__)} enabled\s+OK", section), listing
    listing = _jupyter("server", "extension", "list")
    section = listing.split(f"Config dir: {Path(sys.prefix) / 'etc' / 'jupyter'}\n", 1)[1]
    section = section.split("Config dir:")[0]
    assert re.search(r"^\s+jupyter_clustersdk enabled$", section, re.M), listing


@pytest.fixture
def without_prometheus(monkeypatch):
    """prometheus_client as if it were not installed, for the extension: Jupyter Server
    itself imports it (it requires it), so only what the extension imports is hidden."""
    monkeypatch.setitem(sys.modules, "prometheus_client.exposition", None)


async def test_without_prometheus_client_only_the_metrics_route_is_off(
    without_prometheus, capfd, jp_fetch
):
    said = capfd.readouterr().err
    hint = "pip install 'clustersdk[server]'"
    [line] = [line for line in said.splitlines() if "prometheus_client is not installed" in line]
    assert "/clustersdk/metrics is off" in line and hint in line and "Traceback" not in said
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("clustersdk", "metrics")
    assert info.value.code == 503
    body = json.loads(info.value.response.body)
    assert body["error"] == "metrics_unavailable" and hint in body["message"]
    overview = json.loads((await jp_fetch("clustersdk", "api", "overview")).body)  # the rest works
    assert "clusters" in overview
