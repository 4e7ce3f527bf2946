"""The plan store: a path that cannot hold it is refused at start-up (exit 2, naming --db), and every
job it holds can be read back, before and after a restart, whatever an older version wrote."""

from __future__ import annotations

import json
import sqlite3

import pytest
from fastapi.testclient import TestClient

from autoshard.cli.main import main
from autoshard.errors import InputError
from service.app import create_app
from service.store import DB_FLAG, Store
from support.service import settings_for


def unusable_paths(tmp_path):
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("these are not the plans you are looking for\n")
    foreign = tmp_path / "foreign.sqlite3"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE jobs (name TEXT)")
    return {"missing directory": (tmp_path / "no" / "such" / "plans.sqlite3", "does not exist"),
            "not SQLite": (not_sqlite, "not an SQLite database"),
            "a directory": (tmp_path, "is a directory"),
            "someone else's tables": (foreign, "lacks the columns")}


@pytest.mark.parametrize("case", ["missing directory", "not SQLite", "a directory", "someone else's tables"])
def test_serve_refuses_an_unusable_db_with_exit_2_naming_it(tmp_path, capsys, case):
    path, words = unusable_paths(tmp_path)[case]
    assert main(["serve", "--db", str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"{DB_FLAG}: " in err and words in err and "Traceback" not in err
    assert not (tmp_path / "no").exists()  # nothing created on the way


def test_the_store_itself_refuses_the_same_paths(tmp_path):
    for path, words in unusable_paths(tmp_path).values():
        with pytest.raises(InputError, match=words) as error:
            Store(path)
        assert error.value.problems[0].where == DB_FLAG


def test_values_strict_json_cannot_hold_are_stored_readable(tmp_path):
    """NaN and lone surrogates reach the store only by a bug; they are written so that a response can
    carry them (null, an escape) rather than make the job unreadable."""
    store = Store(tmp_path / "plans.sqlite3")
    job = store.create("key", {"graph": {"name": "\ud800"}, "options": {}})
    store.start(job.id)
    store.set_progress(job.id, {"objective": float("nan"), "lower_bound": float("-inf")})
    stored = store.get(job.id)
    assert stored.request["graph"]["name"] == "\\ud800"
    assert stored.progress == {"objective": None, "lower_bound": None}
    store.close()


def test_jobs_an_older_version_stored_with_nan_or_a_lone_surrogate_read_back_after_a_restart(tmp_path):
    settings = settings_for(tmp_path)
    Store(settings.db).close()
    with sqlite3.connect(settings.db) as db:  # rows as json.dumps wrote them before: NaN, a \ud800 escape
        db.execute("INSERT INTO jobs (id, key, status, request, plan, error, created_at, updated_at) "
                   "VALUES ('old', 'k', 'failed', ?, ?, ?, 0, 0)",
                   (json.dumps({"graph": {"name": "\ud800"}, "options": {}}), json.dumps({"gap": float("nan")}),
                    json.dumps({"kind": "input", "message": "x", "problems": []})))
    for _ in range(2):  # and again after a restart
        with TestClient(create_app(settings)) as http:
            response = http.get("/v1/plans/old")
            assert response.status_code == 200
            assert response.json()["plan"] == {"gap": None}
