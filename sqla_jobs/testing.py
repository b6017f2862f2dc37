"""Helpers for tests against a real PostgreSQL server (ours, and your application's).

::

    admin = testing.find_server()                      # DATABASE_URL, local :5432, or embedded
    with testing.scratch_database(admin, migrate=True) as url:
        engine = create_engine(url)
        ...

``find_server`` never mocks anything: it returns a URL of a real server, starting the
embedded one (the ``embedded`` extra, pgserver) only when nothing else answers.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

from sqla_jobs import config, migrations
from sqla_jobs.sql import admin
from sqla_jobs.tasks import Registry

LOCAL_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

_embedded: object | None = None  # keeps the embedded server alive for the process


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def embedded_server(datadir: str | os.PathLike[str] | None = None) -> URL:
    """Start (or reuse) a pip-installed PostgreSQL in ``datadir``; return its admin URL.

    The server is stopped when the process exits. Needs ``pip install sqla-jobs[embedded]``.
    """
    global _embedded
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers): harmless.
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError:
        raise RuntimeError(
            "no PostgreSQL server found: set DATABASE_URL, start one on 127.0.0.1:5432, "
            "or install the embedded server with: pip install 'sqla-jobs[embedded]'"
        ) from None
    path = Path(datadir) if datadir else Path(tempfile.mkdtemp(prefix="sqla_jobs_pg_"))
    path.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = pgserver.get_server(  # type: ignore[attr-defined]
            str(path), cleanup_mode="stop"
        )
    _embedded = server
    return config.database_url(server.get_uri())


def find_server(env: str = "DATABASE_URL") -> URL:
    """An admin URL: ``$DATABASE_URL`` if set, else 127.0.0.1:5432 if it answers, else embedded."""
    raw = os.environ.get(env)
    if raw:
        return config.database_url(raw)
    if _answers("127.0.0.1", 5432):
        return config.database_url(LOCAL_SERVER)
    return embedded_server()


def _admin(url: URL) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)


def create_database(admin_url: URL, name: str, *, template: str | None = None) -> URL:
    """CREATE DATABASE ``name`` (optionally from a template) and return its URL."""
    preparer = sa.create_engine(admin_url).dialect.identifier_preparer
    sql = f"CREATE DATABASE {preparer.quote(name)}"
    if template:
        sql += f" TEMPLATE {preparer.quote(template)}"
    engine = _admin(admin_url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()
    return admin_url.set(database=name)


def drop_database(admin_url: URL, name: str) -> None:
    """DROP DATABASE IF EXISTS ``name`` WITH (FORCE): disconnects leftover sessions."""
    preparer = sa.create_engine(admin_url).dialect.identifier_preparer
    engine = _admin(admin_url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {preparer.quote(name)} WITH (FORCE)")
    finally:
        engine.dispose()


def migrate(url: URL | str, revision: str = "heads") -> None:
    """Run sqla_jobs' Alembic migrations up to ``revision`` on the database at ``url``."""
    engine = sa.create_engine(
        config.database_url(str(url)) if isinstance(url, str) else url, poolclass=sa.NullPool
    )
    try:
        with engine.connect() as conn:
            migrations.upgrade(conn, revision)
    finally:
        engine.dispose()


@contextmanager
def scratch_database(
    admin_url: URL,
    *,
    prefix: str = "sqla_jobs_test",
    migrate: bool = True,
    template: str | None = None,
) -> Iterator[URL]:
    """A throwaway database, migrated unless told otherwise, dropped on exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    url = create_database(admin_url, name, template=template)
    try:
        if migrate and template is None:
            globals()["migrate"](url)
        yield url
    finally:
        drop_database(admin_url, name)


def drain(
    url: URL | str,
    registry: Registry,
    *,
    timeout: float = 30.0,
    queues: tuple[str, ...] | None = None,
) -> None:
    """Run ``registry``'s handlers in this process until none of its jobs is ready or running.

    Like Oban.Testing's ``drain_queue``: a real worker against the real database, stopped
    once the queue is empty. Jobs scheduled in the future are left alone. Raises
    TimeoutError if jobs are still ready or running after ``timeout`` seconds.
    """
    from sqla_jobs.worker import Worker

    text = url if isinstance(url, str) else url.render_as_string(hide_password=False)
    if not queues:
        # Every queue the registry's jobs sit in (read once, before running).
        probe = sa.create_engine(config.database_url(text), poolclass=sa.NullPool)
        try:
            with probe.connect() as conn:
                stmt = admin.queues_of_kinds(list(registry.kinds))
                queues = tuple(conn.execute(stmt).scalars()) or ("default",)
        finally:
            probe.dispose()
    worker = Worker(
        registry,
        config.WorkerConfig(
            database_url=text,
            listen=False,
            poll_interval=0.05,
            shutdown_timeout=timeout,
            queues=queues,
        ),
    )
    thread = threading.Thread(target=worker.run, name="sqla_jobs-drain", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    stmt = admin.pending_count(list(registry.kinds), list(worker.queues))
    try:
        while True:
            with worker.engine.connect() as conn:
                if conn.execute(stmt).scalar_one() == 0:
                    return
            if time.monotonic() > deadline or not thread.is_alive():
                raise TimeoutError(f"jobs still ready or running after {timeout}s")
            time.sleep(0.02)
    finally:
        worker.stop()
        thread.join(timeout)
        worker.engine.dispose()
