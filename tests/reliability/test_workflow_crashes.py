"""Workflows under crashes (#26): workers SIGKILLed during a fan-in; every step runs once,
the fan-in step once, and only after all of its dependencies."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import rows, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import (
    Supervisor,
    all_done,
    exactly_once,
    oracle,
    setup_app,
    status_counts,
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
    assert (
        rows(engine, "SELECT count(*) AS n FROM jobs_workflow_edges WHERE parent_outcome IS NULL")[
            0
        ].n
        == 0
    )
