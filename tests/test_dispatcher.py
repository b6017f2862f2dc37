"""The dispatcher alone (a real ledger and database, no handlers): when it claims with
less room than half its buffer. Jobs it claims stay in its buffer until the test takes
them, so the room for a claim is exactly what the test frees."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from helpers import running_jobs, scalar, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import NewJob, WorkerConfig, enqueue_many
from sqla_jobs.control import Control
from sqla_jobs.worker._async_executor import LoopBuffer
from sqla_jobs.worker._buffer import ThreadBuffer
from sqla_jobs.worker._dispatcher import Dispatcher, Pool
from sqla_jobs.worker._inflight import ASYNC_POOL, SYNC_POOL, Inflight

#: With a handler pace of 1 ms per job, the buffer holds PREFETCH jobs (50 ms of work
#: would be 50) beyond the one slot, and a claim waits for half of them to be free.
PREFETCH = 20


@contextmanager
def dispatching(
    engine: sa.Engine,
    db_url: URL,
    pool_number: int = SYNC_POOL,
    slots: int = 1,
    prefetch: int = PREFETCH,
) -> Iterator[tuple[Dispatcher, Inflight]]:
    """The dispatcher of one pool of ``slots``: the handler threads' (``SYNC_POOL``) or the
    event loop's (``ASYNC_POOL``, with its own buffer, but no loop to hand jobs out)."""
    config = WorkerConfig(
        database_url=url_text(db_url), concurrency=slots, prefetch=prefetch, poll_interval=0.2
    )
    buffer = ThreadBuffer()
    holder: list[Dispatcher] = []
    ledger = Inflight(on_room=lambda: holder[0].room_freed())
    pool_buffer = buffer if pool_number == SYNC_POOL else LoopBuffer()
    pool = Pool(pool_number, ("k",), slots, pool_buffer, job_seconds=0.001)
    dispatcher = Dispatcher(engine, config, ["k"], ledger, buffer, [pool])
    holder.append(dispatcher)
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield dispatcher, ledger
    finally:
        stop.set()
        dispatcher.wake()
        thread.join(10)
        assert not thread.is_alive()


@contextmanager
def busy(
    engine: sa.Engine, db_url: URL, pool_number: int = SYNC_POOL
) -> Iterator[tuple[Dispatcher, Inflight]]:
    """A dispatcher whose first claim filled its slot and buffer and came back full:
    busy (no notifications), and a claim waits for half the buffer to be free. 19 jobs
    of the buffered priority (9) wait in the table."""
    _enqueue(engine, 40, priority=9)
    with dispatching(engine, db_url, pool_number) as (dispatcher, ledger):
        wait_for(lambda: running_jobs(engine) == PREFETCH + 1, message="the first claim")
        yield dispatcher, ledger


def _enqueue(engine: sa.Engine, count: int, priority: int) -> None:
    with Session(engine) as s:
        enqueue_many(s, [NewJob("k", {}, priority=priority) for _ in range(count)])
        s.commit()


def _urgent_claimed(engine: sa.Engine) -> bool:
    return bool(scalar(engine, "SELECT status = 'running' FROM jobs WHERE priority = 0"))


def _finish(dispatcher: Dispatcher, ledger: Inflight, count: int) -> None:
    """Take ``count`` jobs out of the buffer as if their handlers had run them."""
    buffer = dispatcher.pools[0].buffer
    for _ in range(count):
        job = buffer.get_nowait()
        assert job is not None
        ledger.remove([job])


def test_a_busy_dispatcher_fills_freed_room_before_half_its_buffer_is_free(
    engine: sa.Engine, db_url: URL
) -> None:
    with busy(engine, db_url) as (dispatcher, ledger):
        _finish(dispatcher, ledger, 3)  # room for 3 only, of the same priority
        wait_for(lambda: running_jobs(engine) == PREFETCH + 4, timeout=5, message="a busy look")


def test_a_wake_up_claims_whatever_room_there_is(engine: sa.Engine, db_url: URL) -> None:
    _enqueue(engine, 5, priority=9)
    with dispatching(engine, db_url) as (dispatcher, _ledger):
        wait_for(lambda: running_jobs(engine) == 5, message="the first claim")
        _enqueue(engine, 14, priority=9)
        dispatcher.wake()  # as a notification would
        # Both claims came back short (idle, no busy look), and left room for 2 only.
        wait_for(lambda: running_jobs(engine) == 19, message="the second claim")
        _enqueue(engine, 1, priority=0)
        dispatcher.wake()
        wait_for(lambda: _urgent_claimed(engine), timeout=5, message="a claim on the wake-up")


@pytest.mark.parametrize("pool_number", [SYNC_POOL, ASYNC_POOL], ids=["threads", "event loop"])
def test_a_busy_dispatcher_claims_past_a_full_buffer_only_jobs_more_urgent_than_it_holds(
    engine: sa.Engine, db_url: URL, pool_number: int
) -> None:
    with busy(engine, db_url, pool_number) as (dispatcher, _ledger):
        # No slot is freed: the buffer stays full. One more urgent job arrives.
        _enqueue(engine, 1, priority=5)
        wait_for(lambda: running_jobs(engine) == PREFETCH + 2, timeout=5, message="a busy look")
        assert scalar(engine, "SELECT status::text FROM jobs WHERE priority = 5") == "running"
        time.sleep(0.2)  # ten more looks: none claims a job as urgent as the buffered ones
        assert running_jobs(engine) == PREFETCH + 2
        first = dispatcher.pools[0].buffer.get_nowait()
        assert first is not None and first.priority == 5


def test_slots_held_by_long_jobs_do_not_size_the_buffer_at_the_fast_jobs_pace(
    engine: sa.Engine, db_url: URL
) -> None:
    """At a worker's start its pace is the first job that ended, a fast one (1 ms here),
    while slow jobs hold 3 of its 4 slots: the buffer holds what the one free slot runs
    in 50 ms, not what four such slots would (there, fast jobs waited 25 s behind a slow
    one taken from a buffer four times too large)."""
    _enqueue(engine, 300, priority=9)
    with dispatching(engine, db_url, slots=4, prefetch=500) as (dispatcher, ledger):
        pool = dispatcher.pools[0]
        # Before any job runs: 4 slots at 1 ms a job take 200 jobs in 50 ms.
        wait_for(lambda: running_jobs(engine) == 4 + 200, message="the first claim")
        for _ in range(3):  # three jobs, started 25 s ago, still run
            job = pool.buffer.get_nowait()
            assert job is not None and ledger.start(job)
            ledger.watch(job, Control(None, started=time.monotonic() - 25))
        # One slot at 1 ms a job and three at one job in 25 s or more: 50 jobs.
        wait_for(lambda: pool.capacity <= 4 + 50, timeout=5, message="the buffer sized again")
        _finish(dispatcher, ledger, 201)  # the buffered jobs ran: room for a claim
        wait_for(lambda: ledger.taken() > 3, timeout=5, message="the next claim")
        assert ledger.taken() <= 4 + 50
