"""Handlers for the workflow tests (#26): steps that record their runs and results."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqla_jobs import Discard, JobContext, Registry
from sqla_jobs.workflows import upstream_results

registry = Registry()

RUNS = sa.table("flow_runs", sa.column("job_id"), sa.column("step"), sa.column("seen"))


def setup(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text("CREATE TABLE IF NOT EXISTS flow_runs (job_id bigint, step text, seen jsonb)")
        )


def _record(session: Session, job: JobContext, seen: Any) -> None:
    session.execute(
        sa.text(
            "INSERT INTO flow_runs (job_id, step, seen) VALUES (:id, :step, CAST(:seen AS jsonb))"
        ),
        {"id": job.id, "step": job.kind, "seen": json.dumps(seen)},
    )


@registry.handler("flow.step")
def step(session: Session, payload: dict[str, Any], job: JobContext) -> Any:
    """Records its run and what its dependencies returned; returns ``payload["value"]``."""
    _record(session, job, upstream_results(session, job))
    return payload.get("value")


@registry.handler("flow.sum")
def total(session: Session, payload: dict[str, Any], job: JobContext) -> int:
    """A fan-in: the sum of its dependencies' results."""
    seen = upstream_results(session)
    _record(session, job, seen)
    return sum(v for v in seen.values() if v is not None)


@registry.handler("flow.fail", max_attempts=1)
def fail(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    raise RuntimeError(payload.get("why", "boom"))


@registry.handler("flow.discard")
def discard(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    raise Discard(payload.get("why", "not wanted"))
