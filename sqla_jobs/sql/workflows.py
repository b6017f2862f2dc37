"""Workflow statements (revision 0014): insert steps and edges, the repair sweep, status,
cancel, retry and upstream results.

The release itself is not here: it is ``jobs_workflow_resolve``, a database function
the migration installs, run by a trigger in the transaction of whatever statement ended
a step (see :mod:`sqla_jobs.workflows`). :func:`sweep` calls the same function.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_jobs import models
from sqla_jobs.models import JobStatus, jobs, workflow_edges
from sqla_jobs.sql import _common

#: Statuses of a step that has not ended.
OPEN_STATUSES = (JobStatus.WAITING, JobStatus.QUEUED, JobStatus.RUNNING)
#: ``last_error`` of a step cancelled with its whole workflow.
CANCELLED_WORKFLOW = "cancelled by an operator with its whole workflow"


def _statuses(*statuses: JobStatus) -> list[sa.ColumnElement[Any]]:
    return [_common.status(s) for s in statuses]


def insert_steps() -> sa.Insert:
    """Insert a workflow's steps from one JSON array; RETURNING ``id, step``.

    Parameters: ``workflow_id`` and ``rows``, a JSON array of objects with ``s`` (step
    name), ``k``, ``p``, ``w`` (true: the step waits for dependencies) and the optional
    ``q``, ``pr``, ``m``, ``at``, ``d``, ``t``, ``mt``, ``tg`` of
    :func:`sqla_jobs.sql.enqueue.insert_jobs_json`.
    No idempotency key: a step skipped by a conflict would leave a hole in the graph.
    """
    rows = (
        sa.func.jsonb_to_recordset(sa.cast(sa.bindparam("rows", type_=sa.Text), JSONB))
        .table_valued(
            sa.column("s", sa.Text),
            sa.column("k", sa.Text),
            sa.column("p", JSONB),
            sa.column("w", sa.Boolean),
            sa.column("q", sa.Text),
            sa.column("pr", sa.SmallInteger),
            sa.column("m", sa.Integer),
            sa.column("at", sa.DateTime(timezone=True)),
            sa.column("d", sa.Float),
            sa.column("t", sa.Float),
            sa.column("mt", JSONB),
            sa.column("tg", ARRAY(sa.Text)),
        )
        .render_derived(name="steps", with_types=True)
    )
    c = rows.c
    names = [
        "kind",
        "payload",
        "queue",
        "priority",
        "max_attempts",
        "run_at",
        "timeout",
        "status",
        "workflow_id",
        "step",
        "meta",
        "tags",
    ]
    values = [
        c.k,
        c.p,
        sa.func.coalesce(c.q, models.DEFAULT_QUEUE),
        sa.func.coalesce(c.pr, models.DEFAULT_PRIORITY),
        c.m,
        sa.func.coalesce(c.at, _common.clock(None) + _common.seconds(sa.func.coalesce(c.d, 0.0))),
        c.t,
        sa.case((c.w, _common.status(JobStatus.WAITING)), else_=_common.status(JobStatus.QUEUED)),
        sa.bindparam("workflow_id", type_=sa.Uuid),
        c.s,
        c.mt,
        c.tg,
    ]
    return pg_insert(jobs).from_select(names, sa.select(*values)).returning(jobs.c.id, jobs.c.step)


def insert_edges() -> sa.Insert:
    """Insert edges from one JSON array of ``{"c": child_id, "p": parent_id, "r": requires}``
    (parameters ``rows`` and ``workflow_id``)."""
    rows = (
        sa.func.jsonb_to_recordset(sa.cast(sa.bindparam("rows", type_=sa.Text), JSONB))
        .table_valued(
            sa.column("c", sa.BigInteger), sa.column("p", sa.BigInteger), sa.column("r", sa.Text)
        )
        .render_derived(name="edges", with_types=True)
    )
    return pg_insert(workflow_edges).from_select(
        ["child_id", "parent_id", "workflow_id", "requires"],
        sa.select(rows.c.c, rows.c.p, sa.bindparam("workflow_id", type_=sa.Uuid), rows.c.r),
    )


def workflow_of(job_id: int) -> sa.Select[Any]:
    """The ``workflow_id`` of a live job (NULL for a job outside workflows; no row: no job)."""
    return sa.select(jobs.c.workflow_id).where(
        jobs.c.id == sa.bindparam("job_id", job_id, sa.BigInteger)
    )


def step_ids(workflow_id: Any) -> sa.Select[Any]:
    """``step, id`` of every step of a workflow, live or archived."""
    wid = sa.bindparam("workflow_id", workflow_id, sa.Uuid)
    archive = models.jobs_archive
    live = sa.select(jobs.c.step, jobs.c.id).where(jobs.c.workflow_id == wid)
    archived = sa.select(archive.c.step, archive.c.id).where(archive.c.workflow_id == wid)
    return sa.union_all(live, archived)  # type: ignore[return-value]


def resolve(parent_ids: list[int]) -> sa.Select[Any]:
    """Resolve the edges of these parents if they ended (``jobs_workflow_resolve``);
    returns how many steps were released."""
    ids = sa.bindparam("parent_ids", parent_ids, ARRAY(sa.BigInteger))
    return sa.select(sa.func.jobs_workflow_resolve(ids, type_=sa.Integer))


def sweep(*, limit: int = 1000) -> sa.Select[Any]:
    """The repair path: resolve up to ``limit`` parents that ended (or are gone) with an
    edge still unresolved. Returns the number of steps released.

    Nothing should be left for it: the trigger resolves a parent's edges in the
    transaction that ends it. What it catches is an edge whose parent ended in a
    transaction that could not see it (a step appended to a running workflow while its
    dependency was finishing), or a parent ended while the triggers were disabled.
    """
    parent = jobs.alias("parent")
    ended = parent.c.status.in_(_statuses(*models.FINISHED_STATUSES))
    stuck = (
        sa.select(workflow_edges.c.parent_id)
        .distinct()
        .select_from(workflow_edges.outerjoin(parent, parent.c.id == workflow_edges.c.parent_id))
        .where(workflow_edges.c.parent_outcome.is_(None), sa.or_(parent.c.id.is_(None), ended))
        .limit(sa.bindparam("limit", limit, sa.Integer))
        .cte("stuck")
        .prefix_with("MATERIALIZED")
    )
    ids = sa.func.coalesce(
        sa.func.array_agg(stuck.c.parent_id), sa.cast(sa.literal("{}"), ARRAY(sa.BigInteger))
    )
    return sa.select(sa.func.jobs_workflow_resolve(ids, type_=sa.Integer))


def steps(workflow_id: Any) -> sa.Select[Any]:
    """Every step of a workflow, live and archived: ``id, step, kind, status, last_error,
    waiting_on`` (the names of the dependencies that have not ended), ``archived``,
    ``depends_on`` (the names of all its live dependencies), in id order."""
    wid = sa.bindparam("workflow_id", workflow_id, sa.Uuid)
    archive = models.jobs_archive
    parent = jobs.alias("parent")
    waiting_on = (
        sa.select(
            sa.func.coalesce(
                sa.func.array_agg(sa.func.coalesce(parent.c.step, sa.cast(parent.c.id, sa.Text))),
                sa.cast(sa.literal("{}"), ARRAY(sa.Text)),
            )
        )
        .select_from(workflow_edges.join(parent, parent.c.id == workflow_edges.c.parent_id))
        .where(workflow_edges.c.child_id == jobs.c.id, workflow_edges.c.parent_outcome.is_(None))
        .scalar_subquery()
    )
    # Every dependency, ended or not (a deleted one by its id; an archived step's edges
    # went with it: none).
    depends_on = (
        sa.select(
            sa.func.coalesce(
                sa.func.array_agg(
                    sa.func.coalesce(parent.c.step, sa.cast(workflow_edges.c.parent_id, sa.Text))
                ),
                sa.cast(sa.literal("{}"), ARRAY(sa.Text)),
            )
        )
        .select_from(workflow_edges.outerjoin(parent, parent.c.id == workflow_edges.c.parent_id))
        .where(workflow_edges.c.child_id == jobs.c.id)
        .scalar_subquery()
    )
    live = sa.select(
        jobs.c.id,
        jobs.c.step,
        jobs.c.kind,
        jobs.c.status,
        jobs.c.last_error,
        waiting_on.label("waiting_on"),
        sa.false().label("archived"),
        depends_on.label("depends_on"),
    ).where(jobs.c.workflow_id == wid)
    archived = sa.select(
        archive.c.id,
        archive.c.step,
        archive.c.kind,
        archive.c.status,
        archive.c.last_error,
        sa.cast(sa.literal("{}"), ARRAY(sa.Text)).label("waiting_on"),
        sa.true().label("archived"),
        sa.cast(sa.literal("{}"), ARRAY(sa.Text)).label("depends_on"),
    ).where(archive.c.workflow_id == wid)
    found = sa.union_all(live, archived).subquery("found")
    return sa.select(found).order_by(found.c.id)


def cancel_workflow(workflow_id: Any) -> sa.Update:
    """Every waiting or queued step of a workflow to cancelled, in one statement; RETURNING
    the ids. (Running steps are asked to stop by :func:`sqla_jobs.sql.admin.request_cancel`.)"""
    wid = sa.bindparam("workflow_id", workflow_id, sa.Uuid)
    return (
        sa.update(jobs)
        .where(
            jobs.c.workflow_id == wid,
            jobs.c.status.in_(_statuses(JobStatus.WAITING, JobStatus.QUEUED)),
        )
        .values(
            status=_common.status(JobStatus.CANCELLED),
            finished_at=_common.clock(None),
            locked_until=None,
            last_error=sa.bindparam("note", CANCELLED_WORKFLOW, sa.Text),
        )
        .returning(jobs.c.id)
    )


def running_steps(workflow_id: Any) -> sa.Select[Any]:
    wid = sa.bindparam("workflow_id", workflow_id, sa.Uuid)
    return sa.select(jobs.c.id).where(
        jobs.c.workflow_id == wid, jobs.c.status == _common.status(JobStatus.RUNNING)
    )


def retry_set(workflow_id: Any, *, downstream: bool) -> sa.Select[Any]:
    """Ids of the steps a retry runs again: every step that ended dead or cancelled and,
    with ``downstream``, every step that depends on one of them, transitively (done ones
    too); running and waiting steps are left alone."""
    wid = sa.bindparam("workflow_id", workflow_id, sa.Uuid)
    failed = sa.select(jobs.c.id).where(
        jobs.c.workflow_id == wid,
        jobs.c.status.in_(_statuses(JobStatus.DEAD, JobStatus.CANCELLED)),
    )
    if not downstream:
        return failed
    picked = failed.cte("picked", recursive=True)
    below = sa.select(workflow_edges.c.child_id).join(
        picked, workflow_edges.c.parent_id == picked.c.id
    )
    picked = picked.union(below)
    return (
        sa.select(jobs.c.id)
        .where(
            jobs.c.id.in_(sa.select(picked.c.id)),
            jobs.c.status.in_(_statuses(*models.FINISHED_STATUSES)),
        )
        .order_by(jobs.c.id)
    )


def reopen_edges(ids: list[int]) -> sa.Update:
    """Edges between two retried steps wait for the parent again (a dependent that is
    not retried keeps the outcome it ran after)."""
    chosen = sa.bindparam("ids", ids, ARRAY(sa.BigInteger))
    return (
        sa.update(workflow_edges)
        .where(
            workflow_edges.c.parent_id == sa.any_(chosen),
            workflow_edges.c.child_id == sa.any_(chosen),
        )
        .values(parent_outcome=None)
    )


def reopen_steps(ids: list[int]) -> sa.Update:
    """The retried steps: waiting if a dependency has not ended, else queued and ready
    now, with a fresh set of attempts (as :func:`sqla_jobs.sql.admin.retry_jobs`)."""
    chosen = sa.bindparam("ids", ids, ARRAY(sa.BigInteger))
    unmet = sa.exists().where(
        workflow_edges.c.child_id == jobs.c.id, workflow_edges.c.parent_outcome.is_(None)
    )
    return (
        sa.update(jobs)
        .where(
            jobs.c.id == sa.any_(chosen),
            jobs.c.status.in_(_statuses(*models.FINISHED_STATUSES)),
        )
        .values(
            status=sa.case(
                (unmet, _common.status(JobStatus.WAITING)),
                else_=_common.status(JobStatus.QUEUED),
            ),
            attempts=0,
            run_at=_common.clock(None),
            locked_until=None,
            worker=None,
            finished_at=None,
            cancel_requested_at=None,
            snoozes=0,
        )
        .returning(jobs.c.id, jobs.c.status)
    )


def upstream_results(job_id: int) -> sa.Select[Any]:
    """``step, id, status, result`` of each dependency of a step, live or archived."""
    child = sa.bindparam("job_id", job_id, sa.BigInteger)
    archive = models.jobs_archive
    parents = sa.select(workflow_edges.c.parent_id).where(workflow_edges.c.child_id == child)
    live = sa.select(jobs.c.step, jobs.c.id, jobs.c.status, jobs.c.result).where(
        jobs.c.id.in_(parents)
    )
    archived = sa.select(archive.c.step, archive.c.id, archive.c.status, archive.c.result).where(
        archive.c.id.in_(parents)
    )
    found = sa.union_all(live, archived).subquery("found")
    return sa.select(found).order_by(found.c.id)


def unfinished_workflow(table: sa.Table) -> sa.ColumnElement[bool]:
    """True for a row of ``table`` whose workflow still has a step that has not ended:
    the archiver leaves such rows where they are (a dependent reads their results)."""
    other = jobs.alias("step")
    return sa.and_(
        table.c.workflow_id.is_not(None),
        sa.exists().where(
            other.c.workflow_id == table.c.workflow_id,
            other.c.status.in_(_statuses(*OPEN_STATUSES)),
        ),
    )
