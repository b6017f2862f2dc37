"""Timestamps written inside a long transaction hold the time of the statement that wrote
them, not the transaction's start (revision 0008; ``sqla_jobs.sql._common.clock``).

Each handler here reads the database first (its transaction begins), works for a
second, then notes the database's ``clock_timestamp()`` in ``marks``: whatever the
worker or the handler writes after that must not be dated earlier.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_jobs import (
    JobContext,
    Registry,
    RetryIn,
    Snooze,
    Worker,
    WorkerConfig,
    enqueue,
    enqueue_async,
    ops,
)

#: How long each handler works between its first read and its mark.
WORK_SECONDS = 1.0
#: The delay of the jobs enqueued (and the snoozes and retries) below.
DELAY = 60.0

MARK = "INSERT INTO marks (job_id, at) VALUES (:j, clock_timestamp())"


@contextmanager
def running(registry: Registry, url: URL) -> Iterator[Worker]:
    worker = Worker(
        registry, WorkerConfig(database_url=url_text(url), poll_interval=0.2, lock_seconds=5)
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive()
        worker.engine.dispose()


@pytest.fixture
def marks(engine: sa.Engine) -> sa.Engine:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE marks (job_id bigint, at timestamptz NOT NULL)")
    return engine


def _mark(engine: sa.Engine, job_id: int) -> datetime:
    value = scalar(engine, "SELECT at FROM marks WHERE job_id = :j", j=job_id)
    assert isinstance(value, datetime)
    return value


def _job(engine: sa.Engine, job_id: int) -> Any:
    (row,) = rows(engine, "SELECT * FROM jobs WHERE id = :j", j=job_id)
    return row


def _finished(engine: sa.Engine, job_id: int) -> bool:
    status = scalar(engine, "SELECT status::text FROM jobs WHERE id = :j", j=job_id)
    return status in ("done", "dead", "cancelled")


def _marked_job_registry() -> Registry:
    """``work`` (plain) and ``awork`` (async): read, work, mark, and with ``enqueue`` in
    the payload enqueue a ``child`` delayed by DELAY and a ``child`` ready at once."""
    registry = Registry()

    @registry.handler("work")
    def work(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        session.execute(sa.text("SELECT count(*) FROM jobs"))
        time.sleep(WORK_SECONDS)
        session.execute(sa.text(MARK), {"j": job.id})
        if payload.get("enqueue"):
            enqueue(session, "child", {"parent": job.id, "delayed": True}, delay=DELAY)
            enqueue(session, "child", {"parent": job.id, "delayed": False}, queue="held")

    @registry.handler("awork")
    async def awork(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
        await session.execute(sa.text("SELECT count(*) FROM jobs"))
        await asyncio.sleep(WORK_SECONDS)
        await session.execute(sa.text(MARK), {"j": job.id})
        if payload.get("enqueue"):
            await enqueue_async(session, "child", {"parent": job.id, "delayed": True}, delay=DELAY)
            await enqueue_async(
                session, "child", {"parent": job.id, "delayed": False}, queue="held"
            )

    @registry.handler("child")
    def child(session: Session, payload: dict[str, Any]) -> None:
        pass  # the ready one waits in a queue the worker does not serve

    return registry


@pytest.mark.parametrize("kind", ["work", "awork"])
def test_finished_at_is_when_the_done_mark_ran_not_when_the_handlers_transaction_began(
    marks: sa.Engine, db_url: URL, kind: str
) -> None:
    with Session(marks) as s:
        job_id = enqueue(s, kind)
        s.commit()
    assert job_id is not None
    with running(_marked_job_registry(), db_url):
        wait_for(lambda: _finished(marks, job_id), message="the job done")
    job = _job(marks, job_id)
    assert job.status == "done"
    assert job.finished_at >= _mark(marks, job_id)


@pytest.mark.parametrize("kind", ["work", "awork"])
def test_a_job_enqueued_late_in_a_handlers_transaction_is_dated_from_its_enqueue(
    marks: sa.Engine, db_url: URL, kind: str
) -> None:
    with Session(marks) as s:
        job_id = enqueue(s, kind, {"enqueue": True})
        s.commit()
    assert job_id is not None
    with running(_marked_job_registry(), db_url):
        wait_for(lambda: _finished(marks, job_id), message="the job done")
    marked = _mark(marks, job_id)
    children = {
        r.payload["delayed"]: r
        for r in rows(marks, "SELECT * FROM jobs WHERE payload ? 'parent'")
        if r.payload["parent"] == job_id
    }
    delayed, ready = children[True], children[False]
    assert delayed.created_at >= marked and ready.created_at >= marked
    assert delayed.run_at >= marked + timedelta(seconds=DELAY)
    assert ready.run_at >= marked  # the column's default (revision 0008)


def _deciding_registry(decision: type[Snooze] | type[RetryIn], engine: sa.Engine) -> Registry:
    """``decide`` and ``adecide``: read, work, mark (on a connection of their own, as the
    handler's writes roll back), then snooze or retry in DELAY seconds."""
    registry = Registry()

    def mark(_session: object, job_id: int) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text(MARK), {"j": job_id})

    @registry.handler("decide")
    def decide(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        session.execute(sa.text("SELECT count(*) FROM jobs"))
        time.sleep(WORK_SECONDS)
        mark(session, job.id)
        raise decision(DELAY)

    @registry.handler("adecide")
    async def adecide(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
        await session.execute(sa.text("SELECT count(*) FROM jobs"))
        await asyncio.sleep(WORK_SECONDS)
        await asyncio.to_thread(mark, session, job.id)
        raise decision(DELAY)

    return registry


@pytest.mark.parametrize("decision", [Snooze, RetryIn])
@pytest.mark.parametrize("kind", ["decide", "adecide"])
def test_snooze_and_retry_delays_run_from_the_end_of_the_attempt(
    marks: sa.Engine, db_url: URL, kind: str, decision: type[Snooze] | type[RetryIn]
) -> None:
    with Session(marks) as s:
        job_id = enqueue(s, kind)
        s.commit()
    assert job_id is not None
    with running(_deciding_registry(decision, marks), db_url):
        wait_for(
            lambda: scalar(marks, "SELECT last_error FROM jobs WHERE id = :j", j=job_id),
            message="the attempt recorded",
        )
    job = _job(marks, job_id)
    assert job.status == "queued"
    assert job.run_at >= _mark(marks, job_id) + timedelta(seconds=DELAY)


def test_operator_actions_in_a_long_transaction_are_dated_when_they_run(
    engine: sa.Engine,
) -> None:
    with Session(engine) as s:
        queued, dead = enqueue(s, "k"), enqueue(s, "k")
        assert queued is not None and dead is not None
        s.execute(
            sa.text("UPDATE jobs SET status = 'dead', finished_at = now() WHERE id = :j"),
            {"j": dead},
        )
        s.commit()
    with Session(engine) as s:
        s.execute(sa.text("SELECT count(*) FROM jobs"))  # the app's transaction begins
        s.execute(sa.text("SELECT pg_sleep(:s)"), {"s": WORK_SECONDS})
        before = s.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
        assert ops.cancel(s, ids=[queued]).cancelled == (queued,)
        assert ops.retry_jobs(s, ids=[dead]) == 1
        ops.pause(s, "emails")
        s.commit()
    assert _job(engine, queued).finished_at >= before
    assert _job(engine, dead).run_at >= before
    updated = scalar(engine, "SELECT updated_at FROM jobs_controls WHERE name = 'emails'")
    assert updated >= before
