"""Pieces every statement module shares: the clock, statuses, intervals, arrays.

Time always comes from the database unless a statement is given ``now``; the worker's
clock is never compared with a database timestamp. The database's time is the
statement's (``statement_timestamp()``), not the transaction's start (``now()``): a
done-mark, a retry or an enqueue inside a handler's (or an app's) long transaction
records when it happened, not when the transaction began. Both are STABLE within a
statement, so index conditions such as ``run_at <= statement_timestamp()`` stay index
conditions.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from sqla_jobs import models, validation
from sqla_jobs.models import JobStatus, jobs

Now = datetime | None
#: ``now`` as a value, or as a parameter given at execution (``{"taken_at": ...}`` for
#: ``TAKEN_AT``): a statement built with the parameter is built once and reused, its
#: SQLAlchemy cache key computed once (the dashboard's overview, several times a second).
At = datetime | sa.BindParameter[datetime] | None
#: The instant every figure of a stats read refers to, given at execution.
TAKEN_AT: sa.BindParameter[datetime] = sa.bindparam("taken_at", type_=sa.DateTime(timezone=True))


CLAIMED_COLUMNS = (
    jobs.c.id,
    jobs.c.kind,
    jobs.c.queue,
    jobs.c.payload,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.timeout,  # revision 0005
    jobs.c.snoozes,  # revision 0005
    jobs.c.priority,  # the buffer's order (sqla_jobs.worker._buffer)
    jobs.c.meta,  # revision 0013: the handler's job.meta and job.tags
    jobs.c.tags,
)


def clock(now: At) -> sa.ColumnElement[datetime]:
    """``now`` as a literal (or the parameter given), else the time of the statement that
    reads it."""
    if now is None:
        return sa.func.statement_timestamp(type_=sa.DateTime(timezone=True))
    if isinstance(now, sa.BindParameter):
        return now
    return sa.literal(now, sa.DateTime(timezone=True))


def seconds(value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """An interval of ``value`` seconds (a bound parameter or a column)."""
    return sa.literal_column("interval '1 second'", sa.Interval) * value


def status(status: JobStatus) -> sa.ColumnElement[Any]:
    # Statuses are written into the SQL text, not bound: a partial index
    # (WHERE status = 'queued') can only be used when the planner sees the constant,
    # and a generic plan of a prepared statement would not.
    return sa.literal_column(f"'{status.value}'::job_status", models.job_status)


def still_running() -> sa.ColumnElement[bool]:
    """``status = 'running'`` for the fences, in a form no partial index can answer.

    With the plain comparison the planner may read the running jobs of an index
    (jobs_lease_idx WHERE status = 'running' before revision 0018, jobs_status_id_idx)
    end to end and filter on id: a queue's statistics are always stale, the
    index often looks empty, and then its cost ties with the primary-key probe. That
    made every done-mark scan all running jobs (0.6 ms with 2,000 running instead of
    0.05 ms). Compared as text, the fence is checked on the row the primary key found.
    """
    return sa.cast(jobs.c.status, sa.Text) == sa.literal_column(f"'{JobStatus.RUNNING.value}'")


def text_array(values: Sequence[str]) -> sa.ColumnElement[Any]:
    # One array parameter instead of IN (...): the SQL text (and any prepared plan)
    # stays the same whatever the number of queues or kinds.
    return sa.literal(list(values), ARRAY(sa.Text))


def payload_param(name: str = "payload") -> sa.ColumnElement[Any]:
    # The payload arrives as JSON text already checked by validation.dump_payload;
    # casting text to jsonb avoids serialising it a second time.
    return sa.cast(sa.bindparam(name, type_=sa.Text), JSONB)


def ago(amount: float | sa.ColumnElement[Any], now: At = None) -> sa.ColumnElement[datetime]:
    """``now - amount`` seconds."""
    value = amount if isinstance(amount, sa.ColumnElement) else sa.literal(float(amount))
    return clock(now) - seconds(value)


def epoch(value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    return sa.func.extract("epoch", value)


def priority_levels() -> Any:
    """``levels(level)``: one row per priority, most urgent first. A statement joined to
    it reads jobs_claim_idx one priority's ``run_at`` range at a time, as a claim does,
    instead of sorting the rows of every priority (the claim, the next due time, the
    unserved-jobs look). Both ends are constants, so a prepared statement's generic plan
    counts ten levels (see ``lease.claim``)."""
    return (
        sa.func.generate_series(
            sa.literal_column(str(validation.MIN_PRIORITY)),
            sa.literal_column(str(validation.MAX_PRIORITY)),
        )
        .table_valued("level")
        .render_derived(name="levels")
    )


def fresh_attempt(now: At) -> dict[str, Any]:
    """The columns of a job put back to run again from scratch (an operator's retry, a
    workflow step retried or reopened): no attempt, no lease, no finish, ready at ``now``."""
    return {
        "attempts": 0,
        "run_at": clock(now),
        "locked_until": None,
        "worker": None,
        "finished_at": None,
        "cancel_requested_at": None,
        "snoozes": 0,
    }
