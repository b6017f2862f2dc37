"""Helpers for tests against a real PostgreSQL server (ours, and your application's).

::

    admin = testing.find_server()                      # DATABASE_URL, local :5432, or embedded
    with testing.scratch_database(admin, migrate=True) as url:
        engine = create_engine(url)
        ...

``find_server`` never mocks anything: it returns a URL of a real server, starting the
embedded one (the ``embedded`` extra, pgserver) only when nothing else answers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.util import await_only

from sqla_jobs import _sessions, config, migrations, ops, validation
from sqla_jobs.exceptions import RegistryError
from sqla_jobs.models import DEFAULT_MAX_ATTEMPTS, JobStatus
from sqla_jobs.sql import admin
from sqla_jobs.sql import control as control_sql
from sqla_jobs.tasks import JobContext, Registry

if TYPE_CHECKING:
    from sqla_jobs.worker import Worker, WorkerEvent

LOCAL_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

_embedded: object | None = None  # keeps the embedded server alive for the process


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def embedded_server(datadir: str | os.PathLike[str] | None = None) -> URL:
    """Start (or reuse) a pip-installed PostgreSQL in ``datadir``; return its admin URL.

    The server is stopped when the process exits. Needs ``pip install sqla-jobs[embedded]``.
    """
    global _embedded
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers): harmless.
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError:
        raise RuntimeError(
            "no PostgreSQL server found: set DATABASE_URL, start one on 127.0.0.1:5432, "
            "or install the embedded server with: pip install 'sqla-jobs[embedded]'"
        ) from None
    path = Path(datadir) if datadir else Path(tempfile.mkdtemp(prefix="sqla_jobs_pg_"))
    path.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = pgserver.get_server(  # type: ignore[attr-defined]
            str(path), cleanup_mode="stop"
        )
    _embedded = server
    return config.database_url(server.get_uri())


def find_server(env: str = "DATABASE_URL") -> URL:
    """An admin URL: ``$DATABASE_URL`` if set, else 127.0.0.1:5432 if it answers, else embedded."""
    raw = os.environ.get(env)
    if raw:
        return config.database_url(raw)
    if _answers("127.0.0.1", 5432):
        return config.database_url(LOCAL_SERVER)
    return embedded_server()


def _admin(url: URL) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)


def create_database(admin_url: URL, name: str, *, template: str | None = None) -> URL:
    """CREATE DATABASE ``name`` (optionally from a template) and return its URL."""
    preparer = sa.create_engine(admin_url).dialect.identifier_preparer
    sql = f"CREATE DATABASE {preparer.quote(name)}"
    if template:
        sql += f" TEMPLATE {preparer.quote(template)}"
    engine = _admin(admin_url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()
    return admin_url.set(database=name)


def drop_database(admin_url: URL, name: str) -> None:
    """DROP DATABASE IF EXISTS ``name`` WITH (FORCE): disconnects leftover sessions."""
    preparer = sa.create_engine(admin_url).dialect.identifier_preparer
    engine = _admin(admin_url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {preparer.quote(name)} WITH (FORCE)")
    finally:
        engine.dispose()


def migrate(url: URL | str, revision: str = "heads") -> None:
    """Run sqla_jobs' Alembic migrations up to ``revision`` on the database at ``url``."""
    engine = sa.create_engine(
        config.database_url(str(url)) if isinstance(url, str) else url, poolclass=sa.NullPool
    )
    try:
        with engine.connect() as conn:
            migrations.upgrade(conn, revision)
    finally:
        engine.dispose()


@contextmanager
def _logging_kept() -> Iterator[None]:
    """An app's env.py calls logging.config.fileConfig, which replaces the root handlers
    and disables every logger that exists: undo that once its migrations have run."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    loggers = {
        name: (lg.disabled, lg.level, lg.handlers[:], lg.propagate)
        for name, lg in logging.Logger.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, (disabled, lvl, hs, propagate) in loggers.items():
            lg = logging.getLogger(name)
            lg.disabled, lg.propagate = disabled, propagate
            lg.setLevel(lvl)
            lg.handlers[:] = hs


def migrate_app(alembic_config: Any, url: URL | str, revision: str = "heads") -> None:
    """``alembic upgrade heads`` of your app's Alembic ``Config`` on the database at ``url``.

    ``url`` replaces the config's ``sqlalchemy.url``: your ``env.py`` must read it from
    there (as the one ``alembic init`` writes does). With sqla_jobs' location in your
    ``version_locations`` this creates sqla_jobs' tables and yours. Logging set up by
    your env.py (``fileConfig``) is undone afterwards.
    """
    from alembic import command

    text = url if isinstance(url, str) else url.render_as_string(hide_password=False)
    # Config values go through configparser interpolation: a '%' must be doubled.
    alembic_config.set_main_option("sqlalchemy.url", text.replace("%", "%%"))
    _prepend_sys_path(alembic_config)
    with _logging_kept():
        command.upgrade(alembic_config, revision)


def _prepend_sys_path(alembic_config: Any) -> None:
    """What the ``alembic`` command does with ``prepend_sys_path`` (``.`` in the ini that
    ``alembic init`` writes), so env.py can import the app; relative to the ini's folder."""
    paths = getattr(alembic_config, "get_prepend_sys_paths_list", None)
    if paths is not None:
        entries = paths() or []
    else:  # Alembic before 1.16: one string, split on spaces, commas and colons
        raw = alembic_config.get_main_option("prepend_sys_path") or ""
        entries = [p for p in re.split(r", *| +|:", raw) if p]
    ini = alembic_config.config_file_name
    base = Path(ini).resolve().parent if ini else Path.cwd()
    for entry in reversed(entries):
        path = os.path.normpath(base / entry)
        if path not in sys.path:
            sys.path.insert(0, path)


@contextmanager
def scratch_database(
    admin_url: URL,
    *,
    prefix: str = "sqla_jobs_test",
    migrate: bool = True,
    template: str | None = None,
    alembic_config: Any = None,
) -> Iterator[URL]:
    """A throwaway database, migrated unless told otherwise, dropped on exit.

    Migrated with sqla_jobs' revisions, or with your app's ``alembic_config`` (an
    ``alembic.config.Config``: its heads, see [``migrate_app``][sqla_jobs.testing.migrate_app]). A
    ``template`` database is cloned as it is.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    url = create_database(admin_url, name, template=template)
    try:
        if migrate and template is None:
            if alembic_config is not None:
                migrate_app(alembic_config, url)
            else:
                globals()["migrate"](url)
        yield url
    finally:
        drop_database(admin_url, name)


@dataclass(frozen=True)
class DrainSummary:
    """What [``drain``][sqla_jobs.testing.drain] or [``run_inline``][sqla_jobs.testing.run_inline]
    ran: per kind, how many attempts ended done, were retried (failed, queued again), went dead,
    were snoozed or ended cancelled (``Discard``, or cancelled while running).

    ``summary.done`` is ``{"send_receipt": 2, ...}``; ``summary.total("retried")`` adds up
    one outcome over every kind.
    """

    done: Mapping[str, int] = field(default_factory=dict)
    retried: Mapping[str, int] = field(default_factory=dict)
    dead: Mapping[str, int] = field(default_factory=dict)
    snoozed: Mapping[str, int] = field(default_factory=dict)
    cancelled: Mapping[str, int] = field(default_factory=dict)

    def total(self, outcome: str) -> int:
        if outcome not in ("done", "retried", "dead", "snoozed", "cancelled"):
            raise ValueError(
                f"outcome must be done, retried, dead, snoozed or cancelled, got {outcome!r}"
            )
        return sum(getattr(self, outcome).values())


class _Tally:
    """Counts outcomes per kind from any thread, then freezes into a DrainSummary."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, Counter[str]] = {
            "done": Counter(),
            "retried": Counter(),
            "dead": Counter(),
            "snoozed": Counter(),
            "cancelled": Counter(),
        }

    def add(self, outcome: str, kind: str) -> None:
        with self._lock:
            self._counts[outcome][kind] += 1

    def summary(self) -> DrainSummary:
        with self._lock:
            return DrainSummary(**{k: dict(sorted(v.items())) for k, v in self._counts.items()})


_EVENT_OUTCOMES = {
    "done": "done",
    "retry": "retried",
    "dead": "dead",
    "snoozed": "snoozed",
    "cancelled": "cancelled",
}


def drain(
    url: URL | str,
    registry: Registry,
    *,
    timeout: float = 30.0,
    queues: tuple[str, ...] | None = None,
    until_empty: bool = False,
    within: float | timedelta = 3600.0,
) -> DrainSummary:
    """Run ``registry``'s handlers in this process until none of its jobs is ready or running.

    Like Oban.Testing's ``drain_queue``: a real worker against the real database, stopped
    once the queue is empty; it returns what ran
    ([``DrainSummary``][sqla_jobs.testing.DrainSummary]). Jobs scheduled in the future are left
    alone, unless ``until_empty``: then retries waiting out their backoff and jobs scheduled within
    ``within`` (seconds or a timedelta, default an hour) of the database's ``now()`` are made ready
    at once (their ``run_at`` is pulled forward, for these jobs only: no clock is changed) and run,
    again and again, until none of the registry's jobs is ready, running or due within that bound.
    So a job that fails twice and then succeeds is done when this returns. Jobs must be committed.
    Periodic schedules enqueue nothing here (call ``sqla_jobs.periodic.enqueue_due``,
    with a pinned ``now`` if you like, to enqueue their ticks).
    Raises TimeoutError if jobs are still pending after ``timeout`` seconds.
    """
    from sqla_jobs.worker import Worker

    horizon = within.total_seconds() if isinstance(within, timedelta) else float(within)
    if not horizon >= 0:
        raise ValueError(f"within must be >= 0 seconds, got {within!r}")
    text = url if isinstance(url, str) else url.render_as_string(hide_password=False)
    if not queues:
        # Every queue the registry's jobs sit in (read once, before running), and each
        # handler's own queue, where the jobs its handlers enqueue on the way will go.
        probe = sa.create_engine(config.database_url(text), poolclass=sa.NullPool)
        try:
            with probe.connect() as conn:
                stmt = admin.queues_of_kinds(list(registry.kinds))
                found = set(conn.execute(stmt).scalars())
        finally:
            probe.dispose()
        queues = tuple(sorted(found | set(registry.queues())))
    worker = Worker(
        registry,
        config.WorkerConfig(
            database_url=text,
            listen=False,
            poll_interval=0.05,
            shutdown_timeout=timeout,
            queues=queues,
            periodic=False,
        ),
    )
    tally = _Tally()

    def count(event: WorkerEvent) -> None:
        outcome = _EVENT_OUTCOMES.get(event.outcome.value)
        if outcome is not None:  # lost claims and released jobs are neither
            tally.add(outcome, event.kind)

    worker.subscribe(count)
    thread = threading.Thread(target=worker.run, name="sqla_jobs-drain", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    kinds, names = list(registry.kinds), list(worker.queues)
    pending = admin.pending_count(kinds, names)
    due = admin.due_within(kinds, names, horizon)
    forward = admin.pull_forward(kinds, names, horizon)
    try:
        while True:
            with worker.engine.begin() as conn:
                counts = conn.execute(pending).one()
                if counts.pending == 0 and counts.paused:
                    raise RuntimeError(_held_back(conn, counts.paused))
                if counts.pending == 0:
                    if not until_empty or conn.execute(due).scalar_one() == 0:
                        break
                    conn.execute(forward)  # the worker polls every 50 ms
            if time.monotonic() > deadline or not thread.is_alive():
                raise TimeoutError(f"jobs still ready or running after {timeout}s")
            time.sleep(0.02)
    finally:
        stop_worker(worker, thread, timeout)
    # Read once the worker has stopped: an outcome's event is emitted after its commit,
    # so the database can show nothing pending while the last event is still on its way
    # (a summary read then missed a dead job in one CI run).
    return tally.summary()


def _held_back(conn: sa.Connection, count: int) -> str:
    paused = [
        f"{row.scope} {row.name!r}" for row in conn.execute(control_sql.controls()) if row.paused
    ]
    return (
        f"drain: {count} ready job(s) wait in a paused queue or of a paused kind "
        f"({', '.join(paused)}) and nothing else is left to run: resume it first "
        "(ops.resume), or leave a paused queue out with drain(..., queues=...)"
    )


def stop_worker(worker: Worker, thread: threading.Thread, timeout: float = 30.0) -> None:
    """Stop a worker running on ``thread`` and close its connections.

    ``Worker.run`` can return while its handler threads still hand their connections
    back; disposing of the engine before they have would leave a connection open.
    """
    worker.stop()
    thread.join(timeout)
    for handler_thread in list(getattr(worker, "_threads", ())):
        handler_thread.join(timeout)
    worker.engine.dispose()


async def drain_async(
    url: URL | str,
    registry: Registry,
    *,
    timeout: float = 30.0,
    queues: tuple[str, ...] | None = None,
    until_empty: bool = False,
    within: float | timedelta = 3600.0,
) -> DrainSummary:
    """[``drain``][sqla_jobs.testing.drain], awaitable from an async test: the worker runs on
    threads of its own.

    The caller's event loop is free meanwhile (the worker's ``async def`` handlers run on
    the worker's own loop), so an async test may serve what the handlers call.
    """
    return await asyncio.to_thread(
        drain,
        url,
        registry,
        timeout=timeout,
        queues=queues,
        until_empty=until_empty,
        within=within,
    )


# --- assertions over the caller's transaction ----------------------------------------


def _connection(session: Session | sa.Connection) -> sa.Connection:
    if isinstance(session, Session):
        session.flush()  # jobs added as Job(...) objects are rows only once flushed
        return session.connection()
    return session


@_sessions.sync_form
def enqueued_jobs(
    session: Session | sa.Connection,
    kind: str | None = None,
    *,
    payload: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    status: JobStatus | str | None = JobStatus.QUEUED,
) -> list[ops.JobRecord]:
    """The jobs matching every filter given, oldest first, as seen by ``session``'s own
    transaction: jobs it enqueued and has not committed are included.

    ``payload`` matches by containment: a job matches when its payload holds at least
    these keys with these values (``{"order_id": 7}`` matches ``{"order_id": 7, "n": 1}``).
    ``status`` defaults to queued (ready or scheduled); None matches any status.
    """
    stmt = admin.find_jobs(
        kind=kind,
        statuses=None if status is None else [JobStatus(status)],
        queue=queue,
        priority=priority,
        payload=None if payload is None else validation.dump_payload(payload),
    )
    return [ops._record(row) for row in _connection(session).execute(stmt)]


def _describe_filters(kind: str, filters: Mapping[str, Any]) -> str:
    given = ", ".join(f"{k}={v!r}" for k, v in filters.items() if v is not None)
    return f"kind={kind!r}" + (f", {given}" if given else "")


@_sessions.sync_form
def assert_enqueued(
    session: Session | sa.Connection,
    kind: str,
    *,
    payload: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    count: int | None = None,
) -> ops.JobRecord:
    """Assert that a queued job of ``kind`` matches (``count``: exactly that many do);
    return the first match. Sees the caller's uncommitted jobs; see
    [``enqueued_jobs``][sqla_jobs.testing.enqueued_jobs].

    The AssertionError lists the queued jobs of that kind, to show what was there instead.
    """
    filters = {"payload": payload, "queue": queue, "priority": priority}
    found = enqueued_jobs(session, kind, payload=payload, queue=queue, priority=priority)
    if found and (count is None or len(found) == count):
        return found[0]
    others = enqueued_jobs(session, kind)
    seen = [{"id": j.id, "queue": j.queue, "payload": j.payload} for j in others[:10]]
    wanted = "a queued job" if count is None else f"{count} queued job(s)"
    raise AssertionError(
        f"expected {wanted} with {_describe_filters(kind, filters)}, found {len(found)}; "
        f"queued jobs of kind {kind!r}: {seen or 'none'}"
    )


@_sessions.sync_form
def refute_enqueued(
    session: Session | sa.Connection,
    kind: str,
    *,
    payload: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
) -> None:
    """Assert that no queued job of ``kind`` matches (same filters as assert_enqueued)."""
    found = enqueued_jobs(session, kind, payload=payload, queue=queue, priority=priority)
    if found:
        filters = {"payload": payload, "queue": queue, "priority": priority}
        seen = [{"id": j.id, "queue": j.queue, "payload": j.payload} for j in found[:10]]
        raise AssertionError(
            f"expected no queued job with {_describe_filters(kind, filters)}, "
            f"found {len(found)}: {seen}"
        )


enqueued_jobs_async = _sessions.async_form_or_connection(enqueued_jobs)
assert_enqueued_async = _sessions.async_form_or_connection(assert_enqueued)
refute_enqueued_async = _sessions.async_form_or_connection(refute_enqueued)


# --- inline mode ----------------------------------------------------------------------


#: ``jobs.worker`` (and ``JobContext.worker``) of jobs run by ``run_inline``.
INLINE_WORKER = "inline"


def run_inline(
    registry: Registry,
    session: Session,
    *,
    scheduled: bool = False,
    raise_errors: bool = True,
    limit: int = 1000,
) -> DrainSummary:
    """Run the queued jobs of ``registry``'s kinds now, in ``session``'s own transaction.

    For unit tests, with no worker: each job is locked, marked running (attempt + 1) and
    its handler called with ``session``, the payload as stored (read back from jsonb, as
    the worker gives it) and a [``JobContext``][sqla_jobs.tasks.JobContext] whose worker is
    ``"inline"``. Its writes and its done-mark stay in your transaction, inside a savepoint: a
    handler that raises has its writes rolled back and the failure recorded as the worker would
    (queued again after its backoff, or dead at max_attempts), then the exception is
    re-raised unless ``raise_errors=False``. As in the worker, ``session.commit()`` inside
    a handler raises ``HandlerTransactionError``. Jobs the handlers enqueue run too, up
    to ``limit`` runs in all. Only jobs ready as of the statement's time run,
    unless ``scheduled``. Nothing is committed.

    ``async def`` handlers need an ``AsyncSession``: with one, ``await
    run_inline_async(registry, async_session)`` runs both kinds. Here a ready job of an
    async kind raises [``RegistryError``][sqla_jobs.RegistryError] before any job runs (and a job of
    an async kind that a handler enqueues stops the run with the same error).
    """
    _sessions.refuse_async(session, "testing.run_inline", "testing.run_inline_async")
    kinds = list(registry.kinds)
    waiting = session.execute(
        admin.inline_next(registry.kinds_where(is_async=True), scheduled=scheduled)
    ).first()
    if waiting is not None:
        raise _async_job_in_sync_run(waiting.kind)
    return _run_inline(session, registry, kinds, scheduled, raise_errors, limit, None)


async def run_inline_async(
    registry: Registry,
    session: AsyncSession,
    *,
    scheduled: bool = False,
    raise_errors: bool = True,
    limit: int = 1000,
) -> DrainSummary:
    """[``run_inline``][sqla_jobs.testing.run_inline] on an ``AsyncSession``: plain and ``async
    def`` handlers alike.

    ``async def`` handlers are awaited with ``session``; plain ones are called with its
    own ``Session`` (``session.sync_session``, the same transaction), on the event loop's
    thread as SQLAlchemy's ``run_sync`` does. Everything else is as in
    [``run_inline``][sqla_jobs.testing.run_inline]: one savepoint per job, nothing committed.
    """
    _sessions.refuse_sync(session, "testing.run_inline_async", "testing.run_inline")
    return await session.run_sync(
        _run_inline, registry, list(registry.kinds), scheduled, raise_errors, limit, session
    )


def _async_job_in_sync_run(kind: str) -> RegistryError:
    return RegistryError(
        f"run_inline runs plain def handlers in your Session; {kind!r} is an async def "
        "handler: with an AsyncSession, `await run_inline_async(registry, async_session)` "
        "runs both kinds (or run it with drain() / await drain_async())"
    )


def _call_handler(
    handler: Any,
    session: Session,
    async_session: AsyncSession | None,
    payload: Any,
    ctx: JobContext,
) -> Any:
    if not handler.is_async:
        return handler(session, payload, ctx)
    if async_session is None:
        raise _async_job_in_sync_run(handler.kind)
    # Inside run_sync's greenlet: await the handler on the caller's event loop, with the
    # AsyncSession whose Session this loop runs on (the same transaction).
    return await_only(handler.run_async(async_session, payload, ctx))


def _run_inline(
    session: Session,
    registry: Registry,
    kinds: list[str],
    scheduled: bool,
    raise_errors: bool,
    limit: int,
    async_session: AsyncSession | None,
) -> DrainSummary:
    from sqla_jobs.exceptions import (
        Discard,
        HandlerTransactionError,
        JobDecision,
        RetryIn,
        Snooze,
    )
    from sqla_jobs.worker import _session
    from sqla_jobs.worker._completer import describe

    tally = _Tally()
    runs = 0

    violated: list[bool] = []

    def refuse_commit(_session: Session) -> None:
        violated.append(True)
        raise HandlerTransactionError(
            "handlers must not end the job's transaction (session.commit()): run_inline "
            "(like the worker) commits nothing; the handler's writes stay in the caller's "
            "transaction"
        )

    while True:
        session.flush()
        row = session.execute(admin.inline_next(kinds, scheduled=scheduled)).first()
        if row is None:
            return tally.summary()
        if runs >= limit:
            raise RuntimeError(f"run_inline ran {limit} jobs and more are queued (a loop?)")
        runs += 1
        handler = registry[row.kind]
        if handler.is_async and async_session is None:
            raise _async_job_in_sync_run(row.kind)
        # A job enqueued without max_attempts gets its handler's, as a worker's claim
        # gives it; resolved again when a failure is recorded, after the savepoint
        # rolled back the start.
        handler_max = (
            handler.max_attempts if handler.max_attempts is not None else DEFAULT_MAX_ATTEMPTS
        )
        savepoint = session.begin_nested()
        start = admin.inline_start(row.id, INLINE_WORKER, handler_max_attempts=handler_max)
        attempt, max_attempts = session.execute(start).one()
        ctx = JobContext(
            row.id,
            row.kind,
            row.queue,
            attempt,
            max_attempts,
            INLINE_WORKER,
            meta=row.meta or {},
            tags=tuple(row.tags or ()),
        )
        violated.clear()
        sa.event.listen(session, "before_commit", refuse_commit)
        try:
            value = _call_handler(handler, session, async_session, row.payload, ctx)
            if violated:
                raise HandlerTransactionError(
                    "handler called session.commit() and swallowed the error"
                )
            result = _session.stored_result(value)
            session.flush()
        except BaseException as exc:
            savepoint.rollback()
            # The handler's decisions (revision 0005), as the worker records them.
            if isinstance(exc, Snooze) and row.snoozes < handler.max_snoozes:
                note = f"snooze {row.snoozes + 1} of at most {handler.max_snoozes}: {exc}"
                snoozed = admin.inline_snoozed(row.id, delay_seconds=exc.seconds, note=note)
                session.execute(snoozed)
                tally.add("snoozed", row.kind)
                continue
            if isinstance(exc, Discard):
                discarded = admin.inline_discarded(
                    row.id, worker=INLINE_WORKER, reason=str(exc), handler_max_attempts=handler_max
                )
                session.execute(discarded)
                tally.add("cancelled", row.kind)
                continue
            error = describe(exc)
            if isinstance(exc, Snooze):
                error = (
                    f"the job snoozed {row.snoozes} times, its handler's max_snoozes; one "
                    f"more snooze counts as a failed attempt ({exc})"
                )
            delay = exc.seconds if isinstance(exc, RetryIn) else handler.backoff.delay(attempt)
            failed = admin.inline_failed(
                row.id,
                worker=INLINE_WORKER,
                delay_seconds=delay,
                error=error,
                handler_max_attempts=handler_max,
            )
            status = session.execute(failed).scalar_one()
            tally.add("dead" if status == JobStatus.DEAD else "retried", row.kind)
            if isinstance(exc, JobDecision):
                continue  # RetryIn (or one snooze too many) is the handler's decision
            if raise_errors or not isinstance(exc, Exception):
                raise
            continue
        finally:
            sa.event.remove(session, "before_commit", refuse_commit)
        session.execute(admin.inline_done(row.id, result))
        savepoint.commit()
        tally.add("done", row.kind)
