"""How busy limited kinds and queues keep their slots (issue #23, target 1).

``benchapp:slots`` runs 10 ms jobs of a kind limited to 1 and one limited to 4 (and of
unlimited kinds in queues limited to 1 and 4); each job logs its handler's start and end
(``time.time()``, one machine's clock) in ``bench_slots``. ``W`` worker processes at
concurrency 8 are started and ready first; then the jobs are enqueued in one
transaction. Utilisation = handler time / (limit x span from the first start to the last
end): 1.0 means a slot was never idle between the jobs. The same log checks the limit
(the most handler runs of the scope overlapping at any instant).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from sqla_jobs import NewJob, enqueue_many

#: scope -> (kind to enqueue, its limit)
SCOPES = {
    "one": ("one", "default", 1),
    "four": ("four", "default", 4),
    "q1": ("q1work", "q1", 1),
    "q4": ("q4work", "q4", 4),
}


@dataclass(frozen=True)
class Busy:
    utilisation: float
    overlap: int  # the most runs of the scope at one instant
    per_second: float
    limit: int


def slots_busy(scope: str, n_jobs: int, processes: int, concurrency: int = 8) -> Busy:
    """``n_jobs`` 10 ms jobs of ``scope`` (see SCOPES) drained by ``processes`` workers."""
    import run  # the harness (worker processes, scratch databases)

    kind, queue, limit = SCOPES[scope]
    app = "benchapp:slots" if queue == "default" else "benchapp:slot_queues"
    with run._ours("bench_slots") as url:
        workers = [
            run.WorkerProcess(url, "--concurrency", str(concurrency), app=app)
            for _ in range(processes)
        ]
        try:
            for w in workers:
                w.wait_ready()
            with run._engine(url) as engine, Session(engine) as s:
                enqueue_many(s, [NewJob(kind, {}, queue=queue) for _ in range(n_jobs)])
                s.commit()
            run._wait_all_done(url)
        finally:
            for w in workers:
                w.stop()
        with psycopg.connect(url) as conn:
            marks = conn.execute(
                "SELECT started, ended FROM bench_slots WHERE scope = %s", (scope,)
            ).fetchall()
    assert len(marks) == n_jobs, (len(marks), n_jobs)
    span = max(e for _, e in marks) - min(s for s, _ in marks)
    busy = sum(e - s for s, e in marks)
    return Busy(busy / (limit * span), max_overlap(marks), n_jobs / span, limit)


def max_overlap(marks: list[tuple[float, float]]) -> int:
    """The most [start, end) intervals covering one instant."""
    events = sorted([(s, 1) for s, _ in marks] + [(e, -1) for _, e in marks])
    most = running = 0
    for _, step in events:  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most


#: The issue's target (#23): each limit's slots busy at least this share of the span.
TARGET = 0.8


def section(quick: bool, step: Callable[[str], None]) -> list[Any]:
    """The ``slots`` rows of ``run.py``'s table: utilisation at 1, 2 and 4 workers."""
    import run

    rows: list[Any] = []
    for scope, (_, queue, limit) in SCOPES.items():
        n_jobs = (100 if quick else 300) * (2 if limit > 1 else 1)
        what = f"{'queue' if queue != 'default' else 'kind'} limited to {limit}"
        for processes in (1, 2, 4):
            step(f"slots: {what}, {processes} worker(s)")
            busy = slots_busy(scope, n_jobs, processes)
            if busy.overlap > limit:  # the benchmark checks the limit too
                raise AssertionError(f"{what}: {busy.overlap} ran at once")
            met = busy.utilisation >= TARGET
            rows.append(
                run.Row(
                    "slots",
                    f"{n_jobs:,} 10 ms jobs, {what}, {processes} x concurrency 8: busy"
                    f" (most at once {busy.overlap}, {busy.per_second:,.0f} jobs/s)",
                    busy.utilisation,
                    "%",
                    target=f">= {TARGET:.0%}",
                    met=met,
                )
            )
    return rows
