"""Scenario 6: poison jobs and misbehaving handlers, in real worker processes."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import rows, scalar
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import (
    Supervisor,
    check_misbehaving,
)
from sqla_jobs import enqueue

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
    check_misbehaving(
        engine, db_url, tmp_path, MISBEHAVING, good_kind="work", args=("--concurrency", "1")
    )
