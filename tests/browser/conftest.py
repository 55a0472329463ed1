"""A real JupyterLab server and a headless Chromium driven by Playwright.

Nothing is downloaded: JupyterLab comes from the venv, Chromium from Debian
(``/usr/bin/chromium``, listed in ``.ci/apt-packages``). In CI (``CI`` set) a
missing browser or Playwright fails the test; elsewhere it skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "test-output" / "browser"
# the documentation's pictures of the dashboard and the lab panel: refreshed by every run of
# these tests (committed, so that the docs build without a browser)
DOCS_SCREENSHOTS = ROOT / "docs" / "_static" / "screenshots"
CHROMIUM = os.environ.get("CLUSTERSDK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives JupyterLab in headless Chromium")


def _missing(reason: str):
    if os.environ.get("CI"):
        pytest.fail(
            f"{reason} (CI must run the browser test: see .ci/apt-packages and the test extra)"
        )
    pytest.skip(reason)


@pytest.fixture(scope="session")
def output_dir() -> Path:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return OUTPUT


def save_for_docs(png: Path) -> None:
    """Copy a screenshot the test just took into the documentation's pictures."""
    DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, DOCS_SCREENSHOTS / png.name)


class Lab:
    """A running JupyterLab: its URL, token, root directory, log and the clustersdk state
    directory whose registry its server extension reads."""

    def __init__(
        self, root: Path, port: int, token: str, proc: subprocess.Popen, log: Path, state_dir: Path
    ):
        self.root, self.port, self.token, self.proc, self.log = root, port, token, proc, log
        self.state_dir = state_dir

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, method: str = "GET") -> object:
        req = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab on a free port, token-protected, in a temp root, with its own
    config, data and workspaces; shut down (kernels too) even if the test fails."""
    with lab_server(tmp_path) as lab:
        yield lab


@contextlib.contextmanager
def lab_server(
    tmp_path: Path, config: dict | None = None, env: dict[str, str] | None = None
) -> Iterator[Lab]:
    """The :func:`jupyterlab` fixture's server, with more ``config`` (merged into its
    ``jupyter_server_config.json``) and ``env``. It loads this checkout's build of the
    lab extension where there is one (``./dev setup`` makes it), else the installed one."""
    root, home = tmp_path / "root", tmp_path / "home"
    for d in (
        root,
        home / "config",
        home / "runtime",
        home / "workspaces",
        home / "settings",
        home / "state",
        home / "data" / "labextensions",
    ):
        d.mkdir(parents=True)
    server_config: dict = {
        # nothing reaches out to the internet: no news, no update check, no PyPI extension search
        "LabApp": {
            "news_url": None,
            "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
            "extension_manager": "readonly",
        },
        "ServerApp": {"allow_root": True},  # CI containers run as root
    }
    for section, values in (config or {}).items():
        server_config.setdefault(section, {}).update(values)
    (home / "config" / "jupyter_server_config.json").write_text(json.dumps(server_config))
    # no "get Jupyter news?" prompt over the notebook
    news = home / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    built = ROOT / "extension" / "jupyter_clustersdk" / "labextension"
    if (built / "package.json").exists():  # first on JUPYTER_PATH: it wins over the installed
        (home / "data" / "labextensions" / "jupyterlab-clustersdk").symlink_to(built)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTER_PATH": os.pathsep.join([str(home / "data"), os.environ.get("JUPYTER_PATH", "")]),
        "DASK_CLUSTERSDK__STATE_DIR": str(home / "state"),  # job journals of the notebook's cluster
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    port, token = free_port(), secrets.token_hex(16)
    log = tmp_path / "jupyterlab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter",
                "lab",
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
            ],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    lab = Lab(root, port, token, proc, log, home / "state")
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"JupyterLab exited with {proc.returncode}:\n{lab.log_tail()}")
            try:
                urllib.request.urlopen(f"{lab.url}/api/status", timeout=10).close()
                break
            except urllib.error.HTTPError:  # up (it wants a login): the server answers
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"JupyterLab did not answer within 60 s:\n{lab.log_tail()}"
                    ) from e
                time.sleep(0.2)
        yield lab
    finally:
        _shutdown(lab)


def _shutdown(lab: Lab) -> None:
    """Ask the server to stop (it shuts its kernels down), then make sure: the kernels
    run in sessions of their own, so killing the server's group would miss them."""
    import psutil

    # the kernels and what they started (the notebook's Dask cluster) all run in the root
    started = [
        p
        for p in psutil.process_iter(["cwd"])
        if p.info["cwd"] == str(lab.root) and p.pid not in (lab.proc.pid, os.getpid())
    ]
    try:
        lab.api("/api/shutdown", method="POST")
        lab.proc.wait(timeout=20)
    except Exception:
        pass
    if lab.proc.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(lab.proc.pid, sig)
                lab.proc.wait(timeout=10)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
    for p in started:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(started, timeout=10)


@pytest.fixture
def browser(tmp_path):
    """A headless Debian Chromium page (never a downloaded browser)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (pip install -e '.[test]')")
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        _missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1440, "height": 1100},
            device_scale_factor=1,
        )
        page = context.pages[0] if context.pages else context.new_page()
        try:
            yield page
        finally:
            try:  # what the browser showed last: the first thing to look at when the test fails
                OUTPUT.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(OUTPUT / "last-state.png"), full_page=True, timeout=10_000)
            except Exception:
                pass
            context.close()
