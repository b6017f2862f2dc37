"""Every operation with an empty history beside the same with a long one (issue #25, part 3).

Two scratch databases with the same live queue; each operation timed (median of its
repeats, ms) in both, in turns (three rounds, the median of the rounds), one of them
with ``history`` finished jobs added in SQL
(``generate_series``) the way the product stores them: half as done rows in ``jobs``
finished 1 hour to 6 days ago (not yet archivable at ``--older-than 7d``), half in
``jobs_archive`` finished 10 to 80 days ago (not yet prunable at 90 days) and archived a
day after, in weekly partitions as a partitioned install has them after months (the
closed weeks with their id CHECKs; the empty side is a fresh install: the migration's
initial partition and the two weeks ahead), then ``VACUUM ANALYZE`` (both). The ratio
long/empty is compared with the issue's 1.2x. The live part is the same in both: queued
jobs to claim, a few dead, expired and done ones.

Before the timed rounds, ``moves`` runs each archive and prune shape once per side with
auto_explain on, and prints what the server counted (buffers, pages dirtied, each
batch's look): a 1,000-row archive of rows smaller than the history's (the free space
map sends each into a hole VACUUM recorded in a page of the history), the same with rows
shaped like the history's, and 20,000 rows in batches of 1,000 (does batch 20 read
more than batch 1?).

The periodic enqueuer is timed as a worker runs it (``periodic.enqueue_due``: register,
lock the due row, insert the tick's job with its idempotency key, advance), one due tick
per call (the database clock pinned a minute further each call). After the rounds,
``sqla-jobs health`` on the long side, its output and wall time. Full size 10,000,000
(``--quick``: 1,000,000).
"""

from __future__ import annotations

import os
import re
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqla_jobs import enqueue, ops
from sqla_jobs.models import JobStatus
from sqla_jobs.sql import admin, lease
from sqla_jobs.sql import stats as stats_sql

TARGET = 1.2
_LIVE_SQL = """
INSERT INTO jobs (kind, payload) SELECT 'noop', '{}' FROM generate_series(1, 2000);
INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error)
  SELECT 'noop', '{}', 'dead', 8, now() - interval '1 hour', 'boom'
  FROM generate_series(1, 200);
INSERT INTO jobs (kind, payload, status, attempts, locked_until, worker)
  SELECT 'noop', '{}', 'running', 1, now() - interval '1 hour', 'gone:1'
  FROM generate_series(1, 20);
INSERT INTO jobs (kind, payload, status, attempts, finished_at, result)
  SELECT 'noop', '{}', 'done', 1, now() - interval '1 minute', '{"ok": true}'
  FROM generate_series(1, 200);
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, attempts,
                          created_at, finished_at, result)
  VALUES (900000000, 'noop', 'default', 0, '{}', 'done', now(), 1,
          now() - interval '30 days', now() - interval '30 days', '{"ok": true}');
"""
_HISTORY_SQL = """
INSERT INTO jobs (kind, payload, status, attempts, worker, run_at, created_at, finished_at,
                  result)
  SELECT 'noop', '{"n": 1}', 'done', 1, 'old:1',
         now() - interval '6 days' + g * (interval '6 days' / %(half)s),
         now() - interval '6 days' + g * (interval '6 days' / %(half)s),
         now() - interval '6 days' + g * (interval '6 days' / %(half)s) - interval '1 hour',
         '{"ok": true}'
  FROM generate_series(1, %(half)s) AS g;
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, attempts,
                          worker, created_at, finished_at, result, archived_at)
  SELECT 1000000000 + g, 'noop', 'default', 0, '{"n": 1}', 'done',
         now() - interval '80 days' + g * (interval '70 days' / %(half)s), 1, 'old:1',
         now() - interval '80 days' + g * (interval '70 days' / %(half)s),
         now() - interval '80 days' + g * (interval '70 days' / %(half)s), '{"ok": true}',
         now() - interval '79 days' + g * (interval '70 days' / %(half)s)
  FROM generate_series(1, %(half)s) AS g;
"""
# The archive as a partitioned install has it after months (revision 0022): instead of
# the migration's initial partition (MINVALUE to the week after next), one partition per
# week from before the oldest archived row on, in the archiver's names, so the history
# lands in the weeks it was archived in. After the rows are in, the archiver's own
# jobs_archive_prepare (twice: add, then validate) gives the closed weeks their id CHECKs.
_WEEKLY_SQL = """
DO $$
DECLARE
  bound timestamptz;
  week timestamptz;
BEGIN
  SELECT upper_bound INTO bound FROM jobs_archive_partitions()
   WHERE partition = 'jobs_archive_p_initial';
  ALTER TABLE jobs_archive DETACH PARTITION jobs_archive_p_initial;
  DROP TABLE jobs_archive_p_initial;
  FOR week IN SELECT generate_series(date_trunc('week', now() - interval '90 days', 'UTC'),
                                     bound - interval '1 week', interval '1 week') LOOP
    EXECUTE format('CREATE TABLE %%I PARTITION OF jobs_archive FOR VALUES FROM (%%L) TO (%%L)',
                   'jobs_archive_p' || to_char(week AT TIME ZONE 'UTC', 'YYYYMMDD'),
                   week, week + interval '1 week');
  END LOOP;
END $$
"""
# Rows smaller than the history's (no worker, no result): after the history's VACUUM
# nearly every page of jobs_archive has a hole that fits exactly one of them, and the
# free space map sends each to a page of its own (see _moves).
_ARCHIVABLE = """
INSERT INTO jobs (kind, payload, status, attempts, finished_at)
  SELECT 'noop', '{}', 'done', 1, now() - interval '8 days' FROM generate_series(1, 1000)
"""
# Rows shaped like the history's, each finished at its own instant: %(rows)s of them.
_ARCHIVABLE_LIKE_HISTORY = """
INSERT INTO jobs (kind, payload, status, attempts, worker, finished_at, result)
  SELECT 'noop', '{"n": 1}', 'done', 1, 'old:1',
         now() - interval '8 days' - g * interval '1 second', '{"ok": true}'
  FROM generate_series(1, %(rows)s) AS g
"""
_PRUNABLE_SPREAD = """
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, attempts,
                          worker, created_at, finished_at, result)
  SELECT 4000000000 + g + %(offset)s * 100, 'noop', 'default', 0, '{"n": 1}', 'done',
         now(), 1, 'old:1', now() - interval '100 days',
         now() - interval '100 days' - g * interval '1 second', '{"ok": true}'
  FROM generate_series(1, %(rows)s) AS g
"""
#: A long call: this many rows, in batches of BATCH (each batch's look, first -> last).
LONG_ROWS, BATCH = 20_000, 1_000
_PRUNABLE = """
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, attempts,
                          created_at, finished_at)
  SELECT 3000000000 + g + %(offset)s, 'noop', 'default', 0, '{}', 'done', now(), 1,
         now() - interval '100 days', now() - interval '100 days'
  FROM generate_series(1, 1000) AS g
"""


def _ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _ids(engine: sa.Engine, sql: str) -> list[int]:
    with engine.connect() as conn:
        return [int(r[0]) for r in conn.exec_driver_sql(sql)]


def measure(engine: sa.Engine, repeats: int) -> dict[str, float]:
    """Milliseconds per operation on the database as it stands."""
    import run

    out: dict[str, float] = {}
    claim_sql, claim_params = run._claim_sql()
    dead = _ids(engine, "SELECT id FROM jobs WHERE status = 'dead' LIMIT 1")[0]
    done = _ids(engine, "SELECT id FROM jobs WHERE status = 'done' ORDER BY id DESC LIMIT 1")[0]
    archived = 900_000_000  # the live part's one archived job
    with Session(engine) as s:

        def enqueue_one() -> None:
            enqueue(s, "noop", {})
            s.commit()

        def rolled_back(stmt: Any, params: Any = None) -> Callable[[], None]:
            def call() -> None:
                with engine.connect() as conn:
                    if isinstance(stmt, str):
                        conn.exec_driver_sql(stmt, params).all()
                    else:
                        conn.execute(stmt)
                    conn.rollback()

            return call

        out["enqueue (one job, commit)"] = _ms(enqueue_one, repeats)
        out["claim (1 job, rolled back)"] = _ms(rolled_back(claim_sql, claim_params), repeats)
        out["done-mark (complete_one)"] = _done_mark_ms(engine, claim_sql, claim_params, repeats)

        def retry_one() -> None:
            ops.retry_jobs(s, ids=[dead])
            s.rollback()

        out["retry (one dead job, rolled back)"] = _ms(retry_one, repeats)
        out["rescue (20 expired, rolled back)"] = _ms(rolled_back(lease.rescue_expired()), repeats)
        # As many repeats as the rest: with three, one slow scheduling slice on a loaded
        # host moved the median by 2x (the 2.19x of the first run, see buffers()).
        out["stats"] = _ms(lambda: ops.stats(s), repeats)
        out["list (first page, all)"] = _ms(lambda: ops.list_jobs(s), repeats)
        out["list (dead)"] = _ms(lambda: ops.list_jobs(s, status="dead"), repeats)
        out["show (live job)"] = _ms(lambda: ops.get_job(s, done), repeats)
        out["show (archived job)"] = _ms(lambda: ops.get_job(s, archived), repeats)
        out["result"] = _ms(lambda: ops.result(s, done), repeats)
        out["health"] = _ms(lambda: ops.health(s), max(3, repeats // 3))
        out["periodic enqueue (one due tick)"] = _periodic_ms(engine, repeats)
        s.rollback()
        out["archive (1,000 rows)"] = _batch_op(
            engine, _ARCHIVABLE, lambda: ops.archive(s, timedelta(days=7))
        )
        out["archive (1,000 rows like the history's)"] = _batch_op(
            engine, _ARCHIVABLE_LIKE_HISTORY, lambda: ops.archive(s, timedelta(days=7))
        )
        out["prune (1,000 rows)"] = _batch_op(
            engine, _PRUNABLE, lambda: ops.prune(s, timedelta(days=90))
        )
        out["prune (1,000 rows like the history's)"] = _batch_op(
            engine, _PRUNABLE_SPREAD, lambda: ops.prune(s, timedelta(days=90))
        )
    return out


_periodic_calls = 0


def _periodic_ms(engine: sa.Engine, repeats: int) -> float:
    """Median ms of ``periodic.enqueue_due`` enqueueing one due tick: each call's pinned
    clock a minute past the previous call's, on a schedule ticking every minute."""
    global _periodic_calls
    from datetime import datetime, timezone

    from sqla_jobs import Registry, periodic

    registry = Registry()
    registry.handler("noop")(lambda session, payload, job: None)
    registry.schedule("bench-minutely", "* * * * *", "noop")
    base = datetime(2030, 1, 1, tzinfo=timezone.utc)
    times = []
    for n in range(repeats + 1):
        _periodic_calls += 1
        now = base + timedelta(minutes=_periodic_calls)
        t0 = time.perf_counter()
        done = periodic.enqueue_due(engine, registry, now=now)
        times.append((time.perf_counter() - t0) * 1000)
        assert done.ticks or n == 0, "no tick enqueued"
    return statistics.median(times[1:])  # the first call registers the schedule


def _done_mark_ms(engine: sa.Engine, claim_sql: str, params: dict[str, Any], repeats: int) -> float:
    """Median ms of the done-mark alone, each of a job claimed (and committed) just before."""
    times = []
    for _ in range(repeats):
        with engine.connect() as conn:
            row = conn.exec_driver_sql(claim_sql, params).mappings().first()
            conn.commit()
        assert row is not None, "no job to claim"
        stmt = lease.complete_one(worker="bench:1", job_id=row["id"], attempt=row["attempts"])
        t0 = time.perf_counter()
        with engine.begin() as conn:
            assert conn.execute(stmt).rowcount == 1
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


_batches = 0


def _batch_op(engine: sa.Engine, seed: str, op: Callable[[], int], rows: int = 1000) -> float:
    global _batches
    times = []
    for _ in range(3):
        _seed(engine, seed, rows)
        t0 = time.perf_counter()
        moved = op()
        times.append((time.perf_counter() - t0) * 1000)
        assert moved == rows, moved
    return statistics.median(times)


def _seed(engine: sa.Engine, seed: str, rows: int) -> None:
    global _batches
    _batches += 1
    with engine.begin() as conn:
        conn.exec_driver_sql(seed, {"offset": _batches * 1000, "rows": rows})


class Moves(NamedTuple):
    """What one ops.archive or ops.prune call cost the server, summed over its batch
    statements (auto_explain: each statement's plan as run, ANALYZE and BUFFERS)."""

    batches: int
    buffers: int  # shared hit + read, every batch statement
    dirtied: int  # pages the call dirtied (each written back, and in WAL after a checkpoint)
    first_look: int  # buffers of the first batch's look (the ``picked`` CTE)
    last_look: int  # ... of the last full batch's


_AUTO_EXPLAIN = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_level = notice",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_buffers = on",
    "SET auto_explain.log_format = json",
)


def moves(url: str) -> dict[str, Moves]:
    """Each archive and prune shape once, on a connection that explains every statement."""
    import json

    import run

    plans: list[dict[str, Any]] = []
    with run._engine(url, poolclass=sa.NullPool) as engine:

        @sa.event.listens_for(engine, "connect")
        def _explain(dbapi: Any, _record: Any) -> None:
            def keep(notice: Any) -> None:
                text = notice.message_primary or ""
                if "{" in text:
                    plans.append(json.loads(text[text.index("{") :]))

            dbapi.add_notice_handler(keep)
            with dbapi.cursor() as cursor:
                for statement in _AUTO_EXPLAIN:
                    cursor.execute(statement)
            dbapi.commit()

        shapes: list[tuple[str, str, int, Callable[[Session], int]]] = [
            (
                "archive 1,000 smaller",
                _ARCHIVABLE,
                1000,
                lambda s: ops.archive(s, timedelta(days=7)),
            ),
            (
                "archive 1,000 like history",
                _ARCHIVABLE_LIKE_HISTORY,
                1000,
                lambda s: ops.archive(s, timedelta(days=7)),
            ),
            ("prune 1,000", _PRUNABLE, 1000, lambda s: ops.prune(s, timedelta(days=90))),
            (
                f"archive {LONG_ROWS:,} / {BATCH:,}",
                _ARCHIVABLE_LIKE_HISTORY,
                LONG_ROWS,
                lambda s: ops.archive(s, timedelta(days=7), batch=BATCH),
            ),
            (
                f"prune {LONG_ROWS:,} / {BATCH:,}",
                _PRUNABLE_SPREAD,
                LONG_ROWS,
                lambda s: ops.prune(s, timedelta(days=90), batch=BATCH),
            ),
        ]
        found = {}
        for name, seed, rows, op in shapes:
            _seed(engine, seed, rows)
            plans.clear()
            with Session(engine) as session:
                assert op(session) == rows
            found[name] = _summed([p for p in plans if "picked" in p.get("Query Text", "")])
    return found


def _summed(plans: list[dict[str, Any]]) -> Moves:
    def blocks(node: dict[str, Any]) -> int:
        return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])

    def look(plan: dict[str, Any]) -> int:
        stack = [plan["Plan"]]
        while stack:
            node = stack.pop()
            if node.get("Subplan Name") == "CTE picked":
                return blocks(node)
            stack.extend(node.get("Plans", []))
        return 0

    looks = [look(p) for p in plans]
    full = looks[:-1] if len(looks) > 1 else looks
    return Moves(
        len(plans),
        sum(blocks(p["Plan"]) for p in plans),
        sum(int(p["Plan"]["Shared Dirtied Blocks"]) for p in plans),
        full[0],
        full[-1],
    )


def _statements(engine: sa.Engine) -> dict[str, tuple[str, dict[str, Any]]]:
    """The operations' statements, compiled with the values of this database's rows."""
    import run

    dead = _ids(engine, "SELECT id FROM jobs WHERE status = 'dead' LIMIT 1")[0]
    done = _ids(engine, "SELECT id FROM jobs WHERE status = 'done' ORDER BY id DESC LIMIT 1")[0]
    built: dict[str, Any] = {
        "done-mark": lease.complete_one(worker="gone:1", job_id=done, attempt=1),
        "retry": admin.retry_jobs(statuses=[JobStatus.DEAD], ids=[dead]),
        "rescue": lease.rescue_expired(),
        # What ops.stats runs: the head (pg_class, pg_stat_user_tables, pg_stats) and
        # the per-(queue, kind) parts in one UNION ALL; then each part alone.
        "stats head": stats_sql.stats_head(),
        "stats parts": ops._stats_statement(None)[1],
        "stats queued": stats_sql.stats_queued(),
        "stats running": stats_sql.stats_running(),
        "stats dead": stats_sql.stats_dead(),
        "stats done recent": stats_sql.stats_done_recent(),
        "list (first page)": admin.list_jobs(limit=50),
        "list (dead)": admin.list_jobs(statuses=[JobStatus.DEAD], limit=50),
        "show": admin.get_job(done),
        "show archived": admin.get_archived_job(900_000_000),
        "result": admin.job_result(done),
        "archive batch": admin.archive_batch(
            done_older_than=7 * 86400.0, dead_older_than=None, batch=10_000
        ),
        "prune batch": admin.prune_batch(older_than=90 * 86400.0, batch=10_000),
    }
    out = {"claim": run._claim_sql()}
    for name, stmt in built.items():
        compiled = stmt.compile(dialect=engine.dialect)
        params = dict(compiled.params)
        if "taken_at" in params:
            params["taken_at"] = None  # the clock, as of the statement (stats_parts)
        out[name] = (str(compiled), params)
    return out


class Plan(NamedTuple):
    """One statement's EXPLAIN (ANALYZE, BUFFERS), its second run in one connection."""

    buffers: int  # shared hit + read of the execution
    planning_buffers: int  # catalog and statistics pages the planner read
    server_ms: float  # planning + execution time in the server
    scan: str  # the plan's first scan line


def buffers(engine: sa.Engine) -> dict[str, Plan]:
    """What each statement costs the server: buffers (hit + read) of its execution and of
    its planning, planning + execution time, and its plan's first scan line: counts the
    host's load does not change (EXPLAIN ANALYZE, rolled back). Each statement is
    explained twice in one connection and the second taken: the first pays the
    connection's catalog cache, which every statement of a real session has paid."""
    found: dict[str, Plan] = {}
    for name, (sql, params) in _statements(engine).items():
        with engine.connect() as conn:
            for _ in range(2):
                plan = [
                    str(r[0])
                    for r in conn.exec_driver_sql(
                        f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}", params
                    )
                ]
                conn.rollback()
        found[name] = _read_plan(plan)
    return found


def _read_plan(plan: list[str]) -> Plan:
    def count(line: str) -> int:
        hit = re.search(r"hit=(\d+)", line)
        read = re.search(r"read=(\d+)", line)
        return int(hit.group(1) if hit else 0) + int(read.group(1) if read else 0)

    executed = next((count(x) for x in plan if "Buffers:" in x), 0)
    planning = 0
    if "Planning:" in plan:  # "Planning:" then its "Buffers:" line, when it read any
        after = plan[plan.index("Planning:") + 1]
        planning = count(after) if "Buffers:" in after else 0
    ms = sum(
        float(m.group(1))
        for x in plan
        if (m := re.match(r"(?:Planning|Execution) Time: ([\d.]+) ms", x.strip()))
    )
    scans = [x.strip() for x in plan if " Scan " in x or "Scan using" in x]
    return Plan(executed, planning, ms, scans[0] if scans else "")


def _prepare(url: str, engine: sa.Engine, history: int) -> None:
    with engine.begin() as conn:
        if history:
            conn.exec_driver_sql(_WEEKLY_SQL, {})  # {}: the driver reads %% as %
        conn.exec_driver_sql(_LIVE_SQL)
        if history:
            for statement in _HISTORY_SQL.split(";")[:2]:
                conn.exec_driver_sql(statement, {"half": history // 2})
    if history:
        for _ in range(2):
            with engine.begin() as conn:
                conn.exec_driver_sql("SELECT jobs_archive_prepare()")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")


def section(quick: bool, step: Callable[[str], None]) -> list[Any]:
    """The ``history`` rows of ``run.py``'s table: two databases, measured in turns."""
    import run

    history = int(os.environ.get("SQLA_JOBS_BENCH_HISTORY", 1_000_000 if quick else 10_000_000))
    repeats, rounds = (11, 3) if quick else (21, 3)
    rows = []
    with (
        run._ours("bench_history_empty") as empty_url,
        run._ours("bench_history_long") as long_url,
        run._engine(empty_url) as empty_engine,
        run._engine(long_url) as long_engine,
    ):
        _prepare(empty_url, empty_engine, 0)
        step(f"history: adding {history:,} finished jobs (generate_series)")
        t0 = time.perf_counter()
        _prepare(long_url, long_engine, history)
        step(f"history: generated and vacuumed in {time.perf_counter() - t0:.0f} s")
        # First, while the history's pages still have the holes VACUUM recorded; then
        # VACUUM again, so that the timed rounds do not walk the dead index entries of
        # these calls (a call whose last batch is short reads to the end of its range:
        # with them left in place, the timed 1,000-row prune took 5.9x at 10M).
        moved = moves(empty_url), moves(long_url)
        for engine in (empty_engine, long_engine):
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE jobs, jobs_archive")
        print(
            "  archive and prune, empty -> long history (auto_explain, every batch statement"
            " summed): batches, buffers, pages dirtied, the first and the last full batch's"
            " look:"
        )
        for name, a in moved[0].items():
            b = moved[1][name]
            print(
                f"    {name:28} {a.batches:3} -> {b.batches:3}"
                f"  {a.buffers:8,} -> {b.buffers:8,}  dirtied {a.dirtied:6,} ->"
                f" {b.dirtied:6,}  look {a.first_look:5} .. {a.last_look:5} ->"
                f" {b.first_look:5} .. {b.last_look:5}",
                flush=True,
            )
        empty: dict[str, list[float]] = {}
        long: dict[str, list[float]] = {}
        sides = [(empty_engine, empty), (long_engine, long)]
        for n in range(rounds):  # in turns, each side first in turn: load drift hits both
            step(f"history: round {n + 1} of {rounds}")
            for engine, into in sides if n % 2 == 0 else sides[::-1]:
                for name, value in measure(engine, repeats).items():
                    into.setdefault(name, []).append(value)
        before, after = buffers(empty_engine), buffers(long_engine)
        print(f"  health on the {history:,}-job history:")
        for line in run._health_cli(long_url).splitlines():
            print(f"    {line}", flush=True)
        print(
            "  per statement, empty -> long history: buffers of the execution, of the"
            " planning, server ms (planning + execution), and the long side's first scan:"
        )
        for name, one in before.items():
            other = after[name]
            print(
                f"    {name:18} {one.buffers:6} -> {other.buffers:6}"
                f"  plan {one.planning_buffers:4} -> {other.planning_buffers:4}"
                f"  {one.server_ms:6.2f} -> {other.server_ms:6.2f} ms  {other.scan}",
                flush=True,
            )
    for name, values in empty.items():
        value = statistics.median(long[name])
        rows.append(
            run.Row(
                "history",
                f"{name}: {history:,} finished jobs of history vs none",
                value,
                "ms",
                peer="empty history",
                peer_value=statistics.median(values),
                target=f"<= {TARGET}x",
                met=value <= TARGET * statistics.median(values),
            )
        )
    return rows
