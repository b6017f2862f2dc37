"""A job committed while its worker goes from busy to idle is woken for, not polled for.

Revision 0003 decided at INSERT time whether to notify; a job inserted while the only
worker was busy, whose transaction committed after the worker had gone idle and looked
at the table, waited for the poll. Revision 0007 decides at commit, under a lock that
a worker going idle waits out. Each test holds a producer's transaction open across the
worker's busy -> idle transition, at one of the two moments that matter, with the poll
and rescue intervals at 60 s: only a notification (or the claim after the wait) can
bring the job to the worker within NOTIFIED seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import open_gate, setup_gated, spawn, stop_all
from sqla_jobs import enqueue
from sqla_jobs.sql import locks
from sqla_jobs.worker import _dispatcher

pytestmark = pytest.mark.reliability

ARGS = ("--concurrency", "1", "--poll-interval", "60", "--rescue-interval", "60")
#: Well below the poll interval: a job done this soon was not found by a poll.
NOTIFIED = 10.0
#: The test's own advisory lock: a producer's commit waits for it in a later trigger.
HOLD_KEY = 4242

_LOCKS = """
SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database
                                             WHERE datname = current_database())
   AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1
   AND mode = :mode AND granted = :granted
"""


def _locks(engine: sa.Engine, key: int, mode: str, granted: bool) -> int:
    return int(
        scalar(engine, _LOCKS, hi=key >> 32, lo=key & 0xFFFFFFFF, mode=mode, granted=granted)
    )


def _idle_flag_up(engine: sa.Engine) -> bool:
    return _locks(engine, locks.IDLE_LOCK_KEY, "ShareLock", True) > 0


def _status(engine: sa.Engine, job_id: int) -> str:
    return str(scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id))


@pytest.fixture
def busy_worker(engine: sa.Engine, db_url: URL, tmp_path: Path) -> Iterator[int]:
    """A worker of concurrency 1, busy with a ``gated`` job (its idle flag down); yields
    that job's id. The test opens its gate to make the worker idle."""
    setup_gated(engine)
    proc = spawn(db_url, tmp_path / "worker.log", *ARGS)
    try:
        wait_for(lambda: _idle_flag_up(engine), message="the idle worker raises its flag")
        with Session(engine) as s:
            gated = enqueue(s, "gated", {})
            s.commit()
        assert gated is not None
        # A claim that came back full (1 of 1) lowers the flag: the worker is busy.
        wait_for(lambda: _status(engine, gated) == "running", message="the gated job runs")
        wait_for(lambda: not _idle_flag_up(engine), message="the busy worker lowers its flag")
        yield gated
    finally:
        stop_all([proc])


def _let_it_finish(engine: sa.Engine, job_id: int) -> None:
    worker = scalar(engine, "SELECT worker FROM jobs WHERE id = :i", i=job_id)
    open_gate(engine, job_id, worker, 1)
    wait_for(lambda: _status(engine, job_id) == "done", message="the gated job is done")


def test_a_job_whose_transaction_stays_open_while_the_worker_goes_idle_is_notified(
    engine: sa.Engine, busy_worker: int
) -> None:
    with Session(engine) as producer:
        job_id = enqueue(producer, "work", {})  # inserted while the worker is busy
        producer.flush()
        _let_it_finish(engine, busy_worker)
        wait_for(lambda: _idle_flag_up(engine), message="the worker goes idle")
        # Longer than the look revision 0003's workers took 50 ms after raising the flag:
        # without a decision at commit, only the 60 s poll would find the job now.
        threading.Event().wait(_dispatcher.IDLE_RECHECK_SECONDS * 10)
        producer.commit()
    assert job_id is not None
    wait_for(
        lambda: _status(engine, job_id) == "done",
        timeout=NOTIFIED,
        message="the job committed after the worker went idle picked up without a poll",
    )


def test_a_commit_in_flight_while_the_worker_goes_idle_is_waited_out_and_claimed(
    engine: sa.Engine, busy_worker: int
) -> None:
    # A second deferred trigger, after jobs_notify (by name), holds the producer's
    # commit after jobs_notify decided "no worker waits" and before the job is visible.
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"PERFORM pg_advisory_xact_lock_shared({HOLD_KEY}); RETURN NULL; END $$"
        )
        conn.exec_driver_sql(
            "CREATE CONSTRAINT TRIGGER zz_hold_commit AFTER INSERT ON jobs "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
            "WHEN (NEW.kind = 'work') EXECUTE FUNCTION hold_commit()"
        )
    ids: list[int | None] = []

    def produce() -> None:
        with Session(engine) as s:
            ids.append(enqueue(s, "work", {}))
            s.commit()

    with engine.connect() as hold:
        hold.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": HOLD_KEY})
        producer = threading.Thread(target=produce)
        producer.start()
        wait_for(
            lambda: _locks(engine, HOLD_KEY, "ShareLock", False),
            message="the producer's commit is held, past its notify decision",
        )
        _let_it_finish(engine, busy_worker)
        wait_for(lambda: _idle_flag_up(engine), message="the worker goes idle")
        # The worker has claimed (nothing: the job is not visible) and looks for commits
        # in flight. Held longer than the second look revision 0003's workers took 50 ms
        # after raising the flag: only waiting for the commit in flight finds the job.
        threading.Event().wait(_dispatcher.IDLE_RECHECK_SECONDS * 10)
        hold.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": HOLD_KEY})
        hold.commit()
        producer.join(30)
    assert ids and ids[0] is not None
    job_id = ids[0]
    wait_for(
        lambda: _status(engine, job_id) == "done",
        timeout=NOTIFIED,
        message="the job whose commit was in flight picked up without a poll",
    )
