"""Queue control: pause and limits per queue or kind, rate-limit starts, the workers registry.

Revision ID: 0006_queue_control
Revises: 0005_job_control
Create Date: 2026-11-30

Three new tables, nothing changed on ``jobs``, so this is safe on a large live table:

* ``jobs_controls``: one row per paused or limited queue or kind. Every claim reads
  it (a few rows), so a pause or a limit holds across hosts and survives restarts.
* ``jobs_rate_starts``: how many jobs a rate-limited queue or kind started, and when.
* ``jobs_workers``: one row per live worker, refreshed by its heartbeat.

Deploy order: pre-deploy. Workers built before this revision ignore the tables (and so
ignore pauses and limits); workers built after it refuse to start until it is applied.
Downgrade drops the three tables with their rows: pauses and runtime limits are lost.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0006_queue_control"
down_revision: str | None = "0005_job_control"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "jobs_controls",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("declared_concurrency", sa.Integer(), nullable=True),
        sa.Column("rate_count", sa.Integer(), nullable=True),
        sa.Column("rate_seconds", sa.Float(), nullable=True),
        sa.Column("declared_rate_count", sa.Integer(), nullable=True),
        sa.Column("declared_rate_seconds", sa.Float(), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("scope IN ('queue', 'kind')", name="jobs_controls_scope_check"),
        sa.CheckConstraint("concurrency >= 1", name="jobs_controls_concurrency_positive_check"),
        sa.CheckConstraint(
            "declared_concurrency >= 1",
            name="jobs_controls_declared_concurrency_positive_check",
        ),
        sa.CheckConstraint(
            "(rate_count IS NULL) = (rate_seconds IS NULL) AND rate_count >= 1 "
            "AND rate_seconds > 0",
            name="jobs_controls_rate_check",
        ),
        sa.CheckConstraint(
            "(declared_rate_count IS NULL) = (declared_rate_seconds IS NULL) "
            "AND declared_rate_count >= 1 AND declared_rate_seconds > 0",
            name="jobs_controls_declared_rate_check",
        ),
        sa.PrimaryKeyConstraint("scope", "name", name="jobs_controls_pkey"),
    )
    op.create_table(
        "jobs_rate_starts",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="jobs_rate_starts_pkey"),
    )
    op.create_index(
        "jobs_rate_starts_scope_name_started_at_idx",
        "jobs_rate_starts",
        ["scope", "name", "started_at"],
    )
    op.create_table(
        "jobs_workers",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("kinds", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("running", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name="jobs_workers_pkey"),
    )


def downgrade() -> None:
    op.drop_table("jobs_workers")
    op.drop_index("jobs_rate_starts_scope_name_started_at_idx", table_name="jobs_rate_starts")
    op.drop_table("jobs_rate_starts")
    op.drop_table("jobs_controls")
