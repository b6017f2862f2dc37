"""Job control (#14) for ``async def`` handlers: Snooze, RetryIn, Discard, results, the
un-run-coroutine check, timeouts and cancelling a running job; in a worker running in
this process, against the real database (as tests/test_job_control.py for plain ones)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, setup_app_tables, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from test_worker import running

from sqla_jobs import (
    Backoff,
    Discard,
    JobContext,
    Registry,
    RegistryError,
    RetryIn,
    Snooze,
    enqueue,
    ops,
)

registry = Registry()
FAST = Backoff(base=0.05, cap=0.1)
#: Runs per job id (in-process worker: the test reads it).
RUNS: dict[int, int] = {}
#: Set by ``a_cancellable`` once it awaits inside the handler.
INSIDE = threading.Event()


async def _write_effect(session: AsyncSession, job: JobContext) -> None:
    RUNS[job.id] = RUNS.get(job.id, 0) + 1
    await session.execute(
        sa.text("INSERT INTO effects (job_id, worker, attempt) VALUES (:j, :w, :a)"),
        {"j": job.id, "w": job.worker, "a": job.attempt},
    )


@registry.handler("a_snooze")
async def a_snooze(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> str:
    await _write_effect(session, job)
    if RUNS[job.id] <= 2:
        raise Snooze(0.05, "not yet")
    return f"ran after {RUNS[job.id] - 1} snoozes"


@registry.handler("a_retry_in", backoff=FAST)
async def a_retry_in(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> int:
    await _write_effect(session, job)
    if job.attempt == 1:
        raise RetryIn(0.05, "partner busy")
    return job.attempt


@registry.handler("a_discard")
async def a_discard(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    await _write_effect(session, job)
    raise Discard("order 42 no longer exists")


@registry.handler("a_result")
async def a_result(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"pages": [f"page {n}" for n in range(payload["pages"])]}


@registry.handler("a_bad_result", max_attempts=1)
async def a_bad_result(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> object:
    await _write_effect(session, job)
    return object()


async def _never_awaited() -> None:
    await asyncio.sleep(0)


@registry.handler("a_returns_coroutine", max_attempts=1)
async def a_returns_coroutine(
    session: AsyncSession, payload: dict[str, Any]
) -> Coroutine[Any, Any, None]:
    return _never_awaited()  # forgot the await


@registry.handler("a_timeout", max_attempts=1, timeout=1)
async def a_timeout(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    await _write_effect(session, job)
    if payload.get("db"):
        await session.execute(sa.text("SELECT pg_sleep(3600)"))
    elif payload.get("swallow"):
        with contextlib.suppress(asyncio.CancelledError):  # swallowed: still a failure
            await asyncio.sleep(3600)
    else:
        await asyncio.sleep(3600)


@registry.handler("a_cancellable", max_attempts=3)
async def a_cancellable(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    await _write_effect(session, job)
    INSIDE.set()
    await asyncio.sleep(3600)


def _job(engine: sa.Engine, job_id: int) -> Any:
    return rows(
        engine,
        "SELECT status::text AS status, attempts, snoozes, last_error, result "
        "FROM jobs WHERE id = :id",
        id=job_id,
    )[0]


def _enqueue(engine: sa.Engine, kind: str, payload: dict[str, Any] | None = None) -> int:
    with Session(engine) as s:
        job_id = registry[kind].enqueue(s, payload or {})
        s.commit()
    assert job_id is not None
    return job_id


def _finished(engine: sa.Engine, job_id: int) -> bool:
    return bool(_job(engine, job_id).status in ("done", "dead", "cancelled"))


def _effects(engine: sa.Engine, job_id: int) -> int:
    return int(scalar(engine, "SELECT count(*) FROM effects WHERE job_id = :j", j=job_id))


def test_async_snooze_retry_in_and_discard_are_recorded_as_for_plain_handlers(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    snoozed = _enqueue(engine, "a_snooze")
    retried = _enqueue(engine, "a_retry_in")
    discarded = _enqueue(engine, "a_discard")
    with running(registry, db_url, poll_interval=0.1):
        wait_for(
            lambda: all(_finished(engine, j) for j in (snoozed, retried, discarded)),
            message="the three jobs finished",
        )
    row = _job(engine, snoozed)
    assert (row.status, row.attempts, row.snoozes) == ("done", 1, 2)
    assert row.result == "ran after 2 snoozes"
    assert "snooze 2 of at most 100" in row.last_error and "not yet" in row.last_error
    row = _job(engine, retried)
    assert (row.status, row.attempts, row.result) == ("done", 2, 2)
    assert "retry requested in 0.05s: partner busy" in row.last_error
    row = _job(engine, discarded)
    assert (row.status, row.attempts) == ("cancelled", 1)
    assert row.last_error == "discarded by its handler: order 42 no longer exists"
    # Each committed once at most: the snoozed and retried runs' writes were rolled back.
    assert (_effects(engine, snoozed), _effects(engine, retried)) == (1, 1)
    assert _effects(engine, discarded) == 0


def test_an_async_handlers_result_is_stored_and_one_that_cannot_be_fails(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    good = _enqueue(engine, "a_result", {"pages": 2})
    bad = _enqueue(engine, "a_bad_result")
    with running(registry, db_url):
        wait_for(lambda: _finished(engine, good) and _finished(engine, bad), message="both")
    with Session(engine) as s:
        assert ops.result(s, good) == {"pages": ["page 0", "page 1"]}
    row = _job(engine, bad)
    assert (row.status, row.result) == ("dead", None)
    assert "ResultError: the handler's return value is not JSON-serializable" in row.last_error
    assert _effects(engine, bad) == 0


def test_a_coroutine_returned_by_an_async_handler_fails_the_attempt(
    engine: sa.Engine, db_url: URL
) -> None:
    job_id = _enqueue(engine, "a_returns_coroutine")
    with running(registry, db_url):
        wait_for(lambda: _finished(engine, job_id), message="job finished")
    row = _job(engine, job_id)
    assert row.status == "dead"
    assert "the handler returned coroutine object instead of running" in row.last_error


@pytest.mark.parametrize(
    "payload",
    [{}, {"db": True}, {"swallow": True}],
    ids=["awaiting", "in_a_statement", "swallowing_the_cancel"],
)
def test_an_async_handler_past_its_timeout_is_cancelled_and_its_writes_rolled_back(
    engine: sa.Engine, db_url: URL, payload: dict[str, Any]
) -> None:
    setup_app_tables(engine)
    job_id = _enqueue(engine, "a_timeout", payload)
    with running(registry, db_url, timeout_grace=60):
        # Within the grace: stopped by the timeout itself, not given up on.
        wait_for(lambda: _finished(engine, job_id), timeout=30, message="job finished")
    row = _job(engine, job_id)
    assert (row.status, row.attempts) == ("dead", 1)
    assert "JobTimeout: the job ran past its timeout of 1s" in row.last_error
    assert "gave up" not in row.last_error
    assert _effects(engine, job_id) == 0


def test_a_lane_runs_its_next_jobs_normally_after_a_handler_swallowed_its_cancel(
    engine: sa.Engine, db_url: URL
) -> None:
    # One lane (async concurrency 1): the three jobs run on the same task in turn.
    setup_app_tables(engine)
    swallowed = _enqueue(engine, "a_timeout", {"swallow": True})
    timed_out = _enqueue(engine, "a_timeout")
    result = _enqueue(engine, "a_result", {"pages": 1})
    with running(registry, db_url, async_concurrency=1, timeout_grace=60):
        wait_for(
            lambda: all(_finished(engine, j) for j in (swallowed, timed_out, result)),
            timeout=30,
            message="the three jobs finished",
        )
    for job_id in (swallowed, timed_out):
        row = _job(engine, job_id)
        assert (row.status, row.attempts) == ("dead", 1)
        assert "JobTimeout: the job ran past its timeout of 1s" in row.last_error
    row = _job(engine, result)
    assert (row.status, row.result, row.last_error) == ("done", {"pages": ["page 0"]}, None)


def test_cancelling_a_running_async_job_cancels_its_task_and_never_retries(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    INSIDE.clear()
    job_id = _enqueue(engine, "a_cancellable")
    with running(registry, db_url, timeout_grace=60):
        assert INSIDE.wait(30)
        with Session(engine) as s:
            assert ops.cancel(s, [job_id]).stopping == (job_id,)
            s.commit()
        wait_for(lambda: _finished(engine, job_id), timeout=30, message="job cancelled")
    row = _job(engine, job_id)
    assert (row.status, row.attempts) == ("cancelled", 1)
    assert "JobCancelled: the job was cancelled by an operator while it was running" in (
        row.last_error
    )
    assert _effects(engine, job_id) == 0
    with Session(engine) as s:  # not retried: the same job enqueued again is not blocked
        assert enqueue(s, "a_result", {"pages": 0}) is not None
        s.commit()


def test_process_isolation_is_refused_for_an_async_handler() -> None:
    reg = Registry()

    async def handler(session: AsyncSession, payload: dict[str, Any]) -> None:
        pass

    with pytest.raises(RegistryError) as err:
        reg.handler("isolated_async", isolation="process")(handler)
    assert str(err.value) == (
        "handler 'isolated_async': isolation='process' is for plain def handlers; an async "
        "def handler runs on the worker's event loop (its timeout and cancel cancel its "
        "task): drop isolation='process' or write the handler as a plain def"
    )


ACTIVE = {"now": 0, "max": 0}


@registry.handler("a_limited", limit=2)
async def a_limited(session: AsyncSession, payload: dict[str, Any]) -> None:
    ACTIVE["now"] += 1  # one event loop: no lock needed
    ACTIVE["max"] = max(ACTIVE["max"], ACTIVE["now"])
    try:
        await asyncio.sleep(0.3)
    finally:
        ACTIVE["now"] -= 1


def test_a_concurrency_limit_holds_for_an_async_kind(engine: sa.Engine, db_url: URL) -> None:
    ACTIVE.update(now=0, max=0)
    ids = [_enqueue(engine, "a_limited") for _ in range(8)]
    with running(registry, db_url, poll_interval=0.1):
        wait_for(lambda: all(_finished(engine, j) for j in ids), message="8 limited jobs done")
    assert {_job(engine, j).status for j in ids} == {"done"}
    assert ACTIVE["max"] == 2  # reached, never passed (async concurrency is 100)
