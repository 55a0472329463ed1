"""The IPython magics, run in a real IPython shell against a real cluster."""

from __future__ import annotations

import time

import pytest
from IPython.core.interactiveshell import InteractiveShell

import clustersdk as cs
from clustersdk.magics import ClusterMagics, RemoteFailure, cell_function


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "clustersdk")
    yield ip
    ip.user_ns.pop("cluster", None)


@pytest.fixture
def ip(shell, idle):
    """The shell, with the module's cluster as ``cluster`` and no %cluster made yet."""
    magics = shell.magics_manager.registry["ClusterMagics"]
    magics.current = None
    shell.user_ns["cluster"] = idle
    yield shell
    shell.user_ns.pop("cluster", None)


def run(ip, source: str):
    result = ip.run_cell(source, store_history=False)
    return result


def one_line_error(capsys) -> str:
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert "Traceback" not in text, text
    assert len(text.splitlines()) == 1, text
    assert text.startswith("UsageError: "), text
    return text


@pytest.mark.parametrize(
    "magic",
    [
        "%cluster --help",
        "%%distributed --help\npass",
        "%jobs --help",
        "%job --help",
        "%queue --help",
    ],
)
def test_every_magic_has_help(shell, capsys, magic):
    result = run(shell, magic)
    assert result.success
    out = capsys.readouterr().out
    name = magic.lstrip("%").split()[0]
    assert out.startswith(f"usage: %{name}") or f"%{name} " in out.splitlines()[2]
    assert "--help" in out


@pytest.mark.parametrize(
    "line, message",
    [
        ("%cluster frobnicate", "unknown mode 'frobnicate'"),
        ("%cluster connect", "needs one scheduler address"),
        ("%cluster local -n two", "argument -n/--workers: invalid int value: 'two'"),
        ("%job pause no-such-job", "no job named 'no-such-job' on this cluster"),
        (
            "%job frob x",
            "usage: %job {pause|resume|checkpoint|suspend|stop|restart|show|logs|run|update|fork|"
            "debug|console|stacks|history} NAME",
        ),
        ("%%distributed -n 5\npass", "world_size=5 is more than this cluster can ever hold"),
        ("%%distributed --strategy zero\npass", "unknown strategy 'zero'"),
        ("%%distributed\nfor x in:\n    pass", "the cell has a syntax error"),
        ("%%distributed --cluster nope\npass", "--cluster nope: no Cluster called 'nope'"),
        ("%%distributed -n 1 --queue nowhere\npass", "unknown queue 'nowhere'"),
        (
            "%%distributed -n 1 --priority low --not-preemptible\npass",
            "preemptible=False needs priority normal (50) or higher",
        ),
    ],
)
def test_mistakes_are_one_line(ip, capsys, line, message):
    result = run(ip, line)
    assert not result.success
    assert message in one_line_error(capsys)


def test_no_cluster_yet_is_one_line(shell, capsys):
    shell.magics_manager.registry["ClusterMagics"].current = None
    result = run(shell, "%jobs")
    assert "no cluster yet: start one with %cluster local" in one_line_error(capsys)
    assert not result.success


def test_cluster_local_starts_shows_and_closes(shell, tmp_path, capsys):
    magics: ClusterMagics = shell.magics_manager.registry["ClusterMagics"]
    result = run(shell, f"%cluster local -n 1 --state-dir {tmp_path}")
    cluster = result.result
    try:
        assert isinstance(cluster, cs.Cluster) and magics.current is cluster
        assert len(cluster.slots()) == 1
        assert run(shell, "%cluster").result is cluster
        bundle = cluster._repr_mimebundle_()
        assert "1 CPU slot on 1 host" in bundle["text/plain"]
    finally:
        run(shell, "%cluster close")
    assert cluster.closed and magics.current is None
    assert "closed <Cluster local (closed)>" in capsys.readouterr().out


def test_distributed_runs_the_cell_on_every_rank_with_notebook_globals(ip, capsys):
    ip.user_ns["greeting"] = "hello"
    result = run(
        ip,
        "%%distributed -n 2 --name magic-ranks\n"
        "print(greeting, 'from', ctx.rank)\n"
        "import torch\n"
        "return {'rank': ctx.rank, 'world': ctx.world_size}\n",
    )
    assert result.success, result.error_in_exec
    assert result.result == {"rank": 0, "world": 2}
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out
    assert cs.Job.attach(ip.user_ns["cluster"], "magic-ranks").status is cs.JobStatus.FINISHED


def test_distributed_failure_shows_the_remote_traceback_only(ip, capsys):
    result = run(
        ip, "%%distributed -n 2\nx = 1\nif ctx.rank == 1:\n    raise ValueError(f'bad value {x}')\n"
    )
    assert isinstance(result.error_in_exec, RemoteFailure)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Remote traceback (rank 1" in text
    assert "line 3, in cell" in text and "ValueError: bad value 1" in text
    assert "failed: rank 1 raised ValueError: bad value 1" in text
    assert "magics.py" not in text  # none of our frames


def test_no_wait_then_job_magics_and_jobs_table(ip, capsys):
    result = run(
        ip,
        "%%distributed -n 2 --no-wait --name magic-spin --priority high\n"
        "import time\n"
        "for step, _ in ctx.loop(None, steps=1_000_000):\n"
        "    time.sleep(0.01)\n"
        "    ctx.log(value=float(step))\n",
    )
    job = result.result
    assert isinstance(job, cs.Job)
    deadline = time.monotonic() + 30
    while job.status is not cs.JobStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.priority == 100 and job.queue == "default"
    queues = run(ip, "%queue").result
    assert [h["name"] for h in queues.data["queues"][0]["holding"]] == ["magic-spin"]
    while not job.history() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "value" in run(ip, "%job history magic-spin").result[0]
    capsys.readouterr()
    assert run(ip, "%job stacks magic-spin").success
    assert capsys.readouterr().out.startswith("rank 0 on ")
    assert run(ip, "%job pause magic-spin").success
    assert job.status is cs.JobStatus.PAUSED
    assert run(ip, "%job resume magic-spin").success
    assert job.status is cs.JobStatus.RUNNING
    shown = run(ip, "%job show magic-spin").result
    assert isinstance(shown, cs.Job) and shown.id == job.id
    assert run(ip, "%job stop magic-spin").success
    assert job.status is cs.JobStatus.STOPPED
    out = capsys.readouterr().out
    assert "job 'magic-spin': paused before step" in out
    assert "job 'magic-spin': resumed (RUNNING)" in out
    assert "job 'magic-spin': now STOPPED" in out
    table = run(ip, "%jobs").result
    assert "magic-spin" in repr(table) and "STOPPED" in repr(table)
    assert "magic-spin" in table._repr_html_()
    capsys.readouterr()
    result = run(ip, "%job pause magic-spin")
    assert "magic-spin" in one_line_error(capsys) and not result.success  # a finished job


def test_cell_function_keeps_strings_and_line_numbers():
    fn = cell_function('text = """a\n  b"""\nreturn text, ctx', {"__name__": "__main__"})
    assert fn("ctx") == ("a\n  b", "ctx")
    assert fn.__module__ == "__main__" and fn.__name__ == "cell"
    assert fn.__code__.co_firstlineno == 1
