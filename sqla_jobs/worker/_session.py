"""The handler's session, the connection under it, and the guard on their transaction.

The worker promises that a handler's database writes commit with the job's done-mark,
in one transaction. That holds only if the handler cannot end that transaction itself,
by any route a SQLAlchemy user knows. Each job gets a new ``HandlerSession`` whose
transactions run on the handler thread's own ``GuardedConnection``; while the
handler runs, the guard is *armed* and refuses, with
[``HandlerTransactionError``][sqla_jobs.exceptions.HandlerTransactionError]:

* ``session.commit()``, ``session.close()``, ``session.begin()`` (as a block or not),
  ``session.reset()`` and ``session.invalidate()``;
* on the connection: ``commit()``, ``rollback()``, ``begin()`` inside the running
  transaction, ``close()``, ``invalidate()``, ``detach()``, and the AUTOCOMMIT isolation
  level; and a commit or rollback of the connection's transaction by any other route
  (``session.get_transaction().commit()``, ...), caught by the connection's events;
* SQL text that ends or starts a transaction: ``COMMIT``, ``ROLLBACK`` (but not
  ``ROLLBACK TO SAVEPOINT``), ``END``, ``ABORT``, ``BEGIN``, ``START TRANSACTION``,
  ``PREPARE TRANSACTION``, in any statement of a multi-statement text.

``session.rollback()`` (discard the writes so far and go on) and ``session.begin_nested()``
(a SAVEPOINT) stay allowed. Whatever a refused call left behind, the worker closes the
connection (PostgreSQL rolls the transaction back) and records a failed attempt. As a
last line, after every handler the worker asks the driver whether the transaction it
opened is still open (``Guard.ended_by_handler``); a handler that went below
SQLAlchemy to the DBAPI connection and committed is caught there, though writes it
committed that way cannot be taken back (the Handlers guide says so).
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, cast

import psycopg
import sqlalchemy as sa
import sqlparse
from sqlalchemy.orm import Session, SessionTransaction
from sqlalchemy.util.concurrency import in_greenlet

from sqla_jobs import validation
from sqla_jobs.control import Control
from sqla_jobs.exceptions import HandlerTransactionError, ResultError
from sqla_jobs.sql import lease
from sqla_jobs.worker import _connlost, _db

log = logging.getLogger("sqla_jobs.worker")

# A cheap first look: only statements that mention one of these words are parsed.
_SUSPECT = re.compile(r"\b(COMMIT|ROLLBACK|END|ABORT|BEGIN|START|PREPARE)\b", re.IGNORECASE)
_ENDS_TRANSACTION = {"COMMIT", "ROLLBACK", "END", "ABORT", "BEGIN", "START"}


def _transaction_control(statement: str) -> str | None:
    """The first word of a statement in ``statement`` that ends or starts a transaction.

    Parsed with sqlparse, so quoted text (``'a; COMMIT'``, ``$$...$$``) and comments do not
    count, and every statement of a multi-statement text is looked at.
    """
    if _SUSPECT.search(statement) is None:
        return None
    for parsed in sqlparse.parse(statement):
        words = [
            t.normalized.upper()
            for t in parsed.flatten()  # type: ignore[no-untyped-call]
            if not t.is_whitespace and t.ttype not in sqlparse.tokens.Comment
        ][:2]
        if not words:
            continue
        first, second = words[0], (words[1] if len(words) > 1 else "")
        if first == "ROLLBACK" and second == "TO":
            continue  # ROLLBACK TO SAVEPOINT: begin_nested()'s own statement
        if first in _ENDS_TRANSACTION or (first == "PREPARE" and second == "TRANSACTION"):
            return f"{first} {second}".strip() if first == "PREPARE" else first
    return None


class Guard:
    """Whether the handler's transaction may be ended now, and what the handler tried."""

    __slots__ = ("armed", "executed", "violation")

    def __init__(self) -> None:
        self.armed = False
        self.violation: str | None = None
        self.executed = False  # a statement ran in the current transaction

    def refuse(self, what: str) -> HandlerTransactionError:
        self.violation = self.violation or what
        return HandlerTransactionError(
            f"handlers must not end the job's transaction ({what}): the worker commits its writes "
            "together with the job's done-mark (use session.flush() to send writes, "
            "session.rollback() to discard them, session.begin_nested() for a savepoint)"
        )

    @contextmanager
    def disarmed(self) -> Iterator[None]:
        armed, self.armed = self.armed, False
        try:
            yield
        finally:
            self.armed = armed

    def ended_by_handler(self, conn: sa.Connection | None) -> str | None:
        """Why the handler's transaction is not the one the worker opened, or None."""
        if self.violation:
            return self.violation
        if conn is None or not self.executed or conn.closed or conn.invalidated:
            return None
        driver = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
        if driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            return "a commit or rollback on the DBAPI connection (the transaction was ended)"
        return None


class ClaimLost(Exception):
    """The done-mark sent with the commit found the claim lost: nothing was committed
    (the transaction was rolled back)."""


class GuardedConnection(sa.Connection):
    """A handler thread's connection: refuses, while armed, to end its transaction."""

    guard: Guard
    #: The job's done-mark (SQL, parameters, whether to prepare it), sent in the same
    #: round trip as this transaction's COMMIT (``HandlerSession.worker_commit``);
    #: None once sent.
    done_mark: tuple[str, dict[str, Any], bool] | None = None

    def _check(self, what: str) -> None:
        if self.guard.armed:
            raise self.guard.refuse(what)

    def commit(self) -> None:
        self._check("connection.commit()")
        super().commit()

    def rollback(self) -> None:
        self._check("connection.rollback()")
        super().rollback()

    def begin(self) -> sa.RootTransaction:
        if self.in_transaction():
            self._check("connection.begin()")
        return super().begin()

    def close(self) -> None:
        self._check("connection.close()")
        super().close()

    def invalidate(self, exception: BaseException | None = None) -> None:
        # SQLAlchemy's own invalidation of a lost connection (a disconnect, a failover's
        # read-only node): the server ended the transaction, not the handler.
        if not _connlost.is_lost(exception):
            self._check("connection.invalidate()")
        super().invalidate(exception)

    def detach(self) -> None:
        self._check("connection.detach()")
        super().detach()

    def execution_options(self, **opt: Any) -> GuardedConnection:
        if str(opt.get("isolation_level", "")).upper() == "AUTOCOMMIT":
            self._check("the AUTOCOMMIT isolation level")
        super().execution_options(**opt)
        return self


def _connect(engine: sa.Engine) -> GuardedConnection:
    conn = GuardedConnection(engine)
    guard = conn.guard = Guard()

    @sa.event.listens_for(conn, "begin")
    def _began(_conn: sa.Connection) -> None:
        guard.executed = False

    @sa.event.listens_for(conn, "commit")
    def _commit(_conn: sa.Connection) -> None:
        if guard.armed:
            raise guard.refuse("a commit of the job's transaction")
        # After the session's flush and before_commit hooks (so their writes are in the
        # transaction): the done-mark and the COMMIT in one round trip; the driver's own
        # commit that follows finds the transaction over and sends nothing.
        done_mark, conn.done_mark = conn.done_mark, None
        if done_mark is not None:
            sql, params, prepare = done_mark
            if not _db.commit_with(conn, sql, params, prepare=prepare, lost_text=lease.CLAIM_LOST):
                raise ClaimLost("the done-mark matched no row: the claim was lost")

    @sa.event.listens_for(conn, "rollback")
    def _rollback(_conn: sa.Connection) -> None:
        if guard.armed:
            raise guard.refuse("a rollback of the job's connection")

    @sa.event.listens_for(conn, "before_cursor_execute", retval=True)
    def _statement(
        _conn: sa.Connection, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> tuple[str, Any]:
        if guard.armed:
            found = _transaction_control(statement)
            if found is not None:
                raise guard.refuse(f"SQL {found}")
            guard.executed = True
        return statement, params

    return conn


class ThreadConnection:
    """A handler thread's own connection, kept from one job to the next.

    Checking a pooled connection out and back in for every job (pool bookkeeping, reset,
    events) cost about 15% of the worker's time per job that writes one row. The worker
    gives it up (back to the pool, which resets or discards it) whenever a job leaves it
    in any state but clean: invalidated or closed, still in a transaction, its execution
    options changed (e.g. an isolation level), or the pool invalidated since it was taken.
    """

    __slots__ = (
        "conn",
        "control",
        "engine",
        "generation",
        "in_greenlet",
        "options",
        "pending",
        "used",
    )

    def __init__(self, engine: sa.Engine, *, in_greenlet: bool = False) -> None:
        self.engine = engine
        #: An AsyncSession's connection (the engine's pool is asyncio's): taken only in
        #: the session's greenlet, when the session first looks up its bind (see
        #: HandlerSession.get_bind). A session.add() begins the session's transaction
        #: outside any greenlet, where no connection can be taken.
        self.in_greenlet = in_greenlet
        self.pending = False  # a transaction began and waits for its connection
        self.conn: GuardedConnection | None = None
        self.options: Any = None
        self.generation = 0  # the worker's pool generation when conn was taken
        # Whether a session ran on conn since the last clean(): a job that never touched
        # the database (no-op handlers) skips the checks, a fifth of such a job's cost.
        self.used = False
        # The running job's deadline (set by the executor per job): its transaction
        # begins with statement_timeout set to the time left.
        self.control: Control | None = None

    @property
    def guard(self) -> Guard | None:
        return None if self.conn is None else self.conn.guard

    def connect(self) -> GuardedConnection:
        self.used = True
        if self.conn is None:
            self.conn = _connect(self.engine)
            self.options = self.conn.get_execution_options()
        return self.conn

    def cancel_statement(self) -> None:
        """Cancel the statement the handler's connection runs, from another thread."""
        conn = self.conn
        if conn is None or conn.closed or conn.invalidated:
            return
        driver = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
        if not (driver.closed or driver.broken):
            driver.cancel()

    def clean(self) -> bool:
        conn = self.conn
        if conn is None or not self.used:
            return True
        self.used = False
        if conn.guard.violation or conn.closed or conn.invalidated or conn.in_transaction():
            return False
        if conn.get_execution_options() is not self.options:
            return False
        driver = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
        return not (driver.closed or driver.broken) and (
            driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )

    def close(self) -> None:
        """Give the connection up; after a refused call, close it so its transaction dies."""
        conn, self.conn = self.conn, None
        if conn is None:
            return
        conn.guard.armed = False
        try:
            if conn.guard.violation and not conn.invalidated:
                # Whatever the handler half-did to the transaction, PostgreSQL rolls it
                # back when the connection goes; the pool must not reuse it.
                conn.invalidate()
            conn.close()
        except Exception:
            log.debug("closing a handler thread's connection", exc_info=True)


class HandlerSession(Session):
    """The Session a handler receives: its transaction belongs to the worker.

    Use ``flush()`` to send writes early, ``rollback()`` to discard them and
    ``begin_nested()`` for a savepoint; the worker commits what is left with the job's
    done-mark when the handler returns. Each job gets a new session; its transaction runs
    on the handler thread's own connection (``get_bind()`` is still the engine).
    """

    _sqla_jobs_thread_conn: ThreadConnection | None = None
    #: What a refused call tried, even if the handler caught the error.
    _sqla_jobs_violation: str | None = None

    def get_bind(self, *args: Any, **kw: Any) -> Any:
        thread_conn = self._sqla_jobs_thread_conn
        if thread_conn is not None and thread_conn.pending and in_greenlet():
            # Every statement and flush looks up its bind just before it takes its
            # connection, in the AsyncSession's greenlet: the deferred connection is
            # taken there, on the first one.
            thread_conn.pending = False
            _bind_transaction(self, thread_conn)
        return super().get_bind(*args, **kw)

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
        self._violate("session.commit()")

    def close(self) -> None:
        self._violate("session.close()")

    def reset(self) -> None:
        self._violate("session.reset()")

    def invalidate(self) -> None:
        self._violate("session.invalidate()")

    def begin(self, nested: bool = False) -> SessionTransaction:
        if nested:
            return super().begin(nested=True)
        self._violate("session.begin()")

    def rollback(self) -> None:
        guard = self._guard()
        if guard is None:
            super().rollback()
            return
        with guard.disarmed():  # discarding the writes so far is allowed; a new one begins
            super().rollback()

    def _violate(self, what: str) -> NoReturn:
        self._sqla_jobs_violation = what
        raise (self._guard() or Guard()).refuse(what)

    # The worker's own ends of the transaction.

    def worker_commit(self, done_mark: tuple[str, dict[str, Any], bool] | None = None) -> None:
        """Commit the job's transaction; with ``done_mark`` (a statement that fails when
        the claim was lost, see ``lease.complete_one_before_commit``), send it in the
        same round trip as the COMMIT. Raises ``ClaimLost`` when it found the claim
        lost (nothing committed)."""
        guard = self._guard()
        thread_conn = self._sqla_jobs_thread_conn
        conn = None if thread_conn is None else thread_conn.conn
        if done_mark is not None:
            if conn is None or not self.in_transaction():
                raise RuntimeError("the job's transaction is not on its thread's connection")
            conn.done_mark = done_mark
        try:
            with guard.disarmed() if guard is not None else _nothing():
                Session.commit(self)
        finally:
            unsent = conn is not None and conn.done_mark is not None
            if conn is not None:
                conn.done_mark = None
        if done_mark is not None and unsent:
            # The commit never reached the connection's commit (nothing would mark the
            # job done): an outcome not recorded, left to the lease.
            raise RuntimeError("the job's done-mark was not sent with its commit")

    def worker_close(self) -> None:
        guard = self._guard()
        with guard.disarmed() if guard is not None else _nothing():
            Session.rollback(self)
            Session.close(self)

    def _guard(self) -> Guard | None:
        thread_conn = self._sqla_jobs_thread_conn
        return None if thread_conn is None else thread_conn.guard


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@sa.event.listens_for(HandlerSession, "after_transaction_create")
def _on_transaction(session: Session, transaction: SessionTransaction) -> None:
    # Every (outermost) transaction of a handler's session starts on the handler
    # thread's own connection instead of a pooled checkout; later lookups of the engine
    # (execute, flush, connection()) find it. Only when the session first needs the
    # database (autobegin), so a handler that never touches it costs no connection.
    thread_conn = cast(HandlerSession, session)._sqla_jobs_thread_conn
    if thread_conn is not None and transaction.parent is None:
        if thread_conn.in_greenlet and not in_greenlet():
            thread_conn.pending = True
            return
        _bind_transaction(session, thread_conn)


def _bind_transaction(session: Session, thread_conn: ThreadConnection) -> None:
    conn = thread_conn.connect()
    conn.guard.armed = True
    session.connection(bind_arguments={"bind": conn})
    control = thread_conn.control
    time_left = None if control is None else control.time_left()
    if time_left is not None:
        # The handler's database work ends with its time; 1 ms, not 0 (no limit),
        # when the deadline has already passed.
        ms = max(1, int(time_left * 1000))
        conn.execute(lease.statement_timeout(ms), {"ms": ms})


def open_session(engine: sa.Engine, thread_conn: ThreadConnection) -> HandlerSession:
    """A new session for one job, its transactions on ``thread_conn``, the guard armed."""
    session = HandlerSession(engine, autoflush=True, expire_on_commit=False)
    session._sqla_jobs_thread_conn = thread_conn
    guard = thread_conn.guard
    if guard is not None:
        guard.armed, guard.violation, guard.executed = True, None, False
    return session


def disarm(thread_conn: ThreadConnection) -> None:
    """The handler returned: the worker may end the transaction again."""
    if thread_conn.conn is not None:
        thread_conn.conn.guard.armed = False


def discard(session: HandlerSession, thread_conn: ThreadConnection) -> None:
    """End the job's session; keep the thread's connection only if it is clean."""
    disarm(thread_conn)
    try:
        # A session the handler never used (no transaction, no objects) has nothing
        # to end: closing it only rebuilt its empty identity map, a third of a no-op
        # job's time on its thread.
        if session.in_transaction() or session.identity_map or session.new or session.deleted:
            session.worker_close()
    except Exception:
        log.debug("discarding a broken handler session", exc_info=True)
        thread_conn.close()
    try:
        clean = thread_conn.clean()
    except Exception:
        clean = False
    if not clean:
        thread_conn.close()


def check_ran(returned: object) -> None:
    """A coroutine or generator returned by a wrapped handler means its body never ran."""
    if inspect.isawaitable(returned) or inspect.isgenerator(returned):
        close = getattr(returned, "close", None)
        if close is not None:
            close()  # no "never awaited" warning: the failure below says it
        raise TypeError(
            f"the handler returned {type(returned).__name__} object instead of running: "
            "an async or generator function behind a plain one; its body never ran"
        )


def check_transaction(session: HandlerSession, thread_conn: ThreadConnection) -> None:
    """The last line: the handler's transaction must still be the one the worker opened."""
    refused = session._sqla_jobs_violation
    guard = thread_conn.guard
    problem = refused
    if problem is None and guard is not None:
        problem = guard.ended_by_handler(thread_conn.conn)
    if problem is None:
        return
    if refused is None and guard is not None and guard.violation is None:
        # Found by the driver's status: the commit happened below SQLAlchemy.
        raise HandlerTransactionError(
            f"the handler ended the job's transaction ({problem}); what it committed that "
            "way stays committed, the rest was rolled back, and the attempt counts as failed"
        )
    raise HandlerTransactionError(
        f"the handler ended, or tried to end, the job's transaction ({problem}); "
        "its writes were rolled back and the attempt counts as failed"
    )


def returned(
    value: object, session: HandlerSession, thread_conn: ThreadConnection, control: Control
) -> tuple[str | None, bool]:
    """After a handler returned (its guard disarmed): ``(result to store, wrote)``, or the
    exception that makes the return a failed attempt. One set of checks for both executors."""
    if value is not None:
        check_ran(value)
    check_transaction(session, thread_conn)
    stop = control.interruption()
    if stop is not None:  # it returned, but too late or after a cancel
        raise stop
    result = stored_result(value)
    # session.add() alone does not begin a transaction: pending objects count as writes
    # too, or they would never be flushed.
    # ``dirty`` walks the identity map: only asked when it holds something.
    wrote = session.in_transaction() or bool(
        session.new or session.deleted or (session.identity_map and session.dirty)
    )
    return result, wrote


def stored_result(value: object) -> str | None:
    """The handler's return value as JSON text for the done-mark; ResultError if it
    cannot be stored (the attempt fails; nothing is truncated)."""
    if value is None:
        return None
    try:
        return validation.dump_result(value)
    except ValueError as exc:
        raise ResultError(str(exc)) from None
