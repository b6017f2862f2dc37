"""Scenario: failover to a standby, a node turned read-only, a dead LISTEN socket.

Each test builds its own primary and streaming standby from the machine's PostgreSQL
binaries (``cluster.Cluster``), runs real worker processes (``relapp:registry``; the
``work`` handler writes its effect row in the job's transaction) and injects the fault:

* synchronous replication, primary stopped ``-m immediate`` and the standby promoted,
  workers on a multi-host URL (``target_session_attrs=read-write``) under steady
  enqueue: every committed job done exactly once, nothing left running, notifications
  back (poll interval 60 s);
* the primary turns read-only without closing a socket while the proxy sends new
  connections to the promoted standby: 25006 is a lost connection, not a failure;
* the proxy black-holes the LISTEN connection: the listener's probe notices, reconnects
  and claims at once;
* a worker started against a standby only waits, saying so once, and claims nothing.

The recovery times are printed (``-s``) and recorded in the README.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.cluster import Cluster, Proxy, cluster, have_binaries
from reliability.support import (
    exactly_once,
    oracle,
    setup_app,
    spawn,
    status_counts,
    stop_all,
)
from sqla_jobs import NewJob, enqueue, enqueue_many
from sqla_jobs.worker import _floors

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.skipif(not have_binaries(), reason="no PostgreSQL server binaries"),
]

#: Neither the poll nor the rescuer (it wakes the dispatcher only when it rescued a job)
#: picks a new job within a minute: a pickup within PICKUP seconds came by notification.
ARGS = (
    "--concurrency",
    "4",
    "--lock-seconds",
    "3",
    "--poll-interval",
    "60",
    "--rescue-interval",
    "1",
)
PICKUP = 15.0
WORKERS = 3


def _engine(url: URL) -> sa.Engine:
    return sa.create_engine(url, poolclass=sa.NullPool)


def _listeners(engine: sa.Engine) -> list[int]:
    query = (
        "SELECT client_port FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'sqla_jobs_worker' AND query LIKE 'LISTEN%'"
    )
    return [r[0] for r in rows(engine, query)]


def _done(engine: sa.Engine, job_id: int | None) -> bool:
    return bool(scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id) == "done")


def _after_the_full_claim() -> None:
    """Let the worker's last full claim pass: a floored claim that came back short
    after a job sets a timer for a claim from the start about FULL_CLAIM_SECONDS later
    (sqla_jobs.worker._floors), and a job enqueued before it would be found by that
    claim, not by a notification."""
    time.sleep(_floors.FULL_CLAIM_SECONDS * 2)


def _picked_by_notification(engine: sa.Engine, what: str) -> float:
    _after_the_full_claim()
    with Session(engine) as s:
        job_id = enqueue(s, "work", {})
        s.commit()
    started = time.monotonic()
    wait_for(
        lambda: _done(engine, job_id),
        timeout=PICKUP,
        message=f"{what} picked up by notification (poll interval 60 s)",
    )
    return round(time.monotonic() - started, 2)


class Producer:
    """Enqueues a ``work`` job every few milliseconds until stopped; remembers which
    commits returned (those jobs must exist, whatever happens to the primary)."""

    def __init__(self, url: URL) -> None:
        self.engine = sa.create_engine(url, poolclass=sa.NullPool)
        self.committed: list[int | None] = []
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                with Session(self.engine) as s:
                    job_id = enqueue(s, "work", {"sleep": 0.02})
                    s.commit()
                self.committed.append(job_id)
            except sa.exc.DBAPIError:
                self.failed += 1  # the primary is gone; libpq finds the next one
                self.stop.wait(0.2)
            self.stop.wait(0.01)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.engine.dispose()


@pytest.fixture
def sync_cluster() -> Iterator[Cluster]:
    with cluster(synchronous=True) as made:
        yield made


def test_failover_with_synchronous_replication_runs_every_committed_job_exactly_once(
    sync_cluster: Cluster, tmp_path: Path
) -> None:
    c = sync_cluster
    url = c.multi_host_url()
    engine = _engine(url)
    setup_app(engine)
    with Session(engine) as s:
        enqueue_many(s, [NewJob("work", {"sleep": 0.02}) for _ in range(200)])
        s.commit()
    log = tmp_path / "workers.log"
    procs = [spawn(url, log, *ARGS) for _ in range(WORKERS)]
    producer: Producer | None = None
    try:
        wait_for(lambda: len(_listeners(engine)) == WORKERS, message="every worker listening")
        producer = Producer(url)
        wait_for(lambda: status_counts(engine).get("done", 0) >= 100, message="work under way")
        running_before = status_counts(engine).get("running", 0)
        stopped = time.monotonic()
        c.primary.stop("immediate")
        c.promote()
        promoted = time.monotonic()
        new = _engine(c.standby.url(Cluster.DATABASE))
        wait_for(
            lambda: len(_listeners(new)) == WORKERS,
            timeout=60,
            message="every worker listening on the new primary",
        )
        listening = time.monotonic()
        committed_after = len(producer.committed)
        wait_for(
            lambda: len(producer.committed) > committed_after + 20,
            timeout=30,
            message="enqueue going on after the failover",
        )
        producer.close()
        wait_for(
            lambda: set(status_counts(new)) == {"done"},
            timeout=60,
            message="every job done, none left running",
        )
        everything_done = time.monotonic()
        pickups = [_picked_by_notification(new, f"job {n} after the failover") for n in (1, 2)]
        assert [p.poll() for p in procs] == [None] * WORKERS, "a worker died"
    finally:
        if producer is not None:
            producer.close()
        stop_all(procs)
    print(
        f"\n[failover sync] running at the stop: {running_before}; promotion took "
        f"{promoted - stopped:.2f}s; all workers listening on the new primary "
        f"{listening - stopped:.2f}s after the stop; every job done "
        f"{everything_done - stopped:.2f}s after; pickups by notification: {pickups} s; "
        f"enqueue attempts that failed during the failover: {producer.failed}"
    )
    total = scalar(new, "SELECT count(*) FROM jobs")
    found = {r[0] for r in rows(new, "SELECT id FROM jobs")}
    missing = set(producer.committed) - found
    assert not missing, f"{len(missing)} committed jobs lost under synchronous replication"
    assert oracle(new) == exactly_once(total), log.read_text()[-3000:]
    failed = rows(new, "SELECT id, attempts, last_error FROM jobs WHERE last_error IS NOT NULL")
    assert not failed, f"attempts recorded as failed because of the failover: {failed[:3]}"
    new.dispose()
    engine.dispose()


def test_an_idle_workers_listener_and_idle_flag_are_back_on_the_new_primary(
    sync_cluster: Cluster, tmp_path: Path
) -> None:
    """An idle worker holds the idle flag (a session advisory lock) when the primary
    dies: the lock is gone with it. Producers on the new primary notify only if the
    worker took the flag again there (poll interval 60 s)."""
    c = sync_cluster
    url = c.multi_host_url()
    engine = _engine(url)
    setup_app(engine)
    log = tmp_path / "worker.log"
    proc = spawn(url, log, *ARGS)
    try:
        wait_for(lambda: _listeners(engine), message="listener up")
        before = _picked_by_notification(engine, "a job before the failover")
        stopped = time.monotonic()
        c.primary.stop("immediate")
        c.promote()
        new = _engine(c.standby.url(Cluster.DATABASE))
        wait_for(lambda: _listeners(new), timeout=60, message="listening on the new primary")
        listening = time.monotonic() - stopped
        after = [_picked_by_notification(new, f"job {n} after the failover") for n in (1, 2)]
        assert proc.poll() is None, "the worker died"
    finally:
        stop_all([proc])
    print(
        f"\n[idle failover] pickups {before}s before; listening on the new primary "
        f"{listening:.2f}s after the stop; pickups after: {after} s"
    )
    assert oracle(new) == exactly_once(3)
    new.dispose()
    engine.dispose()


def test_failover_with_asynchronous_replication_and_lag_loses_commits_consistently(
    tmp_path: Path,
) -> None:
    """The standby stops receiving WAL (lag), the primary goes on taking claims, effects
    and enqueues, then dies: what the standby never got is lost, consistently. A job is
    never done without its effect nor an effect kept without done; a job whose done-mark
    was lost runs again on the new primary (at least once); nothing is left running."""
    with cluster(synchronous=False) as c:
        url = c.multi_host_url()
        engine = _engine(url)
        setup_app(engine)
        jobs = 300
        with Session(engine) as s:
            enqueue_many(s, [NewJob("work", {"sleep": 0.05}) for _ in range(jobs)])
            s.commit()
        log = tmp_path / "workers.log"
        procs = [spawn(url, log, *ARGS) for _ in range(WORKERS)]
        producer: Producer | None = None
        try:
            wait_for(lambda: len(_listeners(engine)) == WORKERS, message="listeners up")
            producer = Producer(url)
            wait_for(lambda: status_counts(engine).get("done", 0) >= 50, message="under way")
            # Lag: the standby stops receiving; the primary does not wait for it.
            c.standby.query("ALTER SYSTEM SET primary_conninfo = ''")
            c.standby.query("SELECT pg_reload_conf()")
            lag_from = scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'done'")
            wait_for(
                lambda: (
                    scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'done'")
                    >= lag_from + 40
                ),
                message="jobs done that the standby never receives",
            )
            done_on_old = {r[0] for r in rows(engine, "SELECT id FROM jobs WHERE status = 'done'")}
            stopped = time.monotonic()
            c.primary.stop("immediate")
            c.promote()
            new = _engine(c.standby.url(Cluster.DATABASE))
            # Read at once (the workers are still finding the new primary): what was done
            # on the old one and is not done here lost its done-mark with the lag.
            done_here = {r[0] for r in rows(new, "SELECT id FROM jobs WHERE status = 'done'")}
            lost_done = done_on_old - done_here
            wait_for(
                lambda: len(_listeners(new)) == WORKERS,
                timeout=60,
                message="every worker listening on the new primary",
            )
            listening = time.monotonic()
            producer.close()
            wait_for(
                lambda: set(status_counts(new)) == {"done"},
                timeout=60,
                message="every job on the new primary done, none left running",
            )
            finished = time.monotonic()
            assert [p.poll() for p in procs] == [None] * WORKERS, "a worker died"
        finally:
            if producer is not None:
                producer.close()
            stop_all(procs)
        total = scalar(new, "SELECT count(*) FROM jobs")
        present = {r[0] for r in rows(new, "SELECT id FROM jobs")}
        lost_enqueues = len(set(producer.committed) - present)
        print(
            f"\n[failover async] listening on the new primary {listening - stopped:.2f}s "
            f"after the stop; every job done {finished - stopped:.2f}s after; enqueues lost "
            f"with the old primary: {lost_enqueues}; done-marks lost, so run again: "
            f"{len(lost_done & present)}"
        )
        assert lost_done, "the lag lost no done-mark: the scenario did not test lost commits"
        figures = oracle(new)
        assert figures == exactly_once(total), (figures, log.read_text()[-3000:])
        new.dispose()
        engine.dispose()


def _caught_up(c: Cluster) -> bool:
    lsn = c.primary.query("SELECT pg_current_wal_lsn()::text")
    return bool(c.standby.query(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"))


def test_a_primary_turned_read_only_under_open_sockets_is_left_for_the_new_primary(
    tmp_path: Path,
) -> None:
    """The old node stays up and keeps every socket open, but refuses writes (25006),
    as Aurora does; the proxy sends new connections to the promoted standby."""
    with cluster(synchronous=True) as c:
        proxy = Proxy(c.primary.port)
        url = c.primary.url(Cluster.DATABASE).set(port=proxy.port)
        old = _engine(c.primary.url(Cluster.DATABASE))
        setup_app(old)
        jobs = 300
        with Session(old) as s:
            enqueue_many(s, [NewJob("work", {"sleep": 0.05}) for _ in range(jobs)])
            s.commit()
        log = tmp_path / "workers.log"
        procs = [spawn(url, log, *ARGS) for _ in range(2)]
        try:
            wait_for(lambda: len(_listeners(old)) == 2, message="listeners up")
            wait_for(lambda: status_counts(old).get("done", 0) >= 60, message="work under way")
            # The old node refuses writes from now on (its sockets stay open); the
            # synchronous standby has every commit it made.
            c.primary.query("ALTER SYSTEM SET default_transaction_read_only = on")
            c.primary.query("SELECT pg_reload_conf()")
            flipped = time.monotonic()
            # Transactions that wrote before the flip still commit, and a commit waits for
            # the synchronous standby: promoted first, it would never answer them (a
            # real failover stops the old primary, which ends those waits; see README).
            wait_for(
                lambda: (
                    not c.primary.query(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE backend_xid IS NOT NULL OR wait_event = 'SyncRep'",
                        Cluster.DATABASE,
                    )
                ),
                message="the old primary's writing transactions ended",
            )
            proxy.switch(c.standby.port)
            c.promote()
            new = _engine(c.standby.url(Cluster.DATABASE))
            wait_for(
                lambda: len(_listeners(new)) == 2,
                timeout=60,
                message="both listeners moved to the new primary",
            )
            moved = time.monotonic()
            wait_for(
                lambda: set(status_counts(new)) == {"done"},
                timeout=90,
                message="every job done on the new primary",
            )
            finished = time.monotonic()
            pickup = _picked_by_notification(new, "a job after the switch")
            assert [p.poll() for p in procs] == [None, None], "a worker died"
            assert not _listeners(old), "a listener stayed on the read-only node"
        finally:
            stop_all(procs)
            proxy.close()
        out = log.read_text()
        warnings = out.count("WARNING")
        print(
            f"\n[read-only node] listeners moved {moved - flipped:.2f}s after the flip; every "
            f"job done {finished - flipped:.2f}s after; pickup by notification {pickup}s; "
            f"{warnings} warning lines from 2 workers"
        )
        assert oracle(new) == exactly_once(jobs + 1), out[-3000:]
        assert scalar(new, "SELECT count(*) FROM jobs WHERE last_error IS NOT NULL") == 0, (
            "a read-only error was recorded as the job's failure"
        )
        # No log storm: a bounded number of lines per worker and window, then a summary.
        assert warnings < 200, out[-3000:]
        new.dispose()
        old.dispose()


def test_a_dead_listen_socket_is_noticed_by_the_probe_and_the_worker_claims_at_once(
    tmp_path: Path,
) -> None:
    """The proxy stops forwarding the LISTEN connection's bytes but closes nothing (a
    socket a failover or a network left open and dead). Notifications sent meanwhile are
    gone; the probe notices, the listener reconnects and the worker claims at once."""
    with cluster(synchronous=False) as c:
        proxy = Proxy(c.primary.port)
        url = c.primary.url(Cluster.DATABASE).set(port=proxy.port)
        engine = _engine(c.primary.url(Cluster.DATABASE))
        setup_app(engine)
        log = tmp_path / "worker.log"
        proc = spawn(url, log, *ARGS)
        try:
            wait_for(lambda: _listeners(engine), message="listener up")
            before = _picked_by_notification(engine, "a job before the fault")
            (port,) = _listeners(engine)
            _after_the_full_claim()  # the job below must wait for the probe, not a claim
            proxy.black_hole_link(port)
            with Session(engine) as s:
                job_id = enqueue(s, "work", {})
                s.commit()
            cut = time.monotonic()
            wait_for(
                lambda: _done(engine, job_id),
                timeout=PICKUP + 10,
                message="the job enqueued while the LISTEN socket was dead",
            )
            recovered = time.monotonic() - cut
            after = _picked_by_notification(engine, "a job after the new LISTEN")
            assert proc.poll() is None, "the worker died"
        finally:
            stop_all([proc])
            proxy.close()
        print(
            f"\n[dead LISTEN socket] pickups {before}s before; the job sent into the dead "
            f"socket done {recovered:.2f}s later; {after}s after"
        )
        assert "listener's probe" in log.read_text(), log.read_text()[-3000:]
        assert oracle(engine) == exactly_once(3)
        engine.dispose()


def test_a_worker_started_against_a_standby_only_waits_and_claims_nothing(
    tmp_path: Path,
) -> None:
    with cluster(synchronous=False) as c:
        primary = _engine(c.primary.url(Cluster.DATABASE))
        setup_app(primary)
        with Session(primary) as s:
            job_id = enqueue(s, "work", {})
            s.commit()
        wait_for(lambda: _caught_up(c), message="the standby caught up")
        # One worker on the standby's own URL (it connects; the writable check refuses
        # it), one on a multi-host URL naming only the standby (libpq refuses it).
        logs = [tmp_path / "single.log", tmp_path / "multi.log"]
        urls = [c.standby.url(Cluster.DATABASE), c.multi_host_url(c.standby)]
        procs = [spawn(url, log, *ARGS) for url, log in zip(urls, logs, strict=True)]
        try:
            for log in logs:
                wait_for(
                    lambda log=log: "waiting for a primary" in log.read_text(),  # type: ignore[misc]
                    timeout=30,
                    message=f"the worker of {log.name} says it waits for a primary",
                )
            assert scalar(primary, "SELECT attempts FROM jobs WHERE id = :i", i=job_id) == 0
            c.primary.stop("fast")
            c.promote()
            standby_wait = time.monotonic()
            promoted = _engine(c.standby.url(Cluster.DATABASE))
            wait_for(
                lambda: _done(promoted, job_id),
                timeout=30,
                message="the job done once the standby is a primary",
            )
            started_in = time.monotonic() - standby_wait
            assert [p.poll() for p in procs] == [None, None], "a waiting worker exited"
        finally:
            stop_all(procs)
        print(
            f"\n[standby only] a waiting worker ran the job {started_in:.2f}s after the promotion"
        )
        for log in logs:
            out = log.read_text()
            assert out.count("waiting for a primary") == 1, out
            assert "Traceback" not in out, out
        assert oracle(promoted) == exactly_once(1)
        promoted.dispose()
        primary.dispose()
