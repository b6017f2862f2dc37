"""A FastAPI + AsyncSession app, as an async user writes one: signups enqueue jobs, and
admin endpoints operate the queue through the ``_async`` forms of ``sqla_jobs.ops``.

``create_app(engine)`` builds it over an AsyncEngine; tests override ``get_session`` (the
dependency every endpoint takes) or call it as it is. Handlers: ``welcome`` (async def,
writes ``signups`` in the job's transaction and returns a value), ``audit`` (plain def).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Request
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

import sqla_jobs
from sqla_jobs import JobContext, Registry, ops

registry = Registry()

SIGNUPS_DDL = "CREATE TABLE IF NOT EXISTS signups (name text PRIMARY KEY, welcomed_by bigint)"


@registry.handler("welcome", queue="mail", max_attempts=3)
async def welcome(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> str:
    await session.execute(
        sa.text("UPDATE signups SET welcomed_by = :job WHERE name = :name"),
        {"job": job.id, "name": payload["name"]},
    )
    return f"welcome sent to {payload['name']}"


@registry.handler("audit", queue="mail")
def audit(session: Session, payload: dict[str, Any]) -> int:
    return len(payload["name"])


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """The dependency every endpoint takes: one AsyncSession per request."""
    async with request.app.state.sessions() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


def create_app(engine: AsyncEngine) -> FastAPI:
    app = FastAPI()
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)

    @app.post("/signup/{name}")
    async def signup(name: str, session: SessionDep) -> dict[str, Any]:
        await session.execute(sa.text("INSERT INTO signups (name) VALUES (:n)"), {"n": name})
        job_id = await welcome.enqueue_async(session, {"name": name})
        await registry.enqueue_async(session, "audit", {"name": name})
        await session.commit()
        return {"job_id": job_id}

    @app.post("/admin/queues/{queue}/pause")
    async def pause(queue: str, session: SessionDep) -> dict[str, Any]:
        await ops.pause_async(session, queue)
        await session.commit()
        return {"paused": queue}

    @app.post("/admin/queues/{queue}/resume")
    async def resume(queue: str, session: SessionDep) -> dict[str, Any]:
        await ops.resume_async(session, queue)
        await session.commit()
        return {"resumed": queue}

    @app.put("/admin/kinds/{kind}/limit")
    async def set_limit(kind: str, concurrency: int, session: SessionDep) -> dict[str, Any]:
        await ops.set_limit_async(session, kind=kind, concurrency=concurrency)
        await session.commit()
        return {"kind": kind, "concurrency": concurrency}

    @app.delete("/admin/kinds/{kind}/limit")
    async def clear_limits(kind: str, session: SessionDep) -> dict[str, Any]:
        await ops.clear_limits_async(session, kind=kind)
        await session.commit()
        return {"kind": kind}

    @app.get("/admin/controls")
    async def controls(session: SessionDep) -> list[dict[str, Any]]:
        return [c.to_dict() for c in await ops.controls_async(session)]

    @app.get("/admin/stats")
    async def stats(session: SessionDep) -> dict[str, Any]:
        return (await ops.stats_async(session, registry)).to_dict()

    @app.get("/admin/jobs")
    async def list_jobs(session: SessionDep, status: str | None = None) -> list[dict[str, Any]]:
        return [j.to_dict() for j in await ops.list_jobs_async(session, status=status)]

    @app.post("/admin/jobs/{job_id}/cancel")
    async def cancel(job_id: int, session: SessionDep) -> dict[str, Any]:
        done = await ops.cancel_async(session, [job_id])
        await session.commit()
        return {"cancelled": list(done.cancelled), "stopping": list(done.stopping)}

    @app.post("/admin/jobs/{job_id}/retry")
    async def retry(job_id: int, session: SessionDep) -> dict[str, Any]:
        changed = await ops.retry_jobs_async(session, [job_id], status=["dead", "cancelled"])
        await session.commit()
        return {"retried": changed}

    @app.get("/jobs/{job_id}/result")
    async def result(job_id: int, session: SessionDep) -> dict[str, Any]:
        try:
            return {"result": await sqla_jobs.result_async(session, job_id)}
        except sqla_jobs.JobNotFoundError as exc:
            raise HTTPException(404, str(exc)) from None
        except sqla_jobs.JobNotDoneError as exc:
            raise HTTPException(409, str(exc)) from None

    return app
