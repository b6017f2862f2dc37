"""Handlers used by the worker tests; workers load it as ``jobapp:registry``.

``effects(job_id UNIQUE)`` is written in the handler's transaction, so it commits with
the done-mark: the oracle for "no lost job, no double effect". ``runs`` logs every
start and end from a separate connection, so it survives rollbacks and crashes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Registry, current_job

registry = Registry()

SETUP_SQL = """
CREATE TABLE IF NOT EXISTS effects (
    job_id bigint PRIMARY KEY,
    worker text NOT NULL,
    attempt int NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    worker text NOT NULL,
    attempt int NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz
);
"""


def _log_start(session: Session, job: JobContext) -> int:
    # Logged on a separate autocommit connection so the row survives a rollback or crash.
    engine = session.get_bind()
    assert isinstance(engine, sa.Engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        return int(
            conn.execute(
                sa.text(
                    "INSERT INTO runs (job_id, worker, attempt) VALUES (:j, :w, :a) RETURNING id"
                ),
                {"j": job.id, "w": job.worker, "a": job.attempt},
            ).scalar_one()
        )


def _log_end(session: Session, run_id: int) -> None:
    engine = session.get_bind()
    assert isinstance(engine, sa.Engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(
            sa.text("UPDATE runs SET ended_at = clock_timestamp() WHERE id = :r"), {"r": run_id}
        )


def _effect(session: Session, job: JobContext) -> None:
    session.execute(
        sa.text("INSERT INTO effects (job_id, worker, attempt) VALUES (:j, :w, :a)"),
        {"j": job.id, "w": job.worker, "a": job.attempt},
    )


@registry.handler("noop")
def noop(session: Session, payload: dict[str, Any]) -> None:
    pass


@registry.handler("effect")
def effect(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Writes its effect row; optionally sleeps first (``sleep`` seconds), logged in runs."""
    run_id = _log_start(session, job) if payload.get("log") else None
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    _effect(session, job)
    if payload.get("fail_after_write"):
        raise RuntimeError("failed after writing")
    if run_id is not None:
        _log_end(session, run_id)


@registry.handler("fail", max_attempts=3)
def fail(session: Session, payload: dict[str, Any]) -> None:
    raise ValueError(f"boom {payload.get('n', '')}".strip())


@registry.handler("order_log")
def order_log(session: Session, payload: dict[str, Any]) -> None:
    session.execute(
        sa.text("INSERT INTO effects (job_id, worker, attempt) VALUES (:j, :w, 0)"),
        {"j": current_job().id, "w": payload["label"]},
    )


@registry.handler("kill_self")
def kill_self(session: Session, payload: dict[str, Any]) -> None:
    """A poison job: takes its whole worker process down."""
    os.kill(os.getpid(), signal.SIGKILL)


@registry.handler("raise_base")
def raise_base(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _effect(session, job)
    session.flush()
    exc: BaseException = {
        "SystemExit": SystemExit(3),
        "KeyboardInterrupt": KeyboardInterrupt(),
        "BaseException": BaseException("custom base"),
    }[payload["which"]]
    raise exc


@registry.handler("misbehave")
def misbehave(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _effect(session, job)
    what = payload["what"]
    if what == "commit":
        session.commit()
    elif what == "commit_swallowed":
        with contextlib.suppress(Exception):  # swallowing it is the point of the test
            session.commit()
    elif what == "close":
        session.close()
    elif what == "invalidate":
        session.connection().invalidate()
    elif what == "sql_error":
        session.execute(sa.text("SELECT 1/0"))


@registry.handler("until_cancelled", max_attempts=1)
def until_cancelled(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """A long job that stops when cancelled (checks every 50 ms; gives up after 120 s)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job.check()
        time.sleep(0.05)


@registry.handler("read_then_idle", max_attempts=1)
def read_then_idle(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Reads, then sleeps ``sleep`` seconds with its transaction idle (logged in runs): an
    idle_in_transaction_session_timeout shorter than that closes its session."""
    _log_start(session, job)
    session.execute(sa.text("SELECT 1"))
    time.sleep(float(payload["sleep"]))
