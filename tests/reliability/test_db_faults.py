"""Scenario 5: database faults. Workers survive a server restart and killed backends."""

from __future__ import annotations

import importlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.cluster import Proxy
from reliability.support import (
    GATED_SQL,
    WORKER_APP,
    all_done,
    exactly_once,
    oracle,
    setup_app,
    spawn,
    status_counts,
    stop_all,
    terminate,
    worker_backends,
)
from sqla_jobs import NewJob, enqueue, enqueue_many, testing

pytestmark = pytest.mark.reliability

JOBS = 400
WORKERS = 2
#: A poll this long cannot explain a pickup within NOTIFY_PICKUP seconds.
ARGS = ("--concurrency", "4", "--lock-seconds", "1", "--rescue-interval", "0.3")
POLL = ("--poll-interval", "30")
NOTIFY_PICKUP = 5.0
AFTER_FAULT = 3


@pytest.fixture
def private_server() -> Iterator[tuple[URL, Callable[[], None]]]:
    """An embedded PostgreSQL owned by this test alone, and a function that restarts it."""
    pgserver: Any = pytest.importorskip("pgserver")
    pg_ctl: Any = importlib.import_module("pgserver._commands").pg_ctl

    datadir = Path(tempfile.mkdtemp(prefix="sqla_jobs_reliability_pg_"))
    try:
        admin = testing.embedded_server(datadir)
        server = pgserver.get_server(str(datadir))

        def restart() -> None:
            pg_ctl(
                ["-w", "-m", "fast", "-l", str(server.log), "restart"],
                pgdata=server.pgdata,
                user=server.system_user,
                timeout=60,
            )

        yield admin, restart
        server.cleanup()
    finally:
        shutil.rmtree(datadir, ignore_errors=True)


def _fault_scenario(
    engine: sa.Engine, url: URL, log: Path, fault: Callable[[], None], listen_fault: bool = False
) -> dict[str, Any]:
    """Run JOBS jobs through WORKERS workers, inject ``fault`` midway, then prove recovery.

    Recovery means: the same worker processes are alive, every job is done exactly once,
    every worker LISTENs again, and jobs enqueued afterwards are picked up within
    NOTIFY_PICKUP seconds although the poll interval is 30 s.
    """
    setup_app(engine)
    with Session(engine) as s:
        enqueue_many(s, [NewJob("work", {"sleep": 0.03}) for _ in range(JOBS)])
        s.commit()
    procs = [spawn(url, log, *ARGS, *POLL) for _ in range(WORKERS)]
    pickups: list[float] = []
    try:
        wait_for(
            lambda: len(worker_backends(engine, listeners_only=True)) == WORKERS,
            message="listeners up",
        )
        listeners_before = worker_backends(engine, listeners_only=True)
        wait_for(
            lambda: status_counts(engine).get("done", 0) >= JOBS // 4,
            message="a quarter of the jobs done",
        )
        fault()
        wait_for(lambda: all_done(engine, JOBS), timeout=90, message="all jobs done")
        wait_for(
            lambda: len(worker_backends(engine, listeners_only=True)) == WORKERS,
            message="every worker listening again",
        )
        if listen_fault:
            assert not set(worker_backends(engine, listeners_only=True)) & set(listeners_before)
        for n in range(AFTER_FAULT):
            with Session(engine) as s:
                job_id = enqueue(s, "work", {})
                s.commit()
            started = time.monotonic()
            wait_for(
                lambda job_id=job_id: (  # type: ignore[misc]
                    scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id)
                    == "done"
                ),
                timeout=NOTIFY_PICKUP,
                message=f"job {n + 1} enqueued after the fault picked up by notification",
            )
            pickups.append(round(time.monotonic() - started, 3))
        assert [p.poll() for p in procs] == [None] * WORKERS, "a worker died"
    finally:
        stop_all(procs)
    print(f"pickups after the fault: {pickups} s")
    assert oracle(engine) == exactly_once(JOBS + AFTER_FAULT), log.read_text()[-3000:]
    return {"pickups": pickups}


def test_workers_survive_a_postgresql_restart_and_finish_every_job(
    private_server: tuple[URL, Callable[[], None]], tmp_path: Path
) -> None:
    admin, restart = private_server
    with testing.scratch_database(admin, migrate=True) as url:
        engine = sa.create_engine(url, poolclass=sa.NullPool)
        try:
            _fault_scenario(engine, url, tmp_path / "workers.log", restart)
        finally:
            engine.dispose()
    assert "listener connection lost" in (tmp_path / "workers.log").read_text()


def test_workers_survive_termination_of_every_backend(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    killed: list[int] = []

    def fault() -> None:
        killed.append(terminate(engine, worker_backends(engine)))

    _fault_scenario(engine, db_url, tmp_path / "workers.log", fault, listen_fault=True)
    assert killed[0] >= WORKERS * 2  # at least a listener and a dispatcher each


def test_a_terminated_listen_connection_comes_back_and_notifications_resume(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    def fault() -> None:
        assert terminate(engine, worker_backends(engine, listeners_only=True)) == WORKERS

    _fault_scenario(engine, db_url, tmp_path / "workers.log", fault, listen_fault=True)


#: Neither the poll nor the lease rescue wakes an idle worker within a minute, so a job
#: picked up within IDLE_PICKUP seconds was picked up because a notification woke it.
IDLE_ARGS = ("--poll-interval", "60", "--rescue-interval", "60")
IDLE_PICKUP = 10.0


def _picked_up_by_notification(engine: sa.Engine, what: str) -> float:
    with Session(engine) as s:
        job_id = enqueue(s, "work", {})
        s.commit()
    started = time.monotonic()
    wait_for(
        lambda: scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id) == "done",
        timeout=IDLE_PICKUP,
        message=f"{what} picked up by notification (poll and rescue intervals are 60 s)",
    )
    return round(time.monotonic() - started, 3)


def _idle_worker_fault(engine: sa.Engine, url: URL, log: Path, fault: Callable[[], None]) -> None:
    """An idle worker, a fault, then jobs that only a notification can deliver promptly."""
    setup_app(engine)
    proc = spawn(url, log, *IDLE_ARGS)
    try:
        wait_for(lambda: worker_backends(engine, listeners_only=True), message="listener up")
        before = set(worker_backends(engine, listeners_only=True))
        pickups = [_picked_up_by_notification(engine, "a job before the fault")]
        fault()
        wait_for(
            lambda: set(worker_backends(engine, listeners_only=True)) - before,
            message="a new LISTEN connection",
        )
        for n in range(AFTER_FAULT):
            pickups.append(_picked_up_by_notification(engine, f"job {n + 1} after the fault"))
        assert proc.poll() is None, "the worker died"
    finally:
        stop_all([proc])
    print(f"pickups before and after the fault: {pickups} s")
    assert oracle(engine) == exactly_once(1 + AFTER_FAULT), log.read_text()[-3000:]


def test_an_idle_workers_killed_listen_connection_comes_back_and_notifications_wake_it(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    def fault() -> None:
        assert terminate(engine, worker_backends(engine, listeners_only=True)) == 1

    _idle_worker_fault(engine, db_url, tmp_path / "worker.log", fault)


def test_an_idle_worker_whose_backends_were_all_killed_is_woken_by_notifications(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    def fault() -> None:
        assert terminate(engine, worker_backends(engine)) >= 2

    _idle_worker_fault(engine, db_url, tmp_path / "worker.log", fault)


def test_an_idle_worker_is_woken_by_notifications_after_a_postgresql_restart(
    private_server: tuple[URL, Callable[[], None]], tmp_path: Path
) -> None:
    admin, restart = private_server
    with testing.scratch_database(admin, migrate=True) as url:
        engine = sa.create_engine(url, poolclass=sa.NullPool)
        try:
            _idle_worker_fault(engine, url, tmp_path / "worker.log", restart)
        finally:
            engine.dispose()


def test_jobs_enqueued_while_the_listener_was_away_are_picked_up_when_it_is_back(
    engine: sa.Engine, db_url: URL, admin_url: URL, tmp_path: Path
) -> None:
    """Notifications sent while the listener is disconnected are lost: it must poll once
    it is back (poll and rescue intervals are 60 s, so nothing else would find the job)."""
    setup_app(engine)
    assert db_url.database
    log = tmp_path / "worker.log"
    proc = spawn(db_url, log, *IDLE_ARGS)
    try:
        wait_for(lambda: worker_backends(engine, listeners_only=True), message="listener up")
        _picked_up_by_notification(engine, "a job before the fault")
        # While the database refuses new connections, the listener cannot come back; the
        # test works through the one connection it already holds.
        admin = sa.create_engine(admin_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
        with engine.connect() as held, admin.connect() as server:
            conn = held.execution_options(isolation_level="AUTOCOMMIT")

            def listeners() -> list[int]:
                query = (
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = :app AND query LIKE 'LISTEN%'"
                )
                return [r[0] for r in conn.execute(sa.text(query), {"app": WORKER_APP})]

            server.exec_driver_sql(f'ALTER DATABASE "{db_url.database}" ALLOW_CONNECTIONS false')
            try:
                (listener,) = listeners()
                conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": listener})
                wait_for(lambda: not listeners(), message="listener gone")
                job_id = conn.execute(
                    sa.text("INSERT INTO jobs (kind, payload) VALUES ('work', '{}') RETURNING id")
                ).scalar_one()
                assert not listeners()
            finally:
                server.exec_driver_sql(f'ALTER DATABASE "{db_url.database}" ALLOW_CONNECTIONS true')
        wait_for(
            lambda: (
                scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id) == "done"
            ),
            timeout=IDLE_PICKUP,
            message="the job enqueued while the listener was away, once it is back",
        )
        _picked_up_by_notification(engine, "a job after the fault")
        assert proc.poll() is None, "the worker died"
    finally:
        stop_all([proc])
    assert oracle(engine) == exactly_once(3), log.read_text()[-3000:]


#: Jobs run on the handler's connection before and after the restart: past psycopg's
#: prepare_threshold (5), so the handler's own statement is prepared too, not only the
#: worker's done-mark (prepared on its first run).
PREPARED_JOBS = 8


def _run_prepared_jobs(engine: sa.Engine, n: int) -> list[dict[str, Any]]:
    with Session(engine) as s:
        ids = [enqueue(s, "prepared", {}) for _ in range(n)]
        s.commit()
    wait_for(
        lambda: (
            scalar(
                engine,
                "SELECT count(*) FROM jobs WHERE id = ANY(:ids) AND status = 'done'",
                ids=ids,
            )
            == n
        ),
        timeout=90,
        message=f"{n} jobs done",
    )
    found = rows(engine, "SELECT result FROM jobs WHERE id = ANY(:ids) ORDER BY id", ids=ids)
    return [r[0] for r in found]


def _done_mark(result: dict[str, Any]) -> bool:
    # lease.complete_one_before_commit: the done-mark in a CTE (WITH done AS (UPDATE ...)).
    return any("(UPDATE jobs SET status='done'" in s for s in result["statements"])


def _handler_select(result: dict[str, Any]) -> bool:
    return any("FROM pg_prepared_statements" in s for s in result["statements"])


def test_after_a_postgresql_restart_the_workers_statements_are_prepared_again_on_new_backends(
    private_server: tuple[URL, Callable[[], None]], tmp_path: Path
) -> None:
    """A restarted server has no prepared statement. The worker's connections are new
    ones, so psycopg prepares the claim and the done-mark again there; a connection that
    trusted its old statements would fail every claim or done-mark with "prepared
    statement ... does not exist" (26000), and no job after the restart would be done.
    The handler reads pg_prepared_statements on its own backend: the worker's done-mark
    of the previous job is there before the restart, and again on the new backend."""
    admin, restart = private_server
    log = tmp_path / "worker.log"
    with testing.scratch_database(admin, migrate=True) as url:
        engine = sa.create_engine(url, poolclass=sa.NullPool)
        proc = spawn(url, log, "--concurrency", "1")
        try:
            before = _run_prepared_jobs(engine, PREPARED_JOBS)
            restart()
            after = _run_prepared_jobs(engine, PREPARED_JOBS)
            # psycopg prepares a statement on a connection after it ran there a few times
            # (prepare_threshold); the handler's sessions may have been spread over two
            # new pooled connections, so more rounds until the newest backend has it.
            for _ in range(3):
                if _done_mark(after[-1]) and _handler_select(after[-1]):
                    break
                after += _run_prepared_jobs(engine, PREPARED_JOBS)
            assert proc.poll() is None, "the worker died"
        finally:
            stop_all([proc])
            engine.dispose()
    out = log.read_text()
    assert "does not exist" not in out, out[-3000:]
    old_backends = {r["pid"] for r in before}
    assert _done_mark(before[-1]) and _handler_select(before[-1]), before[-1]
    assert after[-1]["pid"] not in old_backends, (old_backends, after[-1])
    # The first job on the new backend saw nothing prepared there; the last one sees the
    # worker's done-mark and the handler's statement prepared again.
    first_on_new = next(r for r in after if r["pid"] == after[-1]["pid"])
    assert not _done_mark(first_on_new), first_on_new
    assert _done_mark(after[-1]) and _handler_select(after[-1]), after[-1]


#: More than the worker's socket send buffer can hold (Linux's tcp_wmem allows 4 MiB).
BIG_WRITE = 16 * 1024 * 1024
#: The scenario's tcp_user_timeout (ms), short to keep it quick; the default is 30 s.
USER_TIMEOUT_MS = 3000


def test_a_handler_connection_whose_peer_stops_acknowledging_is_given_up_by_tcp_user_timeout(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    """A proxy stops reading one handler connection mid-transaction, closing nothing: the
    handler's big statement fills both socket buffers and waits on a zero window, as it
    would on a peer that vanished with data in flight. ``tcp_user_timeout`` ends the
    connection (without it the send waits for the kernel's ~15 minutes), the job is given
    back without spending an attempt, and it is done on a new connection."""
    setup_app(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(GATED_SQL)
    proxy = Proxy(db_url.port or 5432, receive_buffer=4096)
    url = db_url.set(host="127.0.0.1", port=proxy.port).update_query_dict(
        {"tcp_user_timeout": str(USER_TIMEOUT_MS)}
    )
    log = tmp_path / "worker.log"
    with Session(engine) as s:
        job_id = enqueue(s, "big_write", {"bytes": BIG_WRITE})
        s.commit()
    proc = spawn(url, log, "--concurrency", "1")
    try:
        wait_for(
            lambda: scalar(engine, "SELECT count(*) FROM runs WHERE job_id = :j", j=job_id),
            message="the handler's first run waiting at its gate",
        )
        # The handler's session: inside its transaction, its last statement its SELECT 1
        # (a heartbeat's transaction may be open too, but never ran that).
        port = wait_for(
            lambda: scalar(
                engine,
                "SELECT client_port FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = :app AND state = 'idle in transaction' "
                "AND query = 'SELECT 1'",
                app=WORKER_APP,
            ),
            message="the handler's connection",
        )
        proxy.freeze_link(port)
        with engine.begin() as conn:
            conn.execute(
                sa.text("INSERT INTO gates (job_id, worker, attempt) VALUES (:j, '', 0)"),
                {"j": job_id},
            )
        frozen = time.monotonic()
        wait_for(
            lambda: (
                scalar(engine, "SELECT status::text FROM jobs WHERE id = :j", j=job_id) == "done"
            ),
            timeout=60,
            message="the job done on a new connection",
        )
        took = time.monotonic() - frozen
        assert proc.poll() is None, "the worker died"
    finally:
        stop_all([proc])
        proxy.close()
    out = log.read_text()
    print(f"\n[frozen handler link] job done {took:.1f}s after the freeze")
    assert "given back without spending an attempt" in out, out[-3000:]
    runs = rows(engine, "SELECT attempt FROM runs WHERE job_id = :j ORDER BY id", j=job_id)
    assert [r[0] for r in runs] == [1, 1], out[-3000:]
    assert scalar(engine, "SELECT attempts FROM jobs WHERE id = :j", j=job_id) == 1
    assert oracle(engine) == exactly_once(1)
