"""Workflow statements (revision 0014): insert steps and edges, the repair sweep, status,
cancel, retry and upstream results.

The release itself is not here: it is ``jobs_workflow_resolve``, a database function
the migration installs, run by a trigger in the transaction of whatever statement ended
a step (see [``sqla_jobs.workflows``][sqla_jobs.workflows]). ``sweep`` calls the same function.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.selectable import LateralFromClause

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
    name), ``k``, ``p``, ``w`` (true: the step waits for dependencies), ``l`` (true: no
    step depends on it, revision 0021's ``workflow_leaf``) and the optional
    ``q``, ``pr``, ``m``, ``at``, ``d``, ``t``, ``mt``, ``tg`` of
    ``sqla_jobs.sql.enqueue.insert_jobs_json``.
    No idempotency key: a step skipped by a conflict would leave a hole in the graph.
    """
    rows = (
        sa.func.jsonb_to_recordset(sa.cast(sa.bindparam("rows", type_=sa.Text), JSONB))
        .table_valued(
            sa.column("s", sa.Text),
            sa.column("k", sa.Text),
            sa.column("p", JSONB),
            sa.column("w", sa.Boolean),
            sa.column("l", sa.Boolean),
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
        "workflow_leaf",
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
        c.l,
        c.mt,
        c.tg,
    ]
    return pg_insert(jobs).from_select(names, sa.select(*values)).returning(jobs.c.id, jobs.c.step)


def insert_edges() -> sa.Insert:
    """Insert edges from one JSON array of ``{"c": child_id, "p": parent_id, "r": requires}``
    and, on an edge from a step that existed before this append, ``"a": true``
    (parameters ``rows`` and ``workflow_id``).

    An appended edge's parent may be a leaf (``workflow_leaf``, which its done-mark's
    trigger does not list): a deferred trigger (revision 0021) clears that at commit and
    resolves the parent if it ended meanwhile.
    """
    rows = (
        sa.func.jsonb_to_recordset(sa.cast(sa.bindparam("rows", type_=sa.Text), JSONB))
        .table_valued(
            sa.column("c", sa.BigInteger),
            sa.column("p", sa.BigInteger),
            sa.column("r", sa.Text),
            sa.column("a", sa.Boolean),
        )
        .render_derived(name="edges", with_types=True)
    )
    return pg_insert(workflow_edges).from_select(
        ["child_id", "parent_id", "workflow_id", "requires", "appended"],
        sa.select(
            rows.c.c, rows.c.p, sa.bindparam("workflow_id", type_=sa.Uuid), rows.c.r, rows.c.a
        ),
    )


def workflow_of(job_id: int) -> sa.Select[Any]:
    """The ``workflow_id`` of a live job (NULL for a job outside workflows; no row: no job)."""
    return sa.select(jobs.c.workflow_id).where(
        jobs.c.id == sa.bindparam("job_id", job_id, sa.BigInteger)
    )


def hold_steps(workflow_id: Any, table: sa.Table) -> sa.Select[Any]:
    """One step of a workflow in ``table`` (``jobs`` or ``jobs_archive``), locked ``FOR KEY
    SHARE`` until the transaction ends: what a transaction appending steps holds.

    The archiver and ``prune`` take a workflow only with every step of it locked (``FOR
    UPDATE SKIP LOCKED``, ``sqla_jobs.sql.admin.archive_batch``), as their snapshot
    showed it: without this lock, steps appended by a transaction that had not committed
    yet were invisible to that snapshot, and the workflow went without them (split: its
    old steps archived, the new ones waiting on them in ``jobs``). With it, a workflow
    being appended to stays whole for the next batch; an archiver that locked first makes
    the append wait for its commit, and the append then finds the steps archived (it may
    append to an archived workflow). ``KEY SHARE``: it does not block a step's own
    updates (its done-mark), only the archiver's and prune's row locks and deletes.
    """
    wid = sa.bindparam("workflow_id", workflow_id, sa.Uuid)
    return (
        sa.select(table.c.id)
        .where(table.c.workflow_id == wid)
        .limit(1)
        .with_for_update(key_share=True, read=True)
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
    child = jobs.alias("child")
    ended = parent.c.status.in_(_statuses(*models.FINISHED_STATUSES))
    stuck = (
        sa.select(workflow_edges.c.parent_id)
        .distinct()
        .select_from(
            workflow_edges.join(child, child.c.id == workflow_edges.c.child_id).outerjoin(
                parent, parent.c.id == workflow_edges.c.parent_id
            )
        )
        .where(workflow_edges.c.parent_outcome.is_(None), sa.or_(parent.c.id.is_(None), ended))
        # Only a waiting child has anything left to resolve: the edge of a child released
        # alone by its parent stays NULL (revision 0020), and is not stuck.
        .where(child.c.status == _common.status(JobStatus.WAITING))
        .limit(sa.bindparam("limit", limit, sa.Integer))
        .cte("stuck")
        .prefix_with("MATERIALIZED")
    )
    ids = sa.func.coalesce(
        sa.func.array_agg(stuck.c.parent_id), sa.cast(sa.literal("{}"), ARRAY(sa.BigInteger))
    )
    return sa.select(sa.func.jobs_workflow_resolve(ids, type_=sa.Integer))


def _waiting_on() -> sa.ScalarSelect[Any]:
    """The names of a live step's dependencies that have not ended, in their job ids'
    order (stable: a retry does not reorder them)."""
    parent = jobs.alias("parent")
    return (
        sa.select(
            sa.func.coalesce(
                sa.func.array_agg(
                    aggregate_order_by(
                        sa.func.coalesce(parent.c.step, sa.cast(parent.c.id, sa.Text)),
                        workflow_edges.c.parent_id,
                    )
                )
                # A NULL edge whose parent ended: its child was released alone (revision
                # 0018). Tested in the aggregate, on the parent's row as fetched, not as a
                # filter of the parent's primary-key probe.
                .filter(parent.c.status.not_in(_statuses(*models.FINISHED_STATUSES))),
                sa.cast(sa.literal("{}"), ARRAY(sa.Text)),
            )
        )
        .select_from(workflow_edges.join(parent, parent.c.id == workflow_edges.c.parent_id))
        .where(workflow_edges.c.child_id == jobs.c.id, workflow_edges.c.parent_outcome.is_(None))
        .scalar_subquery()
    )


def _depends_on() -> sa.ScalarSelect[Any]:
    """Every dependency of a live step, ended or not (a deleted one by its id; an
    archived step's edges went with it: none), in their job ids' order (stable: a
    retry, which rewrites the edges, does not reorder them)."""
    parent = jobs.alias("parent")
    return (
        sa.select(
            sa.func.coalesce(
                sa.func.array_agg(
                    aggregate_order_by(
                        sa.func.coalesce(
                            parent.c.step, sa.cast(workflow_edges.c.parent_id, sa.Text)
                        ),
                        workflow_edges.c.parent_id,
                    )
                ),
                sa.cast(sa.literal("{}"), ARRAY(sa.Text)),
            )
        )
        .select_from(workflow_edges.outerjoin(parent, parent.c.id == workflow_edges.c.parent_id))
        .where(workflow_edges.c.child_id == jobs.c.id)
        .scalar_subquery()
    )


def _step_rows(
    live_where: sa.ColumnElement[bool], archived_where: sa.ColumnElement[bool]
) -> sa.Select[Any]:
    archive = models.jobs_archive
    live = sa.select(
        jobs.c.id,
        jobs.c.step,
        jobs.c.kind,
        jobs.c.status,
        jobs.c.last_error,
        _waiting_on().label("waiting_on"),
        sa.false().label("archived"),
        _depends_on().label("depends_on"),
        jobs.c.attempts,
        jobs.c.snoozes,
    ).where(live_where)
    archived = sa.select(
        archive.c.id,
        archive.c.step,
        archive.c.kind,
        archive.c.status,
        archive.c.last_error,
        sa.cast(sa.literal("{}"), ARRAY(sa.Text)).label("waiting_on"),
        sa.true().label("archived"),
        sa.cast(sa.literal("{}"), ARRAY(sa.Text)).label("depends_on"),
        archive.c.attempts,
        archive.c.snoozes,
    ).where(archived_where)
    found = sa.union_all(live, archived).subquery("found")
    return sa.select(found).order_by(found.c.id)


def steps(workflow_id: Any) -> sa.Select[Any]:
    """Every step of a workflow, live and archived: ``id, step, kind, status, last_error,
    waiting_on`` (the names of the dependencies that have not ended), ``archived``,
    ``depends_on`` (the names of all its live dependencies), ``attempts, snoozes`` (is
    ``last_error`` the step's state or history?), in id order."""
    wid = sa.bindparam("workflow_id", workflow_id, sa.Uuid)
    archive = models.jobs_archive
    return _step_rows(jobs.c.workflow_id == wid, archive.c.workflow_id == wid)


def step_page(workflow_id: Any, *, after_id: int | None, limit: int) -> sa.Select[Any]:
    """One page of ``steps``: the ``limit`` steps with the lowest ids above
    ``after_id`` (keyset). The page's ids are picked first, then only its steps'
    dependencies are read: a page of a 10,000-step workflow does not read every step's
    edges.

    The ids come from the workflow's own index entries (``jobs_workflow_finished_idx``,
    ``jobs_archive_workflow_finished_idx``), fenced in MATERIALIZED CTEs: asked for "the
    lowest ids of this workflow", the planner otherwise walks the primary key testing
    each job's workflow (690,000 rows read for the first page of an old workflow in a
    table of 1,000,000). A page costs the workflow's index entries, not the table's.
    """
    wid = sa.bindparam("workflow_id", workflow_id, sa.Uuid)
    n = sa.bindparam("limit", limit, sa.Integer)
    archive = models.jobs_archive

    def ids(table: sa.Table, name: str) -> sa.Select[Any]:
        steps = (
            sa.select(table.c.id)
            .where(table.c.workflow_id == wid)
            .cte(name)
            .prefix_with("MATERIALIZED")
        )
        where = []
        if after_id is not None:
            where.append(steps.c.id > sa.bindparam("after_id", after_id, sa.BigInteger))
        return sa.select(steps.c.id).where(*where).order_by(steps.c.id).limit(n)

    both = sa.union_all(ids(jobs, "live_steps"), ids(archive, "archived_steps")).subquery("both")
    # An array, so each table is read by primary key look-ups whatever its statistics.
    page = sa.func.array(sa.select(both.c.id).order_by(both.c.id).limit(n).scalar_subquery())
    return _step_rows(jobs.c.id == sa.any_(page), archive.c.id == sa.any_(page))


def step_counts(workflow_id: Any) -> sa.Select[Any]:
    """``status, n, archived``: a workflow's steps (live and archived) by status, and how
    many of those are archived."""
    wid = sa.bindparam("workflow_id", workflow_id, sa.Uuid)
    archive = models.jobs_archive
    both = sa.union_all(
        sa.select(jobs.c.status, sa.false().label("archived")).where(jobs.c.workflow_id == wid),
        sa.select(archive.c.status, sa.true()).where(archive.c.workflow_id == wid),
    ).subquery("both")
    return sa.select(
        both.c.status,
        sa.func.count().label("n"),
        sa.func.count().filter(both.c.archived).label("archived"),
    ).group_by(both.c.status)


def cancel_workflow(workflow_id: Any) -> sa.Update:
    """Every waiting or queued step of a workflow to cancelled, in one statement; RETURNING
    the ids. (Running steps are asked to stop by ``sqla_jobs.sql.admin.request_cancel``.)"""
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


def _has_open_dependency(chosen: sa.BindParameter[Any]) -> sa.Exists:
    """The job (``jobs``, the statement's row) has a dependency that has not ended: an
    edge without an outcome whose parent is retried with it (``chosen``: this statement
    does not see the parent's new status) or has not ended. A NULL edge whose parent
    ended is resolved: its child was released alone (revision 0020)."""
    parent = jobs.alias("parent")
    running = (
        sa.select(parent.c.id)
        .where(
            parent.c.id == workflow_edges.c.parent_id,
            parent.c.status.not_in(_statuses(*models.FINISHED_STATUSES)),
        )
        .exists()
    )
    return sa.exists().where(
        workflow_edges.c.child_id == jobs.c.id,
        workflow_edges.c.parent_outcome.is_(None),
        sa.or_(workflow_edges.c.parent_id == sa.any_(chosen), running),
    )


def reopen_steps(ids: list[int]) -> sa.Update:
    """The retried steps: waiting if a dependency has not ended, else queued and ready
    now, with a fresh set of attempts (as ``sqla_jobs.sql.admin.retry_jobs``)."""
    chosen = sa.bindparam("ids", ids, ARRAY(sa.BigInteger))
    unmet = _has_open_dependency(chosen)
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
            **_common.fresh_attempt(None),
        )
        .returning(jobs.c.id, jobs.c.status)
    )


#: How ``last_error`` begins for a step cancelled because an upstream step ended dead,
#: cancelled or deleted (``jobs_workflow_resolve``, revision 0014, writes it).
UPSTREAM_FAILED = "upstream step "


def cancelled_downstream(ids: list[int]) -> sa.Select[Any]:
    """Ids of the steps that depend on one of ``ids`` and were cancelled because an
    upstream step failed, and of theirs, transitively (a step cancelled by an operator,
    or a workflow cancel, is not one: its ``last_error`` says so)."""
    chosen = sa.bindparam("ids", ids, ARRAY(sa.BigInteger))
    child = jobs.alias("child")

    def below(parents: sa.ColumnElement[Any]) -> sa.Select[Any]:
        return (
            sa.select(workflow_edges.c.child_id.label("id"))
            .join(child, child.c.id == workflow_edges.c.child_id)
            .where(
                parents,
                child.c.status == _common.status(JobStatus.CANCELLED),
                child.c.last_error.startswith(UPSTREAM_FAILED, autoescape=True),
            )
        )

    found = below(workflow_edges.c.parent_id == sa.any_(chosen)).cte("found", recursive=True)
    found = found.union(below(workflow_edges.c.parent_id == found.c.id))
    return sa.select(found.c.id).order_by(found.c.id)


def reopen_cancelled(ids: list[int], kept: list[int]) -> sa.Update:
    """The steps ``ids`` (cancelled because an upstream step failed) back to waiting,
    with a fresh set of attempts; RETURNING their ids. ``kept``: the steps that run
    again (the retried ones and these): a step with a dependency that failed and is not
    among them stays cancelled (it would otherwise run without it)."""
    chosen = sa.bindparam("ids", ids, ARRAY(sa.BigInteger))
    kept_ = sa.bindparam("kept", kept, ARRAY(sa.BigInteger))
    failed_elsewhere = sa.exists().where(
        workflow_edges.c.child_id == jobs.c.id,
        workflow_edges.c.requires == "succeeded",
        workflow_edges.c.parent_outcome.is_not(None),
        workflow_edges.c.parent_outcome != "done",
        workflow_edges.c.parent_id != sa.all_(kept_),
    )
    return (
        sa.update(jobs)
        .where(
            jobs.c.id == sa.any_(chosen),
            jobs.c.status == _common.status(JobStatus.CANCELLED),
            sa.not_(failed_elsewhere),
        )
        .values(
            status=_common.status(JobStatus.WAITING),
            **_common.fresh_attempt(None),
        )
        .returning(jobs.c.id)
    )


def failed_dependencies(ids: list[int]) -> sa.Select[Any]:
    """The dependencies that ended dead, cancelled or deleted of the steps ``ids`` (each
    needing them to succeed), not among ``ids`` themselves: ``child_id, child_step,
    workflow_id, parent_id, parent_step, outcome``. A step retried by hand with one of
    these would run without what it needs ([``sqla_jobs.ops.retry_jobs``][sqla_jobs.ops.retry_jobs]
    refuses it)."""
    chosen = sa.bindparam("ids", ids, ARRAY(sa.BigInteger))
    child = jobs.alias("child")
    parent = jobs.alias("parent")
    archive = models.jobs_archive
    return (
        sa.select(
            workflow_edges.c.child_id,
            child.c.step.label("child_step"),
            child.c.workflow_id,
            workflow_edges.c.parent_id,
            sa.func.coalesce(parent.c.step, archive.c.step).label("parent_step"),
            workflow_edges.c.parent_outcome.label("outcome"),
        )
        .select_from(
            workflow_edges.join(child, child.c.id == workflow_edges.c.child_id)
            .outerjoin(parent, parent.c.id == workflow_edges.c.parent_id)
            .outerjoin(archive, archive.c.id == workflow_edges.c.parent_id)
        )
        .where(
            workflow_edges.c.child_id == sa.any_(chosen),
            workflow_edges.c.requires == "succeeded",
            workflow_edges.c.parent_outcome.is_not(None),
            workflow_edges.c.parent_outcome != "done",
            workflow_edges.c.parent_id != sa.all_(chosen),
        )
        .order_by(workflow_edges.c.child_id, workflow_edges.c.parent_id)
    )


def wait_again(ids: list[int]) -> sa.Update:
    """The queued steps among ``ids`` with a dependency not ended (it is retried with them)
    back to waiting: they run after it, not beside it. RETURNING their ids."""
    chosen = sa.bindparam("ids", ids, ARRAY(sa.BigInteger))
    unmet = _has_open_dependency(chosen)
    return (
        sa.update(jobs)
        .where(
            jobs.c.id == sa.any_(chosen),
            jobs.c.status == _common.status(JobStatus.QUEUED),
            unmet,
        )
        .values(status=_common.status(JobStatus.WAITING))
        .returning(jobs.c.id)
    )


def reopen_edges_into(parents: list[int], children: list[int]) -> sa.Update:
    """The edges from ``parents`` (steps that run again) into ``children`` (steps that
    wait again) wait for their parent's new outcome."""
    return (
        sa.update(workflow_edges)
        .where(
            workflow_edges.c.parent_id
            == sa.any_(sa.bindparam("parents", parents, ARRAY(sa.BigInteger))),
            workflow_edges.c.child_id
            == sa.any_(sa.bindparam("children", children, ARRAY(sa.BigInteger))),
        )
        .values(parent_outcome=None)
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


def has_step_in(workflow_id: sa.ColumnElement[Any], *statuses: JobStatus) -> sa.ColumnElement[bool]:
    """True when the workflow ``workflow_id`` (a column of the outer row) has a step in
    ``jobs`` in one of ``statuses`` (none given: any step): one probe of
    ``jobs_workflow_status_idx`` per status (of ``jobs_workflow_finished_idx``).

    A scalar sub-select with ``LIMIT 1``, not ``EXISTS``: inside the archiver's ``OR``
    the planner made the ``EXISTS`` a hashed sub-plan, reading every open (or every
    dead and cancelled) job of the table once per batch instead of probing per row.
    """
    other = jobs.alias("other_step")
    probe = (
        sa.select(sa.literal_column("1"))
        .where(
            other.c.workflow_id == workflow_id,
            *([other.c.status.in_(_statuses(*statuses))] if statuses else []),
        )
        .limit(1)
        .scalar_subquery()
    )
    return probe.is_not(None)


def unfinished_workflow(table: sa.Table) -> sa.ColumnElement[bool]:
    """True for a row of ``table`` whose workflow still has a step that has not ended:
    the archiver leaves such rows where they are (a dependent reads their results)."""
    return sa.and_(
        table.c.workflow_id.is_not(None), has_step_in(table.c.workflow_id, *OPEN_STATUSES)
    )


#: ``list_workflows(state=...)``: workflows with a step not ended yet, workflows whose
#: every step ended, workflows with a step that ended dead or cancelled (running or not).
LIST_STATES = ("running", "finished", "failed")


def _below(
    bound: sa.ColumnElement[Any] | None,
    status: JobStatus | None,
    *,
    inclusive: bool = False,
    table: sa.Table = jobs,
) -> sa.ScalarSelect[Any]:
    """The highest workflow id below ``bound`` (of a step in ``status``) in ``table``: one
    descent of its ``(workflow_id, finished_at)`` index (or, with a status, of its
    ``(status, workflow_id)`` one)."""
    conditions: list[sa.ColumnElement[bool]] = [table.c.workflow_id.is_not(None)]
    if bound is not None:
        conditions.append(
            table.c.workflow_id <= bound if inclusive else table.c.workflow_id < bound
        )
    if status is not None:
        # The status as a sub-select, not a literal: the planner cannot then prove the
        # predicate of jobs_claim_idx (status = 'queued') or jobs_lease_idx ('running',
        # before revision 0018) and pick one of them, filtering every queued job of the
        # table by workflow and sorting them, when statistics say few are queued (seen
        # on an empty table).
        conditions.append(table.c.status == sa.select(_common.status(status)).scalar_subquery())
    # ORDER BY ... LIMIT 1, not max(): PostgreSQL has no max(uuid).
    return (
        sa.select(table.c.workflow_id)
        .where(*conditions)
        .order_by(table.c.workflow_id.desc())
        .limit(1)
        .scalar_subquery()
    )


def _next(bound: sa.ColumnElement[Any] | None, state: str | None) -> sa.ColumnElement[Any]:
    archive = models.jobs_archive
    if state == "running":
        # An archived workflow has ended: only ``jobs`` holds running ones.
        return sa.func.greatest(*(_below(bound, s) for s in OPEN_STATUSES))
    if state == "failed":
        failed = (JobStatus.DEAD, JobStatus.CANCELLED)
        return sa.func.greatest(
            *(_below(bound, s, table=t) for t in (jobs, archive) for s in failed)
        )
    # One descent per status and table (an IN list would not give the ids in order on
    # PostgreSQL 15): the highest of them is the next workflow (greatest skips NULLs).
    return sa.func.greatest(_below(bound, None), _below(bound, None, table=archive))


def set_jit(value: str | None = None) -> sa.Select[Any]:
    """``jit`` set to ``value`` for the rest of the transaction (as ``SET LOCAL``);
    returns the value before. (Without ``value``: only reads it.)

    ``list_workflows`` is run with JIT off: under misleading statistics (taken when
    the table was empty) its plan is the same index descents, but its estimated cost
    (5,000 steps a workflow, 50 times) passes ``jit_above_cost``, and compiling it took
    650 ms of a 750 ms page on 1,000,000 jobs; the plan itself ran in 2 ms.
    """
    before = sa.func.current_setting(sa.literal_column("'jit'")).label("before")
    if value is None:
        return sa.select(before)
    changed = sa.func.set_config(
        sa.literal_column("'jit'"), sa.bindparam("jit", value, sa.Text), sa.true()
    )
    return sa.select(before, changed.label("now"))


def list_workflows(*, state: str | None, before: bool, limit: int = 50) -> sa.Select[Any]:
    """One page of workflows, newest (highest id) first: ``id, size`` and a count per
    status, ``created_at`` (the first step's), ``finished_at`` (the last step's end, NULL
    while a step has not ended). Parameters: ``before`` (with ``before=True``: the ids
    below it) and ``limit``.

    Workflow ids are time-ordered (UUID version 7), so "newest first" is a walk down
    the ids: a recursive CTE that takes the highest id below the previous one, an index
    descent each (a loose index scan), stopped by the LIMIT after ``limit`` workflows.
    Each workflow's figures are one aggregate over its steps (``jobs_workflow_finished_idx``):
    a page costs its workflows' steps, not the table. ``state="finished"`` walks every
    workflow and skips those with a step not ended (three index descents each).
    Archived workflows are walked too (``jobs_archive``'s indexes of revision 0017), and
    a workflow's figures count its steps in both tables (``archived``: how many are in
    ``jobs_archive``).
    """
    if state is not None and state not in LIST_STATES:
        raise ValueError(f"state must be one of {LIST_STATES}, got {state!r}")
    cursor = sa.bindparam("before", type_=sa.Uuid) if before else None
    first = sa.select(_next(cursor, state).label("id")).cte("walk", recursive=True)
    prior = first.alias("prior")
    walk = first.union_all(sa.select(_next(prior.c.id, state)).where(prior.c.id.is_not(None)))
    conditions: list[sa.ColumnElement[bool]] = [walk.c.id.is_not(None)]
    if state == "finished":
        # "Has a step in this status" as the same ordered descent (the highest id at or
        # below this one is this one), not an EXISTS: under misleading statistics the
        # planner answered that from jobs_claim_idx (or the old jobs_lease_idx), filtering every
        # queued or running job by workflow.
        conditions.append(
            sa.not_(
                sa.or_(
                    *(
                        _below(walk.c.id, s, inclusive=True).is_not_distinct_from(walk.c.id)
                        for s in OPEN_STATUSES
                    )
                )
            )
        )
    page = (
        sa.select(walk.c.id)
        .where(*conditions)
        .limit(sa.bindparam("limit", limit, sa.Integer))
        .subquery("page")
    )

    # Its steps in both tables (a finished workflow is archived as a unit, and listed
    # after that as before): one aggregate per table and workflow (LATERAL, an index
    # range each), not a GROUP BY of the page, which sorted every step it counted.
    def figures(table: sa.Table, name: str) -> LateralFromClause:
        open_ = sa.func.count().filter(table.c.status.in_(_statuses(*OPEN_STATUSES)))
        return (
            sa.select(
                sa.func.count().label("size"),
                *(
                    sa.func.count().filter(table.c.status == _common.status(s)).label(s.value)
                    for s in JobStatus
                ),
                open_.label("open"),
                sa.func.min(table.c.created_at).label("created_at"),
                sa.func.max(table.c.finished_at).label("finished_at"),
            )
            .where(table.c.workflow_id == page.c.id)
            .lateral(name)
        )

    live, gone = figures(jobs, "live"), figures(models.jobs_archive, "gone")
    return (
        sa.select(
            page.c.id,
            (live.c.size + gone.c.size).label("size"),
            *((live.c[s.value] + gone.c[s.value]).label(s.value) for s in JobStatus),
            gone.c.size.label("archived"),
            sa.func.least(live.c.created_at, gone.c.created_at).label("created_at"),
            sa.case(
                (
                    live.c.open == sa.literal_column("0"),
                    sa.func.greatest(live.c.finished_at, gone.c.finished_at),
                )
            ).label("finished_at"),
        )
        .select_from(page.join(live, sa.true()).join(gone, sa.true()))
        .order_by(page.c.id.desc())
    )
