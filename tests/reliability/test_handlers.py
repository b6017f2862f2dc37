"""Scenario 6: poison jobs and misbehaving handlers, in real worker processes."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import Supervisor, count, setup_app, spawn, status_counts, stop_all
from sqla_jobs import NewJob, enqueue, enqueue_many

pytestmark = pytest.mark.reliability

MAX_ATTEMPTS = 3


def test_poison_job_that_kills_its_worker_is_dead_after_exactly_max_attempts(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    with Session(engine) as s:
        enqueue(s, "kill_self", {}, max_attempts=MAX_ATTEMPTS)
        s.commit()
    sup = Supervisor(db_url, tmp_path, 1, "--lock-seconds", "1", "--rescue-interval", "0.3")
    deadline = time.monotonic() + 60
    try:
        # A supervisor loop: restart the worker whenever the poison job has killed it.
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
MISBEHAVING = [
    ("raise_base", {"which": "SystemExit"}, "builtins.SystemExit: 3"),
    ("raise_base", {"which": "KeyboardInterrupt"}, "builtins.KeyboardInterrupt"),
    ("raise_base", {"which": "BaseException"}, "builtins.BaseException: custom base"),
    ("misbehave", {"what": "commit"}, "sqla_jobs.exceptions.HandlerTransactionError"),
    ("misbehave", {"what": "commit_swallowed"}, "sqla_jobs.exceptions.HandlerTransactionError"),
    ("misbehave", {"what": "close"}, "sqla_jobs.exceptions.HandlerTransactionError"),
    ("misbehave", {"what": "invalidate"}, "sqla_jobs.exceptions.HandlerTransactionError"),
    ("misbehave", {"what": "sql_error"}, "sqlalchemy.exc.DataError"),
    ("sql_error_code", {"error": "deadlock"}, "sqlalchemy.exc.OperationalError"),
    ("sql_error_code", {"error": "serialization"}, "sqlalchemy.exc.OperationalError"),
]


def test_misbehaving_handlers_are_recorded_failures_with_no_partial_writes(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    with Session(engine) as s:
        # Each bad job is followed by a good one, all run one at a time by one process.
        for i, (kind, payload, _) in enumerate(MISBEHAVING):
            enqueue_many(
                s,
                [
                    NewJob(kind, {**payload, "i": i}, max_attempts=1),
                    NewJob("work", {"after": i}),
                ],
            )
        s.commit()
    proc = spawn(db_url, tmp_path / "worker.log", "--concurrency", "1")
    n = len(MISBEHAVING)
    try:
        wait_for(
            lambda: status_counts(engine) == {"dead": n, "done": n},
            timeout=60,
            message="every job has its outcome",
        )
        assert proc.poll() is None, "a handler took the worker down"
    finally:
        stop_all([proc])
    out = (tmp_path / "worker.log").read_text()
    errors = dict(
        rows(engine, "SELECT (payload->>'i')::int, last_error FROM jobs WHERE status = 'dead'")
    )
    for i, (kind, payload, head) in enumerate(MISBEHAVING):
        assert errors[i].startswith(head), (kind, payload, errors[i][:300])
        assert "Traceback" in errors[i]
    # Zero partial writes: the only effects are the good jobs' (each bad job wrote one
    # row before misbehaving, and all of those were rolled back).
    assert count(engine, "SELECT count(*) FROM effects") == n
    assert (
        count(
            engine,
            "SELECT count(*) FROM effects e JOIN jobs j ON j.id = e.job_id WHERE j.kind = 'work'",
        )
        == n
    )
    assert count(engine, "SELECT max(attempts) FROM jobs") == 1, out[-3000:]
