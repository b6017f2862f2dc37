"""An index on created_at for the jobs page's ``newer_than`` filter.

Revision ID: 0012_created_at_index
Revises: 0011_attempt_history
Create Date: 2026-12-01

A jobs page filtered ``newer_than`` walks the primary key in id order. Oldest first, or
on its last page newest first, it reads every job older than the bound before (or
after) the ones it shows: 0.23-0.36 s at 1,000,000 rows. ``(created_at, id)`` gives
the lowest id of the jobs created since the bound by reading those jobs' index entries
only (no table rows); the page then starts its walk there (see
``sqla_jobs.sql.admin.list_jobs``). The id is in the index so that look-up needs
no table row; the created_at test stays on the page, so a job whose created_at is out
of step with its id (created in a long transaction) is still shown exactly when it
matches.

Built with ``CREATE INDEX CONCURRENTLY`` in an autocommit block, as revision 0010 builds
its indexes (an INVALID leftover of a failed build is dropped and built again;
``lock_timeout`` bounds the wait for the brief lock each statement takes). Cost: one
more btree entry per insert and per non-HOT update, see benchmarks/README.md. Deploy
order: either; no code needs the index to be correct, only to be fast. Downgrade drops
it (concurrently).
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0012_created_at_index"
down_revision: str | None = "0011_attempt_history"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

LOCK_TIMEOUT = "5s"

#: name -> what follows ``ON jobs``; models.py declares the same.
INDEXES = {"jobs_created_at_idx": "(created_at, id)"}

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


def upgrade() -> None:
    with op.get_context().autocommit_block():
        statements = []
        for name, definition in INDEXES.items():
            valid = op.get_bind().execute(_VALID, {"name": name}).scalar_one_or_none()
            if valid is False:  # left INVALID by a failed concurrent build
                statements.append(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            statements.append(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON jobs {definition}"
            )
        _with_lock_timeout(statements)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _with_lock_timeout([f"DROP INDEX CONCURRENTLY IF EXISTS {name}" for name in INDEXES])
