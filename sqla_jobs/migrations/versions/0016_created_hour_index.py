"""The jobs page's age filters bounded from an index of jobs by their hour.

Revision ID: 0016_created_hour_index
Revises: 0015_workflow_list
Create Date: 2026-12-02

A jobs page filtered by age walks the primary key in id order and tests created_at on
each row (the page is exact whatever the order of created_at against id). On the far
side of the bound, that walk went through every job of the other side first:
``older_than`` newest first, through the jobs created since the bound; ``newer_than``
oldest first, through the older ones (revision 0012 bounded that one from
``(created_at, id)``, by reading the index entry of every job created since: 25 ms at
143,000 jobs a day, growing with the span of the filter).

``(date_bin('1 hour', created_at, origin), id) INCLUDE (created_at)`` gives either end
of a side by one index descent per hour past the bound, and the bound's own hour read
entry by entry from the index (``sqla_jobs.sql.admin._id_bound``): the lowest id
created since a bound and the highest created before one, with no table row read. It
replaces 0012's ``jobs_created_at_idx``, which nothing else reads (one index written
per insert and non-HOT update, as before).

Built with ``CREATE INDEX CONCURRENTLY`` in an autocommit block, as revisions 0010 and
0012 build theirs (an INVALID leftover of a failed build is dropped and built again;
``lock_timeout`` bounds the wait for the brief lock each statement takes); the old
index is dropped concurrently once the new one is built. Deploy order: either; no code
needs either index to be correct, only to be fast. Downgrade builds 0012's index again
and drops this one.
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0016_created_hour_index"
down_revision: str | None = "0015_workflow_list"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

LOCK_TIMEOUT = "5s"

#: name -> what follows ``ON jobs``; models.py declares the same, and the constants are
#: sqla_jobs.sql.admin's HOUR_WIDTH and HOUR_ORIGIN (the statements' expression must be
#: the index's own).
INDEXES = {
    "jobs_created_hour_idx": "(date_bin(interval '1 hour', created_at,"
    " timestamptz '2000-01-01 00:00:00+00'), id) INCLUDE (created_at)"
}
#: Revision 0012's index, which this one replaces.
REPLACED = {"jobs_created_at_idx": "(created_at, id)"}

_VALID = sa.text("SELECT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = to_regclass(:name)")


def _with_lock_timeout(statements: list[str]) -> None:
    # Autocommit: a session setting, put back afterwards for the application's own
    # revisions that run on the same connection.
    conn = op.get_bind()
    before = conn.execute(sa.text("SELECT current_setting('lock_timeout')")).scalar_one()
    conn.execute(sa.text("SELECT set_config('lock_timeout', :v, false)"), {"v": LOCK_TIMEOUT})
    try:
        for statement in statements:
            op.execute(statement)
    finally:
        conn.execute(sa.text("SELECT set_config('lock_timeout', :v, false)"), {"v": before})


def _build(indexes: dict[str, str]) -> list[str]:
    statements = []
    for name, definition in indexes.items():
        valid = op.get_bind().execute(_VALID, {"name": name}).scalar_one_or_none()
        if valid is False:  # left INVALID by a failed concurrent build
            statements.append(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        statements.append(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON jobs {definition}")
    return statements


def _drop(indexes: dict[str, str]) -> list[str]:
    return [f"DROP INDEX CONCURRENTLY IF EXISTS {name}" for name in indexes]


def upgrade() -> None:
    with op.get_context().autocommit_block():
        _with_lock_timeout(_build(INDEXES) + _drop(REPLACED))


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _with_lock_timeout(_build(REPLACED) + _drop(INDEXES))
