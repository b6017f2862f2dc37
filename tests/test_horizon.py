"""A pinned MVCC horizon costs the worker's statements little (issue #25, part 2).

While an application's transaction pins the horizon, vacuum removes no row version
newer than it, and an index entry of a dead version cannot be marked dead either: every
non-HOT update leaves entries that each later scan walks past. These tests read what the
database did (HOT update counters, the buffers of a plan), never the time it took.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from helpers import url_text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import NewJob, enqueue_many
from sqla_jobs.sql import lease

WORKER = "w:1"


@pytest.fixture
def pinned(db_url: URL) -> Iterator[None]:
    """An application's REPEATABLE READ transaction, idle in transaction throughout."""
    with psycopg.connect(url_text(db_url.set(drivername="postgresql"))) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM jobs").fetchone()  # the snapshot is taken here
        yield
        conn.rollback()


def _claim(conn: sa.Connection, limit: int) -> list[Any]:
    stmt = lease.claim(worker=WORKER, lock_seconds=30, queues=["default"], kinds=["k"], limit=limit)
    return list(conn.execute(stmt))


def _updates(conn: sa.Connection) -> tuple[int, int]:
    """Updates and HOT updates of jobs by this backend not yet reported (the current
    transaction's, and earlier ones' until the backend flushes its statistics)."""
    updated, hot = conn.execute(
        sa.text(
            "SELECT pg_stat_get_xact_tuples_updated('jobs'::regclass),"
            " pg_stat_get_xact_tuples_hot_updated('jobs'::regclass)"
        )
    ).one()
    return int(updated), int(hot)


def test_heartbeats_are_hot_updates_under_a_pinned_horizon(engine: sa.Engine, pinned: None) -> None:
    # No index holds locked_until (revision 0018): a heartbeat writes no index entry and
    # leaves no dead entry for the claim or the fences to walk past. A HOT update needs
    # room on the row's page: a few jobs, so that their versions fit in one page even
    # though the pinned horizon lets none of them be pruned.
    with Session(engine) as s:
        enqueue_many(s, [NewJob("k", {}) for _ in range(5)])
        s.commit()
    with engine.begin() as conn:
        leases = [(row.id, row.attempts) for row in _claim(conn, 5)]
    assert len(leases) == 5
    with engine.begin() as conn:
        before = _updates(conn)
        for _ in range(3):
            beat = lease.heartbeat(worker=WORKER, leases=leases, lock_seconds=30)
            assert len(conn.execute(beat).all()) == 5
        after = _updates(conn)
    assert (after[0] - before[0], after[1] - before[1]) == (15, 15)
