"""Operators' statements (``sqla_jobs.ops``): list, show, retry, cancel, delete,
archive, prune; and the look-ups of ``sqla_jobs.testing``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
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
    workflow: Any = None,
    expired: bool = False,
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
    in two steps ([``sqla_jobs.ops.list_jobs``][sqla_jobs.ops.list_jobs]), and so are ``meta`` and
    ``tags`` (revision 0013): ``payload_scan=NEAR`` reads the ``PAYLOAD_WINDOW`` ids after the
    cursor on the primary key (a common value fills the page there); if that is not a
    page, ``payload_scan=MATCHES`` reads every match from the GIN index
    (``jobs_payload_idx``, ``jobs_meta_idx``, ``jobs_tags_idx``) and sorts them (a rare
    value has few; the values and the cursor are kept out of the planner's estimates
    there, see ``_hidden``).
    The age filters walk the primary key and test ``created_at`` (it mostly follows
    ``id``). Without a leading filter or a payload (``age_bounded``), the walk runs
    between the lowest id created since the ``newer_than`` bound and the highest created
    before the ``older_than`` one (``_id_bound``, revision 0017) rather than through
    every job on the other side of a bound: one statement, no window first (finding
    the bound costs less than reading a window of rows).

    ``expired`` keeps jobs whose lease has expired (``locked_until`` past; the caller
    gives ``statuses=[RUNNING]``, which leads, so the walk reads running jobs only).

    ``workflow`` (a workflow id, #26) leads whatever else is given: a workflow's steps
    are few next to the table, read from ``jobs_workflow_finished_idx`` (revision 0017) and
    sorted; the order is ``id + 0`` (so no walk of the primary key can yield it) and no
    other filter is asked in two steps.
    """
    conditions = [jobs.c.locked_until < _common.clock(now)] if expired else []
    if workflow is not None:
        return _workflow_page(
            extra=conditions,
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
    by_age = age_bounded(statuses, kind, queue, (older_than, newer_than), payload, meta, tags)
    conditions += _job_filters(
        statuses=None if lead is jobs.c.status else statuses,
        kind=None if lead is jobs.c.kind else kind,
        queue=None if lead is jobs.c.queue else queue,
        older_than=None if by_age else older_than,
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
    if newer_than is not None and not by_age:
        age = sa.bindparam("newer_than", newer_than, sa.Float)
        conditions.append(jobs.c.created_at >= _common.ago(age, now))
    if by_age:
        conditions.extend(_age_walk(older_than, newer_than, newest_first, now))
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
    extra: list[sa.ColumnElement[bool]],
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
    """``list_jobs`` of one workflow's steps (see there); ``extra``: conditions
    already made."""
    conditions = extra + _job_filters(
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


def age_bounded(
    statuses: Sequence[JobStatus] | None,
    kind: str | None,
    queue: str | None,
    ages: Sequence[Any],
    *contains: Any,
) -> bool:
    """Whether ``list_jobs`` with these filters bounds its walk of the primary key by
    the age filters (``_age_walk``): ``ages`` (its ``older_than`` and ``newer_than``)
    has one given, and no other filter leads, nor a payload, meta or tags filter (which
    are asked in two steps of their own)."""
    return (
        any(a is not None for a in ages)
        and all(c is None for c in contains)
        and _leading_filter(statuses, kind, queue)[0] is None
    )


def _age_walk(
    older_than: float | None, newer_than: float | None, newest_first: bool, now: Now
) -> list[sa.ColumnElement[bool]]:
    """The age filters of a page walking the primary key, and the bounds of that walk.

    The walk runs between the lowest id created since the ``newer_than`` bound and the
    highest id created before the ``older_than`` one (``_id_bound``), so neither
    side of a bound is walked through to reach (or to rule out) the other.
    ``created_at`` is tested on every row: the page is exact whatever the order of
    created_at against id.
    """
    conditions: list[sa.ColumnElement[bool]] = []
    both = older_than is not None and newer_than is not None
    for name, value, older in (("older_than", older_than, True), ("newer_than", newer_than, False)):
        if value is None:
            continue
        bound = _common.ago(sa.bindparam(name, value, sa.Float), now)
        if both and older is not newest_first:
            # Both filters: only the bound the page starts from. With an id range
            # between two values it cannot see, the planner prices it at 0.5% of the
            # rows and sorts them instead of walking; the walk may then pass the far
            # end of the window on the last page (a combination, not a single filter).
            conditions.append(jobs.c.created_at < bound if older else jobs.c.created_at >= bound)
            continue
        # The bound out of the planner's sight (an InitPlan, priced at a third of the
        # rows): statistics taken when every job was on the other side of it (all
        # recent, or none yet) would otherwise price the walk at the whole table, and
        # a sort of every row of the id range would look cheaper.
        hidden = sa.select(bound).scalar_subquery()
        conditions.append(jobs.c.created_at < hidden if older else jobs.c.created_at >= hidden)
        edge = _id_bound(bound, older)
        conditions.append(jobs.c.id <= edge if older else jobs.c.id >= edge)
    return conditions


#: ``jobs_created_hour_idx`` (revision 0017) keys jobs by ``date_bin`` of created_at to
#: the hour: its width and origin, written as constants here and in the index (an
#: expression matches an index only when it is the same expression).
HOUR_WIDTH = "interval '1 hour'"
HOUR_ORIGIN = "timestamptz '2000-01-01 00:00:00+00'"


def _created_hour(value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``date_bin`` of ``value`` to its hour: revision 0017's index key."""
    return sa.func.date_bin(
        sa.literal_column(HOUR_WIDTH),
        value,
        sa.literal_column(HOUR_ORIGIN),
        type_=sa.DateTime(timezone=True),
    )


def _id_bound(bound: sa.ColumnElement[Any], older: bool) -> sa.ScalarSelect[Any]:
    """The highest id of the jobs created before ``bound`` (``older``), or the lowest id
    of those created since, from ``jobs_created_hour_idx (hour, id) INCLUDE
    (created_at)`` alone (revision 0017).

    Exact whatever the order of created_at against id (a job enqueued in a long
    transaction has an old created_at and a high id): every job of an hour wholly past
    the bound is on the bound's side, so the extreme id among them is the first entry
    of each such hour, found by one index descent per hour (a recursive walk, hour to
    hour); the bound's own hour is read entry by entry, testing created_at on the
    index's copy of it. The cost grows with the hours past the bound and the jobs of one
    hour, not with the jobs on either side (reading every match's entry took 25 ms at
    143,000 jobs a day; this reads 24 entries and part of an hour).
    """
    hour = _created_hour(jobs.c.created_at)
    bound_hour = _created_hour(bound)

    def first(where: sa.ColumnElement[bool]) -> sa.Select[Any]:
        order = (hour.desc(), jobs.c.id.desc()) if older else (hour, jobs.c.id)
        # LIMIT written as a constant: a generic plan prices a parameter at 10% of the rows.
        one = sa.literal_column("1", sa.Integer)
        return sa.select(hour.label("hour"), jobs.c.id).where(where).order_by(*order).limit(one)

    def past(other: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
        return hour < other if older else hour > other

    side = "before" if older else "since"
    walk = first(past(bound_hour)).cte(f"hours_{side}", recursive=True)
    step = first(past(walk.c.hour)).lateral(f"next_hour_{side}")
    walk = walk.union_all(sa.select(step.c.hour, step.c.id).select_from(walk.join(step, sa.true())))
    on_the_side = jobs.c.created_at < bound if older else jobs.c.created_at >= bound
    edge = first(sa.and_(hour == bound_hour, on_the_side))
    ids = sa.union_all(sa.select(walk.c.id), sa.select(edge.subquery().c.id)).subquery(
        f"ids_{side}"
    )
    extreme = sa.func.max(ids.c.id) if older else sa.func.min(ids.c.id)
    return sa.select(extreme).scalar_subquery()


def payload_in_two_steps(
    statuses: Sequence[JobStatus] | None,
    kind: str | None,
    queue: str | None,
    *contains: Any,
) -> bool:
    """Whether ``list_jobs`` with these filters is asked NEAR, then MATCHES:
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


def id_edges() -> sa.Select[Any]:
    """The lowest and highest job ids, one index probe each."""
    return sa.select(sa.func.min(jobs.c.id), sa.func.max(jobs.c.id))


def near_window_was_everything(
    after_id: int | None, newest_first: bool, lowest: int | None, highest: int | None
) -> bool:
    """Whether the NEAR window (``_near``) after ``after_id`` held every id up to the
    table's far edge (``lowest``/``highest`` from ``id_edges``, read after it): then
    the rows it found are all there are, and the MATCHES step, which reads every match
    from the GIN index (the last page of a common value: every one of them), has nothing
    to add. A job inserted past the edge since makes the edge read later farther, so
    MATCHES runs."""
    if lowest is None or highest is None:
        return True
    if newest_first:
        start = highest + 1 if after_id is None else after_id
        return lowest >= start - PAYLOAD_WINDOW
    start = lowest - 1 if after_id is None else after_id
    return highest <= start + PAYLOAD_WINDOW


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
    trigger of [``sqla_jobs.workflows``][sqla_jobs.workflows], in this statement's transaction).

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


def job_result(job_id: int, *, archived: bool = False) -> sa.Select[Any]:
    """``(status, result)`` of a job in ``jobs`` (revision 0005), or ``archived`` in
    ``jobs_archive``. Two statements, not one: planning a look-up in the archive weighs
    each of its weekly partitions (revision 0022: 0.19 -> 0.49 ms at 15), which the
    result of a live job, the common case, does not need."""
    table = models.jobs_archive if archived else jobs
    job_id_param = sa.bindparam("id", job_id, sa.BigInteger)
    return sa.select(table.c.status, table.c.result).where(table.c.id == job_id_param)


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
    """``(id, status, queue, kind)`` of the jobs ``delete_jobs`` with the same
    arguments would delete now, by id (a dry run: no lock, nothing changed)."""
    conditions = _job_filters(
        ids=ids, statuses=statuses, kind=kind, queue=queue, older_than=older_than, now=now
    )
    return (
        sa.select(jobs.c.id, jobs.c.status, jobs.c.queue, jobs.c.kind)
        .where(*conditions)
        .order_by(jobs.c.id)
    )


def _ended_before(
    table: sa.Table | sa.Alias,
    done_age: sa.ColumnElement[Any],
    dead_age: sa.ColumnElement[Any] | None,
) -> sa.ColumnElement[bool]:
    """The archiver's test of one row: done before the ``done_age`` cutoff, or dead or
    cancelled before the ``dead_age`` one (none: those stay)."""
    done = sa.and_(table.c.status == _common.status(JobStatus.DONE), table.c.finished_at < done_age)
    if dead_age is None:
        return done
    failed = sa.and_(
        table.c.status.in_([_common.status(JobStatus.DEAD), _common.status(JobStatus.CANCELLED)]),
        table.c.finished_at < dead_age,
    )
    return sa.or_(done, failed)


def _last_end(table: sa.Table, workflow_id: sa.ColumnElement[Any]) -> sa.ScalarSelect[Any]:
    """When the last step of a workflow in ``table`` ended: one descent of its
    ``(workflow_id, finished_at)`` index (revision 0017)."""
    step = table.alias("last_step")
    return (
        sa.select(sa.func.max(step.c.finished_at))
        .where(step.c.workflow_id == workflow_id)
        .scalar_subquery()
    )


def _whole_workflows(
    table: sa.Table, picked: sa.CTE, row_test: sa.ColumnElement[bool], key: Sequence[str] = ("id",)
) -> sa.CTE:
    """The rows that go with ``picked``: its rows outside workflows, and every step of each
    workflow it touched, or none of them, by ``key`` (columns of both ``table`` and
    ``picked``).

    A batch picks rows up to its size; the workflows among them are then taken whole
    (each of their steps locked, SKIP LOCKED), even past the batch size. A workflow one
    of whose steps could not be locked (an operator is retrying it, another archiver
    has it: fewer steps locked than it has) or fails ``row_test`` as locked (retried
    since the snapshot) is left for the next batch, all of it. One statement: a crash
    leaves all of a workflow moved or none of it (#26).
    """
    units = (
        sa.select(picked.c.workflow_id)
        .where(picked.c.workflow_id.is_not(None))
        .distinct()
        .cte("units")
        .prefix_with("MATERIALIZED")
    )
    # An array, not a join: the planner, guessing 200 units, hashed every finished step
    # of every workflow in the table; this is one index range per unit.
    unit_ids = sa.func.array(sa.select(units.c.workflow_id).scalar_subquery())
    # Every step of the units is locked; whether it may go is a column (read from the
    # row as locked), not a filter: in the filter the planner read every old dead job
    # of the table through jobs_finished_idx to test it against the units.
    locked = (
        sa.select(*(table.c[k] for k in key), table.c.workflow_id, row_test.label("goes"))
        .where(table.c.workflow_id == sa.any_(unit_ids))
        .with_for_update(of=table, skip_locked=True)
        .cte("unit_steps")
        .prefix_with("MATERIALIZED")
    )
    step = table.alias("any_step")
    all_steps = (
        sa.select(sa.func.count())
        .where(step.c.workflow_id == locked.c.workflow_id)
        .scalar_subquery()
    )
    whole = (
        sa.select(locked.c.workflow_id)
        .group_by(locked.c.workflow_id)
        .having(sa.and_(sa.func.bool_and(locked.c.goes), sa.func.count() == all_steps))
    )
    return (
        sa.union_all(
            sa.select(*(picked.c[k] for k in key)).where(picked.c.workflow_id.is_(None)),
            sa.select(*(locked.c[k] for k in key)).where(locked.c.workflow_id.in_(whole)),
        )
        .cte("chosen")
        .prefix_with("MATERIALIZED")
    )


#: What each range of ``archive_batch`` holds, in the order a batch reads them: done
#: rows past ``done_older_than``, dead and cancelled ones past ``dead_older_than``. One
#: status per range (not ``status IN (dead, cancelled)``): a range read in
#: ``finished_at`` order is what lets a batch start where the previous one stopped.
ARCHIVED_STATUSES = (JobStatus.DONE, JobStatus.DEAD, JobStatus.CANCELLED)


def _floor(name: str) -> sa.ColumnElement[Any]:
    """A batch's lower bound on ``finished_at``, given at execution (``next_floors``):
    where the previous batch of the same call stopped; ``-infinity`` for the first."""
    stamp = sa.DateTime(timezone=True)
    return sa.func.coalesce(
        sa.bindparam(name, None, stamp), sa.literal_column("'-infinity'::timestamptz", stamp)
    )


def _reached(picked: sa.CTE, status: JobStatus | None = None) -> sa.ScalarSelect[Any]:
    """The greatest ``finished_at`` among the rows ``picked`` (of one status), returned
    with every moved row: the next batch's floor (NULL: the range gave nothing)."""
    reached = sa.select(sa.func.max(picked.c.finished_at))
    if status is not None:
        reached = reached.where(picked.c.status == _common.status(status))
    return reached.scalar_subquery()


def next_floors(row: sa.Row[Any], floors: Mapping[str, datetime]) -> dict[str, datetime]:
    """The parameters of the next batch of ``archive_batch`` or ``prune_batch`` in
    the same call: ``floors`` with each range's floor (``floor_<status>``, ``floor``) moved
    up to what ``row``, any row the batch returned, says it reached (``reached_<status>``,
    ``reached``). A range the batch did not read, or found empty, keeps its floor."""
    moved = dict(floors)
    for name, value in row._mapping.items():
        if name.startswith("reached") and value is not None:
            moved[name.replace("reached", "floor", 1)] = value
    return moved


def archive_batch(
    *,
    done_older_than: float,
    dead_older_than: float | None,
    batch: int,
    now: Now = None,
) -> ReturningInsert[Any]:
    """Move a batch of finished rows from ``jobs`` to ``jobs_archive``, in one statement.

    ``WITH picked AS MATERIALIZED (SELECT id ... LIMIT n FOR UPDATE SKIP LOCKED),
    moved AS (DELETE ... RETURNING *) INSERT INTO jobs_archive SELECT ... FROM moved``.
    Done rows finished before ``now - done_older_than`` go; dead and cancelled rows only
    when ``dead_older_than`` is given. Each status is a range on jobs_finished_idx
    (``ARCHIVED_STATUSES``), read in ``finished_at`` order from its floor, the
    parameter ``floor_<status>`` (none: from the start).

    Returns, per moved row, its id and ``reached_<status>``: the greatest ``finished_at``
    the batch picked in each range, the floor of the next batch of the same call
    (``next_floors``). Without it each batch re-read the index entries its
    predecessors had just deleted, dead until vacuum: batch k of a call walked k batches
    of them; with ``dead_older_than`` the two ranges were one BitmapOr read whole. Rows
    below a floor that a batch skipped (locked, or their workflow not ready) wait for
    the next call; rows at the floor stay in reach (``>=``).

    A workflow goes as a unit (#26), once it has ended and its last step ended before
    the cutoff (before both, if a step ended dead or cancelled; never, if one did and
    ``dead_older_than`` is not given): all its steps in the batch that first picks one
    of them, even past ``batch`` rows (``_whole_workflows``). Until then each of
    its rows stays: a dependent reads their results, the status page shows them.
    """
    done_age = _common.ago(sa.bindparam("done_age", done_older_than, sa.Float), now)
    dead_age = (
        None
        if dead_older_than is None
        else _common.ago(sa.bindparam("dead_age", dead_older_than, sa.Float), now)
    )
    which = _ended_before(jobs, done_age, dead_age)
    last_end = _last_end(jobs, jobs.c.workflow_id)
    ready = sa.and_(sa.not_(workflows.unfinished_workflow(jobs)), last_end < done_age)
    failed = workflows.has_step_in(jobs.c.workflow_id, JobStatus.DEAD, JobStatus.CANCELLED)
    ready = sa.and_(
        ready, sa.not_(failed) if dead_age is None else sa.or_(sa.not_(failed), last_end < dead_age)
    )
    limit = sa.bindparam("batch", batch, sa.Integer)
    ranges = [(JobStatus.DONE, done_age)]
    if dead_age is not None:
        ranges += [(JobStatus.DEAD, dead_age), (JobStatus.CANCELLED, dead_age)]

    def pick(status: JobStatus, age: sa.ColumnElement[Any]) -> sa.Select[Any]:
        return (
            sa.select(jobs.c.id, jobs.c.workflow_id, jobs.c.status, jobs.c.finished_at)
            .where(
                jobs.c.status == _common.status(status),
                jobs.c.finished_at >= _floor(f"floor_{status.value}"),
                jobs.c.finished_at < age,
                sa.or_(jobs.c.workflow_id.is_(None), ready),
            )
            .order_by(jobs.c.finished_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )

    if len(ranges) == 1:
        rows = pick(*ranges[0])
    else:
        # Each range in a sub-select of its own (FOR UPDATE is not allowed on a UNION's
        # arms); the outer LIMIT stops before a later range is read once earlier ones
        # filled the batch.
        arms = [sa.select(pick(s, age).subquery(f"picked_{s.value}")) for s, age in ranges]
        rows = sa.select(sa.union_all(*arms).subquery("ranges")).limit(limit)
    picked = rows.cte("picked").prefix_with("MATERIALIZED")
    chosen = _whole_workflows(jobs, picked, which)
    moved = sa.delete(jobs).where(jobs.c.id == chosen.c.id).returning(*jobs.c).cte("moved")
    names = [c.name for c in jobs.c]
    archive = models.jobs_archive
    return (
        sa.insert(archive)
        .from_select(
            [*names, archive.c.archived_at.name],
            sa.select(*(moved.c[n] for n in names), _common.clock(now)),
        )
        .add_cte(moved)
        .returning(
            archive.c.id,
            *(_reached(picked, status).label(f"reached_{status.value}") for status, _ in ranges),
        )
    )


def prepare_archive(now: Now = None) -> sa.Select[Any]:
    """``jobs_archive_prepare(now)`` (revision 0022): the partitions of this week and
    the next exist, closed partitions get (then, at the next call, validate) their id
    CHECK. Returns how many changes it made: call again, in a new transaction, until 0.
    A ``SECURITY DEFINER`` function: the caller needs no ownership and runs no DDL."""
    return sa.select(
        sa.func.jobs_archive_prepare(_common.clock(now), type_=sa.Integer).label("changes")
    )


def drop_archive_before(*, older_than: float, now: Now = None) -> sa.Select[Any]:
    """``jobs_archive_drop_before(now - older_than)`` (revision 0022): drops every
    partition of ``jobs_archive`` wholly archived before the cutoff (so finished before
    it), returns the exact number of rows dropped (0 when the parent's lock was not
    granted within the function's lock_timeout)."""
    cutoff = _common.ago(sa.bindparam("age", older_than, sa.Float), now)
    return sa.select(sa.func.jobs_archive_drop_before(cutoff, type_=sa.BigInteger).label("dropped"))


def archive_partitions() -> sa.Select[Any]:
    """``jobs_archive``'s partitions (revision 0022), oldest first: name, bounds,
    whether the id CHECK is validated, and the planner's estimate of its rows
    (``pg_class.reltuples``: -1 until the partition is first vacuumed or analyzed;
    catalog only, no scan)."""
    parts = sa.func.jobs_archive_partitions().table_valued(
        sa.column("partition", sa.Text),
        sa.column("lower_bound", sa.DateTime(timezone=True)),
        sa.column("upper_bound", sa.DateTime(timezone=True)),
        sa.column("id_check", sa.Boolean),
    )
    pg_class = sa.table("pg_class", sa.column("oid"), sa.column("reltuples", sa.Float))
    estimate = (
        sa.select(pg_class.c.reltuples)
        .where(pg_class.c.oid == sa.func.to_regclass(sa.func.quote_ident(parts.c.partition)))
        .scalar_subquery()
    )
    return sa.select(*parts.c, estimate.label("estimated_rows")).order_by(
        parts.c.lower_bound.asc().nulls_first()
    )


def prune_batch(*, older_than: float, batch: int, now: Now = None) -> ReturningDelete[Any]:
    """Delete a batch of archived jobs finished before ``now - older_than``.

    Read in ``finished_at`` order from the parameter ``floor`` (none: from the start),
    ``reached`` of the previous batch of the same call, returned with every deleted
    row's id (``next_floors``): as ``archive_batch``, so that a batch does not
    walk the dead index entries its predecessors left.

    An archived workflow goes as a unit (#26): once its last step ended before the
    cutoff and none of its steps is still in ``jobs``, every step of it in one batch
    (``_whole_workflows``), even past ``batch`` rows.
    """
    archive = models.jobs_archive
    age = _common.ago(sa.bindparam("age", older_than, sa.Float), now)
    ready = sa.and_(
        _last_end(archive, archive.c.workflow_id) < age,
        sa.not_(workflows.has_step_in(archive.c.workflow_id)),
    )
    picked = (
        sa.select(archive.c.id, archive.c.archived_at, archive.c.workflow_id, archive.c.finished_at)
        .where(
            archive.c.finished_at >= _floor("floor"),
            archive.c.finished_at < age,
            sa.or_(archive.c.workflow_id.is_(None), ready),
        )
        .order_by(archive.c.finished_at)
        .limit(sa.bindparam("batch", batch, sa.Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    # By (id, archived_at), the primary key: the partition key lets each deleted row's
    # look-up probe its own partition (run-time pruning), where an id alone probed every
    # weekly partition's primary key (revision 0022; 38,000 buffers for 1,000 rows at
    # 15 partitions, against 6,000 unpartitioned).
    key = ("id", "archived_at")
    chosen = _whole_workflows(archive, picked, archive.c.finished_at < age, key)
    return (
        sa.delete(archive)
        .where(archive.c.id == chosen.c.id, archive.c.archived_at == chosen.c.archived_at)
        .returning(archive.c.id, _reached(picked).label("reached"))
    )


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
    or kind (no worker starts them until [``sqla_jobs.ops.resume``][sqla_jobs.ops.resume])."""
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
    """Make the queued jobs ``due_within`` counts ready now (``run_at = now()``):
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
    LOCKED``), for [``sqla_jobs.testing.run_inline``][sqla_jobs.testing.run_inline]; with
    ``scheduled``, jobs whose
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
    resolves it (``sqla_jobs.sql.lease.claim``, revision 0008)."""
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
    ``handler_max_attempts``), as ``retry`` does."""
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
