"""Decisions from inside a handler (Snooze, RetryIn, Discard) and results, in a worker
running in this process; timeouts and cancelling are in test_job_control_process.py."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
import test_worker
from controlapp import registry
from helpers import rows, scalar, setup_app_tables, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import sqla_jobs
from sqla_jobs import (
    Discard,
    InvalidJobError,
    JobContext,
    JobNotDoneError,
    JobNotFoundError,
    JobTimeout,
    NewJob,
    Registry,
    RegistryError,
    RetryIn,
    Snooze,
    Worker,
    enqueue,
    enqueue_many,
    ops,
)
from sqla_jobs.control import Control


def running(url: URL, **options: Any) -> contextlib.AbstractContextManager[Worker]:
    """test_worker's in-process worker, on this file's registry, polling every 0.1 s."""
    options.setdefault("poll_interval", 0.1)
    return test_worker.running(registry, url, **options)


def job_row(engine: sa.Engine, job_id: int) -> Any:
    return rows(
        engine,
        "SELECT status::text AS status, attempts, snoozes, last_error, result, run_at, "
        "finished_at FROM jobs WHERE id = :id",
        id=job_id,
    )[0]


def enqueue_one(engine: sa.Engine, kind: str, payload: dict[str, Any] | None = None) -> int:
    with Session(engine) as s:
        job_id = registry[kind].enqueue(s, payload or {})  # with the handler's defaults
        s.commit()
    assert job_id is not None
    return job_id


def finished(engine: sa.Engine, job_id: int) -> bool:
    return job_row(engine, job_id).status in ("done", "dead", "cancelled")


# --- A: decisions from inside a handler ----------------------------------------------


def test_snooze_runs_the_job_again_without_spending_an_attempt_and_rolls_back_its_writes(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    job_id = enqueue_one(engine, "snooze_twice")
    with running(db_url):
        wait_for(lambda: finished(engine, job_id), message="snoozed job done")
    row = job_row(engine, job_id)
    assert (row.status, row.attempts, row.snoozes) == ("done", 1, 2)
    assert row.result == "ran after 2 snoozes"
    # The effect committed once: the snoozed runs' inserts were rolled back.
    assert scalar(engine, "SELECT count(*) FROM effects WHERE job_id = :j", j=job_id) == 1
    assert scalar(engine, "SELECT count(*) FROM runs WHERE job_id = :j", j=job_id) == 3
    # The last snooze is on record until the run that succeeded.
    assert "snooze 2 of at most 100" in row.last_error
    assert "the partner API is rate limited" in row.last_error


def test_snoozing_past_max_snoozes_is_a_failed_attempt(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        job_id = enqueue(s, "snooze_forever", {}, max_attempts=1)
        s.commit()
    assert job_id is not None
    with running(db_url):
        wait_for(lambda: finished(engine, job_id), message="job dead")
    row = job_row(engine, job_id)
    assert (row.status, row.attempts, row.snoozes) == ("dead", 1, 3)
    assert "the job snoozed 3 times, its handler's max_snoozes" in row.last_error
    assert scalar(engine, "SELECT count(*) FROM runs WHERE job_id = :j", j=job_id) == 4


def test_discard_ends_the_job_cancelled_at_once_without_its_writes(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    job_id = enqueue_one(engine, "discard")
    with running(db_url):
        wait_for(lambda: finished(engine, job_id), message="job discarded")
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("cancelled", 1)
    assert row.finished_at is not None
    assert row.last_error == "discarded by its handler: order 42 no longer exists"
    assert scalar(engine, "SELECT count(*) FROM effects") == 0
    assert scalar(engine, "SELECT count(*) FROM runs WHERE job_id = :j", j=job_id) == 1


def test_retry_in_spends_the_attempt_and_waits_the_chosen_delay(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    soon = enqueue_one(engine, "retry_in", {"seconds": 0.05, "until": 3})
    later = enqueue_one(engine, "retry_in", {"seconds": 3600, "until": 99})
    with running(db_url):
        wait_for(lambda: finished(engine, soon), message="retried job done")
        wait_for(lambda: job_row(engine, later).last_error is not None, message="retry recorded")
    row = job_row(engine, soon)
    assert (row.status, row.attempts) == ("done", 3)
    row = job_row(engine, later)
    assert (row.status, row.attempts) == ("queued", 1)
    assert "RetryIn: retry requested in 3600s: the upstream said 503" in row.last_error
    wait = scalar(
        engine, "SELECT extract(epoch FROM run_at - now()) FROM jobs WHERE id = :j", j=later
    )
    assert 3500 < wait <= 3600
    # Only the successful run's effect committed.
    assert rows(engine, "SELECT job_id, attempt FROM effects") == [(soon, 3)]


def test_retry_in_at_the_last_attempt_makes_the_job_dead(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        job_id = enqueue(s, "retry_in", {"seconds": 0, "until": 9}, max_attempts=2)
        s.commit()
    assert job_id is not None
    with running(db_url):
        wait_for(lambda: finished(engine, job_id), message="job dead")
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("dead", 2)


def test_decisions_refuse_bad_delays_where_they_are_raised() -> None:
    with pytest.raises(ValueError, match="Snooze takes a delay >= 0 seconds, got -1"):
        Snooze(-1)
    with pytest.raises(TypeError, match="RetryIn takes seconds"):
        RetryIn("soon")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Snooze takes seconds"):
        Snooze(float("nan"))
    assert Snooze(timedelta(minutes=2)).seconds == 120.0
    assert str(Discard("gone")) == "discarded by its handler: gone"


def test_max_snoozes_and_timeout_are_checked_at_registration() -> None:
    reg = Registry()
    with pytest.raises(RegistryError, match="max_snoozes must be a non-negative integer"):
        reg.handler("a", max_snoozes=-1)(lambda session, payload: None)
    with pytest.raises(RegistryError, match="timeout must be a finite number of seconds > 0"):
        reg.handler("b", timeout=0)(lambda session, payload: None)
    with pytest.raises(RegistryError, match="timeout must be at most 604800 seconds"):
        reg.handler("c", timeout=timedelta(days=8))(lambda session, payload: None)
    with pytest.raises(
        RegistryError, match="handler 'd': isolation must be 'thread' or 'process', got 'fork'"
    ):
        reg.handler("d", isolation="fork")(lambda session, payload: None)


# --- B: results -----------------------------------------------------------------------


def test_a_returned_value_is_stored_with_the_done_mark_and_read_back(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    value = {"invoice": "F-2026-001", "lines": [1, 2.5, None, True], "note": "é"}
    with Session(engine) as s:
        wrote = enqueue(s, "returns", {"value": value, "write": True})
        pure = enqueue(s, "returns", {"value": [1, 2, 3]})
        nothing = enqueue(s, "returns", {})
        s.commit()
    assert wrote and pure and nothing
    with running(db_url):
        wait_for(lambda: all(finished(engine, j) for j in (wrote, pure, nothing)), message="done")
    with Session(engine) as s:
        assert sqla_jobs.result(s, wrote) == value
        assert sqla_jobs.result(s, pure) == [1, 2, 3]  # no writes: the one-job done-mark
        assert sqla_jobs.result(s, nothing) is None  # None: the batched done-mark
    assert scalar(engine, "SELECT count(*) FROM effects WHERE job_id = :j", j=wrote) == 1
    assert scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'done'") == 3


def test_result_of_an_archived_job_is_still_there(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)
    job_id = enqueue_one(engine, "returns", {"value": {"n": 7}})
    with running(db_url):
        wait_for(lambda: finished(engine, job_id), message="done")
    with Session(engine) as s:
        assert ops.archive(s, older_than=timedelta(0)) == 1
        assert scalar(engine, "SELECT count(*) FROM jobs") == 0
        assert sqla_jobs.result(s, job_id) == {"n": 7}
    assert scalar(engine, "SELECT result FROM jobs_archive WHERE id = :j", j=job_id) == {"n": 7}


def test_result_of_a_missing_or_unfinished_job_says_so(engine: sa.Engine) -> None:
    job_id = enqueue_one(engine, "returns", {"value": 1})
    with Session(engine) as s:
        with pytest.raises(JobNotDoneError, match=f"job {job_id} is queued: only done jobs"):
            sqla_jobs.result(s, job_id)
        with pytest.raises(JobNotFoundError, match="no job with id 999999"):
            sqla_jobs.result(s, 999999)


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("object", "the handler's return value is not JSON-serializable: result['when']: "),
        ("huge", "bytes as JSON, more than the 1,048,576 allowed (MAX_RESULT_BYTES)"),
    ],
)
def test_a_return_value_that_cannot_be_stored_fails_the_attempt_and_rolls_back(
    engine: sa.Engine, db_url: URL, what: str, message: str
) -> None:
    setup_app_tables(engine)
    job_id = enqueue_one(engine, "returns_bad", {"what": what})
    with running(db_url):
        wait_for(lambda: finished(engine, job_id), message="job dead")
    row = job_row(engine, job_id)
    assert row.status == "dead" and row.result is None
    assert row.last_error.startswith("sqla_jobs.exceptions.ResultError: ")
    assert message in row.last_error
    assert scalar(engine, "SELECT count(*) FROM effects") == 0


def test_show_prints_the_result_and_the_decision(engine: sa.Engine, db_url: URL) -> None:
    import subprocess
    import sys

    setup_app_tables(engine)
    done = enqueue_one(engine, "returns", {"value": {"total": 12}})
    discarded = enqueue_one(engine, "discard")
    with running(db_url):
        wait_for(lambda: finished(engine, done) and finished(engine, discarded), message="ends")

    def show(job_id: int) -> str:
        return subprocess.run(
            [sys.executable, "-m", "sqla_jobs", "show", str(job_id)],
            env={"DATABASE_URL": url_text(db_url), "PATH": ""},
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    assert 'result:\n{\n  "total": 12\n}' in show(done)
    out = show(discarded)
    assert "status:          cancelled" in out
    assert "last_error:\ndiscarded by its handler: order 42 no longer exists" in out


def test_the_attempt_history_reads_timestamps_whose_fraction_postgres_shortened(
    engine: sa.Engine,
) -> None:
    # to_jsonb drops the fraction's trailing zeros; Python 3.10's fromisoformat then
    # refused 5 digits, and `sqla-jobs show` failed for one job in ten (the matrix's
    # Python 3.10 cell found it).
    with engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT to_jsonb(CAST('2026-12-02 00:57:27.11095+00' AS timestamptz))")
        ).scalar_one()
    assert stored.endswith(".11095+00:00")
    entry = {"attempt": 1, "claimed_at": stored, "at": "2026-12-02T00:57:28.5+00:00"}
    record = ops.AttemptRecord.from_entry(entry)
    assert record.claimed_at is not None and record.ended_at is not None
    assert record.claimed_at.microsecond == 110950
    assert record.ended_at.microsecond == 500000
    assert record.claimed_at.utcoffset() == timedelta(0)


# --- C (in process): the context a handler sees -----------------------------------------


def test_the_job_context_tells_the_deadline_and_check_raises_after_it() -> None:
    control = Control(0.5, started=0.0)  # started long ago on the monotonic clock
    job = JobContext(1, "k", "default", 1, 3, "w", control=control)
    assert job.deadline == 0.5 and job.time_left() == 0.0 and job.cancelled
    with pytest.raises(JobTimeout, match=r"the job ran past its timeout of 0\.5s"):
        job.check()
    plain = JobContext(1, "k", "default", 1, 3, "w")
    assert plain.deadline is None and plain.time_left() is None and not plain.cancelled
    plain.check()


def test_timeouts_are_checked_at_enqueue(session: Session) -> None:
    cases: list[tuple[Any, str]] = [
        (0, "timeout must be a finite number of seconds > 0, got 0"),
        (-1, "timeout must be a finite number of seconds > 0, got -1"),
        ("5", "timeout must be seconds or a timedelta, got str"),
        (8 * 86400, "timeout must be at most 604800 seconds"),
    ]
    for bad, message in cases:
        with pytest.raises(InvalidJobError, match=message):
            enqueue(session, "spin", {}, timeout=bad)
        with pytest.raises(InvalidJobError, match=message):
            NewJob("spin", {}, timeout=bad)
    ids = [
        enqueue(session, "spin", {}, timeout=timedelta(seconds=90)),
        *enqueue_many(session, [NewJob("spin", {}, timeout=2.5), NewJob("spin", {})]),
    ]
    found = session.execute(
        sa.text("SELECT id, timeout FROM jobs WHERE id = ANY(:ids)"), {"ids": ids}
    )
    timeouts: dict[int, float | None] = {r.id: r.timeout for r in found}
    assert sorted(t for t in timeouts.values() if t is not None) == [2.5, 90.0]
    assert list(timeouts.values()).count(None) == 1


def test_the_snooze_log_line_carries_the_reason(
    engine: sa.Engine, db_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    setup_app_tables(engine)
    caplog.set_level(logging.INFO, logger="sqla_jobs.worker")
    job_id = enqueue_one(engine, "snooze_twice")
    with running(db_url):
        wait_for(lambda: finished(engine, job_id), message="done")
    assert any(
        "snoozed for" in r.getMessage() and "rate limited" in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


def test_a_cancelled_running_job_whose_worker_died_ends_cancelled_not_requeued(
    engine: sa.Engine, db_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    with engine.begin() as conn:
        job_id = conn.execute(
            sa.text(
                "INSERT INTO jobs (kind, payload, status, attempts, worker, locked_until, "
                "cancel_requested_at) VALUES ('quick', '{}', 'running', 1, 'gone:1', "
                "now() - interval '1 minute', now()) RETURNING id"
            )
        ).scalar_one()
    with (
        caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"),
        running(db_url, rescue_interval=0.1),
    ):
        wait_for(lambda: finished(engine, job_id), message="rescued")
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("cancelled", 1)
    assert "lease expired during attempt 1" in row.last_error
    said = [r.getMessage() for r in caplog.records if "lease expired on attempt" in r.getMessage()]
    assert said == [f"job {job_id} (quick) lease expired on attempt 1 (worker gone:1): cancelled"]
