"""The registry of workers (revision 0006): each worker's row, refreshed by its heartbeat.

A row lives until ``expires_at`` (the last heartbeat plus the worker's lease time):
listings show only unexpired rows, and every heartbeat deletes rows that expired, so a
killed worker vanishes when its leases would have expired.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, insert

from sqla_jobs.models import worker_records
from sqla_jobs.sql import _common
from sqla_jobs.sql._common import Now


def beat(
    *,
    worker: str,
    host: str,
    pid: int,
    version: str,
    queues: Sequence[str],
    kinds: Sequence[str],
    concurrency: int,
    lock_seconds: float,
    running: int,
    now: Now = None,
) -> sa.Insert:
    """Insert or refresh this worker's row: heartbeat now, expiry one lease later."""
    clock = _common.clock(now)
    expires = clock + _common.seconds(sa.bindparam("lock_seconds", lock_seconds, sa.Float))
    stmt = insert(worker_records).values(
        id=sa.bindparam("worker", worker, sa.Text),
        host=host,
        pid=pid,
        version=version,
        queues=sa.literal(list(queues), ARRAY(sa.Text)),
        kinds=sa.literal(list(kinds), ARRAY(sa.Text)),
        concurrency=concurrency,
        started_at=clock,
        heartbeat_at=clock,
        expires_at=expires,
        running=sa.bindparam("running", running, sa.Integer),
    )
    return stmt.on_conflict_do_update(
        index_elements=[worker_records.c.id],
        set_={
            "heartbeat_at": stmt.excluded.heartbeat_at,
            "expires_at": stmt.excluded.expires_at,
            "running": stmt.excluded.running,
        },
    )


def forget_expired(now: Now = None) -> sa.Delete:
    """Delete the rows of workers that stopped heartbeating, skipping rows locked elsewhere.

    Every heartbeat runs this in the transaction that refreshed its own row. Two workers
    whose rows both expired (a loaded host delays heartbeats) would each hold its own row
    and wait for the other's: a deadlock, whose detection costs a second and fails the
    heartbeat round. A locked row is being refreshed or deleted by its holder, so
    skipping it loses nothing.
    """
    expired = (
        sa.select(worker_records.c.id)
        .where(worker_records.c.expires_at < _common.clock(now))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return sa.delete(worker_records).where(worker_records.c.id.in_(expired))


def retire(worker: str) -> sa.Delete:
    """Delete this worker's row (it stopped cleanly)."""
    return sa.delete(worker_records).where(
        worker_records.c.id == sa.bindparam("worker", worker, sa.Text)
    )


def live(now: Now = None) -> sa.Select[Any]:
    """The workers whose last heartbeat is younger than their lease time, by id."""
    return (
        sa.select(*worker_records.c)
        .where(worker_records.c.expires_at >= _common.clock(now))
        .order_by(worker_records.c.id)
    )
