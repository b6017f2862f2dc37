"""Scenario 10: SIGTERM drains running jobs, claims nothing more, loses nothing."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import count, run_started, setup_app, setup_gated, spawn, stop_all
from sqla_jobs import NewJob, enqueue, enqueue_many

pytestmark = pytest.mark.reliability

RUNNING = 4
QUEUED = 100


def test_sigterm_finishes_the_running_jobs_claims_nothing_more_and_exits_zero(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    with Session(engine) as s:
        enqueue_many(
            s, [NewJob("work", {"sleep": 1.5, "log": True}, priority=0) for _ in range(RUNNING)]
        )
        enqueue_many(s, [NewJob("work", {"log": True}, priority=5) for _ in range(QUEUED)])
        s.commit()
    log = tmp_path / "worker.log"
    proc = spawn(db_url, log, "--concurrency", str(RUNNING), "--lock-seconds", "1")
    try:
        wait_for(
            lambda: count(engine, "SELECT count(*) FROM runs") == RUNNING,
            message="four handlers running",
        )
        signalled_at = scalar(engine, "SELECT clock_timestamp()")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        stop_all([proc])
    out = log.read_text()
    assert "draining" in out
    by_status = dict(rows(engine, "SELECT status::text, count(*) FROM jobs GROUP BY 1"))
    assert by_status == {"done": RUNNING, "queued": QUEUED}, out[-3000:]
    # The four finished after the signal; no handler started after it.
    assert count(engine, "SELECT count(*) FROM runs WHERE ended_at > :t", t=signalled_at) == RUNNING
    assert count(engine, "SELECT count(*) FROM runs WHERE started_at > :t", t=signalled_at) == 0
    assert count(engine, "SELECT count(*) FROM effects") == RUNNING
    # Untouched: not one attempt spent, no lease, no worker (jobs claimed ahead of time,
    # if any, were given back).
    assert (
        count(
            engine,
            "SELECT count(*) FROM jobs WHERE status = 'queued' AND attempts = 0 "
            "AND worker IS NULL AND locked_until IS NULL",
        )
        == QUEUED
    )


def test_a_job_longer_than_the_shutdown_timeout_is_left_to_its_lease_never_lost(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    with Session(engine) as s:
        job_id = enqueue(s, "work", {"sleep": 3, "log": True})
        s.commit()
    log = tmp_path / "worker.log"
    first = spawn(db_url, log, "--shutdown-timeout", "0.5", "--lock-seconds", "1")
    procs = [first]
    try:
        wait_for(lambda: count(engine, "SELECT count(*) FROM runs"), message="handler running")
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
        ((status, lease),) = rows(engine, "SELECT status::text, locked_until FROM jobs")
        assert status == "running" and lease is not None  # left to its lease
        procs.append(spawn(db_url, log, "--rescue-interval", "0.3", "--lock-seconds", "1"))
        wait_for(
            lambda: scalar(engine, "SELECT status::text FROM jobs") == "done",
            message="job taken over after its lease",
        )
    finally:
        stop_all(procs)
    assert "still running" in log.read_text()
    ((attempts, finished_at),) = rows(engine, "SELECT attempts, finished_at FROM jobs")
    assert attempts == 2 and finished_at >= lease
    assert rows(engine, "SELECT job_id, attempt FROM effects") == [(job_id, 2)]


WARMUP = 30
PREFETCH = 10
BEHIND = 40


def test_sigterm_gives_buffered_jobs_back_at_once_with_their_attempt_unspent(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    """One handler thread held in a job that outlives the shutdown timeout, jobs claimed
    ahead of it in the buffer, a 60 s lease: when the worker has exited, the buffered
    jobs are already queued again, attempt not spent. Nothing but the give-back can
    explain that (their lease still had about a minute to run)."""
    setup_gated(engine)
    with Session(engine) as s:
        # No-op jobs first: the worker learns its handlers' pace, so it buffers.
        enqueue_many(s, [NewJob("noop", {}, priority=0) for _ in range(WARMUP)])
        blocker = enqueue(s, "gated", {}, priority=1)  # its gate never opens
        enqueue_many(s, [NewJob("noop", {}, priority=2) for _ in range(BEHIND)])
        s.commit()
    assert blocker is not None
    log = tmp_path / "worker.log"
    args = ("--concurrency", "1", "--prefetch", str(PREFETCH), "--lock-seconds", "60")
    proc = spawn(db_url, log, *args, "--shutdown-timeout", "0.5", "--worker-id", "w")
    try:
        wait_for(lambda: run_started(engine, blocker, "w", 1), message="blocker running")
        buffered = wait_for(
            lambda: count(
                engine, "SELECT count(*) FROM jobs WHERE status = 'running' AND id <> :b", b=blocker
            ),
            message="jobs claimed into the buffer behind the blocker",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        stop_all([proc])
    out = log.read_text()
    print(f"{buffered} job(s) buffered behind the blocker")
    assert dict(rows(engine, "SELECT status::text, count(*) FROM jobs GROUP BY 1")) == {
        "done": WARMUP,
        "running": 1,
        "queued": BEHIND,
    }, out[-3000:]
    # The blocker keeps its lease (left to it, never lost); every other job is as new.
    assert rows(engine, "SELECT id, worker, attempts FROM jobs WHERE status = 'running'") == [
        (blocker, "w", 1)
    ]
    assert (
        count(
            engine,
            "SELECT count(*) FROM jobs WHERE status = 'queued' AND attempts = 0 "
            "AND worker IS NULL AND locked_until IS NULL",
        )
        == BEHIND
    )
