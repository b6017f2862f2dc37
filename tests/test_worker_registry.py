"""The registry of workers (``jobs_workers``): what two heartbeats at once must not do."""

from __future__ import annotations

import sqlalchemy as sa

from sqla_jobs.sql import workers


def _beat(conn: sa.Connection, worker: str) -> None:
    conn.execute(
        workers.beat(
            worker=worker,
            host="h",
            pid=1,
            version="0",
            queues=["default"],
            kinds=["k"],
            concurrency=1,
            lock_seconds=30,
            running=0,
        )
    )


def test_two_late_heartbeats_forgetting_each_others_expired_row_do_not_wait_on_each_other(
    engine: sa.Engine,
) -> None:
    # Both rows expired (a loaded host delayed both heartbeats). Each worker's heartbeat
    # refreshes its own row, then forgets expired rows in the same transaction: the
    # other's row still reads as expired, and is locked by the other's refresh. Waiting
    # for it would deadlock (each holds the row the other waits for), costing the
    # deadlock detector's second and a failed heartbeat round, which a lease may not
    # survive.
    with engine.begin() as conn:
        for worker in ("a", "b"):
            _beat(conn, worker)
        conn.execute(sa.text("UPDATE jobs_workers SET expires_at = now() - interval '1 minute'"))
    with engine.connect() as a, engine.connect() as b:
        a.begin()
        b.begin()
        _beat(a, "a")
        _beat(b, "b")
        # A wait would show as lock_timeout's error instead of a deadlock a second later.
        a.execute(sa.text("SET LOCAL lock_timeout = '2s'"))
        b.execute(sa.text("SET LOCAL lock_timeout = '2s'"))
        forgotten_by_a = a.execute(workers.forget_expired()).rowcount
        forgotten_by_b = b.execute(workers.forget_expired()).rowcount
        a.commit()
        b.commit()
    assert (forgotten_by_a, forgotten_by_b) == (0, 0)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id FROM jobs_workers ORDER BY id")).scalars().all()
    assert rows == ["a", "b"]


def test_a_heartbeat_forgets_a_worker_that_stopped(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for worker in ("gone", "here"):
            _beat(conn, worker)
        conn.execute(
            sa.text(
                "UPDATE jobs_workers SET expires_at = now() - interval '1 minute' WHERE id = 'gone'"
            )
        )
    with engine.begin() as conn:
        _beat(conn, "here")
        assert conn.execute(workers.forget_expired()).rowcount == 1
        rows = conn.execute(sa.text("SELECT id FROM jobs_workers")).scalars().all()
    assert rows == ["here"]
