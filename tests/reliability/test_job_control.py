"""Timeouts and cancelling, with real worker processes.

Each handler of ``controlapp`` writes its effect row first and then hangs (a cooperative
loop, ``pg_sleep(3600)``, or a sleep that ignores everything). Whatever stops it, the
job must leave ``running`` within its deadline + the grace + one rescue interval, and
the hung attempt's write must never commit, not even when its thread comes back late.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncapp
import controlapp
import pytest
import sqlalchemy as sa
from helpers import rows, scalar, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import setup_app, spawn, stop_all
from sqla_jobs import ops

pytestmark = pytest.mark.reliability

LOCK_SECONDS = 6.0  # heartbeats every 2 s: the timeout, not the lease, must decide
RESCUE_INTERVAL = 0.5
GRACE = 1.0
#: Slack for two busy cores: process scheduling, a poll, a commit.
SLACK = 2.0


@contextmanager
def worker(
    url: URL, log: Path, *extra: str, app: str = "controlapp:registry"
) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process of ``app``; later ``extra`` options override the defaults."""
    proc = spawn(
        url,
        log,
        "--lock-seconds", str(LOCK_SECONDS),
        "--rescue-interval", str(RESCUE_INTERVAL),
        "--timeout-grace", str(GRACE),
        "--poll-interval", "0.2",
        "--concurrency", "2",
        *extra,
        app=app,
    )  # fmt: skip
    try:
        yield proc
    finally:
        stop_all([proc])


def enqueue(engine: sa.Engine, kind: str, payload: dict[str, Any] | None = None, **kw: Any) -> int:
    return enqueue_kind(engine, "controlapp:registry", kind, payload, **kw)


def enqueue_kind(
    engine: sa.Engine, app: str, kind: str, payload: dict[str, Any] | None = None, **kw: Any
) -> int:
    """Enqueue a job of ``kind`` with its handler's defaults, from ``app``'s registry."""
    apps = {"controlapp:registry": controlapp.registry, "asyncapp:registry": asyncapp.registry}
    with Session(engine) as s:
        job_id = apps[app][kind].enqueue(s, payload or {}, **kw)
        s.commit()
    assert job_id is not None
    return job_id


def status(engine: sa.Engine, job_id: int) -> str:
    return str(scalar(engine, "SELECT status::text FROM jobs WHERE id = :j", j=job_id))


def run_seconds(engine: sa.Engine, job_id: int) -> float:
    """From the (last) start of the handler to the job leaving ``running``, database time."""
    return float(
        scalar(
            engine,
            "SELECT extract(epoch FROM j.finished_at - max(r.started_at)) "
            "FROM jobs j JOIN runs r ON r.job_id = j.id WHERE j.id = :j GROUP BY j.finished_at",
            j=job_id,
        )
    )


def effects(engine: sa.Engine, job_id: int) -> int:
    return int(scalar(engine, "SELECT count(*) FROM effects WHERE job_id = :j", j=job_id))


@pytest.mark.parametrize(
    ("kind", "cause"),
    [
        ("spin", "job.check()"),
        ("db_sleep", "canceling statement due to statement timeout"),
    ],
)
def test_a_hung_handler_is_stopped_at_its_timeout_and_its_writes_roll_back(
    engine: sa.Engine, db_url: URL, tmp_path: Path, kind: str, cause: str
) -> None:
    setup_app(engine)
    job_id = enqueue(engine, kind, max_attempts=1)
    bound = 2.0 + GRACE + RESCUE_INTERVAL  # the handler's timeout is 2 s
    with worker(db_url, tmp_path / "w.log"):
        wait_for(lambda: status(engine, job_id) == "dead", timeout=bound + 15, message="dead")
    assert run_seconds(engine, job_id) <= bound + SLACK
    last_error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :j", j=job_id)
    assert last_error.startswith(
        "sqla_jobs.exceptions.JobTimeout: the job ran past its timeout of 2s"
    ), last_error
    assert cause in last_error
    assert effects(engine, job_id) == 0


def test_a_timed_out_attempt_is_retried_by_the_usual_rules(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    job_id = enqueue(engine, "spin")  # max_attempts=2 from the handler
    with worker(db_url, tmp_path / "w.log"):
        wait_for(lambda: status(engine, job_id) == "dead", timeout=30, message="dead")
    assert scalar(engine, "SELECT attempts FROM jobs WHERE id = :j", j=job_id) == 2
    assert scalar(engine, "SELECT count(*) FROM runs WHERE job_id = :j", j=job_id) == 2
    assert effects(engine, job_id) == 0


def test_a_job_timeout_overrides_the_handlers(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    job_id = enqueue(engine, "spin", max_attempts=1, timeout=0.5)
    with worker(db_url, tmp_path / "w.log"):
        wait_for(lambda: status(engine, job_id) == "dead", timeout=20, message="dead")
    last_error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :j", j=job_id)
    assert "the job ran past its timeout of 0.5s" in last_error


def test_a_handler_that_ignores_its_timeout_is_given_up_and_its_late_outcome_fenced(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    log = tmp_path / "w.log"
    job_id = enqueue(engine, "stubborn", {"sleep": 12})  # timeout 1 s, max_attempts 1
    with worker(db_url, log, "--concurrency", "1"):
        wait_for(lambda: status(engine, job_id) == "dead", timeout=20, message="given up")
        assert run_seconds(engine, job_id) <= 1.0 + GRACE + RESCUE_INTERVAL + SLACK
        # Its thread still sleeps; a replacement runs the next job meanwhile.
        quick = enqueue(engine, "quick")
        wait_for(lambda: status(engine, quick) == "done", timeout=20, message="quick done")
        assert "came back after the worker had given up" not in log.read_text()
        wait_for(
            lambda: "came back after the worker had given up" in log.read_text(),
            timeout=30,
            message="the late thread's log line",
        )
    last_error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :j", j=job_id)
    assert "did not stop within the 1s grace" in last_error
    assert status(engine, job_id) == "dead"
    assert effects(engine, job_id) == 0  # the late done-mark was fenced, its write rolled back
    assert effects(engine, quick) == 1


def test_a_plain_handler_that_returns_after_its_deadline_fails_and_its_writes_roll_back(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    # Timeout 1 s; it sleeps 1.5 s, then returns, well within the (long) grace.
    job_id = enqueue(engine, "stubborn", {"sleep": 1.5})
    with worker(db_url, tmp_path / "w.log", "--timeout-grace", "30"):
        wait_for(lambda: status(engine, job_id) == "dead", timeout=30, message="dead")
    last_error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :j", j=job_id)
    assert last_error.startswith(
        "sqla_jobs.exceptions.JobTimeout: the job ran past its timeout of 1s"
    ), last_error
    assert "grace" not in last_error  # it returned: not given up
    assert effects(engine, job_id) == 0  # its write, made in time, rolled back all the same
    assert scalar(engine, "SELECT result FROM jobs WHERE id = :j", j=job_id) is None


def stopped_after(engine: sa.Engine, job_id: int) -> float:
    """Seconds from the handler's start to when it saw its statement stopped (runs)."""
    return float(
        scalar(
            engine,
            "SELECT extract(epoch FROM ended_at - started_at) FROM runs WHERE job_id = :j",
            j=job_id,
        )
    )


@pytest.mark.parametrize(
    ("app", "kind", "timeout"),
    [
        ("controlapp:registry", "late_statement", controlapp.LATE_TIMEOUT),
        ("asyncapp:registry", "alate_statement", asyncapp.LATE_TIMEOUT),
    ],
    ids=["def", "async-def"],
)
def test_a_statement_started_late_is_cancelled_at_the_deadline_not_a_timeout_after_its_start(
    engine: sa.Engine, db_url: URL, tmp_path: Path, app: str, kind: str, timeout: float
) -> None:
    setup_app(engine)
    # Work outside the database for 80% of the timeout, then a statement: statement_timeout,
    # set when the transaction began, would only stop it 0.8 timeouts past the deadline.
    job_id = enqueue_kind(engine, app, kind, {"before": 0.8 * timeout})
    # A grace far longer than the test: giving up on the handler must not be what stops it.
    with worker(db_url, tmp_path / "w.log", "--timeout-grace", "60", app=app):
        wait_for(lambda: status(engine, job_id) == "dead", timeout=30, message="dead")
    last_error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :j", j=job_id)
    assert last_error.startswith("sqla_jobs.exceptions.JobTimeout"), last_error
    # The deadline watch looks every 0.25 s; half the timeout is room for a loaded machine.
    took = stopped_after(engine, job_id)
    print(f"{kind}: statement stopped {took:.3f}s after the start (timeout {timeout:g}s)")
    assert took <= 1.5 * timeout
    assert effects(engine, job_id) == 0


def active_sleep(engine: sa.Engine) -> bool:
    """A backend other than ours is running the handler's ``pg_sleep(3600)``."""
    return bool(
        scalar(
            engine,
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND datname = current_database() AND pid <> pg_backend_pid() "
            "AND position('pg_sleep(3600)' in query) > 0",
        )
    )


def test_the_database_stops_a_handlers_statement_at_its_deadline_even_with_the_worker_frozen(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    """statement_timeout, set when the handler's transaction begins, is the database's own
    stop: it holds when the worker cannot cancel anything (here: SIGSTOP)."""
    setup_app(engine)
    timeout = 5.0
    job_id = enqueue(engine, "db_sleep", max_attempts=1, timeout=timeout)
    # A lease longer than the freeze: the job must not be rescued meanwhile.
    with worker(db_url, tmp_path / "w.log", "--lock-seconds", "60") as proc:
        wait_for(lambda: active_sleep(engine), timeout=30, message="the handler in pg_sleep")
        proc.send_signal(signal.SIGSTOP)
        try:
            frozen_after = float(
                scalar(
                    engine,
                    "SELECT extract(epoch FROM clock_timestamp() - started_at) FROM runs "
                    "WHERE job_id = :j",
                    j=job_id,
                )
            )
            assert frozen_after < timeout - 1, "frozen too late to tell who stopped it"
            wait_for(
                lambda: not active_sleep(engine),
                timeout=timeout * 2,
                interval=0.02,
                message="the statement stopped by the database",
            )
            stopped = float(
                scalar(
                    engine,
                    "SELECT extract(epoch FROM clock_timestamp() - started_at) FROM runs "
                    "WHERE job_id = :j",
                    j=job_id,
                )
            )
        finally:
            proc.send_signal(signal.SIGCONT)
        wait_for(lambda: status(engine, job_id) == "dead", timeout=30, message="dead")
    print(f"frozen worker's statement stopped {stopped:.3f}s after the start (timeout 5s)")
    assert stopped <= 1.5 * timeout
    last_error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :j", j=job_id)
    assert last_error.startswith("sqla_jobs.exceptions.JobTimeout"), last_error
    assert effects(engine, job_id) == 0


def _cli(url: URL, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqla_jobs", *args],
        env={**os.environ, "DATABASE_URL": url_text(url)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _started(engine: sa.Engine, job_id: int) -> bool:
    return bool(scalar(engine, "SELECT count(*) FROM runs WHERE job_id = :j", j=job_id))


@pytest.mark.parametrize(
    ("payload", "extra"),
    [
        ({}, ()),  # a cooperative loop, told by NOTIFY
        ({"db": True}, ()),  # in pg_sleep(3600): its statement is cancelled
        ({"db": True}, ("--no-listen",)),  # no NOTIFY: the heartbeat reads the flag
    ],
    ids=["loop-notify", "pg_sleep-notify", "pg_sleep-heartbeat"],
)
def test_cancelling_a_running_job_stops_it_rolls_back_and_never_retries(
    engine: sa.Engine, db_url: URL, tmp_path: Path, payload: dict[str, Any], extra: tuple[str, ...]
) -> None:
    setup_app(engine)
    job_id = enqueue(engine, "cancellable", payload)
    with worker(db_url, tmp_path / "w.log", *extra):
        wait_for(lambda: _started(engine, job_id), timeout=20, message="handler started")
        result = _cli(db_url, "cancel", str(job_id), "--wait", "20")
        assert result.returncode == 0, result.stderr
        assert result.stdout == (
            "cancelled 0 job(s)\n"
            "asked 1 running job(s) to stop\n"
            f"job {job_id}: stopped and cancelled (its attempt's writes rolled back)\n"
        )
        # Not retried: a later job still runs, and this one stays cancelled.
        quick = enqueue(engine, "quick")
        wait_for(lambda: status(engine, quick) == "done", timeout=20, message="quick done")
    row = rows(
        engine,
        "SELECT status::text, attempts, last_error, cancel_requested_at IS NOT NULL "
        "FROM jobs WHERE id = :j",
        j=job_id,
    )[0]
    assert row[:2] == ("cancelled", 1)
    assert "JobCancelled: the job was cancelled by an operator while it was running" in row[2]
    assert row[3]
    assert effects(engine, job_id) == 0
    assert scalar(engine, "SELECT count(*) FROM runs WHERE job_id = :j", j=job_id) == 1


#: Heartbeats every 4 s (lock_seconds / 3): a cancel told by notification must land in
#: under half that, so a cancel left to the heartbeat is seen for what it is.
CANCEL_LOCK_SECONDS = 12.0


def test_a_cancel_stops_a_running_statement_long_before_the_next_heartbeat(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    job_id = enqueue(engine, "cancellable", {"db": True})
    log = tmp_path / "w.log"
    with worker(db_url, log, "--lock-seconds", str(CANCEL_LOCK_SECONDS)):
        wait_for(lambda: active_sleep(engine), timeout=20, message="the handler in pg_sleep")
        # Cancel just after a heartbeat renewed the lease: the next one is 4 s away.
        lease = "SELECT locked_until FROM jobs WHERE id = :j"
        claimed_until = scalar(engine, lease, j=job_id)
        wait_for(
            lambda: scalar(engine, lease, j=job_id) != claimed_until,
            timeout=CANCEL_LOCK_SECONDS,
            interval=0.02,
            message="a heartbeat",
        )
        with Session(engine) as s:
            asked_at = s.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
            assert ops.cancel(s, [job_id]).stopping == (job_id,)
            s.commit()
        wait_for(lambda: status(engine, job_id) == "cancelled", timeout=20, message="cancelled")
    landed = scalar(
        engine,
        "SELECT extract(epoch FROM ended_at - :t) FROM runs WHERE job_id = :j",
        t=asked_at,
        j=job_id,
    )
    print(f"cancel landed in {landed:.3f}s (heartbeat every {CANCEL_LOCK_SECONDS / 3:g}s)")
    assert landed < CANCEL_LOCK_SECONDS / 6, log.read_text()[-2000:]
    assert "cancel requested by an operator (seen at the heartbeat)" not in log.read_text()
    assert effects(engine, job_id) == 0


def test_cancel_of_jobs_that_finished_first_says_so(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    first, second = enqueue(engine, "quick"), enqueue(engine, "quick")
    with worker(db_url, tmp_path / "w.log"):
        wait_for(
            lambda: status(engine, first) == status(engine, second) == "done",
            timeout=20,
            message="both done",
        )
    with Session(engine) as s:
        assert ops.cancel(s, [first, second]) == ops.CancelResult((), ())
    result = _cli(db_url, "cancel", str(first), str(second))
    assert result.returncode == 0, result.stderr
    assert f"job {first}: not cancelled, it is done (it finished first)" in result.stdout
    assert status(engine, first) == "done" and effects(engine, first) == 1


# --- process isolation ------------------------------------------------------------------


@pytest.mark.parametrize("payload", [{}, {"db": True}], ids=["python-loop", "pg_sleep"])
def test_an_isolated_handler_is_killed_at_its_deadline_and_its_transaction_dies(
    engine: sa.Engine, db_url: URL, tmp_path: Path, payload: dict[str, Any]
) -> None:
    setup_app(engine)
    job_id = enqueue(engine, "isolated_spin", payload)  # timeout 2 s, max_attempts 1
    with worker(db_url, tmp_path / "w.log", "--concurrency", "1"):
        wait_for(lambda: status(engine, job_id) == "dead", timeout=30, message="dead")
        # No grace needed and no thread lost: the same single slot runs the next job.
        quick = enqueue(engine, "quick")
        wait_for(lambda: status(engine, quick) == "done", timeout=20, message="quick done")
    # Killed at the deadline (no grace): the process start is in the run, not the bound.
    assert run_seconds(engine, job_id) <= 2.0 + SLACK
    last_error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :j", j=job_id)
    assert last_error.startswith(
        "sqla_jobs.exceptions.JobTimeout: the job ran past its timeout of 2s"
    ), last_error
    assert effects(engine, job_id) == 0
    # The child's backend is gone with its transaction (terminated, not left in pg_sleep).
    assert (
        scalar(
            engine,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'SELECT pg_sleep(3600)%'",
        )
        == 0
    )


def test_an_isolated_handler_commits_its_writes_and_result_with_the_done_mark(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    log = tmp_path / "w.log"
    done = enqueue(engine, "isolated_work", {"snooze": True})
    failed = enqueue(engine, "isolated_work", {"fail": True}, max_attempts=1)
    with worker(db_url, log):
        wait_for(
            lambda: status(engine, done) == "done" and status(engine, failed) == "dead",
            timeout=60,
            message="both finished",
        )
    row = rows(engine, "SELECT attempts, snoozes, result FROM jobs WHERE id = :j", j=done)[0]
    assert row == (1, 1, {"pid_differs": True, "runs": 2})
    assert effects(engine, done) == 1 and effects(engine, failed) == 0
    last_error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :j", j=failed)
    assert last_error.startswith("builtins.ValueError: isolated failure"), last_error
    assert 'raise ValueError("isolated failure")' in last_error  # the child's traceback
    assert "a handler's print goes to the worker's stderr" in log.read_text()


def test_cancelling_an_isolated_job_kills_its_process(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    job_id = enqueue(engine, "isolated_spin", {"db": True}, timeout=600)
    with worker(db_url, tmp_path / "w.log"):
        wait_for(lambda: _started(engine, job_id), timeout=30, message="handler started")
        result = _cli(db_url, "cancel", str(job_id), "--wait", "20")
        assert result.returncode == 0, result.stderr
        assert f"job {job_id}: stopped and cancelled" in result.stdout
    assert status(engine, job_id) == "cancelled"
    assert effects(engine, job_id) == 0
