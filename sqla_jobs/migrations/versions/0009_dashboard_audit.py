"""The audit trail of operators' actions (the dashboard's retry, cancel, pause, ...).

Revision ID: 0009_dashboard_audit
Revises: 0008_handler_defaults
Create Date: 2026-12-01

A new table only (``jobs_audit``) and its index, created empty: no lock on ``jobs``,
nothing rewritten. Deploy order: pre-deploy (code that records actions needs the table;
code built before it never reads it). Downgrade drops the table and its history.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "0009_dashboard_audit"
down_revision: str | None = "0008_handler_defaults"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "jobs_audit",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column(
            "at",
            sa.DateTime(timezone=True),
            server_default=sa.func.statement_timestamp(),
            nullable=False,
        ),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("detail", JSONB),
        sa.CheckConstraint(
            "scope IN ('job', 'jobs', 'queue', 'kind')", name="jobs_audit_scope_check"
        ),
        sa.PrimaryKeyConstraint("id", name="jobs_audit_pkey"),
    )
    op.create_index("jobs_audit_scope_target_id_idx", "jobs_audit", ["scope", "target", "id"])


def downgrade() -> None:
    op.drop_table("jobs_audit")
