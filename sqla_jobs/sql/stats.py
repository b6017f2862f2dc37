"""Statements behind ``sqla_jobs.stats``.

Stats read indexes only: the partial ones, jobs_claim_idx (queued) and jobs_finished_idx
(done/dead/cancelled, by status then finished_at), and (revision 0010)
jobs_status_id_idx, which the planner may take for one status's rows (running jobs are
read there since revision 0018 dropped jobs_lease_idx). No statement here counts all
finished rows; their total comes from planner estimates (pg_class.reltuples, pg_stats),
so the cost does not grow with the history. The exact per-(queue, kind) counts of queued
and of dead jobs do grow with the backlog and the dead jobs kept; ``stats_sample`` lets
``ops.stats(exact_up_to=n)`` count them from the newest ``n + 1`` rows of each status
instead, exactly when there are no more, as an estimate when there are (the dashboard).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, REGCLASS

from sqla_jobs.models import JobStatus, jobs
from sqla_jobs.sql import _common
from sqla_jobs.sql._common import At, Now


def stats_now(now: Now = None) -> sa.Select[Any]:
    """The database's clock, the instant every stats figure refers to."""
    return sa.select(_common.clock(now))


def stats_queued(now: At = None) -> sa.Select[Any]:
    """Per (queue, kind): ready, scheduled, age of the oldest ready job (jobs_claim_idx)."""
    ready = jobs.c.run_at <= _common.clock(now)
    return (
        sa.select(
            jobs.c.queue,
            jobs.c.kind,
            sa.func.count().filter(ready).label("ready"),
            sa.func.count().filter(sa.not_(ready)).label("scheduled"),
            _common.epoch(_common.clock(now) - sa.func.min(jobs.c.run_at).filter(ready)).label(
                "oldest_ready"
            ),
        )
        .where(jobs.c.status == _common.status(JobStatus.QUEUED))
        .group_by(jobs.c.queue, jobs.c.kind)
    )


def stats_running(now: At = None) -> sa.Select[Any]:
    """Per (queue, kind): running, and expired leases among them (jobs_status_id_idx;
    no index holds the lease, revision 0018)."""
    return (
        sa.select(
            jobs.c.queue,
            jobs.c.kind,
            sa.func.count().label("running"),
            sa.func.count().filter(jobs.c.locked_until < _common.clock(now)).label("expired"),
        )
        .where(jobs.c.status == _common.status(JobStatus.RUNNING))
        .group_by(jobs.c.queue, jobs.c.kind)
    )


def stats_waiting(now: At = None) -> sa.Select[Any]:
    """Per (queue, kind): workflow steps waiting for their dependencies (revision 0014;
    jobs_status_id_idx: no partial index covers them, the claim never reads them)."""
    return (
        sa.select(jobs.c.queue, jobs.c.kind, sa.func.count().label("waiting"))
        .where(jobs.c.status == _common.status(JobStatus.WAITING))
        .group_by(jobs.c.queue, jobs.c.kind)
    )


def stats_dead(now: At = None) -> sa.Select[Any]:
    """Per (queue, kind): dead and cancelled rows (jobs_finished_idx, by status).

    ``finished_at > '-infinity'`` is always true for these rows (they all have one); it
    is there so the planner sees a bounded range on the index's second column too.
    """
    return (
        sa.select(
            jobs.c.queue,
            jobs.c.kind,
            sa.func.count().filter(jobs.c.status == _common.status(JobStatus.DEAD)).label("dead"),
            sa.func.count()
            .filter(jobs.c.status == _common.status(JobStatus.CANCELLED))
            .label("cancelled"),
        )
        .where(
            jobs.c.status.in_([_common.status(JobStatus.DEAD), _common.status(JobStatus.CANCELLED)])
        )
        .group_by(jobs.c.queue, jobs.c.kind)
    )


def stats_done_recent(now: At = None) -> sa.Select[Any]:
    """Per (queue, kind): done in the last minute and hour (a range on jobs_finished_idx)."""
    minute = jobs.c.finished_at >= _common.ago(60.0, now)
    return (
        sa.select(
            jobs.c.queue,
            jobs.c.kind,
            sa.func.count().filter(minute).label("done_last_minute"),
            sa.func.count().label("done_last_hour"),
        )
        .where(
            jobs.c.status == _common.status(JobStatus.DONE),
            jobs.c.finished_at >= _common.ago(3600.0, now),
        )
        .group_by(jobs.c.queue, jobs.c.kind)
    )


def _jobs_regclass() -> sa.ColumnElement[Any]:
    return sa.cast(sa.literal(jobs.name, sa.Text), REGCLASS)


def stats_table() -> sa.Select[Any]:
    """Size and bloat of the jobs table: planner row estimate and pg_stat_user_tables."""
    pg_class = sa.table("pg_class", sa.column("oid"), sa.column("reltuples", sa.Float))
    user_tables = sa.table(
        "pg_stat_user_tables",
        sa.column("relid"),
        sa.column("n_live_tup", sa.BigInteger),
        sa.column("n_dead_tup", sa.BigInteger),
        sa.column("last_vacuum", sa.DateTime(timezone=True)),
        sa.column("last_autovacuum", sa.DateTime(timezone=True)),
        sa.column("last_autoanalyze", sa.DateTime(timezone=True)),
    )
    return (
        sa.select(
            pg_class.c.reltuples,
            user_tables.c.n_live_tup,
            user_tables.c.n_dead_tup,
            user_tables.c.last_vacuum,
            user_tables.c.last_autovacuum,
            user_tables.c.last_autoanalyze,
        )
        .select_from(pg_class)
        .join(user_tables, user_tables.c.relid == pg_class.c.oid)
        .where(pg_class.c.oid == _jobs_regclass())
    )


def stats_status_estimates() -> sa.Select[Any]:
    """The planner's status frequencies (pg_stats), to estimate totals without counting."""
    pg_stats = sa.table(
        "pg_stats",
        sa.column("schemaname", sa.Text),
        sa.column("tablename", sa.Text),
        sa.column("attname", sa.Text),
        sa.column("most_common_vals"),
        sa.column("most_common_freqs", ARRAY(sa.Float)),
    )
    return sa.select(
        sa.cast(sa.cast(pg_stats.c.most_common_vals, sa.Text), ARRAY(sa.Text)).label("vals"),
        pg_stats.c.most_common_freqs.label("freqs"),
    ).where(
        pg_stats.c.schemaname == sa.func.current_schema(),
        pg_stats.c.tablename == jobs.name,
        pg_stats.c.attname == jobs.c.status.name,
    )


def unserved_ready(
    kinds: Sequence[str], queues: Sequence[str], *, look: int = 1000, now: Now = None
) -> sa.Select[Any]:
    """``(kind, queue, ready)``: ready jobs of ``kinds`` waiting outside ``queues``, among
    the ``look`` oldest ready jobs of each priority (jobs_claim_idx).

    For the worker's warning about jobs no claim of its own will ever take (a plain
    ``enqueue`` left them in ``default`` while it serves the handler's queue only). A
    bounded look, not a count: a job nobody claims becomes the oldest of its priority
    as the jobs around it are claimed, and the cost stays that of reading at most
    ``10 * look`` index entries however large the backlog.
    """
    levels = _common.priority_levels()
    oldest = (
        sa.select(jobs.c.kind, jobs.c.queue)
        .where(
            jobs.c.status == _common.status(JobStatus.QUEUED),
            jobs.c.priority == levels.c.level,
            jobs.c.run_at <= _common.clock(now),
        )
        .order_by(jobs.c.run_at)
        .limit(sa.bindparam("look", look, sa.Integer))
        .lateral("oldest")
    )
    return (
        sa.select(oldest.c.kind, oldest.c.queue, sa.func.count().label("ready"))
        .select_from(levels)
        .join(oldest, sa.true())
        .where(
            oldest.c.kind == sa.any_(_common.text_array(kinds)),
            oldest.c.queue != sa.all_(_common.text_array(queues)),
        )
        .group_by(oldest.c.kind, oldest.c.queue)
        .order_by(oldest.c.kind, oldest.c.queue)
    )


def throughput(minutes: int, now: Now = None) -> sa.Select[Any]:
    """Done and dead jobs per minute over the last ``minutes`` whole minutes (the current
    one included), oldest first; minutes with neither are absent.

    A range on jobs_finished_idx for each of the two statuses, as in
    ``stats_done_recent``: the cost follows the jobs finished in the window, never
    the history.
    """
    # 'minute' as SQL text, not a parameter: the same expression in SELECT and GROUP BY.
    unit: sa.ColumnElement[str] = sa.literal_column("'minute'")
    minute = sa.func.date_trunc(unit, jobs.c.finished_at)
    start = sa.func.date_trunc(unit, _common.clock(now)) - _common.seconds(
        sa.bindparam("span", (minutes - 1) * 60.0, sa.Float)
    )
    done = _common.status(JobStatus.DONE)
    dead = _common.status(JobStatus.DEAD)
    return (
        sa.select(
            minute.label("minute"),
            sa.func.count().filter(jobs.c.status == done).label("done"),
            sa.func.count().filter(jobs.c.status == dead).label("dead"),
        )
        .where(jobs.c.status.in_([done, dead]), jobs.c.finished_at >= start)
        .group_by(minute)
        .order_by(minute)
    )


def throughput_now(minutes: int) -> sa.Select[Any]:
    """``throughput`` as of the statement's clock, with that clock (``taken_at``) on
    every row, and alone on one row when no minute had a job: one round trip, not two.
    (``statement_timestamp()`` is one value throughout a statement.)"""
    one = sa.select(_common.clock(None).label("taken_at")).subquery("clock")
    counts = throughput(minutes).subquery("counts")
    return (
        sa.select(one.c.taken_at, counts.c.minute, counts.c.done, counts.c.dead)
        .select_from(one.outerjoin(counts, sa.true()))
        .order_by(counts.c.minute)
    )


def stats_sample(status: JobStatus, size: int, now: At = None) -> sa.Select[Any]:
    """Per (queue, kind): ready, scheduled, waiting, dead and cancelled among the newest ``size``
    rows of ``status``, and the oldest ready among them: the shares an estimate scales
    to the planner's total for the status.

    Read backwards on jobs_status_id_idx (revision 0010), written as the jobs page's
    statement is (``status = ANY(ARRAY[...])`` ordered by ``(status, id)``, see
    ``sqla_jobs.sql.admin.list_jobs``): ``ORDER BY id`` alone lets the planner walk
    the primary key back through every newer row of other statuses.
    """
    literal: sa.ColumnElement[Any] = sa.literal_column(f"ARRAY['{status.value}'::job_status]")
    newest = (
        sa.select(jobs.c.queue, jobs.c.kind, jobs.c.status, jobs.c.run_at)
        .where(jobs.c.status == sa.any_(literal))
        .order_by(jobs.c.status.desc(), jobs.c.id.desc())
        .limit(sa.bindparam("size", size, sa.Integer))
        .subquery("newest")
    )
    queued = newest.c.status == _common.status(JobStatus.QUEUED)
    ready = sa.and_(queued, newest.c.run_at <= _common.clock(now))
    return sa.select(
        newest.c.queue,
        newest.c.kind,
        sa.func.count().filter(ready).label("ready"),
        sa.func.count().filter(sa.and_(queued, sa.not_(ready))).label("scheduled"),
        sa.func.count()
        .filter(newest.c.status == _common.status(JobStatus.WAITING))
        .label("waiting"),
        sa.func.count().filter(newest.c.status == _common.status(JobStatus.DEAD)).label("dead"),
        sa.func.count()
        .filter(newest.c.status == _common.status(JobStatus.CANCELLED))
        .label("cancelled"),
        _common.epoch(_common.clock(now) - sa.func.min(newest.c.run_at).filter(ready)).label(
            "oldest_ready"
        ),
    ).group_by(newest.c.queue, newest.c.kind)


def stats_head(now: Now = None) -> sa.Select[Any]:
    """One row: the clock every figure refers to (``taken_at``), ``stats_table``'s
    columns and ``stats_status_estimates``' (NULL when missing): one round trip
    where the dashboard's overview made three."""
    table = stats_table().subquery("table_stats")
    estimates = stats_status_estimates().subquery("status_estimates")
    one = sa.select(_common.clock(now).label("taken_at")).subquery("clock")
    return sa.select(one.c.taken_at, *table.c, *estimates.c).select_from(
        one.outerjoin(table, sa.true()).outerjoin(estimates, sa.true())
    )


def stats_parts(parts: Sequence[tuple[str, sa.Select[Any]]]) -> sa.Select[Any]:
    """Per-(queue, kind) statements of this module, asked in one: ``UNION ALL`` of each,
    a ``part`` column naming it, the figures one lacks NULL (each branch is planned as
    it is alone, on its own index)."""
    types: dict[str, Any] = {}
    for _, stmt in parts:
        for column in stmt.selected_columns:
            if column.key is not None and column.key not in ("queue", "kind"):
                types.setdefault(column.key, column.type)
    branches: list[sa.Select[Any]] = []
    for name, stmt in parts:
        sub = stmt.subquery(f"part_{len(branches)}")
        figures = [
            sub.c[key] if key in sub.c else sa.cast(sa.null(), type_).label(key)
            for key, type_ in types.items()
        ]
        part = sa.literal(name, sa.Text).label("part")
        branches.append(sa.select(part, sub.c.queue, sub.c.kind, *figures))
    return sa.union_all(*branches)  # type: ignore[return-value]
