"""Scenarios 2-4: a kill at every point of a job's life, no overlapping runs, stale workers."""

from __future__ import annotations

import random
import signal
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import (
    all_done,
    count,
    exactly_once,
    oracle,
    setup_app,
    spawn,
    stop_all,
)
from sqla_jobs import NewJob, enqueue, enqueue_many

pytestmark = pytest.mark.reliability

# A deferred constraint trigger runs at COMMIT, after the done-mark: a job whose payload
# has "slow_commit" holds its handler-plus-done transaction inside COMMIT for that many
# seconds, which is where the test kills the worker.
SLOW_COMMIT_SQL = """
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_sleep(coalesce(
    (SELECT (payload->>'slow_commit')::float FROM jobs WHERE id = NEW.job_id), 0));
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER effects_slow_commit AFTER INSERT ON effects
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
"""

#: Where a worker is killed, and the payload that makes that point observable.
POINTS: dict[str, dict[str, object]] = {
    # claim committed, handler has done nothing yet (it sleeps before its first write)
    "after_claim": {"pre_sleep": 1.0, "log": True},
    # handler running, nothing written in its transaction yet
    "in_handler": {"sleep": 1.0, "log": True},
    # handler's effect flushed, done-mark not yet sent: the handler SIGKILLs its worker
    "after_flush": {"die_after_flush": True, "log": True},
    # inside COMMIT of effect + done-mark; the server notices the dead client and aborts
    "in_commit_aborted": {"slow_commit": 1.0},
    # inside COMMIT of effect + done-mark; the server finishes the commit anyway
    "in_commit_committed": {"slow_commit": 1.0},
}
WORKER_ARGS = ("--lock-seconds", "1", "--rescue-interval", "0.3", "--poll-interval", "0.2")


def _configure_for(engine: sa.Engine, db_name: str, point: str) -> None:
    """Sessions started from now on notice a vanished client mid-query (or do not)."""
    setting = (
        "SET client_connection_check_interval = 20"
        if point == "in_commit_aborted"
        else "RESET client_connection_check_interval"
    )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{db_name}" {setting}')


def _reach(engine: sa.Engine, point: str, job_id: int, victim: subprocess.Popen[bytes]) -> None:
    """Wait until the victim's run of ``job_id`` is at ``point``, then SIGKILL it."""
    if point == "after_claim":
        wait_for(
            lambda: (
                scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id) == "running"
            ),
            message="claim committed",
        )
        assert count(engine, "SELECT count(*) FROM runs WHERE job_id = :i", i=job_id) == 0
    elif point == "in_handler":
        wait_for(
            lambda: count(engine, "SELECT count(*) FROM runs WHERE job_id = :i", i=job_id),
            message="handler started",
        )
    elif point == "after_flush":
        victim.wait(30)  # the handler kills its own worker
        assert victim.returncode == -signal.SIGKILL
        return
    else:
        wait_for(
            lambda: count(
                engine,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query = 'COMMIT' AND wait_event = 'PgSleep'",
            ),
            message="worker inside COMMIT",
        )
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)


def test_kill_at_every_point_of_a_jobs_life_keeps_effect_and_done_together(
    engine: sa.Engine, db_url: URL, tmp_path: Path, rng: random.Random
) -> None:
    setup_app(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(SLOW_COMMIT_SQL)
    assert db_url.database
    rounds = [p for p in POINTS for _ in range(2)]
    rng.shuffle(rounds)
    log = tmp_path / "workers.log"
    procs: list[subprocess.Popen[bytes]] = []
    outcomes: list[tuple[str, int, int]] = []
    try:
        _configure_for(engine, db_url.database, rounds[0])
        victim = spawn(db_url, log, *WORKER_ARGS)
        procs.append(victim)
        for i, point in enumerate(rounds):
            with Session(engine) as s:
                job_id = enqueue(s, "work", POINTS[point])
                s.commit()
            assert job_id is not None
            _reach(engine, point, job_id, victim)
            killed_at: datetime = scalar(engine, "SELECT clock_timestamp()")
            lease: datetime | None = scalar(
                engine, "SELECT locked_until FROM jobs WHERE id = :i", i=job_id
            )
            # The next round's victim is this round's rescuer, so configure it now.
            _configure_for(engine, db_url.database, rounds[min(i + 1, len(rounds) - 1)])
            victim = spawn(db_url, log, *WORKER_ARGS)
            procs.append(victim)
            wait_for(
                lambda job_id=job_id: (  # type: ignore[misc]
                    scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id)
                    == "done"
                ),
                message=f"job of round {i} ({point}) done",
            )
            ((attempts, finished_at),) = rows(
                engine, "SELECT attempts, finished_at FROM jobs WHERE id = :i", i=job_id
            )
            effects = rows(engine, "SELECT attempt FROM effects WHERE job_id = :i", i=job_id)
            outcomes.append((point, attempts, len(effects)))
            if point == "in_commit_committed":
                # The commit landed although its worker was dead: done once, not rerun.
                assert (attempts, effects) == (1, [(1,)]), point
                assert finished_at < killed_at
            else:
                assert (attempts, effects) == (2, [(2,)]), point
                assert lease is not None and finished_at >= lease, (point, lease, finished_at)
    finally:
        stop_all(procs)
    print(f"kill points: {outcomes}")
    assert oracle(engine) == exactly_once(len(rounds)), log.read_text()[-3000:]


LONG_JOBS = 8
SHORT_JOBS = 1_500


def test_no_two_runs_of_a_job_overlap_while_heartbeats_are_alive(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    with Session(engine) as s:
        # Long jobs (3.5 leases) first, so they run while the short ones stream past.
        enqueue_many(
            s, [NewJob("work", {"sleep": 3.5, "log": True}, priority=0) for _ in range(LONG_JOBS)]
        )
        enqueue_many(s, [NewJob("work", {"log": True}, priority=1) for _ in range(SHORT_JOBS)])
        s.commit()
    args = ("--concurrency", "4", "--lock-seconds", "1", "--rescue-interval", "0.3")
    procs = [spawn(db_url, tmp_path / "workers.log", *args) for _ in range(3)]
    total = LONG_JOBS + SHORT_JOBS
    try:
        wait_for(lambda: all_done(engine, total), timeout=120, message="all jobs done")
    finally:
        stop_all(procs)
    out = (tmp_path / "workers.log").read_text()
    assert oracle(engine) == exactly_once(total), out[-3000:]
    overlapping = count(
        engine,
        """
        SELECT count(*) FROM runs a JOIN runs b ON a.job_id = b.job_id AND a.id < b.id
         WHERE tstzrange(a.started_at, coalesce(a.ended_at, 'infinity'))
            && tstzrange(b.started_at, coalesce(b.ended_at, 'infinity'))
        """,
    )
    assert overlapping == 0
    assert count(engine, "SELECT count(*) FROM runs") == total, out[-3000:]
    assert count(engine, "SELECT count(DISTINCT worker) FROM runs") == 3
    assert count(engine, "SELECT max(attempts) FROM jobs") == 1
    assert (
        count(
            engine,
            "SELECT count(*) FROM runs WHERE ended_at - started_at > interval '3 seconds'",
        )
        == LONG_JOBS
    )
    # (The heartbeat may log a spurious "lease lost" for a job whose done-mark committed
    # between its snapshot and its UPDATE; the completion path logs real losses.)
    assert "claim lost" not in out


def test_stale_worker_resumed_after_takeover_is_fenced_and_rolls_back(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    with Session(engine) as s:
        job_id = enqueue(s, "work", {"sleep": 2, "log": True})
        s.commit()
    stale_log, other_log = tmp_path / "stale.log", tmp_path / "other.log"
    stale = spawn(db_url, stale_log, "--lock-seconds", "1", "--worker-id", "stale")
    procs = [stale]
    try:
        wait_for(lambda: count(engine, "SELECT count(*) FROM runs"), message="stale started")
        stale.send_signal(signal.SIGSTOP)
        procs.append(
            spawn(
                db_url,
                other_log,
                *("--lock-seconds", "5", "--rescue-interval", "0.3", "--worker-id", "other"),
            )
        )
        wait_for(
            lambda: scalar(engine, "SELECT status::text FROM jobs") == "done",
            message="other worker finished the job",
        )
        stale.send_signal(signal.SIGCONT)
        wait_for(lambda: "claim lost" in stale_log.read_text(), message="stale fenced")
        stale.send_signal(signal.SIGTERM)
        assert stale.wait(30) == 0
    finally:
        stop_all(procs)
    assert rows(engine, "SELECT job_id, worker, attempt FROM effects") == [(job_id, "other", 2)]
    assert rows(engine, "SELECT worker, attempts, status::text FROM jobs") == [("other", 2, "done")]
    # Both runs happened; the stale one resumed after the takeover and wrote nothing that
    # survived (its effect insert or its done-mark failed, and its transaction rolled back).
    assert rows(engine, "SELECT worker, attempt FROM runs ORDER BY attempt") == [
        ("stale", 1),
        ("other", 2),
    ]
    assert oracle(engine) == exactly_once(1)
