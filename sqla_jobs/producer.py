"""Enqueue jobs inside the caller's unit of work.

``enqueue`` and ``enqueue_many`` execute on the ``Session`` or ``Connection`` they are
given and never begin, commit or roll back a transaction themselves: the job commits
with the caller's own writes, or not at all. That is the property the whole design rests
on (the table is the outbox). The same holds for ``session.add(Job(...))``: a flush
listener on every ``Session`` (so on every ``AsyncSession``, which wraps one) inserts a
pending ``Job`` with a key or a delay with the same statement as ``enqueue``, so the
ORM style dedupes, waits and schedules exactly as ``enqueue`` does (see
``_insert_jobs_as_enqueue_does``).

Every value is checked before any SQL runs, so a bad job raises
[``InvalidJobError``][sqla_jobs.exceptions.InvalidJobError] and leaves the caller's transaction
usable.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, CursorResult
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import (
    Session,
    SessionTransaction,
    make_transient,
    make_transient_to_detached,
    scoped_session,
)

from sqla_jobs import _otel, validation
from sqla_jobs.exceptions import InvalidJobError
from sqla_jobs.models import DelayedRunAt, Job, JobStatus
from sqla_jobs.sql import enqueue as enqueue_sql
from sqla_jobs.sql import schema

#: A ``scoped_session`` (Flask-SQLAlchemy's ``db.session``) stands for the session it
#: holds for the current scope: the job goes into that session's transaction.
Executor = Session | Connection | scoped_session[Any]
AsyncExecutor = AsyncSession | AsyncConnection

#: enqueue_many sends at most this many jobs per statement (bounds the parameter arrays).
ENQUEUE_MANY_CHUNK = 5_000


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to insert, validated when built. ``None`` fields take the table defaults.

    ``run_at`` (timezone-aware) and ``delay`` (seconds or timedelta) are exclusive; with
    neither the job is ready at once. Defaults: queue ``"default"``, priority 0 (0-9,
    lower first); without ``max_attempts`` the job gets its handler's when a worker
    claims it, else 8. ``queue`` and ``priority`` cannot wait for the worker (they decide
    who claims the job, and when): ``Registry.new`` / ``Handler.new`` fill in the
    handler's. ``meta`` (a JSON object, at most 8 KiB; ``traceparent`` and
    ``tracestate`` are reserved for the trace context, see ``validation``) and ``tags``
    (a list of at most 32 strings of 1 to 100 characters, no comma) are the
    application's metadata of the job: the
    handler reads them (``job.meta``, ``job.tags``), operators filter by them
    (``ops.list_jobs(meta=..., tag=...)``); an empty one is stored as none.
    """

    kind: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    key: str | None = None
    run_at: datetime | None = None
    delay: float | timedelta | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    timeout: float | timedelta | None = None
    meta: Mapping[str, Any] | None = None
    tags: Sequence[str] | None = None
    payload_json: str = field(init=False, repr=False, compare=False)
    #: ``meta`` as JSON text; None when the job has none (or an empty one).
    meta_json: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validation.check_kind(self.kind)
        object.__setattr__(self, "payload_json", validation.dump_payload(self.payload))
        validation.check_key(self.key)
        validation.check_run_at(self.run_at)
        object.__setattr__(self, "delay", validation.check_delay(self.delay))
        if self.run_at is not None and self.delay is not None:
            raise InvalidJobError("give run_at or delay, not both")
        if self.queue is not None:
            validation.check_queue(self.queue)
        if self.priority is not None:
            validation.check_priority(self.priority)
        if self.max_attempts is not None:
            validation.check_max_attempts(self.max_attempts)
        object.__setattr__(self, "timeout", validation.check_timeout(self.timeout))
        # The trace context is added when the job is inserted (_meta_json), not here: a
        # NewJob built in one span may be inserted in another, or never.
        object.__setattr__(self, "meta_json", validation.dump_meta(self.meta))
        object.__setattr__(self, "tags", validation.check_tags(self.tags))


_OPTIONAL_COLUMNS = (
    ("queue", "queue"),
    ("priority", "priority"),
    ("max_attempts", "max_attempts"),
    ("key", "idempotency_key"),
    ("timeout", "timeout"),
    ("meta_json", "meta"),
    ("tags", "tags"),
)


def _meta_json(job: NewJob) -> str | None:
    """``job.meta_json`` plus the inserting code's trace context, when a span is current
    (a publish span is recorded for the job then: this is called as it is inserted)."""
    meta = _otel.with_trace_context(job.meta, job.queue)
    # Not dump_meta: its limit was applied to the application's meta when the job was
    # built; the context comes on top (bounded), so tracing never makes a job too large.
    return job.meta_json if meta is job.meta else validation.dump_traced_meta(meta)


def _single_insert(
    job: NewJob, *, with_defaults: bool = False
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(shape, params)`` of the one-row insert for ``job`` (see _build)."""
    params: dict[str, Any] = {"kind": job.kind, "payload": job.payload_json}
    columns = []
    meta_json = _meta_json(job)
    for attr, column in _OPTIONAL_COLUMNS:
        value = meta_json if attr == "meta_json" else getattr(job, attr)
        if value is not None:
            columns.append(column)
            params[column] = list(value) if column == "tags" else value
    if job.run_at is not None:
        params["run_at"] = job.run_at
    if job.delay is not None:
        params["delay"] = job.delay
    shape = ("one", job.run_at is not None, job.delay is not None, tuple(columns), with_defaults)
    return shape, params


def _build(shape: tuple[Any, ...]) -> Any:
    """The insert a shape stands for: ``("one", has_run_at, has_delay, columns,
    with_defaults)`` or ``("many", with_keys, options)``."""
    if shape[0] == "many":
        return enqueue_sql.insert_jobs_json(with_keys=shape[1], options=shape[2])
    _, has_run_at, has_delay, columns, with_defaults = shape
    return enqueue_sql.insert_job(
        has_run_at=has_run_at, has_delay=has_delay, columns=columns, with_defaults=with_defaults
    )


# The inserts are built once per shape, compiled once per shape and dialect, and sent as
# the driver's SQL. SQLAlchemy 2.0 cannot cache PostgreSQL's INSERT construct (the one
# with ON CONFLICT): executed as a statement it was compiled again on every call, about
# 0.25 ms, two thirds of the client CPU of an enqueue-and-commit.
_STATEMENTS: dict[tuple[Any, ...], Any] = {}
_COMPILED: dict[tuple[Any, ...], tuple[str, dict[str, Any], tuple[str, ...] | None]] = {}


def _statement(shape: tuple[Any, ...]) -> Any:
    stmt = _STATEMENTS.get(shape)
    if stmt is None:
        stmt = _STATEMENTS[shape] = _build(shape)
    return stmt


def _driver_call(
    dialect: Any, shape: tuple[Any, ...], stmt: Any, params: dict[str, Any]
) -> tuple[str, Any]:
    """``(sql, parameters)`` for ``exec_driver_sql``, in the dialect's paramstyle."""
    key = (dialect.name, dialect.driver, dialect.paramstyle, shape)
    compiled = _COMPILED.get(key)
    if compiled is None:
        c = stmt.compile(dialect=dialect)
        positions = tuple(c.positiontup) if c.positional and c.positiontup else None
        compiled = _COMPILED[key] = (c.string, dict(c.params), positions)
    sql, defaults, positions = compiled
    merged = {**defaults, **params}
    return sql, merged if positions is None else tuple(merged[name] for name in positions)


@contextmanager
def _schema_errors() -> Iterator[None]:
    """A missing jobs table says what to do, as the worker and CLI do."""
    try:
        yield
    except sa_exc.ProgrammingError as exc:
        if schema.missing_jobs_table(exc):
            raise schema.no_schema_error(exc, doing="cannot enqueue: ") from exc
        raise


def _wrong_session(session: object, *, async_: bool) -> TypeError:
    """The error for a session of the other kind (checked only once the type is not ours,
    so the enqueue path pays nothing for it)."""
    given = type(session).__name__
    if async_:
        return TypeError(
            "enqueue_async() (like enqueue_many_async(), registry.enqueue_async() and "
            f"handler.enqueue_async()) takes an AsyncSession or AsyncConnection, got {given}: "
            "with a Session use enqueue(...), enqueue_many(...), registry.enqueue(...) or "
            "handler.enqueue(...)"
        )
    return TypeError(
        "enqueue() (like enqueue_many(), registry.enqueue() and handler.enqueue()) takes a "
        f"Session or Connection, got {given}: with an AsyncSession use "
        "`await enqueue_async(...)`, `await enqueue_many_async(...)`, "
        "`await registry.enqueue_async(...)` or `await handler.enqueue_async(...)`"
    )


def _execute(
    session: Executor, shape: tuple[Any, ...], params: dict[str, Any]
) -> CursorResult[Any]:
    stmt = _statement(shape)
    if isinstance(session, scoped_session):
        session = session()
    if isinstance(session, Session):
        # The bind session.execute(stmt) would pick (binds= by class or table, or a
        # get_bind() that routes on the statement), in the session's transaction.
        conn = session.connection(bind_arguments={"mapper": Job, "clause": stmt})
    elif isinstance(session, Connection):
        conn = session
    else:
        raise _wrong_session(session, async_=False)
    with _schema_errors():
        return conn.exec_driver_sql(*_driver_call(conn.dialect, shape, stmt, params))


def enqueue(
    session: Executor,
    kind: str,
    payload: Mapping[str, Any] | None = None,
    *,
    key: str | None = None,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | timedelta | None = None,
    meta: Mapping[str, Any] | None = None,
    tags: Sequence[str] | None = None,
) -> int | None:
    """Insert one job in the caller's transaction and return its id.

    ``timeout`` (seconds or timedelta) limits each run of this job, over its handler's
    own ``timeout``; see the Job control guide. Without ``max_attempts`` the job gets
    its handler's when a worker claims it (else 8); without ``queue`` or ``priority`` it
    gets ``"default"`` and 0, not its handler's: ``registry.enqueue`` and
    ``handler.enqueue`` use the handler's. ``meta`` (a JSON object) and ``tags`` (a list
    of strings) are the job's metadata, see [``NewJob``][sqla_jobs.producer.NewJob].

    Returns ``None`` when ``key`` is given and a job with that idempotency key already
    exists (``ON CONFLICT DO NOTHING``): the existing job is left as it is. If another
    transaction holding the same key has not committed yet, this call waits for it; if
    that transaction rolls back, this job is inserted and its id returned.

    Never commits: call ``session.commit()`` when your own work is done.
    """
    job = NewJob(
        kind,
        {} if payload is None else payload,
        key=key,
        run_at=run_at,
        delay=delay,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        timeout=timeout,
        meta=meta,
        tags=tags,
    )
    return insert_one(session, job)


def insert_one(session: Executor, job: NewJob) -> int | None:
    """Insert an already validated [``NewJob``][sqla_jobs.producer.NewJob]; the same contract as
    [``enqueue``][sqla_jobs.producer.enqueue]."""
    return _execute(session, *_single_insert(job)).scalar_one_or_none()


async def _execute_async(
    session: AsyncExecutor, shape: tuple[Any, ...], params: dict[str, Any]
) -> CursorResult[Any]:
    """``_execute`` on an ``AsyncSession`` or ``AsyncConnection``."""
    stmt = _statement(shape)
    if isinstance(session, AsyncSession):
        conn = await session.connection(bind_arguments={"mapper": Job, "clause": stmt})
    elif isinstance(session, AsyncConnection):
        conn = session
    else:
        raise _wrong_session(session, async_=True)
    with _schema_errors():
        return await conn.exec_driver_sql(*_driver_call(conn.dialect, shape, stmt, params))


async def enqueue_async(
    session: AsyncExecutor,
    kind: str,
    payload: Mapping[str, Any] | None = None,
    **options: Any,
) -> int | None:
    """``enqueue`` for an ``AsyncSession`` or ``AsyncConnection``; same rules, same result."""
    return await insert_one_async(
        session, NewJob(kind, {} if payload is None else payload, **options)
    )


async def insert_one_async(session: AsyncExecutor, job: NewJob) -> int | None:
    """``insert_one`` on an ``AsyncSession`` or ``AsyncConnection``. Never commits."""
    return (await _execute_async(session, *_single_insert(job))).scalar_one_or_none()


#: enqueue_many sends at most this many characters of JSON per statement (a text value
#: may not exceed 1 GB; this keeps each statement's memory modest on both sides).
ENQUEUE_MANY_MAX_CHARS = 32 * 1024 * 1024


class _RowsWriter:
    """Builds the ``rows`` JSON text of ``enqueue_sql.insert_jobs_json`` for a batch.

    Every value was checked (and the payload serialized) when its NewJob was built;
    this only joins the pieces. Kinds and queues repeat, so their JSON is cached.
    """

    __slots__ = ("_texts",)

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}

    def _text(self, value: str) -> str:
        text = self._texts.get(value)
        if text is None:
            text = self._texts[value] = validation.json_string(value)
        return text

    def row(self, job: NewJob) -> tuple[str, bool]:
        """The job's JSON object, and whether it has more than a kind and a payload."""
        head = '{"k":' + self._text(job.kind) + ',"p":' + job.payload_json
        meta_json = _meta_json(job)
        if (
            job.queue is None
            and job.priority is None
            and job.max_attempts is None
            and job.key is None
            and job.run_at is None
            and job.delay is None
            and job.timeout is None
            and meta_json is None
            and job.tags is None
        ):
            return head + "}", False
        parts = [head]
        if job.queue is not None:
            parts.append(',"q":' + self._text(job.queue))
        if job.priority is not None:
            parts.append(f',"pr":{job.priority:d}')
        if job.max_attempts is not None:
            parts.append(f',"m":{job.max_attempts:d}')
        if job.key is not None:
            parts.append(',"key":' + validation.json_string(job.key))
        if job.run_at is not None:
            parts.append(',"at":"' + job.run_at.isoformat() + '"')
        if job.delay is not None:
            parts.append(f',"d":{job.delay!r}')  # a float since __post_init__
        if job.timeout is not None:
            parts.append(f',"t":{job.timeout!r}')  # a float since __post_init__
        if meta_json is not None:
            parts.append(',"mt":' + meta_json)
        if job.tags is not None:
            parts.append(',"tg":[' + ",".join(self._text(t) for t in job.tags) + "]")
        parts.append("}")
        return "".join(parts), True


def _chunks(batch: list[NewJob]) -> Iterator[tuple[str, bool, bool]]:
    """``(rows JSON, any idempotency key, any option)`` per statement, within both chunk
    limits (see insert_jobs_json for the last two)."""
    writer = _RowsWriter()
    rows: list[str] = []
    chars = 0
    keys = options = False
    for job in batch:
        row, extra = writer.row(job)
        if rows and (len(rows) >= ENQUEUE_MANY_CHUNK or chars + len(row) > ENQUEUE_MANY_MAX_CHARS):
            yield "[" + ",".join(rows) + "]", keys, options
            rows, chars, keys, options = [], 0, False, False
        rows.append(row)
        chars += len(row) + 1
        keys = keys or job.key is not None
        options = options or extra
    if rows:
        yield "[" + ",".join(rows) + "]", keys, options


def _checked(jobs: Iterable[NewJob]) -> list[NewJob]:
    batch = list(jobs)
    for job in batch:
        if not isinstance(job, NewJob):
            raise InvalidJobError(f"enqueue_many takes NewJob objects, got {validation.what(job)}")
    return batch


def enqueue_many(session: Executor, jobs: Iterable[NewJob]) -> list[int]:
    """Insert many jobs in the caller's transaction, one statement per 5,000 jobs.

    Every job is validated (as ``NewJob``) before the first statement is sent. Returns
    the ids of the jobs inserted, in no particular order; jobs whose idempotency key
    already existed (in the table or earlier in the same batch) are skipped and have no
    id. Never commits.
    """
    if not isinstance(session, (Session, Connection, scoped_session)):
        raise _wrong_session(session, async_=False)  # even for an empty batch
    ids: list[int] = []
    for rows, with_keys, options in _chunks(_checked(jobs)):
        ids.extend(_execute(session, ("many", with_keys, options), {"rows": rows}).scalars())
    return ids


async def enqueue_many_async(session: AsyncExecutor, jobs: Iterable[NewJob]) -> list[int]:
    """[``enqueue_many``][sqla_jobs.producer.enqueue_many] on an ``AsyncSession`` or
    ``AsyncConnection``. Never commits."""
    if not isinstance(session, (AsyncSession, AsyncConnection)):
        raise _wrong_session(session, async_=True)  # even for an empty batch
    ids: list[int] = []
    for rows, with_keys, options in _chunks(_checked(jobs)):
        result = await _execute_async(session, ("many", with_keys, options), {"rows": rows})
        ids.extend(result.scalars())
    return ids


# --- session.add(Job(...)) ------------------------------------------------------------

#: The columns a Job inserted as enqueue inserts it may set (NewJob's fields).
_ENQUEUE_COLUMNS = frozenset(
    (
        "kind",
        "payload",
        "idempotency_key",
        "run_at",
        "queue",
        "priority",
        "max_attempts",
        "timeout",
        "meta",
        "tags",
    )
)
_OTHER_COLUMNS = tuple(
    sorted(set(Job.__mapper__.columns.keys()) - _ENQUEUE_COLUMNS)  # status, attempts, ...
)
_OTHER_COLUMNS_SET = frozenset(_OTHER_COLUMNS)
#: The columns a job inserted as enqueue does holds NULL in unless it set them (it
#: always has a kind, and a payload: ``{}`` unless given).
_NULL_UNLESS_SET = tuple(
    sorted(
        set(Job.__mapper__.columns.keys())
        - {c.name for c in enqueue_sql.FILLED_BY_THE_TABLE}
        - {"kind", "payload"}
    )
)


#: A flush inserts up to this many plain jobs (no key, no delay) one by one with
#: enqueue's statement, one round trip each; more are left to the ORM's own insert, one
#: statement for all of them, whose fixed cost (its unit of work: about 2.5 times the
#: client CPU of an enqueue, #23) a few round trips undercut.
ONE_BY_ONE_UP_TO = 3


def _routed(session: Session, instances: Sequence[Any] | None) -> list[Job]:
    """The pending Jobs the flush inserts as enqueue does, in the order they were added.

    Every Job with a key (a taken key must not abort the caller's transaction) or a delay
    (counted in database time). Plain ones too, for speed, when there are at most
    ``ONE_BY_ONE_UP_TO`` and each sets a kind and a payload and no worker column
    (``status``, ``attempts``, ...): those the ORM would insert as they are, so the row
    is the same; any other is the ORM's to insert (or refuse) as before.
    """
    new = [
        obj
        for obj in session.new  # in the order added
        if isinstance(obj, Job) and (instances is None or obj in instances)
    ]
    keyed: list[Job] = []
    plain: list[Job] = []
    for job in new:
        values = job.__dict__  # read without the attribute machinery: every pending object
        if values.get("idempotency_key") is not None or type(values.get("run_at")) is DelayedRunAt:
            keyed.append(job)
        elif "kind" in values and "payload" in values and _OTHER_COLUMNS_SET.isdisjoint(values):
            plain.append(job)
    if not plain or len(plain) > ONE_BY_ONE_UP_TO:
        return keyed
    if not keyed:
        return plain
    chosen = {id(job) for job in (*keyed, *plain)}
    return [job for job in new if id(job) in chosen]


def _new_job(job: Job) -> NewJob:
    """The NewJob ``enqueue`` would insert for ``job``; InvalidJobError before any SQL."""
    values = job.__dict__
    # isdisjoint first: the list is built only for a job that names another column.
    extra = (
        []
        if _OTHER_COLUMNS_SET.isdisjoint(values)
        else [name for name in _OTHER_COLUMNS if values.get(name) is not None]
    )
    if extra:
        raise InvalidJobError(
            f"a Job with a key or a delay is inserted as enqueue() inserts it and sets only "
            f"kind, payload, key, run_at or delay, queue, priority, max_attempts, timeout, "
            f"meta and tags; "
            f"this one also sets {', '.join(extra)}"
        )
    run_at = values.get("run_at")
    delay = run_at.seconds if isinstance(run_at, DelayedRunAt) else None
    return NewJob(
        values.get("kind"),  # type: ignore[arg-type]  # checked by NewJob
        values.get("payload") or {},
        key=values.get("idempotency_key"),
        run_at=None if delay is not None else run_at,
        delay=delay,
        queue=values.get("queue"),
        priority=values.get("priority"),
        max_attempts=values.get("max_attempts"),
        timeout=values.get("timeout"),
        meta=values.get("meta"),
        tags=values.get("tags"),
    )


def _add_trace_context(
    session: Session, instances: Sequence[Any] | None, routed: Sequence[Job]
) -> None:
    """The flush inserts the pending Jobs: each the ORM inserts itself gets the current
    trace context (and its publish span) now, not when it was built; one inserted as
    enqueue does (``routed``) gets it from that insert."""
    tracing = _otel.recording()
    skip = {id(job) for job in routed}
    for obj in session.new:
        if isinstance(obj, Job) and id(obj) not in skip and (instances is None or obj in instances):
            meta = obj.__dict__.get("meta")
            if not tracing and not (meta and validation.TRACEPARENT in meta):
                continue
            traced = _otel.with_trace_context(meta, obj.__dict__.get("queue"))
            if traced is not meta:
                # Past meta's validator: it checked the application's meta when it was
                # set; the context comes on top of its size limit (bounded), as enqueue's.
                obj.__dict__["meta"] = traced


def _insert_jobs_as_enqueue_does(
    session: Session, _flush_context: Any, instances: Sequence[Any] | None
) -> None:
    """``before_flush``: insert pending Jobs with a key or a delay (and a few plain ones,
    see ``_routed``) as [``enqueue``][sqla_jobs.producer.enqueue] does.

    Each is taken out of the unit of work and inserted by
    [``enqueue``][sqla_jobs.producer.enqueue]'s statement (``ON CONFLICT DO NOTHING``), in the order
    they were added. A new row makes the object persistent, filled from the row (RETURNING: no query
    to read it later, as after the ORM's own insert); no row (the key is taken) leaves it transient
    with ``id`` None. Every job is checked before the first insert. The rest of the flush
    (other jobs included) is the ORM's own.
    """
    pending = _routed(session, instances)  # the first of two equal keys wins
    _add_trace_context(session, instances, pending)
    if not pending:
        return
    inserts = [(job, _new_job(job)) for job in pending]
    for job, new in inserts:
        row = _execute(session, *_single_insert(new, with_defaults=True)).one_or_none()
        session.expunge(job)
        if row is None:
            continue
        # The object's values become its committed ones, as after the ORM's own insert:
        # the row's defaults, NULL for every other column the job did not set. Written
        # into its __dict__ for make_transient_to_detached to commit at once (it leaves
        # no column unloaded), rather than one set_committed_value per column.
        values = job.__dict__
        values.setdefault("payload", {})  # what NewJob sent for a job given none
        for name in _NULL_UNLESS_SET:
            values.setdefault(name, None)
        values.update(row._mapping)
        values["status"] = JobStatus(values["status"])  # the driver's text (exec_driver_sql)
        make_transient_to_detached(job)
        session.add(job)
        _inserted(session)[job] = session.get_nested_transaction() or session.get_transaction()


# A job the flush inserted itself must, like one the ORM inserted, leave the session
# when the transaction that inserted it rolls back (the ORM would keep it as a
# persistent object whose row is gone). These remember which transaction that was.
_INSERTED = "sqla_jobs.inserted_as_enqueue"


def _inserted(session: Session) -> dict[Job, SessionTransaction | None]:
    found: dict[Job, SessionTransaction | None] = session.info.setdefault(_INSERTED, {})
    return found


def _forget_rolled_back_jobs(session: Session) -> None:
    """``after_rollback`` (of the root transaction or a savepoint, before the session
    expires its objects): the jobs inserted inside it become transient again."""
    inserted = session.info.get(_INSERTED)
    if not inserted:
        return
    ended = session.get_nested_transaction() or session.get_transaction()
    for job, transaction in list(inserted.items()):
        while transaction is not None and transaction is not ended:
            transaction = transaction.parent
        if transaction is not None:
            del inserted[job]
            if job in session:
                session.expunge(job)
            make_transient(job)


def _forget_ended_transaction(session: Session, transaction: SessionTransaction) -> None:
    """``after_transaction_end`` of the root (a commit or a close): nothing left to undo."""
    if transaction.parent is None:
        session.info.pop(_INSERTED, None)
