"""A Starlette app whose requests enqueue through an AsyncSession, and its async handler.

``POST /signups`` stores a signup and enqueues ``send_welcome`` in the same transaction
(``enqueue_async``: the job exists if and only if the signup does). The ``async def``
handler calls a mail provider over HTTP (``POST /mail``, served by this same app, so the
example needs nothing else) and records the provider's message id on the signup, in the
handler's transaction, which commits with the job's done-mark.

The HTTP call comes first, before the handler touches its session: while it waits, the
job holds no database connection. The provider is asked with an idempotency key derived
from the job's id, so a run repeated after a crash sends one mail, not two.

Run it (with ``pip install 'sqla-jobs[async-example]'``)::

    DATABASE_URL=postgresql://localhost/app python examples/async_app.py

which migrates, creates the example's tables and serves on :8000 with a worker inside
the app's process (``await worker.run_async()`` in the lifespan). In production run the
worker as its own process instead: ``python -m sqla_jobs.worker async_app:registry``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.ext.asyncio import create_async_engine as _create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from sqla_jobs import JobContext, Registry, Worker, WorkerConfig
from sqla_jobs.config import database_url

#: Where the app is served: the handler calls its /mail endpoint there.
BASE_URL = os.environ.get("EXAMPLE_BASE_URL", "http://127.0.0.1:8000")


class ExampleBase(DeclarativeBase):
    pass


class Signup(ExampleBase):
    __tablename__ = "example_signups"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    welcome_message_id: Mapped[str | None]
    welcomed_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


class Mail(ExampleBase):
    """What the pretend mail provider sent, one row per idempotency key."""

    __tablename__ = "example_mail"

    key: Mapped[str] = mapped_column(primary_key=True)
    recipient: Mapped[str]


registry = Registry()


@registry.handler("send_welcome", max_attempts=5)
async def send_welcome(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    async with httpx.AsyncClient(base_url=BASE_URL, timeout=10) as client:
        response = await client.post(
            "/mail", json={"to": payload["email"], "key": f"welcome-{job.id}"}
        )
        response.raise_for_status()  # a failed call raises: the job is retried later
    signup = await session.get(Signup, payload["signup_id"])
    if signup is not None:  # committed with the done-mark, in one transaction
        signup.welcome_message_id = response.json()["message_id"]
        signup.welcomed_at = sa.func.now()


_engine: AsyncEngine | None = None
_sessions: async_sessionmaker[AsyncSession] | None = None


def sessions() -> async_sessionmaker[AsyncSession]:
    global _engine, _sessions
    if _sessions is None:
        _engine = _create_async_engine(database_url(os.environ["DATABASE_URL"]))
        _sessions = async_sessionmaker(_engine, expire_on_commit=False)
    return _sessions


async def create_signup(request: Request) -> JSONResponse:
    body = await request.json()
    async with sessions()() as session:
        signup = Signup(email=str(body["email"]))
        session.add(signup)
        await session.flush()  # the signup's id, for the job
        await send_welcome.enqueue_async(session, {"signup_id": signup.id, "email": signup.email})
        await session.commit()  # the signup and its job, together
    return JSONResponse({"id": signup.id}, status_code=201)


async def show_signup(request: Request) -> JSONResponse:
    async with sessions()() as session:
        signup = await session.get(Signup, int(request.path_params["id"]))
    if signup is None:
        return JSONResponse({"error": "not found"}, status_code=404)
    return JSONResponse({"id": signup.id, "welcome_message_id": signup.welcome_message_id})


async def mail(request: Request) -> JSONResponse:
    """The pretend mail provider: sends once per idempotency key."""
    body = await request.json()
    async with sessions()() as session:
        await session.execute(
            insert(Mail).values(key=body["key"], recipient=body["to"]).on_conflict_do_nothing()
        )
        await session.commit()
    return JSONResponse({"message_id": f"msg-{body['key']}"})


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """With EXAMPLE_RUN_WORKER=1, a worker runs inside the app's process and loop."""
    worker_task = None
    if os.environ.get("EXAMPLE_RUN_WORKER") == "1":
        worker = Worker(
            registry,
            WorkerConfig(database_url=os.environ["DATABASE_URL"], async_concurrency=50),
        )
        worker_task = asyncio.create_task(worker.run_async())
    try:
        yield
    finally:
        if worker_task is not None:
            worker_task.cancel()  # a graceful drain; returns once the worker stopped
            with contextlib.suppress(asyncio.CancelledError):
                await worker_task
        if _engine is not None:
            await _engine.dispose()


app = Starlette(
    routes=[
        Route("/signups", create_signup, methods=["POST"]),
        Route("/signups/{id:int}", show_signup),
        Route("/mail", mail, methods=["POST"]),
    ],
    lifespan=lifespan,
)


def main() -> None:
    import uvicorn

    from sqla_jobs import testing

    url = database_url(os.environ["DATABASE_URL"])
    testing.migrate(url)  # an app runs sqla_jobs' migrations from its own Alembic set-up
    engine = sa.create_engine(url)
    ExampleBase.metadata.create_all(engine)
    engine.dispose()
    os.environ.setdefault("EXAMPLE_RUN_WORKER", "1")
    uvicorn.run(app, host="127.0.0.1", port=8000)


if __name__ == "__main__":
    main()
