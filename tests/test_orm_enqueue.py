"""``session.add(Job(...))`` is the equal of ``enqueue``: same arguments, same row, same
outcome on a taken key, on a ``Session`` and on an ``AsyncSession``.

The styles are proven equal side by side: each behaviour is one test parametrized over
``enqueue``, ``enqueue_async``, ``Session.add(Job(...))`` and ``AsyncSession.add(Job(...))``,
each style driven through the same small interface (:class:`Caller`).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from helpers import rows, scalar, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from test_enqueue import BAD_INPUTS

from sqla_jobs import InvalidJobError, Job, JobStatus, NewJob, enqueue, enqueue_async, producer
from sqla_jobs.models import jobs
from sqla_jobs.sql import locks


class Caller:
    """One caller's open transaction, enqueueing in one style. ``enqueue`` returns what
    :func:`sqla_jobs.enqueue` returns: the new id, or None when the key is taken."""

    def enqueue(self, kind: str, payload: dict[str, Any], **options: Any) -> int | None:
        raise NotImplementedError

    def write(self, sql: str) -> None:
        """A write of the caller's own, in the same transaction."""
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def rollback(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SyncCaller(Caller):
    def __init__(self, engine: sa.Engine, orm: bool) -> None:
        self.session = Session(engine)
        self.orm = orm

    def enqueue(self, kind: str, payload: dict[str, Any], **options: Any) -> int | None:
        if not self.orm:
            return enqueue(self.session, kind, payload, **options)
        job = Job(kind=kind, payload=payload, **options)
        self.session.add(job)
        self.session.flush()
        return _outcome(self.session, job)

    def write(self, sql: str) -> None:
        self.session.execute(sa.text(sql))

    def commit(self) -> None:
        self.session.commit()

    def rollback(self) -> None:
        self.session.rollback()

    def close(self) -> None:
        self.session.close()


class AsyncCaller(Caller):
    """The same on an ``AsyncSession``, each step run on this caller's own event loop."""

    def __init__(self, url: URL, orm: bool) -> None:
        self.loop = asyncio.new_event_loop()
        self.engine = create_async_engine(url)
        self.session = AsyncSession(self.engine)
        self.orm = orm

    def enqueue(self, kind: str, payload: dict[str, Any], **options: Any) -> int | None:
        async def add() -> int | None:
            if not self.orm:
                job_id: int | None = await enqueue_async(self.session, kind, payload, **options)
                return job_id
            job = Job(kind=kind, payload=payload, **options)
            self.session.add(job)
            await self.session.flush()
            return _outcome(self.session.sync_session, job)

        return self.loop.run_until_complete(add())

    def write(self, sql: str) -> None:
        self.loop.run_until_complete(self.session.execute(sa.text(sql)))

    def commit(self) -> None:
        self.loop.run_until_complete(self.session.commit())

    def rollback(self) -> None:
        self.loop.run_until_complete(self.session.rollback())

    def close(self) -> None:
        self.loop.run_until_complete(self.session.close())
        self.loop.run_until_complete(self.engine.dispose())
        self.loop.close()


def _outcome(session: Session, job: Job) -> int | None:
    """The ORM style's answer: a persistent job with its id, or a job out of the session
    with no id (enqueue's None)."""
    if job.id is None:
        assert job not in session and sa.inspect(job).transient
        return None
    assert sa.inspect(job).persistent
    return job.id


STYLES = ["enqueue", "enqueue_async", "session.add(Job)", "AsyncSession.add(Job)"]
Open = Callable[[], Caller]


@pytest.fixture(params=STYLES)
def open_caller(request: pytest.FixtureRequest, engine: sa.Engine, db_url: URL) -> Iterator[Open]:
    """Opens callers of one style; every one is closed at the end of the test."""
    style: str = request.param
    opened: list[Caller] = []

    def open_one() -> Caller:
        orm = style.endswith("(Job)")
        caller = AsyncCaller(db_url, orm) if "async" in style.lower() else SyncCaller(engine, orm)
        opened.append(caller)
        return caller

    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE notes (text text NOT NULL)")
    yield open_one
    for caller in opened:
        caller.close()


def _stored(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(jobs).order_by(jobs.c.id))]


def test_every_style_stores_the_same_row_for_the_same_arguments(
    open_caller: Open, engine: sa.Engine
) -> None:
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    common = {"queue": "mail", "priority": 3, "max_attempts": 2, "timeout": timedelta(seconds=90)}
    caller = open_caller()
    start = scalar(engine, "SELECT clock_timestamp()")
    delayed = caller.enqueue("welcome", {"user": 1}, key="w-1", delay=timedelta(hours=1), **common)
    scheduled = caller.enqueue("welcome", {"user": 2}, run_at=at, **common)
    seconds = caller.enqueue("welcome", {"user": 3}, delay=30)
    plain = caller.enqueue("welcome", {"user": 4}, key="w-4")
    caller.commit()
    ids = [delayed, scheduled, seconds, plain]
    assert all(isinstance(i, int) for i in ids)
    stored = _stored(engine)
    assert [r["id"] for r in stored] == sorted(ids)  # type: ignore[type-var]
    by_user = {r["payload"]["user"]: r for r in stored}
    expected_options = {"queue": "mail", "priority": 3, "max_attempts": 2, "timeout": 90.0}
    # max_attempts left out is NULL: the handler's, set by the claim (revision 0008).
    defaults = {"queue": "default", "priority": 0, "max_attempts": None, "timeout": None}
    for user, key, options in [
        (1, "w-1", expected_options),
        (2, None, expected_options),
        (3, None, defaults),
        (4, "w-4", defaults),
    ]:
        row = by_user[user]
        assert row["id"] == ids[user - 1]
        assert (row["kind"], row["idempotency_key"], row["status"]) == (
            "welcome",
            key,
            JobStatus.QUEUED,
        )
        assert {name: row[name] for name in options} == options
        assert (row["attempts"], row["snoozes"], row["worker"], row["result"]) == (0, 0, None, None)
    # Delays count from the database's time during the caller's transaction, never from
    # the caller's clock; run_at is kept exactly.
    assert by_user[2]["run_at"] == at
    end = scalar(engine, "SELECT clock_timestamp()")
    for user, delay in [(1, timedelta(hours=1)), (3, timedelta(seconds=30))]:
        assert start <= by_user[user]["run_at"] - delay <= end
    assert start <= by_user[4]["run_at"] <= end


def test_a_taken_key_inserts_nothing_and_the_callers_transaction_commits_its_other_writes(
    open_caller: Open, engine: sa.Engine
) -> None:
    first = enqueue_first(engine, key="K")
    caller = open_caller()
    caller.write("INSERT INTO notes VALUES ('before')")
    assert caller.enqueue("invoice", {"n": 2}, key="K") is None
    caller.write("INSERT INTO notes VALUES ('after')")
    again = caller.enqueue("invoice", {"n": 3}, key="K2")
    caller.commit()
    assert isinstance(again, int)
    assert rows(engine, "SELECT text FROM notes ORDER BY text") == [("after",), ("before",)]
    assert rows(engine, "SELECT id, idempotency_key, payload FROM jobs ORDER BY id") == [
        (first, "K", {"n": 1}),
        (again, "K2", {"n": 3}),
    ]


def enqueue_first(engine: sa.Engine, key: str) -> int:
    with Session(engine) as s:
        job_id = enqueue(s, "invoice", {"n": 1}, key=key)
        s.commit()
    assert job_id is not None
    return job_id


def _waiting_on_a_lock(engine: sa.Engine) -> bool:
    return bool(
        scalar(
            engine,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'",
        )
    )


@pytest.mark.parametrize("holder_outcome", ["rollback", "commit"])
def test_a_key_held_by_an_open_transaction_is_waited_for_and_its_outcome_followed(
    open_caller: Open, engine: sa.Engine, holder_outcome: str
) -> None:
    holder, second = open_caller(), open_caller()
    held = holder.enqueue("work", {"by": "holder"}, key="K")
    assert held is not None
    result: list[int | None] = []

    def second_caller() -> None:
        result.append(second.enqueue("work", {"by": "second"}, key="K"))
        second.write("INSERT INTO notes VALUES ('second')")
        second.commit()

    thread = threading.Thread(target=second_caller)
    thread.start()
    wait_for(lambda: _waiting_on_a_lock(engine), message="the second caller waits for the key")
    assert not result
    holder.rollback() if holder_outcome == "rollback" else holder.commit()
    thread.join(30)
    assert not thread.is_alive() and len(result) == 1
    assert rows(engine, "SELECT text FROM notes") == [("second",)]
    if holder_outcome == "rollback":
        assert result[0] is not None  # the holder's job never existed: the second's is in
        assert rows(engine, "SELECT id, payload->>'by' FROM jobs") == [(result[0], "second")]
    else:
        assert result == [None]
        assert rows(engine, "SELECT id, payload->>'by' FROM jobs") == [(held, "holder")]


# --- what only the ORM style has ---------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "override", "message"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_a_job_object_refuses_what_new_job_refuses_with_the_same_message(
    case: str, override: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"kind": "k", "payload": {"ok": True}, **override}
    with pytest.raises(InvalidJobError, match=message):
        NewJob(**args)
    with pytest.raises(InvalidJobError, match=message):
        Job(**args)


def test_key_and_idempotency_key_are_one_column_given_once() -> None:
    assert Job(kind="k", payload={}, key="a").idempotency_key == "a"
    assert Job(kind="k", payload={}, idempotency_key="a").key == "a"
    with pytest.raises(InvalidJobError, match="give key or idempotency_key, not both"):
        Job(kind="k", payload={}, key="a", idempotency_key="b")
    with pytest.raises(InvalidJobError, match="delay must be seconds or a timedelta, got str"):
        Job(kind="k", payload={}, delay="soon")  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="run_at must be a datetime, got str"):
        Job(kind="k", payload={}, run_at="tomorrow")


def test_two_pending_jobs_with_one_key_insert_the_first_added(session: Session) -> None:
    first, second = (
        Job(kind="k", payload={"n": 1}, key="K"),
        Job(kind="k", payload={"n": 2}, key="K"),
    )
    session.add(first)
    session.add(second)
    session.add(first)  # added twice: still one job
    session.add(Job(kind="plain", payload={}))
    session.commit()
    assert first.id is not None and second.id is None and second not in session
    assert first.status == JobStatus.QUEUED  # loaded from its row on access
    assert sorted(session.scalars(sa.select(Job.kind)).all()) == ["k", "plain"]


def test_a_merged_job_with_a_taken_key_is_not_inserted(engine: sa.Engine) -> None:
    enqueue_first(engine, key="K")
    with Session(engine) as s:
        merged = s.merge(Job(kind="k", payload={"n": 2}, key="K", delay=60))
        kept = s.merge(Job(kind="k", payload={"n": 3}, key="K3", delay=60))
        s.commit()
        assert merged.id is None and kept.id is not None
        db_now = s.scalar(sa.select(sa.func.now()))
        assert db_now is not None and kept.run_at > db_now + timedelta(seconds=55)
    assert scalar(engine, "SELECT count(*) FROM jobs") == 2


def test_a_keyed_job_that_sets_worker_columns_is_refused_at_flush_before_writing(
    session: Session,
) -> None:
    session.execute(sa.text("SELECT 1"))
    job = Job(kind="k", payload={}, key="K", status=JobStatus.DONE, attempts=2)
    session.add(job)
    with pytest.raises(InvalidJobError, match="this one also sets attempts, status"):
        session.flush()
    session.expunge(job)
    session.add(Job(kind="k", payload={}, key="K"))
    session.commit()  # the transaction was not harmed
    assert session.scalars(sa.select(Job.status)).all() == [JobStatus.QUEUED]


def test_jobs_without_key_or_delay_keep_the_orms_batched_insert(
    engine: sa.Engine, session: Session
) -> None:
    inserts: list[str] = []
    sa.event.listen(
        engine,
        "before_cursor_execute",
        lambda *a: inserts.append(a[2]) if a[2].startswith("INSERT") else None,
    )
    session.add_all(Job(kind="k", payload={"i": i}) for i in range(50))
    session.add(Job(kind="k", payload={"i": 50}, key="K"))
    session.add(Job(kind="k", payload={"i": 51}, delay=5))
    session.commit()
    assert len(inserts) == 3  # the 50 in one statement, then one per keyed or delayed job
    assert scalar(engine, "SELECT count(*) FROM jobs") == 52


def test_a_rolled_back_flush_of_a_keyed_job_leaves_no_row(engine: sa.Engine) -> None:
    with Session(engine) as s:
        job = Job(kind="k", payload={}, key="K")
        s.add(job)
        s.flush()
        assert job.id is not None
        s.rollback()
    assert scalar(engine, "SELECT count(*) FROM jobs") == 0
    assert enqueue_first(engine, key="K") is not None  # the key is free again


def test_a_flushed_job_leaves_the_session_with_the_transaction_that_inserted_it(
    engine: sa.Engine,
) -> None:
    with Session(engine) as s:
        kept, dropped, plain = (Job(kind=k, payload={}, key=k) for k in ("kept", "dropped", "p"))
        plain.key = None
        s.add(kept)
        s.flush()
        savepoint = s.begin_nested()
        s.add_all([dropped, plain])
        s.flush()
        savepoint.rollback()
        # Like the job without a key the ORM inserted: transient again, its values kept.
        for job, kind in [(dropped, "dropped"), (plain, "p")]:
            assert sa.inspect(job).transient and (job.kind, job.payload) == (kind, {})
        assert sa.inspect(kept).persistent
        s.commit()
        assert kept.status == JobStatus.QUEUED
    assert rows(engine, "SELECT idempotency_key FROM jobs") == [("kept",)]
    with Session(engine) as s:
        again = Job(kind="k", payload={}, key="again")
        s.add(again)
        s.flush()
        s.rollback()
        assert sa.inspect(again).transient and again.kind == "k"


def test_a_flushed_job_is_read_without_a_query_as_the_orms_own_insert_leaves_it(
    engine: sa.Engine, db_url: URL
) -> None:
    # An AsyncSession cannot load an attribute on access (MissingGreenlet): every
    # column of a flushed job must already be there, as the ORM's insert leaves them.
    columns = [c.name for c in jobs.c]

    async def scenario() -> list[dict[str, Any]]:
        async_engine = create_async_engine(db_url)
        try:
            async with AsyncSession(async_engine) as s:
                added = [
                    Job(kind="plain", payload={"n": 1}),
                    Job(kind="keyed", payload={"n": 2}, key="K", queue="mail"),
                    Job(kind="delayed", payload={"n": 3}, delay=60, priority=4),
                ]
                s.add_all(added)
                await s.flush()
                seen = [{c: getattr(job, c) for c in columns} for job in added]
                await s.commit()
                return seen
        finally:
            await async_engine.dispose()

    seen = sorted(asyncio.run(scenario()), key=lambda job: int(job["id"]))
    assert seen == _stored(engine)
    assert [type(job["status"]) for job in seen] == [JobStatus] * 3


# --- #23: a few plain jobs take enqueue's statement too, for speed ---------------------


def _inserts(engine: sa.Engine) -> list[str]:
    """The INSERT statements sent through ``engine`` from now on."""
    sent: list[str] = []
    sa.event.listen(
        engine,
        "before_cursor_execute",
        lambda *a: sent.append(a[2]) if a[2].startswith("INSERT") else None,
    )
    return sent


def test_a_flush_of_a_few_plain_jobs_inserts_each_with_enqueues_statement(
    engine: sa.Engine, session: Session
) -> None:
    sent = _inserts(engine)
    few = [Job(kind="k", payload={"i": i}) for i in range(producer.ONE_BY_ONE_UP_TO)]
    session.add_all(few)
    session.commit()
    assert len(sent) == len(few)
    assert all("ON CONFLICT (idempotency_key) DO NOTHING" in sql for sql in sent)
    assert [job.payload["i"] for job in few] == [0, 1, 2]  # loaded again after the commit
    assert [r["payload"] for r in _stored(engine)] == [{"i": i} for i in range(len(few))]


def test_a_flushed_plain_job_holds_the_rows_values_as_after_the_orms_insert(
    session: Session, engine: sa.Engine
) -> None:
    job = Job(kind="k", payload={"a": 1}, priority=3)
    session.add(job)
    session.flush()
    seen = {c.name: job.__dict__[c.name] for c in jobs.c}  # loaded, none expired
    assert sa.inspect(job).persistent and not sa.inspect(job).modified
    session.commit()
    assert seen == _stored(engine)[0]
    assert type(seen["status"]) is JobStatus


def test_a_plain_job_that_sets_a_worker_column_keeps_the_orms_insert(
    engine: sa.Engine, session: Session
) -> None:
    """Test fixtures insert finished jobs this way: enqueue's statement could not."""
    sent = _inserts(engine)
    session.add(Job(kind="k", payload={}, status=JobStatus.DONE, attempts=2))
    session.commit()
    assert len(sent) == 1 and "ON CONFLICT" not in sent[0]
    assert rows(engine, "SELECT status::text, attempts FROM jobs") == [("done", 2)]


def test_a_plain_job_without_a_payload_is_refused_by_the_database_as_before(
    session: Session,
) -> None:
    session.add(Job(kind="k"))
    with pytest.raises(sa.exc.IntegrityError, match="payload"):
        session.flush()


def test_a_job_added_and_committed_notifies_a_waiting_worker_at_commit(
    engine: sa.Engine, db_url: URL
) -> None:
    with psycopg.connect(url_text(db_url).replace("+psycopg", ""), autocommit=True) as listener:
        listener.execute(f"LISTEN {locks.NOTIFY_CHANNEL}")
        with engine.connect() as waiting, Session(engine) as s:
            waiting.execute(locks.idle_flag(raise_=True))
            s.add(Job(kind="k", payload={}))
            s.flush()
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == []  # not before
            s.commit()
            assert len(list(listener.notifies(timeout=10, stop_after=1))) == 1


def test_a_keyed_job_given_no_payload_holds_the_empty_payload_it_stored(
    session: Session, engine: sa.Engine
) -> None:
    job = Job(kind="k", key="K")
    session.add(job)
    session.flush()
    assert job.__dict__["payload"] == {}  # loaded, as stored
    session.commit()
    assert rows(engine, "SELECT payload FROM jobs") == [({},)]


def test_job_imported_from_the_models_module_alone_keeps_enqueues_rules_at_flush(
    db_url: URL,
) -> None:
    # The package loads its public names lazily (#23): an app that imports Job only from
    # sqla_jobs.models, and never enqueue, must still get the flush listener.
    script = """
import sys
import sqlalchemy as sa
from sqlalchemy.orm import Session
from sqla_jobs.models import Job

engine = sa.create_engine(sys.argv[1])
with Session(engine) as s:
    s.add(Job(kind="mail", payload={}, key="k1"))
    s.commit()
with Session(engine) as s:
    again = Job(kind="mail", payload={}, key="k1")
    s.add(again)
    s.commit()  # a taken key inserts nothing, as enqueue does: no IntegrityError
    print(again.id)
"""
    out = subprocess.run(
        [sys.executable, "-c", script, url_text(db_url)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"
