"""Revision 0010 finishes after a failed concurrent build: an INVALID leftover is rebuilt.

``CREATE INDEX CONCURRENTLY`` that fails (a cancelled statement, a deadlock, a lost
connection) leaves an INVALID index under its name, which ``IF NOT EXISTS`` would keep
forever: unused by the planner, still written by every insert. The revision drops such
a leftover and builds the index again; a valid index of that name is left alone.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import URL
from test_migrations import REPO, _alembic

_INDEXES = sa.text(
    "SELECT c.relname, i.indisvalid, pg_get_indexdef(i.indexrelid) AS definition"
    " FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
    " WHERE c.relname IN ('jobs_kind_id_idx', 'jobs_queue_id_idx')"
)


def _indexes(url: URL) -> dict[str, tuple[bool, str]]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return {r.relname: (r.indisvalid, r.definition) for r in conn.execute(_INDEXES)}
    finally:
        engine.dispose()


def test_upgrade_rebuilds_an_index_a_failed_concurrent_build_left_invalid(
    empty_db_url: URL,
) -> None:
    up = _alembic(["upgrade", "0009_dashboard_audit"], REPO, empty_db_url)
    assert up.returncode == 0, up.stderr
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload) VALUES ('same', '{}'), ('same', '{}')"
        )
        # A unique build over duplicates fails after creating the index: INVALID.
        try:
            conn.exec_driver_sql("CREATE UNIQUE INDEX CONCURRENTLY jobs_kind_id_idx ON jobs (kind)")
        except sa.exc.IntegrityError:
            pass
        else:
            raise AssertionError("the unique build over duplicates succeeded")
        # A valid index of the revision's name and definition, built by hand beforehand.
        conn.exec_driver_sql("CREATE INDEX jobs_queue_id_idx ON jobs (queue, id)")
        oid = conn.exec_driver_sql("SELECT 'jobs_queue_id_idx'::regclass::oid").scalar_one()
    engine.dispose()
    assert _indexes(empty_db_url)["jobs_kind_id_idx"][0] is False

    up = _alembic(["upgrade", "head"], REPO, empty_db_url)
    assert up.returncode == 0, up.stderr
    found = _indexes(empty_db_url)
    assert found["jobs_kind_id_idx"] == (
        True,
        "CREATE INDEX jobs_kind_id_idx ON public.jobs USING btree (kind, id)",
    )
    assert found["jobs_queue_id_idx"][0] is True
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    with engine.connect() as conn:  # kept, not rebuilt
        assert conn.exec_driver_sql("SELECT 'jobs_queue_id_idx'::regclass::oid").scalar_one() == oid
    engine.dispose()

    down = _alembic(["downgrade", "0009_dashboard_audit"], REPO, empty_db_url)
    assert down.returncode == 0, down.stderr
    assert _indexes(empty_db_url) == {}


_AGE_INDEXES = sa.text(
    "SELECT c.relname, i.indisvalid, pg_get_indexdef(i.indexrelid) AS definition"
    " FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
    " WHERE c.relname IN ('jobs_created_at_idx', 'jobs_created_hour_idx')"
)


def _age_indexes(url: URL) -> dict[str, tuple[bool, str]]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return {r.relname: (r.indisvalid, r.definition) for r in conn.execute(_AGE_INDEXES)}
    finally:
        engine.dispose()


def test_the_created_hour_index_replaces_created_at_and_an_invalid_leftover_is_rebuilt(
    empty_db_url: URL,
) -> None:
    """Revision 0016 builds ``jobs_created_hour_idx`` (again, over an INVALID leftover of a
    failed concurrent build) and drops 0012's ``jobs_created_at_idx``; its downgrade
    puts 0012's back and drops its own."""
    up = _alembic(["upgrade", "0015_workflow_list"], REPO, empty_db_url)
    assert up.returncode == 0, up.stderr
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload, idempotency_key)"
            " VALUES ('same', '{}', 'a'), ('same', '{}', 'b')"
        )
        # A unique build over duplicates fails after creating the index: INVALID.
        try:
            conn.exec_driver_sql(
                "CREATE UNIQUE INDEX CONCURRENTLY jobs_created_hour_idx ON jobs (kind)"
            )
        except sa.exc.IntegrityError:
            pass
        else:
            raise AssertionError("the unique build over duplicates succeeded")
    engine.dispose()
    assert _age_indexes(empty_db_url)["jobs_created_hour_idx"][0] is False

    up = _alembic(["upgrade", "head"], REPO, empty_db_url)
    assert up.returncode == 0, up.stderr
    assert _age_indexes(empty_db_url) == {
        "jobs_created_hour_idx": (
            True,
            "CREATE INDEX jobs_created_hour_idx ON public.jobs USING btree"
            " (date_bin('01:00:00'::interval, created_at,"
            " '2000-01-01 00:00:00+00'::timestamp with time zone), id) INCLUDE (created_at)",
        )
    }

    down = _alembic(["downgrade", "0015_workflow_list"], REPO, empty_db_url)
    assert down.returncode == 0, down.stderr
    assert _age_indexes(empty_db_url) == {
        "jobs_created_at_idx": (
            True,
            "CREATE INDEX jobs_created_at_idx ON public.jobs USING btree (created_at, id)",
        )
    }
