"""Operators' statements (``sqla_jobs.ops``): list, show, retry, cancel, delete,
archive, prune; and the look-ups of ``sqla_jobs.testing``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert

from sqla_jobs import models
from sqla_jobs.models import JobStatus, jobs
from sqla_jobs.sql import _common, locks, workflows
from sqla_jobs.sql._common import Now

#: ``list_jobs(payload_scan=...)``: the ids near the cursor, or every match.
NEAR = "near"
MATCHES = "matches"
#: How many ids after the cursor the first step of a payload filter reads.
PAYLOAD_WINDOW = 5_000


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
        conditions.append(jobs.c.status.in_([_common.status(s) for s in statuses]))
    if kind is not None:
        conditions.append(jobs.c.kind == sa.bindparam("kind", kind, sa.Text))
    if queue is not None:
        conditions.append(jobs.c.queue == sa.bindparam("queue", queue, sa.Text))
    if older_than is not None:
        age = sa.bindparam("older_than", older_than, sa.Float)
        conditions.append(jobs.c.created_at < _common.ago(age, now))
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
    key: str | None = None,
    min_id: int | None = None,
    max_id: int | None = None,
    newer_than: float | None = None,
    payload: str | None = None,
    newest_first: bool = False,
    payload_scan: str = NEAR,
    tags: Sequence[str] | None = None,
    meta: str | None = None,
    age_scan: str = NEAR,
    workflow: Any = None,
) -> sa.Select[Any]:
    """One page of jobs in id order; the next page starts after the last id (keyset).

    With ``newest_first`` the order is descending and ``after_id`` means "ids below it"
    (the next page of a newest-first listing). ``key`` is the idempotency key (its unique
    index), ``min_id``/``max_id`` an inclusive range on the primary key, ``newer_than``
    the age bound opposite ``older_than``, and ``payload`` JSON text the payload must
    contain (``payload @> :payload_match``); ``meta`` likewise for the metadata (``meta @>
    :meta_match``) and ``tags`` the tags a job must all have (``tags @> :tags``).

    A page reads one index in its order and stops at ``limit`` rows (revision 0010):
    the first of kind, queue and a single status given leads, on its ``(column, id)``
    index; otherwise the primary key. A payload filter without a leading one is asked
    in two steps (:func:`sqla_jobs.ops.list_jobs`), and so are ``meta`` and ``tags``
    (revision 0013): ``payload_scan=NEAR`` reads the ``PAYLOAD_WINDOW`` ids after the
    cursor on the primary key (a common value fills the page there); if that is not a
    page, ``payload_scan=MATCHES`` reads every match from the GIN index
    (``jobs_payload_idx``, ``jobs_meta_idx``, ``jobs_tags_idx``) and sorts them (a rare
    value has few; the values and the cursor are kept out of the planner's estimates
    there, see :func:`_hidden`).
    The age filters walk the primary key and test ``created_at`` (it mostly follows
    ``id``). ``newer_than`` without a leading filter or a payload is asked in two steps
    too (:func:`age_in_two_steps`): ``age_scan=NEAR`` the window after the cursor; then
    ``age_scan=MATCHES`` walks from the lowest id created since the bound
    (:func:`_lowest_id_since`, revision 0012) rather than through every older job.

    ``workflow`` (a workflow id, #26) leads whatever else is given: a workflow's steps
    are few next to the table, read from ``jobs_workflow_id_idx`` (revision 0014) and
    sorted; the order is ``id + 0`` (so no walk of the primary key can yield it) and no
    other filter is asked in two steps.
    """
    if workflow is not None:
        return _workflow_page(
            statuses=statuses,
            kind=kind,
            queue=queue,
            older_than=older_than,
            limit=limit,
            after_id=after_id,
            now=now,
            key=key,
            min_id=min_id,
            max_id=max_id,
            newer_than=newer_than,
            payload=payload,
            newest_first=newest_first,
            tags=tags,
            meta=meta,
            workflow=workflow,
        )
    lead, lead_condition = _leading_filter(statuses, kind, queue)
    conditions = _job_filters(
        statuses=None if lead is jobs.c.status else statuses,
        kind=None if lead is jobs.c.kind else kind,
        queue=None if lead is jobs.c.queue else queue,
        older_than=older_than,
        now=now,
    )
    if lead_condition is not None:
        conditions.append(lead_condition)
    if key is not None:
        conditions.append(jobs.c.idempotency_key == sa.bindparam("key", key, sa.Text))
    if min_id is not None:
        conditions.append(jobs.c.id >= sa.bindparam("min_id", min_id, sa.BigInteger))
    if max_id is not None:
        conditions.append(jobs.c.id <= sa.bindparam("max_id", max_id, sa.BigInteger))
    if newer_than is not None:
        age = sa.bindparam("newer_than", newer_than, sa.Float)
        conditions.append(jobs.c.created_at >= _common.ago(age, now))
        if age_in_two_steps(statuses, kind, queue, newer_than, payload, meta, tags):
            if age_scan == NEAR:
                conditions.append(_near(after_id, newest_first))
            elif age_scan == MATCHES:
                conditions.append(jobs.c.id >= _lowest_id_since(age, now))
                if after_id is not None:
                    conditions.append(_past_the_window(after_id, newest_first))
            else:
                raise ValueError(f"age_scan is {NEAR!r} or {MATCHES!r}, got {age_scan!r}")
    contains = payload is not None or meta is not None or tags is not None
    # The second step of a containment filter (every match): see _hidden.
    all_matches = contains and lead is None and payload_scan == MATCHES
    if payload is not None:
        match = sa.cast(sa.bindparam("payload_match", payload, sa.Text), JSONB)
        conditions.append(jobs.c.payload.contains(_hidden(match, all_matches)))
    if meta is not None:
        meta_match = sa.cast(sa.bindparam("meta_match", meta, sa.Text), JSONB)
        conditions.append(jobs.c.meta.contains(_hidden(meta_match, all_matches)))
    if tags is not None:
        tags_match = sa.bindparam("tags", list(tags), ARRAY(sa.Text))
        conditions.append(jobs.c.tags.contains(_hidden(tags_match, all_matches)))
    if after_id is not None:
        cursor = sa.bindparam("after_id", after_id, sa.BigInteger)
        # MATCHES: ``id + 0``, so the cursor is no range on the primary key either (the
        # planner would walk half the table from it, filtering each row by the payload).
        keyed = jobs.c.id + 0 if all_matches else jobs.c.id
        conditions.append(keyed < cursor if newest_first else keyed > cursor)
    order: list[sa.ColumnElement[Any]] = [jobs.c.id] if lead is None else [lead, jobs.c.id]
    if contains and lead is None:
        if payload_scan == NEAR:
            conditions.append(_near(after_id, newest_first))
        elif payload_scan == MATCHES:
            # Not the id itself: no index yields this order, so the planner cannot walk
            # the primary key hoping a match comes soon; it reads the GIN index.
            order = [jobs.c.id + 0]
        else:
            raise ValueError(f"payload_scan is {NEAR!r} or {MATCHES!r}, got {payload_scan!r}")
    return (
        sa.select(*jobs.c)
        .where(*conditions)
        .order_by(*(c.desc() for c in order) if newest_first else order)
        .limit(sa.bindparam("limit", limit, sa.Integer))
    )


def _workflow_page(
    *,
    statuses: Sequence[JobStatus] | None,
    kind: str | None,
    queue: str | None,
    older_than: float | None,
    limit: int,
    after_id: int | None,
    now: Now,
    key: str | None,
    min_id: int | None,
    max_id: int | None,
    newer_than: float | None,
    payload: str | None,
    newest_first: bool,
    tags: Sequence[str] | None,
    meta: str | None,
    workflow: Any,
) -> sa.Select[Any]:
    """:func:`list_jobs` of one workflow's steps (see there)."""
    conditions = _job_filters(
        statuses=statuses, kind=kind, queue=queue, older_than=older_than, now=now
    )
    # ``workflow_id = :workflow`` (not ``= ANY``): it proves the partial index's
    # ``workflow_id IS NOT NULL``.
    conditions.append(jobs.c.workflow_id == sa.bindparam("workflow", workflow, sa.Uuid))
    if key is not None:
        conditions.append(jobs.c.idempotency_key == sa.bindparam("key", key, sa.Text))
    if min_id is not None:
        conditions.append(jobs.c.id + 0 >= sa.bindparam("min_id", min_id, sa.BigInteger))
    if max_id is not None:
        conditions.append(jobs.c.id + 0 <= sa.bindparam("max_id", max_id, sa.BigInteger))
    if newer_than is not None:
        age = sa.bindparam("newer_than", newer_than, sa.Float)
        conditions.append(jobs.c.created_at >= _common.ago(age, now))
    if payload is not None:
        match = sa.cast(sa.bindparam("payload_match", payload, sa.Text), JSONB)
        conditions.append(jobs.c.payload.contains(match))
    if meta is not None:
        meta_match = sa.cast(sa.bindparam("meta_match", meta, sa.Text), JSONB)
        conditions.append(jobs.c.meta.contains(meta_match))
    if tags is not None:
        conditions.append(jobs.c.tags.contains(sa.bindparam("tags", list(tags), ARRAY(sa.Text))))
    # ``id + 0`` here too: a range of the primary key from the cursor is no way in.
    keyed = jobs.c.id + 0
    if after_id is not None:
        cursor = sa.bindparam("after_id", after_id, sa.BigInteger)
        conditions.append(keyed < cursor if newest_first else keyed > cursor)
    return (
        sa.select(*jobs.c)
        .where(*conditions)
        .order_by(keyed.desc() if newest_first else keyed)
        .limit(sa.bindparam("limit", limit, sa.Integer))
    )


def _hidden(value: sa.ColumnElement[Any], all_matches: bool) -> sa.ColumnElement[Any]:
    """A value a containment filter looks for; in the MATCHES step, out of the planner's
    sight.

    Written ``(SELECT :payload_match::jsonb)`` there, an InitPlan the planner cannot look
    into: it prices ``payload @> $0`` at the default 1% of rows, and reads the GIN index.
    Given the value itself, it prices it from the statistics, and statistics taken when
    the value was on every row (a backlog of one tenant, since drained) make reading the
    whole table and sorting it the cheapest plan. The same holds for ``meta`` and
    ``tags``.
    """
    return sa.select(value).scalar_subquery() if all_matches else value


def age_in_two_steps(
    statuses: Sequence[JobStatus] | None,
    kind: str | None,
    queue: str | None,
    newer_than: Any,
    *contains: Any,
) -> bool:
    """Whether :func:`list_jobs` with these filters is asked ``age_scan=NEAR``, then
    ``MATCHES``: ``newer_than`` on the primary key (no other filter leads, and no
    payload, meta or tags filter, which have their own two steps)."""
    return (
        newer_than is not None
        and all(c is None for c in contains)
        and _leading_filter(statuses, kind, queue)[0] is None
    )


def _past_the_window(after_id: int, newest_first: bool) -> sa.ColumnElement[bool]:
    """Whether the table goes on past the first step's window (a one-time test, made
    before the bound is looked up): when it does not, the first step read every id
    left, and this step returns nothing (the caller keeps the first step's rows)."""
    window = sa.bindparam("window", PAYLOAD_WINDOW, sa.BigInteger)
    cursor = sa.bindparam("after_id", after_id, sa.BigInteger)
    if newest_first:
        return sa.select(sa.func.min(jobs.c.id)).scalar_subquery() < cursor - window
    return sa.select(sa.func.max(jobs.c.id)).scalar_subquery() > cursor + window


def _lowest_id_since(age: sa.ColumnElement[Any], now: Now) -> sa.ScalarSelect[Any]:
    """The lowest id among the jobs created since ``now - age``, from
    ``jobs_created_at_idx (created_at, id)`` alone (revision 0012).

    A bound for the page's walk on the primary key, exact whatever the order of
    created_at against id: every job created since is at or above it (a job created in
    a long transaction gets an id after younger ones). ``id + 0`` and the subquery's
    ``ORDER BY created_at, id``: ``min(id)`` would be rewritten into a walk of the
    primary key that stops at the first match (which is the slow walk this bound
    avoids); ordered by the index's own columns, no plan reads the table's rows.
    """
    # Both ends out of the planner's sight (InitPlans): it prices a range between two
    # unknown values at 0.5% of the rows, and reads the index; given the bound itself,
    # statistics that say every job is recent (or none yet) make it read the table.
    start = sa.select(_common.ago(age, now)).scalar_subquery()
    end = sa.select(sa.cast(sa.literal("infinity"), sa.DateTime(timezone=True))).scalar_subquery()
    since = (
        sa.select((jobs.c.id + 0).label("id"))
        .where(jobs.c.created_at >= start, jobs.c.created_at <= end)
        .order_by(jobs.c.created_at, jobs.c.id)
        .subquery("since")
    )
    return sa.select(sa.func.min(since.c.id)).scalar_subquery()


def payload_in_two_steps(
    statuses: Sequence[JobStatus] | None,
    kind: str | None,
    queue: str | None,
    *contains: Any,
) -> bool:
    """Whether :func:`list_jobs` with these filters is asked NEAR, then MATCHES:
    ``contains`` are its payload, meta and tags filters (None where not given)."""
    return (
        any(c is not None for c in contains) and _leading_filter(statuses, kind, queue)[0] is None
    )


def _near(after_id: int | None, newest_first: bool) -> sa.ColumnElement[bool]:
    """The ``PAYLOAD_WINDOW`` ids after the cursor (from the first or last id without one)."""
    window = sa.bindparam("window", PAYLOAD_WINDOW, sa.BigInteger)
    if after_id is not None:
        start: sa.ColumnElement[Any] = sa.bindparam("after_id", after_id, sa.BigInteger)
    else:
        edge = sa.func.max(jobs.c.id) if newest_first else sa.func.min(jobs.c.id)
        # One past the edge, so the window holds the edge row itself.
        start = sa.select(edge).scalar_subquery() + (1 if newest_first else -1)
    return jobs.c.id >= start - window if newest_first else jobs.c.id <= start + window


def _leading_filter(
    statuses: Sequence[JobStatus] | None, kind: str | None, queue: str | None
) -> tuple[sa.ColumnElement[Any] | None, sa.ColumnElement[bool] | None]:
    """The column whose ``(column, id)`` index drives a page, and its condition.

    Written ``column = ANY(ARRAY[value])`` and ordered by ``(column, id)``: the same rows
    in the same order as ``column = value ORDER BY id``, but only that index yields
    this order, and the primary key would have to sort every match first. With
    ``column = value`` the planner drops the constant column from the order; then,
    under statistics that say every row has the value (taken before a backlog of one
    kind drained, say), it walks the primary key expecting a page in the first rows,
    and reads the whole table when the value has become rare.
    """
    if kind is not None:
        value = sa.bindparam("kind", [kind], ARRAY(sa.Text))
        return jobs.c.kind, jobs.c.kind == sa.any_(value)
    if queue is not None:
        value = sa.bindparam("queue", [queue], ARRAY(sa.Text))
        return jobs.c.queue, jobs.c.queue == sa.any_(value)
    if statuses is not None and len(statuses) == 1:
        # The status as SQL text, as everywhere (see _common.status).
        literal: sa.ColumnElement[Any] = sa.literal_column(
            f"ARRAY['{statuses[0].value}'::job_status]"
        )
        return jobs.c.status, jobs.c.status == sa.any_(literal)
    return None, None


def get_job(job_id: int) -> sa.Select[Any]:
    return sa.select(*jobs.c).where(jobs.c.id == sa.bindparam("id", job_id, sa.BigInteger))


def job_states(ids: Sequence[int]) -> sa.Select[Any]:
    """Status, attempts and cancel flag of the jobs with these ids (primary key look-ups:
    the dashboard's live view asks this about the jobs on an open page, once a second)."""
    return sa.select(
        jobs.c.id,
        jobs.c.status,
        jobs.c.attempts,
        jobs.c.max_attempts,
        jobs.c.cancel_requested_at,
    ).where(jobs.c.id == sa.any_(sa.bindparam("ids", list(ids), ARRAY(sa.BigInteger))))


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
    stays visible until it runs again. RETURNING the ids changed and their
    ``workflow_id`` (a retried workflow step reopens its cancelled dependents, #26).
    """
    conditions = _job_filters(
        ids=ids, statuses=statuses, kind=kind, queue=queue, older_than=older_than, now=now
    )
    picked = _locked_ids(conditions, "picked")
    return (
        sa.update(jobs)
        .where(jobs.c.id == picked.c.id)
        .values(
            status=_common.status(JobStatus.QUEUED),
            **_common.fresh_attempt(now),
        )
        .returning(jobs.c.id, jobs.c.workflow_id)
    )


#: ``last_error`` of a queued job or waiting step an operator cancelled, followed by that
#: status (a running one gets JobCancelled).
CANCELLED_BY_OPERATOR = "cancelled by an operator while it was "
#: Before what ``last_error`` held (the failure a retry was queued after, a snooze's note).
CANCELLED_EARLIER = "\n\nbefore that:\n"


def cancel_jobs(
    *,
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: float | None = None,
    now: Now = None,
) -> sa.Update:
    """Queued jobs (ready or scheduled) and waiting workflow steps to cancelled. A job
    claimed meanwhile is running, fails the status test once its lock is released, and
    is not changed. A cancelled step's dependents follow by the workflow rules (the
    trigger of :mod:`sqla_jobs.workflows`, in this statement's transaction).

    ``last_error`` says an operator cancelled it and in which status (``show`` prints it;
    ``finished_at`` is when); what it held (the failure a retry was queued after) stays
    below that line.
    """
    statuses = [JobStatus.QUEUED, JobStatus.WAITING]
    conditions = _job_filters(
        ids=ids, statuses=statuses, kind=kind, queue=queue, older_than=older_than, now=now
    )
    picked = _locked_ids(conditions, "picked")
    earlier = sa.bindparam("earlier", CANCELLED_EARLIER, sa.Text) + jobs.c.last_error
    return (
        sa.update(jobs)
        .where(jobs.c.id == picked.c.id, jobs.c.status.in_([_common.status(s) for s in statuses]))
        .values(
            status=_common.status(JobStatus.CANCELLED),
            finished_at=_common.clock(now),
            locked_until=None,
            # The status before this update: "queued" or "waiting".
            last_error=sa.bindparam("note", CANCELLED_BY_OPERATOR, sa.Text)
            + sa.cast(jobs.c.status, sa.Text)
            + sa.func.coalesce(earlier, ""),
        )
        .returning(jobs.c.id)
    )


def request_cancel(
    *,
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: float | None = None,
    now: Now = None,
) -> sa.Select[Any]:
    """Ask running jobs to stop (revision 0005): set ``cancel_requested_at`` and NOTIFY
    ``CANCEL_CHANNEL`` with each id (delivered when the caller commits).

    No SKIP LOCKED: a running row is locked only for a moment (a heartbeat, the
    done-mark); waiting for it and testing the status again afterwards means a job that
    finished meanwhile is left ``done`` and not reported. RETURNING the ids marked.
    """
    running = [JobStatus.RUNNING]
    conditions = _job_filters(
        ids=ids, statuses=running, kind=kind, queue=queue, older_than=older_than, now=now
    )
    marked = (
        sa.update(jobs)
        .where(*conditions, jobs.c.cancel_requested_at.is_(None))
        .values(cancel_requested_at=_common.clock(now))
        .returning(jobs.c.id)
        .cte("marked")
    )
    notified = sa.func.pg_notify(
        sa.bindparam("channel", locks.CANCEL_CHANNEL, sa.Text), sa.cast(marked.c.id, sa.Text)
    )
    return sa.select(marked.c.id, notified.label("notified")).order_by(marked.c.id)


def job_result(job_id: int) -> sa.Select[Any]:
    """``(status, result)`` of a job, live or archived (revision 0005)."""
    archive = models.jobs_archive
    job_id_param = sa.bindparam("id", job_id, sa.BigInteger)
    live = sa.select(jobs.c.status, jobs.c.result).where(jobs.c.id == job_id_param)
    archived = sa.select(archive.c.status, archive.c.result).where(archive.c.id == job_id_param)
    return sa.select(sa.union_all(live, archived).subquery("found")).limit(1)


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


def matching_jobs(
    *,
    statuses: Sequence[JobStatus],
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: float | None = None,
    now: Now = None,
) -> sa.Select[Any]:
    """``(id, status, queue, kind)`` of the jobs :func:`delete_jobs` with the same
    arguments would delete now, by id (a dry run: no lock, nothing changed)."""
    conditions = _job_filters(
        ids=ids, statuses=statuses, kind=kind, queue=queue, older_than=older_than, now=now
    )
    return (
        sa.select(jobs.c.id, jobs.c.status, jobs.c.queue, jobs.c.kind)
        .where(*conditions)
        .order_by(jobs.c.id)
    )


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
        jobs.c.status == _common.status(JobStatus.DONE),
        jobs.c.finished_at < _common.ago(sa.bindparam("done_age", done_older_than, sa.Float), now),
    )
    which: sa.ColumnElement[bool] = done
    if dead_older_than is not None:
        failed = sa.and_(
            jobs.c.status.in_(
                [_common.status(JobStatus.DEAD), _common.status(JobStatus.CANCELLED)]
            ),
            jobs.c.finished_at
            < _common.ago(sa.bindparam("dead_age", dead_older_than, sa.Float), now),
        )
        which = sa.or_(done, failed)
    picked = (
        sa.select(jobs.c.id)
        # A finished step of a workflow that has not ended stays: its dependents read
        # its result, and the workflow is archived as a unit once it ended (#26).
        .where(which, sa.not_(workflows.unfinished_workflow(jobs)))
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
            sa.select(*(moved.c[n] for n in names), _common.clock(now)),
        )
        .add_cte(moved)
        .returning(archive.c.id)
    )


def prune_batch(*, older_than: float, batch: int, now: Now = None) -> ReturningDelete[Any]:
    """Delete up to ``batch`` archived jobs finished before ``now - older_than``."""
    archive = models.jobs_archive
    picked = (
        sa.select(archive.c.id)
        .where(archive.c.finished_at < _common.ago(sa.bindparam("age", older_than, sa.Float), now))
        .limit(sa.bindparam("batch", batch, sa.Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    return sa.delete(archive).where(archive.c.id == picked.c.id).returning(archive.c.id)


def queues_of_kinds(kinds: Sequence[str]) -> sa.Select[Any]:
    """Distinct queues holding live jobs of ``kinds`` (sqla_jobs.testing.drain)."""
    return (
        sa.select(jobs.c.queue)
        .where(
            jobs.c.kind == sa.any_(_common.text_array(kinds)),
            jobs.c.status.in_(
                [_common.status(JobStatus.QUEUED), _common.status(JobStatus.RUNNING)]
            ),
        )
        .distinct()
    )


def pending_count(kinds: Sequence[str], queues: Sequence[str]) -> sa.Select[Any]:
    """``(pending, paused)`` of the jobs of ``kinds`` in ``queues``: ``pending`` counts those
    running or ready to be claimed; ``paused``, those ready but held back by a paused queue
    or kind (no worker starts them until :func:`sqla_jobs.ops.resume`)."""
    ready = sa.and_(
        jobs.c.status == _common.status(JobStatus.QUEUED), jobs.c.run_at <= _common.clock(None)
    )
    c = models.queue_controls.c

    def paused_names(scope: str) -> sa.Select[Any]:
        return sa.select(c.name).where(c.scope == sa.literal(scope, sa.Text), c.paused)

    held = sa.or_(jobs.c.queue.in_(paused_names("queue")), jobs.c.kind.in_(paused_names("kind")))
    running = jobs.c.status == _common.status(JobStatus.RUNNING)
    return sa.select(
        sa.func.count().filter(sa.or_(running, sa.and_(ready, sa.not_(held)))).label("pending"),
        sa.func.count().filter(sa.and_(ready, held)).label("paused"),
    ).where(
        jobs.c.kind == sa.any_(_common.text_array(kinds)),
        jobs.c.queue == sa.any_(_common.text_array(queues)),
        sa.or_(ready, running),
    )


# --- archived jobs (sqla_jobs.ops.get_job) ---------------------------------------------


def get_archived_job(job_id: int) -> sa.Select[Any]:
    """The archived copy of a job (``jobs_archive``), with ``archived_at``."""
    archive = models.jobs_archive
    return sa.select(*archive.c).where(archive.c.id == sa.bindparam("id", job_id, sa.BigInteger))


# --- testing helpers (sqla_jobs.testing) -----------------------------------------------


def find_jobs(
    *,
    kind: str | None = None,
    statuses: Sequence[JobStatus] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    payload: str | None = None,
    limit: int = 1000,
) -> sa.Select[Any]:
    """Jobs matching every filter given, in id order; ``payload`` is JSON text matched by
    containment (``payload @> :payload``: the job's payload holds at least these keys)."""
    conditions = _job_filters(statuses=statuses, kind=kind, queue=queue)
    if priority is not None:
        conditions.append(jobs.c.priority == sa.bindparam("priority", priority, sa.SmallInteger))
    if payload is not None:
        match = sa.cast(sa.bindparam("payload_match", payload, sa.Text), JSONB)
        conditions.append(jobs.c.payload.contains(match))
    return (
        sa.select(*jobs.c)
        .where(*conditions)
        .order_by(jobs.c.id)
        .limit(sa.bindparam("limit", limit, sa.Integer))
    )


def due_within(kinds: Sequence[str], queues: Sequence[str], seconds: float) -> sa.Select[Any]:
    """How many queued jobs of ``kinds`` in ``queues`` are scheduled after now() and
    within ``seconds`` of it (retries waiting out their backoff, delayed jobs)."""
    return sa.select(sa.func.count()).where(
        jobs.c.kind == sa.any_(_common.text_array(kinds)),
        jobs.c.queue == sa.any_(_common.text_array(queues)),
        jobs.c.status == _common.status(JobStatus.QUEUED),
        jobs.c.run_at > _common.clock(None),
        jobs.c.run_at
        <= _common.clock(None) + _common.seconds(sa.bindparam("horizon", seconds, sa.Float)),
    )


def pull_forward(kinds: Sequence[str], queues: Sequence[str], seconds: float) -> sa.Update:
    """Make the queued jobs :func:`due_within` counts ready now (``run_at = now()``):
    the test's clock moves for these jobs only. RETURNING their ids."""
    return (
        sa.update(jobs)
        .where(
            jobs.c.kind == sa.any_(_common.text_array(kinds)),
            jobs.c.queue == sa.any_(_common.text_array(queues)),
            jobs.c.status == _common.status(JobStatus.QUEUED),
            jobs.c.run_at > _common.clock(None),
            jobs.c.run_at
            <= _common.clock(None) + _common.seconds(sa.bindparam("horizon", seconds, sa.Float)),
        )
        .values(run_at=_common.clock(None))
        .returning(jobs.c.id)
    )


def inline_next(kinds: Sequence[str], *, scheduled: bool) -> sa.Select[Any]:
    """The next queued job of ``kinds`` in claim order, locked (``FOR UPDATE SKIP
    LOCKED``), for :func:`sqla_jobs.testing.run_inline`; with ``scheduled``, jobs whose
    run_at is still ahead are included."""
    conditions = [
        jobs.c.kind == sa.any_(_common.text_array(kinds)),
        jobs.c.status == _common.status(JobStatus.QUEUED),
    ]
    if not scheduled:
        conditions.append(jobs.c.run_at <= _common.clock(None))
    return (
        sa.select(*jobs.c)
        .where(*conditions)
        .order_by(jobs.c.priority, jobs.c.run_at, jobs.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )


def _handler_max_attempts(value: int) -> sa.ColumnElement[Any]:
    """The job's own max_attempts, else ``value`` (its handler's, else 8), as a claim
    resolves it (:func:`sqla_jobs.sql.lease.claim`, revision 0008)."""
    return sa.func.coalesce(
        jobs.c.max_attempts, sa.bindparam("handler_max_attempts", value, sa.Integer)
    )


def inline_start(
    job_id: int, worker: str, handler_max_attempts: int = models.DEFAULT_MAX_ATTEMPTS
) -> sa.Update:
    """Mark a job running for an inline run (attempts + 1), as a claim would, its
    max_attempts resolved (``handler_max_attempts``: its handler's, else 8). RETURNING
    ``attempts, max_attempts``."""
    return (
        sa.update(jobs)
        .where(jobs.c.id == sa.bindparam("id", job_id, sa.BigInteger))
        .values(
            status=_common.status(JobStatus.RUNNING),
            attempts=jobs.c.attempts + 1,
            worker=sa.bindparam("worker", worker, sa.Text),
            max_attempts=_handler_max_attempts(handler_max_attempts),
        )
        .returning(jobs.c.attempts, jobs.c.max_attempts)
    )


def inline_done(job_id: int, result: str | None = None) -> sa.Update:
    """Mark an inline run done, with the handler's result (JSON text, or None)."""
    return (
        sa.update(jobs)
        .where(jobs.c.id == sa.bindparam("id", job_id, sa.BigInteger))
        .values(
            status=_common.status(JobStatus.DONE),
            finished_at=_common.clock(None),
            locked_until=None,
            run_at=sa.func.least(jobs.c.run_at, _common.clock(None)),
            result=sa.cast(sa.bindparam("result", result, sa.Text), JSONB),
        )
    )


def inline_snoozed(job_id: int, *, delay_seconds: float, note: str) -> sa.Update:
    """An inline run raised Snooze (its start was rolled back with its writes): queued
    again in ``delay_seconds``, attempt not spent, ``snoozes`` + 1."""
    return (
        sa.update(jobs)
        .where(jobs.c.id == sa.bindparam("id", job_id, sa.BigInteger))
        .values(
            status=_common.status(JobStatus.QUEUED),
            snoozes=jobs.c.snoozes + 1,
            run_at=_common.clock(None)
            + _common.seconds(sa.bindparam("delay", delay_seconds, sa.Float)),
            last_error=sa.bindparam("error", note, sa.Text),
        )
    )


def inline_discarded(
    job_id: int,
    *,
    worker: str,
    reason: str,
    handler_max_attempts: int = models.DEFAULT_MAX_ATTEMPTS,
) -> sa.Update:
    """An inline run raised Discard: ``cancelled``, the attempt spent, not retried."""
    return (
        sa.update(jobs)
        .where(jobs.c.id == sa.bindparam("id", job_id, sa.BigInteger))
        .values(
            status=_common.status(JobStatus.CANCELLED),
            max_attempts=_handler_max_attempts(handler_max_attempts),
            attempts=jobs.c.attempts + 1,
            worker=sa.bindparam("worker", worker, sa.Text),
            last_error=sa.bindparam("error", reason, sa.Text),
            finished_at=_common.clock(None),
        )
    )


def inline_failed(
    job_id: int,
    *,
    worker: str,
    delay_seconds: float,
    error: str,
    handler_max_attempts: int = models.DEFAULT_MAX_ATTEMPTS,
) -> sa.Update:
    """Record a failed inline attempt (its own writes were rolled back with it): queued
    again after ``delay_seconds``, or dead at max_attempts (the job's, else
    ``handler_max_attempts``), as :func:`retry` does."""
    max_attempts = _handler_max_attempts(handler_max_attempts)
    exhausted = jobs.c.attempts + 1 >= max_attempts
    return (
        sa.update(jobs)
        .where(jobs.c.id == sa.bindparam("id", job_id, sa.BigInteger))
        .values(
            max_attempts=max_attempts,
            status=sa.case(
                (exhausted, _common.status(JobStatus.DEAD)), else_=_common.status(JobStatus.QUEUED)
            ),
            attempts=jobs.c.attempts + 1,
            worker=sa.bindparam("worker", worker, sa.Text),
            run_at=sa.case(
                # Run ahead of its schedule (``scheduled=True``): never ready after it ended.
                (exhausted, sa.func.least(jobs.c.run_at, _common.clock(None))),
                else_=_common.clock(None)
                + _common.seconds(sa.bindparam("delay", delay_seconds, sa.Float)),
            ),
            last_error=sa.bindparam("error", error, sa.Text),
            finished_at=sa.case((exhausted, _common.clock(None)), else_=None),
        )
        .returning(jobs.c.status)
    )
