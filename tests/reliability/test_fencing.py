"""Fencing: a stale worker's late done-mark, retry, release and heartbeat change nothing.

A worker is frozen (SIGSTOP) past its lease while it holds jobs; other workers take them
over and are held inside their own runs; then the stale worker resumes and finishes its
runs. Its handlers write to ``writes``, which has no unique key, so no constraint can
refuse a stale write: only the fence (``status = 'running' AND worker = me AND attempts
= my attempt``) on the done-mark, the retry, the release and the heartbeat can. The
checks run while the replacement runs are still in progress, when a fence missing a
condition would find the row it must not touch.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import (
    count,
    freeze,
    open_gate,
    run_started,
    setup_gated,
    spawn,
    status_counts,
    stop_all,
)
from sqla_jobs import NewJob, enqueue, enqueue_many, ops

pytestmark = pytest.mark.reliability

STALE, OTHER = "stale", "other"
#: application_name of the stale worker's backends (see support.freeze).
STALE_APP = "sqla_jobs_stale_worker"
WARMUP = 20
#: Handler threads of the stale worker; every one of them is held in a gated run.
STALE_THREADS = 8
#: Jobs the stale worker claims ahead of its free slots (never started by it).
BUFFERED = 2


@dataclass(frozen=True)
class Case:
    """A job the stale worker holds, and who must own it after the takeover."""

    name: str
    payload: dict[str, Any]
    queue: str = "main"
    max_attempts: int = 5
    priority: int = 1
    #: (worker, attempt) of the replacement run; the stale run is always (STALE, 1).
    replacement: tuple[str, int] = (OTHER, 2)
    #: Started by the stale worker (False: only claimed into its buffer).
    started: bool = True


CASES = [
    # Another worker, another attempt: the fence's worker and attempt both differ.
    Case("write_takeover", {"write": True}),  # done-mark in the handler's transaction
    Case("noop_takeover", {}),  # batched done-mark
    Case("fail_takeover", {"write": True, "fail_on": [1]}),  # retry
    # Dead when its lease expired (last attempt), then retried by an operator: the
    # replacement runs attempt 1 again, so only the fence's worker condition differs.
    Case("write_reset", {"write": True}, max_attempts=1, replacement=(OTHER, 1)),
    Case("noop_reset", {}, max_attempts=1, replacement=(OTHER, 1)),
    # Taken over by a process with the same --worker-id (a restarted pod keeps its
    # name): only the fence's attempt condition differs.
    Case("write_same", {"write": True}, queue="same", replacement=(STALE, 2)),
    Case("noop_same", {}, queue="same", replacement=(STALE, 2)),
    Case("fail_same", {"write": True, "fail_on": [1]}, queue="same", replacement=(STALE, 2)),
    # Claimed into the stale worker's buffer, never started there: its shutdown release.
    *(Case(f"buffered_{i}", {"write": True}, priority=2, started=False) for i in range(BUFFERED)),
]
assert sum(c.started for c in CASES) == STALE_THREADS


def _state(engine: sa.Engine, job_id: int) -> dict[str, Any]:
    ((status, worker, attempts, lease_left, last_error),) = rows(
        engine,
        "SELECT status::text, worker, attempts, extract(epoch FROM locked_until - now()), "
        "coalesce(last_error, '') FROM jobs WHERE id = :i",
        i=job_id,
    )
    return {
        "status": status,
        "worker": worker,
        "attempts": attempts,
        "lease_held": lease_left is not None and lease_left > 0,
        "stale_error": "planned failure" in last_error,
        "writes": rows(engine, "SELECT worker, attempt FROM writes WHERE job_id = :i", i=job_id),
    }


def test_stale_worker_resumed_during_the_replacement_runs_changes_none_of_them(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_gated(engine)
    ids: dict[str, int] = {}
    with Session(engine) as s:
        # No-op jobs first: the stale worker learns its handlers' pace, so it buffers.
        enqueue_many(s, [NewJob("noop", {}, queue="main", priority=0) for _ in range(WARMUP)])
        for case in CASES:
            job_id = enqueue(
                s,
                "gated",
                case.payload,
                queue=case.queue,
                priority=case.priority,
                max_attempts=case.max_attempts,
            )
            assert job_id is not None
            ids[case.name] = job_id
        s.commit()
    logs = {name: tmp_path / f"{name}.log" for name in ("stale", "other", "same")}
    stale = spawn(
        db_url,
        logs["stale"],
        *("--worker-id", STALE, "--queues", "main,same", "--lock-seconds", "1"),
        *("--concurrency", str(STALE_THREADS), "--prefetch", str(BUFFERED)),
        # Bounded, so a slow exit (seen under heavy machine load, cause not found yet)
        # cannot outlast the wait below; what it did or left undone is checked either way.
        *("--shutdown-timeout", "10"),
        env={"PGAPPNAME": STALE_APP},
    )
    procs = [stale]
    try:
        started = [c for c in CASES if c.started]
        wait_for(
            lambda: (
                all(run_started(engine, ids[c.name], STALE, 1) for c in started)
                and count(engine, "SELECT count(*) FROM jobs WHERE status = 'running'")
                == len(CASES)
            ),
            message="stale worker running its gated jobs with the rest in its buffer",
        )
        freeze(stale, engine, STALE_APP)
        # Takeover: both rescue the expired leases; the jobs on their last attempt go
        # dead and an operator retries them.
        takeover = ("--lock-seconds", "30", "--rescue-interval", "0.3", "--concurrency", "8")
        procs.append(
            spawn(db_url, logs["other"], "--worker-id", OTHER, "--queues", "main", *takeover)
        )
        procs.append(
            spawn(db_url, logs["same"], "--worker-id", STALE, "--queues", "same", *takeover)
        )
        reset = [ids[c.name] for c in CASES if c.replacement[1] == 1]
        wait_for(
            lambda: (
                count(
                    engine,
                    "SELECT count(*) FROM jobs WHERE status = 'dead' AND id = ANY(:i)",
                    i=reset,
                )
                == len(reset)
            ),
            message="jobs on their last attempt dead after their lease expired",
        )
        with Session(engine) as s:
            assert ops.retry_jobs(s, reset) == len(reset)
            s.commit()
        wait_for(
            lambda: all(run_started(engine, ids[c.name], *c.replacement) for c in CASES),
            message="every job running again in its replacement run",
        )
        # The stale worker resumes, finishes its runs and stops (which releases its
        # buffer); its exit means every done-mark, retry and release it had was sent.
        for case in started:
            open_gate(engine, ids[case.name], STALE, 1)
        stale.send_signal(signal.SIGCONT)
        stale.send_signal(signal.SIGTERM)
        assert stale.wait(60) == 0
        if "shutdown timeout" in logs["stale"].read_text():
            print("the stale worker needed its shutdown timeout to exit")
        # The replacement runs are untouched: still running, same worker and attempt,
        # lease held, no stale write or error.
        states = {c.name: _state(engine, ids[c.name]) for c in CASES}
        untouched = {
            c.name: {
                "status": "running",
                "worker": c.replacement[0],
                "attempts": c.replacement[1],
                "lease_held": True,
                "stale_error": False,
                "writes": [],
            }
            for c in CASES
        }
        assert states == untouched, logs["stale"].read_text()[-3000:]
        for case in CASES:
            open_gate(engine, ids[case.name], *case.replacement)
        wait_for(
            lambda: status_counts(engine) == {"done": WARMUP + len(CASES)},
            message="every replacement run done",
        )
        for proc in procs[1:]:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        stop_all(procs)
    for case in CASES:
        job_id = ids[case.name]
        writes = [case.replacement] if case.payload.get("write") else []
        assert _state(engine, job_id) == {
            "status": "done",
            "worker": case.replacement[0],
            "attempts": case.replacement[1],
            "lease_held": False,
            "stale_error": False,
            "writes": writes,
        }, case.name
        expected_runs = [(STALE, 1)] if case.started else []
        assert rows(
            engine, "SELECT worker, attempt FROM runs WHERE job_id = :i ORDER BY id", i=job_id
        ) == [*expected_runs, case.replacement], case.name
    assert "claim lost" in logs["stale"].read_text()


def test_stale_worker_heartbeat_does_not_keep_a_dead_replacements_lease_alive(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    """The stale worker still holds its run of the job while the replacement's worker
    dies: the job must be rescued when the replacement's lease expires, which only
    happens if the stale worker's heartbeat (fenced) does not renew it."""
    setup_gated(engine)
    with Session(engine) as s:
        job_id = enqueue(s, "gated", {"write": True})
        s.commit()
    assert job_id is not None
    open_gate(engine, job_id, STALE, 3)  # the run after the rescue goes straight through
    short = ("--lock-seconds", "1", "--rescue-interval", "0.3", "--poll-interval", "0.2")
    stale_log, other_log = tmp_path / "stale.log", tmp_path / "other.log"
    stale = spawn(
        db_url,
        stale_log,
        *("--worker-id", STALE, "--concurrency", "2", *short),
        env={"PGAPPNAME": STALE_APP},
    )
    procs = [stale]
    try:
        wait_for(lambda: run_started(engine, job_id, STALE, 1), message="stale run started")
        freeze(stale, engine, STALE_APP)
        other = spawn(db_url, other_log, "--worker-id", OTHER, *short)
        procs.append(other)
        wait_for(lambda: run_started(engine, job_id, OTHER, 2), message="job taken over")
        stale.send_signal(signal.SIGCONT)  # its run of attempt 1 still waits at its gate
        other.send_signal(signal.SIGKILL)
        other.wait(10)
        wait_for(
            lambda: scalar(engine, "SELECT status::text FROM jobs") == "done",
            message="job rescued from the dead replacement and run again",
        )
        open_gate(engine, job_id, STALE, 1)
        stale.send_signal(signal.SIGTERM)
        assert stale.wait(30) == 0
    finally:
        stop_all(procs)
    assert rows(engine, "SELECT status::text, worker, attempts FROM jobs") == [("done", STALE, 3)]
    assert rows(engine, "SELECT worker, attempt FROM writes") == [(STALE, 3)]
    assert rows(engine, "SELECT worker, attempt FROM runs ORDER BY id") == [
        (STALE, 1),
        (OTHER, 2),
        (STALE, 3),
    ]


def test_a_workers_stale_run_ending_does_not_stop_the_heartbeat_of_its_new_run_of_the_job(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    """A worker frozen past its lease claims the job again once resumed, while its stale
    run of it is still in its handler. When the stale run ends (fenced out), the new run
    must keep its lease: still renewed by the heartbeat, never rescued from under it."""
    setup_gated(engine)
    with Session(engine) as s:
        job_id = enqueue(s, "gated", {"write": True})
        s.commit()
    assert job_id is not None
    short = ("--lock-seconds", "1", "--rescue-interval", "0.3", "--poll-interval", "0.2")
    log = tmp_path / "stale.log"
    stale = spawn(
        db_url,
        log,
        *("--worker-id", STALE, "--concurrency", "2", *short),
        env={"PGAPPNAME": STALE_APP},
    )
    procs = [stale]
    try:
        wait_for(lambda: run_started(engine, job_id, STALE, 1), message="first run started")
        freeze(stale, engine, STALE_APP)
        # A worker that serves another queue only rescues: the job is requeued, not taken.
        # (Had the stale worker resumed first, its heartbeat would rightly have renewed
        # the lease it still held, since nobody had taken the job.)
        rescuer = spawn(db_url, tmp_path / "rescuer.log", "--queues", "elsewhere", *short)
        procs.append(rescuer)
        wait_for(
            lambda: scalar(engine, "SELECT status::text FROM jobs") == "queued",
            message="the expired lease rescued",
        )
        stale.send_signal(signal.SIGCONT)  # claims the job again, its first run still going
        wait_for(lambda: run_started(engine, job_id, STALE, 2), message="second run started")
        open_gate(engine, job_id, STALE, 1)
        wait_for(lambda: "claim lost" in log.read_text(), message="first run fenced out")
        ended = scalar(engine, "SELECT clock_timestamp()")
        # The second run's lease (1 s) is renewed past the moment the first run ended.
        wait_for(
            lambda: scalar(
                engine,
                "SELECT locked_until > :t + interval '1.5 seconds' FROM jobs "
                "WHERE status = 'running' AND attempts = 2",
                t=ended,
            ),
            timeout=10,
            message="the second run's lease renewed after the first run ended",
        )
        open_gate(engine, job_id, STALE, 2)
        wait_for(lambda: scalar(engine, "SELECT status::text FROM jobs") == "done", message="done")
        stale.send_signal(signal.SIGTERM)
        assert stale.wait(30) == 0
    finally:
        stop_all(procs)
    assert rows(engine, "SELECT status::text, worker, attempts FROM jobs") == [("done", STALE, 2)]
    assert rows(engine, "SELECT worker, attempt FROM writes") == [(STALE, 2)]
    assert rows(engine, "SELECT worker, attempt FROM runs ORDER BY id") == [(STALE, 1), (STALE, 2)]
