"""The worker's statements: claim, and the fenced outcomes of a claim.

Fencing: every statement that finishes, retries, extends or releases a claimed job
matches ``status = 'running' AND worker = :worker AND attempts = :attempt``. A worker
whose lease expired and whose job was taken over updates zero rows instead of
overwriting the new run (the seed finished jobs by id alone).

Attempt history (revision 0011): the claim writes ``attempted_at`` (it writes the row
anyway); every statement that ends an attempt other than done (a failure, a snooze, a
cancel, an expired lease) appends one object to ``errors`` (``_attempt_ended``).
The done-marks, the hottest statements, write neither: ``finished_at`` says when the
done attempt ended.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, aggregate_order_by

from sqla_jobs import models, validation
from sqla_jobs.models import JobStatus, jobs
from sqla_jobs.sql import _common, control
from sqla_jobs.sql._common import Now

#: Most characters of one attempt's error kept in ``errors``: its beginning, where the
#: worker writes the exception before its traceback (``last_error`` keeps the latest
#: error in full).
ERROR_CHARS = 2000
#: Most attempts kept in ``errors``, the latest (a job retried by hand again and again).
MAX_ERRORS = 50
#: What ended an attempt, as ``errors[].outcome`` says.
FAILED, SNOOZED, LEASE_EXPIRED, CANCELLED = "failed", "snoozed", "lease expired", "cancelled"


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
    locked_queues: Sequence[str] = (),
    locked_kinds: Sequence[str] = (),
    room: sa.ColumnElement[Any] | None = None,
    max_attempts: Mapping[str, int] | None = None,
) -> sa.Select[Any]:
    """Claim up to ``limit`` ready jobs of the given queues and kinds, in one statement.

    A claimed job enqueued without ``max_attempts`` (NULL, revision 0008) gets its
    handler's, from ``max_attempts`` (kind -> the handler's ``max_attempts``, bound as
    the ``handler_max_attempts`` parameter), else 8: every running or finished row holds
    a number, so the failure, rescue and archive statements never see NULL.

    Paused queues and kinds are left out by the statement itself, and so are limited
    ones (revision 0006) unless named in ``locked_queues`` / ``locked_kinds``: the
    caller holds their advisory locks and sized ``limit`` to the room they have left,
    or passes ``room`` (``sqla_jobs.sql.control.room``), which the statement
    computes itself and claims at most (see ``sqla_jobs.sql.control``).

    Each row ends with ``waited``: seconds from the job's ``run_at`` to this claim, both
    database times (its time in the queue for this attempt, on the process span), and
    ``run_at`` (where the worker's next walk of that priority may start, see
    ``_floor``).

    Rows come back in claim order (priority, run_at, id): ``UPDATE ... RETURNING`` alone
    returns them in whatever order the join produced, and a worker that buffers a batch
    runs it in the order returned.

    ``ORDER BY priority, run_at`` is walked one priority at a time: a LATERAL subquery
    per priority level (0-9) is an index range scan on ``jobs_claim_idx`` bounded by
    ``run_at <= statement_timestamp()``, so jobs scheduled in the future are never read (a single
    ``ORDER BY priority, run_at`` scan would walk every future row of a priority before
    reaching the next one). The outer LIMIT stops the nested loop as soon as enough rows
    are locked, so empty or unneeded levels cost one index probe or nothing.

    Bound ``max_priority`` (default 9, every level) to claim only jobs at least that
    urgent: a worker whose buffer is full claims past it only jobs more urgent than any
    it holds. The bound filters the ten levels; it is not ``generate_series``'s upper
    end: with a parameter there, the generic plan guesses 1,000 levels, its cost never
    beats the custom plans', and PostgreSQL planned the prepared claim again on every
    execution (``pg_prepared_statements``: no generic plan in hundreds; 0.35 ms of the
    claim's 0.7 ms round trip, empty or with a job, on the benchmark machine).

    The candidate set is a MATERIALIZED CTE: as an ``IN (subquery)`` the planner may
    re-run the SKIP LOCKED subquery and lock more rows than it updates.

    The transaction that claims jobs commits without waiting for its WAL flush: the
    statement sets ``synchronous_commit`` off for its own transaction
    (``set_config(..., true)``, as ``SET LOCAL``), so a claim sent alone in autocommit
    mode is one round trip with nothing else to send (a separate ``SET LOCAL`` needs a
    transaction block: ``BEGIN``, the claim, ``COMMIT``). A claim that a server crash
    loses puts its jobs back as queued, attempt unspent, as the lease's expiry would
    after any crash; the next synchronous commit (a done-mark, any other
    transaction's) flushes it. What it saves is on the path from a notification to the
    handler: the fsync of the claim's commit (0.3 ms at the median on the benchmark
    machine, several ms when others write). When nothing is claimed nothing is written,
    and there is no commit to wait for.
    """
    # Claims only jobs at least this urgent: a worker whose buffer is full looks for jobs
    # more urgent than any it holds (see the dispatcher's busy look).
    levels = _common.priority_levels()
    max_priority = sa.bindparam("max_priority", validation.MAX_PRIORITY, sa.Integer)
    per_level = (
        sa.select(jobs.c.id)
        .where(
            jobs.c.status == _common.status(JobStatus.QUEUED),
            jobs.c.priority == levels.c.level,
            jobs.c.run_at >= _floor(levels.c.level),
            jobs.c.run_at <= _common.clock(now),
            jobs.c.queue
            == sa.any_(control.claimable(control.QUEUE, queues, locked_queues, "queues")),
            jobs.c.kind == sa.any_(control.claimable(control.KIND, kinds, locked_kinds, "kinds")),
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
        .where(levels.c.level <= max_priority)
        # The room, when given, only here: the nested loop stops pulling (and locking)
        # rows at this LIMIT, and it is computed once (an uncorrelated InitPlan).
        .limit(_limit(limit) if room is None else room)
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
            status=_common.status(JobStatus.RUNNING),
            locked_until=_common.clock(now)
            + _common.seconds(sa.bindparam("lock_seconds", lock_seconds, sa.Float)),
            attempts=jobs.c.attempts + 1,
            worker=sa.bindparam("worker", worker, sa.Text),
            max_attempts=_resolved_max_attempts(max_attempts or {}),
            attempted_at=_common.clock(now),
        )
        .returning(
            *_common.CLAIMED_COLUMNS,
            jobs.c.run_at,
            # How long the job waited to run, from the database's clock at both ends
            # (run_at, and the claim's time): the worker's clock is never compared.
            sa.cast(_common.epoch(_common.clock(now) - jobs.c.run_at), sa.Float).label("waited"),
        )
        .cte("claimed")
    )
    # An uncorrelated scalar subquery: an InitPlan, run once, whatever the plan.
    no_flush = sa.select(
        sa.func.set_config(
            sa.literal_column("'synchronous_commit'"), sa.literal_column("'off'"), sa.true()
        )
    ).scalar_subquery()
    return (
        sa.select(
            *(claimed.c[c.name] for c in _common.CLAIMED_COLUMNS),
            claimed.c.waited,
            claimed.c.run_at,
        )
        .where(no_flush.is_not(None))
        .order_by(claimed.c.priority, claimed.c.run_at, claimed.c.id)
    )


def _floor(level: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """Where the claim's walk of ``level`` starts in ``run_at``: ``floors[level]``, bound
    at execution (``{"floors": [...]}``, one ``run_at`` or NULL per level from
    ``validation.MIN_PRIORITY`` up; NULL or no array: from the start).

    While an application's transaction pins the MVCC horizon, the entries of the jobs
    already claimed stay at the head of jobs_claim_idx (their heap rows are dead, but
    not to every snapshot, so they cannot be marked dead in the index) and a walk from
    the start reads past all of them: 238 buffers instead of 77 after 12,000 jobs, more
    with each job run. A worker that claimed jobs up to some ``run_at`` starts its next
    walk just below it (sqla_jobs.worker._dispatcher); a job left below the floor is
    found by the full walk it makes at least every ``FULL_CLAIM_SECONDS``. An index
    condition: the descent lands on the floor.
    """
    array = ARRAY(sa.DateTime(timezone=True))
    # Parenthesized: PostgreSQL subscripts ``(expression)[i]``, not ``CAST(...)[i]``.
    floors = sa.type_coerce(sa.Grouping(sa.cast(sa.bindparam("floors", None, array), array)), array)
    one = sa.literal_column(str(1 - validation.MIN_PRIORITY), sa.Integer)
    return sa.func.coalesce(
        floors[level + one],
        sa.literal_column("'-infinity'::timestamptz", sa.DateTime(timezone=True)),
    )


def next_due(*, queues: Sequence[str], kinds: Sequence[str], now: Now = None) -> sa.Select[Any]:
    """Seconds until the next queued job of ``queues`` and ``kinds`` comes due (NULL if
    none is scheduled): what an idle worker sets its wake-up timer by (issue #23).

    Walked as the claim walks ``jobs_claim_idx``: per priority level, the first row
    after now in ``run_at`` order (an index range scan stopped at its first match),
    then the earliest of the ten. Paused and limited scopes are not left out: waking
    for one costs a claim that finds nothing.
    """
    levels = _common.priority_levels()
    first = (
        sa.select(jobs.c.run_at)
        .where(
            jobs.c.status == _common.status(JobStatus.QUEUED),
            jobs.c.priority == levels.c.level,
            jobs.c.run_at > _common.clock(now),
            jobs.c.queue == sa.any_(sa.bindparam("queues", list(queues), ARRAY(sa.Text))),
            jobs.c.kind == sa.any_(sa.bindparam("kinds", list(kinds), ARRAY(sa.Text))),
        )
        .order_by(jobs.c.run_at)
        .limit(1)
        .lateral("next")
    )
    return sa.select(_common.epoch(sa.func.min(first.c.run_at) - _common.clock(now))).select_from(
        levels.join(first, sa.true())
    )


def _resolved_max_attempts(by_kind: Mapping[str, int]) -> sa.ColumnElement[Any]:
    """``coalesce(max_attempts, the handler's, 8)`` for a row being claimed.

    The handlers' values are one JSON object parameter, so the claim's text (and its
    prepared plan) does not depend on them. coalesce() evaluates an argument only when
    those before it are NULL, and the object is parsed once per statement (an
    uncorrelated subquery, an InitPlan): a job enqueued with its own max_attempts costs
    nothing more.
    """
    handlers = sa.select(
        sa.cast(
            sa.bindparam(
                "handler_max_attempts", json.dumps(dict(by_kind), sort_keys=True), sa.Text
            ),
            JSONB,
        )
    ).scalar_subquery()
    return sa.func.coalesce(
        jobs.c.max_attempts,
        sa.cast(handlers.op("->>")(jobs.c.kind), sa.Integer),
        sa.literal_column(str(models.DEFAULT_MAX_ATTEMPTS), sa.Integer),
    )


def _text(value: str) -> sa.ColumnElement[str]:
    """A constant written into the statement's text (no parameter: a fixed text)."""
    return sa.literal_column("'" + value.replace("'", "''") + "'", sa.Text)


def _attempt_ended(
    outcome: str, error: sa.ColumnElement[Any], then: sa.ColumnElement[Any], now: Now
) -> sa.ColumnElement[Any]:
    """``errors`` with one more object: the attempt this UPDATE ends (``outcome``), the
    status it leaves the job in (``then``) and its ``error``, cut to its first
    ``ERROR_CHARS`` characters; the latest ``MAX_ERRORS`` objects are kept.

    In an UPDATE's SET every column reads the row as it was: ``attempts``, ``worker``
    and ``attempted_at`` are those of the attempt that ends, whatever else is set.
    """
    short = sa.case(
        (sa.func.char_length(error) <= sa.literal_column(str(ERROR_CHARS)), error),
        else_=sa.func.concat(
            sa.func.left(error, sa.literal_column(str(ERROR_CHARS - 1))), _text("…")
        ),
    )
    entry = sa.func.jsonb_build_object(
        _text("attempt"),
        jobs.c.attempts,
        _text("worker"),
        jobs.c.worker,
        _text("claimed_at"),
        jobs.c.attempted_at,
        _text("at"),
        _common.clock(now),
        _text("outcome"),
        _text(outcome),
        _text("then"),
        sa.cast(then, sa.Text),
        _text("error"),
        short,
    )
    added = sa.func.coalesce(jobs.c.errors, sa.literal_column("'[]'::jsonb", JSONB)).op("||")(
        sa.func.jsonb_build_array(entry)
    )
    keep: sa.ColumnElement[Any] = sa.literal_column(
        f"'$[last - {MAX_ERRORS - 1} to last]'::jsonpath"
    )
    return sa.func.jsonb_path_query_array(added, keep, type_=JSONB)


def _fence(worker: str, leases: Sequence[tuple[int, int]]) -> list[sa.ColumnElement[bool]]:
    """Conditions that make a claim in ``leases`` (``(job_id, attempt)`` pairs) still ours.

    No join. A join of ``jobs`` with ``unnest(ids, attempts)`` was planned by the
    statistics, and a queue's statistics are stale by nature (taken after a bulk load or
    at a quiet moment, when nothing ran): the planner expected one running row, chose a
    nested loop and re-scanned the unnested leases for every job, 1,000 x 1,000 rows per
    batch (150-300 ms). Here the only access path is the primary key (``id =
    ANY(ids)``), and each row found checks its attempt by binary search:

    * the leases sorted by ``(id, attempt)`` into two arrays, once per statement (a
      MATERIALIZED CTE read by InitPlans) whatever the plan;
    * ``width_bucket(x, sorted)`` is the number of elements ``<= x``, found by binary
      search, so the leases of job ``id`` are the slice
      ``width_bucket(id - 1) + 1 .. width_bucket(id)`` (usually one element);
    * ``attempts = ANY(that slice of the sorted attempts)``.

    O(n log n) for n leases in the custom and the generic plan alike.
    """
    # Named parameters, so a caller that compiles a fenced statement once can pass other
    # leases per execution (``{"fence_ids": [...], "fence_attempts": [...]}``).
    ids = sa.bindparam("fence_ids", [job_id for job_id, _ in leases], ARRAY(sa.BigInteger))
    attempts = sa.bindparam("fence_attempts", [attempt for _, attempt in leases], ARRAY(sa.Integer))
    fence = sa.func.unnest(ids, attempts).table_valued("id", "attempt").render_derived(name="lease")
    order = (fence.c.id, fence.c.attempt)
    # Sorted once per statement (a MATERIALIZED CTE, read by InitPlans), whatever the plan.
    fence_sorted = (
        sa.select(
            sa.func.array_agg(
                aggregate_order_by(fence.c.id, *order), type_=ARRAY(sa.BigInteger)
            ).label("ids"),
            sa.func.array_agg(
                aggregate_order_by(fence.c.attempt, *order), type_=ARRAY(sa.Integer)
            ).label("attempts"),
        )
        .cte("fence")
        .prefix_with("MATERIALIZED")
    )
    sorted_ids = sa.select(fence_sorted.c.ids).scalar_subquery()
    # ``(SELECT ...)[a:b]``: PostgreSQL subscripts a parenthesized subquery, not a CAST.
    sorted_attempts = sa.select(fence_sorted.c.attempts).scalar_subquery()
    one = sa.literal_column("1", sa.Integer)
    first = sa.func.width_bucket(jobs.c.id - one, sorted_ids) + one
    last = sa.func.width_bucket(jobs.c.id, sorted_ids)
    return [
        jobs.c.id == sa.any_(ids),
        jobs.c.attempts == sa.any_(sorted_attempts[first:last]),
        _common.still_running(),
        jobs.c.worker == sa.bindparam("fence_worker", worker, sa.Text),
    ]


def complete(*, worker: str, leases: Sequence[tuple[int, int]], now: Now = None) -> sa.Update:
    """Mark the given ``(job_id, attempt)`` claims done; RETURNING the ids that were ours."""
    conditions = _fence(worker, leases)
    return (
        sa.update(jobs)
        .where(*conditions)
        .values(
            status=_common.status(JobStatus.DONE), finished_at=_common.clock(now), locked_until=None
        )
        .returning(jobs.c.id)
    )


def complete_one(*, worker: str, job_id: int, attempt: int, now: Now = None) -> sa.Update:
    """Mark one ``(job_id, attempt)`` claim done, in the handler's transaction.

    The same fence as ``complete``, with scalar parameters: the worker runs this once
    per job whose handler wrote, and adapting the lease arrays cost more client time than
    the rest of the statement. One row updated means the claim was ours; zero, lost. Its
    generic plan (it may be prepared) is a primary-key probe.
    """
    return (
        sa.update(jobs)
        .where(
            jobs.c.id == sa.bindparam("job_id", job_id, sa.BigInteger),
            jobs.c.attempts == sa.bindparam("attempt", attempt, sa.Integer),
            _common.still_running(),
            jobs.c.worker == sa.bindparam("fence_worker", worker, sa.Text),
        )
        .values(
            status=_common.status(JobStatus.DONE),
            finished_at=_common.clock(now),
            locked_until=sa.null(),
            # The handler's return value as JSON text (validation.dump_result), or NULL.
            result=sa.cast(sa.bindparam("result", None, sa.Text), JSONB),
        )
    )


#: The text a lost claim's ``complete_one_before_commit`` fails with (inside the
#: server's "invalid input syntax for type integer" error): the worker reads it as the
#: claim lost, any other error as the outcome unknown.
CLAIM_LOST = "sqla_jobs: claim lost"


def complete_one_before_commit(
    *, worker: str, job_id: int, attempt: int, now: Now = None
) -> sa.Select[Any]:
    """``complete_one`` that fails when its fence matches no row, so that it can go
    in the same round trip as the COMMIT after it (the worker pipelines the two).

    Sent ahead of the COMMIT, the done-mark's row count comes back only after the
    COMMIT has run: a lost claim must stop the commit of the handler's writes by
    itself. It does: zero rows makes the statement cast ``'sqla_jobs: claim lost'`` to
    an integer, an error, and a statement that fails aborts the transaction, so the
    COMMIT queued behind it is not run (the worker then rolls back and logs the lost
    claim). The failing branch depends on the row count, so the planner cannot fold it
    into a constant and fail every time. One round trip instead of two for every
    handler that wrote (a limited kind's slot waits for that commit, issue #23).
    """
    done = (
        complete_one(worker=worker, job_id=job_id, attempt=attempt, now=now)
        .returning(jobs.c.id)
        .cte("done")
    )
    ours = sa.func.count()
    return sa.select(
        sa.cast(
            sa.case(
                (ours == sa.literal_column("1"), sa.literal_column("'1'", sa.Text)),
                else_=sa.func.concat(_text(CLAIM_LOST + " "), ours),
            ),
            sa.Integer,
        ).label("done")
    ).select_from(done)


def record_failure(
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
    ends = _ends_now()
    error_text = sa.bindparam("error", error, sa.Text)
    return (
        sa.update(jobs)
        .where(*conditions)
        .values(
            status=_failed_status(),
            errors=_attempt_ended(FAILED, error_text, _failed_status(), now),
            # A job that ends here (dead, or cancelled by an operator) keeps the run_at
            # of its last attempt: no retry is coming.
            run_at=sa.case(
                (ends, sa.func.least(jobs.c.run_at, _common.clock(now))),
                else_=_common.clock(now)
                + _common.seconds(sa.bindparam("delay", delay_seconds, sa.Float)),
            ),
            locked_until=None,
            last_error=error_text,
            finished_at=sa.case((ends, _common.clock(now)), else_=None),
        )
        .returning(jobs.c.id, jobs.c.status)
    )


def _failed_status() -> sa.ColumnElement[Any]:
    """After a failed attempt: ``cancelled`` if an operator asked (revision 0005), ``dead``
    at the last attempt, else ``queued``."""
    return sa.case(
        (jobs.c.cancel_requested_at.is_not(None), _common.status(JobStatus.CANCELLED)),
        (jobs.c.attempts >= jobs.c.max_attempts, _common.status(JobStatus.DEAD)),
        else_=_common.status(JobStatus.QUEUED),
    )


def _ends_now() -> sa.ColumnElement[bool]:
    return sa.or_(jobs.c.cancel_requested_at.is_not(None), jobs.c.attempts >= jobs.c.max_attempts)


def snooze(
    *,
    worker: str,
    job_id: int,
    attempt: int,
    delay_seconds: float,
    note: str,
    now: Now = None,
) -> sa.Update:
    """The handler raised Snooze: queued again in ``delay_seconds``, the attempt not spent.

    ``snoozes`` counts up (the worker bounds it); ``note`` goes to ``last_error``. A job an
    operator cancelled meanwhile ends ``cancelled``. RETURNING ``id, status``; no row:
    the claim was lost.
    """
    conditions = _fence(worker, [(job_id, attempt)])
    cancelled = jobs.c.cancel_requested_at.is_not(None)
    status = sa.case(
        (cancelled, _common.status(JobStatus.CANCELLED)),
        else_=_common.status(JobStatus.QUEUED),
    )
    note_text = sa.bindparam("error", note, sa.Text)
    return (
        sa.update(jobs)
        .where(*conditions)
        .values(
            status=status,
            # The snoozed attempt is not spent: the next claim has its number again.
            errors=_attempt_ended(SNOOZED, note_text, status, now),
            attempts=sa.case((cancelled, jobs.c.attempts), else_=jobs.c.attempts - 1),
            snoozes=jobs.c.snoozes + 1,
            run_at=_common.clock(now)
            + _common.seconds(sa.bindparam("delay", delay_seconds, sa.Float)),
            locked_until=None,
            worker=sa.case((cancelled, jobs.c.worker), else_=None),
            last_error=note_text,
            finished_at=sa.case((cancelled, _common.clock(now)), else_=None),
        )
        .returning(jobs.c.id, jobs.c.status)
    )


def cancel_running(
    *, worker: str, job_id: int, attempt: int, reason: str, now: Now = None
) -> sa.Update:
    """End a running claim ``cancelled``, not retried (Discard, or an operator's cancel).

    RETURNING ``id, status``; no row: the claim was lost (or the job already finished).
    """
    conditions = _fence(worker, [(job_id, attempt)])
    reason_text = sa.bindparam("error", reason, sa.Text)
    cancelled = _common.status(JobStatus.CANCELLED)
    return (
        sa.update(jobs)
        .where(*conditions)
        .values(
            status=cancelled,
            errors=_attempt_ended(CANCELLED, reason_text, cancelled, now),
            locked_until=None,
            last_error=reason_text,
            finished_at=_common.clock(now),
        )
        .returning(jobs.c.id, jobs.c.status)
    )


def statement_timeout(milliseconds: int) -> sa.Select[Any]:
    """``SET LOCAL statement_timeout`` as a function call (it takes a bound value).

    Run at the start of a handler's transaction that has a deadline: the handler's own
    statements are then cancelled when its time is up (revision 0005 timeouts).
    """
    return sa.select(
        sa.func.set_config(
            sa.literal_column("'statement_timeout'"),
            sa.cast(sa.bindparam("ms", milliseconds, sa.Integer), sa.Text),
            sa.true(),
        )
    )


def terminate_backend(pid: int) -> sa.Select[Any]:
    """End a killed child's backend (process isolation): its transaction rolls back now,
    not when its running statement ends. A role may terminate its own backends."""
    return sa.select(sa.func.pg_terminate_backend(sa.bindparam("pid", pid, sa.Integer)))


def reset_statement_timeout() -> sa.TextClause:
    """Back to the connection's own ``statement_timeout`` (the one it started with) for
    the rest of the transaction: the worker's done-mark must not be cancelled by the
    handler's deadline."""
    return sa.text("RESET statement_timeout")


def heartbeat(
    *, worker: str, leases: Sequence[tuple[int, int]], lock_seconds: float, now: Now = None
) -> sa.Update:
    """Extend the leases still ours; RETURNING their ids and attempts (a missing lease is a
    lost claim) and whether an operator asked to cancel each."""
    conditions = _fence(worker, leases)
    return (
        sa.update(jobs)
        .where(*conditions)
        .values(
            locked_until=_common.clock(now)
            + _common.seconds(sa.bindparam("lock_seconds", lock_seconds, sa.Float))
        )
        # The cancel flag comes back with each renewal: the lease keeper tells a job's
        # handler to stop even if the cancel's NOTIFY was missed (revision 0005).
        .returning(
            jobs.c.id,
            jobs.c.attempts,
            jobs.c.cancel_requested_at.is_not(None).label("cancelling"),
        )
    )


def release(*, worker: str, leases: Sequence[tuple[int, int]]) -> sa.Update:
    """Give back claims whose handler never started (shutdown): queued again, attempt not spent."""
    conditions = _fence(worker, leases)
    cancelled = jobs.c.cancel_requested_at.is_not(None)
    return (
        sa.update(jobs)
        .where(*conditions)
        .values(
            # An operator cancelled it while it was buffered (revision 0005): it ends now.
            status=sa.case(
                (cancelled, _common.status(JobStatus.CANCELLED)),
                else_=_common.status(JobStatus.QUEUED),
            ),
            attempts=jobs.c.attempts - 1,
            locked_until=None,
            worker=None,
            # Claimed, never started: no attempt to show in the job's history.
            attempted_at=None,
            finished_at=sa.case((cancelled, _common.clock(None)), else_=None),
        )
        .returning(jobs.c.id)
    )


def index_scans_only() -> sa.Select[Any]:
    """``SET LOCAL enable_seqscan = off`` as a function call, run before
    ``rescue_expired`` in its transaction.

    No index holds the lease (revision 0018: a heartbeat is then a HOT update), so the
    rescuer finds expired leases among the running jobs of ``jobs_status_id_idx`` and
    tests each one's lease. The running jobs are few (the fleet's concurrency), but
    statistics taken while most rows were running (a bulk claim, a small table) make a
    sequential scan of the whole table look cheaper, and it would be re-read at every
    rescue. Off for this transaction only, the planner takes the index.
    """
    return sa.select(
        sa.func.set_config(
            sa.literal_column("'enable_seqscan'"), sa.literal_column("'off'"), sa.true()
        )
    )


def rescue_expired(*, limit: int = 1000, now: Now = None) -> sa.Update:
    """Requeue jobs whose lease expired (their worker died or stopped heartbeating).

    A job that had already used its last attempt goes dead instead: a poison job that
    kills its worker must not be handed to the next one forever; a job an operator asked
    to cancel goes ``cancelled``. This replaces the
    seed's ``OR (status = 'running' AND locked_until < now())`` claim branch.

    The running jobs are read from ``jobs_status_id_idx`` and their leases tested there
    (no index holds ``locked_until``, revision 0018); run ``index_scans_only`` first
    in the same transaction.
    """
    expired = (
        sa.select(jobs.c.id)
        .where(
            jobs.c.status == _common.status(JobStatus.RUNNING),
            jobs.c.locked_until < _common.clock(now),
        )
        .order_by(jobs.c.locked_until)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("expired")
        .prefix_with("MATERIALIZED")
    )
    message = sa.func.concat(
        "lease expired during attempt ",
        jobs.c.attempts,
        " of ",
        jobs.c.max_attempts,
        ": worker ",
        sa.func.coalesce(jobs.c.worker, "?"),
        " stopped heartbeating (killed, crashed or lost its connection)",
    )
    # The primary key probed with an array, as in claim(): a join with ``expired`` was
    # planned by the statistics, and could be a hash join over a scan of the table.
    expired_ids = sa.cast(
        sa.select(sa.func.array_agg(expired.c.id)).scalar_subquery(), ARRAY(sa.BigInteger)
    )
    return (
        sa.update(jobs)
        .where(jobs.c.id == sa.any_(expired_ids))
        .values(
            status=_failed_status(),
            errors=_attempt_ended(LEASE_EXPIRED, message, _failed_status(), now),
            run_at=_common.clock(now),
            locked_until=None,
            last_error=message,
            finished_at=sa.case((_ends_now(), _common.clock(now)), else_=None),
        )
        .returning(jobs.c.id, jobs.c.kind, jobs.c.status, jobs.c.attempts, jobs.c.worker)
    )
