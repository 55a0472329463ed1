"""The SQLite journal: job records, metric cursors, rank logs, persistence."""

from __future__ import annotations

import pytest

from clustersdk.control.journal import Journal


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "state" / "journal.db")  # the folder doesn't exist yet


@pytest.fixture
def journal(path):
    j = Journal(path)
    yield j
    j.close()


def record(id: str, name: str = "train", scheduler: str = "s1", submitted: float = 0.0, **fields):
    return {
        "id": id,
        "name": name,
        "scheduler": scheduler,
        "status": "QUEUED",
        "spec": {"world_size": 2},
        "submitted": submitted,
        **fields,
    }


def metric(step: int, rank: int = 0, **scalars):
    return {"rank": rank, "step": step, "time": 100.0 + step, "scalars": scalars}


def test_add_get_and_defaults(journal):
    journal.add_job(record("a1"))
    got = journal.get("a1")
    assert got["name"] == "train" and got["spec"] == {"world_size": 2}
    assert (got["reason"], got["ranks"], got["error"], got["started"]) == ("", [], None, None)
    assert journal.get("nope") is None


def test_update_changes_only_the_given_fields(journal):
    journal.add_job(record("a1"))
    journal.update("a1", status="RUNNING", started=5.0, ranks=[{"rank": 0, "host": "h"}])
    got = journal.get("a1")
    assert (got["status"], got["started"], got["ranks"]) == (
        "RUNNING",
        5.0,
        [{"rank": 0, "host": "h"}],
    )
    assert got["spec"] == {"world_size": 2}


def test_json_fields_round_trip(journal):
    spec = {
        "world_size": 4,
        "timeout": 1.5,
        "nested": {"l": [1, "two", None]},
        "name": "entraînement",
    }
    error = {"rank": 1, "type": "ValueError", "message": "bad", "traceback": "Traceback...\n"}
    journal.add_job(record("a1", spec=spec, ranks=[{"rank": 0}, {"rank": 1}]))
    journal.update("a1", error=error, result=b"\x80\x05pickled")
    got = journal.get("a1")
    assert (got["spec"], got["ranks"], got["error"], got["result"]) == (
        spec,
        [{"rank": 0}, {"rank": 1}],
        error,
        b"\x80\x05pickled",
    )


def test_find_returns_the_newest_job_of_that_name_on_that_scheduler(journal):
    for id, name, scheduler, submitted in [
        ("old", "x", "s1", 1.0),
        ("new", "x", "s1", 3.0),
        ("mid", "x", "s1", 2.0),
        ("other", "y", "s1", 9.0),
        ("elsewhere", "x", "s2", 9.0),
    ]:
        journal.add_job(record(id, name=name, scheduler=scheduler, submitted=submitted))
    assert journal.find("s1", "x")["id"] == "new"
    assert journal.find("s1", "z") is None


def test_jobs_are_filtered_by_scheduler_and_ordered_by_submission(journal):
    for id, scheduler, submitted in [("b", "s1", 2.0), ("c", "s2", 0.0), ("a", "s1", 1.0)]:
        journal.add_job(record(id, scheduler=scheduler, submitted=submitted))
    assert [j["id"] for j in journal.jobs("s1")] == ["a", "b"]
    assert journal.jobs("s3") == []


def test_history_cursor_returns_only_new_rows_in_order(journal):
    journal.add_metrics("a1", [metric(0, loss=1.0), metric(0, rank=1, loss=1.1)])
    journal.add_metrics("b2", [metric(0, loss=9.0)])  # another job's rows stay out
    first = journal.history("a1")
    assert [(r["rank"], r["step"], r["loss"]) for r in first] == [(0, 0, 1.0), (1, 0, 1.1)]
    assert first[0]["time"] == 100.0

    journal.add_metrics("a1", [metric(1, loss=0.5), metric(2, loss=0.25)])
    new = journal.history("a1", since=first[-1]["seq"])
    assert [(r["step"], r["loss"]) for r in new] == [(1, 0.5), (2, 0.25)]
    assert first[-1]["seq"] < new[0]["seq"] < new[1]["seq"]
    assert journal.history("a1", since=new[-1]["seq"]) == []
    assert [r["step"] for r in journal.history("a1", since=first[-1]["seq"], limit=1)] == [1]


def test_a_scalar_named_like_a_column_does_not_clobber_it(journal):
    journal.add_metrics("a1", [metric(3, time=42.0, seq=0)])
    row = journal.history("a1")[0]
    assert row["time"] == 103.0 and row["seq"] == 1


def test_logs_filter_by_rank_and_cursor(journal):
    journal.add_logs(
        "a1", [(0, 1.0, "stdout", "r0 a"), (1, 1.0, "stdout", "r1 a"), (0, 2.0, "stderr", "r0 b")]
    )
    journal.add_logs("b2", [(0, 1.0, "stdout", "other job")])
    assert [e["text"] for e in journal.logs("a1")] == ["r0 a", "r1 a", "r0 b"]
    rank0 = journal.logs("a1", rank=0)
    assert [(e["stream"], e["text"]) for e in rank0] == [("stdout", "r0 a"), ("stderr", "r0 b")]
    assert [e["text"] for e in journal.logs("a1", since=rank0[0]["seq"])] == ["r1 a", "r0 b"]


def test_everything_survives_reopening_the_file(path):
    first = Journal(path)
    first.add_job(record("a1"))
    first.update("a1", status="FINISHED", error={"rank": 0})
    first.add_metrics("a1", [metric(0, loss=1.0)])
    first.add_logs("a1", [(0, 1.0, "stdout", "hello")])
    first.close()

    again = Journal(path)
    try:
        got = again.get("a1")
        assert (got["status"], got["error"]) == ("FINISHED", {"rank": 0})
        assert [r["loss"] for r in again.history("a1")] == [1.0]
        assert [e["text"] for e in again.logs("a1")] == ["hello"]
    finally:
        again.close()


def test_truncate_history_forgets_steps_a_resume_replays(journal):
    journal.add_metrics("a1", [metric(s) for s in range(6)])
    journal.truncate_history("a1", 4)
    assert [r["step"] for r in journal.history("a1")] == [0, 1, 2, 3]
