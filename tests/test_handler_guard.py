"""A handler cannot end the worker's transaction, by any route a SQLAlchemy user knows.

Each refused route writes an effect row first, then tries to commit, roll back, begin or
close the job's transaction. The attempt must fail with HandlerTransactionError and the
effect must not survive: never a done job without its writes, never writes of a failed
job. Routes that keep the transaction (savepoints, session.rollback()) keep working.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from helpers import rows, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from test_worker import running

from sqla_jobs import Handler, HandlerTransactionError, JobContext, Registry, current_job

registry = Registry()

SETUP = "CREATE TABLE marks (job_id bigint NOT NULL, label text NOT NULL)"


def _mark(session: Session, job: JobContext, label: str = "x") -> None:
    session.execute(
        sa.text("INSERT INTO marks (job_id, label) VALUES (:j, :l)"), {"j": job.id, "l": label}
    )


def _begin_block(session: Session, job: JobContext) -> None:
    with session.begin():
        _mark(session, job, "in block")
    raise RuntimeError("after the block")


def _connection_begin(session: Session, job: JobContext) -> None:
    with session.connection().begin():
        pass


def _autocommit(session: Session, job: JobContext) -> None:
    session.connection().execution_options(isolation_level="AUTOCOMMIT")


ROUTES: dict[str, Callable[[Session, JobContext], Any]] = {
    "session.commit()": lambda s, j: s.commit(),
    "session.close()": lambda s, j: s.close(),
    "session.begin()": _begin_block,
    "session.reset()": lambda s, j: s.reset(),
    "session.invalidate()": lambda s, j: s.invalidate(),
    "connection.commit()": lambda s, j: s.connection().commit(),
    "connection.rollback()": lambda s, j: s.connection().rollback(),
    "connection.begin()": _connection_begin,
    "connection.close()": lambda s, j: s.connection().close(),
    "connection.invalidate()": lambda s, j: s.connection().invalidate(),
    "AUTOCOMMIT": _autocommit,
    "a commit of the job's transaction": lambda s, j: s.get_transaction().commit(),  # type: ignore[union-attr]
    "SQL COMMIT": lambda s, j: s.execute(sa.text("COMMIT")),
    "SQL ROLLBACK": lambda s, j: s.execute(sa.text("rollback")),
    "SQL END": lambda s, j: s.execute(sa.text("END")),
    "SQL ABORT": lambda s, j: s.execute(sa.text("ABORT")),
    "SQL BEGIN": lambda s, j: s.execute(sa.text("BEGIN")),
    "SQL START": lambda s, j: s.execute(sa.text("START TRANSACTION")),
    "SQL PREPARE TRANSACTION": lambda s, j: s.execute(sa.text("PREPARE TRANSACTION 'x'")),
    "SQL COMMIT ": lambda s, j: s.connection().exec_driver_sql(
        "INSERT INTO marks VALUES (0, 'multi'); /* then */ COMMIT"
    ),
}


@registry.handler("refused", max_attempts=1)
def refused(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _mark(session, job)
    route = ROUTES[payload["route"]]
    if payload["swallow"]:
        with contextlib.suppress(HandlerTransactionError):
            route(session, job)
    else:
        route(session, job)


@registry.handler("begin_first", max_attempts=1)
def begin_first(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """The new user's case: the block is the handler's first use of the session."""
    with session.begin():
        _mark(session, job, "in block")
    raise RuntimeError("after the block")


@registry.handler("below_sqlalchemy", max_attempts=1)
def below_sqlalchemy(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _mark(session, job)
    session.connection().connection.driver_connection.commit()  # type: ignore[union-attr]


def _coroutine_behind_a_plain_function() -> Any:
    async def body(session: Session, payload: dict[str, Any]) -> None:
        _mark(session, current_job(), "async body")

    return lambda session, payload: body(session, payload)


registry.register("wrapped_async", _coroutine_behind_a_plain_function(), max_attempts=1)


@registry.handler("allowed")
def allowed(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _mark(session, job, "discarded by rollback")
    session.rollback()
    _mark(session, job, "kept")
    with contextlib.suppress(ValueError), session.begin_nested():
        _mark(session, job, "discarded by savepoint")
        raise ValueError("roll back the savepoint")
    session.execute(sa.text("SAVEPOINT manual"))
    _mark(session, job, "discarded by text savepoint")
    session.execute(sa.text("ROLLBACK TO SAVEPOINT manual"))
    session.execute(sa.text("INSERT INTO marks VALUES (:j, 'quoted; COMMIT; END')"), {"j": job.id})
    session.execute(sa.text("SELECT CASE WHEN true THEN 1 END"))


def _enqueue(
    engine: sa.Engine, handler: Handler[None], payloads: list[dict[str, Any]]
) -> dict[int, Any]:
    with Session(engine) as s:
        ids = {handler.enqueue(s, p): p for p in payloads}
        s.commit()
    return ids  # type: ignore[return-value]


def _finished(engine: sa.Engine, count: int) -> list[Any]:
    found = rows(
        engine,
        "SELECT id, status::text, attempts, last_error FROM jobs"
        " WHERE status::text IN ('done', 'dead') ORDER BY id",
    )
    return found if len(found) == count else []


def test_every_route_that_ends_the_handlers_transaction_is_refused_and_rolled_back(
    engine: sa.Engine, db_url: URL
) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP)
    payloads = [{"route": r, "swallow": s} for r in ROUTES for s in (False, True)]
    jobs = _enqueue(engine, refused, payloads)
    with running(registry, db_url, concurrency=2):
        finished = wait_for(lambda: _finished(engine, len(jobs)), message="every job finished")
    for job_id, status, attempts, last_error in finished:
        route = jobs[job_id]["route"].strip()
        assert (status, attempts) == ("dead", 1), (jobs[job_id], status)
        assert "sqla_jobs.exceptions.HandlerTransactionError" in last_error, jobs[job_id]
        assert route in last_error, (jobs[job_id], last_error.splitlines()[0])
    assert rows(engine, "SELECT job_id, label FROM marks") == []


def test_a_with_session_begin_block_as_the_first_use_is_refused_and_leaves_no_row(
    engine: sa.Engine, db_url: URL
) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP)
    _enqueue(engine, begin_first, [{}])
    with running(registry, db_url):
        ((_, status, _, last_error),) = wait_for(lambda: _finished(engine, 1))
    assert status == "dead"
    assert last_error.startswith(
        "sqla_jobs.exceptions.HandlerTransactionError: handlers must not end the job's "
        "transaction (session.begin())"
    )
    assert rows(engine, "SELECT job_id, label FROM marks") == []


def test_a_commit_below_sqlalchemy_fails_the_attempt_instead_of_a_silent_done(
    engine: sa.Engine, db_url: URL
) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP)
    (job_id,) = _enqueue(engine, below_sqlalchemy, [{}])
    with running(registry, db_url):
        ((_, status, _, last_error),) = wait_for(lambda: _finished(engine, 1))
    assert status == "dead"
    assert "the transaction was ended" in last_error
    assert "what it committed that way stays committed" in last_error
    # The limit the README states: what the DBAPI committed cannot be taken back.
    assert rows(engine, "SELECT job_id FROM marks") == [(job_id,)]


def test_a_handler_that_returns_an_unrun_coroutine_fails_instead_of_a_silent_done(
    engine: sa.Engine, db_url: URL
) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP)
    _enqueue(engine, registry["wrapped_async"], [{}])
    with running(registry, db_url):
        ((_, status, _, last_error),) = wait_for(lambda: _finished(engine, 1))
    assert status == "dead"
    assert last_error.startswith(
        "builtins.TypeError: the handler returned coroutine object instead of running"
    )
    assert rows(engine, "SELECT label FROM marks") == []


def test_savepoints_and_session_rollback_keep_working_in_a_handler(
    engine: sa.Engine, db_url: URL
) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP)
    (job_id,) = _enqueue(engine, allowed, [{}])
    with running(registry, db_url):
        ((_, status, _, last_error),) = wait_for(lambda: _finished(engine, 1))
    assert (status, last_error) == ("done", None)
    assert sorted(rows(engine, "SELECT job_id, label FROM marks")) == [
        (job_id, "kept"),
        (job_id, "quoted; COMMIT; END"),
    ]
