"""A pytest plugin: a migrated scratch database per test run, a session per test.

Opt in from your top-level ``conftest.py``::

    pytest_plugins = ["sqla_jobs.pytest_plugin"]

and, to run your application's own Alembic history (``alembic upgrade heads``, which
includes sqla_jobs' branch) instead of sqla_jobs' migrations alone, name its config in
your pytest settings::

    [tool.pytest.ini_options]
    sqla_jobs_alembic_ini = "alembic.ini"

Fixtures (override any of them in a conftest.py of your own):

* ``sqla_jobs_admin_url`` (session): a real server, from
  [``sqla_jobs.testing.find_server``][sqla_jobs.testing.find_server] (``$DATABASE_URL``, else
  127.0.0.1:5432, else the embedded server).
* ``sqla_jobs_alembic_config`` (session): the Alembic ``Config`` to migrate with, or None
  for sqla_jobs' own migrations. From ``sqla_jobs_alembic_ini``; its ``sqlalchemy.url`` is
  replaced by the scratch database's, so your ``env.py`` must read the URL from it (as
  the one ``alembic init`` writes does); its ``prepend_sys_path`` is put on ``sys.path``
  (relative to the ini's folder), as the ``alembic`` command does.
* ``sqla_jobs_template``: a database migrated once per run; every test clones it.
* ``sqla_jobs_database_url``: a fresh migrated database for this test, dropped afterwards.
* ``sqla_jobs_engine``: an engine on it. ``sqla_jobs_session``: a ``Session`` on that
  engine, rolled back and closed after the test.

The clone costs a ``CREATE DATABASE ... TEMPLATE`` (tens of milliseconds), so tests share
nothing, and a test may commit, run a worker
([``sqla_jobs.testing.drain``][sqla_jobs.testing.drain]) or inline jobs
([``sqla_jobs.testing.run_inline``][sqla_jobs.testing.run_inline]) as it likes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import testing

INI_OPTION = "sqla_jobs_alembic_ini"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        INI_OPTION,
        "alembic.ini of your app (relative to the rootdir): the sqla_jobs plugin's scratch "
        "databases run its `alembic upgrade heads` instead of sqla_jobs' migrations alone",
        default="",
    )


@pytest.fixture(scope="session")
def sqla_jobs_admin_url() -> URL:
    return testing.find_server()


@pytest.fixture(scope="session")
def sqla_jobs_alembic_config(pytestconfig: pytest.Config) -> Any:
    """The app's Alembic Config (from the ``sqla_jobs_alembic_ini`` setting), or None."""
    from alembic.config import Config

    value = str(pytestconfig.getini(INI_OPTION) or "").strip()
    if not value:
        return None
    path = Path(value)
    if not path.is_absolute():
        path = pytestconfig.rootpath / path
    if not path.is_file():
        raise pytest.UsageError(f"{INI_OPTION} = {value!r}: no such file ({path})")
    return Config(str(path))


@pytest.fixture(scope="session")
def sqla_jobs_template(sqla_jobs_admin_url: URL, sqla_jobs_alembic_config: Any) -> Iterator[str]:
    """Name of a database migrated once for the whole run (dropped at the end)."""
    name = f"sqla_jobs_tpl_{uuid.uuid4().hex[:12]}"
    url = testing.create_database(sqla_jobs_admin_url, name)
    try:
        if sqla_jobs_alembic_config is None:
            testing.migrate(url)
        else:
            testing.migrate_app(sqla_jobs_alembic_config, url)
        yield name
    finally:
        testing.drop_database(sqla_jobs_admin_url, name)


@pytest.fixture
def sqla_jobs_database_url(sqla_jobs_admin_url: URL, sqla_jobs_template: str) -> Iterator[URL]:
    """A fresh database for this test, cloned from the migrated template."""
    with testing.scratch_database(
        sqla_jobs_admin_url, prefix="sqla_jobs_test", template=sqla_jobs_template
    ) as url:
        yield url


@pytest.fixture
def sqla_jobs_engine(sqla_jobs_database_url: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(sqla_jobs_database_url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def sqla_jobs_session(sqla_jobs_engine: sa.Engine) -> Iterator[Session]:
    """A Session for the test; whatever it did not commit is rolled back afterwards."""
    with Session(sqla_jobs_engine) as session:
        try:
            yield session
        finally:
            session.rollback()
