"""Job records, metric history and rank logs in SQLite.

The journal lives in the state directory so that what a job did outlives the
kernel that launched it and any client that watched it. All writes come from
the scheduler's event loop.

What the ranks ship (metric rows, step phases, system samples, log lines, the
per-step summaries) is written in batches: it waits in memory for at most
:data:`BATCH_S` seconds and goes in with what came meanwhile, in one
transaction (1,024 ranks send thousands of rows a second; one transaction each
cost the scheduler most of a core). Every other statement, a read or a write,
first commits what waits, so a reader never misses a row that arrived before
its question, and a job record's change (a checkpoint committed, a status) is
never on disk before the rows that came before it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    scheduler TEXT NOT NULL,
    status TEXT NOT NULL,
    spec TEXT NOT NULL,
    submitted REAL NOT NULL,
    started REAL,
    ended REAL,
    reason TEXT NOT NULL DEFAULT '',
    ranks TEXT NOT NULL DEFAULT '[]',
    error TEXT,
    result BLOB,
    paused_at INTEGER,
    checkpoint TEXT,
    checkpoint_step INTEGER,
    checkpoint_error TEXT,
    total_steps INTEGER,
    restarts INTEGER NOT NULL DEFAULT 0,
    address TEXT,
    seq INTEGER,
    payload BLOB,
    estimated_start REAL,
    stacks TEXT,
    profiles TEXT,
    held TEXT,
    diagnosis TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_name ON jobs (scheduler, name, submitted);
CREATE TABLE IF NOT EXISTS metrics (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    time REAL NOT NULL,
    scalars TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_by_job ON metrics (job, seq);
CREATE INDEX IF NOT EXISTS metrics_by_step ON metrics (job, step, rank);
CREATE TABLE IF NOT EXISTS logs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    rank INTEGER NOT NULL,
    time REAL NOT NULL,
    stream TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS logs_by_job ON logs (job, rank, seq);
CREATE TABLE IF NOT EXISTS system (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    rank INTEGER NOT NULL,
    time REAL NOT NULL,
    sample TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS system_by_job ON system (job, seq);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    time REAL NOT NULL,
    step INTEGER,
    kind TEXT NOT NULL,
    message TEXT NOT NULL,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job, seq);
CREATE TABLE IF NOT EXISTS settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS phases (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    phases TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS phases_by_job ON phases (job, seq);
CREATE TABLE IF NOT EXISTS steps (
    job TEXT NOT NULL,
    step INTEGER NOT NULL,
    time REAL NOT NULL,
    ranks INTEGER NOT NULL,
    scalars TEXT NOT NULL,
    PRIMARY KEY (job, step)
) WITHOUT ROWID;
"""

BATCH_S = 0.2  # the longest shipped rows wait in memory before their transaction
_INSERTS = {
    "metrics": "INSERT INTO metrics (job, rank, step, time, scalars) VALUES (?, ?, ?, ?, ?)",
    "phases": "INSERT INTO phases (job, rank, step, phases) VALUES (?, ?, ?, ?)",
    "system": "INSERT INTO system (job, rank, time, sample) VALUES (?, ?, ?, ?)",
    "logs": "INSERT INTO logs (job, rank, time, stream, text) VALUES (?, ?, ?, ?, ?)",
    "steps": "INSERT OR REPLACE INTO steps (job, step, time, ranks, scalars) VALUES (?, ?, ?, ?, ?)",
}

_JSON_FIELDS = (
    "spec",
    "ranks",
    "error",
    "stacks",
    "profiles",
    "held",
    "diagnosis",
    "controls",
    "pending",
    "goodput",
)
# columns added since the first release, with their declarations
_ADDED_COLUMNS = {
    "restarts": "INTEGER NOT NULL DEFAULT 0",
    "address": "TEXT",
    "seq": "INTEGER",
    "payload": "BLOB",
    "estimated_start": "REAL",
    "stacks": "TEXT",
    "profiles": "TEXT",
    "held": "TEXT",
    "diagnosis": "TEXT",
    "controls": "TEXT",  # a script job's: what its ranks accept (scripts.py)
    "pending": "TEXT",  # requests its ranks have not carried out yet (lifecycle.py)
    "goodput": "TEXT",  # where its wall time went (goodput.py)
}
# what a job record leaves out when it goes to a client (big, or only for the control plane)
PRIVATE = ("result", "payload")


class Journal:
    """SQLite-backed store of jobs, metrics and logs.

    >>> j = Journal(":memory:")
    >>> j.add_job({"id": "a1", "name": "a", "scheduler": "s", "status": "QUEUED",
    ...            "spec": {}, "submitted": 0.0})
    >>> j.get("a1")["name"]
    'a'
    """

    def __init__(self, path: str):
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._migrate()
        self._waiting: dict[str, list[tuple]] = {table: [] for table in _INSERTS}
        self._oldest: float | None = None  # monotonic time the oldest waiting row came

    def _migrate(self) -> None:
        """Add the columns a newer clustersdk keeps to a state directory made by an older one."""
        have = {row["name"] for row in self._db.execute("PRAGMA table_info(jobs)")}
        for column, decl in _ADDED_COLUMNS.items():
            if column not in have:
                self._db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {decl}")

    def close(self) -> None:
        self.flush()
        self._db.close()

    # batches ----------------------------------------------------------------
    def _batch(self, table: str, values: list[tuple]) -> None:
        if not values:
            return
        self._waiting[table].extend(values)
        now = time.monotonic()
        if self._oldest is None:
            self._oldest = now
        elif now - self._oldest >= BATCH_S:
            self.flush()

    def flush(self) -> None:
        """Commit what waits (rows, phases, samples, lines, step summaries) in one
        transaction. The control plane also calls it on its tick."""
        if self._oldest is None:
            return
        self._oldest = None
        waiting = self._waiting
        self._waiting = {table: [] for table in _INSERTS}
        db = self._db
        db.execute("BEGIN")
        try:
            for table, values in waiting.items():
                if values:
                    db.executemany(_INSERTS[table], values)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _sql(self, sql: str, params: tuple = ()) -> sqlite3.Cursor:
        """Any statement but the batched inserts: what waits goes first."""
        self.flush()
        return self._db.execute(sql, params)

    # jobs -----------------------------------------------------------------
    def add_job(self, record: dict[str, Any]) -> None:
        row = _encode(record)
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        self._sql(f"INSERT INTO jobs ({cols}) VALUES ({marks})", tuple(row.values()))

    def update(self, job: str, **fields: Any) -> None:
        if not fields:
            return
        row = _encode(fields)
        sets = ", ".join(f"{k} = ?" for k in row)
        self._sql(f"UPDATE jobs SET {sets} WHERE id = ?", (*row.values(), job))

    def get(self, job: str) -> dict[str, Any] | None:
        row = self._sql("SELECT * FROM jobs WHERE id = ?", (job,)).fetchone()
        return _decode(row) if row else None

    def find(self, scheduler: str, name: str) -> dict[str, Any] | None:
        """The newest job of that name on that scheduler."""
        row = self._sql(
            "SELECT * FROM jobs WHERE scheduler = ? AND name = ? ORDER BY submitted DESC, rowid DESC LIMIT 1",
            (scheduler, name),
        ).fetchone()
        return _decode(row) if row else None

    def adoptable(self, address: str, scheduler: str) -> list[dict[str, Any]]:
        """Jobs an earlier scheduler at ``address`` left queued or suspended (oldest first)."""
        rows = self._sql(
            "SELECT * FROM jobs WHERE address = ? AND scheduler != ? AND status IN "
            "('QUEUED', 'SUSPENDED') ORDER BY seq, submitted",
            (address, scheduler),
        ).fetchall()
        return [_decode(r) for r in rows]

    def orphaned(self, address: str, scheduler: str) -> list[dict[str, Any]]:
        """Jobs an earlier scheduler at ``address`` left running (it died with them)."""
        rows = self._sql(
            "SELECT * FROM jobs WHERE address = ? AND scheduler != ? AND status NOT IN "
            "('QUEUED', 'SUSPENDED', 'FINISHED', 'FAILED', 'STOPPED')",
            (address, scheduler),
        ).fetchall()
        return [_decode(r) for r in rows]

    # events: restarts, failures, world-size changes, preemptions ------------
    def add_event(
        self,
        job: str,
        time: float,
        step: int | None,
        kind: str,
        message: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        self._sql(
            "INSERT INTO events (job, time, step, kind, message, data) VALUES (?, ?, ?, ?, ?, ?)",
            (job, time, step, kind, message, json.dumps(data or {}, default=str)),
        )

    def events(self, job: str) -> list[dict[str, Any]]:
        """The job's durable events, oldest first."""
        rows = self._sql(
            "SELECT time, step, kind, message, data FROM events WHERE job = ? ORDER BY seq", (job,)
        ).fetchall()
        return [
            {
                "time": r["time"],
                "step": r["step"],
                "kind": r["kind"],
                "message": r["message"],
                **json.loads(r["data"]),
            }
            for r in rows
        ]

    # settings ---------------------------------------------------------------
    def put_setting(self, key: str, value: Any) -> None:
        self._sql(
            "INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, json.dumps(value))
        )

    def setting(self, key: str) -> Any:
        row = self._sql("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return json.loads(row["value"]) if row else None

    def jobs(self, scheduler: str) -> list[dict[str, Any]]:
        rows = self._sql(
            "SELECT * FROM jobs WHERE scheduler = ? ORDER BY submitted", (scheduler,)
        ).fetchall()
        return [_decode(r) for r in rows]

    # metrics --------------------------------------------------------------
    def add_metrics(self, job: str, rows: Iterable[dict[str, Any]]) -> None:
        self._batch(
            "metrics", [(job, r["rank"], r["step"], r["time"], _dumps(r["scalars"])) for r in rows]
        )

    def truncate_history(self, job: str, step: int) -> None:
        """Forget the rows of steps at or after ``step`` (a resume from there replays them)."""
        self._sql("DELETE FROM metrics WHERE job = ? AND step >= ?", (job, step))
        self._sql("DELETE FROM phases WHERE job = ? AND step >= ?", (job, step))
        self._sql("DELETE FROM steps WHERE job = ? AND step >= ?", (job, step))

    def history(
        self,
        job: str,
        since: int = 0,
        limit: int | None = None,
        *,
        last_steps: int | None = None,
        rank: int | None = None,
    ) -> list[dict[str, Any]]:
        """Rows after sequence number ``since``: seq, rank, step, time and each scalar.

        In the order they came; with ``last_steps`` (only the newest that many steps) or
        ``rank`` (only that rank's), in step order (then rank), read through the
        ``(job, step, rank)`` index.
        """
        where, params = "job = ? AND seq > ?", [job, since]
        order = "seq"
        if last_steps is not None:
            newest = self._sql("SELECT MAX(step) FROM metrics WHERE job = ?", (job,)).fetchone()[0]
            if newest is None:
                return []
            where += " AND step > ?"
            params.append(newest - last_steps)
        if rank is not None:
            where += " AND rank = ?"
            params.append(rank)
        if last_steps is not None or rank is not None:
            order = "step, rank"
        sql = f"SELECT seq, rank, step, time, scalars FROM metrics WHERE {where} ORDER BY {order}"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        loads = json.loads
        return [
            {**loads(scalars), "seq": seq, "rank": r, "step": step, "time": t}
            for seq, r, step, t, scalars in self._sql(sql, tuple(params))
        ]

    # per-step summaries -------------------------------------------------------
    def put_steps(self, job: str, summaries: Iterable[dict[str, Any]]) -> None:
        """Per-step summaries (:meth:`clustersdk.control.digest.StepBands.take`'s): each
        replaces the one kept for its step."""
        self._batch(
            "steps",
            [(job, s["step"], s["time"], s["ranks"], _dumps(s["scalars"])) for s in summaries],
        )

    def step_summary(self, job: str, step: int) -> dict[str, Any] | None:
        """The summary kept for one step, in the form :meth:`put_steps` takes."""
        row = self._sql(
            "SELECT step, time, ranks, scalars FROM steps WHERE job = ? AND step = ?", (job, step)
        ).fetchone()
        if row is None:
            return None
        return {"step": row[0], "time": row[1], "ranks": row[2], "scalars": json.loads(row[3])}

    def steps(
        self, job: str, last: int | None = None, since_step: int | None = None
    ) -> list[dict[str, Any]]:
        """One row per step, oldest first: step, time (of its newest row), ranks (how many
        logged it) and, per scalar, its ``mean``, ``min``, ``max`` over the ranks and
        ``ranks`` (how many logged that scalar). Only the newest ``last`` steps, or the
        steps after ``since_step``."""
        where, params = "job = ?", [job]
        if since_step is not None:
            where += " AND step > ?"
            params.append(since_step)
        sql = f"SELECT step, time, ranks, scalars FROM steps WHERE {where} ORDER BY step"
        if last is not None:
            sql = (
                f"SELECT * FROM (SELECT step, time, ranks, scalars FROM steps WHERE {where} "
                "ORDER BY step DESC LIMIT ?) ORDER BY step"
            )
            params.append(last)
        return [
            {
                "step": step,
                "time": t,
                "ranks": ranks,
                "scalars": {
                    name: {"mean": total / count, "min": lo, "max": hi, "ranks": count}
                    for name, (count, total, lo, hi) in json.loads(scalars).items()
                    if count
                },
            }
            for step, t, ranks, scalars in self._sql(sql, tuple(params))
        ]

    # step phases ------------------------------------------------------------
    def add_phases(self, job: str, rank: int, rows: Iterable[list[float]]) -> None:
        """``[step, *PHASES]`` rows of one rank (see :mod:`clustersdk.runtime.phases`)."""
        self._batch("phases", [(job, rank, int(r[0]), _dumps(list(r[1:]))) for r in rows])

    def phases(
        self, job: str, since: int = 0, limit: int | None = None, tail: int | None = None
    ) -> list[dict[str, Any]]:
        """Phase rows after ``since`` (the first ``limit``, or only the newest ``tail``),
        oldest first: seq, rank, step and each phase's seconds."""
        from ..protocol import PHASES

        order, count = ("DESC", tail) if tail is not None else ("ASC", limit)
        sql = (
            "SELECT seq, rank, step, phases FROM phases WHERE job = ? AND seq > ? "
            f"ORDER BY seq {order}"
        )
        params: tuple = (job, since)
        if count is not None:
            sql += " LIMIT ?"
            params += (count,)
        rows = [
            {"seq": seq, "rank": rank, "step": step, **dict(zip(PHASES, json.loads(values)))}
            for seq, rank, step, values in self._sql(sql, params)
        ]
        return rows[::-1] if tail is not None else rows

    # system samples ---------------------------------------------------------
    def add_system(self, job: str, samples: Iterable[dict[str, Any]]) -> None:
        self._batch("system", [(job, s["rank"], s["time"], _dumps(s["sample"])) for s in samples])

    def system(self, job: str, since: int = 0) -> list[dict[str, Any]]:
        """GPU (or CPU) samples after ``since``: seq, rank, time, source and each reading."""
        rows = self._sql(
            "SELECT seq, rank, time, sample FROM system WHERE job = ? AND seq > ? ORDER BY seq",
            (job, since),
        )
        return [
            {**json.loads(sample), "seq": seq, "rank": rank, "time": t}
            for seq, rank, t, sample in rows
        ]

    # logs -----------------------------------------------------------------
    def add_logs(self, job: str, lines: Iterable[tuple[int, float, str, str]]) -> None:
        self._batch("logs", [(job, *line) for line in lines])

    def logs(self, job: str, rank: int | None = None, since: int = 0) -> list[dict[str, Any]]:
        sql = "SELECT seq, rank, time, stream, text FROM logs WHERE job = ? AND seq > ?"
        params: tuple = (job, since)
        if rank is not None:
            sql += " AND rank = ?"
            params += (rank,)
        rows = self._sql(sql + " ORDER BY seq", params).fetchall()
        return [dict(r) for r in rows]


# one encoder for every row: json.dumps with any argument builds a new JSONEncoder per call,
# a third of each row's encoding at thousands of rows a second
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _encode(record: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (json.dumps(v) if k in _JSON_FIELDS and v is not None else v) for k, v in record.items()
    }


def _decode(row: sqlite3.Row) -> dict[str, Any]:
    record = dict(row)
    for k in _JSON_FIELDS:
        if record.get(k) is not None:
            record[k] = json.loads(record[k])
    return record
