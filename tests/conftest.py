"""Test harness: every test gets its own database, cloned from a migrated template.

The server is ``$DATABASE_URL`` if set, else the one on 127.0.0.1:5432 if it answers,
else the embedded server (see ``sqla_jobs.testing.find_server``). One template database
is migrated with ``alembic upgrade heads`` per run; each test clones it
(``CREATE DATABASE ... TEMPLATE``), and every database is dropped afterwards, so tests
share no state with each other or with a developer's own data.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import testing


@pytest.fixture(scope="session")
def admin_url() -> URL:
    return testing.find_server()


@pytest.fixture(scope="session")
def run_prefix() -> str:
    return f"sqla_jobs_test_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def template_db(admin_url: URL, run_prefix: str) -> Iterator[str]:
    name = f"{run_prefix}_tpl"
    url = testing.create_database(admin_url, name)
    try:
        testing.migrate(url)
        yield name
    finally:
        testing.drop_database(admin_url, name)


@pytest.fixture
def db_url(admin_url: URL, template_db: str, run_prefix: str) -> Iterator[URL]:
    """A fresh, migrated database for this test only."""
    name = f"{run_prefix}_{uuid.uuid4().hex[:8]}"
    url = testing.create_database(admin_url, name, template=template_db)
    try:
        yield url
    finally:
        testing.drop_database(admin_url, name)


@pytest.fixture
def empty_db_url(admin_url: URL, run_prefix: str) -> Iterator[URL]:
    """A fresh database with no schema at all."""
    name = f"{run_prefix}_e{uuid.uuid4().hex[:8]}"
    url = testing.create_database(admin_url, name)
    try:
        yield url
    finally:
        testing.drop_database(admin_url, name)


@pytest.fixture
def engine(db_url: URL) -> Iterator[sa.Engine]:
    eng = sa.create_engine(db_url, pool_size=10, max_overflow=60)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def session(engine: sa.Engine) -> Iterator[Session]:
    with Session(engine) as s:
        yield s


@pytest.fixture
def driver(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    """The raw psycopg connection under a pooled one (for EXPLAIN with bound values);
    rolled back afterwards."""
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        yield raw
        raw.rollback()
