"""Schedules used by the periodic tests; workers load it as ``periodicapp:registry``.

Every schedule ticks every second. ``ticked`` writes one row per run, in the handler's
transaction (so it commits with the done-mark), with the tick the job says it serves.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Registry

registry = Registry()

SETUP_SQL = """
CREATE TABLE IF NOT EXISTS periodic_runs (
    job_id bigint PRIMARY KEY,
    schedule text NOT NULL,
    scheduled_for timestamptz NOT NULL,
    worker text NOT NULL
);
"""
#: How late a tick may be and still count as on time, in the policy schedules.
GRACE = timedelta(seconds=1.5)
SECOND = timedelta(seconds=1)


@registry.periodic(every=SECOND, missed="all", catch_up=timedelta(hours=1), payload={"s": "each"})
@registry.handler("ticked")
def ticked(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    session.execute(
        sa.text(
            "INSERT INTO periodic_runs (job_id, schedule, scheduled_for, worker) "
            "VALUES (:j, :s, :t, :w)"
        ),
        {"j": job.id, "s": payload["s"], "t": job.scheduled_for, "w": job.worker},
    )


registry.schedule(
    "skip", None, ticked, every=SECOND, missed="skip", grace=GRACE, payload={"s": "skip"}
)
registry.schedule(
    "latest", None, ticked, every=SECOND, missed="latest", grace=GRACE, payload={"s": "latest"}
)
registry.schedule(
    "all-3s",
    None,
    ticked,
    every=SECOND,
    missed="all",
    catch_up=timedelta(seconds=3),
    grace=GRACE,
    payload={"s": "all-3s"},
)
registry.schedule(
    "all-2",
    None,
    ticked,
    every=SECOND,
    missed="all",
    catch_up=2,
    grace=GRACE,
    payload={"s": "all-2"},
)
