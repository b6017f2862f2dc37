"""Statements behind ``sqla_jobs.ops.health`` (issue #25): what pins the horizon, bloat, stalls.

None of them reads the history: the horizon holders come from ``pg_stat_activity``,
``pg_replication_slots`` and ``pg_prepared_xacts`` (one row per session, slot or
prepared transaction, never per job); dead and live tuples, vacuum times and sizes
from ``pg_stat_user_tables`` and the relation's files (``pg_relation_size`` stats a
file, it does not read it); the queue's figures through the partial indexes that hold
live jobs: expired leases among the running rows of ``jobs_status_id_idx`` (bounded
by the fleet's concurrency), the oldest ready
job on ``jobs_claim_idx`` one priority at a time, as a claim reads it. The cost stays
that of the live queue however many finished jobs the tables keep (``tests/test_health.py``
checks the plans on a large history).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

from sqla_jobs.models import JobStatus, jobs, worker_records
from sqla_jobs.sql import _common
from sqla_jobs.sql._common import Now

_XID = sa.types.NullType()


def _xid_age(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """Transactions begun since ``column`` (an xid): how far behind it holds the horizon."""
    return sa.func.age(column, type_=sa.BigInteger)


def horizon_sessions(*, limit: int = 3) -> sa.Select[Any]:
    """The sessions of this database holding back the xmin horizon, oldest first.

    A session holds it while it has a snapshot (``backend_xmin``: a REPEATABLE READ
    transaction, a long statement) or a transaction id (``backend_xid``: it wrote).
    The reading session itself is left out. Other users' sessions show no details
    unless the reader is a superuser or has ``pg_read_all_stats``.
    """
    activity = sa.table(
        "pg_stat_activity",
        sa.column("pid", sa.Integer),
        sa.column("datname", sa.Text),
        sa.column("usename", sa.Text),
        sa.column("application_name", sa.Text),
        sa.column("backend_type", sa.Text),
        sa.column("state", sa.Text),
        sa.column("xact_start", sa.DateTime(timezone=True)),
        sa.column("query_start", sa.DateTime(timezone=True)),
        sa.column("backend_xmin", _XID),
        sa.column("backend_xid", _XID),
        sa.column("query", sa.Text),
    )
    xid_age = sa.func.greatest(_xid_age(activity.c.backend_xmin), _xid_age(activity.c.backend_xid))
    now = sa.func.statement_timestamp()
    return (
        sa.select(
            activity.c.pid,
            activity.c.usename.label("user"),
            activity.c.application_name,
            activity.c.backend_type,
            activity.c.state,
            activity.c.xact_start,
            activity.c.query_start,
            _common.epoch(now - activity.c.xact_start).label("age_seconds"),
            xid_age.label("xid_age"),
            sa.func.left(activity.c.query, 200).label("query"),
        )
        .where(
            activity.c.datname == sa.func.current_database(),
            activity.c.pid != sa.func.pg_backend_pid(),
            sa.or_(activity.c.backend_xmin.is_not(None), activity.c.backend_xid.is_not(None)),
        )
        .order_by(xid_age.desc(), activity.c.xact_start)
        .limit(limit)
    )


def reader() -> sa.Select[Any]:
    """The reading role, whether it sees other roles' sessions, and since when this
    database's statistics run.

    ``sees_all``: a superuser or a member of ``pg_read_all_stats`` (``pg_has_role``'s
    MEMBER is true for a superuser); any other role sees only its own sessions' states,
    queries and transaction starts in ``pg_stat_activity``. ``stats_since``: the last
    reset of this database's statistics, else the server's start (when its counters,
    the vacuum times among them, began).
    """
    database = sa.table(
        "pg_stat_database",
        sa.column("datname", sa.Text),
        sa.column("stats_reset", sa.DateTime(timezone=True)),
    )
    started = sa.func.pg_postmaster_start_time(type_=sa.DateTime(timezone=True))
    since = (
        sa.select(sa.func.coalesce(database.c.stats_reset, started))
        .where(database.c.datname == sa.func.current_database())
        .scalar_subquery()
    )
    return sa.select(
        sa.func.current_user().label("role"),
        sa.func.pg_has_role(
            sa.func.current_user(),
            sa.literal("pg_read_all_stats"),
            sa.literal("MEMBER"),
            type_=sa.Boolean,
        ).label("sees_all"),
        sa.func.coalesce(since, started).label("stats_since"),
    )


def horizon_slots() -> sa.Select[Any]:
    """Replication slots holding the horizon or WAL: physical ones (cluster-wide, e.g.
    with ``hot_standby_feedback``) and this database's logical ones, with an xmin, or
    inactive (an inactive slot keeps its WAL from ``restart_lsn`` on, xmin or not).
    ``retained_wal_bytes``: the WAL from its ``restart_lsn`` to now (on a standby, to
    the last replayed position)."""
    slots = sa.table(
        "pg_replication_slots",
        sa.column("slot_name", sa.Text),
        sa.column("slot_type", sa.Text),
        sa.column("database", sa.Text),
        sa.column("active", sa.Boolean),
        sa.column("xmin", _XID),
        sa.column("catalog_xmin", _XID),
        sa.column("restart_lsn", _XID),
    )
    xid_age = sa.func.greatest(_xid_age(slots.c.xmin), _xid_age(slots.c.catalog_xmin))
    current_lsn = sa.case(
        (sa.func.pg_is_in_recovery(), sa.func.pg_last_wal_replay_lsn()),
        else_=sa.func.pg_current_wal_lsn(),
    )
    retained = sa.func.pg_wal_lsn_diff(current_lsn, slots.c.restart_lsn, type_=sa.BigInteger)
    return (
        sa.select(
            slots.c.slot_name,
            slots.c.slot_type,
            slots.c.active,
            _xid_age(slots.c.xmin).label("xmin_age"),
            _xid_age(slots.c.catalog_xmin).label("catalog_xmin_age"),
            xid_age.label("xid_age"),
            retained.label("retained_wal_bytes"),
        )
        .where(
            sa.or_(
                slots.c.xmin.is_not(None),
                slots.c.catalog_xmin.is_not(None),
                sa.not_(slots.c.active),
            ),
            sa.or_(slots.c.database.is_(None), slots.c.database == sa.func.current_database()),
        )
        .order_by(xid_age.desc().nulls_last(), slots.c.slot_name)
    )


def horizon_prepared() -> sa.Select[Any]:
    """Prepared transactions (two-phase commit) of this database, oldest first: each
    holds the horizon, and its locks, until COMMIT PREPARED or ROLLBACK PREPARED."""
    prepared = sa.table(
        "pg_prepared_xacts",
        sa.column("gid", sa.Text),
        sa.column("transaction", _XID),
        sa.column("prepared", sa.DateTime(timezone=True)),
        sa.column("owner", sa.Text),
        sa.column("database", sa.Text),
    )
    return (
        sa.select(
            prepared.c.gid,
            prepared.c.owner,
            prepared.c.prepared,
            _common.epoch(sa.func.statement_timestamp() - prepared.c.prepared).label("age_seconds"),
            _xid_age(prepared.c.transaction).label("xid_age"),
        )
        .where(prepared.c.database == sa.func.current_database())
        .order_by(prepared.c.prepared)
    )


def tables(names: Sequence[str]) -> sa.Select[Any]:
    """Tuples, vacuum and analyze times and sizes of the queue's tables (this schema).

    A partitioned table (``jobs_archive`` since revision 0022) is the sum of its
    partitions (the leaves of ``pg_partition_tree``; a plain table is its own only
    leaf): live and dead tuples, updates and sizes added up; each last-vacuum and
    last-analyze time the oldest among the partitions that have dead rows (the one
    vacuum is behind on), the newest when none has. ``server_autovacuum``: the
    ``autovacuum`` setting is on; ``table_autovacuum``: no leaf has
    ``autovacuum_enabled`` false. Catalog and statistics reads only.
    """
    user_tables = sa.table(
        "pg_stat_user_tables",
        sa.column("relid"),
        sa.column("n_live_tup", sa.BigInteger),
        sa.column("n_dead_tup", sa.BigInteger),
        sa.column("n_tup_upd", sa.BigInteger),
        sa.column("n_tup_hot_upd", sa.BigInteger),
        sa.column("last_vacuum", sa.DateTime(timezone=True)),
        sa.column("last_autovacuum", sa.DateTime(timezone=True)),
        sa.column("last_analyze", sa.DateTime(timezone=True)),
        sa.column("last_autoanalyze", sa.DateTime(timezone=True)),
    )
    t = user_tables.c
    wanted = sa.func.unnest(sa.literal(list(names), ARRAY(sa.Text))).table_valued("name")
    qualified = sa.func.quote_ident(sa.func.current_schema()) + "." + wanted.c.name
    table = sa.func.to_regclass(qualified)
    # pg_partition_tree lists nothing for a table outside partitioning: it is its own leaf.
    tree = (
        sa.func.pg_partition_tree(table)
        .table_valued(sa.column("relid"), sa.column("isleaf", sa.Boolean))
        .lateral("tree")
    )

    def total(column: sa.ColumnElement[Any], name: str) -> sa.Label[Any]:
        return sa.cast(sa.func.sum(column), sa.BigInteger).label(name)

    # ALTER TABLE ... SET (autovacuum_enabled = false) on a table (a partition).
    pg_class = sa.table("pg_class", sa.column("oid"), sa.column("reloptions", ARRAY(sa.Text)))
    disabled = sa.func.array_to_string(pg_class.c.reloptions, ",").regexp_match(
        "(^|,)autovacuum_enabled=(false|off|no|n|f|0)(,|$)", flags="i"
    )

    def behind(column: sa.ColumnElement[Any]) -> sa.Label[Any]:
        oldest_dirty = sa.func.min(column).filter(t.n_dead_tup > 0)
        return sa.func.coalesce(oldest_dirty, sa.func.max(column)).label(column.name)

    return (
        sa.select(
            wanted.c.name,
            total(t.n_live_tup, "live_tuples"),
            total(t.n_dead_tup, "dead_tuples"),
            total(t.n_tup_upd, "updates"),
            total(t.n_tup_hot_upd, "hot_updates"),
            behind(t.last_vacuum),
            behind(t.last_autovacuum),
            behind(t.last_analyze),
            behind(t.last_autoanalyze),
            total(sa.func.pg_table_size(t.relid, type_=sa.BigInteger), "table_bytes"),
            total(sa.func.pg_indexes_size(t.relid, type_=sa.BigInteger), "index_bytes"),
            (sa.func.current_setting("autovacuum") == "on").label("server_autovacuum"),
            sa.not_(sa.func.coalesce(sa.func.bool_or(disabled), False)).label("table_autovacuum"),
        )
        .select_from(wanted)
        .outerjoin(tree, tree.c.isleaf)
        .join(user_tables, t.relid == sa.func.coalesce(tree.c.relid, table))
        .join(pg_class, pg_class.c.oid == t.relid)
        .group_by(wanted.c.name)
        .order_by(wanted.c.name)
    )


def expired_leases(grace_seconds: float, now: Now = None) -> sa.Select[Any]:
    """Running jobs whose lease expired over ``grace_seconds`` ago, and the oldest
    expiry (the running jobs of jobs_status_id_idx): their worker died and no rescuer
    took them back yet."""
    cutoff = _common.ago(sa.bindparam("grace", grace_seconds, sa.Float), now)
    return sa.select(
        sa.func.count().label("expired"),
        _common.epoch(_common.clock(now) - sa.func.min(jobs.c.locked_until)).label(
            "oldest_seconds"
        ),
    ).where(jobs.c.status == _common.status(JobStatus.RUNNING), jobs.c.locked_until < cutoff)


def oldest_ready(now: Now = None) -> sa.Select[Any]:
    """The oldest ready job: seconds it has waited, its queue and kind (no row when
    none is ready).

    Read like a claim: per priority level the first ready row in ``run_at`` order
    (a range scan of jobs_claim_idx stopped at its first match), then the oldest of
    those, so the cost does not grow with the backlog.
    """
    levels = _common.priority_levels()
    first = (
        sa.select(jobs.c.run_at, jobs.c.queue, jobs.c.kind)
        .where(
            jobs.c.status == _common.status(JobStatus.QUEUED),
            jobs.c.priority == levels.c.level,
            jobs.c.run_at <= _common.clock(now),
        )
        .order_by(jobs.c.run_at)
        .limit(1)
        .lateral("first")
    )
    return (
        sa.select(
            _common.epoch(_common.clock(now) - first.c.run_at).label("seconds"),
            first.c.queue,
            first.c.kind,
        )
        .select_from(levels.join(first, sa.true()))
        .order_by(first.c.run_at)
        .limit(1)
    )


def live_workers(max_age_seconds: float, now: Now = None) -> sa.Select[Any]:
    """How many workers are live and on time: listed by ``sqla-jobs workers`` (their
    lease not expired, ``workers.live``) and beat within ``max_age_seconds``."""
    w = worker_records.c
    cutoff = _common.ago(sa.bindparam("max_age", max_age_seconds, sa.Float), now)
    return sa.select(sa.func.count()).where(
        w.heartbeat_at >= cutoff, w.expires_at >= _common.clock(now)
    )


def stale_workers(max_age_seconds: float, now: Now = None) -> sa.Select[Any]:
    """Registered workers whose last heartbeat is older than ``max_age_seconds``."""
    w = worker_records.c
    return (
        sa.select(
            w.id,
            w.host,
            w.pid,
            w.heartbeat_at,
            _common.epoch(_common.clock(now) - w.heartbeat_at).label("age_seconds"),
            w.expires_at,
        )
        .where(
            w.heartbeat_at < _common.ago(sa.bindparam("max_age", max_age_seconds, sa.Float), now)
        )
        .order_by(w.heartbeat_at)
    )


def average_row_bytes(table: str) -> sa.Select[Any]:
    """A live row's average size in ``table`` per ``pg_stats`` (ANALYZE's sample): its
    columns' ``avg_width`` plus the tuple header and line pointer (28 bytes); NULL
    before the table's first ANALYZE."""
    stats = sa.table(
        "pg_stats",
        sa.column("schemaname", sa.Text),
        sa.column("tablename", sa.Text),
        sa.column("avg_width", sa.Integer),
    )
    return sa.select(sa.func.sum(stats.c.avg_width, type_=sa.BigInteger) + 28).where(
        stats.c.schemaname == sa.func.current_schema(),
        stats.c.tablename == sa.bindparam("table", table),
    )
