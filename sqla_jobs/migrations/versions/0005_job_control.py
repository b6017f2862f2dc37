"""Job control: results, timeouts, snoozes and cancelling running jobs.

Revision ID: 0005_job_control
Revises: 0004_periodic_schedules
Create Date: 2026-11-30

Adds to ``jobs`` and ``jobs_archive``:

* ``result jsonb`` (nullable): a handler's return value, written with the done-mark;
* ``timeout double precision`` (nullable): the job's own time limit in seconds (else the
  handler's ``timeout``, else none);
* ``snoozes integer NOT NULL DEFAULT 0``: how often the job was snoozed (``Snooze``);
* ``cancel_requested_at timestamptz`` (nullable): an operator asked to stop it while it
  was running.

Safe on a large live table: nullable columns without a default are a catalog change
only, and since PostgreSQL 11 a constant default (``snoozes``) is stored in the catalog
too, so no column is rewritten and ``ACCESS EXCLUSIVE`` is held for a moment. No index
and no CHECK constraint (adding one would scan the table under that lock): values are
checked where they enter (``enqueue``, ``Job(timeout=...)``).

Deploy order: migrate first, then deploy workers built with this revision (they read
the new columns when they claim). Workers built before it ignore the columns: the jobs
they run have no timeout, return no result, and finish or fail as before even if an
operator asked to cancel them.
Downgrade drops the four columns (results and cancel requests are lost).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "0005_job_control"
down_revision: str | None = "0004_periodic_schedules"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

_TABLES = ("jobs", "jobs_archive")


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("result", JSONB(), nullable=True))
        op.add_column(table, sa.Column("timeout", sa.Float(), nullable=True))
        op.add_column(table, sa.Column("snoozes", sa.Integer(), server_default="0", nullable=False))
        op.add_column(
            table, sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    for table in _TABLES:
        for column in ("cancel_requested_at", "snoozes", "timeout", "result"):
            op.drop_column(table, column)
