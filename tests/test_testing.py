"""sqla_jobs.testing for an app's tests: assertions, inline runs and drains, on real PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, setup_app_tables, url_text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import sqla_jobs
from sqla_jobs import Backoff, HandlerTransactionError, Job, JobContext, Registry, enqueue, testing


class FlakyError(Exception):
    pass


def make_registry() -> Registry:
    registry = Registry()

    @registry.handler("effect", queue="work")
    def effect(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        session.execute(
            sa.text("INSERT INTO effects (job_id, worker, attempt) VALUES (:j, :w, :a)"),
            {"j": job.id, "w": job.worker, "a": job.attempt},
        )
        if payload.get("then") is not None:
            enqueue(session, "effect", {"n": payload["then"]}, queue="work")

    @registry.handler("fails_until", queue="work", backoff=Backoff(base=30, cap=60))
    def fails_until(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        session.execute(
            sa.text("INSERT INTO effects (job_id, worker, attempt) VALUES (:j, :w, :a)"),
            {"j": job.id * 100 + job.attempt, "w": job.worker, "a": job.attempt},
        )
        if job.attempt < payload["attempt"]:
            raise FlakyError(f"attempt {job.attempt} fails")

    @registry.handler("commits")
    def commits(session: Session, payload: dict[str, Any]) -> None:
        session.commit()

    @registry.handler("swallows_commit")
    def swallows_commit(session: Session, payload: dict[str, Any]) -> None:
        with contextlib.suppress(HandlerTransactionError):
            session.commit()

    return registry


# --- assert_enqueued / refute_enqueued / enqueued_jobs -----------------------------------


def test_assertions_see_jobs_the_session_enqueued_and_did_not_commit(
    session: Session, engine: sa.Engine
) -> None:
    enqueue(session, "mail", {"order_id": 7, "lang": "de"}, queue="mail")
    session.add(Job(kind="mail", payload={"order_id": 8}))  # ORM style, not flushed yet
    found = testing.assert_enqueued(session, "mail", payload={"order_id": 7}, queue="mail")
    assert found.payload == {"order_id": 7, "lang": "de"} and found.queue == "mail"
    testing.assert_enqueued(session, "mail", payload={"order_id": 8}, queue="default")
    testing.assert_enqueued(session, "mail", count=2)
    testing.refute_enqueued(session, "mail", payload={"order_id": 7, "lang": "fr"})
    testing.refute_enqueued(session, "mail", payload={"order_id": 8}, queue="mail")
    testing.refute_enqueued(session, "sms")
    # Nothing was committed: another connection sees no job.
    assert scalar(engine, "SELECT count(*) FROM jobs") == 0
    assert [j.payload["order_id"] for j in testing.enqueued_jobs(session, "mail")] == [7, 8]


def test_assert_enqueued_failure_says_what_was_wanted_and_what_is_queued(
    session: Session,
) -> None:
    enqueue(session, "mail", {"order_id": 7}, queue="mail")
    with pytest.raises(AssertionError) as failure:
        testing.assert_enqueued(session, "mail", payload={"order_id": 9})
    assert str(failure.value).startswith(
        "expected a queued job with kind='mail', payload={'order_id': 9}, found 0; "
        "queued jobs of kind 'mail': [{'id': "
    )
    assert "'payload': {'order_id': 7}" in str(failure.value)
    with pytest.raises(AssertionError, match=r"expected 2 queued job\(s\) .* found 1"):
        testing.assert_enqueued(session, "mail", count=2)
    with pytest.raises(AssertionError, match=r"expected no queued job with kind='mail', found 1"):
        testing.refute_enqueued(session, "mail")


def test_enqueued_jobs_filters_by_status_and_works_on_a_connection(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        enqueue(conn, "a", {"x": 1})
        done_id = enqueue(conn, "a", {"x": 2})
        conn.execute(sa.text("UPDATE jobs SET status = 'done' WHERE id = :i"), {"i": done_id})
        assert [j.payload for j in testing.enqueued_jobs(conn, "a")] == [{"x": 1}]
        assert [j.id for j in testing.enqueued_jobs(conn, "a", status="done")] == [done_id]
        assert len(testing.enqueued_jobs(conn, status=None)) == 2
        conn.rollback()


# --- run_inline ---------------------------------------------------------------------------


def test_run_inline_runs_handlers_in_the_callers_transaction(
    session: Session, engine: sa.Engine
) -> None:
    setup_app_tables(engine)
    registry = make_registry()
    first = enqueue(session, "effect", {"then": 2}, queue="work")
    later = enqueue(session, "effect", {}, delay=3600, queue="work")
    enqueue(session, "unknown_kind", {})
    summary = testing.run_inline(registry, session)
    # The job the handler enqueued ran too; the scheduled one and the unknown kind did not.
    assert summary == testing.DrainSummary(done={"effect": 2})
    jobs: dict[int | None, Any] = {j.id: j for j in testing.enqueued_jobs(session, status=None)}
    assert jobs[first].status.value == "done" and jobs[first].attempts == 1
    assert jobs[first].worker == testing.INLINE_WORKER
    assert jobs[later].status.value == "queued"
    assert [j.kind for j in testing.enqueued_jobs(session)] == ["effect", "unknown_kind"]
    assert session.execute(sa.text("SELECT count(*) FROM effects")).scalar_one() == 2
    assert scalar(engine, "SELECT count(*) FROM jobs") == 0  # nothing committed
    assert testing.run_inline(registry, session, scheduled=True).done == {"effect": 1}


def test_run_inline_rolls_back_a_failed_handler_and_records_the_retry(
    session: Session, engine: sa.Engine
) -> None:
    setup_app_tables(engine)
    registry = make_registry()
    job_id = enqueue(session, "fails_until", {"attempt": 2})
    with pytest.raises(FlakyError, match="attempt 1 fails"):
        testing.run_inline(registry, session)
    (job,) = testing.enqueued_jobs(session, status=None)
    assert (job.id, job.status.value, job.attempts) == (job_id, "queued", 1)
    assert job.last_error is not None and "FlakyError: attempt 1 fails" in job.last_error
    assert job.run_at > session.execute(sa.text("SELECT now()")).scalar_one()  # backoff
    # The handler's write went with its savepoint; the session is still usable.
    assert session.execute(sa.text("SELECT count(*) FROM effects")).scalar_one() == 0
    summary = testing.run_inline(registry, session, scheduled=True)
    assert summary == testing.DrainSummary(done={"fails_until": 1})
    assert session.execute(sa.text("SELECT attempt FROM effects")).scalars().all() == [2]


def test_run_inline_without_raising_counts_retries_and_dead_jobs(
    session: Session, engine: sa.Engine
) -> None:
    setup_app_tables(engine)
    registry = make_registry()
    enqueue(session, "fails_until", {"attempt": 9}, max_attempts=2)
    summary = testing.run_inline(registry, session, raise_errors=False, scheduled=True)
    assert summary == testing.DrainSummary(retried={"fails_until": 1}, dead={"fails_until": 1})
    (job,) = testing.enqueued_jobs(session, status="dead")
    assert job.attempts == 2 and job.finished_at is not None
    assert job.run_at <= job.finished_at


def test_run_inline_refuses_a_handlers_commit_as_the_worker_does(
    session: Session, engine: sa.Engine
) -> None:
    registry = make_registry()
    enqueue(session, "commits", {})
    with pytest.raises(
        HandlerTransactionError, match=r"must not end the job's transaction \(session\.commit\(\)\)"
    ):
        testing.run_inline(registry, session)
    enqueue(session, "swallows_commit", {})
    with pytest.raises(HandlerTransactionError, match="swallowed the error"):
        testing.run_inline(registry, session)
    assert scalar(engine, "SELECT count(*) FROM jobs") == 0  # the commit never happened
    statuses = [j.status.value for j in testing.enqueued_jobs(session, status=None)]
    assert statuses == ["queued", "queued"]


# --- drain --------------------------------------------------------------------------------


def test_drain_until_empty_runs_retries_until_the_job_succeeds(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    registry = make_registry()
    with Session(engine) as s:
        flaky = enqueue(s, "fails_until", {"attempt": 3}, queue="work")
        enqueue(s, "effect", {}, queue="work")
        s.commit()
    # Backoff of 30-60 s: without until_empty the retry waits in the queue.
    first = testing.drain(db_url, registry)
    assert first == testing.DrainSummary(done={"effect": 1}, retried={"fails_until": 1})
    assert rows(engine, "SELECT status::text, attempts FROM jobs WHERE id = :i", i=flaky) == [
        ("queued", 1)
    ]
    rest = testing.drain(db_url, registry, until_empty=True)
    assert rest == testing.DrainSummary(done={"fails_until": 1}, retried={"fails_until": 1})
    assert rest.total("retried") == 1
    assert rows(engine, "SELECT status::text, attempts FROM jobs WHERE id = :i", i=flaky) == [
        ("done", 3)
    ]


def test_drain_until_empty_leaves_jobs_scheduled_beyond_its_bound(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    registry = make_registry()
    with Session(engine) as s:
        soon = enqueue(s, "effect", {}, delay=600, queue="work")
        far = enqueue(s, "effect", {}, delay=86400, queue="work")
        s.commit()
    summary = testing.drain(db_url, registry, until_empty=True, within=3600)
    assert summary.done == {"effect": 1}
    statuses = dict(rows(engine, "SELECT id, status::text FROM jobs"))
    assert statuses == {soon: "done", far: "queued"}
    with pytest.raises(ValueError, match="within must be >= 0 seconds"):
        testing.drain(db_url, registry, within=-1)


def test_drain_counts_dead_jobs(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)
    registry = make_registry()
    with Session(engine) as s:
        enqueue(s, "fails_until", {"attempt": 9}, queue="work", max_attempts=2)
        s.commit()
    summary = testing.drain(db_url, registry, until_empty=True)
    assert summary == testing.DrainSummary(retried={"fails_until": 1}, dead={"fails_until": 1})
    assert summary.total("dead") == 1
    with pytest.raises(
        ValueError, match="outcome must be done, retried, dead, snoozed or cancelled"
    ):
        summary.total("lost")


# --- the pytest plugin --------------------------------------------------------------------

PLUGIN_TEST = """
import sqlalchemy as sa

from sqla_jobs import enqueue, testing


def test_scratch_database_has_the_jobs_tables(sqla_jobs_session, sqla_jobs_engine):
    enqueue(sqla_jobs_session, "a", {})
    testing.assert_enqueued(sqla_jobs_session, "a")
    assert {"jobs", "jobs_archive"} <= set(sa.inspect(sqla_jobs_engine).get_table_names())


def test_each_test_gets_a_fresh_database(sqla_jobs_session):
    sqla_jobs_session.commit()
    testing.refute_enqueued(sqla_jobs_session, "a")
"""


def _pytest_in(tmp: Path, admin_url: URL, ini: str) -> subprocess.CompletedProcess[str]:
    (tmp / "conftest.py").write_text('pytest_plugins = ["sqla_jobs.pytest_plugin"]\n')
    (tmp / "pytest.ini").write_text(f"[pytest]\n{ini}\n")
    (tmp / "test_plugin.py").write_text(PLUGIN_TEST)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
        cwd=tmp,
        env={**os.environ, "DATABASE_URL": url_text(admin_url)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_plugin_without_an_alembic_ini_migrates_sqla_jobs_alone(
    tmp_path: Path, admin_url: URL
) -> None:
    result = _pytest_in(tmp_path, admin_url, "")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_plugin_names_a_missing_alembic_ini(tmp_path: Path, admin_url: URL) -> None:
    result = _pytest_in(tmp_path, admin_url, "sqla_jobs_alembic_ini = nowhere/alembic.ini")
    assert result.returncode != 0
    assert "sqla_jobs_alembic_ini = 'nowhere/alembic.ini': no such file" in (
        result.stdout + result.stderr
    )


def test_drain_runs_jobs_that_handlers_enqueue_into_another_queue(
    engine: sa.Engine, db_url: URL
) -> None:
    registry = Registry()

    @registry.handler("place_order", queue="orders")
    def place_order(session: Session, payload: dict[str, Any]) -> None:
        send_receipt.enqueue(session, {"order": payload["order"]})

    @registry.handler("send_receipt", queue="mail")
    def send_receipt(session: Session, payload: dict[str, Any]) -> None:
        pass

    with Session(engine) as s:
        place_order.enqueue(s, {"order": 1})
        s.commit()
    # Only "orders" holds a job when the drain starts; the receipt lands in "mail".
    summary = testing.drain(db_url, registry)
    assert summary.done == {"place_order": 1, "send_receipt": 1}
    assert rows(engine, "SELECT queue, status::text FROM jobs ORDER BY id") == [
        ("orders", "done"),
        ("mail", "done"),
    ]


def test_run_inline_records_results_and_the_handlers_decisions(session: Session) -> None:
    from sqla_jobs import Discard, RetryIn, Snooze

    registry = Registry()

    @registry.handler("answer")
    def answer(session: Session, payload: dict[str, Any]) -> dict[str, int]:
        return {"answer": 42}

    @registry.handler("later")
    def later(session: Session, payload: dict[str, Any]) -> None:
        raise Snooze(60, "not yet")

    @registry.handler("gone")
    def gone(session: Session, payload: dict[str, Any]) -> None:
        raise Discard("nothing to do")

    @registry.handler("slow_retry")
    def slow_retry(session: Session, payload: dict[str, Any]) -> None:
        raise RetryIn(600)

    ids = {kind: registry[kind].enqueue(session, {}) for kind in registry.kinds}
    summary = testing.run_inline(registry, session)  # decisions are not raised
    assert summary.done == {"answer": 1}
    assert summary.snoozed == {"later": 1}
    assert summary.cancelled == {"gone": 1}
    assert summary.retried == {"slow_retry": 1}
    answered = ids["answer"]
    assert answered is not None
    assert sqla_jobs.result(session, answered) == {"answer": 42}
    found = {
        r.kind: r
        for r in session.execute(
            sa.text(
                "SELECT kind, status::text AS status, attempts, snoozes, last_error, "
                "extract(epoch FROM run_at - statement_timestamp()) AS wait FROM jobs"
            )
        )
    }
    assert (found["later"].status, found["later"].attempts, found["later"].snoozes) == (
        "queued",
        0,
        1,
    )
    assert 59 < found["later"].wait <= 60
    assert (found["gone"].status, found["gone"].last_error) == (
        "cancelled",
        "discarded by its handler: nothing to do",
    )
    assert found["slow_retry"].status == "queued" and 599 < found["slow_retry"].wait <= 600


def test_run_inline_gives_a_job_enqueued_without_max_attempts_its_handlers(
    session: Session,
) -> None:
    registry = Registry()

    @registry.handler("once", max_attempts=1)
    def once(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        assert job.max_attempts == 1
        raise FlakyError("no second try")

    job_id = enqueue(session, "once")  # plain enqueue: no max_attempts stored
    summary = testing.run_inline(registry, session, raise_errors=False)
    assert summary.dead == {"once": 1}
    row = session.execute(
        sa.text("SELECT status::text, max_attempts FROM jobs WHERE id = :id"), {"id": job_id}
    ).one()
    assert tuple(row) == ("dead", 1)
