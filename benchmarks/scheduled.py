"""How late scheduled jobs start on an idle worker (issue #23, target 5).

ONE worker process (``benchapp:registry``, concurrency 4, the default 1 s poll) is
started and idle; then ``stamp`` jobs are enqueued in one transaction with ``delay=``
spread evenly over 0.05-5 s. Each handler stamps its start (``time.time()``); its
lateness is that minus the job's ``run_at`` (the server's clock, the same machine's).
Without a timer an idle worker finds such a job at its next poll: up to a poll interval
late.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from sqla_jobs import NewJob, enqueue_many

#: The issue's target (#23): an idle worker starts a job within this of its run_at.
TARGET_MS = 20.0
EARLIEST, LATEST = 0.05, 5.0


def lateness(n_jobs: int) -> list[float]:
    """Milliseconds from each job's ``run_at`` to its handler's start."""
    import run

    with run._ours("bench_scheduled") as url:
        worker = run.WorkerProcess(url, "--concurrency", "4")
        try:
            worker.wait_ready()
            step = (LATEST - EARLIEST) / max(1, n_jobs - 1)
            with run._engine(url) as engine, Session(engine) as s:
                enqueue_many(
                    s, [NewJob("stamp", {}, delay=EARLIEST + i * step) for i in range(n_jobs)]
                )
                s.commit()
            run._wait_all_done(url)
        finally:
            worker.stop()
        with psycopg.connect(url) as conn:
            late = conn.execute(
                "SELECT (p.started - extract(epoch FROM j.run_at)) * 1000"
                " FROM bench_pickup p JOIN jobs j ON j.id = p.job_id"
            ).fetchall()
    assert len(late) == n_jobs, (len(late), n_jobs)
    return sorted(float(r[0]) for r in late)


def section(quick: bool, step: Callable[[str], None]) -> list[Any]:
    """The ``scheduled`` rows of ``run.py``'s table."""
    import run

    n_jobs = 25 if quick else 100
    step(f"scheduled: {n_jobs} jobs due {EARLIEST}-{LATEST} s ahead, idle worker")
    late = lateness(n_jobs)
    rows = []
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        value = run._percentile(late, q)
        rows.append(
            run.Row(
                "scheduled",
                f"{label} lateness, {n_jobs} jobs due {EARLIEST}-{LATEST} s ahead, idle worker"
                " (poll 1 s): handler start - run_at",
                value,
                "ms",
                target=f"<= {TARGET_MS:g} ms",
                met=value <= TARGET_MS,
            )
        )
    return rows
