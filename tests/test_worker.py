"""The worker, in process: claim order and filters, transactional completion, retries."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, running_jobs, scalar, setup_app_tables, url_text, wait_for
from jobapp import registry as app_registry
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import (
    Backoff,
    JobContext,
    NewJob,
    Registry,
    SchemaNotReadyError,
    Worker,
    WorkerConfig,
    enqueue,
    enqueue_many,
)
from sqla_jobs.sql import lease
from sqla_jobs.worker import Phase


@contextmanager
def running(registry: Registry, url: URL, **options: Any) -> Iterator[Worker]:
    options.setdefault("poll_interval", 0.2)
    options.setdefault("lock_seconds", 5)
    worker = Worker(registry, WorkerConfig(database_url=url_text(url), **options))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive()
        worker.engine.dispose()


def status_counts(engine: sa.Engine) -> dict[str, int]:
    return dict(rows(engine, "SELECT status::text, count(*) FROM jobs GROUP BY 1"))


def test_handler_writes_commit_with_the_done_mark(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        ids = enqueue_many(s, [NewJob("effect", {}) for _ in range(20)])
        s.commit()
    with running(app_registry, db_url, concurrency=4):
        wait_for(lambda: status_counts(engine) == {"done": 20}, message="20 done")
    assert sorted(r[0] for r in rows(engine, "SELECT job_id FROM effects")) == sorted(ids)


class FixedBackoff(Backoff):
    """A retry exactly 60 s later: far enough that the test sees the job waiting."""

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        return 60.0


def test_failed_handler_rolls_back_its_writes_and_schedules_a_retry(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    registry = Registry()

    @registry.handler("write_then_fail", backoff=FixedBackoff())
    def write_then_fail(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        session.execute(
            sa.text("INSERT INTO effects (job_id, worker, attempt) VALUES (:j, 'w', 1)"),
            {"j": job.id},
        )
        session.flush()
        raise RuntimeError("failed after writing")

    with Session(engine) as s:
        job_id = write_then_fail.enqueue(s, {})
        s.commit()
    with running(registry, db_url):
        wait_for(lambda: scalar(engine, "SELECT last_error IS NOT NULL FROM jobs"))
    assert rows(engine, "SELECT status::text, attempts FROM jobs") == [("queued", 1)]
    assert scalar(engine, "SELECT count(*) FROM effects") == 0
    error = scalar(engine, "SELECT last_error FROM jobs WHERE id = :i", i=job_id)
    assert error.startswith("builtins.RuntimeError: failed after writing")
    assert "Traceback" in error
    delay = scalar(engine, "SELECT extract(epoch FROM run_at - now()) FROM jobs")
    assert 50 < delay <= 60.0  # run_at = the database's now() at the failure + 60 s


def test_job_goes_dead_at_max_attempts_and_is_kept(engine: sa.Engine, db_url: URL) -> None:
    registry = Registry()

    @registry.handler("fail", max_attempts=3, backoff=Backoff(base=0.01, cap=0.01))
    def fail(session: Session, payload: dict[str, Any]) -> None:
        raise ValueError("boom")

    with Session(engine) as s:
        fail.enqueue(s, {})
        s.commit()
    with running(registry, db_url):
        wait_for(lambda: status_counts(engine) == {"dead": 1}, message="dead")
    row = rows(engine, "SELECT attempts, finished_at IS NOT NULL, last_error FROM jobs")[0]
    assert row[0] == 3 and row[1] is True and "ValueError: boom" in row[2]
    # No retry is coming: run_at stays that of the last attempt, not after finished_at.
    assert scalar(engine, "SELECT run_at <= finished_at FROM jobs") is True


def test_log_outcomes_logs_done_jobs_at_info(
    engine: sa.Engine, db_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sqla_jobs.worker")
    with Session(engine) as s:
        first = enqueue(s, "noop", {})
        s.commit()
    with running(app_registry, db_url):
        wait_for(lambda: status_counts(engine) == {"done": 1}, message="done")
    assert not [r for r in caplog.records if "done in" in r.getMessage()]
    with Session(engine) as s:
        second = enqueue(s, "noop", {})
        s.commit()
    with running(app_registry, db_url, log_outcomes=True):
        wait_for(lambda: status_counts(engine) == {"done": 2}, message="done")
    (done,) = [r for r in caplog.records if "done in" in r.getMessage()]
    assert done.levelno == logging.INFO
    assert (done.__dict__["job_id"], done.__dict__["outcome"]) == (second, "done")
    assert first != second


def test_claim_order_is_priority_then_run_at(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        for label, priority in [("p5", 5), ("p0-late", 0), ("p9", 9)]:
            enqueue(s, "order_log", {"label": label}, priority=priority)
        s.execute(
            sa.text(
                "UPDATE jobs SET run_at = now() - interval '1 hour' WHERE payload->>'label' = 'p5'"
            )
        )
        enqueue(s, "order_log", {"label": "p0-early"}, priority=0)
        s.execute(
            sa.text(
                "UPDATE jobs SET run_at = now() - interval '1 minute' "
                "WHERE payload->>'label' = 'p0-early'"
            )
        )
        s.commit()
    with running(app_registry, db_url, concurrency=1):
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM effects") == 4)
    order = [
        r[0]
        for r in rows(
            engine,
            "SELECT e.worker FROM effects e JOIN jobs j ON j.id = e.job_id ORDER BY j.finished_at",
        )
    ]
    assert order == ["p0-early", "p0-late", "p5", "p9"]


def _ordering_registry(flavour: str, gate: threading.Event, started: list[str]) -> Registry:
    """``block`` holds the one handler slot until ``gate``; ``record`` notes its label."""
    registry = Registry()
    if flavour == "def":

        def block(session: Session, payload: dict[str, Any]) -> None:
            gate.wait(30)

        def record(session: Session, payload: dict[str, Any]) -> None:
            started.append(payload["label"])

        registry.register("block", block)
        registry.register("record", record)
    else:

        async def block_async(session: Any, payload: dict[str, Any]) -> None:
            await asyncio.to_thread(gate.wait, 30)

        async def record_async(session: Any, payload: dict[str, Any]) -> None:
            started.append(payload["label"])

        registry.register("block", block_async)
        registry.register("record", record_async)
    return registry


@pytest.mark.parametrize("flavour", ["def", "async def"])
def test_a_more_urgent_job_claimed_later_starts_before_the_buffered_ones(
    engine: sa.Engine, db_url: URL, flavour: str
) -> None:
    gate, started = threading.Event(), list[str]()
    registry = _ordering_registry(flavour, gate, started)

    def put(labels: list[str], priority: int) -> None:
        with Session(engine) as s:
            enqueue_many(s, [NewJob("record", {"label": x}, priority=priority) for x in labels])
            s.commit()

    with running(registry, db_url, concurrency=1, async_concurrency=1, prefetch=20):
        put(["warm"] * 5, 0)  # the worker learns its handlers' pace, so it buffers
        wait_for(lambda: len(started) == 5, message="the warm-up jobs")
        with Session(engine) as s:
            enqueue(s, "block", {})
            s.commit()
        wait_for(lambda: running_jobs(engine) == 1, message="the one slot taken")
        put([f"low{i}" for i in range(10)], 9)
        wait_for(lambda: running_jobs(engine) == 11, message="the low-priority jobs buffered")
        put([f"high{i}" for i in range(3)], 0)  # a later claim, more urgent
        wait_for(lambda: running_jobs(engine) == 14, message="the urgent jobs buffered behind them")
        gate.set()
        wait_for(lambda: len(started) == 18, message="every job run")
    assert started[5:] == [f"high{i}" for i in range(3)] + [f"low{i}" for i in range(10)]


def test_a_claim_alone_commits_without_waiting_for_its_wal_flush(engine: sa.Engine) -> None:
    with Session(engine) as s:
        enqueue_many(s, [NewJob("effect", {}) for _ in range(20)])
        s.commit()
    claim = lease.claim(
        worker="w:1", lock_seconds=30, queues=["default"], kinds=["effect"], limit=1
    )
    behind = sa.text("SELECT pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()")
    unflushed = 0
    with (
        engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
        engine.connect().execution_options(isolation_level="AUTOCOMMIT") as probe,
    ):
        for _ in range(20):
            assert len(conn.execute(claim).all()) == 1
            unflushed += bool(probe.execute(behind).scalar())
    # A synchronous commit returns once its WAL is flushed (none would be behind); the
    # WAL writer flushes asynchronous ones every wal_writer_delay (200 ms).
    assert unflushed >= 15


def test_claim_takes_only_registered_kinds_and_own_queues(engine: sa.Engine) -> None:
    with Session(engine) as s:
        enqueue(s, "known", {}, queue="a")
        enqueue(s, "known", {}, queue="b")
        enqueue(s, "unknown", {}, queue="a")
        enqueue(s, "known", {}, queue="a", delay=3600)
        s.commit()
    with engine.begin() as conn:
        got = conn.execute(
            lease.claim(worker="w", lock_seconds=30, queues=["a"], kinds=["known"], limit=10)
        ).all()
    assert [(r.kind, r.queue, r.attempts) for r in got] == [("known", "a", 1)]
    assert status_counts(engine) == {"running": 1, "queued": 3}


def test_concurrent_claims_never_hand_out_a_job_twice(engine: sa.Engine) -> None:
    with Session(engine) as s:
        enqueue_many(s, [NewJob("k", {}) for _ in range(500)])
        s.commit()
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        while True:
            with engine.begin() as conn:
                got = (
                    conn.execute(
                        lease.claim(
                            worker=f"w{n}",
                            lock_seconds=30,
                            queues=["default"],
                            kinds=["k"],
                            limit=7,
                        )
                    )
                    .scalars()
                    .all()
                )
            if not got:
                return
            with lock:
                claimed.extend(got)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == 500 == len(set(claimed))


def test_completion_of_a_lost_claim_updates_nothing(engine: sa.Engine) -> None:
    with Session(engine) as s:
        job_id = enqueue(s, "k", {})
        s.commit()
    with engine.begin() as conn:
        conn.execute(
            lease.claim(worker="old", lock_seconds=30, queues=["default"], kinds=["k"], limit=1)
        )
        # The lease expires and another worker takes the job over.
        conn.execute(sa.text("UPDATE jobs SET locked_until = now() - interval '1 s'"))
        conn.execute(lease.rescue_expired())
        conn.execute(
            lease.claim(worker="new", lock_seconds=30, queues=["default"], kinds=["k"], limit=1)
        )
    assert job_id is not None
    with engine.begin() as conn:
        stale = [
            lease.complete(worker="old", leases=[(job_id, 1)]),
            lease.heartbeat(worker="old", leases=[(job_id, 1)], lock_seconds=30),
            lease.record_failure(
                worker="old", job_id=job_id, attempt=1, delay_seconds=0, error="x"
            ),
            lease.release(worker="old", leases=[(job_id, 1)]),
            lease.complete(worker="new", leases=[(job_id, 1)]),  # right worker, old attempt
        ]
        assert [conn.execute(s).all() for s in stale] == [[], [], [], [], []]
        one = [
            lease.complete_one(worker="old", job_id=job_id, attempt=1),
            lease.complete_one(worker="new", job_id=job_id, attempt=1),
        ]
        assert [conn.execute(s).rowcount for s in one] == [0, 0]
        assert conn.execute(lease.complete(worker="new", leases=[(job_id, 2)])).all()


def test_a_done_mark_sent_with_its_commit_commits_nothing_when_the_claim_was_lost(
    engine: sa.Engine,
) -> None:
    """A handler's writes, its done-mark and the COMMIT go in one round trip
    (lease.complete_one_before_commit): the done-mark's row count comes back only after
    the COMMIT ran, so a lost claim must stop that commit by itself."""
    from sqla_jobs.worker import _db

    with Session(engine) as s:
        job_id = enqueue(s, "k", {})
        s.commit()
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE handler_writes (worker text NOT NULL)")
        conn.execute(
            lease.claim(worker="old", lock_seconds=30, queues=["default"], kinds=["k"], limit=1)
        )
        # The lease expires and another worker takes the job over (attempt 2).
        conn.execute(sa.text("UPDATE jobs SET locked_until = now() - interval '1 s'"))
        conn.execute(lease.rescue_expired())
        conn.execute(
            lease.claim(worker="new", lock_seconds=30, queues=["default"], kinds=["k"], limit=1)
        )
    assert job_id is not None

    def write_and_mark_done(worker: str, attempt: int) -> bool:
        stmt = lease.complete_one_before_commit(worker=worker, job_id=job_id, attempt=attempt)
        sql, params = _db.compile_statement(engine, stmt)
        with engine.connect() as conn:
            conn.execute(sa.text("INSERT INTO handler_writes VALUES (:w)"), {"w": worker})
            return _db.commit_with(conn, sql, params, prepare=True, lost_text=lease.CLAIM_LOST)

    assert write_and_mark_done("old", 1) is False  # the stale worker
    assert write_and_mark_done("new", 1) is False  # the right worker, an old attempt
    assert rows(engine, "SELECT worker FROM handler_writes") == []
    assert scalar(engine, "SELECT status::text FROM jobs") == "running"
    assert write_and_mark_done("new", 2) is True
    assert rows(engine, "SELECT worker FROM handler_writes") == [("new",)]
    assert rows(engine, "SELECT status::text, worker, attempts FROM jobs") == [("done", "new", 2)]


def test_fenced_statements_probe_the_primary_key_even_with_stale_statistics(
    engine: sa.Engine,
) -> None:
    # The statistics a queue usually has: analyzed while every job was queued, so the
    # running-jobs index looks empty. Then 2,000 jobs are claimed by one worker.
    with Session(engine) as s:
        enqueue_many(s, [NewJob("k", {}) for _ in range(2_000)])
        s.commit()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE jobs")
    with engine.begin() as conn:
        claim = lease.claim(
            worker="w", lock_seconds=30, queues=["default"], kinds=["k"], limit=2_000
        )
        job_id = conn.execute(claim).scalars().first()
    assert job_id is not None
    fenced = {
        "complete_one": lease.complete_one(worker="w", job_id=job_id, attempt=1),
        "complete": lease.complete(worker="w", leases=[(job_id, 1)]),
        "retry": lease.record_failure(
            worker="w", job_id=job_id, attempt=1, delay_seconds=1, error="x"
        ),
        "heartbeat": lease.heartbeat(worker="w", leases=[(job_id, 1)], lock_seconds=30),
        "release": lease.release(worker="w", leases=[(job_id, 1)]),
    }
    with engine.connect() as conn:
        for name, stmt in fenced.items():
            compiled = stmt.compile(dialect=conn.dialect)
            for mode in ("force_custom_plan", "force_generic_plan"):
                # generic: what a prepared statement runs after its fifth execution
                conn.exec_driver_sql(f"SET plan_cache_mode = {mode}")
                plan = "\n".join(
                    conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params).scalars()
                )
                # Reading the running jobs of jobs_status_id_idx end to end would visit
                # all 2,000 of them.
                assert "jobs_pkey" in plan and "jobs_status_id_idx" not in plan, (name, mode, plan)
        conn.rollback()


def test_handler_can_read_its_own_job(engine: sa.Engine, db_url: URL) -> None:
    seen: list[JobContext] = []
    registry = Registry()

    @registry.handler("introspect")
    def introspect(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        seen.append(job)

    with Session(engine) as s:
        job_id = introspect.enqueue(s, {})
        s.commit()
    with running(registry, db_url):
        wait_for(lambda: seen)
    assert (seen[0].id, seen[0].kind, seen[0].attempt, seen[0].max_attempts) == (
        job_id,
        "introspect",
        1,
        8,
    )


@pytest.mark.parametrize("what", ["commit", "commit_swallowed", "close", "invalidate", "sql_error"])
def test_misbehaving_handler_is_a_failure_with_no_partial_writes(
    engine: sa.Engine, db_url: URL, what: str
) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        enqueue(s, "misbehave", {"what": what}, max_attempts=1)
        enqueue(s, "noop", {})
        s.commit()
    with running(app_registry, db_url):
        wait_for(lambda: status_counts(engine) == {"dead": 1, "done": 1}, message="outcomes")
    assert scalar(engine, "SELECT count(*) FROM effects") == 0


@pytest.mark.parametrize("which", ["SystemExit", "KeyboardInterrupt", "BaseException"])
def test_base_exceptions_from_handlers_do_not_kill_the_worker(
    engine: sa.Engine, db_url: URL, which: str
) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        enqueue(s, "raise_base", {"which": which}, max_attempts=1)
        s.commit()
    with running(app_registry, db_url) as worker:
        wait_for(lambda: status_counts(engine) == {"dead": 1})
        with Session(engine) as s:
            enqueue(s, "noop", {})
            s.commit()
        wait_for(lambda: status_counts(engine) == {"dead": 1, "done": 1})
        assert worker.lifecycle.phase is Phase.RUNNING
    assert scalar(engine, "SELECT count(*) FROM effects") == 0


def test_worker_refuses_an_unmigrated_database(empty_db_url: URL) -> None:
    worker = Worker(app_registry, WorkerConfig(database_url=url_text(empty_db_url)))
    with pytest.raises(SchemaNotReadyError, match="alembic upgrade head"):
        worker.check_schema()
    worker.engine.dispose()


def test_handler_threads_are_connected_before_the_worker_reports_started(db_url: URL) -> None:
    worker = Worker(app_registry, WorkerConfig(database_url=url_text(db_url), concurrency=3))
    checked_out_at_start: list[int] = []

    class AtStarted(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if " started: " in record.getMessage():
                checked_out_at_start.append(worker.engine.pool.checkedout())  # type: ignore[attr-defined]

    handler = AtStarted()
    logger = logging.getLogger("sqla_jobs")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        thread.start()
        wait_for(lambda: checked_out_at_start, message="the started line")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        worker.stop()
        thread.join(30)
        worker.engine.dispose()
    # One connection per handler thread, held from before the first job arrives.
    assert checked_out_at_start[0] >= 3


def test_backoff_is_full_jitter_under_a_capped_exponential_ceiling() -> None:
    import random

    backoff = Backoff()
    rng = random.Random(7)
    assert [backoff.ceiling(n) for n in range(1, 11)] == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    for attempt in (1, 3, 9, 500):
        samples = [backoff.delay(attempt, rng) for _ in range(2000)]
        assert min(samples) >= 0 and max(samples) <= backoff.ceiling(attempt)
        # Uniform below the ceiling: the mean sits near half of it.
        assert abs(sum(samples) / len(samples) - backoff.ceiling(attempt) / 2) < (
            backoff.ceiling(attempt) * 0.05
        )


def test_objects_only_added_to_the_session_are_flushed_and_committed(
    engine: sa.Engine, db_url: URL
) -> None:
    from sqla_jobs import Job

    registry = Registry()

    @registry.handler("spawn")
    def spawn(session: Session, payload: dict[str, Any]) -> None:
        session.add(Job(kind="child", payload={"from": "spawn"}))  # no query, no flush

    with Session(engine) as s:
        spawn.enqueue(s, {})
        s.commit()
    with running(registry, db_url):
        wait_for(lambda: status_counts(engine) == {"done": 1, "queued": 1})
    assert scalar(engine, "SELECT payload->>'from' FROM jobs WHERE kind = 'child'") == "spawn"


def test_jobs_on_one_handler_thread_share_a_connection_but_no_session_state(
    engine: sa.Engine, db_url: URL
) -> None:
    from sqla_jobs import Job

    seen: list[dict[str, Any]] = []
    registry = Registry()

    @registry.handler("probe")
    def probe(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        if payload.get("serializable"):  # first, as SQLAlchemy requires
            session.connection(execution_options={"isolation_level": "SERIALIZABLE"})
        seen.append(
            {
                "bind_is_engine": isinstance(session.get_bind(), sa.Engine),
                "identity_map": len(session.identity_map),
                "info": dict(session.info),
                "isolation": session.execute(sa.text("SHOW transaction_isolation")).scalar(),
                "pid": session.execute(sa.text("SELECT pg_backend_pid()")).scalar(),
            }
        )
        session.get(Job, job.id)  # loaded into this job's identity map
        session.info["left"] = "behind"
        if payload.get("fail"):
            raise RuntimeError("fails after touching its session")

    with Session(engine) as s:
        for payload in ({}, {"fail": True}, {}, {"serializable": True}, {}, {}):
            probe.enqueue(s, payload, max_attempts=1)
        s.commit()
    with running(registry, db_url, concurrency=1):
        wait_for(lambda: len(seen) == 6, message="six probes")
        wait_for(lambda: status_counts(engine) == {"done": 5, "dead": 1}, message="outcomes")
    assert all(p["bind_is_engine"] for p in seen)
    assert [(p["identity_map"], p["info"]) for p in seen] == [(0, {})] * 6
    # The isolation level set by the fourth job applied to it and did not outlive it.
    assert [p["isolation"] for p in seen] == ["read committed"] * 3 + ["serializable"] + [
        "read committed"
    ] * 2
    # One connection, kept from job to job; given up after the job that changed its
    # isolation level (the pool resets it).
    pids = [p["pid"] for p in seen]
    assert pids[0] == pids[1] == pids[2] == pids[3]
    assert pids[4] == pids[5]


@pytest.mark.parametrize("what", ["invalidate", "sql_error", "commit", "close"])
def test_a_broken_handler_connection_does_not_poison_the_next_job_on_its_thread(
    engine: sa.Engine, db_url: URL, what: str
) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        enqueue(s, "effect", {})
        enqueue(s, "misbehave", {"what": what}, max_attempts=1)
        after = [enqueue(s, "effect", {}) for _ in range(3)]
        s.commit()
    with running(app_registry, db_url, concurrency=1):
        wait_for(lambda: status_counts(engine) == {"dead": 1, "done": 4}, message="outcomes")
    effects = {r[0] for r in rows(engine, "SELECT job_id FROM effects")}
    assert len(effects) == 4 and set(after) <= effects


def test_the_shutdown_warning_names_only_the_jobs_still_running_when_it_is_logged(
    engine: sa.Engine, db_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    """The count used to be taken when the timeout passed: a job that finished during
    the rest of the drain (done-mark written, logged done) was still listed as running."""
    caplog.set_level(logging.INFO, logger="sqla_jobs.worker")
    setup_app_tables(engine)
    registry = Registry()
    release_late, release_stuck, release_async = (
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    async_cancelled = threading.Event()

    @registry.handler("late")
    def late(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        release_late.wait(60)
        session.execute(
            sa.text("INSERT INTO effects (job_id, worker, attempt) VALUES (:j, :w, :a)"),
            {"j": job.id, "w": job.worker, "a": job.attempt},
        )

    @registry.handler("stuck")
    def stuck(session: Session, payload: dict[str, Any]) -> None:
        release_stuck.wait(60)

    @registry.handler("clings")
    async def clings(session: Any, payload: dict[str, Any]) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            # Cancelled at the timeout, after the drain counted what it holds: the drain
            # now waits for this task, and meanwhile `late` finishes.
            async_cancelled.set()
            await asyncio.to_thread(release_async.wait, 60)
            raise

    with Session(engine) as s:
        late_id, stuck_id, _ = enqueue_many(
            s, [NewJob("late", {}), NewJob("stuck", {}), NewJob("clings", {})]
        )
        s.commit()
    worker = Worker(
        registry,
        WorkerConfig(
            database_url=url_text(db_url), concurrency=2, shutdown_timeout=0.2, poll_interval=0.2
        ),
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: worker.ledger.running() == 3, message="three handlers running")
        worker.stop()
        wait_for(async_cancelled.is_set, message="the async handler cancelled at the timeout")
        release_late.set()
        wait_for(
            lambda: (
                scalar(engine, "SELECT status::text FROM jobs WHERE id = :j", j=late_id) == "done"
            ),
            message="the late job done",
        )
        release_async.set()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        release_late.set()
        release_async.set()
        release_stuck.set()
        # The stuck handler's thread outlived the drain; it ends (and closes its
        # connection) once released.
        for handler_thread in threading.enumerate():
            if handler_thread.name.startswith("sqla_jobs-job-"):
                handler_thread.join(30)
        worker.engine.dispose()
    (warning,) = [r.getMessage() for r in caplog.records if "shutdown timeout:" in r.getMessage()]
    assert warning.startswith(f"shutdown timeout: 1 job(s) still running ({stuck_id} stuck); ")
