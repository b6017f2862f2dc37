"""A pinned MVCC horizon costs the worker's statements little (issue #25, part 2).

While an application's transaction pins the horizon, vacuum removes no row version
newer than it, and an index entry of a dead version cannot be marked dead either: every
non-HOT update leaves entries that each later scan walks past. These tests read what the
database did (HOT update counters, the buffers of a plan), never the time it took.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from helpers import url_text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import NewJob, Registry, WorkerConfig, Workflow, enqueue_many
from sqla_jobs.sql import lease
from sqla_jobs.worker import _floors
from sqla_jobs.worker._buffer import ThreadBuffer
from sqla_jobs.worker._dispatcher import Dispatcher, Pool
from sqla_jobs.worker._inflight import SYNC_POOL, Claimed, Inflight
from sqla_jobs.worker._limits import Limits

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


def _claim_plan(conn: sa.Connection, floors: list[Any] | None) -> int:
    """Buffers one claim of one job read in jobs_claim_idx and the rows it points at
    (EXPLAIN ANALYZE, rolled back by the caller)."""
    stmt = lease.claim(worker=WORKER, lock_seconds=30, queues=["default"], kinds=["k"], limit=1)
    compiled = stmt.compile(dialect=conn.dialect)
    params = {**compiled.params, "floors": floors}
    (plan,) = conn.exec_driver_sql(
        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {compiled}", params
    ).scalar_one()

    def scans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if node.get("Index Name") == "jobs_claim_idx":
            yield node
        for child in node.get("Plans", []):
            yield from scans(child)

    found = list(scans(plan["Plan"]))
    assert found, plan
    return sum(n["Shared Hit Blocks"] + n["Shared Read Blocks"] for n in found)


def _run_jobs(engine: sa.Engine, pool: Pool, count: int) -> None:
    """``count`` jobs through claim and done-mark, 50 at a time, ready one second apart
    in the past (a steady flow), each claim from the floors the last one taught."""
    for _ in range(count // 50):
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (kind, payload, run_at) SELECT 'k', '{}',"
                    " now() - interval '1 day' + (coalesce((SELECT max(id) FROM jobs), 0) + g)"
                    " * interval '1 second' FROM generate_series(1, 50) AS g"
                )
            )
        with engine.begin() as conn:
            stmt = lease.claim(
                worker=WORKER, lock_seconds=30, queues=["default"], kinds=["k"], limit=50
            )
            compiled = stmt.compile(dialect=conn.dialect)
            params = {**compiled.params, "floors": pool.floors.values()}
            jobs = [Claimed(*row) for row in conn.exec_driver_sql(str(compiled), params)]
            assert len(jobs) == 50
            pool.floors.learn(jobs)
            conn.execute(lease.complete(worker=WORKER, leases=[j.lease for j in jobs])).all()


def test_a_floored_claim_reads_the_same_buffers_however_many_jobs_ran_under_a_pinned_horizon(
    engine: sa.Engine, pinned: None
) -> None:
    # The claimed jobs' entries stay at the head of jobs_claim_idx while the horizon is
    # pinned (nothing can mark them dead): a claim from the start reads past all of
    # them, one from the worker's floor (sqla_jobs.sql.lease._floor) does not.
    pool = Pool(SYNC_POOL, ("k",), 1, ThreadBuffer())
    read: dict[int, tuple[int, int]] = {}
    ran = 0
    for count in (200, 3000):
        _run_jobs(engine, pool, count - ran)
        ran = count
        with engine.connect() as conn:
            conn.execute(sa.text("INSERT INTO jobs (kind, payload) VALUES ('k', '{}')"))
            read[count] = (_claim_plan(conn, pool.floors.values()), _claim_plan(conn, None))
            conn.rollback()
    print(read)  # the evidence, with -s: {jobs run: (floored, from the start)}
    (floored_before, _), (floored_after, full_after) = read[200], read[3000]
    # At most one more index level per priority's descent, not an entry per job run.
    assert floored_after <= floored_before + 10, read
    assert full_after >= floored_after + 100, read  # what the floor saves


def test_a_job_ready_below_the_floor_is_claimed_by_the_next_full_claim(
    engine: sa.Engine, db_url: URL
) -> None:
    # A job committed after the floor moved past its run_at (a producer's long
    # transaction, run_at= in the past, a job given back by a stopping worker): the
    # floored claims do not see it; the claim from the start, due at most
    # FULL_CLAIM_SECONDS after the last one, does, and a short floored claim sets a
    # timer for it so an idle worker makes it.
    config = WorkerConfig(database_url=url_text(db_url), concurrency=4, prefetch=0)
    pool = Pool(SYNC_POOL, ("k",), 4, ThreadBuffer())
    dispatcher = Dispatcher(
        engine, config, ["k"], Inflight(on_room=lambda: None), ThreadBuffer(), [pool]
    )

    def enqueue(run_at: str = "now()") -> int:
        insert = f"INSERT INTO jobs (kind, payload, run_at) VALUES ('k', '{{}}', {run_at})"
        with engine.begin() as conn:
            return int(conn.execute(sa.text(insert + " RETURNING id")).scalar_one())

    first = enqueue()
    assert [j.id for j in dispatcher._claim_unlimited(pool, 4)] == [first]  # from the start
    assert pool.floors.by_priority
    assert pool.floors.full_claim_at <= time.monotonic() + _floors.FULL_CLAIM_SECONDS
    straggler = enqueue("now() - interval '1 hour'")
    fresh = enqueue()
    pool.floors.full_claim_at = time.monotonic() + 3600  # the test's pace, not the clock's
    assert [j.id for j in dispatcher._claim_unlimited(pool, 4)] == [fresh]  # floored
    # Short: the next full claim is on the timer, in case nothing else wakes the worker.
    assert dispatcher._timers[0][0] == pool.floors.full_claim_at
    pool.floors.full_claim_at = time.monotonic()  # due
    assert [j.id for j in dispatcher._claim_unlimited(pool, 4)] == [straggler]


def test_full_claims_come_less_often_as_they_cost_more_up_to_the_bound() -> None:
    # The decision alone, on injected costs (no clock): a full claim reads the whole dead
    # head of jobs_claim_idx, so its period grows with its cost to keep full claims
    # under FULL_CLAIM_SHARE of the time, and stops at FULL_CLAIM_MAX_SECONDS, the
    # longest a job ready below the floor waits for one.
    period = _floors.full_claim_period
    share, shortest = _floors.FULL_CLAIM_SHARE, _floors.FULL_CLAIM_SECONDS
    longest = _floors.FULL_CLAIM_MAX_SECONDS
    assert period(0.0) == period(0.012) == shortest  # a free horizon's, 12,000 dead entries
    assert period(0.12) == pytest.approx(0.12 / share)  # 120,000: every 2.4 s, 5% of the time
    assert shortest < period(0.12) < period(0.3) < longest
    assert period(longest * share) == pytest.approx(longest)
    assert period(5.0) == period(3600.0) == longest  # the bound holds whatever the cost
    floors = _floors.Floors()
    assert floors.full_due(0.0)  # the first claim is a full one
    floors.full_claim_ran(100.0, 100.25)
    assert (floors.full_claim_cost, floors.full_claim_at) == (0.25, 105.0)
    assert not floors.full_due(104.9) and floors.full_due(105.0)
    floors.full_claim_ran(105.0, 105.001)  # the horizon freed, vacuum ran: cheap again
    assert floors.full_claim_at == 105.0 + shortest


class _Clock:
    """The dispatcher's clock for full claims, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_job_ready_below_the_floor_waits_at_most_the_bound_however_long_full_claims_take(
    engine: sa.Engine, db_url: URL
) -> None:
    # Full claims that take far longer than the share allows (a horizon pinned for
    # hours): they come at most FULL_CLAIM_MAX_SECONDS apart, and a job committed below
    # the floor meanwhile is claimed by the first one due. The clock is the test's: the
    # first claim "takes" an hour.
    config = WorkerConfig(database_url=url_text(db_url), concurrency=4, prefetch=0)
    pool = Pool(SYNC_POOL, ("k",), 4, ThreadBuffer())
    dispatcher = Dispatcher(
        engine, config, ["k"], Inflight(on_room=lambda: None), ThreadBuffer(), [pool]
    )
    clock = dispatcher.clock = _Clock()
    run_claim = dispatcher._run_claim

    def slow_claim(*args: Any, **kwargs: Any) -> list[Claimed]:
        found = run_claim(*args, **kwargs)
        clock.now += cost
        return found

    dispatcher._run_claim = slow_claim  # type: ignore[method-assign]

    def enqueue(run_at: str = "now()") -> int:
        insert = f"INSERT INTO jobs (kind, payload, run_at) VALUES ('k', '{{}}', {run_at})"
        with engine.begin() as conn:
            return int(conn.execute(sa.text(insert + " RETURNING id")).scalar_one())

    first, cost, started = enqueue(), 3600.0, clock.now
    assert [j.id for j in dispatcher._claim_unlimited(pool, 4)] == [first]  # from the start
    assert pool.floors.full_claim_cost == 3600.0
    assert pool.floors.full_claim_at == started + _floors.FULL_CLAIM_MAX_SECONDS
    cost = 0.0
    clock.now = started + _floors.FULL_CLAIM_MAX_SECONDS - 0.5
    straggler = enqueue("now() - interval '1 hour'")
    fresh = enqueue()
    assert [j.id for j in dispatcher._claim_unlimited(pool, 4)] == [fresh]  # floored
    clock.now = started + _floors.FULL_CLAIM_MAX_SECONDS  # the bound: a full claim
    assert [j.id for j in dispatcher._claim_unlimited(pool, 4)] == [straggler]


def test_a_limited_kinds_job_ready_below_its_floor_is_claimed_by_its_next_full_claim(
    engine: sa.Engine, db_url: URL
) -> None:
    # A limited group's claims (sqla_jobs.worker._limits) start at the group's own
    # floors as the dispatcher's do: a job ready below them is found by the group's next
    # full claim, on the timer a short floored claim sets (it pokes the resting group).
    registry = Registry()
    registry.register("k", lambda session, payload: None, limit=10)
    config = WorkerConfig(database_url=url_text(db_url), concurrency=4, worker_id=WORKER)
    timers: list[float] = []
    limits = Limits(
        engine,
        config.with_queues(("default",)),
        registry,
        Inflight(on_room=lambda: None),
        timers.append,
    )

    def enqueue(run_at: str = "now()") -> int:
        insert = f"INSERT INTO jobs (kind, payload, run_at) VALUES ('k', '{{}}', {run_at})"
        with engine.begin() as conn:
            return int(conn.execute(sa.text(insert + " RETURNING id")).scalar_one())

    def claim() -> list[int]:
        limits.poke()  # as a notification would: the group rests after a short claim
        limits.refresh()
        return [job.id for job in limits.claim(4, _no_rated_claims)]

    first = enqueue()
    assert claim() == [first]  # the group's first claim: from the start
    (group,) = limits.groups
    floors = limits._floors[group]
    assert floors.by_priority
    straggler = enqueue("now() - interval '1 hour'")
    fresh = enqueue()
    floors.full_claim_at = time.monotonic() + 3600  # the test's pace, not the clock's
    assert claim() == [fresh]  # floored
    assert timers == [floors.full_claim_at]  # short: the next full claim is on the timer
    floors.full_claim_at = time.monotonic()  # due
    assert claim() == [straggler]


def _no_rated_claims(*args: Any, **kwargs: Any) -> list[Claimed]:
    raise AssertionError("a concurrency-only group never takes the two-trip claim")


@pytest.mark.parametrize("parents", [["a"], ["a", "c"]], ids=["released-alone", "fan-in"])
def test_a_released_workflow_step_is_ready_from_its_release_so_a_floored_claim_finds_it(
    engine: sa.Engine, parents: list[str]
) -> None:
    # Revisions 0019/0020: a step enqueued long ago and released by its dependencies'
    # end takes the release's time as run_at (a later run_at, a delay, is kept), so the
    # worker's floored claim finds it at once instead of at the next full claim. Both
    # releases: a child of one parent (released alone, 0020) and a fan-in's child.
    flow = Workflow()
    for name in parents:
        flow.add(name, "k")
    flow.add("b", "k", after=parents)
    with Session(engine) as s:
        ids = flow.enqueue(s)
        s.commit()
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET run_at = now() - interval '1 hour'"))
    with engine.begin() as conn:
        claimed = _claim(conn, 4)
        assert sorted(row.id for row in claimed) == sorted(ids[name] for name in parents)
    with engine.begin() as conn:
        leases = [(row.id, row.attempts) for row in claimed]
        conn.execute(lease.complete(worker=WORKER, leases=leases)).all()
    with engine.begin() as conn:
        released, finished = conn.execute(
            sa.text(
                "SELECT b.run_at >= a.finished_at, a.finished_at FROM jobs AS a, jobs AS b"
                " WHERE a.id = :a AND b.id = :b"
            ),
            {"a": ids["a"], "b": ids["b"]},
        ).one()
        assert released
        stmt = lease.claim(worker=WORKER, lock_seconds=30, queues=["default"], kinds=["k"], limit=4)
        compiled = stmt.compile(dialect=conn.dialect)
        floors = [finished - timedelta(seconds=1)] + [None] * 9
        found = conn.exec_driver_sql(str(compiled), {**compiled.params, "floors": floors}).all()
        assert [row.id for row in found] == [ids["b"]]
