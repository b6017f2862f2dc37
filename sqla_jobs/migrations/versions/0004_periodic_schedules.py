"""Add ``jobs_periodic``: the last tick enqueued by each periodic schedule.

Revision ID: 0004_periodic_schedules
Revises: 0003_notify_only_idle_workers
Create Date: 2026-11-30

A new, empty table: creating it takes no lock on ``jobs``, so it is safe on a live
system of any size. Deploy order: pre-deploy. Workers built before this revision never
read it; workers built after it need it only when their registry declares schedules.

Downgrade drops the table: every schedule then starts afresh at the next deploy (its
first tick is the first one after a worker starts; ticks missed meanwhile are not
caught up). Jobs already enqueued for past ticks are untouched.
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0004_periodic_schedules"
down_revision: str | None = "0003_notify_only_idle_workers"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "jobs_periodic",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("expression", sa.Text, nullable=False),
        sa.Column("last_tick", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_job_id", sa.BigInteger),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("name", name="jobs_periodic_pkey"),
    )


def downgrade() -> None:
    op.drop_table("jobs_periodic")
