"""Lint, format and types, as CI runs them: ``ruff check``, ``ruff format --check`` and a bare
``mypy`` (strict on the pure modules), all configured in pyproject.toml. A new lint or type
error fails the suite, with the tool's own report in the failure message."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_tool(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from this venv, in the repository root (where pyproject.toml
    configures it)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(
            f"{module} is not installed in {sys.executable}: pip install -e '.[test]' installs it"
        )
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def check(result: subprocess.CompletedProcess[str], hint: str = "") -> None:
    """Fail with the tool's report unless it exited 0."""
    if result.returncode != 0:
        command = " ".join(["python", *map(str, result.args[1:])])
        pytest.fail(
            f"{command} exited {result.returncode}:\n{result.stdout}{result.stderr}{hint}",
            pytrace=False,
        )


def test_ruff_finds_no_lint():
    check(run_tool("ruff", "check", "--no-cache", "."))


def test_ruff_format_would_change_nothing():
    check(
        run_tool("ruff", "format", "--check", "--no-cache", "--output-format", "concise", "."),
        "\n(`ruff format .` formats them; `ruff format --diff .` shows how)",
    )


def test_mypy_finds_no_type_error(tmp_path):
    # a fresh cache, as a CI machine has (and nothing written into the checkout)
    result = run_tool("mypy", "--cache-dir", str(tmp_path / "mypy-cache"))
    check(result)
    assert "no issues found" in result.stdout, result.stdout  # it checked the files given
