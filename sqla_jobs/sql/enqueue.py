"""Statements that insert jobs (``sqla_jobs.enqueue`` and ``enqueue_many``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_jobs import models
from sqla_jobs.models import jobs
from sqla_jobs.sql import _common
from sqla_jobs.sql._common import Now

#: The columns an insert fills when the job does not: the identity and server defaults.
FILLED_BY_THE_TABLE = tuple(c for c in jobs.c if c.primary_key or c.server_default is not None)


def insert_job(
    *,
    has_run_at: bool,
    has_delay: bool,
    columns: Sequence[str],
    with_defaults: bool = False,
    now: Now = None,
) -> sa.Insert:
    """``INSERT ... ON CONFLICT (idempotency_key) DO NOTHING RETURNING id``.

    Bind parameters: ``kind``, ``payload`` (JSON text), ``run_at`` or ``delay`` when
    flagged, and one per name in ``columns`` (queue, priority, max_attempts,
    idempotency_key, timeout, meta as JSON text, tags). Columns not named take the
    table's defaults.
    ``with_defaults``: RETURNING the columns the table fills (``FILLED_BY_THE_TABLE``:
    the id and every column with a server default), for the flush of a ``Job`` object,
    which fills the object from it (the ORM's own insert fetches its defaults the same
    way, so reading them later needs no query, which an ``AsyncSession`` could not run).
    Every other column holds what the job gave or NULL.
    """
    values: dict[str, Any] = {
        "kind": sa.bindparam("kind", type_=sa.Text),
        "payload": _common.payload_param(),
    }
    for name in columns:
        if name == "meta":  # JSON text, checked by validation.dump_meta
            values[name] = _common.payload_param("meta")
        else:
            values[name] = sa.bindparam(name, type_=jobs.c[name].type)
    if has_run_at:
        values["run_at"] = sa.bindparam("run_at", type_=sa.DateTime(timezone=True))
    elif has_delay:
        values["run_at"] = _common.clock(now) + _common.seconds(
            sa.bindparam("delay", type_=sa.Float)
        )
    elif now is not None:
        values["run_at"] = _common.clock(now)
    return (
        pg_insert(jobs)
        .values(values)
        .on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])
        .returning(*FILLED_BY_THE_TABLE if with_defaults else (jobs.c.id,))
    )


def insert_jobs_json(*, with_keys: bool, options: bool = True, now: Now = None) -> sa.Insert:
    """Insert many jobs in one statement from one JSON array (one round trip per batch).

    One bound parameter, ``rows``: a JSON array of objects with ``k`` (kind), ``p``
    (payload), and optional ``q`` (queue), ``pr`` (priority), ``m`` (max_attempts),
    ``key``, ``at`` (run_at, ISO 8601 with offset), ``d`` (delay, seconds) and ``t``
    (timeout, seconds; revision 0005), ``mt`` (meta) and ``tg`` (tags, an array of
    strings; revision 0013); a missing field takes the table default (``m``: NULL, the
    handler's when a worker claims it). One text parameter is the cheapest
    thing to send: psycopg quotes every element of a text array with a regular
    expression, which cost more than the insert itself. It is read as ``jsonb``: then
    each payload is taken out of the parsed array as it is, where ``json_to_recordset``
    parsed it a second time (1 us per job of the server's 6).

    ``with_keys``: a batch with idempotency keys skips those already taken (``ON
    CONFLICT DO NOTHING``); a batch without any leaves out that clause and its
    speculative insertion, since NULL keys never conflict. ``options=False``: no job of
    the batch has more than a kind and a payload, so only those two fields are read and
    the table's defaults fill the rest. RETURNING the new ids.
    """
    fields = [sa.column("k", sa.Text), sa.column("p", JSONB)]
    if options or with_keys:
        fields += [
            sa.column("q", sa.Text),
            sa.column("pr", sa.SmallInteger),
            sa.column("m", sa.Integer),
            sa.column("key", sa.Text),
            sa.column("at", sa.DateTime(timezone=True)),
            sa.column("d", sa.Float),
            sa.column("t", sa.Float),
            sa.column("mt", JSONB),
            sa.column("tg", ARRAY(sa.Text)),
        ]
    rows = (
        sa.func.jsonb_to_recordset(sa.cast(sa.bindparam("rows", type_=sa.Text), JSONB))
        .table_valued(*fields)
        .render_derived(name="new_jobs", with_types=True)
    )
    c = rows.c
    if options or with_keys:
        names = ["kind", "payload", "queue", "priority", "max_attempts", "idempotency_key"]
        values: list[Any] = [
            c.k,
            c.p,
            sa.func.coalesce(c.q, models.DEFAULT_QUEUE),
            sa.func.coalesce(c.pr, models.DEFAULT_PRIORITY),
            c.m,  # NULL: the handler's, resolved by the claim (revision 0008)
            c.key,
        ]
        names += ["run_at", "timeout", "meta", "tags"]
        values += [
            sa.func.coalesce(
                c.at, _common.clock(now) + _common.seconds(sa.func.coalesce(c.d, 0.0))
            ),
            c.t,
            c.mt,
            c.tg,
        ]
    else:
        names, values = ["kind", "payload"], [c.k, c.p]
        if now is not None:
            names.append("run_at")
            values.append(_common.clock(now))
    insert = pg_insert(jobs).from_select(names, sa.select(*values))
    if with_keys:
        insert = insert.on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])
    return insert.returning(jobs.c.id)
