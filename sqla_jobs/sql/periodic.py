"""Statements behind periodic schedules ([``sqla_jobs.periodic``][sqla_jobs.periodic]) and their
listing.

A schedule's state is one row of ``jobs_periodic`` (revision 0004). Enqueueing its due
ticks is one short transaction: insert the rows of schedules never seen before
(``register``), lock the rows nobody else is working on (``lock_due``), insert
the ticks' jobs (the ordinary keyed insert of ``sqla_jobs.sql.enqueue``), move
``last_tick`` forward (``advance``), commit. Every time is the database's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_jobs.models import jobs, jobs_archive, jobs_periodic
from sqla_jobs.sql import _common
from sqla_jobs.sql._common import Now


def register(
    names: Sequence[str], kinds: Sequence[str], expressions: Sequence[str], now: Now = None
) -> sa.Insert:
    """Insert a state row for each schedule that has none, with ``last_tick = now()``.

    A new schedule thus starts at the first tick after the first worker that knows it;
    it never catches up on the time before it existed. Existing rows are left alone
    (``ON CONFLICT DO NOTHING``), so this is cheap to run before every enqueue.
    """
    rows = (
        sa.func.unnest(
            sa.bindparam("names", list(names), ARRAY(sa.Text)),
            sa.bindparam("kinds", list(kinds), ARRAY(sa.Text)),
            sa.bindparam("expressions", list(expressions), ARRAY(sa.Text)),
        )
        .table_valued("name", "kind", "expression")
        .render_derived(name="declared")
    )
    source = sa.select(rows.c.name, rows.c.kind, rows.c.expression, _common.clock(now))
    return (
        pg_insert(jobs_periodic)
        .from_select(["name", "kind", "expression", "last_tick"], source)
        .on_conflict_do_nothing(index_elements=[jobs_periodic.c.name])
    )


def lock_due(names: Sequence[str], now: Now = None) -> sa.Select[Any]:
    """The state rows of ``names`` that no other transaction holds, locked, with ``now()``.

    ``SKIP LOCKED``: a row locked by another worker is being handled by it right now;
    waiting for it would only find its ticks already enqueued.
    """
    return (
        sa.select(jobs_periodic.c.name, jobs_periodic.c.last_tick, _common.clock(now).label("now"))
        .where(
            jobs_periodic.c.name == sa.func.any(sa.bindparam("names", list(names), ARRAY(sa.Text)))
        )
        .with_for_update(skip_locked=True)
    )


def advance(now: Now = None) -> sa.Update:
    """Move a schedule's ``last_tick`` forward; binds b_name, b_last_tick, b_job_id, b_expression.

    ``last_job_id`` keeps its value when this run enqueued no job (``b_job_id`` NULL).
    """
    return (
        jobs_periodic.update()
        .where(jobs_periodic.c.name == sa.bindparam("b_name", type_=sa.Text))
        .values(
            last_tick=sa.bindparam("b_last_tick", type_=sa.DateTime(timezone=True)),
            last_job_id=sa.func.coalesce(
                sa.bindparam("b_job_id", type_=sa.BigInteger), jobs_periodic.c.last_job_id
            ),
            expression=sa.bindparam("b_expression", type_=sa.Text),
            updated_at=_common.clock(now),
        )
    )


def state_probe() -> sa.Select[Any]:
    """Reads every column of jobs_periodic; fails if revision 0004 is missing."""
    return sa.select(*jobs_periodic.c).limit(0)


def database_now(now: Now = None) -> sa.Select[Any]:
    """The database's clock: the only clock that decides which ticks are due."""
    return sa.select(_common.clock(now))


def list_states() -> sa.Select[Any]:
    """Every schedule's state row with the status of its last job (live or archived)."""
    live = jobs.alias("live")
    archived = jobs_archive.alias("archived")
    return (
        sa.select(
            jobs_periodic.c.name,
            jobs_periodic.c.kind,
            jobs_periodic.c.expression,
            jobs_periodic.c.last_tick,
            jobs_periodic.c.last_job_id,
            sa.cast(sa.func.coalesce(live.c.status, archived.c.status), sa.Text).label(
                "last_job_status"
            ),
        )
        .select_from(
            jobs_periodic.outerjoin(live, live.c.id == jobs_periodic.c.last_job_id).outerjoin(
                archived, archived.c.id == jobs_periodic.c.last_job_id
            )
        )
        .order_by(jobs_periodic.c.name)
    )
