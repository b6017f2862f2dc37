"""Add the ``cancelled`` status, the ``jobs_archive`` table and the finished-rows index.

Revision ID: 0002_cancelled_and_archive
Revises: 0001_jobs_table
Create Date: 2026-11-30

Deploy order: pre-deploy. Workers built before this revision keep working: they claim
``status = 'queued'`` rows only, so they never see a cancelled job, and they never read
``jobs_archive``. Workers built after it refuse to start until it is applied (their
schema check wants every status).

``ALTER TYPE ... ADD VALUE`` runs in an autocommit block: PostgreSQL refuses to use a new
enum value in the transaction that added it, and the partial index below names it.

Downgrade: cancelled jobs become ``dead`` (with a note in ``last_error``) because the old
type has no place for them, and the type is rebuilt without the value (PostgreSQL cannot
drop an enum value). ``jobs_archive`` is dropped **with its rows**: copy it first if the
history matters.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0002_cancelled_and_archive"
down_revision: str | None = "0001_jobs_table"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

OLD_STATUSES = ("queued", "running", "done", "dead")


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("ALTER TYPE job_status ADD VALUE IF NOT EXISTS 'cancelled'")
    # Built without CONCURRENTLY so it runs in the migration's transaction; on a table
    # already holding millions of rows, create it CONCURRENTLY by hand first (same name,
    # same definition) and this revision's IF NOT EXISTS skips it.
    op.create_index(
        "jobs_finished_idx",
        "jobs",
        ["status", "finished_at"],
        postgresql_where=sa.text("status IN ('done', 'dead', 'cancelled')"),
        if_not_exists=True,
    )
    status = postgresql.ENUM(name="job_status", create_type=False)
    op.create_table(
        "jobs_archive",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("priority", sa.SmallInteger, nullable=False),
        sa.Column("payload", postgresql.JSONB, nullable=False),
        sa.Column("status", status, nullable=False),
        sa.Column("run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("locked_until", sa.DateTime(timezone=True)),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("idempotency_key", sa.Text),
        sa.Column("worker", sa.Text),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column(
            "archived_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("id", name="jobs_archive_pkey"),
    )
    op.create_index("jobs_archive_finished_at_idx", "jobs_archive", ["finished_at"])


def downgrade() -> None:
    op.drop_table("jobs_archive")
    op.drop_index("jobs_finished_idx", table_name="jobs")
    op.execute(
        "UPDATE jobs SET status = 'dead', finished_at = coalesce(finished_at, now()), "
        "last_error = concat_ws(E'\\n\\n', "
        "'cancelled (status folded into dead by the 0002 downgrade)', last_error) "
        "WHERE status = 'cancelled'"
    )
    # The partial indexes compare status with constants of the old type: drop them,
    # swap the column's type, then build them again.
    op.drop_index("jobs_claim_idx", table_name="jobs")
    op.drop_index("jobs_lease_idx", table_name="jobs")
    op.execute("ALTER TYPE job_status RENAME TO job_status_0002")
    postgresql.ENUM(*OLD_STATUSES, name="job_status").create(op.get_bind(), checkfirst=False)
    op.execute("ALTER TABLE jobs ALTER COLUMN status DROP DEFAULT")
    op.execute(
        "ALTER TABLE jobs ALTER COLUMN status TYPE job_status USING status::text::job_status"
    )
    op.execute("ALTER TABLE jobs ALTER COLUMN status SET DEFAULT 'queued'")
    op.execute("DROP TYPE job_status_0002")
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
