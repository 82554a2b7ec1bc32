"""Engine, sessions and schema migrations of the knowledge store.

`resolve_url` turns a path or SQLAlchemy URL into a URL; `make_engines` builds the engine with the
SQLite settings that make several processes safe (WAL journal, foreign keys, busy timeout, and
``BEGIN IMMEDIATE`` for write transactions so two writers serialise instead of failing on upgrade of
a read lock); `upgrade` brings the schema to the newest Alembic revision shipped in
``memory/migrations``; `translate_errors` maps SQLAlchemy and Alembic errors onto `memory._errors`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, OperationalError
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from memory._errors import (
    IntegrityViolation,
    NotFound,
    SchemaVersionError,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
)
from memory._vocabulary import DEFAULT_PATH

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "DEFAULT_PATH",
    "HEAD_REVISION",
    "Engines",
    "alembic_config",
    "current_revision",
    "head_revision",
    "make_engines",
    "resolve_url",
    "translate_errors",
    "upgrade",
]

_MIGRATIONS = Path(__file__).with_name("migrations")
HEAD_REVISION = "0002"
"""The newest revision in ``memory/migrations`` (a test checks it against Alembic's scan of the scripts):
a store already at it opens without importing Alembic (≈ 0.2 s of every store command's start-up)."""
_WRITE_OPTION = "memory_write"


def resolve_url(location: str | Path | None, *, create: bool = True) -> URL:
    """Turn a store location into a SQLAlchemy URL.

    Args:
        location: ``None`` for `DEFAULT_PATH`, a filesystem path to a SQLite file, or any SQLAlchemy
            URL (``sqlite:///...``, ``postgresql+psycopg://user@host/db``).
        create: Create the parent directory of a SQLite file if missing; when ``False`` a missing
            SQLite file raises `NotFound` instead of being created.

    Returns:
        The parsed URL.

    Raises:
        StoreConfigError: The URL cannot be parsed.
        NotFound: ``create`` is ``False`` and the SQLite file does not exist.
    """
    if location is None:
        location = DEFAULT_PATH
    text = str(location)
    if "://" in text:
        try:
            url = make_url(text)
        except (ArgumentError, ValueError) as exc:
            # The message names only the scheme, never the credentials in the URL.
            raise StoreConfigError(f"malformed store URL (scheme {text.split('://')[0]!r})") from exc
    else:
        url = URL.create("sqlite", database=str(Path(text).expanduser()))
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        path = Path(url.database)
        if not path.exists():
            if not create:
                raise NotFound("store", path)
            path.parent.mkdir(parents=True, exist_ok=True)
    return url


@dataclass(frozen=True)
class Engines:
    """The engine of one store and its write view (same pool).

    Attributes:
        read: Engine for read transactions.
        write: Same engine with the write option: on SQLite its transactions begin with
            ``BEGIN IMMEDIATE``, taking the write lock up front.
    """

    read: Engine
    write: Engine


def make_engines(url: URL, *, busy_timeout_s: float = 30.0, echo: bool = False) -> Engines:
    """Create the engine for ``url``.

    Args:
        url: Store URL (see `resolve_url`).
        busy_timeout_s: How long a SQLite writer waits for the lock, in seconds.
        echo: Log every SQL statement (debugging).

    Raises:
        StoreConfigError: No driver for the URL's dialect is installed.
    """
    is_sqlite = url.get_backend_name() == "sqlite"
    kwargs: dict[str, Any] = {"echo": echo}
    if is_sqlite:
        kwargs["connect_args"] = {"timeout": busy_timeout_s, "check_same_thread": False}
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = sa.create_engine(url, **kwargs)
    except (NoSuchModuleError, ArgumentError) as exc:
        raise StoreConfigError(f"unsupported store URL dialect {url.drivername!r}: {exc}") from exc
    except ImportError as exc:
        raise StoreConfigError(f"driver for {url.drivername!r} is not installed ({exc.name})") from exc
    if is_sqlite:
        _configure_sqlite(engine, busy_timeout_s)
    return Engines(read=engine, write=engine.execution_options(**{_WRITE_OPTION: True}))


def _configure_sqlite(engine: Engine, busy_timeout_s: float) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own transaction handling is turned off; `_on_begin` emits BEGIN itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        if engine.url.database not in (None, "", ":memory:"):
            _enable_wal(cursor, busy_timeout_s)
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        # A deferred transaction that reads and then writes fails with SQLITE_BUSY when another
        # writer committed in between (no busy wait possible); IMMEDIATE takes the lock first.
        immediate = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _enable_wal(cursor: Any, timeout_s: float) -> None:
    """Switch the database file to WAL, retrying while another connection holds it.

    Switching needs an exclusive lock, and SQLite answers SQLITE_BUSY at once, without calling the
    busy handler, when another process is opening or converting the same fresh file (seen when two
    processes open a new store together). The mode is persistent, so later opens find it set.
    """
    retrying = Retrying(
        retry=retry_if_exception(
            lambda exc: isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
        ),
        wait=wait_exponential(multiplier=0.01, max=0.5),
        stop=stop_after_delay(timeout_s),
        reraise=True,
    )
    for attempt in retrying:
        with attempt:
            cursor.execute("PRAGMA journal_mode = WAL")


def alembic_config(connection: sa.Connection | None = None) -> Config:
    """Alembic configuration for the migrations shipped in the package (no ``alembic.ini`` needed).

    Args:
        connection: Connection the migrations run on (passed to ``env.py`` through
            ``config.attributes``).
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """Newest schema revision shipped with this code (Alembic's scan of the scripts)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """Schema revision of the database, or ``None`` for an empty database (no or an empty version
    table). Read with plain SQL from Alembic's ``alembic_version`` table, without importing Alembic.

    Raises:
        SchemaVersionError: The version table names several revisions (branches this code never makes).
    """
    with engine.connect() as connection:
        if not sa.inspect(connection).has_table("alembic_version"):
            return None
        rows = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:
        raise SchemaVersionError(f"store schema has several revisions ({', '.join(rows)}); expected one")
    return str(rows[0]) if rows else None


def upgrade(engines: Engines, revision: str = "head") -> None:
    """Migrate the database to ``revision`` (default: newest), in one transaction.

    Safe when several processes open a fresh store at once: on SQLite the write transaction holds
    the database lock, on PostgreSQL ``env.py`` takes an advisory lock.

    Raises:
        SchemaVersionError: The database is at a revision this code does not know (newer code
            wrote it).
        StoreUnavailable: The database cannot be reached.
    """
    with translate_errors():
        current = current_revision(engines.read)
        if revision == "head" and current == HEAD_REVISION:
            return  # the common case: no migration, and no Alembic import
        from alembic import command
        from alembic.script import ScriptDirectory

        script = ScriptDirectory.from_config(alembic_config())
        if current is not None and current not in {rev.revision for rev in script.walk_revisions()}:
            raise SchemaVersionError(
                f"store schema is at revision {current}, which this version of memory does not know "
                f"(newest known: {script.get_current_head()}); upgrade the package"
            )
        if revision == "head" and current == script.get_current_head():
            return
        with engines.write.begin() as connection:
            command.upgrade(alembic_config(connection), revision)


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise SQLAlchemy and Alembic errors as `memory._errors` types, chained to the original."""
    try:
        yield
    except StoreError:
        raise
    except IntegrityError as exc:
        raise IntegrityViolation(f"constraint violated: {_first_line(exc.orig)}") from exc
    except OperationalError as exc:
        raise StoreUnavailable(f"database unavailable: {_first_line(exc.orig)}") from exc
    except sa.exc.SQLAlchemyError as exc:
        raise StoreError(f"database error: {_first_line(exc)}") from exc
    except Exception as exc:
        if _is_alembic_command_error(exc):
            raise SchemaVersionError(f"schema migration failed: {_first_line(exc)}") from exc
        raise


def _is_alembic_command_error(exc: Exception) -> bool:
    """Whether ``exc`` is Alembic's ``CommandError`` (Alembic is imported only when one was raised: only
    a migration, which imported it, raises one)."""
    if "alembic" not in sys.modules:
        return False
    from alembic.util import CommandError

    return isinstance(exc, CommandError)


def _first_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
