"""The worker: claim, run, complete or retry, with leases, heartbeats and fencing.

One process runs one :class:`Worker`. Its threads:

* the **dispatcher** claims, in one short committed transaction, up to as many ready
  jobs as there are free handler slots plus ``prefetch``, and puts them in a local
  buffer; it claims again when the buffer is half empty, so a short job never waits for
  a claim round trip and a batch of jobs costs one claim;
* **handler threads** (``concurrency`` of them) take jobs from the buffer and run one
  at a time. A handler gets a
  :class:`HandlerSession`; if it wrote anything, its writes and the done-mark commit in
  one transaction (exactly-once effect for database-only handlers). Each job gets a new
  session; its transaction runs on the thread's own connection, kept from job to job
  and given back to the pool whenever a job leaves it unclean. A handler that did
  not touch the database is completed by the **completer**, which marks finished jobs
  done in batches;
* the **heartbeat** extends the lease (``locked_until``) of every job this worker holds
  (buffered, running or awaiting its done-mark), every ``lock_seconds / 3``;
* the **listener** holds a dedicated connection that LISTENs on ``jobs`` and wakes the
  dispatcher when jobs are inserted; the poll interval remains the fallback, and the
  listener reconnects (and triggers a poll) after losing its connection.

Every completion, retry, heartbeat and release is fenced on ``(id, attempts, worker,
status = 'running')``: after a takeover the stale worker's statements update zero rows,
its handler transaction is rolled back, and the loss is logged.

On shutdown, buffered jobs that no handler started are given back (``lease.release``:
queued again, attempt not spent).

The worker never runs DDL, so it can run as a role with only DML on the jobs table.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any, TypeVar, cast

import psycopg
import sqlalchemy as sa
from psycopg import sql
from psycopg.rows import namedtuple_row
from psycopg.types.json import set_json_loads
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, SessionTransaction

from sqla_jobs import config as config_mod
from sqla_jobs.config import WorkerConfig
from sqla_jobs.exceptions import SqlaJobsError
from sqla_jobs.models import JobStatus
from sqla_jobs.sql import lease, locks, schema
from sqla_jobs.tasks import JobContext, Registry

log = logging.getLogger("sqla_jobs.worker")

_T = TypeVar("_T")

_PAYLOADS = json.JSONDecoder()


def _load_payload(data: str | bytes) -> Any:
    # The claim decodes every payload, on the thread that feeds all handlers. psycopg's
    # default, json.loads on bytes, first sniffs the encoding: half of the dispatcher's
    # time on no-op jobs. jsonb text is UTF-8 (as json.loads assumes) and one value with
    # nothing around it, so the decoder's raw_decode suffices.
    text = data if isinstance(data, str) else bytes(data).decode()
    return _PAYLOADS.raw_decode(text)[0]


#: last_error keeps this much of the traceback (characters, from the end).
MAX_TRACEBACK_CHARS = 4_000
#: Longest pause after a database error before the dispatcher tries again.
MAX_ERROR_BACKOFF = 5.0
#: Largest batch the completer marks done in one statement.
COMPLETE_BATCH = 1_000
#: The prefetch buffer holds about this many seconds of work (at the handlers' recent
#: pace), up to ``WorkerConfig.prefetch`` jobs: thousands of 20-microsecond jobs, but
#: none of the 1-second jobs, which would sit in this worker while others are idle.
PREFETCH_SECONDS = 0.05
#: After raising the idle flag, look at the table again this soon: a producer whose
#: trigger ran just before the flag went up, and who committed after our last claim,
#: did not notify (revision 0003). Later waits are the poll interval.
IDLE_RECHECK_SECONDS = 0.05


class HandlerTransactionError(SqlaJobsError):
    """A handler tried to commit or close the session the worker gave it.

    The worker owns the handler's transaction: it commits the handler's writes together
    with the done-mark, so that a job is never marked done without its effects (or the
    other way round). A handler that commits or closes its session is recorded as a
    failed attempt and all of its writes are rolled back.
    """


class _ThreadConnection:
    """A handler thread's own connection, kept from one job to the next.

    Checking a pooled connection out and back in for every job (pool bookkeeping, reset,
    events) cost about 15% of the worker's time per job that writes one row. The worker
    gives it up (back to the pool, which resets or discards it) whenever a job leaves it
    in any state but clean: invalidated or closed, still in a transaction, its execution
    options changed (e.g. an isolation level), or the pool invalidated since it was taken.
    """

    __slots__ = ("conn", "engine", "generation", "options", "used")

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.conn: sa.Connection | None = None
        self.options: Any = None
        self.generation = 0  # the worker's pool generation when conn was taken
        # Whether a session ran on conn since the last clean(): a job that never touched
        # the database (no-op handlers) skips the checks, a fifth of such a job's cost.
        self.used = False

    def connect(self) -> sa.Connection:
        self.used = True
        if self.conn is None:
            self.conn = self.engine.connect()
            self.options = self.conn.get_execution_options()
        return self.conn

    def clean(self) -> bool:
        conn = self.conn
        if conn is None or not self.used:
            return True
        self.used = False
        if conn.closed or conn.invalidated or conn.in_transaction():
            return False
        if conn.get_execution_options() is not self.options:
            return False
        driver = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
        return not (driver.closed or driver.broken) and (
            driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing a handler thread's connection", exc_info=True)


class HandlerSession(Session):
    """The Session a handler receives. ``commit()`` and ``close()`` are refused.

    Use ``flush()`` to send writes early and ``rollback()`` to discard them; the worker
    commits what is left when the handler returns. Each job gets a new session; its
    transaction runs on the handler thread's own connection (``get_bind()`` is still the
    engine).
    """

    _sqla_jobs_violation: str | None = None
    _sqla_jobs_thread_conn: _ThreadConnection | None = None

    def connection(
        self, bind_arguments: Any = None, execution_options: Any = None
    ) -> sa.Connection:
        thread_conn = self._sqla_jobs_thread_conn
        if (
            execution_options
            and thread_conn is not None
            and not bind_arguments
            and not self.in_transaction()
        ):
            # The first use, with options (e.g. an isolation level): they go on the
            # thread's connection before its transaction begins, as they would on a
            # pooled one. The worker gives that connection up after the job.
            thread_conn.connect().execution_options(**execution_options)
            return super().connection()
        return super().connection(bind_arguments, execution_options)

    def commit(self) -> None:
        self._sqla_jobs_violation = "commit()"
        raise HandlerTransactionError(
            "handlers must not call session.commit(): the worker commits the handler's "
            "writes together with the job's done-mark"
        )

    def close(self) -> None:
        self._sqla_jobs_violation = "close()"
        raise HandlerTransactionError("handlers must not call session.close()")

    def _worker_commit(self) -> None:
        Session.commit(self)

    def _worker_close(self) -> None:
        Session.close(self)


@sa.event.listens_for(HandlerSession, "after_transaction_create")
def _on_transaction(session: Session, transaction: SessionTransaction) -> None:
    # Every (outermost) transaction of a handler's session starts on the handler
    # thread's own connection instead of a pooled checkout; later lookups of the engine
    # (execute, flush, connection()) find it. Only when the session first needs the
    # database (autobegin), so a handler that never touches it costs no connection.
    thread_conn = cast(HandlerSession, session)._sqla_jobs_thread_conn
    if thread_conn is not None and transaction.parent is None:
        session.connection(bind_arguments={"bind": thread_conn.connect()})


@dataclass(frozen=True)
class Claimed:
    """A job this worker claimed: ``(id, attempt)`` is its fence."""

    id: int
    kind: str
    queue: str
    payload: dict[str, Any]
    attempt: int
    max_attempts: int

    @property
    def lease(self) -> tuple[int, int]:
        return (self.id, self.attempt)


def _describe(exc: BaseException) -> str:
    """``Type: message`` plus the end of the traceback, NUL-free, for ``last_error``."""
    head = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(tb) > MAX_TRACEBACK_CHARS:
        tb = "...\n" + tb[-MAX_TRACEBACK_CHARS:]
    return f"{head}\n\n{tb}".replace("\x00", "")


def _reason(exc: BaseException) -> object:
    """The driver's error when there is one (shorter and clearer than SQLAlchemy's wrapper)."""
    return getattr(exc, "orig", None) or exc


def _fields(job: Claimed, **more: Any) -> dict[str, Any]:
    return {"job_id": job.id, "kind": job.kind, "attempt": job.attempt, **more}


class Worker:
    """Runs the handlers of ``registry`` for jobs in ``config.queues`` until stopped.

    ``run()`` blocks; ``stop()`` (or SIGTERM/SIGINT when ``run`` installs the handlers)
    stops claiming, lets running handlers finish for up to ``shutdown_timeout`` seconds
    and returns. Jobs not finished by then keep their lease until it expires and are
    then taken by another worker: never lost.
    """

    def __init__(
        self, registry: Registry, config: WorkerConfig, *, engine: sa.Engine | None = None
    ) -> None:
        if not len(registry):
            raise SqlaJobsError("the registry has no handlers")
        self.registry = registry
        self.config = config
        self.engine = engine or sa.create_engine(
            config.url,
            pool_size=config.concurrency + 4,
            max_overflow=config.concurrency + 4,
            # No pre-ping (it would cost a round trip per checkout): a disconnect error
            # invalidates the whole pool, and every caller below retries or records it.
            pool_timeout=60,
            # Handlers' own statements keep psycopg's default (prepared on their 5th
            # run); the worker's statements choose explicitly (see _execute_raw).
            connect_args={} if config.prepared_statements else {"prepare_threshold": None},
        )
        self._kinds = list(registry.kinds)
        # The statements run once per batch (claim) or per job (done-mark) are built and
        # compiled once: building, cache-keying and compiling them on every execution
        # took more Python time than a no-op job. Executions pass only new values.
        self._claim_sql = self._compile(
            lease.claim(
                worker=config.worker_id,
                lock_seconds=config.lock_seconds,
                queues=config.queues,
                kinds=self._kinds,
                limit=1,
            )
        )
        self._complete_sql = self._compile(lease.complete(worker=config.worker_id, leases=[]))
        self._complete_one_sql = self._compile(
            lease.complete_one(worker=config.worker_id, job_id=0, attempt=0)
        )
        self._lock = threading.Lock()
        self._pool_generation = 0  # bumped when a pooled connection is invalidated
        sa.event.listen(self.engine, "invalidate", self._on_invalidate)
        self._held: dict[int, int] = {}  # job id -> attempt, for the heartbeat
        # Held jobs whose outcome (done, retry, release) is being written: the heartbeat
        # still renews them, but their lease vanishing is that write, not a loss.
        self._settling: set[int] = set()
        self._running = 0  # claimed and not finished: buffered, running or being completed
        # Buffered + running handlers: what the claim size is computed from. A job whose
        # handler returned no longer counts, even before the completer's done-mark.
        self._active = 0
        # Both follow the buffer's size (see _size_buffer); they start without one.
        self._capacity = config.concurrency
        # Claim again once at least this many slots are free: batches of about half the
        # buffer, not one claim per finished job.
        self._min_claim = 1
        self._job_seconds: float | None = None  # moving average of handler run time
        self._idle_conn: sa.Connection | None = None  # holds the idle flag (see _dispatch)
        self._idle_flag_up = False
        # True while the dispatcher waits for handlers to free room (see _job_left).
        self._want_room = False
        # A SimpleQueue (C, lock-free put) hands jobs to the handler threads: a
        # ThreadPoolExecutor.submit per job cost more than a no-op job itself.
        self._buffer: queue.SimpleQueue[Claimed | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._signals = 0
        self._completions: queue.SimpleQueue[Claimed | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._handlers_ready = threading.Semaphore(0)  # one release per connected thread
        # Metrics hook: on_event(event, job, seconds) with event "done", "retry" or "dead"
        # and the handler's run time; called on the handler thread.
        self.on_event: Callable[[str, Claimed, float], None] | None = None

    # --- life cycle -------------------------------------------------------------------

    def check_schema(self) -> None:
        """Raise SchemaNotReadyError unless the jobs table has every column and status."""
        with self.engine.connect() as conn:
            schema.check_schema(conn)

    def run(self, *, install_signal_handlers: bool = False) -> None:
        """Work until ``stop()`` (or a signal); returns after a graceful drain."""
        self.check_schema()
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self._start_thread(self._heartbeat_loop, "heartbeat")
        self._start_thread(self._complete_loop, "completer")
        for i in range(self.config.concurrency):
            self._start_thread(self._handler_loop, f"job-{i}")
        self._await_handler_connections()
        if self.config.listen:
            self._start_thread(self._listen_loop, "listener")
        if self.config.archive_every is not None:
            self._start_thread(self._archive_loop, "archiver")
        log.info(
            "worker %s started: queues=%s kinds=%s concurrency=%d",
            self.config.worker_id,
            ",".join(self.config.queues),
            ",".join(self._kinds),
            self.config.concurrency,
        )
        self._run_dispatcher()

    def _run_dispatcher(self) -> None:
        # The dispatcher and the drain run on a thread of their own, and the calling
        # thread only joins it. A signal handler runs on the main thread between two
        # bytecodes, and stop() sets Events: had the main thread been the dispatcher,
        # interrupted inside _wake.wait() while holding that Event's lock, stop() would
        # wait for the lock forever (seen once in about 30 SIGTERMs).
        failure: list[BaseException] = []

        def dispatch_then_drain() -> None:
            try:
                self._dispatch_loop()
            except BaseException as exc:
                failure.append(exc)
            finally:
                self._drain()

        thread = threading.Thread(
            target=dispatch_then_drain, name="sqla_jobs-dispatcher", daemon=True
        )
        thread.start()
        try:
            while thread.is_alive():
                thread.join(0.5)
        except BaseException:  # e.g. KeyboardInterrupt without our signal handlers
            self.stop()
            thread.join()
            raise
        if failure:
            raise failure[0]

    def stop(self) -> None:
        """Stop claiming; running handlers finish (up to shutdown_timeout)."""
        self._stopping.set()
        self._wake.set()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning(
                "second %s: exiting now; unfinished jobs go back when their lease expires",
                signal.Signals(signum).name,
            )
            logging.shutdown()
            os._exit(1)
        log.info("received %s: no more claims, draining", signal.Signals(signum).name)
        self.stop()

    def _await_handler_connections(self, timeout: float = 30.0) -> None:
        # "started" means ready to run jobs at full speed: opening a connection per
        # handler thread on its first job cost the first few hundred jobs of a burst
        # (a backend start each, on the same cores as the jobs).
        deadline = time.monotonic() + timeout
        for _ in range(self.config.concurrency):
            if not self._handlers_ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                log.warning("handler threads still connecting after %.0fs", timeout)
                return

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"sqla_jobs-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _drain(self) -> None:
        deadline = time.monotonic() + self.config.shutdown_timeout
        self._release_buffered()
        for _ in range(self.config.concurrency):
            self._buffer.put(None)  # one stop sentinel per handler thread
        while self._busy() and time.monotonic() < deadline:
            self._wake.wait(0.05)
            self._wake.clear()
        unfinished = self._busy()
        self._completions.put(None)  # flush and stop the completer
        for thread in self._threads:
            if thread.name == "sqla_jobs-completer":
                thread.join(max(1.0, deadline - time.monotonic()))
        self._stopped.set()
        for thread in self._threads:
            if not thread.name.startswith("sqla_jobs-job-"):  # handlers may outlive the timeout
                thread.join(2.0)  # the listener and heartbeat notice _stopped within a second
        if unfinished:
            log.warning(
                "shutdown timeout: %d job(s) still running; their leases will expire and "
                "another worker will take them",
                unfinished,
            )
        log.info("worker %s stopped", self.config.worker_id)

    def _busy(self) -> int:
        with self._lock:
            return self._running

    # --- dispatcher -------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        try:
            self._dispatch()
        finally:
            self._set_idle_flag(False)
            if self._idle_conn is not None:
                self._idle_conn.close()
                self._idle_conn = None

    def _dispatch(self) -> None:
        errors = 0
        next_rescue = 0.0
        recheck = False
        while not self._stopping.is_set():
            # Cleared before looking at the table, so a wake-up that arrives while we
            # claim is not lost: the wait below then returns at once.
            self._wake.clear()
            try:
                if time.monotonic() >= next_rescue:
                    self._rescue()
                    next_rescue = time.monotonic() + self.config.rescue_interval
                with self._lock:
                    self._size_buffer()
                    free = self._capacity - self._active
                    # Set under the lock that handlers update _active with: a handler
                    # that frees room after this line sees the flag and wakes us.
                    self._want_room = free < self._min_claim
                claimed = self._claim(free) if free >= self._min_claim else []
                errors = 0
            except sa_exc.SQLAlchemyError as exc:  # incl. pool timeouts
                errors += 1
                pause = min(MAX_ERROR_BACKOFF, 0.1 * 2**errors)
                log.warning(
                    "database error in dispatcher (retrying in %.1fs): %s", pause, _reason(exc)
                )
                self._stopping.wait(pause)
                continue
            for job in claimed:
                self._start(job)
            exhausted = free >= self._min_claim and len(claimed) < free
            if self.config.listen:
                # The idle flag tells the insert trigger to NOTIFY (revision 0003). Up
                # while the queue keeps up with us; down while claims come back full, so
                # producers' commits are not serialized by NOTIFY under load.
                if exhausted and not self._idle_flag_up:
                    if self._set_idle_flag(True):
                        recheck = True
                        continue  # a job committed before the flag was up notified no one
                elif free >= self._min_claim and not exhausted and self._idle_flag_up:
                    self._set_idle_flag(False)
            if free < self._min_claim or len(claimed) < free:
                # No room (a handler wakes us when there is), or nothing more is ready
                # (a notification, a short retry's timer or the poll interval wakes us;
                # finished handlers do not, so a drained queue is not polled per job).
                # Never past the next rescue: expired leases of dead workers must be
                # requeued every rescue_interval even when no notification comes.
                until_rescue = max(0.0, next_rescue - time.monotonic())
                timeout = min(self.config.poll_interval, until_rescue)
                if recheck:
                    timeout, recheck = min(timeout, IDLE_RECHECK_SECONDS), False
                self._wake.wait(timeout)

    def _set_idle_flag(self, up: bool) -> bool:
        """Raise or lower the idle flag on its own connection; False if that failed.

        A session-level lock, so a worker that dies takes its flag with it. If the flag
        cannot be raised, producers stop notifying this worker: it falls back to polling.
        """
        if up == self._idle_flag_up:
            return True
        try:
            if self._idle_conn is None:
                self._idle_conn = self.engine.connect().execution_options(
                    isolation_level="AUTOCOMMIT"
                )
            self._idle_conn.execute(locks.idle_flag(raise_=up))
            self._idle_flag_up = up
            return True
        except sa_exc.SQLAlchemyError as exc:
            log.warning("could not %s the idle flag: %s", "raise" if up else "lower", _reason(exc))
            self._idle_flag_up = False
            if self._idle_conn is not None:
                self._idle_conn.invalidate()  # closes it: a lock it still held goes too
                self._idle_conn.close()
                self._idle_conn = None
            return False

    def _size_buffer(self) -> None:
        """Buffer PREFETCH_SECONDS of work at the handlers' recent pace (under _lock)."""
        per_job = self._job_seconds
        target = 0
        if per_job is not None and self.config.prefetch:
            pace = self.config.concurrency / max(per_job, 1e-6)  # jobs per second
            target = min(self.config.prefetch, int(pace * PREFETCH_SECONDS))
        self._capacity = self.config.concurrency + target
        self._min_claim = max(1, target // 2)

    @staticmethod
    def _execute_raw(
        conn: sa.Connection,
        sql: str,
        params: dict[str, Any],
        *,
        prepare: bool,
        json_loads: Callable[[str | bytes], Any] | None = None,
    ) -> list[Any]:
        """Run compiled SQL on the driver's cursor, choosing whether psycopg prepares it.

        Never prepared: the fenced statements that take arrays of leases. A prepared
        statement gets a generic plan, and theirs is quadratic: the planner cannot see
        the arrays' length, and with the stale statistics a queue table always has
        (jobs_lease_idx looks empty) it scanned every running job and re-ran unnest()
        for each: 100 ms to mark 900 jobs done. Errors are raised as SQLAlchemy's, like
        every other database error the worker handles, and a broken connection is
        invalidated so the pool does not hand it out again.
        """
        return Worker._on_cursor(
            conn,
            sql,
            params,
            prepare,
            lambda c: c.fetchall() if c.description else [],
            json_loads,
        )

    @staticmethod
    def _execute_count(
        conn: sa.Connection, sql: str, params: dict[str, Any], *, prepare: bool
    ) -> int:
        """Like ``_execute_raw``; returns the number of rows affected (no rows built)."""
        return Worker._on_cursor(conn, sql, params, prepare, lambda c: c.rowcount)

    @staticmethod
    def _on_cursor(
        conn: sa.Connection,
        sql: str,
        params: dict[str, Any],
        prepare: bool,
        result: Callable[[psycopg.Cursor[Any]], _T],
        json_loads: Callable[[str | bytes], Any] | None = None,
    ) -> _T:
        driver = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
        try:
            with driver.cursor(row_factory=namedtuple_row) as cursor:
                if json_loads is not None:
                    set_json_loads(json_loads, cursor)
                cursor.execute(sql, params, prepare=prepare)
                return result(cursor)
        except psycopg.Error as exc:
            if driver.closed or driver.broken:
                conn.invalidate()
            raise sa_exc.DBAPIError.instance(sql, params, exc, psycopg.Error) from exc

    def _execute_fenced(self, conn: sa.Connection, stmt: sa.ClauseElement) -> list[Any]:
        return self._execute_raw(conn, *self._compile(stmt), prepare=False)

    def _compile(self, stmt: sa.ClauseElement) -> tuple[str, dict[str, Any]]:
        compiled = stmt.compile(dialect=self.engine.dialect)
        return str(compiled), dict(compiled.params)

    def _fenced(self, leases: Iterable[tuple[int, int]]) -> dict[str, Any]:
        ids, attempts = [], []
        for job_id, attempt in leases:
            ids.append(str(int(job_id)))
            attempts.append(str(int(attempt)))
        # Sent as array literals (the statement casts them to bigint[] and integer[]):
        # psycopg's list dumper runs a regular expression over every element, a quarter
        # of the completer's time; the text of Python ints is exact.
        return {
            **self._complete_sql[1],
            "fence_ids": "{" + ",".join(ids) + "}",
            "fence_attempts": "{" + ",".join(attempts) + "}",
        }

    def _claim(self, limit: int) -> list[Claimed]:
        sql, params = self._claim_sql
        with self.engine.begin() as conn:
            # Prepared: that skips 0.7 ms of planning per batch, and the claim's generic
            # plan is its custom one (an index range scan per priority, primary-key
            # probes; see benchmarks/README.md).
            rows = self._execute_raw(
                conn,
                sql,
                {**params, "limit": limit},
                prepare=self.config.prepared_statements,
                json_loads=_load_payload,
            )
        # Columns: id, kind, queue, payload, attempts, max_attempts (lease.claim).
        jobs = [Claimed(*r) for r in rows]
        with self._lock:
            for job in jobs:
                self._held[job.id] = job.attempt
            self._running += len(jobs)
            self._active += len(jobs)
        return jobs

    def _rescue(self) -> None:
        with self.engine.begin() as conn:
            rows = self._execute_fenced(conn, lease.rescue_expired())
        for row in rows:
            level = logging.ERROR if row.status == JobStatus.DEAD else logging.WARNING
            log.log(
                level,
                "job %s (%s) lease expired on attempt %s (worker %s): %s",
                row.id,
                row.kind,
                row.attempts,
                row.worker,
                "dead" if row.status == JobStatus.DEAD else "requeued",
                extra={
                    "job_id": row.id,
                    "kind": row.kind,
                    "attempt": row.attempts,
                    "outcome": "dead" if row.status == JobStatus.DEAD else "rescued",
                },
            )

    def _start(self, job: Claimed) -> None:
        self._buffer.put(job)

    def _release_buffered(self) -> None:
        """Give back, in one statement, the buffered jobs no handler has started."""
        unstarted: list[Claimed] = []
        while True:
            try:
                job = self._buffer.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                unstarted.append(job)
        if unstarted:
            self._release(unstarted)
            for job in unstarted:
                self._job_left(job, finished=True)
            log.info("released %d buffered job(s) no handler had started", len(unstarted))

    # --- running one job --------------------------------------------------------------

    def _handler_loop(self) -> None:
        get = self._buffer.get
        thread_conn = _ThreadConnection(self.engine)
        try:
            try:
                thread_conn.connect()
                thread_conn.used = False
            except Exception:  # the first job connects again (and records a failure)
                log.warning("a handler thread could not connect yet", exc_info=True)
            finally:
                self._handlers_ready.release()
            while True:
                job = get()
                if job is None:
                    return
                self._run_job(job, thread_conn)
        finally:
            thread_conn.close()

    def _job_left(self, job: Claimed, *, finished: bool) -> None:
        """The job's handler slot is free; ``finished``: nothing more to record either."""
        with self._lock:
            self._active -= 1
            if finished:
                self._held.pop(job.id, None)
                self._settling.discard(job.id)
                self._running -= 1
            wake = self._want_room and self._capacity - self._active >= self._min_claim
        if wake or self._stopping.is_set():
            self._wake.set()

    def _finished(self, job: Claimed) -> None:
        """The completer recorded the job (its slot was freed when the handler returned)."""
        with self._lock:
            self._held.pop(job.id, None)
            self._settling.discard(job.id)
            self._running -= 1
        if self._stopping.is_set():
            self._wake.set()  # _drain waits for _busy() to reach zero

    def _on_invalidate(self, *_args: Any) -> None:
        # A connection was invalidated; on a disconnect the whole pool was. Handler
        # threads take a new connection before their next job, as a pool checkout would.
        self._pool_generation += 1

    def _run_job(self, job: Claimed, thread_conn: _ThreadConnection) -> None:
        if self._stopping.is_set():
            # Claimed but not started before shutdown: hand it back unspent.
            self._release([job])
            self._job_left(job, finished=True)
            return
        handed_to_completer = False
        started = time.monotonic()
        try:
            handed_to_completer = self._execute(job, started, thread_conn)
            took = time.monotonic() - started
            average = self._job_seconds  # a racy update loses a sample at worst
            self._job_seconds = took if average is None else 0.9 * average + 0.1 * took
        except Exception:  # bookkeeping itself failed (database down): the lease expires
            log.exception(
                "could not record the outcome of job %s; it will be retried after "
                "its lease expires",
                job.id,
                extra=_fields(job, outcome="unknown"),
            )
        finally:
            self._job_left(job, finished=not handed_to_completer)

    def _execute(self, job: Claimed, started: float, thread_conn: _ThreadConnection) -> bool:
        """Run the handler and record the outcome; True if the completer now owns the job."""
        handler = self.registry[job.kind]
        ctx = JobContext(
            job.id, job.kind, job.queue, job.attempt, job.max_attempts, self.config.worker_id
        )
        if thread_conn.generation != self._pool_generation:
            thread_conn.close()
            thread_conn.generation = self._pool_generation
        session = HandlerSession(self.engine, autoflush=True, expire_on_commit=False)
        session._sqla_jobs_thread_conn = thread_conn
        try:
            try:
                handler(session, job.payload, ctx)
                if session._sqla_jobs_violation:
                    raise HandlerTransactionError(
                        f"handler called session.{session._sqla_jobs_violation} "
                        "and swallowed the error"
                    )
                # session.add() alone does not begin a transaction: pending objects
                # count as writes too, or they would never be flushed.
                wrote = session.in_transaction() or bool(
                    session.new or session.dirty or session.deleted
                )
                if wrote:
                    session.flush()
                    self._settle(job)
                    if not self._complete_in(session, job):
                        return False
            except BaseException as exc:
                self._discard(session, thread_conn)
                self._settle(job)
                self._retry(job, exc, time.monotonic() - started)
                return False
        finally:
            self._discard(session, thread_conn)
        if wrote:
            self._log_done(job, started)
            return False
        self._settle(job)
        self._completions.put(job)
        self._log_done(job, started)
        return True

    def _settle(self, *jobs: Claimed) -> None:
        with self._lock:
            self._settling.update(j.id for j in jobs)

    def _complete_in(self, session: HandlerSession, job: Claimed) -> bool:
        """Done-mark in the handler's transaction; False (rolled back) if the claim was lost."""
        sql, params = self._complete_one_sql
        # Prepared (unlike the other fenced statements): its scalar fence makes the
        # generic plan a primary-key probe, and it runs once per job that wrote.
        done = self._execute_count(
            session.connection(),
            sql,
            {**params, "job_id": job.id, "attempt": job.attempt},
            prepare=self.config.prepared_statements,
        )
        if not done:
            session.rollback()
            log.warning(
                "job %s: claim lost (lease expired and the job was taken over); "
                "rolled back this run's writes",
                job.id,
                extra=_fields(job, outcome="lost"),
            )
            return False
        session._worker_commit()
        return True

    @staticmethod
    def _discard(session: HandlerSession, thread_conn: _ThreadConnection) -> None:
        """End the job's session; keep the thread's connection only if it is clean."""
        try:
            # A session the handler never used (no transaction, no objects) has nothing
            # to end: closing it only rebuilt its empty identity map, a third of a no-op
            # job's time on its thread.
            if session.in_transaction() or session.identity_map or session.new or session.deleted:
                session.rollback()
                session._worker_close()
        except Exception:
            log.debug("discarding a broken handler session", exc_info=True)
            thread_conn.close()
        try:
            clean = thread_conn.clean()
        except Exception:
            clean = False
        if not clean:
            thread_conn.close()

    def _retry(self, job: Claimed, exc: BaseException, duration: float) -> None:
        handler = self.registry[job.kind]
        delay = handler.backoff.delay(job.attempt)
        stmt = lease.retry(
            worker=self.config.worker_id,
            job_id=job.id,
            attempt=job.attempt,
            delay_seconds=delay,
            error=_describe(exc),
        )
        with self.engine.begin() as conn:
            found = self._execute_fenced(conn, stmt)
        row = found[0] if found else None
        fields = _fields(job, duration=round(duration, 6), error=f"{type(exc).__name__}: {exc}")
        if row is None:
            log.warning(
                "job %s: claim lost before its failure was recorded: %r",
                job.id,
                exc,
                extra={**fields, "outcome": "lost"},
            )
        elif row.status == JobStatus.DEAD:
            log.error(
                "job %s (%s) dead after attempt %s/%s: %r",
                job.id,
                job.kind,
                job.attempt,
                job.max_attempts,
                exc,
                extra={**fields, "outcome": "dead"},
            )
            self._emit("dead", job, duration)
        else:
            log.warning(
                "job %s (%s) failed attempt %s/%s, retry in %.1fs: %r",
                job.id,
                job.kind,
                job.attempt,
                job.max_attempts,
                delay,
                exc,
                extra={**fields, "outcome": "retry"},
            )
            self._emit("retry", job, duration)
            if delay < self.config.poll_interval:
                # A retry is an UPDATE, which fires no notification: wake up for it
                # ourselves instead of leaving it to the next poll.
                timer = threading.Timer(delay, self._wake.set)
                timer.daemon = True
                timer.start()

    def _log_done(self, job: Claimed, started: float) -> None:
        # Checked first: building the structured fields cost as much as a no-op job.
        if log.isEnabledFor(logging.DEBUG):
            duration = time.monotonic() - started
            log.debug(
                "job %s (%s) done in %.3fs",
                job.id,
                job.kind,
                duration,
                extra=_fields(job, duration=round(duration, 6), outcome="done"),
            )
        if self.on_event is not None:
            self.on_event("done", job, time.monotonic() - started)

    def _emit(self, event: str, job: Claimed, duration: float) -> None:
        if self.on_event is not None:
            self.on_event(event, job, duration)

    def _release(self, jobs: Iterable[Claimed]) -> None:
        jobs = list(jobs)
        self._settle(*jobs)
        leases = [j.lease for j in jobs]
        try:
            with self.engine.begin() as conn:
                self._execute_fenced(
                    conn, lease.release(worker=self.config.worker_id, leases=leases)
                )
        except sa_exc.SQLAlchemyError as exc:  # incl. pool timeouts
            log.warning(
                "could not release %d unstarted job(s); they return when their lease expires: %s",
                len(leases),
                _reason(exc),
            )

    # --- completer --------------------------------------------------------------------

    def _complete_loop(self) -> None:
        """Mark done, in batches, the jobs whose handlers wrote nothing."""
        stopping = False
        while not stopping:
            batch: list[Claimed] = []
            item = self._completions.get()
            while True:
                if item is None:
                    stopping = True
                else:
                    batch.append(item)
                if len(batch) >= COMPLETE_BATCH:
                    break
                try:
                    item = self._completions.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._complete_batch(batch)

    def _complete_batch(self, batch: list[Claimed]) -> None:
        sql, params = self._complete_sql[0], self._fenced(j.lease for j in batch)
        for attempt in range(5):
            try:
                with self.engine.begin() as conn:
                    done = {r.id for r in self._execute_raw(conn, sql, params, prepare=False)}
                break
            except sa_exc.SQLAlchemyError as exc:  # incl. pool timeouts
                log.warning(
                    "could not mark %d job(s) done (try %d): %s",
                    len(batch),
                    attempt + 1,
                    _reason(exc),
                )
                time.sleep(min(MAX_ERROR_BACKOFF, 0.2 * 2**attempt))
        else:
            done = set()
        for job in batch:
            if job.id not in done:
                log.warning(
                    "job %s: claim lost before its done-mark; it may run again",
                    job.id,
                    extra=_fields(job, outcome="lost"),
                )
            self._finished(job)

    # --- heartbeat --------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._stopped.wait(self.config.heartbeat_interval):
            with self._lock:
                leases = list(self._held.items())
            if not leases:
                continue
            stmt = lease.heartbeat(
                worker=self.config.worker_id,
                leases=leases,
                lock_seconds=self.config.lock_seconds,
            )
            try:
                with self.engine.begin() as conn:
                    kept = {r.id for r in self._execute_fenced(conn, stmt)}
            except sa_exc.SQLAlchemyError as exc:  # incl. pool timeouts
                log.warning("heartbeat failed (will retry): %s", _reason(exc))
                continue
            for job_id, attempt in leases:
                if job_id not in kept:
                    with self._lock:
                        lost = self._held.get(job_id) == attempt and job_id not in self._settling
                    if lost:
                        log.warning(
                            "job %s: lease lost (expired and taken over, or the job "
                            "was changed by an operator)",
                            job_id,
                            extra={"job_id": job_id, "attempt": attempt, "outcome": "lost"},
                        )

    # --- listener ---------------------------------------------------------------------

    def _listen_loop(self) -> None:
        channel = config_mod.check_channel(locks.NOTIFY_CHANNEL)
        conninfo = self.config.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        failures = 0
        while not self._stopped.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    failures = 0
                    self._wake.set()  # notifications sent while we were away are lost: poll
                    while not self._stopped.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self._wake.set()
            except psycopg.Error as exc:
                failures += 1
                pause = min(MAX_ERROR_BACKOFF, 0.1 * 2**failures)
                log.warning("listener connection lost (reconnecting in %.1fs): %s", pause, exc)
                self._stopped.wait(pause)

    # --- archiver ---------------------------------------------------------------------

    def _archive_loop(self) -> None:
        """Archive finished jobs every ``archive_every`` seconds, first right at start-up."""
        every = self.config.archive_every
        assert every is not None
        while not self._stopping.is_set():
            try:
                self._archive_once()
            except sa_exc.SQLAlchemyError as exc:
                log.warning("archiving failed (next try in %.0fs): %s", every, exc)
            if self._stopping.wait(every):
                return

    def _archive_once(self) -> None:
        from sqla_jobs import ops

        with self.engine.connect() as conn:
            # A session-level lock: held across the batches' commits, released below or
            # by PostgreSQL when this connection dies. Whoever fails to get it skips its turn.
            got = conn.execute(locks.try_advisory_lock(locks.ARCHIVE_LOCK_KEY)).scalar_one()
            conn.commit()
            if not got:
                log.debug("another worker is archiving; skipping this turn")
                return
            moved = 0
            try:
                with Session(bind=conn) as session:
                    older_than = timedelta(seconds=self.config.archive_older_than)
                    for count in ops.archive_batches(session, older_than):
                        moved += count
                        if self._stopping.is_set():
                            break
            finally:
                conn.execute(locks.advisory_unlock(locks.ARCHIVE_LOCK_KEY))
                conn.commit()
        if moved:
            log.info("archived %d finished job(s)", moved, extra={"outcome": "archived"})


if __name__ == "__main__":
    from sqla_jobs import cli

    raise SystemExit(cli.worker_main())
