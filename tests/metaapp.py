"""Handlers that write what they read of their job's metadata; workers load ``metaapp:registry``.

Each writes ``seen(job_id, meta, tags)`` in its own transaction (it commits with the
done-mark): a thread handler, an ``async def`` one, and one run in a child process.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Registry

registry = Registry()

SETUP_SQL = "CREATE TABLE IF NOT EXISTS seen (job_id bigint PRIMARY KEY, meta jsonb, tags text[])"

_SEEN = sa.text("INSERT INTO seen (job_id, meta, tags) VALUES (:id, CAST(:meta AS jsonb), :tags)")


def _values(job: JobContext) -> dict[str, Any]:
    return {"id": job.id, "meta": json.dumps(dict(job.meta)), "tags": list(job.tags)}


@registry.handler("meta.thread")
def in_thread(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    session.execute(_SEEN, _values(job))


@registry.handler("meta.async")
async def in_task(session: AsyncSession, payload: dict[str, Any], job: JobContext) -> None:
    await session.execute(_SEEN, _values(job))


@registry.handler("meta.process", isolation="process")
def in_process(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    session.execute(_SEEN, _values(job))
