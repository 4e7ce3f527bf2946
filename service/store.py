"""The plan store: jobs, their states and finished plans in one embedded SQLite file.

State changes are compare-and-set (`UPDATE ... WHERE status IN (...)`), so a cancel racing a
finishing solve leaves exactly one of them in effect. One connection serves the process,
guarded by a lock; SQLite keeps the data across restarts.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from autoshard.encodable import encodable_copy
from autoshard.errors import InputError

ACTIVE = ("queued", "solving")
FINAL = ("done", "failed", "cancelled", "interrupted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    progress TEXT NOT NULL DEFAULT '{}',
    plan TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_key ON jobs (key, created_at);
CREATE TABLE IF NOT EXISTS ir (
    job_id TEXT NOT NULL REFERENCES jobs (id),
    stage TEXT NOT NULL,
    dialect TEXT NOT NULL,
    arguments TEXT NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (job_id, stage, dialect, arguments)
);
"""


@dataclass(frozen=True)
class Job:
    id: str
    key: str
    status: str
    request: dict[str, Any]
    progress: dict[str, Any]
    plan: dict[str, Any] | None
    error: dict[str, Any] | None
    created_at: float
    updated_at: float

    @property
    def final(self) -> bool:
        return self.status in FINAL


DB_FLAG = "--db (or AUTOSHARD_DB)"  # where a store's path comes from, for the user


class Store:
    def __init__(self, path: Path | str):
        """Open (or create) the store at `path`; an `InputError` naming `DB_FLAG` says why a path
        cannot hold one: a directory, a directory that does not exist, a file that is not SQLite
        or holds other tables under our names."""
        self.path = Path(path)
        _check_path(self.path)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        except sqlite3.Error as error:
            raise InputError(f"{self.path}: cannot open: {error}", DB_FLAG) from None
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            _check_columns(self._db)
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as error:  # DatabaseError: not SQLite; OperationalError: read-only, locked, ...
            self._db.close()
            reason = "not an SQLite database" if "not a database" in str(error) else str(error)
            raise InputError(f"{self.path} cannot hold the plan store: {reason}", DB_FLAG) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _execute(self, sql: str, args: Iterable[Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, tuple(args))

    def create(self, key: str, request: dict[str, Any]) -> Job:
        now = time.time()
        job_id = uuid.uuid4().hex
        self._execute("INSERT INTO jobs (id, key, status, request, created_at, updated_at) VALUES (?, ?, 'queued', ?, ?, ?)",
                      (job_id, key, _dumps(request), now, now))
        job = self.get(job_id)
        assert job is not None
        return job

    def get(self, job_id: str) -> Job | None:
        row = self._execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    def find_reusable(self, key: str) -> Job | None:
        """The newest job for these inputs that is done or still on its way to a plan."""
        row = self._execute("SELECT * FROM jobs WHERE key = ? AND status IN ('queued', 'solving', 'done') "
                            "ORDER BY created_at DESC LIMIT 1", (key,)).fetchone()
        return _job(row) if row else None

    def counts(self) -> dict[str, int]:
        rows = self._execute("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status").fetchall()
        return {row["status"]: row["n"] for row in rows}

    def start(self, job_id: str) -> bool:
        return self._transition(job_id, ("queued",), "solving")

    def set_progress(self, job_id: str, progress: dict[str, Any]) -> None:
        self._execute("UPDATE jobs SET progress = ?, updated_at = ? WHERE id = ? AND status = 'solving'",
                      (_dumps(progress), time.time(), job_id))

    def finish(self, job_id: str, plan: dict[str, Any], ir: Iterable[tuple[str, str, str, str]] = ()) -> bool:
        """Store the plan and the IR emitted with it (stage, dialect, arguments, text) at once."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                cursor = self._db.execute("UPDATE jobs SET status = 'done', plan = ?, updated_at = ? "
                                          "WHERE id = ? AND status = 'solving'", (_dumps(plan), time.time(), job_id))
                self._db.executemany("INSERT OR REPLACE INTO ir (job_id, stage, dialect, arguments, text) "
                                     "VALUES (?, ?, ?, ?, ?)", [(job_id, *entry) for entry in ir])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT" if cursor.rowcount == 1 else "ROLLBACK")
            return cursor.rowcount == 1

    def fail(self, job_id: str, error: dict[str, Any]) -> bool:
        return self._transition(job_id, ACTIVE, "failed", error=_dumps(error))

    def cancel(self, job_id: str) -> bool:
        return self._transition(job_id, ACTIVE, "cancelled",
                                error=_dumps({"kind": "cancelled", "message": "cancelled by a DELETE request"}))

    def interrupt(self, job_id: str, plan: dict[str, Any], error: dict[str, Any]) -> bool:
        """A solve stopped by a shutdown, with the best plan it had found."""
        return self._transition(job_id, ("solving",), "interrupted", plan=_dumps(plan), error=_dumps(error))

    def mark_interrupted(self) -> int:
        """Jobs a previous process left solving (it was killed): their solve was lost with it."""
        error = _dumps({"kind": "interrupted", "message": "interrupted by a restart of the service, before the "
                                                              "solve could hand over a plan"})
        cursor = self._execute("UPDATE jobs SET status = 'interrupted', error = ?, updated_at = ? "
                               "WHERE status = 'solving'", (error, time.time()))
        return cursor.rowcount

    def queued(self) -> list[str]:
        """Ids of the jobs waiting to be solved, oldest first (a restart runs them)."""
        rows = self._execute("SELECT id FROM jobs WHERE status = 'queued' ORDER BY created_at, rowid").fetchall()
        return [row["id"] for row in rows]

    def queue_position(self, job_id: str) -> int | None:
        """1 for the next job to start, 2 for the one after it, ...; None unless the job is queued.
        Jobs take workers in the order they came (`created_at`, then insertion), as `queued()` lists
        them; a small one may start earlier, in the fast lane (`service/lanes.py`)."""
        row = self._execute("SELECT COUNT(*) AS ahead FROM jobs AS other, jobs AS job WHERE job.id = ? "
                            "AND job.status = 'queued' AND other.status = 'queued' AND (other.created_at, other.rowid) "
                            "<= (job.created_at, job.rowid)", (job_id,)).fetchone()
        return row["ahead"] or None

    def _transition(self, job_id: str, sources: tuple[str, ...], target: str, **columns: str) -> bool:
        sets = "".join(f", {name} = ?" for name in columns)
        marks = ", ".join("?" for _ in sources)
        cursor = self._execute(f"UPDATE jobs SET status = ?, updated_at = ?{sets} WHERE id = ? AND status IN ({marks})",
                               (target, time.time(), *columns.values(), job_id, *sources))
        return cursor.rowcount == 1

    def get_ir(self, job_id: str, stage: str, dialect: str, arguments: str) -> str | None:
        row = self._execute("SELECT text FROM ir WHERE job_id = ? AND stage = ? AND dialect = ? AND arguments = ?",
                            (job_id, stage, dialect, arguments)).fetchone()
        return row["text"] if row else None

    def put_ir(self, job_id: str, stage: str, dialect: str, arguments: str, text: str) -> None:
        self._execute("INSERT OR REPLACE INTO ir (job_id, stage, dialect, arguments, text) VALUES (?, ?, ?, ?, ?)",
                      (job_id, stage, dialect, arguments, text))


def _check_path(path: Path) -> None:
    if path.is_dir():
        raise InputError(f"{path} is a directory; expected the path of an SQLite file", DB_FLAG)
    if not path.parent.is_dir():
        raise InputError(f"{path}: the directory {path.parent} does not exist", DB_FLAG)


_COLUMNS = {"jobs": {"id", "key", "status", "request", "progress", "plan", "error", "created_at", "updated_at"},
            "ir": {"job_id", "stage", "dialect", "arguments", "text"}}


def _check_columns(db: sqlite3.Connection) -> None:
    """A database made by something else may hold a `jobs` or `ir` table without our columns."""
    for table, wanted in _COLUMNS.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if have and not wanted <= have:  # no columns: no such table yet
            raise sqlite3.DatabaseError(f"its table {table!r} lacks the columns {sorted(wanted - have)}")


def _dumps(value: Any) -> str:
    """Strict JSON in UTF-8, so that what is stored can always be sent back."""
    return json.dumps(encodable_copy(value), allow_nan=False)


# a JSON \u escape of a surrogate: only a lone one (which UTF-8 cannot encode) makes a row unreadable
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _loads(text: str) -> Any:
    """A stored value; a row written before `_dumps` (NaN, a lone surrogate) is made readable too."""
    value = json.loads(text, parse_constant=lambda _: None)
    return encodable_copy(value) if _SURROGATE_ESCAPE.search(text) else value


def _job(row: sqlite3.Row) -> Job:
    return Job(row["id"], row["key"], row["status"], _loads(row["request"]), _loads(row["progress"]),
               _loads(row["plan"]) if row["plan"] else None,
               _loads(row["error"]) if row["error"] else None, row["created_at"], row["updated_at"])
