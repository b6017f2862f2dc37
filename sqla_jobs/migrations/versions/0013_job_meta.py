"""Job metadata: ``meta`` and ``tags``, and the indexes that filter by them.

Revision ID: 0013_job_meta
Revises: 0012_created_at_index
Create Date: 2026-12-01

Two nullable columns, on ``jobs`` and ``jobs_archive`` alike (archiving copies every
column of ``jobs``):

* ``meta jsonb``: a JSON object the application attaches to a job (tenant, request id,
  the W3C trace context of the request that enqueued it), at most 8 KiB;
* ``tags text[]``: short labels, at most 32.

Both are NULL for a job that has none, which is every job written before this revision.

Safe on a large live table: ``ADD COLUMN`` with no default and no constraint changes the
catalog only (no scan, no rewrite). Each ``ALTER`` still needs a moment of ``ACCESS
EXCLUSIVE``, waited for at most ``LOCK_TIMEOUT`` (it then fails with "canceling
statement due to lock timeout": run it again). Then the two GIN indexes that answer
``meta @> ...`` (``jsonb_path_ops``, as ``jobs_payload_idx``) and ``tags @> ARRAY[...]``
are built with ``CREATE INDEX CONCURRENTLY`` in an autocommit block, as revision 0010
builds its own: no lock blocks the workers' writes while they build; an INVALID
leftover of a failed build is dropped and built again; the columns are added with ``IF
NOT EXISTS``, so running the revision again after a failed build finishes it. Both
indexes are partial (``WHERE meta IS NOT NULL``): a GIN index keeps a placeholder entry
for a NULL, and every claim and done-mark of a job without metadata would write one
(a status change is never a HOT update); the filters' ``@>`` implies the condition, so
the planner still uses them, generic plans included.

Deploy order: migrate first, then the workers and applications built with it (their
claim reads ``meta`` and ``tags``; a worker checks at start that every column it uses
exists). Code built before it keeps working on the migrated table.

Downgrade: drops the indexes (concurrently) and the columns (catalog only), and the
metadata with them.
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0013_job_meta"
down_revision: str | None = "0012_created_at_index"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: How long each statement waits for its table's lock before the migration fails.
LOCK_TIMEOUT = "5s"

_TABLES = ("jobs", "jobs_archive")

#: name -> what follows ``ON jobs``; models.py declares the same.
INDEXES = {
    "jobs_meta_idx": "USING gin (meta jsonb_path_ops) WHERE meta IS NOT NULL",
    "jobs_tags_idx": "USING gin (tags) WHERE tags IS NOT NULL",
}

_VALID = sa.text("SELECT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = to_regclass(:name)")


def _in_transaction(statements: list[str]) -> None:
    # Only for these statements: the setting is put back, so an application whose
    # own revisions run in the same transaction keeps its own lock_timeout.
    op.execute("SELECT set_config('sqla_jobs.lock_timeout', current_setting('lock_timeout'), true)")
    op.execute(f"SELECT set_config('lock_timeout', '{LOCK_TIMEOUT}', true)")
    for statement in statements:
        op.execute(statement)
    op.execute("SELECT set_config('lock_timeout', current_setting('sqla_jobs.lock_timeout'), true)")


def _autocommit(statements: list[str]) -> None:
    # CONCURRENTLY cannot run in a transaction block. Autocommit: a session setting,
    # put back afterwards for the application's own revisions on the same connection.
    conn = op.get_bind()
    before = conn.execute(sa.text("SELECT current_setting('lock_timeout')")).scalar_one()
    conn.execute(sa.text("SELECT set_config('lock_timeout', :v, false)"), {"v": LOCK_TIMEOUT})
    try:
        for statement in statements:
            op.execute(statement)
    finally:
        conn.execute(sa.text("SELECT set_config('lock_timeout', :v, false)"), {"v": before})


def upgrade() -> None:
    _in_transaction(
        [
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS meta jsonb, "
            "ADD COLUMN IF NOT EXISTS tags text[]"
            for t in _TABLES
        ]
    )
    with op.get_context().autocommit_block():
        statements = []
        for name, definition in INDEXES.items():
            valid = op.get_bind().execute(_VALID, {"name": name}).scalar_one_or_none()
            if valid is False:  # left INVALID by a failed concurrent build
                statements.append(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            statements.append(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON jobs {definition}"
            )
        _autocommit(statements)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _autocommit([f"DROP INDEX CONCURRENTLY IF EXISTS {name}" for name in INDEXES])
    _in_transaction([f"ALTER TABLE {t} DROP COLUMN meta, DROP COLUMN tags" for t in _TABLES])
