"""Indexes for the dashboard's jobs page: status, kind, queue and payload filters.

Revision ID: 0010_dashboard_indexes
Revises: 0009_dashboard_audit
Create Date: 2026-12-01

The jobs page lists jobs by id (keyset pages, newest or oldest first) under one filter.
Without an index of its own, a filter that matches few rows (a rare kind, a dead job
among millions done, a payload nobody has) walks the primary key through the whole
table. ``(status, id)``, ``(kind, id)`` and ``(queue, id)`` give each such filter the
page's order directly (a range scan from the cursor that stops after one page); a GIN
index with ``jsonb_path_ops`` answers
``payload @> ...`` (the only payload operator the page uses; smaller and faster than the
default ``jsonb_ops``). Age filters have no index: ``created_at`` follows ``id``, so
the primary key finds a page of them, but only by skipping the rows on the other side
of the age bound (see the README's Dashboard section).

Each index is built with ``CREATE INDEX CONCURRENTLY`` in an autocommit block: no lock
blocks the workers' writes while it builds, however large ``jobs`` is. A concurrent
build that failed (or was interrupted) leaves an INVALID index behind under the same
name, which ``IF NOT EXISTS`` would keep: such a leftover is dropped (concurrently) and
built again, so running this revision again after a failure finishes the job.
``lock_timeout`` bounds the wait for the brief lock at the start of each statement.

Cost: every index is written by every insert and every non-HOT update (a status change
is one), see benchmarks/README.md for the measured cost. Deploy order: either; no code
needs the indexes to be correct, only to be fast. Downgrade drops them (concurrently).
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0010_dashboard_indexes"
down_revision: str | None = "0009_dashboard_audit"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

LOCK_TIMEOUT = "5s"

#: name -> what follows ``ON jobs``; models.py declares the same.
INDEXES = {
    "jobs_status_id_idx": "(status, id)",
    "jobs_kind_id_idx": "(kind, id)",
    "jobs_queue_id_idx": "(queue, id)",
    "jobs_payload_idx": "USING gin (payload jsonb_path_ops)",
}

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
