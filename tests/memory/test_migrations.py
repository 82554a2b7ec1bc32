"""Schema migrations: a store made by an older version upgrades in place, on both backends."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from memory import RunUpdate, SchemaVersionError, Store
from memory._db import (
    HEAD_REVISION,
    alembic_config,
    current_revision,
    head_revision,
    make_engines,
    resolve_url,
    upgrade,
)
from memory._models import metadata


def test_two_revisions_ship_with_the_package() -> None:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    assert [rev.revision for rev in script.walk_revisions()] == ["0002", "0001"]
    assert head_revision() == "0002" == HEAD_REVISION  # a new migration moves HEAD_REVISION too


def test_a_store_at_the_head_opens_without_importing_alembic(tmp_path: Path) -> None:
    """Store commands answer in under a second: a store already migrated is opened (its revision read
    with plain SQL) without Alembic's ≈ 0.2 s import; a fresh one is migrated with it."""
    import subprocess
    import sys

    code = (
        "import sys; from memory import Store; s = Store(sys.argv[1]); "
        "print(s.schema_revision, 'alembic' in sys.modules); s.close()"
    )
    db = str(tmp_path / "memory.db")
    run = [sys.executable, "-c", code, db]
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.split() == ["0002", "True"]
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.split() == ["0002", "False"]


def test_migrations_match_the_models(store: Store, store_url: str) -> None:
    """The schema Alembic builds is the one the models describe (no drift between the two)."""
    engine = sa.create_engine(store_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


def test_store_made_at_first_revision_upgrades_in_place(store_url: str) -> None:
    engines = make_engines(resolve_url(store_url))
    upgrade(engines, "0001")
    assert current_revision(engines.read) == "0001"
    now = datetime.now(UTC)
    # Rows written by the old schema (no run.git_commit yet), through plain SQL.
    with engines.write.begin() as connection:
        inspector = sa.inspect(connection)
        assert "git_commit" not in {c["name"] for c in inspector.get_columns("run")}
        connection.execute(
            sa.text(
                "INSERT INTO study (id, question, kind, status, created_at, updated_at) "
                "VALUES (1, 'old question', 'research', 'open', :now, :now)"
            ),
            {"now": now},
        )
        connection.execute(
            sa.text(
                "INSERT INTO experiment (id, study_id, name, description, created_at) "
                "VALUES (1, 1, 'old experiment', '', :now)"
            ),
            {"now": now},
        )
        connection.execute(
            sa.text(
                "INSERT INTO run (id, experiment_id, name, config, seed, status, started_at) "
                "VALUES (1, 1, 'old run', :config, 3, 'running', :now)"
            ),
            {"config": '{"lr": 0.001}', "now": now},
        )
        connection.execute(
            sa.text(
                "INSERT INTO metricpoint (run_id, step, name, value, recorded_at) VALUES (1, 4, 'kl', 0.5, :now)"
            ),
            {"now": now},
        )
        if connection.dialect.name == "postgresql":
            for table in ("study", "experiment", "run"):
                connection.execute(sa.text(f"SELECT setval('{table}_id_seq', 1)"))
    engines.read.dispose()

    with Store(store_url) as store:  # opening migrates to head
        assert store.schema_revision == "0002"
        (run,) = store.study_runs(1)
        assert (run.name, run.seed, run.config, run.git_commit) == ("old run", 3, {"lr": 0.001}, None)
        assert run.latest_metrics == {"kl": 0.5}
        assert store.get_study(1).question == "old question"
        # The new column is usable, and new rows continue the old ids.
        assert store.update_run(1, RunUpdate(git_commit="0123abc")).git_commit == "0123abc"
        assert store.start_run(1, seed=4).id == 2


def test_downgrade_and_upgrade_round_trip(store: Store, store_url: str) -> None:
    engines = make_engines(resolve_url(store_url))
    try:
        with engines.write.begin() as connection:
            command.downgrade(alembic_config(connection), "base")
        assert current_revision(engines.read) is None
        with engines.read.connect() as connection:
            assert sa.inspect(connection).get_table_names() == ["alembic_version"]
        upgrade(engines)
        assert current_revision(engines.read) == "0002"
    finally:
        engines.read.dispose()


def test_store_written_by_newer_code_is_refused(store: Store, store_url: str) -> None:
    engine = sa.create_engine(store_url)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(SchemaVersionError, match=r"9999.*upgrade the package"):
        Store(store_url)


def test_reopening_keeps_the_data(store: Store, store_url: str) -> None:
    study = store.create_study("kept")
    with Store(store_url) as again:
        assert again.get_study(study.id).question == "kept"
        assert again.schema_revision == "0002"
