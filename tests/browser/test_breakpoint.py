"""A breakpoint's pdb console in a real JupyterLab, in headless Chromium: a notebook launches
a ``debug=True`` job that calls ``ctx.breakpoint()``; its dashboard opens the console, the
test types ``p x`` into it and sees the value, types ``c`` and sees the job finish. A
screenshot goes to test-output/browser/breakpoint-console.png."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from .conftest import save_for_docs

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ".widget-vbox.clustersdk-job"
CONSOLE = ".clustersdk-console"

CELLS = [
    "import clustersdk as cs\ncluster = cs.Cluster.local(workers=2)",
    "def train(ctx):\n"
    "    for step, _ in ctx.loop(None, steps=40):\n"
    "        if step == 3:\n"
    "            x = step * 7 + 0.5\n"
    "            ctx.breakpoint(ranks=[0])\n"
    "    return ctx.step\n"
    "\n"
    "job = cluster.launch(train, world_size=2, debug=True, name='debug-in-lab')\n"
    "job",
]


@pytest.fixture
def own_code(monkeypatch):
    """The Jupyter server, its kernels and their Dask workers import this checkout's
    clustersdk (the environment reaches all of them)."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(dict.fromkeys(paths)))


def notebook(path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {
                        "cell_type": "code",
                        "execution_count": None,
                        "id": f"c{i}",
                        "metadata": {},
                        "outputs": [],
                        "source": source,
                    }
                    for i, source in enumerate(CELLS)
                ],
                "metadata": {
                    "kernelspec": {
                        "display_name": "Python 3 (ipykernel)",
                        "language": "python",
                        "name": "python3",
                    }
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_the_breakpoint_console_works_in_jupyterlab(own_code, browser, jupyterlab, output_dir):
    notebook(jupyterlab.root / "debug.ipynb")
    page = browser
    page.set_default_timeout(60_000)
    page.goto(f"{jupyterlab.url}/doc/tree/debug.ipynb?token={jupyterlab.token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell")
    page.wait_for_function("document.body.innerText.includes('(ipykernel) | Idle')")
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

    dashboard = page.locator(DASHBOARD, has_text="Job debug-in-lab")
    dashboard.wait_for(timeout=120_000)
    badge = dashboard.locator(".clustersdk-badge")
    wait_until(lambda: badge.text_content() == "PAUSED", 120, "the breakpoint to pause the job")
    console = dashboard.locator(CONSOLE)
    console.wait_for(timeout=60_000)  # the dashboard shows the console once a session opens
    transcript = console.locator(".clustersdk-console-transcript")
    wait_until(lambda: "(Pdb rank 0)" in (transcript.text_content() or ""), 60, "the pdb prompt")

    line = console.locator("input")
    line.fill("p x")
    line.press("Enter")
    wait_until(lambda: "p x\n21.5" in (transcript.text_content() or ""), 60, "x's value")
    assert badge.text_content() == "PAUSED"
    console.scroll_into_view_if_needed()
    page.screenshot(path=str(output_dir / "breakpoint-console.png"))
    save_for_docs(output_dir / "breakpoint-console.png")

    line.fill("c")
    console.get_by_role("button", name="Send").click()
    wait_until(lambda: badge.text_content() == "FINISHED", 120, "the job to finish")
    wait_until(
        lambda: "(continuing: the job runs on)" in transcript.text_content(),
        30,
        "the transcript's end",
    )
