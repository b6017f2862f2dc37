"""A workflow's steps by end time, in ``jobs`` and ``jobs_archive``; archived workflows by
status (#26).

Revision ID: 0017_workflow_archive
Revises: 0016_created_hour_index
Create Date: 2026-12-02

The archiver and ``prune`` take a finished workflow as a unit: a row of a workflow goes
only when the workflow's last step ended before the cutoff (see
``sqla_jobs.sql.admin.archive_batch``). That is ``max(finished_at)`` of the
workflow's steps, asked once per row the batch looks at: with ``finished_at`` in the
workflow's index it is one descent; with ``(workflow_id)`` alone it read every step of
the workflow, per row (10,000 x 10,000 entries for one big workflow in one batch).

* ``jobs_workflow_finished_idx (workflow_id, finished_at)`` replaces
  ``jobs_workflow_id_idx (workflow_id)`` (0014), whose look-ups it serves as well (a
  step's status change writes an entry in every index of ``jobs`` anyway: one index,
  not two, keeps that cost where it was).
* ``jobs_archive_workflow_finished_idx (workflow_id, finished_at)`` replaces
  ``jobs_archive_workflow_id_idx (workflow_id)`` (0015).
* ``jobs_archive_workflow_status_idx (status, workflow_id)``: archived workflows are
  listed too ([``sqla_jobs.ops.list_workflows``][sqla_jobs.ops.list_workflows]); "failed" walks the
  archive's workflow ids with a dead or cancelled step one descent each, as 0015's
  ``jobs_workflow_status_idx`` does in ``jobs``.

All partial (``WHERE workflow_id IS NOT NULL``). Built with ``CREATE INDEX
CONCURRENTLY`` in an autocommit block, as revisions 0012 to 0015 build theirs, before the
old index is dropped (concurrently): a reader always has one of them. An INVALID
leftover of a failed build is dropped and built again; ``lock_timeout`` bounds the wait
for the brief lock each statement takes. Deploy order: either (only speed depends on
it). Downgrade builds the old indexes again and drops these (concurrently).
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0017_workflow_archive"
down_revision: str | None = "0016_created_hour_index"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: How long each statement waits for its table's lock before the migration fails.
LOCK_TIMEOUT = "5s"

#: name -> what follows ``ON``; models.py declares the same.
NEW = {
    "jobs_workflow_finished_idx": ("jobs (workflow_id, finished_at) WHERE workflow_id IS NOT NULL"),
    "jobs_archive_workflow_finished_idx": (
        "jobs_archive (workflow_id, finished_at) WHERE workflow_id IS NOT NULL"
    ),
    "jobs_archive_workflow_status_idx": (
        "jobs_archive (status, workflow_id) WHERE workflow_id IS NOT NULL"
    ),
}
#: The indexes they replace, as 0014 and 0015 built them.
OLD = {
    "jobs_workflow_id_idx": "jobs (workflow_id) WHERE workflow_id IS NOT NULL",
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


def _swap(build: dict[str, str], drop: dict[str, str]) -> None:
    with op.get_context().autocommit_block():
        statements = []
        for name, definition in build.items():
            valid = op.get_bind().execute(_VALID, {"name": name}).scalar_one_or_none()
            if valid is False:  # left INVALID by a failed concurrent build
                statements.append(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            statements.append(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {definition}")
        statements += [f"DROP INDEX CONCURRENTLY IF EXISTS {name}" for name in drop]
        _autocommit(statements)


def upgrade() -> None:
    _swap(NEW, OLD)


def downgrade() -> None:
    _swap(OLD, NEW)
