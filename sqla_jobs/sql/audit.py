"""The audit trail's statements (revision 0009): record an operator's action, read them back."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from sqla_jobs.models import audit_entries


def record(
    *, actor: str, action: str, scope: str, target: str, detail: str | None = None
) -> sa.Insert:
    """One entry; ``detail`` is JSON text (or None). RETURNING its id."""
    return (
        sa.insert(audit_entries)
        .values(
            actor=sa.bindparam("actor", actor, sa.Text),
            action=sa.bindparam("action", action, sa.Text),
            scope=sa.bindparam("scope", scope, sa.Text),
            target=sa.bindparam("target", target, sa.Text),
            detail=sa.cast(sa.bindparam("detail", detail, sa.Text), JSONB),
        )
        .returning(audit_entries.c.id)
    )


def entries(
    *,
    scope: str | None = None,
    target: str | None = None,
    limit: int,
    before_id: int | None = None,
) -> sa.Select[Any]:
    """Entries newest first, of one scope (and target) if given; keyset by ``before_id``.

    With a scope and target: a backward range on jobs_audit_scope_target_id_idx; without,
    the primary key read backwards. Either stops at ``limit`` rows.
    """
    conditions: list[sa.ColumnElement[bool]] = []
    if scope is not None:
        conditions.append(audit_entries.c.scope == sa.bindparam("scope", scope, sa.Text))
    if target is not None:
        conditions.append(audit_entries.c.target == sa.bindparam("target", target, sa.Text))
    if before_id is not None:
        conditions.append(audit_entries.c.id < sa.bindparam("before_id", before_id, sa.BigInteger))
    return (
        sa.select(*audit_entries.c)
        .where(*conditions)
        .order_by(audit_entries.c.id.desc())
        .limit(sa.bindparam("limit", limit, sa.Integer))
    )
