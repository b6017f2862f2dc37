"""Periodic schedules with real worker processes: once per tick, outages, wrong clocks.

Every schedule of ``periodicapp`` ticks each second. A tick's job carries its tick in the
payload (``scheduled_for``) and its idempotency key; ``created_at`` is the ``now()`` of
the transaction that enqueued it, the database clock the enqueuer decided with.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from helpers import TESTS, rows, scalar, start_worker, stop, url_text, wait_for
from periodicapp import GRACE, SETUP_SQL
from sqlalchemy.engine import URL

SECOND = timedelta(seconds=1)
APP = "periodicapp:registry"


# Which transaction inserted each job, and when it began (created_at is each insert
# statement's own time, and xmin changes when a worker runs the job): recorded by a
# trigger of the test's.
INSERTED_BY_SQL = """
CREATE TABLE inserted_by (
    job_id bigint PRIMARY KEY, xact bigint NOT NULL, xact_start timestamptz NOT NULL
);
CREATE FUNCTION note_inserting_xact() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO inserted_by VALUES (NEW.id, txid_current(), now());
    RETURN NULL;
END $$;
CREATE TRIGGER note_inserting_xact AFTER INSERT ON jobs
    FOR EACH ROW EXECUTE FUNCTION note_inserting_xact();
"""


def setup(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP_SQL)
        conn.exec_driver_sql(INSERTED_BY_SQL)


def ticks(engine: sa.Engine, schedule: str) -> list[Any]:
    """``(tick, created_at, xact)`` of every job of ``schedule``, oldest tick first; ``xact``
    is the inserting transaction's id (see INSERTED_BY_SQL)."""
    return rows(
        engine,
        "SELECT (payload->>'scheduled_for')::timestamptz AS tick, created_at, b.xact "
        "FROM jobs JOIN inserted_by b ON b.job_id = jobs.id "
        "WHERE payload->>'s' = :s ORDER BY 1",
        s=schedule,
    )


def count(engine: sa.Engine, schedule: str, since: datetime | None = None) -> int:
    return int(
        scalar(
            engine,
            "SELECT count(*) FROM jobs WHERE payload->>'s' = :s "
            "AND (payload->>'scheduled_for')::timestamptz "
            "> coalesce(CAST(:since AS timestamptz), '-infinity')",
            s=schedule,
            since=since,
        )
    )


def transactions_since(engine: sa.Engine, schedule: str, since: datetime) -> int:
    """How many enqueueing transactions gave ticks after ``since``."""
    return int(
        scalar(
            engine,
            "SELECT count(DISTINCT b.xact) FROM jobs JOIN inserted_by b ON b.job_id = jobs.id "
            "WHERE payload->>'s' = :s "
            "AND (payload->>'scheduled_for')::timestamptz > :since",
            s=schedule,
            since=since,
        )
    )


def contiguous(found: list[datetime]) -> bool:
    return all(b - a == SECOND for a, b in itertools.pairwise(found))


def test_three_workers_enqueue_exactly_one_job_per_tick_with_no_gap(
    engine: sa.Engine, db_url: URL
) -> None:
    setup(engine)
    workers = [start_worker(db_url, "--poll-interval", "0.2", app=APP) for _ in range(3)]
    try:
        wait_for(lambda: count(engine, "each") >= 10, timeout=60, message="10 ticks")
    finally:
        outputs = [stop(w) for w in workers]
    found = ticks(engine, "each")
    assert len(found) >= 10, outputs
    assert contiguous([r.tick for r in found]), [r.tick.isoformat() for r in found]
    assert all(r.tick <= r.created_at for r in found)  # never enqueued before its time
    # The handlers saw the tick their job serves (JobContext.scheduled_for).
    mismatched = scalar(
        engine,
        "SELECT count(*) FROM periodic_runs r JOIN jobs j ON j.id = r.job_id "
        "WHERE r.scheduled_for <> (j.payload->>'scheduled_for')::timestamptz",
    )
    assert mismatched == 0 and scalar(engine, "SELECT count(*) FROM periodic_runs") > 0


def expected_after_outage(last: datetime, now: datetime) -> dict[str, list[datetime]]:
    """What each schedule of periodicapp promises for the ticks due at ``now``."""
    newest = now.replace(microsecond=0)
    due = [last + SECOND * i for i in range(1, int((newest - last) / SECOND) + 1)]
    return {
        "each": due,  # missed="all", catch_up=1 hour
        "latest": [newest],
        "skip": [t for t in due if now - t <= GRACE],
        "all-3s": [t for t in due if now - t <= timedelta(seconds=3)],
        "all-2": due[-2:],
    }


def readings(first: datetime, last: datetime) -> list[datetime]:
    """Clock readings from ``first`` to ``last``, 10 ms apart, both ends included."""
    step = timedelta(milliseconds=10)
    count = int((last - first) / step)
    return [first + step * i for i in range(count + 1)] + [last]


def test_ticks_missed_while_no_worker_ran_follow_each_schedules_missed_policy(
    engine: sa.Engine, db_url: URL
) -> None:
    setup(engine)
    schedules = ("each", "latest", "skip", "all-3s", "all-2")
    first = start_worker(db_url, app=APP)
    try:
        wait_for(lambda: min(count(engine, s) for s in schedules) >= 2, timeout=60)
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
    finally:
        stop(first)
    last = dict(rows(engine, "SELECT name, last_tick FROM jobs_periodic"))
    assert len(set(last.values())) == 1  # one transaction handles all five
    stopped_at = last["ticked"]  # the schedule named after its kind (payload "each")
    # Five ticks fall due with no worker running (measured on the database's clock).
    wait_for(
        lambda: scalar(engine, "SELECT now() >= :t", t=stopped_at + 5.5 * SECOND),
        timeout=30,
        message="five ticks without a worker",
    )
    second = start_worker(db_url, app=APP)
    try:
        # The catch-up transaction, then at least one more for every schedule.
        wait_for(
            lambda: min(transactions_since(engine, s, stopped_at) for s in schedules) >= 2,
            timeout=60,
            message="ticks after the restart",
        )
    finally:
        out = stop(second)
    # The first transaction after the restart saw every tick since the stop at once.
    resumed_at, began_at = rows(
        engine,
        "SELECT j.created_at, b.xact_start FROM jobs j JOIN inserted_by b ON b.job_id = j.id "
        "WHERE (j.payload->>'scheduled_for')::timestamptz > :t ORDER BY j.created_at LIMIT 1",
        t=stopped_at,
    )[0]
    assert resumed_at - stopped_at > 5.5 * SECOND
    # The transaction planned its ticks at one clock reading (its locking statement's time):
    # after the transaction began and before its first insert. On a loaded host that span
    # can cross a second or a grace boundary, so any reading inside it is a valid plan.
    expected = [expected_after_outage(stopped_at, plan) for plan in readings(began_at, resumed_at)]
    observed = {}
    for name in schedules:
        after = [r for r in ticks(engine, name) if r.tick > stopped_at]
        restart_xact = min(after, key=lambda r: r.created_at).xact
        observed[name] = [r.tick for r in after if r.xact == restart_xact]
        later = [r.tick for r in after if r.xact != restart_xact]
        assert later and later[0] > observed[name][-1] and later == sorted(set(later)), name
    # One reading explains what every schedule enqueued at the restart.
    assert observed in expected, (observed, began_at, resumed_at, out)
    assert "missed tick(s) dropped" in out  # logged once per schedule that dropped


def skewed_worker(url: URL, offset: float) -> subprocess.Popen[str]:
    """A worker whose process sees its wall clock ``offset`` seconds off (skewed_worker.py)."""
    env = {
        **os.environ,
        "DATABASE_URL": url_text(url),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
        "SQLA_JOBS_TEST_CLOCK_OFFSET": str(offset),
    }
    return subprocess.Popen(
        [sys.executable, str(TESTS / "skewed_worker.py"), APP],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_workers_whose_wall_clock_is_an_hour_off_enqueue_no_early_extra_or_missing_tick(
    engine: sa.Engine, db_url: URL
) -> None:
    setup(engine)
    behind = skewed_worker(db_url, -3600)
    ahead = None
    try:
        # Alone, the worker an hour behind still enqueues every tick on time.
        wait_for(lambda: count(engine, "each") >= 3, timeout=60, message="ticks from behind")
        ahead = skewed_worker(db_url, +3600)
        started = ticks(engine, "each")[-1].tick
        wait_for(lambda: count(engine, "each", started) >= 4, timeout=60, message="more ticks")
    finally:
        outputs = [stop(w) for w in (behind, ahead) if w is not None]
    db_now = scalar(engine, "SELECT now()")
    for out, offset in zip(outputs, (-3600, 3600), strict=True):
        line = next(x for x in out.splitlines() if x.startswith("skewed wall clock: "))
        seen = datetime.fromisoformat(line.split(": ", 1)[1])
        assert abs((seen - db_now).total_seconds() - offset) < 600, out  # the skew was real
    found = ticks(engine, "each")
    assert contiguous([r.tick for r in found]), [r.tick.isoformat() for r in found]
    assert all(r.tick <= r.created_at for r in found)  # none early, by the database's clock
    assert found[-1].tick <= db_now
