"""Indexes for the list of workflows, and for a workflow's archived steps (#26).

Revision ID: 0015_workflow_list
Revises: 0014_workflows
Create Date: 2026-12-01

* ``jobs_workflow_status_idx (status, workflow_id) WHERE workflow_id IS NOT NULL``: the
  list of workflows filtered by state
  ([``sqla_jobs.ops.list_workflows``][sqla_jobs.ops.list_workflows]) walks the workflow ids newest
  first (ids are time-ordered, see [``sqla_jobs.workflows``][sqla_jobs.workflows]) with one index
  probe per workflow shown: "running" takes the highest id below the cursor among waiting, queued
  and running steps, "failed" among dead and cancelled ones, each a descent of this index. Without
  it, "running" tests every workflow in turn, and a few running workflows among 100,000 finished
  ones read them all. ``jobs_workflow_id_idx`` (0014) serves the unfiltered list and each workflow's
  counts.
* ``jobs_archive_workflow_id_idx (workflow_id) WHERE workflow_id IS NOT NULL`` on
  ``jobs_archive``: a workflow's archived steps (``workflow_status``, appending to a
  workflow) were found by reading the whole archive.

Both partial: a job outside workflows writes no entry to them. A workflow step's
status change writes one more entry in ``jobs`` (a status change is never a HOT update).

Built with ``CREATE INDEX CONCURRENTLY`` in an autocommit block, as revisions 0012 and
0013 build theirs: no lock blocks the workers' writes while they build; an INVALID
leftover of a failed build is dropped and built again; ``lock_timeout`` bounds the wait
for the brief lock each statement takes. Deploy order: either; no code needs the
indexes to be correct, only to be fast. Downgrade drops them (concurrently).
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0015_workflow_list"
down_revision: str | None = "0014_workflows"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: How long each statement waits for its table's lock before the migration fails.
LOCK_TIMEOUT = "5s"

#: name -> what follows ``ON``; models.py declares the same.
INDEXES = {
    "jobs_workflow_status_idx": "jobs (status, workflow_id) WHERE workflow_id IS NOT NULL",
    "jobs_archive_workflow_id_idx": "jobs_archive (workflow_id) WHERE workflow_id IS NOT NULL",
}

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
        statements = []
        for name, definition in INDEXES.items():
            valid = op.get_bind().execute(_VALID, {"name": name}).scalar_one_or_none()
            if valid is False:  # left INVALID by a failed concurrent build
                statements.append(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            statements.append(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {definition}")
        _autocommit(statements)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _autocommit([f"DROP INDEX CONCURRENTLY IF EXISTS {name}" for name in INDEXES])
