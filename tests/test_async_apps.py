"""Async apps are first-class users: every function that takes a Session has an awaitable
twin for an AsyncSession, the wrong kind fails at once naming the right call, and a real
FastAPI app operates, tests and reads the queue with the twins alone."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import signupapp
import sqlalchemy as sa
from helpers import scalar
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sqla_jobs
from sqla_jobs import Job, JobContext, NewJob, Registry, RegistryError, ops, testing
from sqla_jobs.models import JobStatus

MODULES = (sqla_jobs, ops, testing)

#: Session-taking public functions without a twin, and why.
NO_TWIN = {
    # The worker's archiver iterates it between batches; archive_async sums it.
    "ops.archive_batches",
}


def _public_functions() -> Iterator[tuple[str, Callable[..., Any]]]:
    seen: set[int] = set()
    for module in MODULES:
        short = module.__name__.removeprefix("sqla_jobs").removeprefix(".")
        for name in dir(module):
            fn = getattr(module, name)
            if name.startswith("_") or not inspect.isfunction(fn) or id(fn) in seen:
                continue
            if not fn.__module__.startswith("sqla_jobs"):
                continue
            seen.add(id(fn))
            if "session" in inspect.signature(fn).parameters:
                yield (f"{short}.{name}" if short else name), fn


def _takes_a_session() -> dict[str, Callable[..., Any]]:
    return dict(_public_functions())


# Arguments after the session that get each call past argument checks to the session.
ARGS: dict[str, tuple[Any, ...]] = {
    "enqueue": ("welcome",),
    "enqueue_many": ([NewJob("welcome")],),
    "ops.get_job": (1,),
    "ops.archive": (ops.parse_duration("1d"),),
    "ops.prune": (ops.parse_duration("1d"),),
    "ops.archive_batches": (ops.parse_duration("1d"),),
    "ops.pause": ("mail",),
    "ops.resume": ("mail",),
    "ops.clear_limits": ("mail",),
    "ops.result": (1,),
    "ops.cancel": ([1],),
    "ops.cancel_jobs": ([1],),
    "testing.assert_enqueued": ("welcome",),
    "testing.refute_enqueued": ("welcome",),
}
KWARGS: dict[str, dict[str, Any]] = {"ops.set_limit": {"queue": "mail", "concurrency": 1}}


def _call(name: str, fn: Callable[..., Any], session: object) -> Any:
    base = name.removesuffix("_async")
    if base == "testing.run_inline":
        return fn(signupapp.registry, session)
    return fn(session, *ARGS.get(base, ()), **KWARGS.get(base, {}))


@pytest.fixture
def async_engine(db_url: URL) -> Iterator[AsyncEngine]:
    engine = create_async_engine(db_url)
    yield engine
    asyncio.run(engine.dispose())


def test_every_public_function_taking_a_session_has_an_async_twin() -> None:
    found = _takes_a_session()
    syncs = {name for name in found if not name.endswith("_async")}
    missing = sorted(n for n in syncs - NO_TWIN if f"{n}_async" not in found)
    assert not missing, f"no _async twin: {missing}"
    for name in syncs - NO_TWIN:
        assert inspect.iscoroutinefunction(found[f"{name}_async"]), name


@pytest.mark.parametrize("name", sorted(n for n in _takes_a_session() if not n.endswith("_async")))
def test_a_sync_function_given_an_async_session_fails_at_once_naming_its_twin(
    name: str, async_engine: AsyncEngine
) -> None:
    fn = _takes_a_session()[name]

    async def scenario() -> None:
        async with AsyncSession(async_engine) as session:
            with pytest.raises(TypeError) as caught:
                _call(name, fn, session)
            twin = "enqueue_many_async" if name == "enqueue_many" else f"{name}_async"
            assert twin in str(caught.value)
            assert "AsyncSession" in str(caught.value)
            assert not session.in_transaction()  # nothing ran: no coroutine left behind

    asyncio.run(scenario())


@pytest.mark.parametrize("name", sorted(n for n in _takes_a_session() if n.endswith("_async")))
def test_an_async_twin_given_a_session_fails_at_once_naming_the_sync_form(
    name: str, engine: sa.Engine
) -> None:
    fn = _takes_a_session()[name]
    with Session(engine) as session:
        with pytest.raises(TypeError) as caught:
            asyncio.run(_call(name, fn, session))
        sync = name.removesuffix("_async")
        assert f"{sync}(" in str(caught.value)
        assert not session.in_transaction()


# --- a real FastAPI app -------------------------------------------------------------------


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


@pytest.fixture
def signup_db(engine: sa.Engine) -> sa.Engine:
    with engine.begin() as conn:
        conn.exec_driver_sql(signupapp.SIGNUPS_DDL)
    return engine


def test_an_admin_endpoint_pauses_and_limits_the_queue_for_every_worker(
    signup_db: sa.Engine, async_engine: AsyncEngine
) -> None:
    async def scenario() -> None:
        async with _client(signupapp.create_app(async_engine)) as client:
            assert (await client.post("/admin/queues/mail/pause")).status_code == 200
            assert (await client.put("/admin/kinds/audit/limit?concurrency=2")).is_success
            listed = (await client.get("/admin/controls")).json()
            shown = (await client.get("/admin/stats")).json()
        assert {(c["scope"], c["name"]) for c in listed} == {("queue", "mail"), ("kind", "audit")}
        assert shown["paused_queues"] == ["mail"]

    asyncio.run(scenario())
    # Committed, and seen by another connection: the pause is real, not a coroutine
    # nobody awaited.
    with Session(signup_db) as session:
        state = {(c.scope, c.name): c for c in ops.controls(session)}
    assert state["queue", "mail"].paused
    assert state["kind", "audit"].concurrency == 2


def test_a_queue_paused_from_an_endpoint_is_not_worked_until_resumed(
    signup_db: sa.Engine, async_engine: AsyncEngine, db_url: URL
) -> None:
    app = signupapp.create_app(async_engine)

    async def call(method: str, path: str) -> Any:
        async with _client(app) as client:
            response = await client.request(method, path)
            assert response.is_success, response.text
            return response.json()

    asyncio.run(call("POST", "/admin/queues/mail/pause"))
    job_id = asyncio.run(call("POST", "/signup/ada"))["job_id"]
    with pytest.raises(
        RuntimeError, match=r"2 ready job\(s\) wait in a paused queue .*queue 'mail'"
    ):
        testing.drain(db_url, signupapp.registry, timeout=30)
    assert scalar(signup_db, "SELECT status::text FROM jobs WHERE id = :id", id=job_id) == "queued"

    asyncio.run(call("POST", "/admin/queues/mail/resume"))
    summary = testing.drain(db_url, signupapp.registry, timeout=30)
    assert summary.done == {"welcome": 1, "audit": 1}
    assert asyncio.run(call("GET", f"/jobs/{job_id}/result")) == {"result": "welcome sent to ada"}
    assert scalar(signup_db, "SELECT welcomed_by FROM signups WHERE name = 'ada'") == job_id


def test_result_and_job_actions_from_endpoints(
    signup_db: sa.Engine, async_engine: AsyncEngine
) -> None:
    async def scenario() -> None:
        async with _client(signupapp.create_app(async_engine)) as client:
            job_id = (await client.post("/signup/bob")).json()["job_id"]
            pending = await client.get(f"/jobs/{job_id}/result")
            assert pending.status_code == 409
            assert "queued" in pending.json()["detail"]
            assert (await client.get("/jobs/999999/result")).status_code == 404
            cancelled = (await client.post(f"/admin/jobs/{job_id}/cancel")).json()
            assert cancelled == {"cancelled": [job_id], "stopping": []}
            assert (await client.post(f"/admin/jobs/{job_id}/retry")).json() == {"retried": 1}
            queued = (await client.get("/admin/jobs?status=queued")).json()
            assert job_id in [j["id"] for j in queued]

    asyncio.run(scenario())


def test_a_dependency_override_lets_a_test_see_the_apps_uncommitted_jobs(
    signup_db: sa.Engine, async_engine: AsyncEngine
) -> None:
    """The pattern the async guide (docs/guides/async.md) shows: the test owns the session
    (and its transaction), the app's endpoint commits into a SAVEPOINT, and the test rolls
    everything back."""
    app = signupapp.create_app(async_engine)

    async def scenario() -> None:
        async with async_engine.connect() as conn:
            await conn.begin()
            session = AsyncSession(bind=conn, join_transaction_mode="create_savepoint")

            async def override() -> AsyncIterator[AsyncSession]:
                yield session

            app.dependency_overrides[signupapp.get_session] = override
            async with _client(app) as client:
                assert (await client.post("/signup/cy")).is_success
            job = await testing.assert_enqueued_async(session, "welcome", payload={"name": "cy"})
            assert job.queue == "mail"
            await testing.refute_enqueued_async(session, "welcome", payload={"name": "dee"})
            summary = await testing.run_inline_async(signupapp.registry, session)
            assert summary.done == {"welcome": 1, "audit": 1}
            assert await sqla_jobs.result_async(session, job.id) == "welcome sent to cy"
            await session.close()
            await conn.rollback()

    asyncio.run(scenario())
    assert scalar(signup_db, "SELECT count(*) FROM jobs") == 0


# --- run_inline with plain and async handlers ----------------------------------------------


def _mixed_registry() -> Registry:
    registry = Registry()

    @registry.handler("plain")
    def plain(session: Session, payload: dict[str, Any], job: JobContext) -> str:
        session.execute(sa.text("INSERT INTO ran (kind) VALUES ('plain')"))
        return "plain"

    @registry.handler("coro")
    async def coro(session: AsyncSession, payload: dict[str, Any]) -> str:
        await session.execute(sa.text("INSERT INTO ran (kind) VALUES ('coro')"))
        return "coro"

    return registry


@pytest.fixture
def ran_table(engine: sa.Engine) -> sa.Engine:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE ran (n serial PRIMARY KEY, kind text)")
    return engine


@pytest.mark.parametrize("order", [("plain", "coro"), ("coro", "plain")])
def test_run_inline_refuses_an_async_job_before_running_any_job(
    ran_table: sa.Engine, order: tuple[str, str]
) -> None:
    registry = _mixed_registry()
    with Session(ran_table) as session:
        for kind in order:
            sqla_jobs.enqueue(session, kind)
        with pytest.raises(RegistryError, match="run_inline_async"):
            testing.run_inline(registry, session)
        assert session.execute(sa.text("SELECT count(*) FROM ran")).scalar_one() == 0
        statuses = session.execute(sa.text("SELECT DISTINCT status::text FROM jobs")).scalars()
        assert list(statuses) == ["queued"]


@pytest.mark.parametrize("order", [("plain", "coro"), ("coro", "plain")])
def test_run_inline_async_runs_plain_and_async_handlers_in_the_callers_transaction(
    ran_table: sa.Engine, async_engine: AsyncEngine, order: tuple[str, str]
) -> None:
    registry = _mixed_registry()

    async def scenario() -> list[Any]:
        async with AsyncSession(async_engine) as session:
            ids = [await sqla_jobs.enqueue_async(session, kind) for kind in order]
            summary = await testing.run_inline_async(registry, session)
            assert summary.done == {"plain": 1, "coro": 1}
            ran = (await session.execute(sa.text("SELECT kind FROM ran ORDER BY n"))).scalars()
            assert list(ran) == list(order)
            results = [await sqla_jobs.result_async(session, i) for i in ids if i is not None]
            await session.rollback()  # run_inline commits nothing: all of it goes
            return results

    assert asyncio.run(scenario()) == list(order)
    assert scalar(ran_table, "SELECT count(*) FROM ran") == 0
    assert scalar(ran_table, "SELECT count(*) FROM jobs") == 0


def test_run_inline_async_refuses_an_async_handlers_commit(
    ran_table: sa.Engine, async_engine: AsyncEngine
) -> None:
    registry = Registry()

    @registry.handler("commits")
    async def commits(session: AsyncSession, payload: dict[str, Any]) -> None:
        await session.commit()

    async def scenario() -> None:
        async with AsyncSession(async_engine) as session:
            await sqla_jobs.enqueue_async(session, "commits")
            with pytest.raises(sqla_jobs.HandlerTransactionError):
                await testing.run_inline_async(registry, session)

    asyncio.run(scenario())
    assert scalar(ran_table, "SELECT count(*) FROM jobs") == 0


def test_stats_async_and_enqueued_jobs_async_on_an_async_connection(
    ran_table: sa.Engine, async_engine: AsyncEngine
) -> None:
    async def scenario() -> None:
        async with async_engine.connect() as conn:
            await sqla_jobs.enqueue_async(conn, "plain", {"n": 1})
            found = await testing.enqueued_jobs_async(conn, "plain")
            assert [j.payload for j in found] == [{"n": 1}]
            assert found[0].status is JobStatus.QUEUED
            await conn.commit()
        async with AsyncSession(async_engine) as session:
            snapshot = await sqla_jobs.stats_async(session)
            assert snapshot.total.ready == 1
            session.add(Job(kind="plain", payload={"n": 2}))
            assert len(await testing.enqueued_jobs_async(session, "plain")) == 2

    asyncio.run(scenario())


def test_enqueue_due_given_the_other_kind_of_engine_names_the_right_call(
    engine: sa.Engine, async_engine: AsyncEngine
) -> None:
    from sqla_jobs import periodic

    with pytest.raises(TypeError, match=r"await periodic\.enqueue_due_async"):
        periodic.enqueue_due(async_engine, signupapp.registry)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"use periodic\.enqueue_due\(\.\.\.\)"):
        asyncio.run(periodic.enqueue_due_async(engine, signupapp.registry))  # type: ignore[arg-type]


def test_the_operations_guide_lists_every_public_ops_function() -> None:
    guide = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    public = [
        name
        for name in dir(ops)
        if not name.startswith("_")
        and not name.endswith("_async")
        and inspect.isfunction(getattr(ops, name))
        and getattr(ops, name).__module__ == "sqla_jobs.ops"
    ]
    missing = [name for name in public if f"`ops.{name}(" not in guide]
    assert not missing, f"docs/operations.md 'The Python API' lacks {missing}"
