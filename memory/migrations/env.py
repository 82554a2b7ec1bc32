"""Alembic environment of the knowledge store.

The store runs migrations itself (`memory._db.upgrade`) and passes its connection in
``config.attributes["connection"]``; without one (the ``alembic`` command line with ``-x url=...`` or a
``sqlalchemy.url`` option) an engine is built from the URL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from memory._models import metadata

# Arbitrary constant identifying the store's migration lock among PostgreSQL advisory locks.
_PG_MIGRATION_LOCK = 0x4133_524D


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Two processes opening a fresh store at once: the second waits, then finds the schema
            # at head and does nothing.
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        context.run_migrations()


def _run_offline() -> None:
    context.configure(
        url=context.get_x_argument(as_dictionary=True).get("url")
        or context.config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    _run_offline()
else:
    given = context.config.attributes.get("connection")
    if given is not None:
        _run(given)
    else:
        url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option(
            "sqlalchemy.url"
        )
        if not url:
            raise SystemExit("memory migrations: pass -x url=SQLALCHEMY_URL or set sqlalchemy.url")
        engine = sa.create_engine(url)
        with engine.begin() as connection:
            _run(connection)
        engine.dispose()
