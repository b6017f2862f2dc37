"""``async def`` handlers: same transaction, same guard, same outcomes as plain ones.

Real workers (in this process, on their own threads and event loop) against the real
database; the process-level scenarios (kills, fencing, a blocked loop) are in
tests/reliability/test_async_handlers.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import asyncapp
import pytest
import sqlalchemy as sa
from asyncapp import ROUTES
from asyncapp import registry as async_registry
from helpers import rows, scalar, setup_app_tables, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from test_worker import running, status_counts

from sqla_jobs import (
    NewJob,
    Registry,
    RegistryError,
    SchemaNotReadyError,
    Worker,
    WorkerConfig,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    testing,
)
from sqla_jobs.worker import Outcome, Phase, WorkerEvent
from sqla_jobs.worker._inflight import ASYNC_POOL, SYNC_POOL


def _enqueue(engine: sa.Engine, jobs: list[NewJob]) -> list[int]:
    with Session(engine) as s:
        ids = enqueue_many(s, jobs)
        s.commit()
    return sorted(ids)


def _effects(engine: sa.Engine) -> list[Any]:
    return rows(engine, "SELECT job_id, attempt FROM effects ORDER BY job_id")


def test_async_handler_writes_commit_with_the_done_mark(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)

    async def enqueue() -> list[int]:
        aengine = create_async_engine(db_url)
        try:
            async with AsyncSession(aengine) as s:
                ids = await enqueue_many_async(
                    s, [NewJob("aeffect", {"orm": i % 2 == 0}) for i in range(20)]
                )
                ids.append(await asyncapp.aeffect.enqueue_async(s, {"sleep": 0.01}) or 0)
                ids.append(await enqueue_async(s, "aeffect", {"orm": True}) or 0)
                ids.append(await async_registry.enqueue_async(s, "aeffect", {"orm": True}) or 0)
                await s.commit()
            return sorted(ids)
        finally:
            await aengine.dispose()

    ids = asyncio.run(enqueue())
    with running(async_registry, db_url, async_concurrency=8):
        wait_for(lambda: status_counts(engine) == {"done": 23}, message="23 done")
    assert _effects(engine) == [(i, 1) for i in ids]


def test_async_and_sync_failures_have_identical_outcomes_and_events(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    payload = {"fail_after_write": True}
    ids = _enqueue(
        engine,
        [NewJob("aeffect", payload, max_attempts=2), NewJob("effect", payload, max_attempts=2)],
    )
    events: list[WorkerEvent] = []
    with running(async_registry, db_url) as worker:
        worker.subscribe(events.append)
        wait_for(lambda: status_counts(engine) == {"dead": 2}, message="both dead")
    found = rows(engine, "SELECT kind, attempts, last_error FROM jobs ORDER BY id")
    assert [(kind, attempts) for kind, attempts, _ in found] == [("aeffect", 2), ("effect", 2)]
    for _, _, last_error in found:
        assert last_error.startswith("builtins.RuntimeError: failed after writing")
        assert "Traceback" in last_error
    assert _effects(engine) == []  # both runs of both jobs rolled back
    by_kind = {
        kind: [(e.outcome, e.attempt) for e in events if e.job_id == job_id]
        for kind, job_id in zip(("aeffect", "effect"), ids, strict=True)
    }
    assert by_kind["aeffect"] == by_kind["effect"] == [(Outcome.RETRY, 1), (Outcome.DEAD, 2)]
    assert all(e.error == "RuntimeError: failed after writing" for e in events)


def _finished(engine: sa.Engine, count: int) -> list[Any]:
    found = rows(
        engine,
        "SELECT id, status::text, attempts, last_error FROM jobs"
        " WHERE status::text IN ('done', 'dead') ORDER BY id",
    )
    return found if len(found) == count else []


def test_every_route_that_ends_the_async_handlers_transaction_is_refused_and_rolled_back(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    payloads = [{"route": r, "swallow": s} for r in ROUTES for s in (False, True)]
    ids = _enqueue(engine, [asyncapp.arefused.new(p) for p in payloads])
    jobs = dict(zip(ids, payloads, strict=True))
    with running(async_registry, db_url, async_concurrency=4):
        finished = wait_for(lambda: _finished(engine, len(jobs)), message="every job finished")
    for job_id, status, attempts, last_error in finished:
        assert (status, attempts) == ("dead", 1), (jobs[job_id], status)
        assert "sqla_jobs.exceptions.HandlerTransactionError" in last_error, jobs[job_id]
        assert jobs[job_id]["route"] in last_error, (jobs[job_id], last_error.splitlines()[0])
    assert _effects(engine) == []


def test_a_commit_below_sqlalchemy_in_an_async_handler_fails_the_attempt(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    (job_id,) = _enqueue(engine, [asyncapp.abelow_sqlalchemy.new()])
    with running(async_registry, db_url):
        ((_, status, _, last_error),) = wait_for(lambda: _finished(engine, 1))
    assert status == "dead"
    assert "the transaction was ended" in last_error
    # As for plain handlers: what the DBAPI committed cannot be taken back.
    assert _effects(engine) == [(job_id, 1)]


@pytest.mark.parametrize(
    ("which", "head"),
    [
        ("SystemExit", "builtins.SystemExit: 3"),
        ("KeyboardInterrupt", "builtins.KeyboardInterrupt"),
        ("BaseException", "builtins.BaseException: custom base"),
        ("CancelledError", "asyncio.exceptions.CancelledError: raised by the handler"),
    ],
)
def test_a_base_exception_raised_by_an_async_handler_is_a_failed_attempt_and_the_loop_goes_on(
    engine: sa.Engine, db_url: URL, which: str, head: str
) -> None:
    setup_app_tables(engine)
    bad, *good = _enqueue(
        engine, [asyncapp.araise_base.new({"which": which}), *[NewJob("aeffect") for _ in range(3)]]
    )
    with running(async_registry, db_url, async_concurrency=1):
        wait_for(lambda: status_counts(engine) == {"dead": 1, "done": 3}, message="outcomes")
    ((last_error,),) = rows(engine, "SELECT last_error FROM jobs WHERE id = :i", i=bad)
    assert last_error.startswith(head), last_error[:200]
    assert _effects(engine) == [(i, 1) for i in good]


def test_current_job_is_each_tasks_own_and_async_concurrency_is_the_limit(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    asyncapp.ACTIVE.update(now=0, max=0)
    ids = _enqueue(engine, [NewJob("concurrent", {"rounds": 5}) for _ in range(40)])
    with running(async_registry, db_url, async_concurrency=10):
        wait_for(lambda: status_counts(engine) == {"done": 40}, message="40 done")
    # Every task saw its own job after each await (the handler raises otherwise).
    assert _effects(engine) == [(i, 1) for i in ids]
    assert asyncapp.ACTIVE["max"] == 10


def test_an_async_handler_that_does_not_use_its_session_holds_no_connection(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    asyncapp.ACTIVE.update(now=0, max=0)
    _enqueue(engine, [NewJob("concurrent", {"rounds": 1, "sleep": 2, "write": False})] * 30)
    with running(async_registry, db_url, async_concurrency=30) as worker:
        wait_for(lambda: asyncapp.ACTIVE["now"] == 30, message="30 handlers waiting at once")
        executor = worker._async_executor
        assert executor is not None and executor.engine is not None
        pool = executor.engine.sync_engine.pool
        assert isinstance(pool, sa.QueuePool)
        assert pool.checkedout() == 0
        wait_for(lambda: status_counts(engine) == {"done": 30}, message="30 done")


def test_sync_and_async_handlers_share_a_worker_and_claim_only_their_own_slots(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    sync_ids = _enqueue(engine, [NewJob("effect", {"sleep": 0.3}) for _ in range(6)])
    async_ids = _enqueue(engine, [NewJob("concurrent", {"rounds": 2}) for _ in range(60)])
    most_running_sync = 0

    def async_done_while_watching_sync() -> bool:
        nonlocal most_running_sync
        running_sync = scalar(
            engine, "SELECT count(*) FROM jobs WHERE kind = 'effect' AND status = 'running'"
        )
        most_running_sync = max(most_running_sync, running_sync)
        return bool(
            scalar(
                engine,
                "SELECT count(*) = 60 FROM jobs WHERE kind = 'concurrent' AND status = 'done'",
            )
        )

    with running(async_registry, db_url, concurrency=1, async_concurrency=50):
        wait_for(async_done_while_watching_sync, interval=0.01, message="async jobs done")
        sync_left = scalar(
            engine, "SELECT count(*) FROM jobs WHERE kind = 'effect' AND status <> 'done'"
        )
        wait_for(lambda: status_counts(engine) == {"done": 66}, message="all done")
    # The async jobs did not wait for the one handler thread, and the loop's free slots
    # never claimed sync jobs: at most one of them was held (and run) at a time.
    assert sync_left > 0
    assert most_running_sync == 1
    assert _effects(engine) == sorted((i, 1) for i in sync_ids + async_ids)


def test_shutdown_cancels_async_handlers_past_the_timeout_and_leaves_jobs_to_their_leases(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    (job_id,) = _enqueue(
        engine, [NewJob("aeffect", {"sleep": 60, "first_only": True, "log": True})]
    )
    worker = Worker(
        async_registry,
        WorkerConfig(
            database_url=url_text(db_url), lock_seconds=1, shutdown_timeout=0.3, poll_interval=0.2
        ),
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM runs"), message="handler started")
    started = time.monotonic()
    worker.stop()
    thread.join(30)
    assert not thread.is_alive() and worker.lifecycle.phase is Phase.STOPPED
    assert time.monotonic() - started < 30  # it did not wait for the 60 s handler
    worker.engine.dispose()
    # Not done, not lost: still running under the stopped worker's lease, no writes.
    assert rows(engine, "SELECT status::text, attempts FROM jobs") == [("running", 1)]
    assert _effects(engine) == []
    with running(async_registry, db_url, rescue_interval=0.2):
        wait_for(lambda: status_counts(engine) == {"done": 1}, message="rescued and done")
    assert _effects(engine) == [(job_id, 2)]


def test_run_async_runs_a_worker_inside_the_applications_event_loop(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    worker = Worker(async_registry, WorkerConfig(database_url=url_text(db_url), poll_interval=0.2))

    async def app() -> list[int]:
        aengine = create_async_engine(db_url)
        task = asyncio.create_task(worker.run_async())
        try:
            async with AsyncSession(aengine) as s:
                ids = [await asyncapp.aeffect.enqueue_async(s) for _ in range(5)]
                await s.commit()
            deadline = time.monotonic() + 30
            async with aengine.connect() as conn:
                while (
                    await conn.scalar(sa.text("SELECT count(*) FROM jobs WHERE status = 'done'"))
                ) < 5:
                    assert time.monotonic() < deadline, "jobs not done"
                    await conn.rollback()  # a new snapshot for the next look
                    await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return sorted(i for i in ids if i is not None)
        finally:
            await aengine.dispose()

    ids = asyncio.run(app())
    assert worker.lifecycle.phase is Phase.STOPPED
    worker.engine.dispose()
    assert _effects(engine) == [(i, 1) for i in ids]


def test_drain_async_runs_async_and_sync_handlers_until_the_queue_is_empty(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    ids = _enqueue(engine, [NewJob("aeffect"), NewJob("effect"), NewJob("anoop")])
    asyncio.run(testing.drain_async(db_url, async_registry, timeout=30))
    assert status_counts(engine) == {"done": 3}
    assert [r[0] for r in _effects(engine)] == ids[:2]


def test_a_registry_of_only_async_handlers_starts_no_handler_threads(
    engine: sa.Engine, db_url: URL
) -> None:
    registry = Registry()
    registry.register("anoop", asyncapp.anoop.fn)
    _enqueue(engine, [NewJob("anoop") for _ in range(10)])
    with running(registry, db_url, concurrency=4) as worker:
        wait_for(lambda: status_counts(engine) == {"done": 10}, message="10 done")
        names = {t.name for t in threading.enumerate()}
        assert "sqla_jobs-asyncio" in names
        assert not any(n.startswith("sqla_jobs-job-") for n in names)
        assert worker._executor.threads == 0


def test_run_inline_refuses_an_async_handlers_job_before_touching_it(
    engine: sa.Engine, db_url: URL
) -> None:
    _enqueue(engine, [NewJob("anoop")])
    with (
        Session(engine) as s,
        pytest.raises(
            RegistryError,
            match=r"run_inline runs plain def handlers in your Session; 'anoop' is an async "
            r"def handler: with an AsyncSession, `await run_inline_async\(registry, "
            r"async_session\)` runs both kinds "
            r"\(or run it with drain\(\) / await drain_async\(\)\)",
        ),
    ):
        testing.run_inline(async_registry, s)
    assert rows(engine, "SELECT status::text, attempts FROM jobs") == [("queued", 0)]


def test_a_busy_pool_does_not_drag_empty_claims_for_the_idle_pool_along(
    engine: sa.Engine, db_url: URL
) -> None:
    """Only plain jobs queued, in a worker with both pools: the async pool's claim comes
    back empty once, then rests until the poll interval instead of following every claim
    of the busy thread pool."""
    _enqueue(engine, [NewJob("noop") for _ in range(5_000)])
    claims: dict[int, int] = {SYNC_POOL: 0, ASYNC_POOL: 0}
    started = time.monotonic()
    with running(async_registry, db_url, concurrency=2, listen=False, poll_interval=5.0) as worker:
        dispatcher = worker._dispatcher
        claim = dispatcher._claim

        def counted(pool: Any, limit: int) -> Any:
            claims[pool.number] += 1
            return claim(pool, limit)

        dispatcher._claim = counted  # type: ignore[method-assign]
        wait_for(lambda: status_counts(engine) == {"done": 5_000}, message="5,000 done")
        elapsed = time.monotonic() - started
    assert claims[SYNC_POOL] >= 5, claims  # 5,000 jobs in claims of at most 502
    assert claims[ASYNC_POOL] <= 2 + elapsed / 5.0, (claims, elapsed)


def test_run_async_raises_what_stopped_the_worker(empty_db_url: URL) -> None:
    worker = Worker(async_registry, WorkerConfig(database_url=url_text(empty_db_url)))
    try:
        with pytest.raises(SchemaNotReadyError, match="alembic upgrade head"):
            asyncio.run(worker.run_async())
    finally:
        worker.engine.dispose()
