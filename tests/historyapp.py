"""Handlers whose attempts make a history (revision 0011); workers load it as
``historyapp:registry``. Retries come after 10 ms, so a test sees every attempt quickly."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqla_jobs import Backoff, JobContext, Registry, Snooze

registry = Registry()
FAST = Backoff(base=0.01, cap=0.01)


@registry.handler("flaky", max_attempts=5, backoff=FAST)
def flaky(session: Session, payload: dict[str, Any], job: JobContext) -> dict[str, Any]:
    """Snoozes once first if ``snooze``, fails its first ``fail`` attempts (the error says
    which attempt, padded by ``pad`` characters), then returns."""
    snoozes = session.execute(
        sa.text("SELECT snoozes FROM jobs WHERE id = :i"), {"i": job.id}
    ).scalar_one()
    if payload.get("snooze") and snoozes == 0:
        raise Snooze(0.01, "not yet")
    if job.attempt <= payload.get("fail", 0):
        raise ValueError(f"boom on attempt {job.attempt}" + "x" * payload.get("pad", 0))
    return {"after": job.attempt}


@registry.handler("hopeless", max_attempts=2, backoff=FAST)
def hopeless(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    raise ValueError(f"hopeless attempt {job.attempt}")
