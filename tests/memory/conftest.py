"""Fixtures of the memory tests: one conformance suite over SQLite and a real PostgreSQL server.

The PostgreSQL server is a throwaway cluster started once per session (initdb + pg_ctl in a temporary
directory, on a free loopback port, as the ``postgres`` OS user when the tests run as root); each test
gets a fresh database in it. `.ci/postgres.sh` installs the server when it is missing. In CI
(``CI=true``) an unavailable server fails the tests; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from memory import Store

BACKENDS = ["sqlite", "postgresql"]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"PostgreSQL is required in CI: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unavailable: {reason}")


def _bindir() -> Path | None:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    for candidate in reversed(candidates):
        if (candidate / "pg_ctl").exists():
            return candidate
    found = shutil.which("pg_ctl")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """A throwaway PostgreSQL cluster; `database` creates a fresh database and returns its URL."""

    def __init__(self) -> None:
        bindir = _bindir()
        if bindir is None:
            _unavailable("server binaries not found; run `bash .ci/postgres.sh`")
        assert bindir is not None
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="a3r-memory-pg-"))
        self.data = self.root / "data"
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            # initdb refuses to run as root.
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.port = _free_port()
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100"
        )
        self._pg(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )
        self.base = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}"

    def _pg(self, program: str, *args: str) -> None:
        result = subprocess.run(
            [*self.prefix, str(self.bindir / program), *args], capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            _unavailable(f"{program} failed ({result.returncode}): {result.stderr.strip()[-2000:]} {tail}")

    def _admin(self) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        )

    def database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        with self._admin() as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return f"{self.base}/{name}"

    def drop(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with self._admin() as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def stop(self) -> None:
        subprocess.run(
            [*self.prefix, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty store on each backend (a SQLite file, or a fresh PostgreSQL database)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'memory.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.database()
    try:
        yield url
    finally:
        server.drop(url)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """An opened (migrated) store on each backend."""
    with Store(store_url) as opened:
        yield opened
