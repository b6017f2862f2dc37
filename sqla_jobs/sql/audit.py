"""The audit trail's statements (revision 0009): record an operator's action, read them back."""

from __future__ import annotations

from collections.abc import Sequence
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
    scope: str | Sequence[str] | None = None,
    target: str | None = None,
    limit: int,
    before_id: int | None = None,
) -> sa.Select[Any]:
    """Entries newest first, of one scope (and target) if given; keyset by ``before_id``.

    With a scope and target: a backward range on jobs_audit_scope_target_id_idx; without,
    the primary key read backwards. Either stops at ``limit`` rows. Several scopes (the
    dashboard's queues page: ``("queue", "kind")``, one round trip): the newest ``limit``
    of each scope, each read as it would be alone, merged newest first.
    """
    if scope is not None and not isinstance(scope, str):
        if len(scope) == 1:
            scope = scope[0]
        else:
            merged = sa.union_all(
                *(_entries(s, target, limit, before_id, f"_{n}") for n, s in enumerate(scope))
            ).subquery("scopes")
            return (
                sa.select(*merged.c)
                .order_by(merged.c.id.desc())
                .limit(sa.bindparam("limit", limit, sa.Integer))
            )
    return _entries(scope, target, limit, before_id)


def _entries(
    scope: str | None, target: str | None, limit: int, before_id: int | None, suffix: str = ""
) -> sa.Select[Any]:
    conditions: list[sa.ColumnElement[bool]] = []
    if scope is not None:
        conditions.append(audit_entries.c.scope == sa.bindparam(f"scope{suffix}", scope, sa.Text))
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
