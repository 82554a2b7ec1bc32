"""SQLite specifics: WAL journal, foreign keys enforced, busy timeout, default location."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from memory import IntegrityViolation, NotFound, Store, StoreConfigError
from memory._db import DEFAULT_PATH, resolve_url


def test_wal_foreign_keys_and_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with Store(path, busy_timeout_s=7.5) as store:
        store.create_study("q")
        with store._engines.read.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 7500
            # A dangling reference is refused by the database itself, not only by the API.
            with pytest.raises(sa.exc.IntegrityError):
                connection.exec_driver_sql(
                    "INSERT INTO run (experiment_id, name, config, status, started_at) "
                    "VALUES (999, '', '{}', 'running', '2026-01-01 00:00:00')"
                )
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent in the file
    finally:
        raw.close()


def test_constraint_violations_are_translated(tmp_path: Path) -> None:
    from memory._db import translate_errors

    with Store(tmp_path / "m.db") as store:
        study = store.create_study("q")
        store.add_artifact(study.id, "reward", "r.py", "x")
        with (
            pytest.raises(IntegrityViolation, match="UNIQUE") as caught,
            translate_errors(),
            store._engines.write.begin() as connection,
        ):
            connection.exec_driver_sql(
                "INSERT INTO codeartifact (study_id, kind, name, version, content, sha256, created_at) "
                f"VALUES ({study.id}, 'reward', 'r.py', 1, 'y', 'h', '2026-01-01 00:00:00')"
            )
        assert isinstance(caught.value.__cause__, sa.exc.IntegrityError)


def test_locations(tmp_path: Path) -> None:
    assert resolve_url(None).database == str(DEFAULT_PATH)
    assert resolve_url(tmp_path / "a" / "b.db").database == str(tmp_path / "a" / "b.db")
    assert (tmp_path / "a").is_dir()  # parent created for a new store
    with pytest.raises(NotFound):
        resolve_url(tmp_path / "missing.db", create=False)
    assert resolve_url("sqlite:///:memory:").database == ":memory:"
    with pytest.raises(StoreConfigError):
        resolve_url("postgresql+psycopg://u@h:notaport/db")
