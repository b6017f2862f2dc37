"""Scenario 7: the crash scenarios again, for ``async def`` handlers in real worker processes.

The workers load ``asyncapp:registry`` (tests/asyncapp.py): the same oracle as the
sync scenarios (``effects`` written in the handler's transaction, ``runs`` written
outside it), the same exact assertions.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import (
    GATED_SQL,
    Supervisor,
    all_done,
    check_misbehaving,
    count,
    exactly_once,
    oracle,
    setup_app,
    spawn,
    status_counts,
    stop_all,
)
from sqla_jobs import NewJob, enqueue, enqueue_many, ops
from sqla_jobs.worker._async_executor import ASYNC_SWITCH_INTERVAL

pytestmark = pytest.mark.reliability

APP = "asyncapp:registry"
WORKERS = 2
JOBS = 300
KILLS = 8


def test_kill_storm_of_async_workers_loses_no_job_and_doubles_no_effect(
    engine: sa.Engine, db_url: URL, tmp_path: Path, rng: random.Random
) -> None:
    setup_app(engine)
    with Session(engine) as s:
        # 100-300 ms handlers, 4 at a time per worker: every kill lands on jobs in flight.
        enqueue_many(s, [NewJob("aeffect", {"sleep": rng.uniform(0.1, 0.3)}) for _ in range(JOBS)])
        s.commit()
    sup = Supervisor(
        db_url,
        tmp_path,
        WORKERS,
        "--async-concurrency", "4",
        "--lock-seconds", "1",
        "--rescue-interval", "0.3",
        "--poll-interval", "0.5",
        app=APP,
    )  # fmt: skip
    try:
        sup.ensure()
        done_mid_storm = None
        while sup.kills < KILLS:
            if done_mid_storm is None and sup.kills >= KILLS // 2:
                done_mid_storm = status_counts(engine).get("done", 0)
            # Pacing the storm, not synchronisation; slower than the sync storm's: with
            # two workers, a worker must live long enough to start and claim. Each kill
            # hits a worker holding a running job (a loaded host starts workers slowly).
            time.sleep(rng.uniform(0.6, 1.2))
            sup.kill_busy(engine, rng)
            sup.ensure()
        wait_for(lambda: all_done(engine, JOBS), timeout=120, message="all jobs done")
    finally:
        out = sup.stop()
    run_again = count(engine, "SELECT count(*) FROM jobs WHERE attempts > 1")
    print(f"async kill storm: {sup.kills} SIGKILLs, {len(sup.procs)} processes, {run_again} rerun")
    assert oracle(engine) == exactly_once(JOBS), out[-3000:]
    assert run_again > 0  # the storm really hit running jobs
    assert done_mid_storm is not None and done_mid_storm < JOBS, "the storm hit an empty queue"


def test_stale_async_worker_resumed_after_takeover_is_fenced_and_rolls_back(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    """The stale run writes to a table without a unique key: its write cannot fail on the
    replacement's row, so only the done-mark's fence, in the same transaction, keeps it out."""
    setup_app(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(GATED_SQL)
    with Session(engine) as s:
        job_id = enqueue(s, "aeffect", {"sleep": 2, "log": True, "writes": True})
        s.commit()
    stale_log, other_log = tmp_path / "stale.log", tmp_path / "other.log"
    stale = spawn(db_url, stale_log, "--lock-seconds", "1", "--worker-id", "stale", app=APP)
    procs = [stale]
    try:
        wait_for(lambda: count(engine, "SELECT count(*) FROM runs"), message="stale started")
        stale.send_signal(signal.SIGSTOP)
        procs.append(
            spawn(
                db_url,
                other_log,
                *("--lock-seconds", "5", "--rescue-interval", "0.3", "--worker-id", "other"),
                app=APP,
            )
        )
        wait_for(
            lambda: scalar(engine, "SELECT status::text FROM jobs") == "done",
            message="other worker finished the job",
        )
        stale.send_signal(signal.SIGCONT)
        wait_for(lambda: "claim lost" in stale_log.read_text(), message="stale fenced")
        stale.send_signal(signal.SIGTERM)
        assert stale.wait(30) == 0
    finally:
        stop_all(procs)
    assert rows(engine, "SELECT job_id, worker, attempt FROM writes") == [(job_id, "other", 2)]
    assert rows(engine, "SELECT worker, attempts, status::text FROM jobs") == [("other", 2, "done")]
    assert rows(engine, "SELECT worker, attempt FROM runs ORDER BY attempt") == [
        ("stale", 1),
        ("other", 2),
    ]


MAX_ATTEMPTS = 3


def test_async_poison_job_that_kills_its_worker_is_dead_after_exactly_max_attempts(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    with Session(engine) as s:
        enqueue(s, "akill_self", {}, max_attempts=MAX_ATTEMPTS)
        s.commit()
    sup = Supervisor(
        db_url, tmp_path, 1, "--lock-seconds", "1", "--rescue-interval", "0.3", app=APP
    )
    deadline = time.monotonic() + 60
    try:
        while scalar(engine, "SELECT status::text FROM jobs") != "dead":
            assert time.monotonic() < deadline, "the poison job never went dead"
            sup.ensure()
            time.sleep(0.05)
        killed = [p for p in sup.procs if p.poll() == -signal.SIGKILL]
    finally:
        out = sup.stop()
    attempts, error, worker = rows(engine, "SELECT attempts, last_error, worker FROM jobs")[0]
    assert attempts == MAX_ATTEMPTS, out
    assert len(killed) == MAX_ATTEMPTS  # one worker process per claim
    assert error == (
        f"lease expired during attempt {MAX_ATTEMPTS} of {MAX_ATTEMPTS}: worker {worker} "
        "stopped heartbeating (killed, crashed or lost its connection)"
    )


#: (kind, payload) -> the exception named at the head of last_error.
MISBEHAVING: list[tuple[str, dict[str, Any], str]] = [
    ("araise_base", {"which": "SystemExit"}, "builtins.SystemExit: 3"),
    ("araise_base", {"which": "KeyboardInterrupt"}, "builtins.KeyboardInterrupt"),
    ("araise_base", {"which": "BaseException"}, "builtins.BaseException: custom base"),
    (
        "araise_base",
        {"which": "CancelledError"},
        "asyncio.exceptions.CancelledError: raised by the handler",
    ),
    ("arefused", {"route": "session.commit()"}, "sqla_jobs.exceptions.HandlerTransactionError"),
    (
        "arefused",
        {"route": "session.commit()", "swallow": True},
        "sqla_jobs.exceptions.HandlerTransactionError",
    ),
    ("arefused", {"route": "session.close()"}, "sqla_jobs.exceptions.HandlerTransactionError"),
    (
        "arefused",
        {"route": "connection.invalidate()"},
        "sqla_jobs.exceptions.HandlerTransactionError",
    ),
    ("asql_error", {}, "sqlalchemy.exc.DataError"),
]


def test_misbehaving_async_handlers_are_recorded_failures_with_no_partial_writes(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    check_misbehaving(
        engine,
        db_url,
        tmp_path,
        MISBEHAVING,
        good_kind="aeffect",
        args=("--async-concurrency", "1"),
        app=APP,
    )


def test_an_async_handler_blocking_the_loop_past_its_lease_keeps_it_and_runs_once(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    """time.sleep in an async handler stalls the loop, not the lease keeper's thread."""
    setup_app(engine)
    with Session(engine) as s:
        job_id = enqueue(s, "aeffect", {"block": 5, "log": True})
        s.commit()
    # A second worker with a fast rescuer takes the job the moment its lease expires. The
    # lease is 2 s (renewed every 0.67 s): with 1 s this failed once in about ten runs on
    # the loaded shared machine (output not kept; a beat later than 0.33 s is the likely
    # cause), which is not what this test is about.
    args = ("--lock-seconds", "2", "--rescue-interval", "0.2", "--poll-interval", "0.2")
    procs = [spawn(db_url, tmp_path / "first.log", *args, app=APP)]
    try:
        wait_for(lambda: count(engine, "SELECT count(*) FROM runs"), message="handler started")
        procs.append(spawn(db_url, tmp_path / "second.log", *args, app=APP))
        wait_for(lambda: all_done(engine, 1), timeout=60, message="job done")
    finally:
        stop_all(procs)
    assert rows(engine, "SELECT attempts FROM jobs") == [(1,)]
    assert count(engine, "SELECT count(*) FROM runs WHERE job_id = :j", j=job_id) == 1
    assert oracle(engine) == exactly_once(1)
    assert "lease expired" not in (tmp_path / "second.log").read_text()


def test_sigterm_drains_async_handlers_and_cancels_those_past_the_timeout_into_their_leases(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    with Session(engine) as s:
        short = enqueue_many(s, [NewJob("aeffect", {"sleep": 1.0, "log": True}) for _ in range(3)])
        # 60 s on its first attempt only: cancelled at the timeout, then done on attempt 2.
        long_id = enqueue(s, "aeffect", {"sleep": 60, "first_only": True, "log": True})
        queued = enqueue_many(s, [NewJob("aeffect", priority=5) for _ in range(20)])
        s.commit()
    log = tmp_path / "worker.log"
    args = ("--async-concurrency", "4", "--lock-seconds", "1", "--shutdown-timeout", "3")
    first = spawn(db_url, log, *args, app=APP)
    procs = [first]
    try:
        wait_for(lambda: count(engine, "SELECT count(*) FROM runs") == 4, message="4 running")
        signalled_at = scalar(engine, "SELECT clock_timestamp()")
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
        out = log.read_text()
        by_status = dict(rows(engine, "SELECT status::text, count(*) FROM jobs GROUP BY 1"))
        # The three short ones finished within the timeout; the long one was cancelled
        # and left running under its lease; nothing else was claimed after the signal.
        assert by_status == {"done": 3, "running": 1, "queued": len(queued)}, out[-3000:]
        assert count(engine, "SELECT count(*) FROM runs WHERE started_at > :t", t=signalled_at) == 0
        assert "cancelled at the shutdown timeout" in out
        assert sorted(r[0] for r in rows(engine, "SELECT job_id FROM effects")) == sorted(short)
        procs.append(spawn(db_url, log, "--rescue-interval", "0.3", app=APP))
        wait_for(lambda: all_done(engine, 24), message="all done after the takeover")
    finally:
        stop_all(procs)
    ((attempts,),) = rows(engine, "SELECT attempts FROM jobs WHERE id = :i", i=long_id)
    assert attempts == 2
    assert oracle(engine)["effect_not_from_final_run"] == 0
    assert count(engine, "SELECT count(*) FROM effects") == 24


def test_a_worker_process_with_async_handlers_shortens_the_gil_switch_interval(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    """The event loop's thread holds the GIL through runs of short jobs: the CLI's worker
    process lets the dispatcher and completer have it sooner (ASYNC_SWITCH_INTERVAL)."""
    setup_app(engine)
    with Session(engine) as s:
        job_id = enqueue(s, "aswitch_interval")
        s.commit()
    assert job_id is not None
    proc = spawn(db_url, tmp_path / "worker.log", app=APP)
    try:
        wait_for(lambda: all_done(engine, 1), message="job done")
    finally:
        stop_all([proc])
    with Session(engine) as s:
        assert ops.result(s, job_id) == ASYNC_SWITCH_INTERVAL != sys.getswitchinterval()
