"""Autovacuum on ``jobs`` with PostgreSQL's defaults beside per-table settings (issue #25).

Each side runs in a fresh database: ``jobs`` is loaded in SQL (``generate_series``) with
``history`` finished jobs of the last day (not yet archived) and ``backlog`` jobs
scheduled ahead (an hour to a day out: at the tail of ``jobs_claim_idx``, never
claimed here), then ``VACUUM ANALYZE`` (autovacuum is off for the table while it
loads). Then the side's storage parameters: the defaults side RESETs every parameter
the candidate sets (a database at head carries the shipped ones), the candidate side
SETs them. Then a steady flow without a pinned horizon: a producer enqueues ``stamp``
jobs at ``rate`` a second (``enqueue_many`` every 50 ms, as ``horizon.py`` does) for
``seconds``, and ONE real worker process (``benchapp:registry``, concurrency 4) runs them.

Printed per window, from the server: ``n_dead_tup``, autovacuum and autoanalyze runs
(``pg_stat_user_tables``), the table's and its indexes' sizes (``jobs_claim_idx`` apart),
and a full claim (from the head of the index, as a worker's periodic full claim walks;
EXPLAIN (ANALYZE, BUFFERS) of one claim, rolled back): buffers and ms. From the client:
claim latency (enqueue to handler start) p50/p99 and jobs done a second. Autovacuum runs
on ``jobs`` are timed by polling ``pg_stat_progress_vacuum`` every 0.25 s. At the end:
``pgstattuple`` (dead tuples, free space), ``pgstatindex`` of ``jobs_claim_idx``, the
all-visible share of the table's pages (``pg_visibility_map_summary``), updates and HOT
updates.

The sides run in turn (defaults, candidate, defaults, candidate; ``--quick``: once each,
short and small). Autovacuum must be on in the server (``SHOW autovacuum``); the section
says so and measures nothing when it is off. The candidate is ``CANDIDATE`` unless
``SQLA_JOBS_BENCH_AUTOVACUUM_SETTINGS`` names others (``key=value,key=value``).
"""

from __future__ import annotations

import os
import re
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

#: The settings measured against the defaults (the ones revision 0023 ships).
CANDIDATE: dict[str, str] = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
}

_HISTORY_SQL = """
INSERT INTO jobs (kind, payload, status, attempts, worker, run_at, created_at, finished_at,
                  result)
  SELECT 'noop', '{"n": 1}', 'done', 1, 'old:1',
         now() - interval '1 day' + g * (interval '1 day' / %(n)s),
         now() - interval '1 day' + g * (interval '1 day' / %(n)s),
         now() - interval '1 day' + g * (interval '1 day' / %(n)s) + interval '10 ms',
         '{"ok": true}'
  FROM generate_series(1, %(n)s) AS g
"""
_BACKLOG_SQL = """
INSERT INTO jobs (kind, payload, run_at)
  SELECT 'noop', '{"n": 1}', now() + interval '1 hour' + g * (interval '23 hours' / %(n)s)
  FROM generate_series(1, %(n)s) AS g
"""
_STATS = """
SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count, last_autovacuum,
       n_tup_upd, n_tup_hot_upd, pg_relation_size('jobs'), pg_indexes_size('jobs'),
       pg_relation_size('jobs_claim_idx')
FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass
"""
_PROGRESS = (
    "SELECT phase, heap_blks_scanned, heap_blks_total, index_vacuum_count"
    " FROM pg_stat_progress_vacuum WHERE relid = 'jobs'::regclass"
)


@dataclass
class Sample:
    at: float
    live: int
    dead: int
    autovacuums: int
    autoanalyzes: int
    table_bytes: int
    index_bytes: int
    claim_idx_bytes: int
    claim_buffers: int
    claim_ms: float


@dataclass
class Side:
    label: str
    settings: dict[str, str]
    seconds: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    vacuums: list[tuple[float, float, str]] = field(default_factory=list)  # start, s, phases
    windows: list[tuple[float, float, float, float]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    done: int = 0
    load_seconds: float = 0.0
    final: dict[str, Any] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0


def autovacuum_on(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    return bool(row and row[0] == "on")


def _claim_sql() -> tuple[str, dict[str, Any]]:
    import run

    sql, params = run._claim_sql()
    sql = sql.replace("'noop'", "'stamp'")
    return sql, {k: (["stamp"] if v == ["noop"] else v) for k, v in params.items()}


#: The scans of every full claim's plan seen (does the plan change as the table does?).
PLANS: set[str] = set()
_SCAN = re.compile(
    r"(Index Only Scan|Index Scan|Seq Scan|Bitmap Heap Scan|Bitmap Index Scan)"
    r"( Backward)?( using \w+)? on \w+"
)


def full_claim(conn: psycopg.Connection[Any]) -> tuple[int, float]:
    """Buffers and ms of one claim from the head of each priority (no floors: a worker's
    periodic full claim), of a job inserted for it; rolled back."""
    sql, params = _claim_sql()
    with conn.transaction(force_rollback=True):
        conn.execute("INSERT INTO jobs (kind, payload) VALUES ('stamp', '{}')")
        plan = [
            str(r[0])
            for r in conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}", {**params, "floors": None}
            )
        ]
    buffers, ms = 0, 0.0
    PLANS.add(" / ".join(m.group(0) for line in plan if (m := _SCAN.search(line))))
    for line in plan:
        line = line.strip()
        if line.startswith("Buffers:") and not buffers:
            for part in line.split():
                if "=" in part:
                    buffers += int(part.split("=")[1])
        if line.startswith("Execution Time:"):
            ms = float(line.split()[2])
    return buffers, ms


def _wait_flow_done(url: str, timeout: float = 300.0) -> None:
    """Until no job is ready or running (the backlog stays queued, scheduled ahead)."""
    deadline = time.perf_counter() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT NOT EXISTS (SELECT 1 FROM jobs WHERE status = 'queued' AND kind = 'stamp')"
                " AND NOT EXISTS (SELECT 1 FROM jobs WHERE status = 'running')"
            ).fetchone()
            if row and row[0]:
                return
            if time.perf_counter() > deadline:
                raise RuntimeError("the flow's jobs did not finish")
            time.sleep(0.1)


def _load(url: str, history: int, backlog: int, settings: dict[str, str]) -> float:
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        conn.execute(_HISTORY_SQL, {"n": history})
        conn.execute(_BACKLOG_SQL, {"n": backlog})
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_visibility")
    # A new session: the inserts' counts reach the statistics when the loading session
    # ends, so the VACUUM below zeroes them (reported after it, they would count as
    # inserts since the last vacuum and start an autovacuum at once).
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("ALTER TABLE jobs RESET (autovacuum_enabled)")
        keys = sorted(set(CANDIDATE) | set(settings))
        conn.execute(f"ALTER TABLE jobs RESET ({', '.join(keys)})")
        if settings:
            pairs = ", ".join(f"{k} = {v}" for k, v in settings.items())
            conn.execute(f"ALTER TABLE jobs SET ({pairs})")
    return time.perf_counter() - t0


def _sample(conn: psycopg.Connection[Any], t0: float) -> Sample:
    row = conn.execute(_STATS).fetchone()
    assert row is not None
    buffers, ms = full_claim(conn)
    return Sample(
        time.time() - t0,
        int(row[0]),
        int(row[1]),
        int(row[2]),
        int(row[3]),
        int(row[7]),
        int(row[8]),
        int(row[9]),
        buffers,
        ms,
    )


def _monitor(url: str, side: Side, t0: float, window: float, stop: threading.Event) -> None:
    """A sample each ``window``; ``pg_stat_progress_vacuum`` every 0.25 s (the runs' length)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET application_name = 'bench-autovacuum-monitor'")
        next_sample = time.time()
        running: tuple[float, set[str]] | None = None
        while not stop.is_set():
            now = time.time()
            progress = conn.execute(_PROGRESS).fetchone()
            if progress and running is None:
                running = (now, {str(progress[0])})
            elif progress and running is not None:
                running[1].add(str(progress[0]))
            elif running is not None:
                side.vacuums.append(
                    (running[0] - t0, now - running[0], ",".join(sorted(running[1])))
                )
                running = None
            if now >= next_sample:
                side.samples.append(_sample(conn, t0))
                next_sample += window
            stop.wait(0.25)
        if running is not None:
            side.vacuums.append((running[0] - t0, time.time() - running[0], "(still running)"))


def _final(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    row = conn.execute(
        "SELECT table_len, tuple_count, dead_tuple_count, free_percent FROM pgstattuple('jobs')"
    ).fetchone()
    assert row is not None
    out["table_len"], out["tuples"], out["dead_tuples"], out["free_percent"] = row
    row = conn.execute(
        "SELECT leaf_pages, deleted_pages, avg_leaf_density FROM pgstatindex('jobs_claim_idx')"
    ).fetchone()
    assert row is not None
    out["claim_leaf_pages"], out["claim_deleted_pages"], out["claim_leaf_density"] = row
    row = conn.execute("SELECT all_visible FROM pg_visibility_map_summary('jobs')").fetchone()
    pages = conn.execute("SELECT pg_relation_size('jobs') / 8192").fetchone()
    assert row is not None and pages is not None
    out["all_visible_share"] = int(row[0]) / max(1, int(pages[0]))
    row = conn.execute(_STATS).fetchone()
    assert row is not None
    out["n_dead_tup"], out["autovacuums"], out["autoanalyzes"] = row[1], row[2], row[3]
    out["updates"], out["hot_updates"] = int(row[5]), int(row[6])
    out["table_bytes"], out["index_bytes"], out["claim_idx_bytes"] = row[7], row[8], row[9]
    out["claim_buffers"], out["claim_ms"] = full_claim(conn)
    return out


def run_side(
    label: str,
    settings: dict[str, str],
    *,
    history: int,
    backlog: int,
    rate: int,
    seconds: float,
    window: float,
) -> Side:
    """One side in a fresh database: load, set ``settings``, run the flow, measure."""
    import horizon
    import run

    side = Side(label, settings)
    with run._ours("bench_autovacuum") as url:
        side.load_seconds = _load(url, history, backlog, settings)
        worker = run.WorkerProcess(url, "--concurrency", "4")
        sent: dict[int, float] = {}
        stop = threading.Event()
        try:
            worker.wait_ready()
            t0 = time.time()
            monitor = threading.Thread(
                target=_monitor, args=(url, side, t0, window, stop), daemon=True
            )
            monitor.start()
            horizon._produce(url, rate, seconds, sent)
            side.seconds = time.time() - t0
            _wait_flow_done(url)
        finally:
            stop.set()
            worker.stop()
        monitor.join(30)
        with psycopg.connect(url, autocommit=True) as conn:
            started: dict[int, float] = {
                int(j): float(t)
                for j, t in conn.execute("SELECT job_id, started FROM bench_pickup").fetchall()
            }
            side.final = _final(conn)
    side.done = sum(1 for t in started.values() if t <= t0 + side.seconds)
    side.latencies, side.windows = run._windows(sent, started, t0, window)
    return side


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f}"


def print_side(side: Side) -> None:
    what = ", ".join(f"{k}={v}" for k, v in side.settings.items()) or "PostgreSQL defaults"
    print(f"  {side.label}: {what} (loaded in {side.load_seconds:.0f} s)")
    print(
        "      at s    live     dead  av  an  table MiB  index MiB  claim_idx MiB"
        "  full claim buf   ms   p50 ms  p99 ms  done/s"
    )
    by_start = {int(w[0]): w for w in side.windows}
    window = side.windows[1][0] - side.windows[0][0] if len(side.windows) > 1 else 0.0
    for s in side.samples:
        w = by_start.get(int((s.at // window) * window)) if window else None
        lat = f"{w[1]:7.1f} {w[2]:7.1f} {w[3]:7.1f}" if w else " " * 23
        print(
            f"    {s.at:6.0f} {s.live:7d} {s.dead:8d} {s.autovacuums:3d} {s.autoanalyzes:3d}"
            f"  {_mib(s.table_bytes):>9}  {_mib(s.index_bytes):>9}  {_mib(s.claim_idx_bytes):>13}"
            f"  {s.claim_buffers:14d} {s.claim_ms:5.1f}  {lat}"
        )
    for start, length, phases in side.vacuums:
        print(f"    autovacuum of jobs at {start:.0f} s: {length:.0f} s ({phases})")
    f = side.final
    print(
        f"    end: pgstattuple dead {f['dead_tuples']}, live {f['tuples']}, free "
        f"{f['free_percent']:.1f}%, table {_mib(f['table_len'])} MiB; n_dead_tup "
        f"{f['n_dead_tup']}; autovacuum {f['autovacuums']}, autoanalyze {f['autoanalyzes']};"
        f" indexes {_mib(f['index_bytes'])} MiB, jobs_claim_idx {_mib(f['claim_idx_bytes'])}"
        f" MiB ({f['claim_leaf_pages']} leaf pages, {f['claim_deleted_pages']} deleted, "
        f"density {f['claim_leaf_density']:.0f}%); all-visible {f['all_visible_share']:.0%};"
        f" updates {f['updates']}, HOT {f['hot_updates']}; full claim {f['claim_buffers']}"
        f" buffers {f['claim_ms']:.1f} ms; p50 {_p(side, 0.5):.1f} ms p99 {_p(side, 0.99):.1f}"
        f" ms; {side.throughput:.0f} jobs/s",
        flush=True,
    )


def _p(side: Side, q: float) -> float:
    import run

    return run._percentile(side.latencies, q) if side.latencies else 0.0


def _candidate() -> dict[str, str]:
    spec = os.environ.get("SQLA_JOBS_BENCH_AUTOVACUUM_SETTINGS")
    if not spec:
        return dict(CANDIDATE)
    pairs = [item.split("=", 1) for item in spec.split(",") if item.strip()]
    return {k.strip(): v.strip() for k, v in pairs}


def section(quick: bool, step: Callable[[str], None]) -> list[Any]:
    """The ``autovacuum`` rows of ``run.py``'s table: the candidate beside the defaults."""
    import run
    from _db import admin_url

    if not autovacuum_on(admin_url()):
        print(
            "  autovacuum: skipped, autovacuum is off in this server (SHOW autovacuum); "
            "point DATABASE_URL at a server where it is on",
            flush=True,
        )
        return []
    env = os.environ.get
    history = int(env("SQLA_JOBS_BENCH_AUTOVACUUM_HISTORY", 100_000 if quick else 800_000))
    backlog = int(env("SQLA_JOBS_BENCH_AUTOVACUUM_BACKLOG", 20_000 if quick else 200_000))
    seconds = float(env("SQLA_JOBS_BENCH_AUTOVACUUM_SECONDS", 90 if quick else 360))
    rate = int(env("SQLA_JOBS_BENCH_AUTOVACUUM_RATE", 200))
    repeats = int(env("SQLA_JOBS_BENCH_AUTOVACUUM_REPEATS", 1 if quick else 2))
    window = max(10.0, seconds / 12)
    candidate = _candidate()
    with open("/proc/loadavg") as f:
        print(f"  load average before: {f.read().split()[:3]}", flush=True)
    sides: dict[str, list[Side]] = {"defaults": [], "candidate": []}
    for rep in range(repeats):
        for label, settings in (("defaults", {}), ("candidate", candidate)):
            step(
                f"autovacuum: {label} ({rep + 1}/{repeats}), {history:,} done + {backlog:,} "
                f"scheduled rows, {rate} jobs/s for {seconds:.0f} s"
            )
            side = run_side(
                label,
                settings,
                history=history,
                backlog=backlog,
                rate=rate,
                seconds=seconds,
                window=window,
            )
            sides[label].append(side)
            print_side(side)
    with open("/proc/loadavg") as f:
        print(f"  load average after: {f.read().split()[:3]}", flush=True)
    print(f"  full claim plans seen: {sorted(PLANS)}", flush=True)
    what = ", ".join(f"{k}={v}" for k, v in candidate.items())
    # Counts ("jobs": printed as plain numbers): rows, runs, buffers.
    figures: list[tuple[str, Callable[[Side], float], str]] = [
        ("n_dead_tup of jobs at the end", lambda s: s.final["n_dead_tup"], "jobs"),
        ("dead tuples at the end (pgstattuple)", lambda s: s.final["dead_tuples"], "jobs"),
        ("autovacuum runs on jobs", lambda s: s.final["autovacuums"], "jobs"),
        ("jobs table size at the end", lambda s: s.final["table_bytes"] / 1048576, "MiB"),
        ("jobs indexes at the end", lambda s: s.final["index_bytes"] / 1048576, "MiB"),
        ("full claim from the head at the end", lambda s: s.final["claim_buffers"], "jobs"),
        (
            "max full claim during the flow",
            lambda s: max(x.claim_buffers for x in s.samples),
            "jobs",
        ),
        ("p99 enqueue to handler start", lambda s: _p(s, 0.99), "ms"),
        ("throughput", lambda s: s.throughput, "jobs/s"),
    ]
    rows = []
    for name, fn, unit in figures:
        rows.append(
            run.Row(
                "autovacuum",
                f"{name}, {history:,} + {backlog:,} rows, {rate} jobs/s, {seconds:.0f} s, {what}",
                statistics.median(fn(s) for s in sides["candidate"]),
                unit,
                peer="PostgreSQL defaults",
                peer_value=statistics.median(fn(s) for s in sides["defaults"]),
            )
        )
    return rows
