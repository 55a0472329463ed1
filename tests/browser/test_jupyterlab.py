"""The quickstart notebook in a real JupyterLab, in headless Chromium: run all
cells, watch the loss chart grow, pause the job by its button, keep a screenshot."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from .conftest import save_for_docs

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "01-quickstart.ipynb"
DASHBOARD = ".widget-vbox.clustersdk-job"  # the live widget, not its static HTML fallback

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def copy_without_outputs(src: Path, dst: Path) -> None:
    """Run the notebook afresh: no saved outputs or widget state to mistake for live ones."""
    nb = json.loads(src.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    nb["metadata"].pop("widgets", None)
    dst.write_text(json.dumps(nb))


def last_step_on_chart(dashboard) -> float:
    """The largest step on the loss chart's x axis, read from its tick labels."""
    axis = dashboard.locator(".bqplot").first.locator("g.axis").first
    labels = axis.locator("text").all_text_contents()
    values = []
    for label in labels:  # SI-formatted: 500, 1.5k, 20k
        m = re.fullmatch(r"([\d.]+)([kM]?)", label.strip())
        if m:
            values.append(float(m[1]) * {"": 1, "k": 1e3, "M": 1e6}[m[2]])
    return max(values, default=0.0)


def vertices(dashboard) -> int:
    """How many points rank 0's loss line has, from its SVG path."""
    path = dashboard.locator(".bqplot").first.locator("path.line").first.get_attribute("d") or ""
    return path.count("L") + path.count("M")


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_quickstart_runs_in_jupyterlab_and_pause_works(browser, jupyterlab, output_dir):
    copy_without_outputs(NOTEBOOK, jupyterlab.root / NOTEBOOK.name)
    page = browser
    page.set_default_timeout(60_000)
    page.goto(f"{jupyterlab.url}/doc/tree/{NOTEBOOK.name}?token={jupyterlab.token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell")
    # the status bar says so once the kernel has started and answered
    page.wait_for_function(
        "document.querySelector('.jp-StatusBar-Widget, #jp-main-statusbar')"
        " && document.body.innerText.includes('(ipykernel) | Idle')"
    )

    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

    # the last cell's job: the one left running for the reader to play with
    dashboard = page.locator(DASHBOARD, has_text="Job playground")
    dashboard.wait_for(timeout=90_000)
    badge = dashboard.locator(".clustersdk-badge")
    wait_until(lambda: badge.text_content() == "RUNNING", 60, "the playground job to run")
    wait_until(lambda: last_step_on_chart(dashboard) > 0, 30, "the first points on the loss chart")
    first_step, first_points = last_step_on_chart(dashboard), vertices(dashboard)
    wait_until(
        lambda: last_step_on_chart(dashboard) > first_step, 10, "the loss chart to gain steps"
    )
    wait_until(lambda: last_step_on_chart(dashboard) >= 1500, 60, "a run worth a screenshot")
    assert vertices(dashboard) >= min(first_points, 100), "the loss line lost its points"
    # the first job's dashboard, finished, shows its whole run
    done = page.locator(DASHBOARD, has_text="Job quickstart").first
    assert done.locator(".clustersdk-badge").text_content() == "FINISHED"
    assert "step 800" in done.text_content()

    dashboard.get_by_role("button", name="Pause").click()
    wait_until(lambda: badge.text_content() == "PAUSED", 30, "the PAUSED badge")
    wait_until(lambda: "paused before step" in dashboard.text_content(), 30, "the pause message")
    paused_at = last_step_on_chart(dashboard)
    assert dashboard.get_by_role("button", name="Resume").is_enabled()
    assert not dashboard.get_by_role("button", name="Pause").is_enabled()
    # where its time went: nearly all of it in steps so far
    goodput = dashboard.locator(".clustersdk-goodput")
    assert re.match(r"goodput \d+% of ", goodput.text_content())
    assert dashboard.locator(".clustersdk-goodput-productive").count() == 1

    dashboard.scroll_into_view_if_needed()
    page.mouse.move(1, 1)  # no chart toolbar from a hovering pointer in the picture
    time.sleep(0.5)  # let the charts finish their last redraw
    page.screenshot(path=str(output_dir / "jupyterlab-quickstart.png"))
    dashboard.screenshot(path=str(output_dir / "job-dashboard-paused.png"))
    save_for_docs(output_dir / "jupyterlab-quickstart.png")
    save_for_docs(output_dir / "job-dashboard-paused.png")
    assert last_step_on_chart(dashboard) == paused_at

    dashboard.get_by_role("button", name="Resume").click()
    wait_until(lambda: badge.text_content() == "RUNNING", 30, "the job to run again")
    # the record read on its resume counts the pause
    wait_until(lambda: "paused" in goodput.text_content(), 30, "the pause in the goodput line")
    dashboard.get_by_role("button", name="Stop").click()
    wait_until(lambda: badge.text_content() == "STOPPED", 30, "the STOPPED badge")
