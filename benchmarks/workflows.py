"""Workflows (#26): what a dependency costs, side by side with independent jobs, in one run.

Two parts, each in a scratch database of its own:

* ``contention``: ``THREADS`` connections each end ``N`` running jobs one per
  transaction (the fenced done-mark a handler that wrote commits with), as workers do.
  The jobs are independent (with revision 0014's triggers dropped, then with them),
  the ``N`` parents of one fan-in step (``N -> 1``: every
  transaction runs the release trigger on the same child), or ``N`` parents of one
  step each (``N -> N``: the trigger's work without the shared child). Reported: jobs
  per second and the ratio to independent jobs.
* ``drain``: one worker process (concurrency 4) runs ``N`` independent no-op jobs
  (without, then with the triggers), a
  ``1 -> N`` fan-out, an ``N -> 1`` fan-in, and a chain of ``CHAIN`` steps; reported
  per-step wall time (from the first start to the last finish, by the jobs' own
  timestamps), and for the chain the pickup latency of each step (from its parent's
  finish to its own start).

    python benchmarks/workflows.py [N] [--threads 8] [--chain 1000] [--only drain]

``run.py --only workflows`` runs the drain part at the issue's sizes (``N`` = 10,000, a
chain of 1,000; ``--quick``: 1,000 and 100) and adds its rows to the table.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from sqla_jobs import NewJob, Workflow, enqueue_many  # noqa: E402

CLAIM_ALL = (
    "UPDATE jobs SET status = 'running', worker = 'bench', attempts = 1, max_attempts = 1, "
    "locked_until = now() + interval '1 hour' WHERE status = 'queued' AND kind = 'noop'"
)
#: Revision 0014's triggers on jobs (what jobs outside workflows pay for them).
WORKFLOW_TRIGGERS = (
    "jobs_workflow_step_ended",
    "jobs_workflow_step_deleted",
    "jobs_workflow_updated",
    "jobs_workflow_deleted",
    "jobs_notify_released",
)
DONE_ONE = (
    "UPDATE jobs SET status = 'done', finished_at = statement_timestamp(), locked_until = NULL "
    "WHERE id = %s AND attempts = 1 AND status = 'running' AND worker = 'bench'"
)


def _build(url: str, shape: str, n: int) -> list[int]:
    """Insert the shape; return the ids of the ``n`` jobs the threads will end."""
    with run._engine(url) as engine, Session(engine) as s:
        if shape == "independent":
            ids = enqueue_many(s, [NewJob("noop") for _ in range(n)])
        else:
            flow = Workflow()
            parents = [flow.add(f"p{i}", "noop") for i in range(n)]
            if shape == "fan-in":
                flow.add("child", "noop", after=parents)
            else:
                for i, p in enumerate(parents):
                    flow.add(f"c{i}", "noop", after=p)
            made = flow.enqueue(s)
            ids = [made[p] for p in parents]
        s.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CLAIM_ALL)
    return ids


def _end_all(url: str, ids: list[int], threads: int) -> float:
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for job_id in ids:
        todo.put(job_id)
    start = threading.Barrier(threads + 1)

    def work() -> None:
        with psycopg.connect(url) as conn:
            start.wait()
            while True:
                try:
                    job_id = todo.get_nowait()
                except queue.Empty:
                    return
                with conn.transaction():
                    conn.execute(DONE_ONE, (job_id,))

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in pool:
        t.join()
    return time.perf_counter() - began


def contention(n: int, threads: int) -> None:
    print(f"contention: {n} done-marks, one per transaction, {threads} connections")
    base = None
    for shape in ("no triggers", "independent", "fan-in", "fan-out 1:1"):
        with run._ours("bench_flows") as url:
            if shape == "no triggers":
                with psycopg.connect(url, autocommit=True) as conn:
                    for trigger in WORKFLOW_TRIGGERS:
                        conn.execute(f"DROP TRIGGER {trigger} ON jobs")
            ids = _build(url, "independent" if shape == "no triggers" else shape, n)
            seconds = _end_all(url, ids, threads)
            with psycopg.connect(url) as conn:
                waiting = conn.execute("SELECT count(*) FROM jobs WHERE status = 'waiting'")
                left = waiting.fetchone()
        rate = n / seconds
        base = base or rate
        print(
            f"  {shape:<12} {rate:8.0f} jobs/s  ({seconds:.2f}s; {base / rate:.2f}x the time "
            f"without the triggers; still waiting after: {left[0] if left else '?'})"
        )


def _span(url: str, where: str = "") -> tuple[float, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(attempted_at)), count(*) "
            f"FROM jobs {where}"
        ).fetchone()
    assert row is not None
    return float(row[0]), int(row[1])


#: The issue's sizes (#26): a 1 -> 10,000 fan-out, a 10,000 -> 1 fan-in, a 1,000-step
#: chain; ``--quick``: a tenth.
FULL_SIZES = (10_000, 1_000)
QUICK_SIZES = (1_000, 100)
#: The issue's target: a step costs at most this many times an independent job.
TARGET_RATIO = 1.5
SHAPES = ("no triggers", "independent", "fan-out 1->N", "fan-in N->1", "chain")


def _flow(shape: str, n: int, chain: int) -> Workflow:
    flow = Workflow()
    if shape == "fan-out 1->N":
        flow.add("root", "noop")
        for i in range(n):
            flow.add(f"s{i}", "noop", after="root")
    elif shape == "fan-in N->1":
        parts = [flow.add(f"s{i}", "noop") for i in range(n)]
        flow.add("gather", "noop", after=parts)
    else:
        previous: list[str] = []
        for i in range(chain):
            previous = [flow.add(f"s{i}", "noop", after=previous)]
    return flow


def _wait_none_waiting(url: str) -> None:
    run._wait_all_done(url)
    with psycopg.connect(url) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM jobs WHERE status = 'waiting'").fetchone()
            if not (row and row[0]):
                return
            time.sleep(0.05)
            run._wait_all_done(url)


def drain_shape(shape: str, n: int, chain: int) -> tuple[float, int, list[float]]:
    """One shape drained by one worker process (concurrency 4) in a scratch database:
    ms per step (first start to last finish, by the jobs' own timestamps), steps, and
    for the chain each step's pickup (ms from its parent's finish to its own start).
    ``n``: the fan's width (its steps are ``n + 1``; independent jobs: ``n + 1`` too)."""
    with run._ours("bench_flows") as url:
        if shape == "no triggers":  # independent jobs, the workflow triggers dropped
            with psycopg.connect(url, autocommit=True) as conn:
                for trigger in WORKFLOW_TRIGGERS:
                    conn.execute(f"DROP TRIGGER {trigger} ON jobs")
        worker = run.WorkerProcess(url, "--concurrency", "4")
        try:
            worker.wait_ready()
            with run._engine(url) as engine, Session(engine) as s:
                if shape in ("independent", "no triggers"):
                    enqueue_many(s, [NewJob("noop") for _ in range(n + 1)])
                else:
                    _flow(shape, n, chain).enqueue(s)
                s.commit()
            _wait_none_waiting(url)
        finally:
            worker.stop()
        seconds, count = _span(url)
        gaps: list[float] = []
        if shape == "chain":
            with psycopg.connect(url) as conn:
                gaps = [
                    float(r[0]) * 1000
                    for r in conn.execute(
                        "SELECT extract(epoch FROM c.attempted_at - p.finished_at) "
                        "FROM jobs_workflow_edges e JOIN jobs p ON p.id = e.parent_id "
                        "JOIN jobs c ON c.id = e.child_id"
                    )
                ]
    return seconds / count * 1000, count, gaps


def drain(n: int, chain: int) -> list[run.Row]:
    """Every shape, in one run, side by side; printed and returned as ``run.py`` rows."""
    print(f"drain: one worker process, concurrency 4; fans of {n:,}, a chain of {chain:,}")
    got = {shape: drain_shape(shape, n, chain) for shape in SHAPES}
    base = got["independent"][0]
    rows = []
    for shape in SHAPES:
        per_step, count, gaps = got[shape]
        print(f"  {shape:<13} {per_step:7.3f} ms/step over {count:,} ({per_step / base:.2f}x)")
        if shape == "chain":
            print(
                f"  chain pickup after the parent's finish: median "
                f"{statistics.median(gaps):.1f} ms, p99 {run._percentile(sorted(gaps), 0.99):.1f}"
                f" ms, max {max(gaps):.1f} ms"
            )
    peer = f"{n + 1:,} independent jobs"
    rows.append(
        run.Row(
            "workflows",
            f"{n + 1:,} independent jobs, the workflow triggers dropped: ms per job",
            got["no triggers"][0],
            "ms",
            peer,
            base,
        )
    )
    for shape, what in (
        ("fan-out 1->N", f"fan-out 1 -> {n:,}"),
        ("fan-in N->1", f"fan-in {n:,} -> 1"),
    ):
        rows.append(
            run.Row.at_most(
                "workflows",
                f"{what}: ms per step (one worker, concurrency 4)",
                got[shape][0],
                "ms",
                peer,
                base,
                TARGET_RATIO,
            )
        )
    per_step, count, gaps = got["chain"]
    rows.append(
        run.Row(
            "workflows",
            f"chain of {chain:,}: ms per step (each waits for the previous)",
            per_step,
            "ms",
        )
    )
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        rows.append(
            run.Row(
                "workflows",
                f"chain of {chain:,}: {label} pickup, parent's finish -> step's start",
                run._percentile(sorted(gaps), q),
                "ms",
            )
        )
    return rows


def section(quick: bool, step: Callable[[str], None]) -> list[run.Row]:
    """The ``workflows`` rows of ``run.py``'s table (#26): the issue's sizes."""
    n, chain = QUICK_SIZES if quick else FULL_SIZES
    step(f"workflows: fan-out 1->{n:,}, fan-in {n:,}->1, chain of {chain:,} vs independent")
    return drain(n, chain)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=FULL_SIZES[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--chain", type=int, default=FULL_SIZES[1])
    parser.add_argument("--only", choices=("contention", "drain"))
    args = parser.parse_args(argv)
    if args.only in (None, "contention"):
        contention(args.n, args.threads)
    if args.only in (None, "drain"):
        drain(args.n, args.chain)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
