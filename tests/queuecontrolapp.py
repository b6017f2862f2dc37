"""Handlers for the queue-control tests (``queuecontrolapp:registry``).

Every handler logs its run in ``control_runs`` (kind, queue, job, start and end by the
database's clock) from an autocommit connection of its own, so the log is the oracle of
what ran when, whatever the worker's transactions did; with ``in_session`` in the
payload, in the handler's own transaction (same times, one connection fewer). ``sleep``
keeps the handler busy between its start and end marks.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Registry

SETUP_SQL = """
CREATE TABLE IF NOT EXISTS control_runs (
  id bigserial PRIMARY KEY,
  job_id bigint NOT NULL,
  kind text NOT NULL,
  queue text NOT NULL,
  worker text NOT NULL,
  started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  ended_at timestamptz
);
"""

#: The most runs of one kind whose [start, end) intervals overlap, over the whole log.
MAX_OVERLAP_SQL = """
SELECT coalesce(max(n), 0) FROM (
  SELECT (SELECT count(*) FROM control_runs b
          WHERE b.kind = a.kind AND b.started_at <= a.started_at
            AND coalesce(b.ended_at, 'infinity') > a.started_at) AS n
  FROM control_runs a WHERE a.kind = :kind) AS per_start
"""

registry = Registry()
registry.limit_queue("capped", limit=2)


def _run(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    if payload.get("in_session"):
        # The marks commit with the done-mark; clock_timestamp() still says when each
        # was made. One connection per handler instead of two (a shared test server has
        # max_connections = 100).
        run_id = session.execute(
            sa.text(
                "INSERT INTO control_runs (job_id, kind, queue, worker) "
                "VALUES (:j, :k, :q, :w) RETURNING id"
            ),
            {"j": job.id, "k": job.kind, "q": job.queue, "w": job.worker},
        ).scalar_one()
        time.sleep(float(payload.get("sleep", 0)))
        session.execute(
            sa.text("UPDATE control_runs SET ended_at = clock_timestamp() WHERE id = :r"),
            {"r": run_id},
        )
        return
    engine = session.get_bind()
    assert isinstance(engine, sa.Engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        run_id = conn.execute(
            sa.text(
                "INSERT INTO control_runs (job_id, kind, queue, worker) "
                "VALUES (:j, :k, :q, :w) RETURNING id"
            ),
            {"j": job.id, "k": job.kind, "q": job.queue, "w": job.worker},
        ).scalar_one()
        time.sleep(float(payload.get("sleep", 0)))
        conn.execute(
            sa.text("UPDATE control_runs SET ended_at = clock_timestamp() WHERE id = :r"),
            {"r": run_id},
        )


@registry.handler("limited", limit=3)
def limited(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _run(session, payload, job)


@registry.handler("rated", rate="10/s")
def rated(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _run(session, payload, job)


@registry.handler("plain")
def plain(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _run(session, payload, job)


@registry.handler("mail", queue="mail")
def mail(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _run(session, payload, job)


@registry.handler("capped_work", queue="capped")
def capped_work(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    _run(session, payload, job)
