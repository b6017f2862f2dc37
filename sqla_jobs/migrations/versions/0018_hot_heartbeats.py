"""No index on the lease, so a heartbeat is a HOT update (issue #25).

Revision ID: 0018_hot_heartbeats
Revises: 0017_workflow_archive
Create Date: 2026-12-02

A heartbeat sets ``locked_until`` and nothing else. ``jobs_lease_idx (locked_until)
WHERE status = 'running'`` (revision 0001) made every heartbeat a non-HOT update: a new
entry in each of the table's indexes, and the old row version left dead until vacuum
may remove it, which it may not while an application's transaction pins the MVCC
horizon. With no index on ``locked_until`` the update is HOT whenever the row's page has
room: no index entry is written, and the page prunes its own chain.

What read the index finds running jobs through ``jobs_status_id_idx (status, id)``
(revision 0010) instead and tests the lease on each: the rescuer, the health check's
expired leases, the stats' and the dashboard's expired counts and filter. Running jobs
are bounded by the fleet's concurrency, so that read is as small as the lease index was.

Dropped with ``DROP INDEX CONCURRENTLY`` in an autocommit block (``lock_timeout``
bounds the wait for the brief lock), as revisions 0016 and 0017 drop theirs. Deploy
order: either (no statement needs the index to be correct). Downgrade builds it again,
concurrently (an INVALID leftover of a failed build is dropped and built again).
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0018_hot_heartbeats"
down_revision: str | None = "0017_workflow_archive"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: How long each statement waits for its table's lock before the migration fails.
LOCK_TIMEOUT = "5s"

#: The index this revision drops, as revision 0001 built it.
DROPPED = {"jobs_lease_idx": "jobs (locked_until) WHERE status = 'running'"}

_VALID = sa.text("SELECT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = to_regclass(:name)")


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
    with op.get_context().autocommit_block():
        _autocommit([f"DROP INDEX CONCURRENTLY IF EXISTS {name}" for name in DROPPED])


def downgrade() -> None:
    with op.get_context().autocommit_block():
        statements = []
        for name, definition in DROPPED.items():
            valid = op.get_bind().execute(_VALID, {"name": name}).scalar_one_or_none()
            if valid is False:  # left INVALID by a failed concurrent build
                statements.append(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            statements.append(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {definition}")
        _autocommit(statements)
