"""Revision 0003: the insert trigger notifies only while a worker waits for work."""

from __future__ import annotations

import psycopg
import sqlalchemy as sa
from helpers import url_text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import enqueue
from sqla_jobs.sql import locks


def _listener(url: URL) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(url_text(url).replace("+psycopg", ""), autocommit=True)
    conn.execute(f"LISTEN {locks.NOTIFY_CHANNEL}")
    return conn


def _enqueue_one(engine: sa.Engine) -> None:
    with Session(engine) as s:
        enqueue(s, "noop", {})
        s.commit()


def test_insert_does_not_notify_when_no_worker_waits(engine: sa.Engine, db_url: URL) -> None:
    with _listener(db_url) as listener:
        _enqueue_one(engine)
        # Waiting for an event that must not come: the deadline is the assertion.
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []


def test_insert_notifies_while_a_worker_holds_the_idle_flag(engine: sa.Engine, db_url: URL) -> None:
    with _listener(db_url) as listener, engine.connect() as waiting:
        waiting.execute(locks.idle_flag(raise_=True))
        _enqueue_one(engine)
        assert len(list(listener.notifies(timeout=10, stop_after=1))) == 1
        waiting.execute(locks.idle_flag(raise_=False))
        _enqueue_one(engine)
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []


def test_the_notify_decision_is_taken_at_commit_not_at_insert(
    engine: sa.Engine, db_url: URL
) -> None:
    """Revision 0007: a job inserted while no worker waited, committed once one does,
    notifies (0003 decided at the insert and stayed silent)."""
    with _listener(db_url) as listener, engine.connect() as waiting:
        with Session(engine) as producer:
            enqueue(producer, "noop", {})
            producer.flush()
            waiting.execute(locks.idle_flag(raise_=True))  # a worker goes idle meanwhile
            producer.commit()
        assert len(list(listener.notifies(timeout=10, stop_after=1))) == 1
        with Session(engine) as producer:
            enqueue(producer, "noop", {})
            producer.flush()
            waiting.execute(locks.idle_flag(raise_=False))  # ... and busy again
            producer.commit()
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
