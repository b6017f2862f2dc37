"""A pinned MVCC horizon beside a steady flow of jobs (issue #25, part 2).

Two runs, each in a fresh database, one after the other: a producer enqueues ``stamp``
jobs at a steady rate (``enqueue_many`` every 50 ms) for ``seconds``, and ONE real
worker (``benchapp:registry``, concurrency 4) runs them. In the second run another
connection holds a ``REPEATABLE READ`` transaction open (it read ``jobs`` once, then
sits idle in transaction, as an app's forgotten session does), so vacuum can remove
none of the rows the flow leaves dead.

Printed per window of the run: the claim latency as a job sees it (its handler's first
line minus the moment just before the producer's ``enqueue``) at p50 and p99, and
throughput (jobs done per second). At the end: dead tuples of ``jobs`` (``pgstattuple``
when the extension is available, else ``n_dead_tup``), its updates and HOT updates, and
the ratios pinned/clean against the targets: p99 within 1.5x, throughput >= 0.8x.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from sqla_jobs import NewJob, enqueue_many

P99_TARGET = 1.5
THROUGHPUT_TARGET = 0.8
TICK = 0.05


@dataclass
class Flow:
    """One run: per-window latencies, throughput and what the table looked like after."""

    pinned: bool
    seconds: float
    rate: int
    windows: list[tuple[float, float, float, float]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    done: int = 0
    dead_tuples: int = 0
    dead_source: str = ""
    updates: int = 0
    hot_updates: int = 0
    claim_buffers: str = ""
    health: str = ""

    @property
    def throughput(self) -> float:
        return self.done / self.seconds


def _produce(url: str, rate: int, seconds: float, sent: dict[int, float]) -> None:
    import run

    per_tick = max(1, round(rate * TICK))
    with run._engine(url) as engine, Session(engine) as s:
        tick = time.perf_counter()
        end = tick + seconds
        while tick < end:
            before = time.time()
            ids = enqueue_many(s, [NewJob("stamp", {}) for _ in range(per_tick)])
            s.commit()
            for job_id in ids:
                sent[int(job_id)] = before
            tick += TICK
            time.sleep(max(0.0, tick - time.perf_counter()))


def _hold(url: str, go: threading.Event, release: threading.Event) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("SET application_name = 'bench-pinned-report'")
        conn.commit()
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM jobs").fetchone()  # the snapshot is taken here
        go.set()
        release.wait()
        conn.rollback()


def _dead_tuples(conn: psycopg.Connection[Any]) -> tuple[int, str]:
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        row = conn.execute("SELECT dead_tuple_count FROM pgstattuple('jobs')").fetchone()
        return int(row[0]) if row else 0, "pgstattuple"
    except psycopg.Error:
        conn.rollback()
        row = conn.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs'"
        ).fetchone()
        return int(row[0]) if row else 0, "n_dead_tup"


def _one_claim(url: str) -> str:
    """Buffers and time of one claim of one fresh job, after the flow (rolled back): the
    index entries a claim walks past. Twice: from the start of each priority (a full
    claim, made at least every FULL_CLAIM_SECONDS), and from the floor the worker keeps
    (the newest run_at it claimed, less FLOOR_SLACK_SECONDS; sqla_jobs.sql.lease._floor),
    as its other claims are made."""
    import run

    from sqla_jobs.worker import _floors

    sql, params = run._claim_sql()
    sql = sql.replace("'noop'", "'stamp'")
    params = {k: (["stamp"] if v == ["noop"] else v) for k, v in params.items()}
    out = []
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT max(run_at) - %s * interval '1 second' FROM jobs WHERE status = 'done'",
            (_floors.FLOOR_SLACK_SECONDS,),
        ).fetchone()
        floor = row[0] if row else None
        conn.execute("INSERT INTO jobs (kind, payload) VALUES ('stamp', '{}')")
        for label, floors in (("full", None), ("floored", [floor] + [None] * 9)):
            plan = [
                str(r[0])
                for r in conn.execute(
                    f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}", {**params, "floors": floors}
                )
            ]
            wanted = [line.strip() for line in plan if "Execution" in line]
            buffers = [line.strip() for line in plan if "Buffers" in line][:1]
            out.append(f"{label}: " + "; ".join(wanted + buffers))
        conn.rollback()
    return " | ".join(out)


def _health(url: str, seconds: float) -> str:
    """``sqla-jobs health`` while the flow's horizon is still held. The transaction-age
    threshold is half the run (the default 5 min in the full run), so the pinned run's
    holder is a finding."""
    import run

    return run._health_cli(url, "--max-transaction-age", f"{max(1, int(min(seconds / 2, 300)))}s")


def flow(pinned: bool, seconds: float, rate: int, window: float) -> Flow:
    """One run; ``pinned``: with the REPEATABLE READ transaction held throughout."""
    import run

    result = Flow(pinned, seconds, rate)
    with run._ours("bench_horizon") as url:
        release, holding = threading.Event(), threading.Event()
        holder = threading.Thread(target=_hold, args=(url, holding, release), daemon=True)
        if pinned:
            holder.start()
            holding.wait(30)
        worker = run.WorkerProcess(url, "--concurrency", "4")
        sent: dict[int, float] = {}
        try:
            worker.wait_ready()
            t0 = time.time()
            _produce(url, rate, seconds, sent)
            ran_for = time.time() - t0
            run._wait_all_done(url)
            result.claim_buffers = _one_claim(url)  # the horizon still held, if pinned
            result.health = _health(url, seconds)
        finally:
            worker.stop()
            release.set()
            if pinned:
                holder.join(30)
        with psycopg.connect(url, autocommit=True) as conn:
            started: dict[int, float] = {
                int(j): float(t)
                for j, t in conn.execute("SELECT job_id, started FROM bench_pickup").fetchall()
            }
            # Done within the production window: what the worker kept up with.
            result.done = sum(1 for t in started.values() if t <= t0 + ran_for)
            stats = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'jobs'"
            ).fetchone()
            result.updates, result.hot_updates = (int(stats[0]), int(stats[1])) if stats else (0, 0)
            result.dead_tuples, result.dead_source = _dead_tuples(conn)
    result.seconds = ran_for
    result.latencies, result.windows = run._windows(sent, started, t0, window)
    return result


def _print_flow(f: Flow) -> None:
    label = "pinned (REPEATABLE READ held)" if f.pinned else "clean"
    print(f"  {label}: {f.rate} jobs/s for {f.seconds:.0f} s")
    print("    from s   p50 ms   p99 ms   done/s")
    for start, p50, p99, done in f.windows:
        print(f"    {start:6.0f}  {p50:7.1f}  {p99:7.1f}  {done:7.1f}")
    print(
        f"    dead tuples of jobs ({f.dead_source}): {f.dead_tuples}; updates {f.updates}, "
        f"HOT {f.hot_updates} ({f.hot_updates / max(1, f.updates):.0%})",
    )
    print(f"    one claim after the flow: {f.claim_buffers}", flush=True)
    print("    health at the end of the flow:")
    for line in f.health.splitlines():
        print(f"      {line}")


def section(quick: bool, step: Callable[[str], None]) -> list[Any]:
    """The ``horizon`` rows of ``run.py``'s table: pinned beside clean."""
    import run

    seconds = float(os.environ.get("SQLA_JOBS_BENCH_HORIZON_SECONDS", 60 if quick else 600))
    rate = int(os.environ.get("SQLA_JOBS_BENCH_HORIZON_RATE", 200))
    window = max(5.0, seconds / 6)
    step(f"horizon: {rate} jobs/s for {seconds:.0f} s, clean then with a pinned horizon")
    with open("/proc/loadavg") as f:
        print(f"  load average before: {f.read().split()[:3]}", flush=True)
    clean = flow(False, seconds, rate, window)
    _print_flow(clean)
    pinned = flow(True, seconds, rate, window)
    _print_flow(pinned)
    with open("/proc/loadavg") as f:
        print(f"  load average after: {f.read().split()[:3]}", flush=True)
    rows = []
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        a = run._percentile(clean.latencies, q)
        b = run._percentile(pinned.latencies, q)
        rows.append(
            run.Row(
                "horizon",
                f"{label} claim latency (enqueue to handler start), {rate} jobs/s for "
                f"{seconds:.0f} s, pinned horizon vs clean",
                b,
                "ms",
                peer="clean run",
                peer_value=a,
                target=f"<= {P99_TARGET}x" if label == "p99" else "",
                met=(b <= P99_TARGET * a) if label == "p99" else None,
            )
        )
    rows.append(
        run.Row(
            "horizon",
            f"throughput, {rate} jobs/s offered for {seconds:.0f} s, pinned horizon vs clean",
            pinned.throughput,
            "jobs/s",
            peer="clean run",
            peer_value=clean.throughput,
            target=f">= {THROUGHPUT_TARGET}x",
            met=pinned.throughput >= THROUGHPUT_TARGET * clean.throughput,
        )
    )
    rows.append(
        run.Row(
            "horizon",
            f"dead tuples of jobs at the end ({pinned.dead_source}), pinned vs clean",
            float(pinned.dead_tuples),
            "jobs",  # printed as a plain count
            peer="clean run",
            peer_value=float(clean.dead_tuples),
        )
    )
    return rows
