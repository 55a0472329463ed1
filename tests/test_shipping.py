"""The job's code goes with it: a script that imports its own helpers, launched on a
cluster of separate `dask worker` processes started from another directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .helpers import wait_for

HELPERS = """
VERSION = {version}

def scale(x):
    return x * VERSION


class Result:
    def __init__(self, **fields):
        self.fields = fields
"""

PACKAGE = """
def triple(x):
    return 3 * x
"""

SCRIPT = """
import json, os, sys

import clustersdk as cs
import helpers


def train(ctx):
    import torch

    with open(os.path.join("data", "note.txt")) as f:
        note = f.read().strip()
    return helpers.Result(value=float(helpers.scale(torch.ones(1))), note=note, cwd=os.getcwd(),
                          module=helpers.__file__)


def train_pkg(ctx):
    import pkg.util  # imported in the body: seen in its code, not in the pickle

    return {"value": pkg.util.triple(ctx.world_size), "cwd": os.getcwd()}


def report(case, fn):
    try:
        out = fn()
    except cs.SpecError as e:
        out = {"error": str(e)}
    print(json.dumps({"case": case, **(out.fields if hasattr(out, "fields") else out)}), flush=True)


def main(address):
    with cs.Cluster.connect(address, state_dir=os.path.join(os.getcwd(), ".state")) as cluster:
        run = lambda fn, **kw: cluster.launch(fn, world_size=2, **kw).wait(timeout=120)
        report("missing", lambda: run(train))
        report("working_dir", lambda: run(train, working_dir="."))
        with open("helpers.py", "w") as f:  # a new version: a new archive, no stale module
            f.write(open("helpers.py.v2").read())
        report("changed", lambda: run(train, working_dir="."))
        report("missing_in_body", lambda: run(train_pkg))
        report("py_modules", lambda: run(train_pkg, py_modules=["pkg"]))


if __name__ == "__main__":
    main(sys.argv[1])
"""


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """A scheduler and two workers, each its own `dask` process started in a directory of
    its own (nothing of the tests on their path); killed by pid, with their children."""
    home = tmp_path_factory.mktemp("remote-cluster")
    scheduler_file = home / "scheduler.json"
    dask = str(Path(sys.executable).with_name("dask"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TMPDIR"] = str(home)  # the workers unpack shipped code under it: gone with it
    procs: list[subprocess.Popen] = []
    log = open(home / "dask.log", "w")

    def start(*args: str) -> None:
        procs.append(
            subprocess.Popen(
                [dask, *args],
                cwd=home,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    try:
        start(
            "scheduler",
            "--scheduler-file",
            str(scheduler_file),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-dashboard",
        )
        wait_for(lambda: scheduler_file.exists() and scheduler_file.stat().st_size, timeout=60)
        for i in range(2):
            start(
                "worker",
                "--scheduler-file",
                str(scheduler_file),
                "--nthreads",
                "1",
                "--host",
                "127.0.0.1",
                "--no-dashboard",
                "--name",
                f"remote-{i}",
            )
        address = json.loads(scheduler_file.read_text())["address"]
        from distributed import Client

        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for proc in reversed(procs):  # the process groups: a worker's nanny and its child
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        log.close()


@pytest.fixture(scope="module")
def outcomes(remote, tmp_path_factory) -> dict[str, dict]:
    """What the script saw, case by case (it runs once; each test checks one case)."""
    project = tmp_path_factory.mktemp("project")
    (project / "helpers.py").write_text(HELPERS.format(version=1))
    (project / "helpers.py.v2").write_text(HELPERS.format(version=2))
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "util.py").write_text(PACKAGE)
    (project / "data").mkdir()
    (project / "data" / "note.txt").write_text("shipped with the job\n")
    (project / "run.py").write_text(textwrap.dedent(SCRIPT))
    run = subprocess.run(
        [sys.executable, "run.py", remote], cwd=project, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    cases = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {case.pop("case"): case for case in cases} | {"project": {"path": str(project)}}


def test_a_module_the_workers_cannot_import_fails_the_launch_naming_it(outcomes):
    error = outcomes["missing"]["error"]
    assert "module 'helpers', which train needs, can't be imported on worker" in error
    assert f"here it is {outcomes['project']['path']}/helpers.py" in error
    assert "working_dir=" in error and "py_modules=[helpers]" in error
    body = outcomes["missing_in_body"]["error"]
    assert "module 'pkg', which train_pkg needs" in body


def test_working_dir_ships_the_modules_and_files_and_is_the_ranks_directory(outcomes):
    got = outcomes["working_dir"]
    assert got["value"] == 1.0 and got["note"] == "shipped with the job"
    assert got["cwd"] != outcomes["project"]["path"] and "clustersdk-code" in got["cwd"]
    assert got["module"].startswith(got["cwd"])


def test_changed_code_is_shipped_again_and_replaces_the_old_module(outcomes):
    first, second = outcomes["working_dir"], outcomes["changed"]
    assert second["value"] == 2.0 and second["cwd"] != first["cwd"]  # another content hash


def test_py_modules_ships_a_package_without_changing_directory(outcomes):
    got = outcomes["py_modules"]
    assert got["value"] == 6 and "clustersdk-code" not in got["cwd"]
