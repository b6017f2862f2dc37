"""The worker as real processes: signals, crashes, heartbeats, fencing, LISTEN, CLI errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
from helpers import (
    TESTS,
    rows,
    scalar,
    setup_app_tables,
    start_worker,
    stop,
    url_text,
    wait_for,
)
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import NewJob, enqueue, enqueue_many


def started(engine: sa.Engine, n: int = 1) -> bool:
    return bool(scalar(engine, "SELECT count(*) FROM runs") >= n)


def test_sigterm_drains_running_jobs_claims_nothing_more_and_exits_zero(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        enqueue_many(
            s, [NewJob("effect", {"sleep": 1.5, "log": True}, priority=0) for _ in range(2)]
        )
        enqueue_many(s, [NewJob("effect", {}, priority=5) for _ in range(10)])
        s.commit()
    proc = start_worker(db_url, "--concurrency", "2")
    try:
        wait_for(lambda: started(engine, 2), message="two handlers running")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        out = stop(proc)
    assert "draining" in out
    counts = dict(rows(engine, "SELECT status::text, count(*) FROM jobs GROUP BY 1"))
    assert counts == {"done": 2, "queued": 10}, out
    assert scalar(engine, "SELECT max(attempts) FROM jobs WHERE status = 'queued'") == 0


def test_job_longer_than_shutdown_timeout_is_left_to_its_lease_not_lost(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        enqueue(s, "effect", {"sleep": 4, "log": True})
        s.commit()
    first = start_worker(db_url, "--shutdown-timeout", "0.5", "--lock-seconds", "2")
    try:
        wait_for(lambda: started(engine), message="handler running")
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
    finally:
        out = stop(first)
    assert "still running" in out
    assert scalar(engine, "SELECT status::text FROM jobs") == "running"
    second = start_worker(db_url, "--rescue-interval", "0.5")
    try:
        wait_for(lambda: scalar(engine, "SELECT status::text FROM jobs") == "done", timeout=40)
    finally:
        stop(second)
    assert scalar(engine, "SELECT count(*) FROM effects") == 1


def test_sigkill_mid_handler_reruns_the_job_after_its_lease(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        job_id = enqueue(s, "effect", {"sleep": 3, "log": True})
        s.commit()
    victim = start_worker(db_url, "--lock-seconds", "1.5")
    try:
        wait_for(lambda: started(engine), message="handler running")
        victim.kill()
        victim.wait(10)
    finally:
        stop(victim)
    assert scalar(engine, "SELECT count(*) FROM effects") == 0
    rescuer = start_worker(db_url, "--rescue-interval", "0.3", "--lock-seconds", "1.5")
    try:
        wait_for(lambda: scalar(engine, "SELECT status::text FROM jobs") == "done", timeout=40)
    finally:
        out = stop(rescuer)
    assert rows(engine, "SELECT job_id, attempt FROM effects") == [(job_id, 2)], out


def test_poison_job_that_kills_its_worker_goes_dead_after_max_attempts(
    engine: sa.Engine, db_url: URL
) -> None:
    with Session(engine) as s:
        enqueue(s, "kill_self", {}, max_attempts=2)
        s.commit()
    procs: list[subprocess.Popen[str]] = []
    deadline = time.monotonic() + 60
    try:
        while scalar(engine, "SELECT status::text FROM jobs") != "dead":
            assert time.monotonic() < deadline, "poison job never went dead"
            if not procs or procs[-1].poll() is not None:  # a supervisor restarting it
                procs.append(
                    start_worker(db_url, "--lock-seconds", "0.6", "--rescue-interval", "0.2")
                )
            time.sleep(0.1)
    finally:
        for p in procs:
            stop(p)
    attempts, error = rows(engine, "SELECT attempts, last_error FROM jobs")[0]
    assert attempts == 2
    assert "lease expired during attempt 2 of 2" in error


def test_heartbeat_keeps_a_job_longer_than_its_lease(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        enqueue(s, "effect", {"sleep": 4, "log": True})
        s.commit()
    a = start_worker(db_url, "--lock-seconds", "1", "--rescue-interval", "0.2")
    b = start_worker(db_url, "--lock-seconds", "1", "--rescue-interval", "0.2")
    try:
        wait_for(lambda: scalar(engine, "SELECT status::text FROM jobs") == "done", timeout=40)
    finally:
        out = stop(a) + stop(b)
    assert scalar(engine, "SELECT count(*) FROM runs") == 1, out
    assert scalar(engine, "SELECT attempts FROM jobs") == 1


def test_stale_worker_paused_past_its_lease_is_fenced(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        job_id = enqueue(s, "effect", {"sleep": 2, "log": True})
        s.commit()
    stale = start_worker(db_url, "--lock-seconds", "1", "--worker-id", "stale")
    try:
        wait_for(lambda: started(engine), message="stale worker started the job")
        stale.send_signal(signal.SIGSTOP)
        other = start_worker(
            db_url, "--lock-seconds", "5", "--rescue-interval", "0.3", "--worker-id", "other"
        )
        try:
            wait_for(lambda: scalar(engine, "SELECT status::text FROM jobs") == "done", timeout=40)
        finally:
            stop(other)
        # The stale worker wakes and finishes its handler (SIGTERM lets it drain); its
        # outcome, whichever it is, is fenced: zero rows, its writes rolled back.
        stale.send_signal(signal.SIGCONT)
        stale.send_signal(signal.SIGTERM)
        assert stale.wait(30) == 0
    finally:
        out = stop(stale)
    assert "claim lost" in out
    assert rows(engine, "SELECT job_id, worker, attempt FROM effects") == [(job_id, "other", 2)]
    assert rows(engine, "SELECT worker, attempts, status::text FROM jobs") == [("other", 2, "done")]


# A worker whose dispatcher is inside _wake.wait(), holding that Event's lock, at the
# moment SIGTERM arrives: the handler's stop() must still get through.
SIGNAL_INSIDE_WAIT = """
import logging, os, signal, sys, threading, time
from jobapp import registry
from sqla_jobs import Worker, WorkerConfig

class SignalInsideWait(threading.Event):
    sent = False

    def wait(self, timeout=None):
        if not SignalInsideWait.sent:
            SignalInsideWait.sent = True
            with self._cond:  # the lock that stop() needs to set this Event
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.3)  # the main thread runs the signal handler meanwhile
        return super().wait(timeout)

logging.basicConfig(level=logging.INFO, stream=sys.stdout)
worker = Worker(registry, WorkerConfig(database_url=os.environ["DATABASE_URL"]))
worker._dispatcher._wake = SignalInsideWait()
worker.run(install_signal_handlers=True)
print("drained and stopped")
"""


def test_sigterm_while_the_dispatcher_holds_its_wake_lock_still_stops_the_worker(
    db_url: URL,
) -> None:
    env = {**os.environ, "DATABASE_URL": url_text(db_url), "PYTHONPATH": str(TESTS)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_INSIDE_WAIT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail("the worker deadlocked in its SIGTERM handler:\n" + out)
    assert proc.returncode == 0, out
    assert "received SIGTERM: no more claims, draining" in out
    assert out.rstrip().endswith("drained and stopped"), out


def test_listen_wakes_an_idle_worker_without_waiting_for_the_poll(
    engine: sa.Engine, db_url: URL
) -> None:
    proc = start_worker(db_url, "--poll-interval", "60", "--rescue-interval", "60")
    try:
        wait_for(
            lambda: (
                scalar(
                    engine,
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'"
                    " AND datname = current_database()",
                )
                == 1
            ),
            message="listener up",
        )
        time.sleep(0.3)  # let the first (start-up) poll pass; the worker is now idle
        with Session(engine) as s:
            enqueue(s, "noop", {})
            s.commit()
        t0 = time.monotonic()
        wait_for(lambda: scalar(engine, "SELECT status::text FROM jobs") == "done", timeout=20)
        assert time.monotonic() - t0 < 10, "picked up by polling, not by notification"
    finally:
        stop(proc)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["nosuchmodule:registry"], {}, "cannot import 'nosuchmodule'"),
        (["jobapp"], {}, "must look like 'package.module:registry'"),
        (["jobapp:nothing"], {}, "module 'jobapp' has no attribute 'nothing'"),
        (["jobapp:noop"], {}, "is not a sqla_jobs.Registry (got Handler)"),
        (["jobapp:registry", "--concurrency", "0"], {}, "concurrency must be between"),
        (
            ["asyncapp:registry", "--async-concurrency", "0"],
            {},
            "async_concurrency must be between 1 and 10000",
        ),
        (["jobapp:registry", "--queues", "bad queue"], {}, "queue must match"),
        (
            ["jobapp:registry", "--listener-probe-interval", "0"],
            {},
            "listener_probe_interval must be > 0, got 0.0",
        ),
        (
            ["jobapp:registry", "--listener-probe-timeout", "-2"],
            {},
            "listener_probe_timeout must be > 0, got -2.0",
        ),
        (["jobapp:registry", "--log-level", "LOUD"], {}, "argument --log-level: invalid choice"),
        (["jobapp:registry", "--concurrency", "abc"], {}, "invalid int value: 'abc'"),
        (["jobapp:registry"], {"DATABASE_URL": "mysql://x@localhost/db"}, "must be PostgreSQL"),
        (["jobapp:registry"], {"DATABASE_URL": ""}, "database URL is empty"),
        (
            ["jobapp:registry"],
            {"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"},
            "cannot connect to the database",
        ),
    ],
)
def test_cli_errors_exit_2_with_a_clear_message(
    db_url: URL, args: list[str], env: dict[str, str], message: str
) -> None:
    proc = start_worker(db_url, *args[1:], app=args[0], env=env)
    out = stop(proc) if proc.wait(60) is not None else ""
    assert proc.returncode == 2, out
    assert message in out
    assert "Traceback" not in out
    assert "usage:" not in out  # one line, as for the sqla-jobs commands


def test_cli_names_the_migration_command_for_an_unmigrated_database(empty_db_url: URL) -> None:
    proc = start_worker(empty_db_url)
    proc.wait(60)
    out = stop(proc)
    assert proc.returncode == 2
    assert "alembic upgrade head" in out and "Traceback" not in out


def test_log_outcomes_flag_logs_every_done_job_at_info(engine: sa.Engine, db_url: URL) -> None:
    with Session(engine) as s:
        job_id = enqueue(s, "noop", {})
        s.commit()
    proc = start_worker(db_url, "--log-outcomes", "--log-format", "json")
    try:
        wait_for(lambda: scalar(engine, "SELECT status::text FROM jobs") == "done")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        out = stop(proc)
    done = [json.loads(line) for line in out.splitlines() if '"outcome": "done"' in line]
    assert [(d["level"], d["job_id"], d["kind"]) for d in done] == [("INFO", job_id, "noop")]


def test_python_dash_m_sqla_jobs_lists_the_worker_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sqla_jobs", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "worker" in result.stdout


def test_database_url_option_overrides_the_environment(engine: sa.Engine, db_url: URL) -> None:
    with Session(engine) as s:
        enqueue(s, "noop", {})
        s.commit()
    proc = start_worker(
        db_url,
        "--database-url",
        url_text(db_url),
        env={"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"},
    )
    try:
        wait_for(lambda: scalar(engine, "SELECT status::text FROM jobs") == "done", timeout=30)
    finally:
        stop(proc)


def _a_job_idle_past_the_databases_timeout(engine: sa.Engine, db_url: URL) -> int:
    """A job whose handler reads, then sleeps 2 s with its transaction open, in a
    database whose sessions are closed after 1 s idle in transaction."""
    setup_app_tables(engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(
            f'ALTER DATABASE "{db_url.database}" SET idle_in_transaction_session_timeout = 1000'
        )
    with Session(engine) as s:
        job_id = enqueue(s, "read_then_idle", {"sleep": 2})
        s.commit()
    assert job_id is not None
    return job_id


def test_a_connection_lost_while_recording_the_outcome_fails_the_job_after_its_give_backs(
    engine: sa.Engine, db_url: URL
) -> None:
    """The worker's role has an idle_in_transaction_session_timeout shorter than the
    handler: its session is closed while it sleeps, the done-mark finds the connection
    lost. Given back MAX_LOST_GIVEBACKS times, then a failed attempt, not running for ever."""
    from sqla_jobs.worker import _completer

    job_id = _a_job_idle_past_the_databases_timeout(engine, db_url)
    proc = start_worker(db_url, "--poll-interval", "0.2")
    try:
        wait_for(
            lambda: (
                scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id) == "dead"
            ),
            timeout=60,
            message="the job dead after its give-backs",
        )
    finally:
        out = stop(proc)
    runs = scalar(engine, "SELECT count(*) FROM runs WHERE job_id = :i", i=job_id)
    assert 1 < runs <= _completer.MAX_LOST_GIVEBACKS + 1, out
    error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :i", i=job_id)
    assert "connection was lost while the job's outcome was recorded" in error
    assert "idle_in_transaction_session_timeout" in error
    assert "terminated backend" in error and "failover" in error
    assert scalar(engine, "SELECT attempts FROM jobs WHERE id = :i", i=job_id) == 1


def test_a_worker_url_that_turns_the_idle_timeout_off_runs_a_handler_longer_than_it(
    engine: sa.Engine, db_url: URL
) -> None:
    """The remedy Running for years gives when the app and the workers share a role:
    ``options=-c idle_in_transaction_session_timeout=0`` in the workers' URL."""
    job_id = _a_job_idle_past_the_databases_timeout(engine, db_url)
    url = db_url.update_query_dict({"options": "-c idle_in_transaction_session_timeout=0"})
    proc = start_worker(url, "--poll-interval", "0.2")
    try:
        wait_for(
            lambda: (
                scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id) == "done"
            ),
            timeout=60,
            message="the job done",
        )
    finally:
        out = stop(proc)
    assert scalar(engine, "SELECT count(*) FROM runs WHERE job_id = :i", i=job_id) == 1, out
