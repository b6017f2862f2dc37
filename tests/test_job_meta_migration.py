"""Revision 0013 on a table that already holds jobs: the rows keep everything and read no
metadata; the GIN indexes are valid; a run interrupted after the columns were added (an
INVALID leftover of a concurrent build) finishes when run again; downgrade drops it all."""

from __future__ import annotations

import contextlib

import sqlalchemy as sa
from sqlalchemy.engine import URL
from test_migrations import REPO, _alembic

_INDEXES = sa.text(
    "SELECT c.relname, i.indisvalid FROM pg_index AS i JOIN pg_class AS c"
    " ON c.oid = i.indexrelid WHERE c.relname IN ('jobs_meta_idx', 'jobs_tags_idx')"
)


def _read(url: URL, query: sa.TextClause | str) -> list[sa.Row[tuple[object, ...]]]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(query) if isinstance(query, str) else query))
    finally:
        engine.dispose()


def test_upgrade_on_a_table_with_jobs_reruns_after_a_failed_build_and_downgrades(
    empty_db_url: URL,
) -> None:
    up = _alembic(["upgrade", "0011_attempt_history"], REPO, empty_db_url)
    assert up.returncode == 0, up.stderr
    engine = sa.create_engine(empty_db_url, poolclass=sa.NullPool)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload) SELECT 'old', jsonb_build_object('n', g)"
            " FROM generate_series(1, 100) AS g"
        )
        # As if a first run added the columns and its concurrent build then failed.
        conn.exec_driver_sql("ALTER TABLE jobs ADD COLUMN meta jsonb, ADD COLUMN tags text[]")
        conn.exec_driver_sql("ALTER TABLE jobs_archive ADD COLUMN meta jsonb")
        conn.exec_driver_sql("UPDATE jobs SET tags = ARRAY['x'] WHERE id <= 2")
        with contextlib.suppress(sa.exc.IntegrityError):
            conn.exec_driver_sql("CREATE UNIQUE INDEX CONCURRENTLY jobs_tags_idx ON jobs (tags)")
        conn.exec_driver_sql("UPDATE jobs SET tags = NULL")
    engine.dispose()
    assert {r[0]: r[1] for r in _read(empty_db_url, _INDEXES)} == {"jobs_tags_idx": False}

    up = _alembic(["upgrade", "head"], REPO, empty_db_url)
    assert up.returncode == 0, up.stderr
    found_indexes = {r[0]: r[1] for r in _read(empty_db_url, _INDEXES)}
    assert found_indexes == {"jobs_meta_idx": True, "jobs_tags_idx": True}
    found = _read(empty_db_url, "SELECT count(*), count(meta), count(tags) FROM jobs")
    assert tuple(found[0]) == (100, 0, 0)

    down = _alembic(["downgrade", "0011_attempt_history"], REPO, empty_db_url)
    assert down.returncode == 0, down.stderr
    assert _read(empty_db_url, _INDEXES) == []
    columns = _read(
        empty_db_url,
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE column_name IN ('meta', 'tags')",
    )
    assert columns == []
    assert _read(empty_db_url, "SELECT count(*) FROM jobs")[0][0] == 100
