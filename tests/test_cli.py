"""The ``clustersdk`` command line through its real entry point (a subprocess, the
console script pip installed), against a real two-worker LocalCluster that the CLI
finds through the registry, as a user's terminal would."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import cloudpickle
import pytest

import clustersdk as cs
from clustersdk import registry

from . import workloads_debug, workloads_live
from .helpers import checkpointed_at, wait_for
from .workloads import count_to, ticker

CLI = str(Path(sys.executable).with_name("clustersdk"))
TIMEOUT = 120


@pytest.fixture(scope="module")
def state(cluster) -> Path:
    """Where the module's cluster is registered: the CLI finds it there."""
    return Path(cluster.state_dir)


def run(state: Path, *args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    env = {**os.environ, "DASK_CLUSTERSDK__STATE_DIR": str(state), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [CLI, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def start_ticker(cluster: cs.Cluster, directory: Path) -> cs.Job:
    job = cluster.launch(ticker, world_size=2, name="cli-tick", checkpoint_dir=str(directory))
    wait_for(lambda: job.status is cs.JobStatus.RUNNING and len(job.history()) >= 4, 60)
    return job


@pytest.fixture
def running(idle, tmp_path):
    return start_ticker(idle, tmp_path / "ck")


def test_jobs_lists_every_registered_cluster_and_hides_ended_jobs_without_all(
    idle, state, tmp_path
):
    done = idle.launch(count_to, world_size=1, name="cli-short")
    assert done.wait(timeout=60) == "done"
    running = start_ticker(idle, tmp_path / "ck")

    live = json.loads(ok(run(state, "jobs", "--json")))
    assert [(j["name"], j["status"], j["cluster"]) for j in live] == [
        ("cli-tick", "RUNNING", idle.scheduler_address)
    ]
    assert live[0]["id"] == running.id and live[0]["spec"]["world_size"] == 2

    every = json.loads(ok(run(state, "jobs", "--all", "--json")))
    assert {(j["name"], j["status"]) for j in every} >= {
        ("cli-tick", "RUNNING"),
        ("cli-short", "FINISHED"),
    }

    table = ok(run(state, "jobs", idle.scheduler_address, "--all")).splitlines()
    assert table[0].split() == [
        "NAME",
        "ID",
        "STATUS",
        "RANKS",
        "STRATEGY",
        "OWNER",
        "SUBMITTED",
        "CLUSTER",
    ]
    row = next(line.split() for line in table if line.startswith("cli-tick "))
    assert row[:5] == ["cli-tick", running.id, "RUNNING", "2", "ddp"]


def test_show_and_history_of_a_job(idle, state):
    job = idle.launch(count_to, kwargs={"steps": 12}, world_size=2, name="cli-hist")
    job.wait(timeout=60)

    shown = json.loads(ok(run(state, "show", "cli-hist", "--json")))
    assert (shown["id"], shown["status"], shown["cluster"]) == (
        job.id,
        "FINISHED",
        idle.scheduler_address,
    )
    assert shown["progress"] == {"steps": 12, "total_steps": 12, "scalars": {"value": 5.5}}

    text = ok(run(state, "show", job.id))
    assert "status:" in text and "FINISHED" in text and "12 / 12" in text

    rows = list(csv.DictReader(io.StringIO(ok(run(state, "history", "cli-hist", "--csv")))))
    expected = job.history()
    assert len(rows) == len(expected) == 24  # 12 steps on 2 ranks
    assert [(int(r["rank"]), int(r["step"]), float(r["value"])) for r in rows] == [
        (e["rank"], e["step"], e["value"]) for e in expected
    ]


def test_pause_checkpoint_suspend_resume_at_another_size_and_stop(running, state):
    name = running.name
    out = ok(run(state, "pause", name))
    assert f"paused job {name!r} before step" in out
    assert running.status is cs.JobStatus.PAUSED

    refused = run(state, "pause", name)
    assert refused.returncode == 1 and refused.stdout == ""
    assert name in refused.stderr and "PAUSED" in refused.stderr

    assert json.loads(ok(run(state, "resume", name, "--json")))["status"] == "RUNNING"
    assert running.status is cs.JobStatus.RUNNING

    out = ok(run(state, "checkpoint", name))
    path = out.rsplit(": ", 1)[1].strip()
    assert os.path.isdir(path) and path == running.info()["checkpoint"]

    ok(run(state, "suspend", name))
    assert running.status is cs.JobStatus.SUSPENDED
    resumed = json.loads(ok(run(state, "resume", name, "--world-size", "1", "--json")))
    assert resumed["spec"]["world_size"] == 1
    wait_for(lambda: running.status is cs.JobStatus.RUNNING, 60)
    assert len(running.info()["ranks"]) == 1

    out = ok(run(state, "stop", running.id))
    assert out.strip() == f"job {name!r} is STOPPED"
    assert running.status is cs.JobStatus.STOPPED


def test_logs_of_one_rank_and_follow_a_running_job_until_it_stops(running, state):
    first = ok(run(state, "logs", "cli-tick", "--rank", "1"))
    assert first.startswith("tick 0 on rank 1\n")  # rank 1's own lines, without a prefix
    assert "on rank 0" not in first

    env = {**os.environ, "DASK_CLUSTERSDK__STATE_DIR": str(state), "PYTHONUNBUFFERED": "1"}
    follow = subprocess.Popen(
        [CLI, "logs", "cli-tick", "--rank", "0", "-f"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    watchdog = threading.Timer(TIMEOUT, follow.kill)  # reads below block: never for ever
    watchdog.start()
    try:
        seen = [follow.stdout.readline() for _ in range(3)]  # blocks until the CLI prints
        assert all(line.startswith("tick ") for line in seen), seen
        newest = int(seen[-1].split()[1])
        later = f"tick {newest + 25} on rank 0\n"
        wait_for(lambda: later in running.logs(rank=0), 60)  # it goes on meanwhile
        running.stop()
        rest = follow.stdout.read()  # (not communicate(): it would skip what readline buffered)
        err = follow.stderr.read()
        follow.wait(timeout=TIMEOUT)
    finally:
        watchdog.cancel()
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err  # the job ended STOPPED
    lines = "".join(seen) + rest
    assert lines == running.logs(rank=0)  # every line once, in order, up to the last
    assert later in rest


def test_update_changes_hyperparameters_and_stacks_show_every_rank(idle, state):
    cloudpickle.register_pickle_by_value(workloads_live)
    job = idle.launch(
        workloads_live.train_live,
        kwargs={"steps": 100_000, "delay": 0.01},
        world_size=2,
        hparams={"scale": 1.0},
        name="cli-live",
    )
    wait_for(lambda: job.status is cs.JobStatus.RUNNING and len(job.history()) >= 4, 60)

    out = ok(run(state, "update", "cli-live", "lr=0.01", "scale=2"))
    step = job.updates()[-1]["step"]
    assert out.strip() == f"updated job 'cli-live' before step {step}: lr 0.05 → 0.01, scale 1 → 2"
    done = json.loads(ok(run(state, "update", job.id, "lr[0]=0.02", "--json")))
    assert done["changes"] == {"lr[0]": [0.01, 0.02]} and done["step"] >= step
    wait_for(lambda: {r["lr"] for r in job.history() if r["step"] == done["step"]} == {0.02})

    refused = run(state, "update", "cli-live", "lr=-1")
    assert refused.returncode == 1 and "lr must be a finite number >= 0" in refused.stderr
    unknown = run(state, "update", "cli-live", "warmup=3")
    assert unknown.returncode == 1 and "unknown key" in unknown.stderr
    bad = run(state, "update", "cli-live", "lr")
    assert bad.returncode == 2 and "'lr' is not KEY=VALUE" in bad.stderr
    assert len(job.updates()) == 2 and job.status is cs.JobStatus.RUNNING

    text = ok(run(state, "stacks", "cli-live"))
    assert text.startswith("rank 0 on tls://") and "\nrank 1 on tls://" in text
    assert text.count("in train_live") == 2  # each rank's own frame
    # the rank's main thread by default, every thread of its process on demand
    assert "clustersdk-channel" not in text and "clustersdk-channel" in ok(
        run(state, "stacks", "cli-live", "--all-threads")
    )
    job.stop()


def test_debug_shows_the_held_rank_and_restart_continues_from_the_checkpoint(idle, state, tmp_path):
    cloudpickle.register_pickle_by_value(workloads_debug)
    job = idle.launch(
        workloads_debug.raise_at,
        kwargs={"rank": 1, "step": 6, "steps": 10, "marker": str(tmp_path / "raised")},
        world_size=2,
        timeout=5,
        on_error="hold",
        name="cli-held",
        checkpoint_dir=str(tmp_path / "ck"),
        checkpoint_every=4,
    )
    wait_for(lambda: job.status is cs.JobStatus.HELD, 90)
    wait_for(lambda: checkpointed_at(job, 4), 30)

    text = ok(run(state, "debug", "cli-held"))
    assert text.startswith("rank 1 of job 'cli-held' raised ValueError at step 6: bad batch")
    assert "in raise_at" in text and "      bad = Tensor(shape=[4, 4]" in text
    record = json.loads(ok(run(state, "debug", "cli-held", "--rank", "1", "--json")))
    assert record["rank"] == 1 and record["error"]["type"] == "ValueError"
    missing = run(state, "debug", "cli-held", "--rank", "7")
    assert missing.returncode == 1 and "rank 7 of job 'cli-held' is not held" in missing.stderr

    out = ok(run(state, "restart", "cli-held"))
    assert (
        out.strip() == "job 'cli-held' is RESTARTING: its hold ended, and it continues from step 4"
    )
    assert job.wait(timeout=120)["step"] == 10  # the marker is there: it does not raise again
    again = run(state, "restart", "cli-held")
    assert again.returncode == 1 and "FINISHED" in again.stderr


def test_usage_errors_exit_2_and_a_missing_job_exits_1(cluster, state):
    bad = run(state, "resume", "x", "--world-size", "0")
    assert bad.returncode == 2 and "must be positive" in bad.stderr
    missing = run(state, "show", "no-such-job")
    assert missing.returncode == 1
    assert "no job with id or name 'no-such-job'" in missing.stderr


# the command line itself: version, help, queue, which cluster, credentials --------------------
# the commands that take their cluster as NAME (a standing cluster's processes and files on
# this host) or make one: every other command talks to a cluster, so takes these two flags
NAMED_OR_OWN = {
    "demo",
    "cluster up",
    "cluster down",
    "cluster status",
    "cluster logs",
    "cluster unit",
    "cluster kubernetes",
}


def commands(parser, path=()):
    """Every command of the parser, as (``"cluster up"``, its parser)."""
    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not nested:
        yield " ".join(path), parser
        return
    for name, child in nested[0].choices.items():
        yield from commands(child, (*path, name))


def test_every_command_that_talks_to_a_cluster_takes_cluster_and_credentials():
    from clustersdk.__main__ import parser

    found = dict(commands(parser()))
    assert {"jobs", "queue", "submit", "doctor", "restart", "cluster users"} <= set(found)
    for name, command in found.items():
        flags = {o for action in command._actions for o in action.option_strings}
        if name not in NAMED_OR_OWN:
            assert {"--cluster", "--credentials"} <= flags, name
        assert "``" not in command.format_help(), name  # no reStructuredText on a terminal


def test_version_and_help_read_as_plain_text(tmp_path):
    assert ok(run(tmp_path, "--version")).strip() == f"clustersdk {cs.__version__}"
    text = ok(run(tmp_path, "--help"))
    assert "``" not in text and "clustersdk COMMAND --help" in text


def test_queue_lists_a_queued_job(running, state):
    waiting = running.cluster.launch(count_to, world_size=2, name="cli-waiting")
    assert waiting.status is cs.JobStatus.QUEUED
    found = json.loads(ok(run(state, "queue", "--json")))
    assert found["unreachable"] == []
    (view,) = found["clusters"]
    assert view["cluster"] == running.cluster.scheduler_address
    assert (view["slots"], view["free"]) == (2, 0)
    (queue,) = view["queues"]
    assert [j["name"] for j in queue["holding"]] == ["cli-tick"]
    assert [j["name"] for j in queue["waiting"]] == ["cli-waiting"]
    # the text is cluster.queue()'s, as %queue shows it
    text = ok(run(state, "queue"))
    assert text.startswith(f"cluster {running.cluster.scheduler_address}\n2 slots, 0 free")
    row = next(line.split() for line in text.splitlines() if "cli-waiting" in line)
    assert row[0] == "cli-waiting" and row[3:5] == ["2", "QUEUED"], text
    waiting.stop()
    running.stop()


def test_submit_uses_every_slot_and_cluster_takes_a_name_or_an_address(idle, state, tmp_path):
    script = tmp_path / "size.py"
    script.write_text("import os\nprint('world size', os.environ['WORLD_SIZE'])\n")
    # no -n and no --cluster: every slot of the registry's only cluster
    out = ok(run(state, "submit", "--name", "cli-every", "--follow", str(script)))
    assert out.splitlines()[0] == "cli-every"
    assert out.count("world size 2") == 2, out
    assert cs.Job.attach(idle, "cli-every").world_size == 2

    # by name: a standing cluster of this account's registry
    named = tmp_path / "named"
    registry.register(
        idle.scheduler_address,
        kind="standing",
        local=False,
        state_dir=str(named),
        credentials=idle.credentials,
        name="cli-team",
    )
    shown = json.loads(ok(run(named, "show", "cli-every", "--cluster", "cli-team", "--json")))
    assert (shown["cluster"], shown["status"]) == (idle.scheduler_address, "FINISHED")

    # by address, from an account whose registry knows nothing: --credentials
    nobody = tmp_path / "nobody"
    address = ["--cluster", idle.scheduler_address]
    refused = run(nobody, "show", "cli-every", *address)
    assert refused.returncode == 1 and "wants credentials" in refused.stderr
    mine = [*address, "--credentials", idle.credentials]
    assert "cli-every" in ok(run(nobody, "jobs", "--all", *mine))
    assert json.loads(ok(run(nobody, "queue", "--json", *mine)))["clusters"][0]["free"] == 2


def test_what_follows_double_dash_is_the_scripts_own_wherever_submits_flags_are(capsys):
    from clustersdk.__main__ import parse

    late = parse(["submit", "-n", "2", "train.py", "--follow", "--", "--lr", "1e-3"])
    assert (late.script, late.follow, late.script_args) == ("train.py", True, ["--lr", "1e-3"])
    early = parse(["submit", "-n", "2", "--follow", "train.py", "a", "--", "--follow"])
    assert (early.follow, early.script_args) == (True, ["a", "--follow"])
    with pytest.raises(SystemExit) as refused:
        parse(["jobs", "--", "x"])
    assert refused.value.code == 2
    assert "only `clustersdk submit` takes arguments after --" in capsys.readouterr().err
