"""PostgreSQL for integration tests: a session-scoped ``postgres_dsn`` fixture and fresh databases.

Import the fixtures into a test module with
``from tests.integration.postgres import postgres_dsn  # noqa: F401``.

The server is the one given by ``PIPELINE_TEST_POSTGRES_DSN``, or one this
session starts with ``scripts/postgres.sh`` on a free port in a temporary
directory (stopped and removed at the end). Under ``CI=true`` a server that
cannot be started fails the run; elsewhere the tests that need it are skipped
with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parents[2]
POSTGRES_SH = ROOT / "scripts" / "postgres.sh"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _unavailable(message: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A PostgreSQL DSN for this test session (given, or a throwaway server started here)."""
    given = os.environ.get("PIPELINE_TEST_POSTGRES_DSN")
    if given:
        yield given
        return
    run_dir = Path(tempfile.mkdtemp(prefix="pipeline-pytest-pg."))
    # mkdtemp makes the directory 0700; the server runs as the 'postgres' user when we are root.
    run_dir.chmod(0o755)
    port = _free_port()
    env = dict(os.environ, PG_RUN_DIR=str(run_dir))
    try:
        started = subprocess.run(
            [str(POSTGRES_SH), "start", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        subprocess.run([str(POSTGRES_SH), "stop", str(port)], env=env, check=False, capture_output=True)
        shutil.rmtree(run_dir, ignore_errors=True)
        _unavailable(f"could not run {POSTGRES_SH}: {exc}")
    if started.returncode != 0:
        subprocess.run([str(POSTGRES_SH), "stop", str(port)], env=env, check=False, capture_output=True)
        shutil.rmtree(run_dir, ignore_errors=True)
        _unavailable(f"could not start PostgreSQL with scripts/postgres.sh:\n{started.stderr}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([str(POSTGRES_SH), "stop", str(port)], env=env, check=False, capture_output=True)
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def postgres_db(postgres_dsn: str) -> Iterator[str]:
    """A DSN of a fresh database for one test (CREATE DATABASE on the session's server), dropped afterwards."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.errors.InsufficientPrivilege:
        _unavailable("the PostgreSQL user of PIPELINE_TEST_POSTGRES_DSN needs the CREATEDB privilege")
    try:
        yield make_conninfo(postgres_dsn, dbname=name)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
