"""Every SQL statement sqla_jobs runs, built with SQLAlchemy Core.

This is the only module that builds SQL. Each function is pure: it takes plain values
(including an optional ``now`` so tests can pin time) and returns an executable Core
statement. Time always comes from the database (``now()``) unless ``now`` is given; the
worker's clock is never compared with a database timestamp.

Fencing: every statement that finishes, retries, extends or releases a claimed job
matches ``status = 'running' AND worker = :worker AND attempts = :attempt``. A worker
whose lease expired and whose job was taken over updates zero rows instead of
overwriting the new run (the seed finished jobs by id alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, REGCLASS
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert

from sqla_jobs import migrations, models, validation
from sqla_jobs.models import JobStatus, jobs

Now = datetime | None

_RETURNING = (
    jobs.c.id,
    jobs.c.kind,
    jobs.c.queue,
    jobs.c.payload,
    jobs.c.attempts,
    jobs.c.max_attempts,
)


def _now(now: Now) -> sa.ColumnElement[datetime]:
    if now is None:
        return sa.func.now()
    return sa.literal(now, sa.DateTime(timezone=True))


def _seconds(value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """An interval of ``value`` seconds (a bound parameter or a column)."""
    return sa.literal_column("interval '1 second'", sa.Interval) * value


def _status(status: JobStatus) -> sa.ColumnElement[Any]:
    # Statuses are written into the SQL text, not bound: a partial index
    # (WHERE status = 'queued') can only be used when the planner sees the constant,
    # and a generic plan of a prepared statement would not.
    return sa.literal_column(f"'{status.value}'::job_status", models.job_status)


def _still_running() -> sa.ColumnElement[bool]:
    """``status = 'running'`` for the fences, in a form no partial index can answer.

    With the plain comparison the planner may read jobs_lease_idx (WHERE status =
    'running') end to end and filter on id: a queue's statistics are always stale, the
    index often looks empty, and then its cost ties with the primary-key probe. That
    made every done-mark scan all running jobs (0.6 ms with 2,000 running instead of
    0.05 ms). Compared as text, the fence is checked on the row the primary key found.
    """
    return sa.cast(jobs.c.status, sa.Text) == sa.literal_column(f"'{JobStatus.RUNNING.value}'")


def _text_array(values: Sequence[str]) -> sa.ColumnElement[Any]:
    # One array parameter instead of IN (...): the SQL text (and any prepared plan)
    # stays the same whatever the number of queues or kinds.
    return sa.literal(list(values), ARRAY(sa.Text))


def _payload_param(name: str = "payload") -> sa.ColumnElement[Any]:
    # The payload arrives as JSON text already checked by validation.dump_payload;
    # casting text to jsonb avoids serialising it a second time.
    return sa.cast(sa.bindparam(name, type_=sa.Text), JSONB)


# --- enqueue ---------------------------------------------------------------------------


def insert_job(
    *,
    has_run_at: bool,
    has_delay: bool,
    columns: Sequence[str],
    now: Now = None,
) -> sa.Insert:
    """``INSERT ... ON CONFLICT (idempotency_key) DO NOTHING RETURNING id``.

    Bind parameters: ``kind``, ``payload`` (JSON text), ``run_at`` or ``delay`` when
    flagged, and one per name in ``columns`` (queue, priority, max_attempts,
    idempotency_key). Columns not named take the table's defaults.
    """
    values: dict[str, Any] = {
        "kind": sa.bindparam("kind", type_=sa.Text),
        "payload": _payload_param(),
    }
    for name in columns:
        values[name] = sa.bindparam(name, type_=jobs.c[name].type)
    if has_run_at:
        values["run_at"] = sa.bindparam("run_at", type_=sa.DateTime(timezone=True))
    elif has_delay:
        values["run_at"] = _now(now) + _seconds(sa.bindparam("delay", type_=sa.Float))
    elif now is not None:
        values["run_at"] = _now(now)
    return (
        pg_insert(jobs)
        .values(values)
        .on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])
        .returning(jobs.c.id)
    )


def insert_jobs_json(*, with_keys: bool, now: Now = None) -> sa.Insert:
    """Insert many jobs in one statement from one JSON array (one round trip per batch).

    One bound parameter, ``rows``: a JSON array of objects with ``k`` (kind), ``p``
    (payload), and optional ``q`` (queue), ``pr`` (priority), ``m`` (max_attempts),
    ``key``, ``at`` (run_at, ISO 8601 with offset) and ``d`` (delay, seconds); a missing
    field takes the table default. One text parameter is the cheapest thing to send:
    psycopg quotes every element of a text array with a regular expression, which cost
    more than the insert itself.

    ``with_keys``: a batch with idempotency keys skips those already taken (``ON
    CONFLICT DO NOTHING``); a batch without any leaves out that clause and its
    speculative insertion, since NULL keys never conflict. RETURNING the new ids.
    """
    rows = (
        sa.func.json_to_recordset(sa.cast(sa.bindparam("rows", type_=sa.Text), sa.JSON))
        .table_valued(
            sa.column("k", sa.Text),
            sa.column("p", JSONB),
            sa.column("q", sa.Text),
            sa.column("pr", sa.SmallInteger),
            sa.column("m", sa.Integer),
            sa.column("key", sa.Text),
            sa.column("at", sa.DateTime(timezone=True)),
            sa.column("d", sa.Float),
        )
        .render_derived(name="new_jobs", with_types=True)
    )
    c = rows.c
    source = sa.select(
        c.k,
        c.p,
        sa.func.coalesce(c.q, models.DEFAULT_QUEUE),
        sa.func.coalesce(c.pr, models.DEFAULT_PRIORITY),
        sa.func.coalesce(c.m, models.DEFAULT_MAX_ATTEMPTS),
        c.key,
        sa.func.coalesce(c.at, _now(now) + _seconds(sa.func.coalesce(c.d, 0.0))),
    )
    insert = pg_insert(jobs).from_select(
        ["kind", "payload", "queue", "priority", "max_attempts", "idempotency_key", "run_at"],
        source,
    )
    if with_keys:
        insert = insert.on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])
    return insert.returning(jobs.c.id)


# --- claim -----------------------------------------------------------------------------


def _limit(limit: int) -> sa.BindParameter[int]:
    # Named, so a caller that compiles the claim once can pass another limit per
    # execution (``{"limit": n}``) instead of rebuilding the statement.
    return sa.bindparam("limit", limit, sa.Integer)


def claim(
    *,
    worker: str,
    lock_seconds: float,
    queues: Sequence[str],
    kinds: Sequence[str],
    limit: int,
    now: Now = None,
) -> sa.Select[Any]:
    """Claim up to ``limit`` ready jobs of the given queues and kinds, in one statement.

    Rows come back in claim order (priority, run_at, id): ``UPDATE ... RETURNING`` alone
    returns them in whatever order the join produced, and a worker that buffers a batch
    runs it in the order returned.

    ``ORDER BY priority, run_at`` is walked one priority at a time: a LATERAL subquery
    per priority level (0-9) is an index range scan on ``jobs_claim_idx`` bounded by
    ``run_at <= now()``, so jobs scheduled in the future are never read (a single
    ``ORDER BY priority, run_at`` scan would walk every future row of a priority before
    reaching the next one). The outer LIMIT stops the nested loop as soon as enough rows
    are locked, so empty or unneeded levels cost one index probe or nothing.

    The candidate set is a MATERIALIZED CTE: as an ``IN (subquery)`` the planner may
    re-run the SKIP LOCKED subquery and lock more rows than it updates.
    """
    levels = (
        sa.func.generate_series(
            sa.literal_column(str(validation.MIN_PRIORITY)),
            sa.literal_column(str(validation.MAX_PRIORITY)),
        )
        .table_valued("level")
        .render_derived(name="levels")
    )
    per_level = (
        sa.select(jobs.c.id)
        .where(
            jobs.c.status == _status(JobStatus.QUEUED),
            jobs.c.priority == levels.c.level,
            jobs.c.run_at <= _now(now),
            jobs.c.queue == sa.any_(_text_array(queues)),
            jobs.c.kind == sa.any_(_text_array(kinds)),
        )
        .order_by(jobs.c.run_at)
        .limit(_limit(limit))
        .with_for_update(skip_locked=True)
        .lateral("ready")
    )
    picked = (
        sa.select(per_level.c.id)
        .select_from(levels)
        .join(per_level, sa.true())
        .limit(_limit(limit))
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    # ``id = ANY((SELECT array_agg(id) FROM picked))``, not a join with ``picked``: the
    # worker's statements are prepared, and in the generic plan the planner cannot see
    # the LIMIT, guesses a large ``picked`` and hash-joins it with a sequential scan of
    # the whole table (7 ms at 20,000 rows, growing with the table). An array from an
    # InitPlan is always probed through the primary key (the cast keeps ANY(array) from
    # being read as ANY(subquery)).
    picked_ids = sa.cast(
        sa.select(sa.func.array_agg(picked.c.id)).scalar_subquery(), ARRAY(sa.BigInteger)
    )
    claimed = (
        sa.update(jobs)
        .where(jobs.c.id == sa.any_(picked_ids))
        .values(
            status=_status(JobStatus.RUNNING),
            locked_until=_now(now) + _seconds(sa.bindparam("lock_seconds", lock_seconds, sa.Float)),
            attempts=jobs.c.attempts + 1,
            worker=sa.bindparam("worker", worker, sa.Text),
        )
        .returning(*_RETURNING, jobs.c.priority, jobs.c.run_at)
        .cte("claimed")
    )
    return sa.select(*(claimed.c[c.name] for c in _RETURNING)).order_by(
        claimed.c.priority, claimed.c.run_at, claimed.c.id
    )


# --- outcomes (all fenced) -------------------------------------------------------------


def _fence(worker: str, leases: Sequence[tuple[int, int]]) -> list[sa.ColumnElement[bool]]:
    """Conditions (over ``unnest(ids, attempts) AS fence``) that make a claim still ours."""
    # Named parameters, so a caller that compiles a fenced statement once can pass other
    # leases per execution (``{"fence_ids": [...], "fence_attempts": [...]}``).
    ids = sa.bindparam("fence_ids", [job_id for job_id, _ in leases], ARRAY(sa.BigInteger))
    fence = (
        sa.func.unnest(
            ids,
            sa.bindparam("fence_attempts", [attempt for _, attempt in leases], ARRAY(sa.Integer)),
        )
        .table_valued("id", "attempt")
        .render_derived(name="fence")
    )
    conditions = [
        # Redundant with the join below, but it gives the (prepared, generic) plan a
        # primary-key probe; without it the planner may scan every running job of every
        # worker through jobs_lease_idx and re-run unnest() for each.
        jobs.c.id == sa.any_(ids),
        jobs.c.id == fence.c.id,
        jobs.c.attempts == fence.c.attempt,
        _still_running(),
        jobs.c.worker == sa.bindparam("fence_worker", worker, sa.Text),
    ]
    return conditions


def complete(*, worker: str, leases: Sequence[tuple[int, int]], now: Now = None) -> sa.Update:
    """Mark the given ``(job_id, attempt)`` claims done; RETURNING the ids that were ours."""
    conditions = _fence(worker, leases)
    return (
        sa.update(jobs)
        .where(*conditions)
        .values(status=_status(JobStatus.DONE), finished_at=_now(now), locked_until=None)
        .returning(jobs.c.id)
    )


def complete_one(*, worker: str, job_id: int, attempt: int, now: Now = None) -> sa.Update:
    """Mark one ``(job_id, attempt)`` claim done, in the handler's transaction.

    The same fence as :func:`complete`, with scalar parameters: the worker runs this once
    per job whose handler wrote, and adapting the lease arrays cost more client time than
    the rest of the statement. One row updated means the claim was ours; zero, lost. Its
    generic plan (it may be prepared) is a primary-key probe.
    """
    return (
        sa.update(jobs)
        .where(
            jobs.c.id == sa.bindparam("job_id", job_id, sa.BigInteger),
            jobs.c.attempts == sa.bindparam("attempt", attempt, sa.Integer),
            _still_running(),
            jobs.c.worker == sa.bindparam("fence_worker", worker, sa.Text),
        )
        .values(status=_status(JobStatus.DONE), finished_at=_now(now), locked_until=sa.null())
    )


def retry(
    *,
    worker: str,
    job_id: int,
    attempt: int,
    delay_seconds: float,
    error: str,
    now: Now = None,
) -> sa.Update:
    """Record a failed attempt: back to queued after ``delay_seconds``, or dead at max_attempts.

    RETURNING ``id, status``: no row means the claim was lost (fenced).
    """
    conditions = _fence(worker, [(job_id, attempt)])
    exhausted = jobs.c.attempts >= jobs.c.max_attempts
    return (
        sa.update(jobs)
        .where(*conditions)
        .values(
            status=sa.case((exhausted, _status(JobStatus.DEAD)), else_=_status(JobStatus.QUEUED)),
            run_at=_now(now) + _seconds(sa.bindparam("delay", delay_seconds, sa.Float)),
            locked_until=None,
            last_error=sa.bindparam("error", error, sa.Text),
            finished_at=sa.case((exhausted, _now(now)), else_=None),
        )
        .returning(jobs.c.id, jobs.c.status)
    )


def heartbeat(
    *, worker: str, leases: Sequence[tuple[int, int]], lock_seconds: float, now: Now = None
) -> sa.Update:
    """Extend the leases still ours; RETURNING their ids (a missing id is a lost claim)."""
    conditions = _fence(worker, leases)
    return (
        sa.update(jobs)
        .where(*conditions)
        .values(
            locked_until=_now(now) + _seconds(sa.bindparam("lock_seconds", lock_seconds, sa.Float))
        )
        .returning(jobs.c.id)
    )


def release(*, worker: str, leases: Sequence[tuple[int, int]]) -> sa.Update:
    """Give back claims whose handler never started (shutdown): queued again, attempt not spent."""
    conditions = _fence(worker, leases)
    return (
        sa.update(jobs)
        .where(*conditions)
        .values(
            status=_status(JobStatus.QUEUED),
            attempts=jobs.c.attempts - 1,
            locked_until=None,
            worker=None,
        )
        .returning(jobs.c.id)
    )


def rescue_expired(*, limit: int = 1000, now: Now = None) -> sa.Update:
    """Requeue jobs whose lease expired (their worker died or stopped heartbeating).

    A job that had already used its last attempt goes dead instead: a poison job that
    kills its worker must not be handed to the next one forever. This replaces the
    seed's ``OR (status = 'running' AND locked_until < now())`` claim branch.
    """
    expired = (
        sa.select(jobs.c.id)
        .where(jobs.c.status == _status(JobStatus.RUNNING), jobs.c.locked_until < _now(now))
        .order_by(jobs.c.locked_until)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("expired")
        .prefix_with("MATERIALIZED")
    )
    exhausted = jobs.c.attempts >= jobs.c.max_attempts
    message = sa.func.concat(
        "lease expired during attempt ",
        jobs.c.attempts,
        " of ",
        jobs.c.max_attempts,
        ": worker ",
        sa.func.coalesce(jobs.c.worker, "?"),
        " stopped heartbeating (killed, crashed or lost its connection)",
    )
    return (
        sa.update(jobs)
        .where(jobs.c.id == expired.c.id)
        .values(
            status=sa.case((exhausted, _status(JobStatus.DEAD)), else_=_status(JobStatus.QUEUED)),
            run_at=_now(now),
            locked_until=None,
            last_error=message,
            finished_at=sa.case((exhausted, _now(now)), else_=None),
        )
        .returning(jobs.c.id, jobs.c.kind, jobs.c.status, jobs.c.attempts, jobs.c.worker)
    )


# --- operations (sqla_jobs.ops) -------------------------------------------------------
#
# Stats read the three partial indexes only: jobs_claim_idx (queued), jobs_lease_idx
# (running) and jobs_finished_idx (done/dead/cancelled, by status then finished_at). No
# statement here counts all finished rows; their total comes from planner estimates
# (pg_class.reltuples, pg_stats), so the cost does not grow with the history.


def _ago(seconds: float | sa.ColumnElement[Any], now: Now = None) -> sa.ColumnElement[datetime]:
    value = seconds if isinstance(seconds, sa.ColumnElement) else sa.literal(float(seconds))
    return _now(now) - _seconds(value)


def _epoch(value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    return sa.func.extract("epoch", value)


def stats_now(now: Now = None) -> sa.Select[Any]:
    """The database's clock, the instant every stats figure refers to."""
    return sa.select(_now(now))


def stats_queued(now: Now = None) -> sa.Select[Any]:
    """Per (queue, kind): ready, scheduled, age of the oldest ready job (jobs_claim_idx)."""
    ready = jobs.c.run_at <= _now(now)
    return (
        sa.select(
            jobs.c.queue,
            jobs.c.kind,
            sa.func.count().filter(ready).label("ready"),
            sa.func.count().filter(sa.not_(ready)).label("scheduled"),
            _epoch(_now(now) - sa.func.min(jobs.c.run_at).filter(ready)).label("oldest_ready"),
        )
        .where(jobs.c.status == _status(JobStatus.QUEUED))
        .group_by(jobs.c.queue, jobs.c.kind)
    )


def stats_running(now: Now = None) -> sa.Select[Any]:
    """Per (queue, kind): running, and expired leases among them (jobs_lease_idx)."""
    return (
        sa.select(
            jobs.c.queue,
            jobs.c.kind,
            sa.func.count().label("running"),
            sa.func.count().filter(jobs.c.locked_until < _now(now)).label("expired"),
        )
        .where(jobs.c.status == _status(JobStatus.RUNNING))
        .group_by(jobs.c.queue, jobs.c.kind)
    )


def stats_dead(now: Now = None) -> sa.Select[Any]:
    """Per (queue, kind): dead and cancelled rows (jobs_finished_idx, by status).

    ``finished_at > '-infinity'`` is always true for these rows (they all have one); it
    is there so the planner sees a bounded range on the index's second column too.
    """
    return (
        sa.select(
            jobs.c.queue,
            jobs.c.kind,
            sa.func.count().filter(jobs.c.status == _status(JobStatus.DEAD)).label("dead"),
            sa.func.count()
            .filter(jobs.c.status == _status(JobStatus.CANCELLED))
            .label("cancelled"),
        )
        .where(jobs.c.status.in_([_status(JobStatus.DEAD), _status(JobStatus.CANCELLED)]))
        .group_by(jobs.c.queue, jobs.c.kind)
    )


def stats_done_recent(now: Now = None) -> sa.Select[Any]:
    """Per (queue, kind): done in the last minute and hour (a range on jobs_finished_idx)."""
    minute = jobs.c.finished_at >= _ago(60.0, now)
    return (
        sa.select(
            jobs.c.queue,
            jobs.c.kind,
            sa.func.count().filter(minute).label("done_last_minute"),
            sa.func.count().label("done_last_hour"),
        )
        .where(
            jobs.c.status == _status(JobStatus.DONE),
            jobs.c.finished_at >= _ago(3600.0, now),
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


def _job_filters(
    *,
    ids: Sequence[int] | None = None,
    statuses: Sequence[JobStatus] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: float | None = None,
    now: Now = None,
) -> list[sa.ColumnElement[bool]]:
    conditions: list[sa.ColumnElement[bool]] = []
    if ids is not None:
        conditions.append(jobs.c.id == sa.any_(sa.literal(list(ids), ARRAY(sa.BigInteger))))
    if statuses is not None:
        conditions.append(jobs.c.status.in_([_status(s) for s in statuses]))
    if kind is not None:
        conditions.append(jobs.c.kind == sa.bindparam("kind", kind, sa.Text))
    if queue is not None:
        conditions.append(jobs.c.queue == sa.bindparam("queue", queue, sa.Text))
    if older_than is not None:
        age = sa.bindparam("older_than", older_than, sa.Float)
        conditions.append(jobs.c.created_at < _ago(age, now))
    return conditions


def list_jobs(
    *,
    statuses: Sequence[JobStatus] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: float | None = None,
    limit: int,
    after_id: int | None = None,
    now: Now = None,
) -> sa.Select[Any]:
    """One page of jobs in id order; the next page starts after the last id (keyset)."""
    conditions = _job_filters(
        statuses=statuses, kind=kind, queue=queue, older_than=older_than, now=now
    )
    if after_id is not None:
        conditions.append(jobs.c.id > sa.bindparam("after_id", after_id, sa.BigInteger))
    return (
        sa.select(*jobs.c)
        .where(*conditions)
        .order_by(jobs.c.id)
        .limit(sa.bindparam("limit", limit, sa.Integer))
    )


def get_job(job_id: int) -> sa.Select[Any]:
    return sa.select(*jobs.c).where(jobs.c.id == sa.bindparam("id", job_id, sa.BigInteger))


def _locked_ids(conditions: list[sa.ColumnElement[bool]], name: str) -> sa.CTE:
    # SKIP LOCKED: rows a worker is claiming (or another operator is changing) right
    # now are left alone and not counted. MATERIALIZED, as in claim(): the locking
    # subquery runs exactly once.
    return (
        sa.select(jobs.c.id)
        .where(*conditions)
        .with_for_update(skip_locked=True)
        .cte(name)
        .prefix_with("MATERIALIZED")
    )


def retry_jobs(
    *,
    statuses: Sequence[JobStatus],
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: float | None = None,
    now: Now = None,
) -> sa.Update:
    """Finished jobs back to queued, ready now, with a fresh set of attempts.

    ``last_error`` is kept (the next failure replaces it), so the reason the job died
    stays visible until it runs again. RETURNING the ids changed.
    """
    conditions = _job_filters(
        ids=ids, statuses=statuses, kind=kind, queue=queue, older_than=older_than, now=now
    )
    picked = _locked_ids(conditions, "picked")
    return (
        sa.update(jobs)
        .where(jobs.c.id == picked.c.id)
        .values(
            status=_status(JobStatus.QUEUED),
            attempts=0,
            run_at=_now(now),
            locked_until=None,
            worker=None,
            finished_at=None,
        )
        .returning(jobs.c.id)
    )


def cancel_jobs(
    *,
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: float | None = None,
    now: Now = None,
) -> sa.Update:
    """Queued jobs (ready or scheduled) to cancelled. A job claimed meanwhile is running,
    fails the status test once its lock is released, and is not changed."""
    conditions = _job_filters(
        ids=ids, statuses=[JobStatus.QUEUED], kind=kind, queue=queue, older_than=older_than, now=now
    )
    picked = _locked_ids(conditions, "picked")
    return (
        sa.update(jobs)
        .where(jobs.c.id == picked.c.id, jobs.c.status == _status(JobStatus.QUEUED))
        .values(status=_status(JobStatus.CANCELLED), finished_at=_now(now), locked_until=None)
        .returning(jobs.c.id)
    )


def delete_jobs(
    *,
    statuses: Sequence[JobStatus],
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: float | None = None,
    now: Now = None,
) -> ReturningDelete[Any]:
    """Delete jobs in ``statuses`` (never ``running``: the caller checks). RETURNING ids."""
    conditions = _job_filters(
        ids=ids, statuses=statuses, kind=kind, queue=queue, older_than=older_than, now=now
    )
    picked = _locked_ids(conditions, "picked")
    return sa.delete(jobs).where(jobs.c.id == picked.c.id).returning(jobs.c.id)


def archive_batch(
    *,
    done_older_than: float,
    dead_older_than: float | None,
    batch: int,
    now: Now = None,
) -> ReturningInsert[Any]:
    """Move up to ``batch`` finished rows from ``jobs`` to ``jobs_archive``, in one statement.

    ``WITH picked AS MATERIALIZED (SELECT id ... LIMIT n FOR UPDATE SKIP LOCKED),
    moved AS (DELETE ... RETURNING *) INSERT INTO jobs_archive SELECT ... FROM moved``.
    Done rows finished before ``now - done_older_than`` go; dead and cancelled rows only
    when ``dead_older_than`` is given. Each branch is a range on jobs_finished_idx.
    """
    done = sa.and_(
        jobs.c.status == _status(JobStatus.DONE),
        jobs.c.finished_at < _ago(sa.bindparam("done_age", done_older_than, sa.Float), now),
    )
    which: sa.ColumnElement[bool] = done
    if dead_older_than is not None:
        failed = sa.and_(
            jobs.c.status.in_([_status(JobStatus.DEAD), _status(JobStatus.CANCELLED)]),
            jobs.c.finished_at < _ago(sa.bindparam("dead_age", dead_older_than, sa.Float), now),
        )
        which = sa.or_(done, failed)
    picked = (
        sa.select(jobs.c.id)
        .where(which)
        .limit(sa.bindparam("batch", batch, sa.Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    moved = sa.delete(jobs).where(jobs.c.id == picked.c.id).returning(*jobs.c).cte("moved")
    names = [c.name for c in jobs.c]
    archive = models.jobs_archive
    return (
        sa.insert(archive)
        .from_select(
            [*names, archive.c.archived_at.name],
            sa.select(*(moved.c[n] for n in names), _now(now)),
        )
        .add_cte(moved)
        .returning(archive.c.id)
    )


def prune_batch(*, older_than: float, batch: int, now: Now = None) -> ReturningDelete[Any]:
    """Delete up to ``batch`` archived jobs finished before ``now - older_than``."""
    archive = models.jobs_archive
    picked = (
        sa.select(archive.c.id)
        .where(archive.c.finished_at < _ago(sa.bindparam("age", older_than, sa.Float), now))
        .limit(sa.bindparam("batch", batch, sa.Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    return sa.delete(archive).where(archive.c.id == picked.c.id).returning(archive.c.id)


def try_advisory_lock(key: int) -> sa.Select[Any]:
    """``pg_try_advisory_lock(key)``: true if this session now holds the lock."""
    return sa.select(sa.func.pg_try_advisory_lock(sa.bindparam("key", key, sa.BigInteger)))


def advisory_unlock(key: int) -> sa.Select[Any]:
    return sa.select(sa.func.pg_advisory_unlock(sa.bindparam("key", key, sa.BigInteger)))


def idle_flag(*, raise_: bool) -> sa.Select[Any]:
    """Raise (take, shared) or lower the advisory lock waiting workers hold (rev. 0003).

    Shared, so any number of workers can wait at once; the insert trigger tries the key
    exclusively to learn whether anyone waits (see migrations.IDLE_LOCK_KEY).
    """
    key = sa.bindparam("key", migrations.IDLE_LOCK_KEY, sa.BigInteger)
    if raise_:
        return sa.select(sa.func.pg_advisory_lock_shared(key))
    return sa.select(sa.func.pg_advisory_unlock_shared(key))


def archive_probe() -> sa.Select[Any]:
    """Reads every column of jobs_archive; fails if revision 0002 is missing."""
    return sa.select(*models.jobs_archive.c).limit(0)


# --- schema ----------------------------------------------------------------------------


def schema_probe() -> sa.Select[Any]:
    """Reads every column the worker uses; fails if the table is missing or outdated."""
    return sa.select(*jobs.c).limit(0)


def status_values() -> sa.TextClause:
    return sa.text("SELECT unnest(enum_range(NULL::job_status))::text")


# --- test helpers ----------------------------------------------------------------------


def queues_of_kinds(kinds: Sequence[str]) -> sa.Select[Any]:
    """Distinct queues holding live jobs of ``kinds`` (sqla_jobs.testing.drain)."""
    return (
        sa.select(jobs.c.queue)
        .where(
            jobs.c.kind == sa.any_(_text_array(kinds)),
            jobs.c.status.in_([_status(JobStatus.QUEUED), _status(JobStatus.RUNNING)]),
        )
        .distinct()
    )


def pending_count(kinds: Sequence[str], queues: Sequence[str]) -> sa.Select[Any]:
    """Jobs of ``kinds`` in ``queues`` that are ready now or running."""
    ready = sa.and_(jobs.c.status == _status(JobStatus.QUEUED), jobs.c.run_at <= sa.func.now())
    return sa.select(sa.func.count()).where(
        jobs.c.kind == sa.any_(_text_array(kinds)),
        jobs.c.queue == sa.any_(_text_array(queues)),
        sa.or_(ready, jobs.c.status == _status(JobStatus.RUNNING)),
    )
