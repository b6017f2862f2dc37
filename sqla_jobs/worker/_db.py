"""How the worker sends its own statements: compiled once, on the driver's cursor.

Building, cache-keying and compiling a Core statement on every execution took more
Python time than a no-op job, so the statements run per batch (claim) or per job
(done-mark) are compiled once and executed with new values only. Errors come back as
SQLAlchemy's, like every other database error the worker handles.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

import psycopg
import sqlalchemy as sa
from psycopg.rows import namedtuple_row, tuple_row
from psycopg.types.json import set_json_loads
from sqlalchemy import exc as sa_exc

from sqla_jobs.worker import _connlost

_T = TypeVar("_T")

Compiled = tuple[str, dict[str, Any]]

_PAYLOADS = json.JSONDecoder()


def load_payload(data: str | bytes) -> Any:
    """Decode a claimed job's payload (``json_loads`` of the claims)."""
    # The claim decodes every payload, on the thread that feeds all handlers. psycopg's
    # default, json.loads on bytes, first sniffs the encoding: half of the dispatcher's
    # time on no-op jobs. jsonb text is UTF-8 (as json.loads assumes) and one value with
    # nothing around it, so the decoder's raw_decode suffices.
    text = data if isinstance(data, str) else bytes(data).decode()
    return _PAYLOADS.raw_decode(text)[0]


def compile_statement(engine: sa.Engine, stmt: sa.ClauseElement) -> Compiled:
    compiled = stmt.compile(dialect=engine.dialect)
    return str(compiled), dict(compiled.params)


def rows(
    conn: sa.Connection,
    sql: str,
    params: dict[str, Any],
    *,
    prepare: bool,
    json_loads: Callable[[str | bytes], Any] | None = None,
    tuples: bool = False,
) -> list[Any]:
    """Run compiled SQL on the driver's cursor, choosing whether psycopg prepares it.

    ``tuples``: plain tuples instead of named ones (a claim's rows become ``Claimed``
    at once; building a named tuple first cost a microsecond per job).

    Never prepared: the fenced statements that take arrays of leases. A prepared
    statement gets a generic plan, and theirs is quadratic: the planner cannot see
    the arrays' length, and with the stale statistics a queue table always has
    (the running jobs look few) it scanned every running job and re-ran unnest()
    for each: 100 ms to mark 900 jobs done.
    """
    return _on_cursor(
        conn,
        sql,
        params,
        prepare,
        lambda c: c.fetchall() if c.description else [],
        json_loads,
        tuples,
    )


def pipelined(
    conn: sa.Connection,
    first: Iterable[Compiled],
    reads: Sequence[Compiled],
    *,
    commit: bool,
    prepare: bool,
    json_loads: Callable[[str | bytes], Any] | None = None,
) -> list[list[Any]]:
    """Run ``first``, then each of ``reads``, then commit if ``commit``, all in one round
    trip (psycopg's pipeline mode); return the rows of each read.

    The server still runs them one after the other, each with a snapshot of its own:
    a statement after ``pg_advisory_xact_lock`` sees every commit made before the lock
    was granted, as if sent on its own.
    """
    driver = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
    sql, params = reads[-1]
    try:
        with driver.pipeline(), driver.cursor() as before:
            for sql, params in first:
                before.execute(sql, params, prepare=prepare)
            cursors = [driver.cursor(row_factory=namedtuple_row) for _ in reads]
            try:
                for cursor, (sql, params) in zip(cursors, reads, strict=True):
                    if json_loads is not None:
                        set_json_loads(json_loads, cursor)
                    cursor.execute(sql, params, prepare=prepare)
                if commit:
                    driver.commit()
                return [cursor.fetchall() for cursor in cursors]
            finally:
                for cursor in cursors:
                    cursor.close()
    except psycopg.Error as exc:
        raise _wrap(conn, driver, sql, params, exc) from exc


def rows_and_commit(
    conn: sa.Connection,
    sql: str,
    params: dict[str, Any],
    *,
    prepare: bool,
    json_loads: Callable[[str | bytes], Any] | None = None,
) -> list[Any]:
    """Like ``rows``, then commit, in one round trip (``pipelined``).

    The caller's ``engine.begin()`` block then commits a transaction that is already
    over, which psycopg treats as nothing to do.
    """
    (found,) = pipelined(
        conn, (), ((sql, params),), commit=True, prepare=prepare, json_loads=json_loads
    )
    return found


def commit_with(
    conn: sa.Connection, sql: str, params: dict[str, Any], *, prepare: bool, lost_text: str
) -> bool:
    """Run ``sql`` and commit, in one round trip (``pipelined``); False, with the
    transaction rolled back, when ``sql`` failed with an error naming ``lost_text`` (a
    statement that fails aborts the transaction: the commit behind it does not run).

    For ``sqla_jobs.sql.lease.complete_one_before_commit``. Any other error is
    raised, as SQLAlchemy's, the transaction left for the caller to roll back.
    """
    driver = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
    try:
        pipelined(conn, (), ((sql, params),), commit=True, prepare=prepare)
    except sa_exc.DBAPIError as exc:
        orig = exc.orig
        if isinstance(orig, psycopg.errors.InvalidTextRepresentation) and lost_text in str(orig):
            driver.rollback()
            return False
        raise
    return True


def count(conn: sa.Connection, sql: str, params: dict[str, Any], *, prepare: bool) -> int:
    """Like ``rows``; returns the number of rows affected (no rows built)."""
    return _on_cursor(conn, sql, params, prepare, lambda c: c.rowcount)


def fenced(engine: sa.Engine, conn: sa.Connection, stmt: sa.ClauseElement) -> list[Any]:
    """Build, compile and run a fenced statement over leases (never prepared)."""
    return rows(conn, *compile_statement(engine, stmt), prepare=False)


def lease_arrays(leases: Iterable[tuple[int, int]]) -> dict[str, str]:
    """``fence_ids`` and ``fence_attempts`` as array literals.

    Sent as text (the statement casts them to bigint[] and integer[]): psycopg's list
    dumper runs a regular expression over every element, a quarter of the completer's
    time; the text of Python ints is exact.
    """
    ids, attempts = [], []
    for job_id, attempt in leases:
        ids.append(str(int(job_id)))
        attempts.append(str(int(attempt)))
    return {
        "fence_ids": "{" + ",".join(ids) + "}",
        "fence_attempts": "{" + ",".join(attempts) + "}",
    }


def _on_cursor(
    conn: sa.Connection,
    sql: str,
    params: dict[str, Any],
    prepare: bool,
    result: Callable[[psycopg.Cursor[Any]], _T],
    json_loads: Callable[[str | bytes], Any] | None = None,
    tuples: bool = False,
) -> _T:
    driver = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
    try:
        with driver.cursor(row_factory=tuple_row if tuples else namedtuple_row) as cursor:
            if json_loads is not None:
                set_json_loads(json_loads, cursor)
            cursor.execute(sql, params, prepare=prepare)
            return result(cursor)
    except psycopg.Error as exc:
        raise _wrap(conn, driver, sql, params, exc) from exc


def _wrap(
    conn: sa.Connection,
    driver: psycopg.Connection[Any],
    sql: str,
    params: dict[str, Any],
    exc: psycopg.Error,
) -> sa_exc.StatementError:
    """SQLAlchemy's error for ``exc``; a lost connection (a closed socket, or a read-only
    or recovering server, see _connlost) is dropped with its pool first, so the next
    checkout opens a new one."""
    lost = driver.closed or driver.broken or _connlost.is_lost(exc)
    if lost and not conn.invalidated:
        _connlost.invalidate_pool(conn, exc)
    return sa_exc.DBAPIError.instance(sql, params, exc, psycopg.Error, connection_invalidated=lost)


def reason(exc: BaseException) -> object:
    """The driver's error when there is one (shorter and clearer than SQLAlchemy's wrapper)."""
    return getattr(exc, "orig", None) or exc
