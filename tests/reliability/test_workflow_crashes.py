"""Workflows under crashes (#26): workers SIGKILLed during a fan-in (every step runs once,
the fan-in step once, and only after all of its dependencies); a stale worker's step
fenced out (it releases nothing)."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import rows, scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import (
    Supervisor,
    all_done,
    count,
    exactly_once,
    oracle,
    setup_app,
    spawn,
    status_counts,
    stop_all,
)
from sqla_jobs import Workflow

pytestmark = pytest.mark.reliability

WORKERS = 3
FAN = 60
STORM_SECONDS = 8.0


def test_workers_killed_during_a_fan_in_run_every_step_and_the_fan_in_once(
    engine: sa.Engine, db_url: URL, tmp_path: Path, rng: random.Random
) -> None:
    setup_app(engine)
    flow = Workflow()
    flow.add("root", "work", {"sleep": 0.05})
    parts = [
        flow.add(f"part{n}", "work", {"sleep": rng.uniform(0.05, 0.2)}, after="root")
        for n in range(FAN)
    ]
    flow.add("gather", "work", after=parts)
    with Session(engine) as s:
        ids = flow.enqueue(s)
        s.commit()
    sup = Supervisor(
        db_url,
        tmp_path,
        WORKERS,
        "--concurrency", "4",
        "--lock-seconds", "1",
        "--rescue-interval", "0.3",
        "--poll-interval", "0.5",
    )  # fmt: skip
    try:
        sup.ensure()
        storm_end = time.monotonic() + STORM_SECONDS
        while time.monotonic() < storm_end:
            time.sleep(rng.uniform(0.2, 0.5))  # pacing the storm, not synchronisation
            sup.kill_random(rng)
            sup.ensure()
        wait_for(lambda: all_done(engine, FAN + 2), timeout=120, message="every step done")
    finally:
        out = sup.stop()
    print(f"fan-in storm: {sup.kills} SIGKILLs, {status_counts(engine)}")
    assert oracle(engine) == exactly_once(FAN + 2), out[-3000:]
    # The fan-in's one effect came from a run that started after every part had ended.
    (gather,) = rows(
        engine,
        "SELECT g.attempted_at >= (SELECT max(p.finished_at) FROM jobs AS p "
        "WHERE p.workflow_id = g.workflow_id AND p.step LIKE 'part%') AS after_all "
        "FROM jobs AS g WHERE g.id = :id",
        id=ids["gather"],
    )
    assert gather.after_all
    # No step waits on an edge left open (a part's edge from "split", its only parent, is
    # left unwritten when split ends done: revision 0020).
    open_edges = rows(
        engine,
        "SELECT count(*) AS n FROM jobs_workflow_edges AS e JOIN jobs AS c ON c.id = e.child_id "
        "WHERE e.parent_outcome IS NULL AND c.status = 'waiting'",
    )
    assert open_edges[0].n == 0


def test_a_stale_workers_step_is_fenced_out_and_releases_nothing(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    setup_app(engine)
    flow = Workflow()
    flow.add("a", "work", {"sleep": 2, "log": True})
    flow.add("b", "work", {"log": True}, after="a")
    with Session(engine) as s:
        ids = flow.enqueue(s)
        s.commit()
    stale_log, other_log = tmp_path / "stale.log", tmp_path / "other.log"
    stale = spawn(db_url, stale_log, "--lock-seconds", "1", "--worker-id", "stale")
    procs = [stale]
    try:
        wait_for(lambda: count(engine, "SELECT count(*) FROM runs"), message="stale started a")
        stale.send_signal(signal.SIGSTOP)
        procs.append(
            spawn(
                db_url,
                other_log,
                *("--lock-seconds", "5", "--rescue-interval", "0.3", "--worker-id", "other"),
            )
        )
        wait_for(
            lambda: count(engine, "SELECT count(*) FROM runs WHERE worker = 'other'"),
            message="the other worker took a over",
        )
        # The stale run wakes while the new run of a still sleeps: its done-mark (and the
        # release of b with it) must not go through.
        stale.send_signal(signal.SIGCONT)
        wait_for(lambda: "claim lost" in stale_log.read_text(), message="stale fenced")
        wait_for(
            lambda: (
                scalar(engine, "SELECT status::text FROM jobs WHERE id = :id", id=ids["b"])
                == "done"
            ),
            timeout=60,
            message="b done",
        )
        stale.send_signal(signal.SIGTERM)
        assert stale.wait(30) == 0
    finally:
        stop_all(procs)
    assert oracle(engine) == exactly_once(2)
    runs = rows(
        engine, "SELECT job_id, worker, attempt, started_at, ended_at FROM runs ORDER BY id"
    )
    # b ran once, on whichever worker (the resumed one is a live worker like any other).
    assert [(r.job_id, r.worker, r.attempt) for r in runs[:2]] == [
        (ids["a"], "stale", 1),
        (ids["a"], "other", 2),
    ]
    assert [(r.job_id, r.attempt) for r in runs[2:]] == [(ids["b"], 1)]
    # b started only after the run of a that counted had ended.
    assert runs[2].started_at >= runs[1].ended_at
