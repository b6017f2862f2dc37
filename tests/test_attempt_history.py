"""The attempt history (revision 0011), against real PostgreSQL: a real worker process
records each attempt's claim, worker, end and error (snoozes and retries included), a
dead job keeps every attempt's error, a long error is cut in the history and kept whole
in ``last_error``; an expired lease and a claim given back unstarted read right; the
history is bounded, and archived jobs keep it."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from dashboard_client import Client
from helpers import rows, scalar, start_worker, stop, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from test_ops_cli import ok

from sqla_jobs import JobStatus, enqueue, ops
from sqla_jobs.dashboard import create_app
from sqla_jobs.sql import lease


def run_to_the_end(
    engine: sa.Engine, db_url: URL, jobs: list[tuple[str, dict[str, Any]]]
) -> list[int]:
    """Enqueue ``jobs`` and let a real worker process of historyapp run them until each
    is done or dead."""
    with Session(engine) as session:
        ids = [enqueue(session, kind, payload) for kind, payload in jobs]
        session.commit()
    worker = start_worker(db_url, app="historyapp:registry")
    try:
        wait_for(
            lambda: (
                scalar(
                    engine,
                    "SELECT count(*) FROM jobs WHERE id = ANY(:ids) AND status IN ('done', 'dead')",
                    ids=ids,
                )
                == len(ids)
            ),
            message="the jobs to end",
        )
    finally:
        out = stop(worker)
    assert all(i is not None for i in ids), out
    return [int(i) for i in ids if i is not None]


def job(engine: sa.Engine, job_id: int) -> ops.JobRecord:
    with Session(engine) as session:
        return ops.get_job(session, job_id)


def test_each_attempt_is_kept_with_its_claim_worker_end_and_error_snoozes_and_retries_too(
    engine: sa.Engine, db_url: URL
) -> None:
    (job_id,) = run_to_the_end(engine, db_url, [("flaky", {"fail": 2, "snooze": True})])
    record = job(engine, job_id)
    assert record.status is JobStatus.DONE and record.attempts == 3
    history = record.history
    assert [(a.attempt, a.outcome, a.then) for a in history] == [
        (1, "snoozed", "queued"),  # not spent: the next claim is attempt 1 again
        (1, "failed", "queued"),
        (2, "failed", "queued"),
        (3, "done", "done"),
    ]
    assert "not yet" in (history[0].error or "")
    assert "ValueError: boom on attempt 1" in (history[1].error or "")
    assert "ValueError: boom on attempt 2" in (history[2].error or "")
    assert history[3].error is None
    workers = {a.worker for a in history}
    assert len(workers) == 1 and None not in workers
    # Each attempt's claim and end, in order; the done one ends at finished_at.
    times = [record.created_at]
    for a in history:
        assert a.claimed_at is not None and a.ended_at is not None
        times += [a.claimed_at, a.ended_at]
    assert times == sorted(times)
    assert history[3].claimed_at == record.attempted_at
    assert history[3].ended_at == record.finished_at
    # Archived, it keeps its history.
    with Session(engine) as session:
        assert ops.archive(session, older_than=timedelta(0)) >= 1
    archived = job(engine, job_id)
    assert archived.archived and archived.history == history


def test_a_dead_job_keeps_the_error_of_every_attempt_and_a_long_one_is_cut_to_its_end(
    engine: sa.Engine, db_url: URL
) -> None:
    dead, long = run_to_the_end(
        engine, db_url, [("hopeless", {}), ("flaky", {"fail": 1, "pad": 5000})]
    )
    record = job(engine, dead)
    assert record.status is JobStatus.DEAD
    assert [(a.attempt, a.outcome, a.then) for a in record.history] == [
        (1, "failed", "queued"),
        (2, "failed", "dead"),
    ]
    assert "hopeless attempt 1" in (record.history[0].error or "")
    assert "hopeless attempt 2" in (record.history[1].error or "")
    assert record.history[1].ended_at == record.finished_at
    cut = job(engine, long)
    error = cut.history[0].error or ""
    # last_error keeps the whole text (the done attempt does not clear it); the history
    # its beginning, where the worker names the exception, before the traceback.
    whole = cut.last_error or ""
    assert len(whole) > lease.ERROR_CHARS and "Traceback" in whole
    assert len(error) == lease.ERROR_CHARS
    assert error == whole[: lease.ERROR_CHARS - 1] + "…"
    assert error.startswith("builtins.ValueError: boom on attempt 1")


def running_job(engine: sa.Engine, **columns: Any) -> int:
    values = {"worker": "w-1", "attempts": 1, "errors": None, **columns}
    with engine.begin() as conn:
        inserted = conn.execute(
            sa.text(
                "INSERT INTO jobs (kind, payload, status, attempts, max_attempts, worker, "
                "locked_until, attempted_at, errors) VALUES ('flaky', '{}', 'running', "
                ":attempts, 5, :worker, now() - interval '1 minute', "
                "now() - interval '2 minutes', CAST(:errors AS jsonb)) RETURNING id"
            ),
            values,
        )
        return int(inserted.scalar_one())


def test_an_expired_lease_is_an_attempt_of_the_history(engine: sa.Engine) -> None:
    job_id = running_job(engine, worker="w-gone")
    with engine.begin() as conn:
        conn.execute(lease.rescue_expired())
    (expired,) = job(engine, job_id).history
    assert (expired.attempt, expired.worker, expired.outcome, expired.then) == (
        1,
        "w-gone",
        "lease expired",
        "queued",
    )
    assert "stopped heartbeating" in (expired.error or "")
    assert expired.claimed_at is not None and expired.ended_at is not None
    assert expired.claimed_at < expired.ended_at


def test_a_claim_given_back_unstarted_is_no_attempt(engine: sa.Engine) -> None:
    with Session(engine) as session:
        enqueued = enqueue(session, "flaky", {})
        session.commit()
    assert enqueued is not None
    job_id = enqueued
    claim = lease.claim(worker="w-1", lock_seconds=30, queues=["default"], kinds=["flaky"], limit=1)
    with engine.begin() as conn:
        (claimed,) = conn.execute(claim).all()
    assert claimed.id == job_id
    running = job(engine, job_id)
    assert [(a.attempt, a.outcome, a.worker) for a in running.history] == [(1, "running", "w-1")]
    with engine.begin() as conn:
        conn.execute(lease.release(worker="w-1", leases=[(job_id, 1)]))
    released = job(engine, job_id)
    assert released.status is JobStatus.QUEUED and released.attempted_at is None
    assert released.history == ()


def test_the_history_keeps_the_latest_attempts_only(engine: sa.Engine) -> None:
    old = [{"attempt": n, "outcome": "failed", "error": f"old {n}"} for n in range(60)]
    job_id = running_job(engine, attempts=61, errors=json.dumps(old))
    failure = lease.record_failure(
        worker="w-1", job_id=job_id, attempt=61, delay_seconds=0, error="the latest"
    )
    with engine.begin() as conn:
        assert conn.execute(failure).all()
    (stored,) = rows(engine, "SELECT errors FROM jobs WHERE id = :i", i=job_id)
    kept = stored.errors
    assert len(kept) == lease.MAX_ERRORS
    assert kept[0]["error"] == f"old {60 - lease.MAX_ERRORS + 1}"
    assert kept[-1]["error"] == "the latest" and kept[-1]["attempt"] == 61


def timeline(engine: sa.Engine, job_id: int) -> list[str]:
    """The job page's timeline, one line of text per item."""
    client = Client(create_app(engine))
    try:
        page = client.get(f"/jobs/{job_id}").text
    finally:
        client.close()
    listed = page.split('<ol class="timeline">', 1)[1].split("</ol>", 1)[0]
    items = re.findall(r"<li[^>]*>(.*?)</li>", listed, flags=re.S)
    return [" ".join(re.sub(r"<[^>]+>", "", item).split()) for item in items]


def test_the_job_page_shows_each_attempt_in_its_timeline_live_and_archived(
    engine: sa.Engine, db_url: URL
) -> None:
    (job_id,) = run_to_the_end(engine, db_url, [("flaky", {"fail": 1, "snooze": True})])
    worker = job(engine, job_id).worker
    lines = timeline(engine, job_id)
    assert lines[0].startswith("Enqueued ")
    attempts = [line for line in lines if line.startswith("Attempt ")]
    assert re.fullmatch(
        rf"Attempt 1 on {worker}: claimed \S+ \S+, snoozed \S+ \S+ \(\d+s after its claim\), "
        r"then queued \(attempt not spent\) ?"
        r"Note snooze 1 of at most 100: snoozed for 0.01s: not yet",
        attempts[0],
    ), attempts[0]
    assert "failed" in attempts[1] and "then queued" in attempts[1]
    assert "Error builtins.ValueError: boom on attempt 1" in attempts[1]
    assert re.fullmatch(
        rf"Attempt 2 on {worker}: claimed \S+ \S+, done \S+ \S+ \(\d+s after its claim\)",
        attempts[2],
    ), attempts[2]
    assert len(attempts) == 3
    with Session(engine) as session:
        assert ops.archive(session, older_than=timedelta(0)) >= 1
    assert [line for line in timeline(engine, job_id) if line.startswith("Attempt ")] == attempts


def test_show_prints_each_attempt_with_its_outcome_worker_and_error(
    engine: sa.Engine, db_url: URL
) -> None:
    (job_id,) = run_to_the_end(engine, db_url, [("flaky", {"fail": 2, "snooze": True})])
    record = job(engine, job_id)
    text = ok(db_url, "show", str(job_id))
    history = text.split("\nhistory:\n", 1)[1].splitlines()
    worker = record.history[0].worker
    assert [line.split("  claimed ")[0] for line in history if line.startswith("  #")] == [
        "  #1 snoozed -> queued",
        "  #1 failed -> queued",
        "  #2 failed -> queued",
        "  #3 done",
    ]
    assert all(line.endswith(f"by {worker}") for line in history if line.startswith("  #"))
    errors = [line.strip() for line in history if line.startswith("      ")]
    assert errors[0].endswith("snoozed for 0.01s: not yet")
    assert errors[1].endswith("ValueError: boom on attempt 1")
    assert errors[2].endswith("ValueError: boom on attempt 2")
    assert len(errors) == 3  # the done attempt has none
    # Each line names when it was claimed and when it ended, as the record has them.
    first = record.history[1]
    assert f"claimed {first.claimed_at.isoformat()}  ended {first.ended_at.isoformat()}" in text  # type: ignore[union-attr]


def test_show_says_a_job_not_claimed_yet_has_no_history(engine: sa.Engine, db_url: URL) -> None:
    with Session(engine) as session:
        job_id = enqueue(session, "flaky", {})
        session.commit()
    assert "history:         -" in ok(db_url, "show", str(job_id))


def _timeline_job(engine: sa.Engine, status: str, run_in: str, **columns: Any) -> int:
    """A job enqueued an hour ago whose first attempt failed 50 minutes ago and whose
    latest attempt became ready ``run_in`` from now (negative: in the past)."""
    failed = {
        "attempt": 1,
        "worker": "w-1",
        "outcome": "failed",
        "then": "queued",
        "error": "boom",
    }
    values = {"attempted_at": None, "finished_at": None, "attempts": 1, **columns}
    with engine.begin() as conn:
        return int(
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (kind, payload, status, attempts, worker, created_at, "
                    "run_at, attempted_at, finished_at, errors) VALUES ('flaky', '{}', "
                    "CAST(:status AS job_status), :attempts, 'w-1', now() - interval '1 hour', "
                    "now() + CAST(:run_in AS interval), :attempted_at, :finished_at, "
                    "jsonb_build_array(CAST(:failed AS jsonb) || jsonb_build_object("
                    "'claimed_at', now() - interval '55 minutes', "
                    "'at', now() - interval '50 minutes'))) RETURNING id"
                ),
                {"status": status, "run_in": run_in, "failed": json.dumps(failed), **values},
            ).scalar_one()
        )


def test_the_job_page_timeline_is_in_time_order_with_ready_at_before_the_attempt_it_readied(
    engine: sa.Engine,
) -> None:
    now = scalar(engine, "SELECT now()")
    done = _timeline_job(
        engine,
        "done",
        "-40 minutes",
        attempts=2,
        attempted_at=now - timedelta(minutes=30),
        finished_at=now - timedelta(minutes=29),
    )
    assert [line.split(" ")[0] for line in timeline(engine, done)] == [
        "Enqueued",
        "Attempt",  # 1, failed
        "Latest",  # attempt 2 became ready 40 minutes ago ...
        "Attempt",  # ... and was claimed 30 minutes ago
        "Finished",
    ]
    lines = timeline(engine, done)
    assert lines[1].startswith("Attempt 1 ") and lines[3].startswith("Attempt 2 ")
    # A retry still ahead: its "Ready at" comes last, after the failed attempt.
    later = _timeline_job(engine, "queued", "10 minutes")
    lines = timeline(engine, later)
    assert [line.split(" ")[0] for line in lines] == ["Enqueued", "Attempt", "Ready"]
    # Every line's first timestamp (the attempt's claim) is no earlier than the one before.
    stamps = [re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line) for line in lines]
    found = [s.group(0) for s in stamps if s is not None]
    assert len(found) == 3 and found == sorted(found)


def test_the_timeline_starts_with_enqueued_and_ends_with_finished_whatever_the_clocks_say(
    engine: sa.Engine,
) -> None:
    # finished_at from the transaction's start, created_at from the statement's: the
    # finish microseconds before the enqueue, as a row written by hand can have.
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT pg_sleep(0.01)"))
        job_id = conn.execute(
            sa.text(
                "INSERT INTO jobs (kind, payload, status, attempts, created_at, run_at, "
                "finished_at) VALUES ('flaky', '{}', 'dead', 3, clock_timestamp(), "
                "clock_timestamp(), now()) RETURNING id"
            )
        ).scalar_one()
    lines = timeline(engine, job_id)
    assert [line.split(" ")[0] for line in lines] == ["Enqueued", "Latest", "Finished"]
