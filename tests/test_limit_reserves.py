"""A limited kind's reserve: jobs claimed beyond the limit while no other worker runs
the kind, held back, and started through the worker's gate as its own jobs end.

The Limits part alone, on a real database, with a ledger and a list for a buffer: what
starts, what other workers can claim, what a pause and a stop give back.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows as rows_of
from helpers import scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from test_worker import running

from sqla_jobs import NewJob, Registry, enqueue_many, ops
from sqla_jobs.config import WorkerConfig
from sqla_jobs.sql import lease
from sqla_jobs.worker import _limits
from sqla_jobs.worker._inflight import Claimed, Inflight, State

LIMIT = 2


def _registry() -> Registry:
    registry = Registry()
    registry.register("a", lambda session, payload: None, limit=LIMIT)
    return registry


class Worker:
    """A Limits with its ledger; ``started`` is what went to the handlers, in order."""

    def __init__(self, engine: sa.Engine, db_url: URL, worker_id: str) -> None:
        self.engine, self.worker_id = engine, worker_id
        self.started: list[Claimed] = []
        self.given_back: list[Claimed] = []
        self.ledger = Inflight(on_room=lambda: None, on_end=self._ended)
        config = WorkerConfig(database_url=str(db_url), concurrency=4, worker_id=worker_id)
        self.limits = _limits.Limits(
            engine,
            config.with_queues(("default",)),
            _registry(),
            self.ledger,
            lambda when: None,
            give_back=self._give_back,
            start=self.started.append,
            wake=lambda: None,
        )

    def _ended(self, job: Claimed, pool: int) -> None:
        self.limits.job_ended(job, pool)

    def _give_back(self, jobs: list[Claimed]) -> None:
        self.given_back += jobs
        with self.engine.begin() as conn:  # as the completer's release does
            conn.execute(lease.release(worker=self.worker_id, leases=[j.lease for j in jobs]))
        self.ledger.remove(jobs)

    def claim(self) -> list[Claimed]:
        self.limits.refresh()
        claimed = self.limits.claim(50, _no_rated_claims, ahead=50)
        self.started += claimed
        return claimed

    def finish(self, job: Claimed) -> None:
        """The handler ran and returned; its done-mark waits for the completer's batch."""
        self.ledger.move(job, State.RUNNING)
        self.ledger.move(job, State.COMPLETING)


def _no_rated_claims(*args: Any, **kwargs: Any) -> list[Claimed]:
    raise AssertionError("a concurrency-only group never takes the two-trip claim")


def _running_rows(engine: sa.Engine, worker: str) -> int:
    return int(
        scalar(
            engine,
            "SELECT count(*) FROM jobs WHERE kind = 'a' AND status = 'running' AND worker = :w",
            w=worker,
        )
    )


@pytest.fixture
def jobs(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    # A reserve as large as the pool's prefetch (``ahead``) however slow the machine:
    # the sizes below are exact. And a view of the limits that stays fresh however long
    # the steps between take on a loaded machine (the pause test ages it on purpose).
    monkeypatch.setattr(_limits, "RESERVE_AHEAD_SECONDS", 1e6)
    monkeypatch.setattr(_limits, "RESERVE_SECONDS", 60.0)
    enqueue_many(session, [NewJob("a", {}) for _ in range(40)])
    session.commit()


def test_a_worker_holds_jobs_back_beyond_the_limit_and_starts_one_per_job_that_ends(
    engine: sa.Engine, db_url: URL, jobs: None
) -> None:
    one = Worker(engine, db_url, "one")
    first = one.claim()
    assert len(first) == LIMIT  # no reserve before the kind's pace is known
    for job in first:
        one.finish(job)
    # Its pace known, the next claim takes more than the limit while nobody else runs
    # the kind; only the limit's worth starts.
    now = one.claim()
    assert len(now) == LIMIT
    assert _running_rows(engine, "one") > LIMIT
    # Another worker sees those rows running: no room for it.
    other = Worker(engine, db_url, "other")
    assert other.claim() == []
    # Each job that ends lets exactly one held-back job start, never more.
    before = len(one.started)
    one.finish(now[0])
    assert len(one.started) == before + 1
    one.finish(now[1])
    assert len(one.started) == before + 2
    # Stopping gives the held-back jobs back (the worker releases them, unstarted).
    held = one.limits.take_reserves()
    assert len(held) == 40 - 3 * LIMIT  # all 40 claimed: 2 ran, 2 + 2 started
    assert not {j.id for j in held} & {j.id for j in one.started}
    # Every row it claimed (no completer here: no done-marks) ran, started or was held.
    assert _running_rows(engine, "one") == len(held) + 3 * LIMIT


def test_a_pause_gives_held_back_jobs_back_at_the_next_look_and_a_resume_claims_them_again(
    engine: sa.Engine, db_url: URL, jobs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = Worker(engine, db_url, "one")
    for job in one.claim():
        one.finish(job)
    now = one.claim()
    assert _running_rows(engine, "one") > LIMIT
    with Session(engine) as s:
        ops.pause(s, kind="a")
        s.commit()
    # Held-back jobs start only while the limits their group last read are fresh: once
    # old, the next job that ends starts nothing, and the next look gives them back.
    monkeypatch.setattr(_limits, "RESERVE_SECONDS", 0.0)
    started = len(one.started)
    one.finish(now[0])
    assert len(one.started) == started
    assert one.claim() == []
    assert one.given_back and len(one.started) == started
    assert one.limits.take_reserves() == []
    with Session(engine) as s:
        ops.resume(s, kind="a")
        s.commit()
    assert len(one.claim()) == LIMIT - 1  # one of its jobs still runs


def _nap(session: Session, payload: dict[str, Any]) -> None:
    time.sleep(0.001)


def test_a_stopping_worker_gives_its_held_back_jobs_back_unspent(
    engine: sa.Engine, db_url: URL
) -> None:
    registry = Registry()
    registry.register("a", _nap, limit=LIMIT)
    with Session(engine) as s:
        enqueue_many(s, [NewJob("a", {}) for _ in range(2_000)])
        s.commit()
    with running(registry, db_url, concurrency=4):
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'done'") >= 50)
    # Stopped mid-drain: nothing is left running, and what did not run is queued with
    # its attempt given back.
    counts = dict(
        (r.status, r.n)
        for r in rows_of(
            engine, "SELECT status::text AS status, count(*) AS n FROM jobs GROUP BY 1"
        )
    )
    assert set(counts) == {"done", "queued"} and sum(counts.values()) == 2_000
    assert scalar(engine, "SELECT max(attempts) FROM jobs WHERE status = 'queued'") == 0


def test_a_worker_keeps_a_reserve_while_another_runs_part_of_the_limit_and_takes_up_its_room(
    engine: sa.Engine, db_url: URL, jobs: None
) -> None:
    other = Worker(engine, db_url, "other")
    taken = other.claim()
    assert len(taken) == LIMIT
    _done(engine, other, taken[0])  # the other worker still runs one job of the limit
    one = Worker(engine, db_url, "one")
    first = one.claim()
    assert len(first) == LIMIT - 1  # no reserve before its jobs' pace is known
    _done(engine, one, first[0])
    # The limit is shared, but leaves this worker room: it holds jobs back beyond it
    # (a slot freed here starts the next one without a claim's round trip) and starts
    # only what its gate (the limit minus the other's running job) lets through.
    now = one.claim()
    assert len(now) == LIMIT - 1
    assert _running_rows(engine, "one") > LIMIT - 1
    assert other.claim() == []  # the held-back rows leave the other worker no room
    # The other worker's job ends; this worker's next look takes up the room it left.
    _done(engine, other, taken[1])
    before = len(one.started)
    one.claim()
    assert len(one.started) == before + 1
    assert len(one.started) - 1 == LIMIT  # the one that ended runs no more


def _done(engine: sa.Engine, worker: Worker, job: Claimed) -> None:
    """The handler returned and its done-mark committed (as the completer would)."""
    worker.finish(job)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = 'done', finished_at = now(), locked_until = NULL"
                " WHERE id = :id"
            ),
            {"id": job.id},
        )
