"""``async def`` handlers (and two plain ones) for the tests; workers load ``asyncapp:registry``.

Same oracle as ``jobapp``: ``effects(job_id PRIMARY KEY)`` written in the handler's
transaction commits with the done-mark; ``runs`` is written on a separate autocommit
connection, so it survives rollbacks and crashes. Payload options of ``aeffect``:

* ``log``: write ``runs`` rows (start, end);
* ``sleep``: ``await asyncio.sleep`` this long before the write (on attempt 1 only when
  ``first_only`` is set);
* ``block``: ``time.sleep`` this long: blocks the whole event loop;
* ``orm``: write the effect with ``session.add`` (pending object, no statement);
* ``writes``: write the effect to ``writes`` (no unique key: a stale run's write would
  not fail; tests/reliability/support.py ``GATED_SQL``) instead of ``effects``;
* ``fail_after_write``: raise after writing;
* ``die_after_flush``: on attempt 1, SIGKILL the worker process after the flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from jobapp import effect as sync_effect
from jobapp import noop as sync_noop
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_jobs import Backoff, HandlerTransactionError, JobContext, Registry, current_job

registry = Registry()
FAST = Backoff(base=0.05, cap=0.2)


class _Base(DeclarativeBase):
    pass


class Effect(_Base):
    __tablename__ = "effects"
    job_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    worker: Mapped[str]
    attempt: Mapped[int]


#: In-process tests read these: how many ``concurrent`` handlers run now, and the most.
ACTIVE = {"now": 0, "max": 0}


def _bind(session: AsyncSession) -> AsyncEngine:
    bind = session.bind
    assert isinstance(bind, AsyncEngine)
    return bind


async def _autocommit(session: AsyncSession, sql: str, **params: Any) -> Any:
    async with _bind(session).connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        result = await conn.execute(sa.text(sql), params)
        return result.scalar() if result.returns_rows else None


async def _effect(session: AsyncSession, job: JobContext) -> None:
    await session.execute(
        sa.text("INSERT INTO effects (job_id, worker, attempt) VALUES (:j, :w, :a)"),
        {"j": job.id, "w": job.worker, "a": job.attempt},
    )


@registry.handler("aeffect", backoff=FAST)
async def aeffect(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    run_id = None
    if payload.get("log"):
        run_id = await _autocommit(
            session,
            "INSERT INTO runs (job_id, worker, attempt) VALUES (:j, :w, :a) RETURNING id",
            j=job.id,
            w=job.worker,
            a=job.attempt,
        )
    if payload.get("sleep") and (job.attempt == 1 or not payload.get("first_only")):
        await asyncio.sleep(float(payload["sleep"]))
    if payload.get("block"):
        time.sleep(float(payload["block"]))
    if payload.get("orm"):
        session.add(Effect(job_id=job.id, worker=job.worker, attempt=job.attempt))
    elif payload.get("writes"):
        await session.execute(
            sa.text("INSERT INTO writes (job_id, worker, attempt) VALUES (:j, :w, :a)"),
            {"j": job.id, "w": job.worker, "a": job.attempt},
        )
    else:
        await _effect(session, job)
    if payload.get("fail_after_write"):
        raise RuntimeError("failed after writing")
    if payload.get("die_after_flush") and job.attempt == 1:
        await session.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if run_id is not None:
        await _autocommit(
            session, "UPDATE runs SET ended_at = clock_timestamp() WHERE id = :r", r=run_id
        )


#: The timeout of ``alate_statement`` (as controlapp's ``late_statement``).
LATE_TIMEOUT = 3.0


@registry.handler("alate_statement", timeout=LATE_TIMEOUT, max_attempts=1)
async def alate_statement(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    """Writes (its transaction begins with statement_timeout = the whole timeout), works
    (``asyncio.sleep``) ``payload["before"]`` seconds, then waits in the database; logs in
    ``runs`` its start and when that statement was stopped."""
    await _autocommit(
        session,
        "INSERT INTO runs (job_id, worker, attempt) VALUES (:j, :w, :a)",
        j=job.id,
        w=job.worker,
        a=job.attempt,
    )
    await _effect(session, job)
    await asyncio.sleep(float(payload["before"]))
    try:
        await session.execute(sa.text("SELECT pg_sleep(3600)"))
    finally:
        await _autocommit(
            session,
            "UPDATE runs SET ended_at = clock_timestamp() WHERE job_id = :j AND attempt = :a",
            j=job.id,
            a=job.attempt,
        )


@registry.handler("anoop")
async def anoop(session: AsyncSession, payload: dict[str, Any]) -> None:
    pass


@registry.handler("afail", max_attempts=3, backoff=FAST)
async def afail(session: AsyncSession, payload: dict[str, Any]) -> None:
    await asyncio.sleep(0)
    raise ValueError(f"async boom {payload.get('n', '')}".strip())


@registry.handler("concurrent")
async def concurrent(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    """Counts the handlers running at once; checks current_job() across awaits."""
    ACTIVE["now"] += 1
    ACTIVE["max"] = max(ACTIVE["max"], ACTIVE["now"])
    try:
        for _ in range(int(payload.get("rounds", 5))):
            await asyncio.sleep(float(payload.get("sleep", 0.02)))
            if current_job() != job:  # another task's job would show here if it leaked
                raise AssertionError(f"current_job() is {current_job().id}, not {job.id}")
        if payload.get("write", True):
            await _effect(session, current_job())
    finally:
        ACTIVE["now"] -= 1


@registry.handler("akill_self")
async def akill_self(session: AsyncSession, payload: dict[str, Any]) -> None:
    """A poison job: takes its whole worker process down."""
    os.kill(os.getpid(), signal.SIGKILL)


async def _begin_block(session: AsyncSession) -> None:
    async with session.begin():
        pass
    raise RuntimeError("after the block")


async def _connection_begin(session: AsyncSession) -> None:
    async with (await session.connection()).begin():
        pass


async def _autocommit_route(session: AsyncSession) -> None:
    await (await session.connection()).execution_options(isolation_level="AUTOCOMMIT")


async def _commit_in_run_sync(session: AsyncSession) -> None:
    await session.run_sync(lambda s: s.get_transaction().commit())  # type: ignore[union-attr]


async def _exec(session: AsyncSession, sql: str) -> None:
    await session.execute(sa.text(sql))


#: route -> what the handler does after writing its effect; the route's name is what
#: last_error must quote.
ROUTES: dict[str, Callable[[AsyncSession], Awaitable[Any]]] = {
    "session.commit()": lambda s: s.commit(),
    "session.close()": lambda s: s.close(),
    "session.begin()": _begin_block,
    "session.reset()": lambda s: s.reset(),
    "session.invalidate()": lambda s: s.invalidate(),
    "connection.commit()": lambda s: _on_connection(s, "commit"),
    "connection.rollback()": lambda s: _on_connection(s, "rollback"),
    "connection.begin()": _connection_begin,
    "connection.close()": lambda s: _on_connection(s, "close"),
    "connection.invalidate()": lambda s: _on_connection(s, "invalidate"),
    "AUTOCOMMIT": _autocommit_route,
    "a commit of the job's transaction": _commit_in_run_sync,
    "SQL COMMIT": lambda s: _exec(s, "COMMIT"),
    "SQL ROLLBACK": lambda s: _exec(s, "ROLLBACK"),
    "SQL BEGIN": lambda s: _exec(s, "BEGIN"),
}


async def _on_connection(session: AsyncSession, method: str) -> None:
    conn = await session.connection()
    await getattr(conn, method)()


@registry.handler("arefused", max_attempts=1)
async def arefused(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    await _effect(session, job)
    route = ROUTES[payload["route"]]
    if payload.get("swallow"):
        with contextlib.suppress(HandlerTransactionError):
            await route(session)
    else:
        await route(session)


@registry.handler("abelow_sqlalchemy", max_attempts=1)
async def abelow_sqlalchemy(
    session: AsyncSession, payload: dict[str, Any], job: JobContext
) -> None:
    await _effect(session, job)
    raw = await (await session.connection()).get_raw_connection()
    await raw.driver_connection.commit()  # type: ignore[union-attr]


@registry.handler("araise_base", max_attempts=1)
async def araise_base(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    await _effect(session, job)
    await session.flush()
    exc: BaseException = {
        "SystemExit": SystemExit(3),
        "KeyboardInterrupt": KeyboardInterrupt(),
        "BaseException": BaseException("custom base"),
        "CancelledError": asyncio.CancelledError("raised by the handler"),
    }[payload["which"]]
    raise exc


@registry.handler("asql_error", max_attempts=1)
async def asql_error(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    await _effect(session, job)
    await session.execute(sa.text("SELECT 1/0"))


@registry.handler("aswitch_interval")
async def aswitch_interval(session: AsyncSession, payload: dict[str, Any]) -> float:
    return sys.getswitchinterval()  # the worker process's GIL switch interval


# Plain def handlers in the same registry: each kind runs on its own executor.
registry.register("effect", sync_effect.fn)
registry.register("noop", sync_noop.fn)
