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
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_jobs import models, validation
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


def insert_jobs_unnest(now: Now = None) -> sa.Insert:
    """Insert many jobs in one statement from parallel arrays (one round trip per batch).

    Bind parameters (equal-length lists; ``None`` elements take the defaults):
    ``kinds``, ``payloads`` (JSON text), ``queues``, ``priorities``, ``max_attempts``,
    ``keys``, ``run_ats``, ``delays``.
    """
    arrays: dict[str, tuple[str, Any]] = {
        "kind": ("kinds", sa.Text),
        "payload": ("payloads", sa.Text),
        "queue": ("queues", sa.Text),
        "priority": ("priorities", sa.SmallInteger),
        "max_attempts": ("max_attempts", sa.Integer),
        "idempotency_key": ("keys", sa.Text),
        "run_at": ("run_ats", sa.DateTime(timezone=True)),
        "delay": ("delays", sa.Float),
    }
    rows = (
        sa.func.unnest(*(sa.bindparam(p, type_=ARRAY(t)) for p, t in arrays.values()))
        .table_valued(*arrays)
        .render_derived(name="new_jobs")
    )
    c = rows.c
    source = sa.select(
        c.kind,
        sa.cast(c.payload, JSONB),
        sa.func.coalesce(c.queue, models.DEFAULT_QUEUE),
        sa.func.coalesce(c.priority, models.DEFAULT_PRIORITY),
        sa.func.coalesce(c.max_attempts, models.DEFAULT_MAX_ATTEMPTS),
        c.idempotency_key,
        sa.func.coalesce(c.run_at, _now(now) + _seconds(sa.func.coalesce(c.delay, 0.0))),
    )
    return (
        pg_insert(jobs)
        .from_select(
            ["kind", "payload", "queue", "priority", "max_attempts", "idempotency_key", "run_at"],
            source,
        )
        .on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])
        .returning(jobs.c.id)
    )


# --- claim -----------------------------------------------------------------------------


def claim(
    *,
    worker: str,
    lock_seconds: float,
    queues: Sequence[str],
    kinds: Sequence[str],
    limit: int,
    now: Now = None,
) -> sa.Update:
    """Claim up to ``limit`` ready jobs of the given queues and kinds, in one statement.

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
        .limit(limit)
        .with_for_update(skip_locked=True)
        .lateral("ready")
    )
    picked = (
        sa.select(per_level.c.id)
        .select_from(levels)
        .join(per_level, sa.true())
        .limit(limit)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    return (
        sa.update(jobs)
        .where(jobs.c.id == picked.c.id)
        .values(
            status=_status(JobStatus.RUNNING),
            locked_until=_now(now) + _seconds(sa.bindparam("lock_seconds", lock_seconds, sa.Float)),
            attempts=jobs.c.attempts + 1,
            worker=sa.bindparam("worker", worker, sa.Text),
        )
        .returning(*_RETURNING)
    )


# --- outcomes (all fenced) -------------------------------------------------------------


def _fence(worker: str, leases: Sequence[tuple[int, int]]) -> list[sa.ColumnElement[bool]]:
    """Conditions (over ``unnest(ids, attempts) AS fence``) that make a claim still ours."""
    fence = (
        sa.func.unnest(
            sa.literal([job_id for job_id, _ in leases], ARRAY(sa.BigInteger)),
            sa.literal([attempt for _, attempt in leases], ARRAY(sa.Integer)),
        )
        .table_valued("id", "attempt")
        .render_derived(name="fence")
    )
    conditions = [
        jobs.c.id == fence.c.id,
        jobs.c.attempts == fence.c.attempt,
        jobs.c.status == _status(JobStatus.RUNNING),
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
