"""Two people on a TLS cluster, seen from bob's JupyterLab in headless Chromium: alice's
job is in his sidebar with every button greyed out, the tooltip naming her; his own
job's buttons work. The server acts as its Jupyter user (bob, by his token) with his
own clustersdk credentials. Screenshot: test-output/browser/people-bob.png."""

from __future__ import annotations

import dask.config
import pytest

import clustersdk as cs
import clustersdk.config  # noqa: F401 - its defaults loaded before dask.config.set below

from ..helpers import wait_for
from ..workloads import spin
from .conftest import ROOT, lab_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SIDEBAR = "#clustersdk-sidebar"


def test_bobs_buttons_on_alices_job_are_disabled(browser, output_dir, tmp_path):
    with dask.config.set({"clustersdk.security.user": "alice"}):
        alice = cs.Cluster.local(workers=2, state_dir=str(tmp_path / "alice"))
    try:
        path = alice.add_user("bob", path=str(tmp_path / "bob.pem"))
        bob = cs.Cluster.connect(
            alice.scheduler_address, credentials=path, state_dir=str(tmp_path / "bob")
        )
        hers = alice.launch(spin, world_size=1, name="alice-job")
        his = bob.launch(spin, world_size=1, name="bob-job")
        config = {
            "ServerApp": {"identity_provider_class": "tests.extension.people.TokenPeople"},
            "TokenPeople": {"tokens": {"bob-token": "bob"}},
            "ClusterSDKApp": {
                "state_dirs": [str(tmp_path / "alice")],
                "credentials": {"bob": path},
            },
        }
        with lab_server(
            tmp_path / "lab", config, env={"PYTHONPATH": f"{ROOT}:{ROOT / 'extension'}"}
        ) as lab:
            page = browser
            page.set_default_timeout(60_000)
            page.goto(f"{lab.url}/lab?token=bob-token")
            page.locator('.lm-TabBar-tab[data-id="clustersdk-sidebar"]').click()
            sidebar = page.locator(SIDEBAR)
            row = sidebar.locator('.jp-clustersdk-job[data-name="alice-job"]')
            mine = sidebar.locator('.jp-clustersdk-job[data-name="bob-job"]')
            row.wait_for()
            mine.wait_for()
            wait_for(lambda: row.locator(".jp-clustersdk-badge").text_content() == "RUNNING", 60)
            for name in ("Pause", "Checkpoint", "Suspend", "Stop"):
                button = row.get_by_role("button", name=name, exact=True)
                assert button.is_disabled(), name
                assert button.get_attribute("title") == (
                    "this job belongs to 'alice'; only its owner or an admin may change it "
                    "(you are 'bob')"
                )
            wait_for(lambda: mine.locator(".jp-clustersdk-badge").text_content() == "RUNNING", 60)
            assert mine.get_by_role("button", name="Stop", exact=True).is_enabled()
            page.mouse.move(1, 1)
            sidebar.screenshot(path=str(output_dir / "people-bob.png"))
            mine.get_by_role("button", name="Pause", exact=True).click()
            wait_for(lambda: his.status is cs.JobStatus.PAUSED, 60)
            assert hers.status is cs.JobStatus.RUNNING
        bob.close()
    finally:
        alice.close()
