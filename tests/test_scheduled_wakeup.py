"""An idle worker starts a scheduled job at its ``run_at``, not at its next poll (#23).

Real worker processes with the poll interval set long (60 s): a job that starts well
within it (10 s; a loaded host has made a timer's start 3.4 s late) was started by the
worker's own timer, set from the next due time it looked up when a wake-up found
nothing ready.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, wait_for
from queuecontrolapp import SETUP_SQL
from reliability.support import spawn, stop_all
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import NewJob, enqueue, enqueue_many

POLL = "60"


def _worker(
    engine: sa.Engine,
    db_url: URL,
    tmp_path: Path,
    *args: str,
    app: str = "queuecontrolapp:registry",
) -> Iterator[Path]:
    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP_SQL)
    log = tmp_path / "w.log"
    procs: list[subprocess.Popen[bytes]] = [
        spawn(db_url, log, "--poll-interval", POLL, *args, app=app)
    ]
    wait_for(lambda: "started" in log.read_text(), message="the worker to start")
    try:
        yield log
    finally:
        stop_all(procs)


@pytest.fixture
def worker(engine: sa.Engine, db_url: URL, tmp_path: Path) -> Iterator[Path]:
    yield from _worker(engine, db_url, tmp_path)


@pytest.fixture
def unlimited_worker(engine: sa.Engine, db_url: URL, tmp_path: Path) -> Iterator[Path]:
    # jobapp: no limited kinds, whose rechecks would run rounds of their own.
    yield from _worker(engine, db_url, tmp_path, "--concurrency", "2", app="jobapp:registry")


def settle(engine: sa.Engine) -> None:
    """Let a job run and end first: the worker's first rounds (raising the idle flag, then
    looking for commits in flight) claim nothing, and would make the look themselves."""
    with Session(engine) as s:
        first = enqueue(s, "noop", {})
        s.commit()
    done = "SELECT status = 'done' FROM jobs WHERE id = :j"
    wait_for(lambda: scalar(engine, done, j=first), message="the first job to end")


def _late(engine: sa.Engine) -> float:
    """Seconds from the latest job's ``run_at`` to its handler's start (the log's clock)."""
    return float(
        scalar(
            engine,
            "SELECT extract(epoch FROM r.started_at - j.run_at) FROM control_runs r"
            " JOIN jobs j ON j.id = r.job_id ORDER BY j.run_at DESC LIMIT 1",
        )
    )


def _ran(engine: sa.Engine, n: int) -> bool:
    return bool(scalar(engine, "SELECT count(*) FROM control_runs") == n)


def test_a_delayed_job_starts_at_its_run_at_not_at_the_next_poll(
    engine: sa.Engine, worker: Path
) -> None:
    # The notification of its insert finds nothing ready; the worker then looks up when
    # the next job comes due and wakes for it.
    with Session(engine) as s:
        enqueue(s, "plain", {}, delay=timedelta(seconds=1.5))
        s.commit()
    wait_for(lambda: _ran(engine, 1), timeout=30, message="the delayed job to run")
    assert 0.0 <= _late(engine) < 10.0  # the poll (60 s) would be 58 s late or more


def test_each_of_several_delayed_jobs_starts_on_time_after_the_one_before(
    engine: sa.Engine, worker: Path
) -> None:
    # The timer that brought one scheduled job looks up the next one's time.
    with Session(engine) as s:
        enqueue_many(s, [NewJob("plain", {}, delay=1.0 + 1.5 * i) for i in range(3)])
        s.commit()
    wait_for(lambda: _ran(engine, 3), timeout=30, message="the delayed jobs to run")
    lateness = [
        float(r)
        for (r,) in rows(
            engine,
            "SELECT extract(epoch FROM r.started_at - j.run_at) FROM control_runs r"
            " JOIN jobs j ON j.id = r.job_id ORDER BY j.run_at",
        )
    ]
    assert all(0.0 <= late < 10.0 for late in lateness), lateness  # the poll: 55 s or more


def test_a_delayed_job_enqueued_beside_a_ready_one_starts_on_time_while_that_one_runs(
    engine: sa.Engine, unlimited_worker: Path
) -> None:
    # One notification for both: its claim takes the ready job, and the look for the
    # next due time, put off while that job starts (DUE_LOOK_DELAY_SECONDS), must not
    # wait for the next round that claims nothing: here, the long job's end (120 s).
    settle(engine)
    with Session(engine) as s:
        enqueue(s, "until_cancelled", {})
        delayed = enqueue(s, "noop", {}, delay=timedelta(seconds=1.5))
        s.commit()
    claimed = "SELECT attempted_at IS NOT NULL FROM jobs WHERE id = :j"
    wait_for(lambda: scalar(engine, claimed, j=delayed), timeout=30, message="the delayed job")
    late = scalar(
        engine,
        "SELECT extract(epoch FROM attempted_at - run_at) FROM jobs WHERE id = :j",
        j=delayed,
    )
    assert 0.0 <= float(late) < 10.0  # the poll (60 s) or the long job's end: 58 s or more
