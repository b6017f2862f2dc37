"""Handlers that steer their job (Snooze, RetryIn, Discard), return results, run past
their timeout or wait to be cancelled; workers load it as ``controlapp:registry``.

Every handler that writes inserts ``effects(job_id)`` in its own transaction (committed
with the done-mark, or rolled back); ``runs`` is logged on a separate autocommit
connection, so it records each start even when the attempt's writes are rolled back.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from jobapp import SETUP_SQL as SETUP_SQL
from sqlalchemy.orm import Session

from sqla_jobs import Backoff, Discard, JobContext, Registry, RetryIn, Snooze, validation

registry = Registry()
FAST = Backoff(base=0.05, cap=0.2)
#: The timeout of the handlers that start a statement late (``late_statement``).
LATE_TIMEOUT = 3.0


def _effect(session: Session, job: JobContext) -> None:
    session.execute(
        sa.text("INSERT INTO effects (job_id, worker, attempt) VALUES (:j, :w, :a)"),
        {"j": job.id, "w": job.worker, "a": job.attempt},
    )
    session.flush()


def _mark_end(session: Session, job: JobContext) -> None:
    """Log (autocommit) when this run saw its statement stopped, by the database's clock."""
    engine = session.get_bind()
    assert isinstance(engine, sa.Engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(_END_RUN, {"j": job.id, "a": job.attempt})


_END_RUN = sa.text(
    "UPDATE runs SET ended_at = clock_timestamp() WHERE job_id = :j AND attempt = :a"
)


def _log_run(session: Session, job: JobContext) -> int:
    """Log this start on an autocommit connection; return how many starts the job had."""
    engine = session.get_bind()
    assert isinstance(engine, sa.Engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(
            sa.text("INSERT INTO runs (job_id, worker, attempt) VALUES (:j, :w, :a)"),
            {"j": job.id, "w": job.worker, "a": job.attempt},
        )
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM runs WHERE job_id = :j"), {"j": job.id}
            ).scalar_one()
        )


# --- decisions ----------------------------------------------------------------------


@registry.handler("snooze_twice", backoff=FAST)
def snooze_twice(session: Session, payload: dict[str, Any], job: JobContext) -> str:
    """Writes its effect, then snoozes on its first two runs; returns on the third.

    A snoozed run's write must be rolled back, or the third run's insert would conflict.
    """
    runs = _log_run(session, job)
    _effect(session, job)
    if runs <= 2:
        raise Snooze(0.05, "the partner API is rate limited")
    return f"ran after {runs - 1} snoozes"


@registry.handler("snooze_forever", max_snoozes=3, backoff=FAST)
def snooze_forever(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _log_run(session, job)
    raise Snooze(0.0)


@registry.handler("discard", backoff=FAST)
def discard(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _log_run(session, job)
    _effect(session, job)
    raise Discard("order 42 no longer exists")


@registry.handler("retry_in", backoff=FAST)
def retry_in(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Asks for a retry in ``payload["seconds"]`` on attempts before ``payload["until"]``."""
    _log_run(session, job)
    _effect(session, job)
    if job.attempt < payload["until"]:
        raise RetryIn(payload["seconds"], "the upstream said 503")


# --- results ------------------------------------------------------------------------


@registry.handler("returns", backoff=FAST)
def returns(session: Session, payload: dict[str, Any], job: JobContext) -> Any:
    """Returns ``payload["value"]``; writes its effect first if ``payload["write"]``."""
    if payload.get("write"):
        _effect(session, job)
    return payload.get("value")


@registry.handler("returns_bad", max_attempts=1)
def returns_bad(session: Session, payload: dict[str, Any], job: JobContext) -> Any:
    _effect(session, job)
    if payload["what"] == "object":
        return {"when": object()}
    return "x" * (validation.MAX_RESULT_BYTES + 1)


# --- timeouts and cancelling --------------------------------------------------------


@registry.handler("spin", timeout=2, backoff=FAST, max_attempts=2)
def spin(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Writes, then loops forever, checking its job (cooperates with timeout and cancel)."""
    _log_run(session, job)
    _effect(session, job)
    while True:
        job.check()
        time.sleep(0.02)


@registry.handler("db_sleep", timeout=2, backoff=FAST, max_attempts=2)
def db_sleep(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Writes, then waits an hour in the database (stopped by statement_timeout or a cancel)."""
    _log_run(session, job)
    _effect(session, job)
    session.execute(sa.text("SELECT pg_sleep(3600)"))


@registry.handler("stubborn", timeout=1, backoff=FAST, max_attempts=1)
def stubborn(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Writes, then sleeps ``payload["sleep"]`` seconds ignoring everything, and returns."""
    _log_run(session, job)
    _effect(session, job)
    time.sleep(float(payload["sleep"]))


@registry.handler("cancellable", backoff=FAST)
def cancellable(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Like spin and db_sleep, without a timeout: it stops only when cancelled."""
    _log_run(session, job)
    _effect(session, job)
    if payload.get("db"):
        try:
            session.execute(sa.text("SELECT pg_sleep(3600)"))
        finally:
            _mark_end(session, job)
    while True:
        job.check()
        time.sleep(0.02)


@registry.handler("late_statement", timeout=LATE_TIMEOUT, max_attempts=1)
def late_statement(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Writes (its transaction begins with statement_timeout = the whole timeout), works
    in Python for ``payload["before"]`` seconds, then waits in the database: a statement
    that statement_timeout would stop only ``before`` seconds after the deadline."""
    _log_run(session, job)
    _effect(session, job)
    time.sleep(float(payload["before"]))
    try:
        session.execute(sa.text("SELECT pg_sleep(3600)"))
    finally:
        _mark_end(session, job)


@registry.handler("quick", backoff=FAST)
def quick(session: Session, payload: dict[str, Any], job: JobContext) -> str:
    _effect(session, job)
    return "quick"


# --- process isolation --------------------------------------------------------------


@registry.handler("isolated_spin", timeout=2, max_attempts=1, isolation="process")
def isolated_spin(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Writes, then loops forever ignoring its timeout: only a kill stops it."""
    _log_run(session, job)
    _effect(session, job)
    if payload.get("db"):
        try:
            session.execute(sa.text("SELECT pg_sleep(3600)"))
        finally:
            _mark_end(session, job)
    while True:
        time.sleep(0.05)


@registry.handler("isolated_work", isolation="process", backoff=FAST)
def isolated_work(session: Session, payload: dict[str, Any], job: JobContext) -> Any:
    """Writes its effect and returns a result; snoozes first if asked."""
    runs = _log_run(session, job)
    if payload.get("snooze") and runs == 1:
        raise Snooze(0.05, "isolated snooze")
    if payload.get("fail"):
        raise ValueError("isolated failure")
    _effect(session, job)
    print("a handler's print goes to the worker's stderr, not the protocol")
    return {"pid_differs": True, "runs": runs}
