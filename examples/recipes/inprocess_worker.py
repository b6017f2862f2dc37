"""Recipe: a small worker inside the web process, for small deployments.

One process serves the requests and runs the jobs: the app's lifespan starts a
``Worker`` on the app's own event loop (``worker.run_async()`` as a task) and stops it at
shutdown (cancelling the task drains it: running jobs finish, up to
``shutdown_timeout``). ``async def`` handlers run on the worker's own event loop (thread
``sqla_jobs-asyncio``), plain ones on its threads: neither blocks the requests' loop,
but they share the process's CPU and GIL. Set ``RUN_JOBS_IN_WEB=0`` and run
``python -m sqla_jobs.worker inprocess_worker:registry`` instead when the app outgrows
it: nothing else changes, since the jobs are rows and any worker takes them::

    pip install 'sqla-jobs[async-example]'
    export DATABASE_URL=postgresql://localhost/app   # migrated: alembic upgrade heads
    uvicorn inprocess_worker:app                     # serves and works

What it costs, and when not to do it, is on the documentation's Recipes page ("A worker
inside the web process"). The project's tests run it under uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Request
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_jobs import JobContext, Registry, Worker, WorkerConfig
from sqla_jobs.config import database_url


class Base(DeclarativeBase):
    pass


class Ping(Base):
    __tablename__ = "recipe_inprocess_pings"

    id: Mapped[int] = mapped_column(primary_key=True)
    url: Mapped[str]
    checked_by_job: Mapped[int | None]
    checked_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


registry = Registry()


@registry.handler("check_url", max_attempts=3)
async def check_url(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    # Runs on the worker's own event loop, not the requests': a blocking call holds one
    # of the worker's async slots; CPU-heavy work still slows this process's requests.
    ping = await session.get(Ping, payload["ping_id"])
    if ping is not None and ping.checked_at is None:
        ping.checked_by_job = job.id
        ping.checked_at = sa.func.now()


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine = create_async_engine(database_url(os.environ["DATABASE_URL"]))
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    worker_task = None
    if os.environ.get("RUN_JOBS_IN_WEB", "1") == "1":
        # Small on purpose: the web requests share this process's CPU and connections.
        config = WorkerConfig(
            database_url=os.environ["DATABASE_URL"], concurrency=2, async_concurrency=10
        )
        worker_task = asyncio.create_task(Worker(registry, config).run_async())
    try:
        yield
    finally:
        if worker_task is not None:
            worker_task.cancel()  # a graceful drain; returns once the worker stopped
            with contextlib.suppress(asyncio.CancelledError):
                await worker_task
        await engine.dispose()


app = FastAPI(lifespan=lifespan)


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
    async with sessions() as session:
        yield session


Db = Annotated[AsyncSession, Depends(get_session)]


@app.post("/pings", status_code=201)
async def create_ping(url: str, session: Db) -> dict[str, int | None]:
    ping = Ping(url=url)
    session.add(ping)
    await session.flush()
    ping_id = ping.id
    job_id = await check_url.enqueue_async(session, {"ping_id": ping_id})
    await session.commit()  # the ping and its job, together
    return {"ping_id": ping_id, "job_id": job_id}


@app.get("/pings/{ping_id}")
async def show_ping(ping_id: int, session: Db) -> dict[str, Any]:
    ping = await session.get(Ping, ping_id)
    if ping is None:
        raise HTTPException(404, "no such ping")
    return {"id": ping.id, "checked_by_job": ping.checked_by_job}
