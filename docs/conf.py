"""Sphinx configuration of clustersdk's documentation (``./dev docs`` builds it).

Pages are MyST Markdown; the tutorials are ``notebooks/*.ipynb``, rendered by myst-nb
with the outputs they were saved with (nbval executes them in the test suite); the API
reference comes from the docstrings (autodoc); the REST reference and the table of
launch options, the REST routes, the job states, the magics and the errors are rendered
by the small extensions in ``_ext/`` from ``extension/jupyter_clustersdk/openapi.yaml``,
``clustersdk/options.py``, ``status.py``, ``magics.py`` and ``errors.py``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(DOCS / "_ext"), str(ROOT), str(ROOT / "extension")]

from clustersdk.version import __version__  # noqa: E402 - after the path is set


def _copy_tutorials() -> None:
    """The notebooks live in notebooks/ (where nbval runs them); the site shows copies in
    tutorials/ (git ignores them), every notebook there, so new ones appear by themselves."""
    target = DOCS / "tutorials"
    wanted = {p.name: p for p in (ROOT / "notebooks").glob("*.ipynb")}
    for old in target.glob("*.ipynb"):
        if old.name not in wanted:
            old.unlink()
    for name, source in wanted.items():
        copy = target / name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            shutil.copyfile(source, copy)


_copy_tutorials()

project = "clustersdk"
copyright = "the clustersdk authors"  # noqa: A001 - Sphinx's name
release = version = __version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "openapi_pages",
    "launch_options",
    "sdk_tables",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store", "**/.ipynb_checkpoints"]
templates_path: list[str] = []

# --- MyST and the notebooks -------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # #some-heading links within and across pages
nb_execution_mode = "off"  # the stored outputs; nbval runs the notebooks in CI
# the dashboards' static HTML, not the widget views (they need a live kernel and a CDN)
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js: dict = {}

# --- the API reference ------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
# transformers takes seconds to import and is needed only for the callback's base class
autodoc_mock_imports = ["transformers"]

# --- the look ---------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"clustersdk {release}"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 7,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_show_sourcelink = False
html_copy_source = False
