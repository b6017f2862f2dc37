"""The ``jobs`` table as a declarative model.

``Base.metadata`` is the schema sqla_jobs owns. It has its own ``DeclarativeBase`` and
naming convention so an application can list it beside its own metadata in Alembic's
``target_metadata`` without name clashes, and so constraint names are stable across
autogenerate runs.

Partial indexes keep the hot paths small no matter how many finished rows pile up:

* ``jobs_claim_idx (priority, run_at) WHERE status = 'queued'``: the claim walks it one
  priority at a time with an index range bound on ``run_at``, so future (scheduled) jobs
  are never scanned.
* ``jobs_finished_idx (status, finished_at) WHERE status IN ('done', 'dead', 'cancelled')``
  (revision 0002): "done in the last hour", "how many dead" and "finished before the
  archive cut-off" are range scans on it, never a scan of millions of finished rows.

No index holds ``locked_until`` (revision 0018 dropped 0001's ``jobs_lease_idx
(locked_until) WHERE status = 'running'``): a heartbeat sets only the lease, so it is a
HOT update (no index entry written, no dead version left for vacuum, which an app's
long transaction may hold off). Expired leases are found among the running jobs of
``jobs_status_id_idx``, which the fleet's concurrency bounds.

Revision 0010 adds what the dashboard's jobs page filters by, each giving one page in id
order from a keyset cursor: ``jobs_status_id_idx (status, id)``, ``jobs_kind_id_idx
(kind, id)``, ``jobs_queue_id_idx (queue, id)`` and ``jobs_payload_idx`` (GIN,
``jsonb_path_ops``, for ``payload @> ...``); revision 0012 adds ``jobs_created_at_idx
(created_at, id)``, where a ``newer_than`` page finds the lowest id created since its
bound; revision 0016 replaces it with ``jobs_created_hour_idx (date_bin('1 hour',
created_at, origin), id) INCLUDE (created_at)``, where an age filter's page finds the
lowest id created since its bound or the highest created before it (one descent per
hour). Each is written by every insert and status change (see benchmarks/README.md for
the cost).

Revision 0013 adds ``meta`` (jsonb) and ``tags`` (text[]), the application's metadata of
a job, with GIN indexes ``jobs_meta_idx`` (``jsonb_path_ops``) and ``jobs_tags_idx`` for
``meta @> ...`` and ``tags @> ARRAY[...]``; both columns are NULL for a job without any,
and both indexes are partial (``IS NOT NULL``) so such a job's status changes write no
entry to them.

Revision 0014 adds ``jobs_workflow_id_idx (workflow_id)`` and revision 0015
``jobs_workflow_status_idx (status, workflow_id)``, both partial (``workflow_id IS NOT
NULL``): a workflow's steps, and the list of workflows by state (one descent per
workflow); 0015 also ``jobs_archive_workflow_id_idx`` (a workflow's archived steps).
Revision 0017 puts ``finished_at`` after ``workflow_id`` in both workflow indexes
(``jobs_workflow_finished_idx``, ``jobs_archive_workflow_finished_idx``, replacing
them): the archiver and prune ask "when did this workflow's last step end?" per row.

Finished rows are moved to ``jobs_archive`` ([``JobArchive``][sqla_jobs.models.JobArchive], same
columns plus ``archived_at``) by [``sqla_jobs.ops.archive``][sqla_jobs.ops.archive], so the live
table stays small.

The seed design had one index over ``status IN ('queued', 'running')`` and a claim with
an ``OR (status = 'running' AND locked_until < now())`` branch. That branch cannot be
bounded by a ``run_at`` range, so we split it: the claim reads queued rows only, and
expired leases are requeued by a separate statement (see ``lease.rescue_expired``).
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    SessionTransaction,
    mapped_column,
    synonym,
    validates,
)

from sqla_jobs import validation
from sqla_jobs.exceptions import InvalidJobError

NAMING_CONVENTION = {
    "ix": "%(table_name)s_%(column_0_N_name)s_idx",
    "uq": "%(table_name)s_%(column_0_N_name)s_key",
    "ck": "%(table_name)s_%(constraint_name)s_check",
    "fk": "%(table_name)s_%(column_0_name)s_fkey",
    "pk": "%(table_name)s_pkey",
}

#: Defaults applied by the database when a job does not say otherwise.
DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 0
#: A job's ``max_attempts`` when neither it nor its handler sets one. A job enqueued
#: without one stores NULL (revision 0008); the worker that claims it writes its
#: handler's value, else this one.
DEFAULT_MAX_ATTEMPTS = 8


def _statement_time() -> sa.ColumnElement[datetime]:
    # The inserting statement's time, not its transaction's start (now()): a job
    # enqueued late in a long transaction (a handler's, an app's request) is created
    # and ready when that statement runs (revision 0008).
    return sa.func.statement_timestamp()


class Base(DeclarativeBase):
    """Declarative base for sqla_jobs' tables; add ``Base.metadata`` to your Alembic env."""

    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class JobStatus(str, enum.Enum):
    """Life cycle: queued -> running -> done | queued (retry, snooze) | dead | cancelled;
    queued -> cancelled.

    ``cancelled`` (revision 0002) is set by an operator
    ([``sqla_jobs.ops.cancel_jobs``][sqla_jobs.ops.cancel_jobs]) on a queued job, by the worker when
    an operator cancelled the job while it ran (revision 0005), or when its handler raised
    [``Discard``][sqla_jobs.Discard]. Workers claim ``queued`` rows only, so a worker built before
    0002 never sees a cancelled job.
    """

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"
    #: A workflow step whose dependencies have not all ended (revision 0014_workflows):
    #: the claim never reads it; the step that ends its last dependency queues it.
    WAITING = "waiting"


#: Terminal statuses: rows that only operators (retry, delete, archive) change again.
FINISHED_STATUSES = (JobStatus.DONE, JobStatus.DEAD, JobStatus.CANCELLED)


job_status = sa.Enum(
    JobStatus,
    name="job_status",
    values_callable=lambda members: [m.value for m in members],
    validate_strings=True,
)


@dataclass(frozen=True, slots=True)
class DelayedRunAt:
    """The ``run_at`` of a ``Job(delay=...)`` until it is flushed: ``seconds`` after its insert.

    Never written as it is: the flush inserts such a job with ``enqueue``'s statement
    (see ``sqla_jobs.producer``), which adds the delay to the database's clock.
    """

    seconds: float


#: The storage parameters of ``jobs`` (revision 0022): autovacuum starts after 1,000
#: dead rows plus 1% of the table's rows (PostgreSQL's default: 50 plus 20%). SQLAlchemy
#: neither emits nor reflects a table's storage parameters, so Alembic cannot compare
#: them: a test reads ``pg_class.reloptions`` of a database at head against this.
JOBS_STORAGE_PARAMETERS: dict[str, str] = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
}


class Job(Base):
    """One background job. ``session.add(Job(kind=..., payload=...))`` enqueues it.

    It takes what [``enqueue``][sqla_jobs.enqueue] takes: ``kind``, ``payload``, ``key`` (the
    ``idempotency_key`` column, either name), ``run_at`` or ``delay`` (seconds or a
    timedelta, not both), ``queue``, ``priority``, ``max_attempts``, ``timeout``,
    ``meta`` and ``tags``. Values
    are checked when set (see ``sqla_jobs.validation``), so a bad job raises
    [``InvalidJobError``][sqla_jobs.exceptions.InvalidJobError] before the session is flushed.

    At flush, a job with a key or a delay is inserted by ``enqueue``'s own statement
    (``ON CONFLICT (idempotency_key) DO NOTHING``) and ends as ``enqueue`` would: if
    the key is taken, nothing is written, the object leaves the session with ``id``
    None (where ``enqueue`` returns None) and the transaction stays usable; while
    another open transaction holds the key, the flush waits for its outcome. Otherwise
    the object is persistent, filled from the inserted row (``id``, ``run_at``, ...) as
    the ORM's own insert leaves it, and leaves the session again if the transaction (or
    savepoint) that inserted it rolls back. Such a job sets only the values above (a
    ``status`` or ``attempts`` is refused at flush). A flush with a few jobs with neither
    (``sqla_jobs.producer.ONE_BY_ONE_UP_TO``) that set only those values inserts
    them the same way, for speed; more, or any setting a worker's column, keep the ORM's
    own batched insert (the row is the same). ``session.merge`` keeps all of this;
    ``bulk_save_objects`` and ``session.execute(insert(Job), rows)`` bypass the flush:
    there a taken key raises ``IntegrityError`` (the transaction is aborted), a delay
    fails, and ``insert(Job)`` ignores a ``"key"`` in its rows (write
    ``"idempotency_key"``).

    The flush listeners are registered below, with this class, so they hold however
    ``Job`` was imported; their work is ``sqla_jobs.producer``'s.
    """

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(always=True), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.Text)
    queue: Mapped[str] = mapped_column(sa.Text, server_default=DEFAULT_QUEUE)
    priority: Mapped[int] = mapped_column(sa.SmallInteger, server_default=str(DEFAULT_PRIORITY))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[JobStatus] = mapped_column(job_status, server_default=JobStatus.QUEUED.value)
    run_at: Mapped[datetime] = mapped_column(
        sa.DateTime(timezone=True), server_default=_statement_time()
    )
    locked_until: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    #: NULL: the handler's ``max_attempts``, else 8, written by the worker's claim.
    max_attempts: Mapped[int | None] = mapped_column(sa.Integer)
    idempotency_key: Mapped[str | None] = mapped_column(sa.Text, unique=True)
    worker: Mapped[str | None] = mapped_column(sa.Text)
    last_error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(
        sa.DateTime(timezone=True), server_default=_statement_time()
    )
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # Revision 0005 (job control).
    result: Mapped[Any | None] = mapped_column(JSONB)
    timeout: Mapped[float | None] = mapped_column(sa.Float)
    snoozes: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    cancel_requested_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # Revision 0011 (attempt history): when the latest attempt was claimed, and one
    # object per attempt that ended other than done (see sqla_jobs.sql.lease).
    attempted_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    # Revision 0013 (job metadata): what the application says about the job (tenant,
    # request id, trace context) and its labels; NULL when it said nothing.
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    tags: Mapped[list[str] | None] = mapped_column(ARRAY(sa.Text))
    # Revision 0014 (workflows): the workflow a step belongs to, and its name in it.
    workflow_id: Mapped[uuid.UUID | None] = mapped_column(sa.Uuid)
    step: Mapped[str | None] = mapped_column(sa.Text)
    # Revision 0021: true when no step depends on this one (its end resolves nothing, so
    # the row trigger does not list it); NULL (outside workflows, or written before
    # 0021): it may have dependents.
    workflow_leaf: Mapped[bool | None] = mapped_column(sa.Boolean)

    __table_args__ = (
        sa.CheckConstraint(
            f"priority BETWEEN {validation.MIN_PRIORITY} AND {validation.MAX_PRIORITY}",
            name="priority_range",
        ),
        sa.CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
        sa.Index(
            "jobs_claim_idx",
            "priority",
            "run_at",
            postgresql_where=sa.text("status = 'queued'"),
        ),
        sa.Index(
            "jobs_finished_idx",
            "status",
            "finished_at",
            postgresql_where=sa.text("status IN ('done', 'dead', 'cancelled')"),
        ),
        # Revision 0010: the dashboard's jobs page, one page of one filter in id order.
        sa.Index("jobs_status_id_idx", "status", "id"),
        sa.Index("jobs_kind_id_idx", "kind", "id"),
        sa.Index("jobs_queue_id_idx", "queue", "id"),
        # Revision 0016 (replacing 0012's (created_at, id)): the ids at either side of an
        # age filter's bound, one descent per hour (sqla_jobs.sql.admin._id_bound); the
        # expression is the statements' own, written as PostgreSQL prints it back (so
        # that Alembic's comparison with the database finds it equal).
        sa.Index(
            "jobs_created_hour_idx",
            sa.text(
                "date_bin('01:00:00'::interval, created_at,"
                " '2000-01-01 00:00:00+00'::timestamp with time zone)"
            ),
            "id",
            postgresql_include=["created_at"],
        ),
        sa.Index(
            "jobs_payload_idx",
            "payload",
            postgresql_using="gin",
            postgresql_ops={"payload": "jsonb_path_ops"},
        ),
        # Revision 0013: ``meta @> ...`` and ``tags @> ARRAY[...]`` (list_jobs' filters).
        sa.Index(
            "jobs_meta_idx",
            "meta",
            postgresql_using="gin",
            postgresql_ops={"meta": "jsonb_path_ops"},
            postgresql_where=sa.text("meta IS NOT NULL"),
        ),
        sa.Index(
            "jobs_tags_idx",
            "tags",
            postgresql_using="gin",
            postgresql_where=sa.text("tags IS NOT NULL"),
        ),
        # Revision 0017 (replacing 0014's jobs_workflow_id_idx): a workflow's steps (its
        # status, the archiver's "finished, and when?" as one descent).
        sa.Index(
            "jobs_workflow_finished_idx",
            "workflow_id",
            "finished_at",
            postgresql_where=sa.text("workflow_id IS NOT NULL"),
        ),
        # Revision 0015: the list of workflows by state, one descent per workflow shown.
        sa.Index(
            "jobs_workflow_status_idx",
            "status",
            "workflow_id",
            postgresql_where=sa.text("workflow_id IS NOT NULL"),
        ),
    )

    @validates("kind")
    def _check_kind(self, _key: str, value: object) -> str:
        return validation.check_kind(value)

    @validates("queue")
    def _check_queue(self, _key: str, value: object) -> str:
        return validation.check_queue(value)

    @validates("priority")
    def _check_priority(self, _key: str, value: object) -> int:
        return validation.check_priority(value)

    @validates("max_attempts")
    def _check_max_attempts(self, _key: str, value: object) -> int | None:
        return None if value is None else validation.check_max_attempts(value)

    @validates("run_at")
    def _check_run_at(self, _key: str, value: object) -> datetime | DelayedRunAt | None:
        if type(value) is DelayedRunAt:  # made by __init__ from a checked delay
            return value
        return validation.check_run_at(value)

    @validates("idempotency_key")
    def _check_key(self, _key: str, value: object) -> str | None:
        return validation.check_key(value)

    @validates("timeout")
    def _check_timeout(self, _key: str, value: object) -> float | None:
        return validation.check_timeout(value)

    @validates("payload")
    def _check_payload(self, _key: str, value: object) -> dict[str, Any]:
        return validation.check_payload(value)

    @validates("meta")
    def _check_meta(self, _key: str, value: object) -> dict[str, Any] | None:
        return validation.check_meta(value)

    @validates("tags")
    def _check_tags(self, _key: str, value: object) -> list[str] | None:
        tags = validation.check_tags(value)
        return None if tags is None else list(tags)

    #: ``key=``, as ``enqueue`` spells it; the column is ``idempotency_key``.
    key: Mapped[str | None] = synonym("idempotency_key")

    def __init__(self, *, delay: float | timedelta | None = None, **values: Any) -> None:
        if values.get("key") is not None and values.get("idempotency_key") is not None:
            raise InvalidJobError("give key or idempotency_key, not both")
        seconds = None if delay is None else validation.check_delay(delay)
        if seconds is not None:
            if values.get("run_at") is not None:
                raise InvalidJobError("give run_at or delay, not both")
            values["run_at"] = DelayedRunAt(seconds)
        super().__init__(**values)

    def __repr__(self) -> str:
        return f"<Job id={self.id} kind={self.kind!r} status={self.status}>"


jobs: sa.Table = Job.__table__  # type: ignore[assignment]


class JobArchive(Base):
    """A finished job moved out of ``jobs`` by [``sqla_jobs.ops.archive``][sqla_jobs.ops.archive];
    read-only history.

    Same columns as [``Job``][sqla_jobs.models.Job] plus ``archived_at``. No unique idempotency key:
    a key only deduplicates against live (unarchived) jobs.

    Since revision 0022 the table is partitioned by week of ``archived_at``
    (``PARTITION BY RANGE``): its primary key is ``(id, archived_at)``, as a partitioned
    table's unique index must hold the partition key, while the ORM's identity stays
    ``id`` (``session.get(JobArchive, job_id)``): ids come from ``jobs``, one row each.
    """

    __tablename__ = "jobs_archive"

    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(sa.Text)
    queue: Mapped[str] = mapped_column(sa.Text)
    priority: Mapped[int] = mapped_column(sa.SmallInteger)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[JobStatus] = mapped_column(job_status)
    run_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    locked_until: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(sa.Integer)
    # NULL for a job cancelled (or deleted) before any worker claimed it.
    max_attempts: Mapped[int | None] = mapped_column(sa.Integer)
    idempotency_key: Mapped[str | None] = mapped_column(sa.Text)
    worker: Mapped[str | None] = mapped_column(sa.Text)
    last_error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    result: Mapped[Any | None] = mapped_column(JSONB)
    timeout: Mapped[float | None] = mapped_column(sa.Float)
    snoozes: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    cancel_requested_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    attempted_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    tags: Mapped[list[str] | None] = mapped_column(ARRAY(sa.Text))
    workflow_id: Mapped[uuid.UUID | None] = mapped_column(sa.Uuid)
    step: Mapped[str | None] = mapped_column(sa.Text)
    workflow_leaf: Mapped[bool | None] = mapped_column(sa.Boolean)
    archived_at: Mapped[datetime] = mapped_column(
        sa.DateTime(timezone=True), server_default=_statement_time(), primary_key=True
    )

    __mapper_args__ = {"primary_key": [id]}
    __table_args__ = (
        sa.Index("jobs_archive_finished_at_idx", "finished_at"),
        # Revision 0017 (replacing 0015's jobs_archive_workflow_id_idx): a workflow's
        # archived steps, and prune's "when did its last step end?" as one descent.
        sa.Index(
            "jobs_archive_workflow_finished_idx",
            "workflow_id",
            "finished_at",
            postgresql_where=sa.text("workflow_id IS NOT NULL"),
        ),
        # Revision 0017: the list of workflows, archived ones by state.
        sa.Index(
            "jobs_archive_workflow_status_idx",
            "status",
            "workflow_id",
            postgresql_where=sa.text("workflow_id IS NOT NULL"),
        ),
    )

    def __repr__(self) -> str:
        return f"<JobArchive id={self.id} kind={self.kind!r} status={self.status}>"


jobs_archive: sa.Table = JobArchive.__table__  # type: ignore[assignment]


class PeriodicState(Base):
    """Where each periodic schedule stands: the last tick enqueued (revision 0004).

    One row per schedule name, inserted by the first worker that knows the schedule
    (``last_tick`` = the database's ``now()`` then, so a new schedule does not catch up
    on the time before it existed). Workers lock a schedule's row (``FOR UPDATE SKIP
    LOCKED``) while they enqueue its due ticks and advance ``last_tick`` in the same
    transaction: that is what makes a tick run once across a fleet even after its job
    was archived and its idempotency key freed. A schedule removed from the code keeps
    its row (``sqla-jobs periodic`` shows it as removed); delete the row to forget it.
    """

    __tablename__ = "jobs_periodic"

    name: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    kind: Mapped[str] = mapped_column(sa.Text)
    expression: Mapped[str] = mapped_column(sa.Text)
    last_tick: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    last_job_id: Mapped[int | None] = mapped_column(sa.BigInteger)
    created_at: Mapped[datetime] = mapped_column(
        sa.DateTime(timezone=True), server_default=_statement_time()
    )
    updated_at: Mapped[datetime] = mapped_column(
        sa.DateTime(timezone=True), server_default=_statement_time()
    )

    def __repr__(self) -> str:
        return f"<PeriodicState {self.name!r} last_tick={self.last_tick}>"


jobs_periodic: sa.Table = PeriodicState.__table__  # type: ignore[assignment]


class QueueControl(Base):
    """Fleet-wide control of one queue or one kind (revision 0006): pause and limits.

    One row per ``(scope, name)``, ``scope`` being ``'queue'`` or ``'kind'``. Operators
    set ``paused`` and the ``concurrency`` / ``rate_*`` overrides (``sqla_jobs.control``);
    workers write the limits their code declares into the ``declared_*`` columns at
    start. The effective limit is the override when set, else the declared one. Every
    claim reads this table, so a pause or a limit holds on every host at once.
    """

    __tablename__ = "jobs_controls"

    scope: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    name: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    paused: Mapped[bool] = mapped_column(sa.Boolean, server_default=sa.false())
    concurrency: Mapped[int | None] = mapped_column(sa.Integer)
    declared_concurrency: Mapped[int | None] = mapped_column(sa.Integer)
    rate_count: Mapped[int | None] = mapped_column(sa.Integer)
    rate_seconds: Mapped[float | None] = mapped_column(sa.Float)
    declared_rate_count: Mapped[int | None] = mapped_column(sa.Integer)
    declared_rate_seconds: Mapped[float | None] = mapped_column(sa.Float)
    updated_at: Mapped[datetime] = mapped_column(
        sa.DateTime(timezone=True), server_default=_statement_time()
    )

    __table_args__ = (
        sa.CheckConstraint("scope IN ('queue', 'kind')", name="scope"),
        sa.CheckConstraint("concurrency >= 1", name="concurrency_positive"),
        sa.CheckConstraint("declared_concurrency >= 1", name="declared_concurrency_positive"),
        sa.CheckConstraint(
            "(rate_count IS NULL) = (rate_seconds IS NULL) AND rate_count >= 1 "
            "AND rate_seconds > 0",
            name="rate",
        ),
        sa.CheckConstraint(
            "(declared_rate_count IS NULL) = (declared_rate_seconds IS NULL) "
            "AND declared_rate_count >= 1 AND declared_rate_seconds > 0",
            name="declared_rate",
        ),
    )

    def __repr__(self) -> str:
        return f"<QueueControl {self.scope} {self.name!r}>"


queue_controls: sa.Table = QueueControl.__table__  # type: ignore[assignment]


class RateStart(Base):
    """Starts counted against a rate limit (revision 0006): ``count`` claims at ``started_at``.

    Written by the claim of a rate-limited kind or queue, under that scope's advisory
    lock; rows older than the longest window are deleted by the same claims.
    """

    __tablename__ = "jobs_rate_starts"

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(always=True), primary_key=True)
    scope: Mapped[str] = mapped_column(sa.Text)
    name: Mapped[str] = mapped_column(sa.Text)
    started_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    count: Mapped[int] = mapped_column(sa.Integer)

    __table_args__ = (
        sa.Index("jobs_rate_starts_scope_name_started_at_idx", "scope", "name", "started_at"),
    )


rate_starts: sa.Table = RateStart.__table__  # type: ignore[assignment]


class WorkerRecord(Base):
    """A live worker (revision 0006), refreshed by its heartbeat; gone once ``expires_at`` passes.

    ``expires_at`` is the last heartbeat plus the worker's ``lock_seconds``: a worker
    that died disappears from ``sqla_jobs.control.workers`` when its leases would
    expire, and the next heartbeat of any worker deletes its row.
    """

    __tablename__ = "jobs_workers"

    id: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    host: Mapped[str] = mapped_column(sa.Text)
    pid: Mapped[int] = mapped_column(sa.Integer)
    version: Mapped[str] = mapped_column(sa.Text)
    queues: Mapped[list[str]] = mapped_column(ARRAY(sa.Text))
    kinds: Mapped[list[str]] = mapped_column(ARRAY(sa.Text))
    concurrency: Mapped[int] = mapped_column(sa.Integer)
    started_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    running: Mapped[int] = mapped_column(sa.Integer, server_default="0")

    def __repr__(self) -> str:
        return f"<WorkerRecord {self.id!r}>"


worker_records: sa.Table = WorkerRecord.__table__  # type: ignore[assignment]


#: What a workflow step needs of its dependencies (``jobs_workflow_edges.requires``):
#: all of them done (else it is cancelled), all of them ended whatever the outcome
#: (run anyway), or at least one of them not done (an on-failure callback).
WORKFLOW_REQUIRES = ("succeeded", "finished", "failed")


class WorkflowEdge(Base):
    """One dependency of a workflow step (revision 0014): ``child_id`` waits for ``parent_id``.

    ``parent_outcome`` is NULL until the parent ends; then the transaction that ended it
    writes the status it ended with (``done``, ``dead``, ``cancelled``, or ``deleted``)
    into this row, its own: the parents of a wide fan-in share no row. Except (revision
    0020) the edge of a child with no other dependency whose parent ended ``done``: the
    child is released and the edge stays NULL, read as resolved since its parent ended.
    ``requires`` is the child's (the same on each of its edges). A step's incoming edges
    are deleted with it (or when it is archived); see
    [``sqla_jobs.workflows``][sqla_jobs.workflows].
    """

    __tablename__ = "jobs_workflow_edges"

    child_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    parent_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    workflow_id: Mapped[uuid.UUID] = mapped_column(sa.Uuid)
    requires: Mapped[str] = mapped_column(sa.Text)
    parent_outcome: Mapped[str | None] = mapped_column(sa.Text)
    #: Revision 0021: true when an append named a step that existed before it (the
    #: parent may be a leaf: a deferred trigger clears its ``workflow_leaf``).
    appended: Mapped[bool | None] = mapped_column(sa.Boolean)

    __table_args__ = (
        sa.CheckConstraint(
            "requires IN (" + ", ".join(f"'{r}'" for r in WORKFLOW_REQUIRES) + ")",
            name="requires",
        ),
        sa.Index("jobs_workflow_edges_parent_id_idx", "parent_id"),
        # The open edges of a step: "is any dependency still running?" reads only those.
        sa.Index(
            "jobs_workflow_edges_open_idx",
            "child_id",
            postgresql_where=sa.text("parent_outcome IS NULL"),
        ),
    )


workflow_edges: sa.Table = WorkflowEdge.__table__  # type: ignore[assignment]


#: What an audit entry is about (``jobs_audit.scope``): one job, jobs matched by a
#: filter, a queue, or a kind.
AUDIT_SCOPES = ("job", "jobs", "queue", "kind")


class AuditEntry(Base):
    """One operator action, who did it and when (revision 0009): the dashboard's audit trail.

    Written by [``sqla_jobs.ops.record_action``][sqla_jobs.ops.record_action] in the transaction of
    the action it records, so an entry exists exactly when its action committed. ``target`` is the
    job id, queue or kind name as text; ``detail`` what the action was given and what it did
    (counts, limits). Rows are only inserted; read newest first, per target through
    ``jobs_audit_scope_target_id_idx``.
    """

    __tablename__ = "jobs_audit"

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(always=True), primary_key=True)
    at: Mapped[datetime] = mapped_column(
        sa.DateTime(timezone=True), server_default=_statement_time()
    )
    actor: Mapped[str] = mapped_column(sa.Text)
    action: Mapped[str] = mapped_column(sa.Text)
    scope: Mapped[str] = mapped_column(sa.Text)
    target: Mapped[str] = mapped_column(sa.Text)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSONB)

    __table_args__ = (
        sa.CheckConstraint(
            "scope IN (" + ", ".join(f"'{s}'" for s in AUDIT_SCOPES) + ")", name="scope"
        ),
        sa.Index("jobs_audit_scope_target_id_idx", "scope", "target", "id"),
    )

    def __repr__(self) -> str:
        return f"<AuditEntry {self.id} {self.action} {self.scope} {self.target!r}>"


audit_entries: sa.Table = AuditEntry.__table__  # type: ignore[assignment]


# --- the flush routes new Jobs through enqueue's statement ----------------------------
# Registered here, beside Job, so that ``from sqla_jobs.models import Job`` gets them too
# (the package loads its public names lazily, #23). The work is the producer's, which
# imports this module: it is imported at the first call, when both are complete.


def _route_new_jobs(session: Session, flush_context: Any, instances: Any) -> None:
    from sqla_jobs import producer

    producer._insert_jobs_as_enqueue_does(session, flush_context, instances)


def _forget_rolled_back_jobs(session: Session) -> None:
    from sqla_jobs import producer

    producer._forget_rolled_back_jobs(session)


def _forget_ended_transaction(session: Session, transaction: SessionTransaction) -> None:
    from sqla_jobs import producer

    producer._forget_ended_transaction(session, transaction)


sa.event.listen(Session, "before_flush", _route_new_jobs)
sa.event.listen(Session, "after_rollback", _forget_rolled_back_jobs)
sa.event.listen(Session, "after_transaction_end", _forget_ended_transaction)
