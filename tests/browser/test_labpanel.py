"""The GPU clusters side panel in a real JupyterLab, in headless Chromium: a job that a
Python process outside JupyterLab launches shows up, its buttons control it (checked
through the SDK), its panel charts it, the inserted attach code reaches it from a
notebook, and refused actions say why. Screenshots go to test-output/browser/."""

from __future__ import annotations

import json
import pathlib
import re
import tempfile
import time

import pytest

import clustersdk as cs

from ..helpers import wait_for
from ..workloads import ticker
from .conftest import save_for_docs

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SIDEBAR = "#clustersdk-sidebar"
APPEAR_WITHIN = 2.0  # seconds from launch() returning to the job's row in the sidebar


def empty_notebook(path) -> None:
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {
                        "cell_type": "code",
                        "execution_count": None,
                        "id": "first",
                        "metadata": {},
                        "outputs": [],
                        "source": "1 + 1",
                    }
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


def overview_requests(page, seconds: float) -> int:
    """How many overview requests the page makes in ``seconds``."""
    seen: list[str] = []

    def count(request):
        if "/clustersdk/api/overview" in request.url:
            seen.append(request.url)

    page.on("request", count)
    try:
        page.wait_for_timeout(seconds * 1000)
    finally:
        page.remove_listener("request", count)
    return len(seen)


def toast(page, text: str):
    """The notification that contains ``text`` (JupyterLab's toasts)."""
    found = page.locator(".Toastify__toast", has_text=text).first
    found.wait_for(timeout=30_000)
    return found.text_content()


def palette(page, label: str) -> None:
    page.keyboard.press("Control+Shift+c")
    search = page.locator(".lm-CommandPalette-input")
    search.wait_for()
    search.fill(label)
    page.locator(".lm-CommandPalette-item", has_text=label).first.click()


def restart_a_worker(dask_scheduler) -> None:
    """What the scheduler does as a worker its supervisor started again comes back."""
    from clustersdk.control.plugin import PLUGIN_NAME

    restart = json.dumps({"process": "worker-1", "restarts": 1, "after": "died of SIGKILL"})
    dask_scheduler.plugins[PLUGIN_NAME].restarted("worker", "tls://10.0.0.9:4000", restart)


@pytest.fixture
def runs():
    """A short directory for checkpoints: its paths show in the docs' screenshot."""
    with tempfile.TemporaryDirectory(prefix="runs-") as path:
        yield pathlib.Path(path)


def test_sidebar_follows_and_controls_a_job_launched_outside_jupyterlab(
    browser, jupyterlab, output_dir, runs
):
    page = browser
    page.set_default_timeout(60_000)
    empty_notebook(jupyterlab.root / "attach.ipynb")
    page.goto(f"{jupyterlab.url}/lab/tree/attach.ipynb?token={jupyterlab.token}")
    page.wait_for_function("document.body.innerText.includes('(ipykernel) | Idle')")

    # the sidebar, opened from its tab on the left; the status bar item is there too
    tab = page.locator('.lm-TabBar-tab[data-id="clustersdk-sidebar"]')
    tab.click()
    sidebar = page.locator(SIDEBAR)
    sidebar.wait_for()
    sidebar.get_by_text("No cluster yet").wait_for()

    cluster = cs.Cluster.local(workers=2, state_dir=str(jupyterlab.state_dir))
    try:
        sidebar.locator(".jp-clustersdk-cluster", has_text=cluster.scheduler_address).wait_for()
        assert sidebar.locator(".jp-clustersdk-slot").count() == 2
        assert sidebar.locator(".jp-clustersdk-slot-label").all_text_contents() == [
            "CPU slot 0",
            "CPU slot 1",
        ]
        page.locator(".jp-clustersdk-status-text", has_text="0/2 slots busy").wait_for()
        # a process of the cluster started again by its supervisor (a standing cluster's)
        assert sidebar.locator(".jp-clustersdk-cluster-restarts").count() == 0
        cluster.client.run_on_scheduler(restart_a_worker)
        restarts = sidebar.locator(".jp-clustersdk-cluster-restarts")
        restarts.wait_for()
        assert restarts.text_content().startswith("1 restart of its processes, the last ")
        assert "died of SIGKILL" in restarts.get_attribute("title")

        # hidden: no refresh at all; the status bar item shows it again, and it refreshes
        tab.click()
        sidebar.wait_for(state="hidden")
        assert overview_requests(page, 3.0) == 0
        page.locator(".jp-clustersdk-status-text").click()
        sidebar.wait_for()
        assert overview_requests(page, 3.0) >= 2
        # its refresh interval is a setting of its own, in the Settings Editor
        schema = jupyterlab.api("/lab/api/settings/jupyterlab-clustersdk:plugin")["schema"]
        assert schema["properties"]["refreshInterval"]["default"] == 750

        job = cluster.launch(
            ticker, world_size=2, name="lab-job", checkpoint_dir=str(runs / "lab-job")
        )
        launched = time.monotonic()
        row = sidebar.locator('.jp-clustersdk-job[data-name="lab-job"]')
        row.wait_for(timeout=30_000)
        appeared = time.monotonic() - launched
        print(f"the job's row appeared {appeared:.2f} s after launch() returned")
        assert appeared <= APPEAR_WITHIN
        badge = row.locator(".jp-clustersdk-badge")
        wait_for(lambda: badge.text_content() == "RUNNING", 60)
        row.get_by_text(re.compile(r"step \d+ / 1000000")).wait_for()
        assert "ddp · 2 ranks" in row.locator(".jp-clustersdk-job-meta").text_content()
        page.locator(
            ".jp-clustersdk-status-text", has_text="clustersdk: 1 running · 2/2 slots busy"
        ).wait_for()
        # each slot names the cores its worker is bound to, as cluster.slots() says
        shares = sorted(s["cpus"] for s in cluster.slots() if s["cpus"])
        shown = sidebar.locator(".jp-clustersdk-slot-cores")
        wait_for(lambda: shown.count() == len(shares), 10)
        assert sorted(t.split(" ", 1)[1] for t in shown.all_text_contents()) == shares

        def button(name: str):
            return row.get_by_role("button", name=name, exact=True)

        button("Pause").click()
        wait_for(lambda: job.status is cs.JobStatus.PAUSED, 60)
        wait_for(lambda: badge.text_content() == "PAUSED", 10)
        assert button("Pause").is_disabled()
        assert "PAUSED" in button("Pause").get_attribute("title")
        assert button("Resume").is_enabled()
        toast(page, "Paused job lab-job before step")

        button("Resume").click()
        wait_for(lambda: job.status is cs.JobStatus.RUNNING, 60)
        first_steps = len(job.history())
        wait_for(lambda: len(job.history()) > first_steps + 10, 60)

        button("Checkpoint").click()
        wait_for(lambda: job.info()["checkpoint"], 60)

        # the job panel: charts per rank, logs per rank, checkpoints, events
        row.locator(".jp-clustersdk-job-name").click()
        panel = page.locator(f'.jp-clustersdk-jobpanel-body[data-job="{job.id}"]')
        panel.wait_for()
        loss = panel.locator('figure[data-title="loss"]')
        wait_for(lambda: loss.locator("path.jp-clustersdk-line").count() == 2, 30)
        assert loss.get_attribute("data-mode") == "lines"
        wait_for(lambda: panel.locator('figure[data-title="throughput"] path').count() == 2, 30)
        log = panel.locator(".jp-clustersdk-log")
        wait_for(lambda: "[1] tick 0 on rank 1" in log.text_content(), 30)
        panel.locator("select.jp-clustersdk-rank").select_option("1")
        wait_for(lambda: log.text_content().startswith("tick 0 on rank 1"), 30)
        assert "on rank 0" not in log.text_content()
        step = job.info()["checkpoint_step"]
        panel.locator(".jp-clustersdk-checkpoints td", has_text=re.compile(rf"^{step}$")).wait_for()
        panel.locator(".jp-clustersdk-events li", has_text=f"checkpoint at step {step}").wait_for()
        # where its time went: mostly steps, and the pause it had
        goodput = panel.locator(".jp-clustersdk-goodput-text")
        wait_for(lambda: "paused" in goodput.text_content(), 30)
        assert re.match(r"goodput \d+% of \d+\.\d s", goodput.text_content())
        assert panel.locator(".jp-clustersdk-goodput-productive").count() == 1
        page.mouse.move(1, 1)
        sidebar.screenshot(path=str(output_dir / "labpanel-sidebar.png"))
        panel.screenshot(path=str(output_dir / "labpanel-job.png"))
        save_for_docs(output_dir / "labpanel-sidebar.png")
        save_for_docs(output_dir / "labpanel-job.png")

        # into the notebook: the attach code runs and reaches the same job
        page.locator(".lm-TabBar-tab", has_text="attach.ipynb").first.click()
        row.get_by_role("button", name="Insert attach code").click()
        cell = page.locator(".jp-NotebookPanel .jp-Cell").nth(1)
        wait_for(lambda: "cs.Job.attach(cs.Cluster.connect(" in cell.text_content(), 10)
        assert f'"{cluster.scheduler_address}"), "lab-job")' in cell.text_content()
        page.keyboard.press("Shift+Enter")  # runs it and makes a new cell below
        page.keyboard.press("Enter")
        page.keyboard.type("print('attached', job.id, job.status)")
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-OutputArea-output", has_text=f"attached {job.id} RUNNING").wait_for(
            timeout=60_000
        )

        button("Stop").click()
        wait_for(lambda: job.status is cs.JobStatus.STOPPED, 60)
        wait_for(lambda: badge.text_content() == "STOPPED", 10)

        # a refused action (409) and a vanished job (404) are notifications that say why
        palette(page, "Pause the selected job")
        message = toast(page, "Could not pause job lab-job (HTTP 409)")
        assert "STOPPED" in message
    finally:
        cluster.close()
    # the notebook's kernel still has it in the registry (it connected): now unreachable
    sidebar.locator(".jp-clustersdk-cluster", has_text="unreachable").wait_for()
    palette(page, "Pause the selected job")
    message = toast(page, "Could not pause job lab-job (HTTP 404)")
    assert f"no job with id or name {job.id!r}" in message
