"""Create the jobs table, its partial indexes and the insert notification trigger.

Revision ID: 0001_jobs_table
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0001_jobs_table"
down_revision: str | None = None
branch_labels = ("sqla_jobs",)
depends_on: str | None = None

STATUSES = ("queued", "running", "done", "dead")


def upgrade() -> None:
    status = postgresql.ENUM(*STATUSES, name="job_status", create_type=False)
    status.create(op.get_bind(), checkfirst=False)
    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("queue", sa.Text, nullable=False, server_default="default"),
        sa.Column("priority", sa.SmallInteger, nullable=False, server_default="0"),
        sa.Column("payload", postgresql.JSONB, nullable=False),
        sa.Column("status", status, nullable=False, server_default="queued"),
        sa.Column(
            "run_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("locked_until", sa.DateTime(timezone=True)),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default="8"),
        sa.Column("idempotency_key", sa.Text),
        sa.Column("worker", sa.Text),
        sa.Column("last_error", sa.Text),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("id", name="jobs_pkey"),
        sa.UniqueConstraint("idempotency_key", name="jobs_idempotency_key_key"),
        sa.CheckConstraint("priority BETWEEN 0 AND 9", name=op.f("jobs_priority_range_check")),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("jobs_max_attempts_positive_check")),
    )
    op.create_index(
        "jobs_claim_idx",
        "jobs",
        ["priority", "run_at"],
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        "jobs_lease_idx",
        "jobs",
        ["locked_until"],
        postgresql_where=sa.text("status = 'running'"),
    )
    # One notification per INSERT statement, with a constant payload: a bulk insert of
    # 10,000 jobs wakes the workers once, not 10,000 times (the seed fired per row).
    op.execute(
        """
        CREATE FUNCTION jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_notify('jobs', '');
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER jobs_notify AFTER INSERT ON jobs "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_notify ON jobs")
    op.execute("DROP FUNCTION jobs_notify()")
    op.drop_table("jobs")
    postgresql.ENUM(name="job_status").drop(op.get_bind(), checkfirst=False)
