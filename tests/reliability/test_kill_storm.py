"""Scenario 1: a kill storm. SIGKILL random workers for 20 s; nothing is lost or doubled."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import (
    Supervisor,
    all_done,
    count,
    exactly_once,
    oracle,
    setup_app,
    status_counts,
)
from sqla_jobs import NewJob, enqueue_many

pytestmark = pytest.mark.reliability

WORKERS = 4
JOBS = 2_000
STORM_SECONDS = 20.0


def test_kill_storm_loses_no_job_and_doubles_no_effect(
    engine: sa.Engine, db_url: URL, tmp_path: Path, rng: random.Random
) -> None:
    setup_app(engine)
    with Session(engine) as s:
        # Handlers take 40-120 ms, so every kill lands on jobs in flight.
        # With a timeout (far above the handlers' time), so every job also runs the
        # deadline machinery: statement_timeout, the deadline watch, the reset before the
        # done-mark (revision 0005).
        enqueue_many(
            s,
            [NewJob("work", {"sleep": rng.uniform(0.04, 0.12)}, timeout=30) for _ in range(JOBS)],
        )
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
        done_at_storm_end = 0
        done_mid_storm = None
        while time.monotonic() < storm_end:
            if done_mid_storm is None and storm_end - time.monotonic() < STORM_SECONDS / 2:
                done_mid_storm = status_counts(engine).get("done", 0)
            time.sleep(rng.uniform(0.2, 0.5))  # pacing the storm, not synchronisation
            sup.kill_random(rng)
            sup.ensure()
        done_at_storm_end = status_counts(engine).get("done", 0)
        wait_for(lambda: all_done(engine, JOBS), timeout=120, message="all jobs done")
    finally:
        out = sup.stop()
    figures = oracle(engine)
    print(
        f"kill storm: {sup.kills} SIGKILLs, {len(sup.procs)} processes, "
        f"{done_at_storm_end}/{JOBS} done when the storm ended, "
        f"{count(engine, 'SELECT count(*) FROM jobs WHERE attempts > 1')} jobs run again"
    )
    assert figures == exactly_once(JOBS), out[-3000:]
    assert sup.kills >= STORM_SECONDS / 0.5
    # The storm really hit running jobs: some of them had to be run again.
    assert count(engine, "SELECT count(*) FROM jobs WHERE attempts > 1") > 0
    assert done_mid_storm is not None and done_mid_storm < JOBS, "the storm hit an empty queue"
