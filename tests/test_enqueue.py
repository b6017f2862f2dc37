"""Enqueue joins the caller's unit of work: it commits or rolls back with the caller."""

from __future__ import annotations

import collections
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from sqla_jobs import (
    InvalidJobError,
    Job,
    JobStatus,
    NewJob,
    Registry,
    RegistryError,
    enqueue,
    enqueue_many,
    producer,
    validation,
)
from sqla_jobs.models import jobs
from sqla_jobs.sql import enqueue as enqueue_sql
from sqla_jobs.sql import locks


def count(engine: sa.Engine, *where: Any) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(jobs).where(*where)).scalar_one()


def test_session_add_job_commits_with_the_callers_data(engine: sa.Engine) -> None:
    with Session(engine) as s:
        s.add(Job(kind="send_welcome_email", payload={"user_id": 42}))
        s.commit()
    with Session(engine) as s:
        job = s.scalars(sa.select(Job)).one()
    assert (job.kind, job.payload, job.status) == (
        "send_welcome_email",
        {"user_id": 42},
        JobStatus.QUEUED,
    )
    # max_attempts NULL: the handler's, written by the worker that claims it.
    assert (job.queue, job.priority, job.attempts, job.max_attempts) == ("default", 0, 0, None)


def test_rollback_leaves_no_job(engine: sa.Engine) -> None:
    with Session(engine) as s:
        s.add(Job(kind="a", payload={}))
        enqueue(s, "b", {"x": 1})
        enqueue_many(s, [NewJob("c", {"i": i}) for i in range(10)])
        s.rollback()
    assert count(engine) == 0


def test_job_is_invisible_to_other_connections_until_commit(engine: sa.Engine) -> None:
    with Session(engine) as s:
        job_id = enqueue(s, "k", {"n": 1})
        assert job_id is not None
        assert count(engine) == 0
        s.commit()
    assert count(engine, jobs.c.id == job_id) == 1


def test_enqueue_works_on_a_core_connection(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        job_id = enqueue(conn, "k", {"n": 1}, queue="mail", priority=3, max_attempts=2)
    with engine.connect() as conn:
        row = conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).one()
    assert (row.queue, row.priority, row.max_attempts) == ("mail", 3, 2)


def test_enqueue_never_commits(engine: sa.Engine) -> None:
    with Session(engine) as s:
        enqueue(s, "k", {})
        assert s.in_transaction()
    assert count(engine) == 0


def test_notify_is_delivered_only_after_commit(engine: sa.Engine, db_url: URL) -> None:
    dsn = db_url.render_as_string(hide_password=False).replace("+psycopg", "")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN jobs")
        # Revision 0003: the trigger notifies only while a worker waits, i.e. holds the
        # idle flag; this listener plays that worker.
        listener.execute("SELECT pg_advisory_lock_shared(%s)", (locks.IDLE_LOCK_KEY,))
        with Session(engine) as s:
            enqueue(s, "k", {})
            s.flush()
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
            s.commit()
        received = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in received] == ["jobs"]


def test_bulk_insert_sends_one_notification_not_one_per_row(engine: sa.Engine, db_url: URL) -> None:
    dsn = db_url.render_as_string(hide_password=False).replace("+psycopg", "")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN jobs")
        # Revision 0003: the trigger notifies only while a worker waits, i.e. holds the
        # idle flag; this listener plays that worker.
        listener.execute("SELECT pg_advisory_lock_shared(%s)", (locks.IDLE_LOCK_KEY,))
        with Session(engine) as s:
            enqueue_many(s, [NewJob("k", {"i": i}) for i in range(2000)])
            s.commit()
        received = list(listener.notifies(timeout=1.0))
    assert len(received) == 1


def test_delay_and_run_at_schedule_in_database_time(engine: sa.Engine) -> None:
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with Session(engine) as s:
        later = enqueue(s, "k", {}, delay=timedelta(hours=1))
        fixed = enqueue(s, "k", {}, run_at=at)
        s.commit()
    with engine.connect() as conn:
        found = {
            r.id: r for r in conn.execute(sa.select(jobs.c.id, jobs.c.run_at, jobs.c.created_at))
        }
    assert found[fixed].run_at == at
    # created_at: the time of the statement that inserted the job (revision 0008).
    assert found[later].run_at == found[later].created_at + timedelta(hours=1)


def test_idempotency_key_dedupes_and_second_enqueue_returns_none(engine: sa.Engine) -> None:
    with Session(engine) as s:
        first = enqueue(s, "invoice", {"n": 42}, key="invoice-42")
        s.commit()
    with Session(engine) as s:
        second = enqueue(s, "invoice", {"n": 43}, key="invoice-42")
        s.commit()
    assert isinstance(first, int)
    assert second is None
    with engine.connect() as conn:
        assert conn.execute(sa.select(jobs.c.payload)).scalars().all() == [{"n": 42}]


def test_enqueue_many_skips_duplicate_keys_within_and_across_batches(engine: sa.Engine) -> None:
    with Session(engine) as s:
        enqueue(s, "k", {}, key="dup")
        ids = enqueue_many(
            s,
            [
                NewJob("k", {}, key="dup"),
                NewJob("k", {}, key="new"),
                NewJob("k", {}, key="new"),
                NewJob("k", {"plain": True}),
            ],
        )
        s.commit()
    assert len(ids) == 2
    assert count(engine) == 3


def test_enqueue_many_inserts_thousands_with_their_options(engine: sa.Engine) -> None:
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    new = [NewJob("bulk", {"i": i}) for i in range(12_000)]
    new.append(NewJob("opt", {}, queue="q", priority=9, max_attempts=3, run_at=at, key="o"))
    with Session(engine) as s:
        ids = enqueue_many(s, new)
        s.commit()
    assert len(set(ids)) == 12_001
    with engine.connect() as conn:
        row = conn.execute(sa.select(jobs).where(jobs.c.kind == "opt")).one()
    assert (row.queue, row.priority, row.max_attempts, row.run_at, row.idempotency_key) == (
        "q",
        9,
        3,
        at,
        "o",
    )
    assert count(engine, jobs.c.kind == "bulk", jobs.c.queue == "default") == 12_000


def test_enqueue_many_keeps_every_value_exact_through_its_json_batch(engine: sa.Engine) -> None:
    # Quotes, backslashes, non-ASCII and a non-UTC offset with microseconds: everything
    # the batch's JSON text has to escape or the server has to parse back.
    at = datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=-3, minutes=-30)))
    odd = 'kind "quoted" \\ back\u00e9\u2603'
    payload = {"text": 'a"b\\c\n\u00e9\U0001f600', "nested": {"list": [1, 2.5, None, True]}}
    with Session(engine) as s:
        enqueue_many(
            s,
            [
                NewJob(odd, payload, key='key "1" \\', queue="q.1:a-b", run_at=at),
                NewJob("delayed", {}, delay=timedelta(minutes=90), priority=0, max_attempts=1),
            ],
        )
        s.commit()
    with engine.connect() as conn:
        rows = {r.kind: r for r in conn.execute(sa.select(jobs))}
    first, delayed = rows[odd], rows["delayed"]
    assert (first.payload, first.idempotency_key, first.queue, first.run_at) == (
        payload,
        'key "1" \\',
        "q.1:a-b",
        at,
    )
    assert delayed.run_at == delayed.created_at + timedelta(minutes=90)
    assert (delayed.priority, delayed.max_attempts, delayed.queue) == (0, 1, "default")


def test_enqueue_many_splits_a_large_batch_into_statements_by_size(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer, "ENQUEUE_MANY_MAX_CHARS", 2_000)
    new = [NewJob("k", {"blob": "x" * 300, "i": i}) for i in range(50)]
    statements_sent: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements_sent.append(a[2]))
    with Session(engine) as s:
        ids = enqueue_many(s, new)
        s.commit()
    inserts = [sql for sql in statements_sent if sql.startswith("INSERT INTO jobs")]
    assert len(set(ids)) == 50 and count(engine) == 50
    assert len(inserts) >= 8  # about 6 rows of 330 characters per 2,000


def test_enqueue_many_refuses_anything_but_new_jobs_before_writing(engine: sa.Engine) -> None:
    with Session(engine) as s:
        s.execute(sa.text("SELECT 1"))
        with pytest.raises(InvalidJobError, match="enqueue_many takes NewJob objects, got dict"):
            enqueue_many(s, [NewJob("fine", {}), {"kind": "k"}])  # type: ignore[list-item]
        enqueue(s, "still_fine", {})
        s.commit()
    assert count(engine) == 1


def test_registered_handler_enqueues_its_own_kind_with_its_defaults(engine: sa.Engine) -> None:
    registry = Registry()

    @registry.handler("send_welcome_email", max_attempts=3, queue="mail", priority=2)
    def send_welcome_email(session: Session, payload: dict[str, Any]) -> None:
        pass

    with Session(engine) as s:
        send_welcome_email.enqueue(s, {"user_id": 42})
        send_welcome_email.enqueue(s, {"user_id": 43}, priority=0)
        s.commit()
    with engine.connect() as conn:
        rows = conn.execute(sa.select(jobs).order_by(jobs.c.id)).all()
    assert [(r.kind, r.queue, r.max_attempts, r.priority) for r in rows] == [
        ("send_welcome_email", "mail", 3, 2),
        ("send_welcome_email", "mail", 3, 0),
    ]


def test_registry_enqueue_by_kind_applies_the_handlers_defaults(engine: sa.Engine) -> None:
    registry = Registry()

    @registry.handler("charge_card", max_attempts=3, queue="payments", priority=1)
    def charge_card(session: Session, payload: dict[str, Any]) -> None:
        pass

    with Session(engine) as s:
        registry.enqueue(s, "charge_card", {"order_id": 1})
        registry.enqueue(s, "charge_card", {"order_id": 2}, queue="urgent", key="charge-2")
        enqueue_many(s, [registry.new("charge_card", {"order_id": 3})])
        # Plain enqueue knows no registry: the table's queue and priority, and no
        # max_attempts (the worker that claims it writes the handler's).
        enqueue(s, "charge_card", {"order_id": 4})
        s.commit()
    with engine.connect() as conn:
        rows = conn.execute(sa.select(jobs).order_by(jobs.c.id)).all()
    assert [(r.payload["order_id"], r.queue, r.max_attempts, r.priority) for r in rows] == [
        (1, "payments", 3, 1),
        (2, "urgent", 3, 1),
        (3, "payments", 3, 1),
        (4, "default", None, 0),
    ]


def test_registry_enqueue_refuses_a_kind_it_has_no_handler_for(engine: sa.Engine) -> None:
    registry = Registry()
    registry.register("charge_card", lambda session, payload: None)
    with Session(engine) as s:
        with pytest.raises(
            RegistryError,
            match=r"no handler registered for kind 'charge_crad' \(registered: charge_card\)",
        ):
            registry.enqueue(s, "charge_crad", {})
        with pytest.raises(RegistryError, match="no handler registered for kind 'x'"):
            registry.new("x")
        s.commit()
    assert count(engine) == 0


class Unserializable:
    pass


CIRCULAR: dict[str, Any] = {"ok": 1}
CIRCULAR["self"] = [CIRCULAR]


BAD_INPUTS: list[tuple[str, dict[str, Any], str]] = [
    ("empty kind", {"kind": ""}, "kind must not be empty"),
    ("non-string kind", {"kind": 5}, "kind must be a string"),
    ("NUL in kind", {"kind": "a\x00b"}, "kind must not contain NUL"),
    (
        "not JSON",
        {"payload": {"x": Unserializable()}},
        r"not JSON-serializable: payload\['x'\]: Unserializable is not JSON",
    ),
    (
        "not JSON, nested",
        {"payload": {"user": {"when": datetime(2030, 1, 1)}}},
        r"payload\['user'\]\['when'\]: datetime is not JSON",
    ),
    (
        "not JSON, in a list",
        {"payload": {"items": [1, {"tags": {"a"}}]}},
        r"payload\['items'\]\[1\]\['tags'\]: set is not JSON",
    ),
    (
        "NaN",
        {"payload": {"x": [float("nan")]}},
        r"payload\['x'\]\[0\]: nan is not JSON \(jsonb refuses NaN and infinity\)",
    ),
    (
        "colliding keys",
        {"payload": {1: "a", "1": "b"}},
        r"payload: the key 1 is an int, not a string; JSON keys are strings, so it would "
        r"come back as \"1\"",
    ),
    (
        "non-string key, nested",
        {"payload": {"m": [{None: 1}]}},
        r"payload\['m'\]\[0\]: the key None is a NoneType, not a string",
    ),
    ("circular", {"payload": CIRCULAR}, "not JSON-serializable: it refers to itself"),
    ("not an object", {"payload": [1, 2]}, "payload must be a JSON object"),
    ("NUL in value", {"payload": {"x": ["ok", "a\x00"]}}, "must not contain NUL"),
    ("NUL in key", {"payload": {"a\x00": 1}}, "must not contain NUL"),
    ("oversized", {"payload": {"x": "y" * validation.MAX_PAYLOAD_BYTES}}, "larger than"),
    ("naive run_at", {"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
    ("negative delay", {"delay": -1}, "delay must be a finite number"),
    ("run_at and delay", {"delay": 1, "run_at": datetime.now(timezone.utc)}, "not both"),
    ("zero max_attempts", {"max_attempts": 0}, "max_attempts must be between 1"),
    (
        "priority out of range",
        {"priority": 10},
        r"priority must be between 0 and 9 \(0 runs first, 9 last\), got 10",
    ),
    ("bad queue", {"queue": "no spaces"}, "queue must match"),
    ("empty key", {"key": ""}, "idempotency key must not be empty"),
]


@pytest.mark.parametrize(
    ("case", "override", "message"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_is_refused_before_writing_and_the_transaction_stays_usable(
    engine: sa.Engine, case: str, override: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"kind": "k", "payload": {"ok": True}, **override}
    with Session(engine) as s:
        s.execute(sa.text("SELECT 1"))  # a transaction is in progress
        with pytest.raises(InvalidJobError, match=message):
            enqueue(s, args.pop("kind"), args.pop("payload"), **args)
        with pytest.raises(InvalidJobError, match=message):
            enqueue_many(
                s, [NewJob("fine", {}), NewJob(**{"kind": "k", "payload": {"ok": 1}, **override})]
            )
        enqueue(s, "still_fine", {})
        s.commit()
    assert count(engine) == 1


def test_none_means_no_payload_for_enqueue_and_is_refused_where_a_payload_is_required(
    engine: sa.Engine,
) -> None:
    with Session(engine) as s:
        omitted, none = enqueue(s, "k"), enqueue(s, "k", None)  # optional: None is "no payload"
        refused = r"payload must be a JSON object \(a dict\), got None; pass \{\} for a job"
        with pytest.raises(InvalidJobError, match=refused):
            NewJob("k", None)  # type: ignore[arg-type]
        with pytest.raises(InvalidJobError, match=refused):
            Job(kind="k", payload=None)
        s.commit()
    with engine.connect() as conn:
        stored = conn.execute(sa.select(jobs.c.id, jobs.c.payload).order_by(jobs.c.id)).all()
    assert [tuple(r) for r in stored] == [(omitted, {}), (none, {})]


def test_a_job_model_refuses_a_payload_key_json_would_turn_into_a_string(
    engine: sa.Engine,
) -> None:
    with pytest.raises(InvalidJobError, match=r"payload\['by_id'\]: the key 7 is an int"):
        Job(kind="k", payload={"by_id": {7: "seven", "7": "also seven"}})
    assert count(engine) == 0


def test_a_class_given_for_a_value_is_named_as_the_class(engine: sa.Engine) -> None:
    with Session(engine) as s:
        with pytest.raises(InvalidJobError, match=r"takes NewJob objects, got the class Job$"):
            enqueue_many(s, [Job])  # type: ignore[list-item]
        with pytest.raises(InvalidJobError, match=r"a JSON object \(a dict\), got the class Job$"):
            enqueue(s, "k", Job)  # type: ignore[arg-type]
    assert count(engine) == 0


def test_bad_job_model_values_raise_when_set(engine: sa.Engine) -> None:
    with pytest.raises(InvalidJobError, match="must not contain NUL"):
        Job(kind="k", payload={"x": "\x00"})
    with pytest.raises(InvalidJobError, match="timezone-aware"):
        Job(kind="k", payload={}, run_at=datetime(2030, 1, 1))
    assert count(engine) == 0


def test_concurrent_enqueues_of_one_key_leave_exactly_one_row(engine: sa.Engine) -> None:
    barrier = threading.Barrier(20)

    def attempt(i: int) -> int | None:
        with Session(engine) as s:
            barrier.wait()
            result = enqueue(s, "k", {"i": i}, key="same")
            s.commit()
            return result

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(attempt, range(20)))
    assert len([r for r in results if r is not None]) == 1
    assert count(engine) == 1


def test_waiting_enqueue_inserts_when_the_key_holder_rolls_back(engine: sa.Engine) -> None:
    holder = Session(engine)
    enqueue(holder, "k", {"who": "first"}, key="K")
    result: list[int | None] = []

    def second() -> None:
        with Session(engine) as s:
            result.append(enqueue(s, "k", {"who": "second"}, key="K"))
            s.commit()

    t = threading.Thread(target=second)
    t.start()
    t.join(0.5)
    assert t.is_alive(), "the second enqueue should wait on the first's uncommitted key"
    holder.rollback()
    holder.close()
    t.join(10)
    assert isinstance(result[0], int)
    with engine.connect() as conn:
        assert conn.execute(sa.select(jobs.c.payload)).scalars().all() == [{"who": "second"}]


def test_enqueue_async_joins_the_async_session(engine: sa.Engine, db_url: URL) -> None:
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from sqla_jobs import enqueue_async

    async def scenario() -> tuple[int | None, int | None]:
        async_engine = create_async_engine(db_url)
        try:
            async with AsyncSession(async_engine) as s:
                rolled_back = await enqueue_async(s, "k", {"n": 1})
                await s.rollback()
            async with AsyncSession(async_engine) as s:
                kept = await enqueue_async(s, "k", {"n": 2}, key="async-key")
                await s.commit()
            return rolled_back, kept
        finally:
            await async_engine.dispose()

    rolled_back, kept = asyncio.run(scenario())
    assert isinstance(rolled_back, int) and isinstance(kept, int)
    with engine.connect() as conn:
        found = [tuple(r) for r in conn.execute(sa.select(jobs.c.id, jobs.c.payload))]
    assert found == [(kept, {"n": 2})]


def test_a_session_that_binds_only_the_job_model_can_enqueue(engine: sa.Engine) -> None:
    # No default bind: the insert must find the engine the way session.execute() would.
    with Session(binds={Job: engine}) as s:
        one = enqueue(s, "k", {"n": 1})
        many = enqueue_many(s, [NewJob("k", {"n": i}) for i in range(3)])
        s.commit()
    assert one is not None and len(many) == 3
    assert count(engine) == 4


def test_a_scoped_session_enqueues_in_the_transaction_of_the_session_it_holds(
    engine: sa.Engine,
) -> None:
    # Flask-SQLAlchemy's db.session is a scoped_session: the job joins the current
    # session's transaction, committed or rolled back with the caller's data.
    scoped = scoped_session(sessionmaker(engine))
    try:
        assert enqueue(scoped, "k", {"n": 1}) is not None
        assert len(enqueue_many(scoped, [NewJob("k", {"n": i}) for i in range(2)])) == 2
        scoped.rollback()
        assert count(engine) == 0
        registry = Registry()
        registry.handler("k")(lambda session, payload: None)
        registry.enqueue(scoped, "k", {"n": 3})
        scoped().commit()  # the session the scope holds is the one that has the job
        assert count(engine) == 1
    finally:
        scoped.remove()


def test_a_session_routing_writes_by_statement_sends_enqueues_to_its_writer(
    engine: sa.Engine,
) -> None:
    # The read/write-split recipe: get_bind() looks at the statement, as it would for
    # session.execute(insert).
    class WriterSession(Session):
        def get_bind(self, mapper: Any = None, clause: Any = None, **kw: Any) -> Any:
            if isinstance(clause, sa.Insert):
                return engine
            raise AssertionError(f"routed without its statement: {mapper=} {clause=}")

    with WriterSession() as s:
        enqueue(s, "k", {"n": 1})
        enqueue_many(s, [NewJob("k", {"n": 2})])
        s.commit()
    assert count(engine) == 2


def test_each_insert_shape_is_built_and_compiled_once(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLAlchemy cannot cache PostgreSQL's INSERT ... ON CONFLICT construct; the producer
    # keeps the compiled SQL per shape instead of compiling it on every enqueue.
    monkeypatch.setattr(producer, "_COMPILED", {})
    monkeypatch.setattr(producer, "_STATEMENTS", {})
    builds: list[str] = []
    real_one, real_many = enqueue_sql.insert_job, enqueue_sql.insert_jobs_json

    def counted_one(**kw: Any) -> Any:
        builds.append("one")
        return real_one(**kw)

    def counted_many(**kw: Any) -> Any:
        builds.append("many")
        return real_many(**kw)

    monkeypatch.setattr(enqueue_sql, "insert_job", counted_one)
    monkeypatch.setattr(enqueue_sql, "insert_jobs_json", counted_many)
    with Session(engine) as s:
        for i in range(5):
            enqueue(s, "k", {"n": i})
            enqueue(s, "k", {"n": i}, priority=3)
            enqueue_many(s, [NewJob("k", {"n": i})])
        s.commit()
    assert sorted(builds) == ["many", "one", "one"]
    assert count(engine) == 15


def test_enqueue_many_keeps_control_characters_offsets_and_delays_exact(engine: sa.Engine) -> None:
    # Tabs, newlines and backslashes in a kind, escapes in the payload's JSON, offsets,
    # delays and defaults must all arrive intact, and the ids returned be the new rows.
    at = datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    kinds = ["tab\there", "new\nline\r", "back\\slash \\N", "\u00e9\u2603 \U0001f600", "."]
    payload = {"text": 'a"b\\c\n\t\u00e9\U0001f600', "n": [1, 2.5, None, True], "\\N": "\\."}
    new = [NewJob(kind, {**payload, "i": i}) for i, kind in enumerate(kinds)]
    new += [
        NewJob("scheduled", {"i": 5}, run_at=at, queue="q.1:a-b", priority=9, max_attempts=1),
        NewJob("delayed", {"i": 6}, delay=timedelta(minutes=90, microseconds=7)),
        NewJob("fractional", {"i": 7}, delay=0.000_250),
    ]
    with Session(engine) as s:
        ids = enqueue_many(s, new)
        s.commit()
    with engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(sa.select(jobs))}
    assert sorted(ids) == sorted(rows) and len(ids) == len(new)
    by_i = {r.payload["i"]: r for r in rows.values()}
    for job in new:
        row = by_i[job.payload["i"]]
        assert (row.kind, row.payload) == (job.kind, dict(job.payload))
        assert (row.status, row.attempts, row.idempotency_key) == (JobStatus.QUEUED, 0, None)
    by_kind = {r.kind: r for r in rows.values()}
    # One statement: its time is every default run_at and created_at.
    db_now = by_kind["."].created_at
    assert all(by_kind[k].run_at == by_kind[k].created_at == db_now for k in kinds)
    assert all(
        (by_kind[k].queue, by_kind[k].priority, by_kind[k].max_attempts) == ("default", 0, None)
        for k in kinds
    )
    scheduled = by_kind["scheduled"]
    assert (scheduled.run_at, scheduled.queue, scheduled.priority, scheduled.max_attempts) == (
        at,
        "q.1:a-b",
        9,
        1,
    )
    assert by_kind["delayed"].run_at == db_now + timedelta(minutes=90, microseconds=7)
    assert by_kind["fractional"].run_at == db_now + timedelta(microseconds=250)


def test_enqueue_many_delays_are_real_time_in_any_session_time_zone(engine: sa.Engine) -> None:
    # 200 days cross a daylight-saving change in Berlin in either direction: the delay
    # must be a span of real time (as now() + interval is), not of wall-clock time.
    with Session(engine) as s:
        s.execute(sa.text("SET LOCAL TIME ZONE 'Europe/Berlin'"))
        (copied,) = enqueue_many(s, [NewJob("k", {}, delay=timedelta(days=200))])
        inserted = enqueue(s, "k", {}, delay=timedelta(days=200))
        created = dict(s.execute(sa.select(jobs.c.id, jobs.c.created_at)).tuples().all())
        s.commit()
    with engine.connect() as conn:
        run_at = dict(conn.execute(sa.select(jobs.c.id, jobs.c.run_at)).tuples().all())
    for job_id in (copied, inserted):
        real_time = created[job_id].astimezone(timezone.utc) + timedelta(days=200)
        assert run_at[job_id] == real_time
        # Python's wall-clock sum in Berlin differs.
        assert real_time != created[job_id] + timedelta(days=200)


def test_enqueue_many_mixes_keyed_and_unkeyed_jobs_in_one_call(engine: sa.Engine) -> None:
    with Session(engine) as s:
        enqueue(s, "k", {}, key="taken")
        ids = enqueue_many(
            s,
            [
                NewJob("k", {"n": 1}),
                NewJob("k", {"n": 2}, key="taken"),
                NewJob("k", {"n": 3}, key="new"),
                NewJob("k", {"n": 4}),
            ],
        )
        s.commit()
    with engine.connect() as conn:
        got = dict(conn.execute(sa.select(jobs.c.id, jobs.c.payload)).tuples().all())
    assert sorted(got[i]["n"] for i in ids) == [1, 3, 4]
    assert count(engine) == 4


def test_enqueue_many_on_a_connection_rolls_back_with_it(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        with conn.begin():
            kept = enqueue_many(conn, [NewJob("kept", {"i": i}) for i in range(3)])
        trans = conn.begin()
        enqueue_many(conn, [NewJob("gone", {"i": i}) for i in range(3)])
        trans.rollback()
    assert count(engine) == 3 == len(kept)
    assert count(engine, jobs.c.kind == "gone") == 0


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"a": ({"b": {2: "x"}},)}, "payload['a'][0]['b']"),  # inside a tuple
        ({"a": collections.OrderedDict({3: "x"})}, "payload['a']"),  # another mapping type
        (collections.OrderedDict({"a": [{True: 1}]}), "payload['a'][0]"),
    ],
)
def test_a_key_that_is_not_a_string_is_refused_in_any_container_at_any_depth(
    payload: dict[str, Any], where: str
) -> None:
    with pytest.raises(InvalidJobError, match=re.escape(f"{where}: the key")):
        NewJob("k", payload)


def test_string_keys_of_any_mapping_type_and_str_subclasses_pass() -> None:
    class Name(str):
        pass

    payload = collections.OrderedDict({Name("a"): ({"b": [1, 2]},), "c": {"d": None}})
    assert NewJob("k", payload).payload_json == '{"a":[{"b":[1,2]}],"c":{"d":null}}'
