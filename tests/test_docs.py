"""The documentation site: it builds with warnings as errors, its internal links and
anchors resolve, and it has the guide, the API reference and every tutorial notebook.
The README stays short and true to the docs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from clustersdk import options

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDE = [
    "launching",
    "checkpoints",
    "model-parallel",
    "data",
    "scripts",
    "sharing",
    "multi-node",
    "team-cluster",
    "deploy-systemd-kubernetes",
    "security",
    "faults",
    "live",
    "jupyterlab",
    "cli",
    "rest-api",
    "monitoring",
]
API = ["client", "context", "script", "errors", "options", "models", "integrations", "rest"]
PAGES = [
    "index",
    "getting-started",
    "install",
    "concepts",
    "coming-from",
    "troubleshooting",
    "architecture",
    "benchmarks",
]


class Page(HTMLParser):
    """The ids a page defines and the relative URLs it points at (href, src)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and (name == "id" or tag == "a"):
                self.ids.add(value)
            elif (
                name in ("href", "src")
                and not urlsplit(value).scheme
                and not value.startswith("//")
            ):
                self.urls.append(value)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.environ.get("CI"):
        pytest.importorskip("sphinx", reason="the docs extra: pip install '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(out / ".doctrees"),
            str(DOCS),
            str(out / "html"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"sphinx-build failed:\n{done.stdout}\n{done.stderr}"
    assert not done.stderr.strip(), done.stderr  # -q: warnings only, and -W made them errors
    print(f"docs built in {time.monotonic() - started:.1f} s")
    return out / "html"


def pages(site: Path) -> dict[Path, Page]:
    parsed = {}
    for path in site.rglob("*.html"):
        if "_static" in path.relative_to(site).parts:  # the theme's templates, not pages
            continue
        page = Page()
        page.feed(path.read_text(encoding="utf-8"))
        parsed[path] = page
    return parsed


@pytest.mark.slow
def test_the_site_has_the_guide_the_api_reference_and_every_tutorial(site):
    for name in GUIDE:
        assert (site / "guide" / f"{name}.html").is_file(), name
    for name in API:
        assert (site / "api" / f"{name}.html").is_file(), name
    for name in PAGES:
        assert (site / f"{name}.html").is_file(), name
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 9
    for stem in notebooks:
        html = (site / "tutorials" / f"{stem}.html").read_text(encoding="utf-8")
        assert 'class="cell_output' in html, f"{stem}: rendered without its outputs"
    index = (site / "tutorials" / "index.html").read_text(encoding="utf-8")
    for stem in notebooks:  # the toctree's glob picks up every notebook
        assert f'href="{stem}.html"' in index, stem


@pytest.mark.slow
def test_every_internal_link_and_anchor_resolves(site):
    parsed = pages(site)
    broken = []
    for path, page in parsed.items():
        for url in page.urls:
            parts = urlsplit(url)
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(site)}: {url} (no such file)")
            elif (
                parts.fragment
                and target.suffix == ".html"
                and unquote(parts.fragment) not in parsed[target].ids
            ):
                broken.append(f"{path.relative_to(site)}: {url} (no such anchor)")
    assert not broken, "\n".join(broken)
    assert sum(len(p.urls) for p in parsed.values()) > 1000  # the check saw the site


@pytest.mark.slow
def test_the_reference_renders_every_launch_option_and_rest_route(site):
    text = (site / "api" / "options.html").read_text(encoding="utf-8")
    for option in options.OPTIONS:
        assert f'<span class="pre">{option.name}</span>' in text, option.name
    rest = (site / "api" / "rest.html").read_text(encoding="utf-8")
    import yaml

    spec = yaml.safe_load((ROOT / "extension" / "jupyter_clustersdk" / "openapi.yaml").read_text())
    for route, item in spec["paths"].items():
        for method in ("get", "post"):
            if method in item:
                assert f"{method.upper()} {route}" in rest, (method, route)
    launch = (site / "api" / "client.html").read_text(encoding="utf-8")
    assert 'href="../guide/faults.html"' in launch  # launch's docstring links to the guide


def test_the_readme_is_short_and_its_commands_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    dev = (ROOT / "dev").read_text()
    for command in re.findall(r"^\./dev (\w+)", readme, re.M):
        assert re.search(rf"^\s+{command}\)", dev, re.M), f"./dev {command} is not a command"
    assert "./dev docs" in readme
    for picture in re.findall(r"\]\((docs/[^)]+\.png)\)", readme):
        assert (ROOT / picture).is_file(), picture


@pytest.mark.slow
def test_the_lists_the_docs_show_are_the_codes(site):
    """The errors, magics, job states and REST routes are rendered from the code (docs/_ext/):
    each page shows every one of them."""
    import inspect

    import yaml

    import clustersdk
    from clustersdk import errors, status
    from clustersdk.magics import ClusterMagics

    errors_page = (site / "api" / "errors.html").read_text(encoding="utf-8")
    for name, value in vars(errors).items():
        if inspect.isclass(value) and issubclass(value, errors.ClusterSDKError):
            assert name in clustersdk.__all__, f"clustersdk does not export {name}"
            assert f'id="clustersdk.{name}"' in errors_page, name
    magics = (site / "guide" / "jupyterlab.html").read_text(encoding="utf-8")
    for kind, prefix in (("line", "%"), ("cell", "%%")):
        for name in ClusterMagics.magics[kind]:
            assert f'<span class="pre">{prefix}{name}</span>' in magics, prefix + name
    concepts = (site / "concepts.html").read_text(encoding="utf-8")
    for state in status.JobStatus:
        assert f'<span class="pre">{state.name}</span>' in concepts, state.name
    routes = (site / "guide" / "rest-api.html").read_text(encoding="utf-8")
    spec = yaml.safe_load((ROOT / "extension" / "jupyter_clustersdk" / "openapi.yaml").read_text())
    for route, item in spec["paths"].items():
        for method in ("get", "post"):
            if method in item:
                assert f"{method.upper()} {route}" in routes, (method, route)


def test_user_pages_do_not_narrate_the_tests():
    """How a feature is tested belongs in architecture.md (and benchmarks.md, which says
    how to measure again), not in the pages a user reads."""
    developer = {DOCS / "architecture.md", DOCS / "benchmarks.md"}
    found = []
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        if page in developer or "_build" in page.parts:
            continue
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"`tests/|browser test|How it is tested", line):
                found.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_install_page_lists_every_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    table = (DOCS / "install.md").read_text(encoding="utf-8")
    missing = [name for name in extras if f"| `{name}` |" not in table]
    assert not missing, f"docs/install.md's table of extras lacks {missing}"
