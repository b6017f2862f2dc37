"""A range-partitioned ``jobs_archive`` beside today's plain one, before any migration (#25).

The design question of issue #25's first part, measured before a revision is written
(a migration that lands is forever). The candidate: ``jobs_archive`` partitioned by
``archived_at`` (a workflow is archived in one transaction, so it stays in one
partition), pruned by dropping whole partitions. Its cost: a look-up by ``id`` (``show``,
``result``, a workflow's steps and upstream results) carries no partition key, so the
planner keeps every partition and the executor probes each partition's index.

Sides, each a scratch database with sqla_jobs' schema and the same ``history`` archived
rows (archived over the last 98 days, evenly; every other row a step of a five-step
workflow archived at one instant): the plain table, then the same rows in ``jobs_archive``
re-created as ``PARTITION BY RANGE (archived_at)`` with 14 (weekly), 30 and 98 (daily)
partitions, its primary key ``(id, archived_at)`` (a partitioned table's unique index must
hold the partition key) and the same two secondary indexes. The product's own statements
run unchanged on both: an ``INSERT`` into the parent is routed to its partition.

Measured on each side: the look-ups (client ms, warm connection; and on a new connection,
as the CLI does, where the planner must first load every partition's catalog entries),
their server cost (EXPLAIN: buffers of the execution and of the planning, server ms),
archiving 1,000 rows, and removing the oldest week (DELETE in batches, ``ops.prune``,
against ``DROP TABLE`` of its partitions). Then, on the plain side, the steps of the
migration that keeps the old table as the first partition: how long each runs and under
which lock.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import models, ops
from sqla_jobs.sql import admin
from sqla_jobs.sql import workflows as workflows_sql

SPAN_DAYS = 98
#: side -> (partition key, partitions, closed partitions get a CHECK on their id range);
#: "plain" is today's table.
_SIDES: dict[str, tuple[str, int, bool]] = {
    "plain": ("", 0, False),
    "at 14": ("archived_at", 14, False),
    "at 30": ("archived_at", 30, False),
    "at 98": ("archived_at", 98, False),
    "at 14 ids": ("archived_at", 14, True),
    "at 98 ids": ("archived_at", 98, True),
    "id 14": ("id", 14, False),
    "id 98": ("id", 98, False),
}
ROWS_SQL = """
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, attempts,
                          worker, created_at, finished_at, result, workflow_id, step,
                          archived_at)
  SELECT 1000000000 + g, 'noop', 'default', 0, '{"n": 1}', 'done', at, 1, 'old:1',
         at - interval '1 day', at - interval '1 day', '{"ok": true}',
         CASE WHEN mod(g, 2) = 0 THEN md5((g / 10)::text)::uuid END,
         CASE WHEN mod(g, 2) = 0 THEN 's' || mod(g, 10) END,
         at
  FROM (SELECT g, now() - interval '%(span)s days'
                  + ((g / 10) * 10) * (interval '%(span)s days' / %(rows)s) AS at
        FROM generate_series(0, %(rows)s - 1) AS g) AS r
"""
_ARCHIVABLE = """
INSERT INTO jobs (kind, payload, status, attempts, finished_at)
  SELECT 'noop', '{}', 'done', 1, now() - interval '8 days' FROM generate_series(1, 1000)
"""

# Rows as the archiver writes them after the migration's bound (tomorrow).
_AFTER_BOUND = """
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, attempts,
                          created_at, finished_at, archived_at)
  SELECT 4000000000 + g, 'noop', 'default', 0, '{}', 'done', now(), 1, now(), now(),
         date_trunc('day', now()) + interval '1 day 1 hour'
  FROM generate_series(1, 1000) AS g
"""


def _partition(conn: psycopg.Connection[Any], key: str, partitions: int, rows: int) -> None:
    """``jobs_archive`` re-created empty as ``partitions`` ranges of ``key``: of
    ``archived_at`` over the span, and one ahead (what the archiver would create before
    it needs it); of ``id`` over the rows' ids, the first from MINVALUE, the last to
    MAXVALUE."""
    conn.execute("ALTER TABLE jobs_archive RENAME TO jobs_archive_plain")
    conn.execute(
        "CREATE TABLE jobs_archive (LIKE jobs_archive_plain INCLUDING DEFAULTS)"
        f" PARTITION BY RANGE ({key})"
    )
    conn.execute("DROP TABLE jobs_archive_plain")
    # A unique index of a partitioned table must hold the partition key.
    conn.execute(
        "ALTER TABLE jobs_archive ADD PRIMARY KEY "
        + ("(id)" if key == "id" else "(id, archived_at)")
    )
    conn.execute("CREATE INDEX jobs_archive_finished_at_idx ON jobs_archive (finished_at)")
    conn.execute(
        "CREATE INDEX jobs_archive_workflow_id_idx ON jobs_archive (workflow_id)"
        " WHERE workflow_id IS NOT NULL"
    )
    if key == "id":
        width = rows // partitions
        for n in range(partitions):
            low = "MINVALUE" if n == 0 else str(1_000_000_000 + n * width)
            high = "MAXVALUE" if n == partitions - 1 else str(1_000_000_000 + (n + 1) * width)
            conn.execute(
                f"CREATE TABLE jobs_archive_p{n} PARTITION OF jobs_archive"
                f" FOR VALUES FROM ({low}) TO ({high})"
            )
        return
    # Bounds from one now(): the rows' archived_at are relative to the same clock.
    statements = [
        r[0]
        for r in conn.execute(
            """
            SELECT format('CREATE TABLE jobs_archive_p%%s PARTITION OF jobs_archive
                           FOR VALUES FROM (%%L) TO (%%L)', n,
                          start + n * width, start + (n + 1) * width)
            FROM (SELECT date_trunc('hour', now()) - interval '1 day' * %s
                         - interval '1 hour' AS start,
                         (interval '1 day' * %s + interval '2 hours') / %s AS width) AS b,
                 generate_series(0, %s) AS n
            """,
            (SPAN_DAYS, SPAN_DAYS, partitions, partitions),
        )
    ]
    for statement in statements:  # the last one is ahead of now
        conn.execute(statement)


def _check_id_ranges(conn: psycopg.Connection[Any]) -> None:
    """Each closed partition (its range wholly before now: nothing is archived into it
    again) gets ``CHECK (id BETWEEN its least AND its greatest id)``, added NOT VALID then
    validated (a scan of that partition under SHARE UPDATE EXCLUSIVE). The planner's
    constraint exclusion (``constraint_exclusion = partition``, the default) then skips,
    for ``id = n``, every closed partition whose ids cannot hold n."""
    closed = conn.execute(
        """
        SELECT c.relname, min(a.id), max(a.id)
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        JOIN jobs_archive a ON a.tableoid = c.oid
        WHERE i.inhparent = 'jobs_archive'::regclass
          AND pg_get_expr(c.relpartbound, c.oid) NOT LIKE '%%MAXVALUE%%'
        GROUP BY c.relname
        HAVING max(a.archived_at) < now() - interval '1 day'
        """
    ).fetchall()
    for name, low, high in closed:
        conn.execute(
            f"ALTER TABLE {name} ADD CONSTRAINT {name}_ids"
            f" CHECK (id BETWEEN {low} AND {high}) NOT VALID"
        )
        conn.execute(f"ALTER TABLE {name} VALIDATE CONSTRAINT {name}_ids")


@contextmanager
def _side(side: str, rows: int) -> Iterator[tuple[str, sa.Engine]]:
    import run

    key, partitions, checks = _SIDES[side]
    with run._ours(f"bench_archive_{side.replace(' ', '_')}") as url, run._engine(url) as engine:
        with psycopg.connect(url, autocommit=True) as conn:
            if partitions:
                _partition(conn, key, partitions, rows)
            conn.execute(ROWS_SQL % {"span": SPAN_DAYS, "rows": rows})
            if checks:
                _check_id_ranges(conn)
            conn.execute("VACUUM ANALYZE")
        yield url, engine


def _ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _plans(engine: sa.Engine, job_id: int, workflow_id: Any) -> dict[str, Any]:
    import history

    statements = {
        "show archived": admin.get_archived_job(job_id),
        "result (archived)": admin.job_result(job_id),
        "workflow steps": workflows_sql.steps(workflow_id),
        "upstream (3 ids)": sa.select(models.jobs_archive.c.id).where(
            models.jobs_archive.c.id
            == sa.any_(sa.bindparam("ids", [job_id, job_id + 2, job_id + 4], ARRAY(sa.BigInteger)))
        ),
    }
    found = {}
    for name, stmt in statements.items():
        compiled = stmt.compile(dialect=engine.dialect)
        with engine.connect() as conn:
            for _ in range(2):
                plan = [
                    str(r[0])
                    for r in conn.exec_driver_sql(
                        f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {compiled}", dict(compiled.params)
                    )
                ]
                conn.rollback()
        found[name] = history._read_plan(plan)
    return found


def measure(url: str, engine: sa.Engine, rows: int, repeats: int) -> dict[str, float]:
    """Client milliseconds per operation on one side."""
    job_id = 1_000_000_000 + rows // 3 * 2  # a workflow step, archived about 33 days ago
    with engine.connect() as conn:
        workflow_id = conn.execute(
            sa.text("SELECT workflow_id FROM jobs_archive WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    out: dict[str, float] = {}
    cold = sa.create_engine(engine.url, poolclass=NullPool)
    with Session(engine) as s, Session(cold) as c:
        out["show archived (ops.get_job)"] = _ms(lambda: ops.get_job(s, job_id), repeats)
        out["result archived (ops.result)"] = _ms(lambda: ops.result(s, job_id), repeats)

        def steps() -> None:
            s.execute(workflows_sql.steps(workflow_id)).all()

        out["workflow steps"] = _ms(steps, repeats)

        def show_cold() -> None:
            ops.get_job(c, job_id)
            c.close()

        out["show archived, new connection"] = _ms(show_cold, max(5, repeats // 2))
        times = []
        for _ in range(3):
            with engine.begin() as conn:
                conn.exec_driver_sql(_ARCHIVABLE)
            t0 = time.perf_counter()
            assert ops.archive(s, timedelta(days=7)) == 1000
            times.append((time.perf_counter() - t0) * 1000)
        out["archive (1,000 rows)"] = statistics.median(times)
    cold.dispose()
    return out


def _drop_oldest_week(url: str, engine: sa.Engine, side: str) -> tuple[float, int]:
    """Milliseconds to remove the archived rows of the oldest week, and the rows removed:
    ``ops.prune`` (batched DELETEs) on the plain table, ``DROP TABLE`` of the partitions
    wholly in that week on a partitioned one. (By id, the first partition also holds
    the live part's small ids, archived just now: it cannot go; the next ones do.)"""
    key, partitions, _ = _SIDES[side]
    if not partitions:
        with engine.connect() as conn:
            before = conn.execute(sa.text("SELECT count(*) FROM jobs_archive")).scalar_one()
        with Session(engine) as s:
            t0 = time.perf_counter()
            ops.prune(s, timedelta(days=SPAN_DAYS - 7 + 1))  # finished_at = archived - 1 day
            ms = (time.perf_counter() - t0) * 1000
        with engine.connect() as conn:
            after = conn.execute(sa.text("SELECT count(*) FROM jobs_archive")).scalar_one()
        return ms, before - after
    width = (SPAN_DAYS + 2 / 24) / partitions
    whole = max(1, int(7 / width))
    first = 1 if key == "id" else 0
    with psycopg.connect(url, autocommit=True) as conn:
        before = conn.execute("SELECT count(*) FROM jobs_archive").fetchone()[0]  # type: ignore[index]
        t0 = time.perf_counter()
        for n in range(first, first + whole):
            conn.execute(f"DROP TABLE jobs_archive_p{n}")
        ms = (time.perf_counter() - t0) * 1000
        after = conn.execute("SELECT count(*) FROM jobs_archive").fetchone()[0]  # type: ignore[index]
    return ms, before - after


Step = tuple[str, str, float]  # what, the lock it takes, ms


def _timed(out: list[Step], conn: psycopg.Connection[Any], name: str, lock: str, *sql: str) -> None:
    t0 = time.perf_counter()
    for statement in sql:
        conn.execute(statement)
    out.append((name, lock, (time.perf_counter() - t0) * 1000))


def upgrade(conn: psycopg.Connection[Any], days: int = 1) -> list[Step]:
    """A plain ``jobs_archive`` put under a partitioned parent (by ``archived_at``), its
    rows left where they are as the first partition, from MINVALUE to ``days`` after
    today (later than any row: archiving goes on into it until the swap; a row past the
    bound fails the VALIDATE, before anything is swapped)."""
    out: list[Step] = []
    cut = conn.execute(
        "SELECT date_trunc('day', now()) + interval '1 day' * %s", (days,)
    ).fetchone()[0]  # type: ignore[index]
    bound = f"'{cut.isoformat()}'"
    ahead = f"'{(cut + timedelta(days=7)).isoformat()}'"
    shared = "SHARE UPDATE EXCLUSIVE (reads, archive, prune go on)"
    _timed(
        out,
        conn,
        "unique index (id, archived_at) on the old table, CONCURRENTLY",
        shared,
        "CREATE UNIQUE INDEX CONCURRENTLY jobs_archive_id_at ON jobs_archive (id, archived_at)",
    )
    _timed(
        out,
        conn,
        "CHECK (archived_at < bound) NOT VALID",
        "ACCESS EXCLUSIVE, no scan",
        "SET lock_timeout = '2s'",
        "ALTER TABLE jobs_archive ADD CONSTRAINT jobs_archive_old_range"
        f" CHECK (archived_at IS NOT NULL AND archived_at < {bound}) NOT VALID",
    )
    _timed(
        out,
        conn,
        "VALIDATE CONSTRAINT (scans the old table)",
        shared,
        "ALTER TABLE jobs_archive VALIDATE CONSTRAINT jobs_archive_old_range",
    )
    with conn.transaction():
        _timed(
            out,
            conn,
            "swap: rename, CREATE partitioned parent and its indexes, ATTACH the old"
            " table (the CHECK proves the range: no scan), one partition ahead",
            "ACCESS EXCLUSIVE on the old table, one transaction",
            "SET LOCAL lock_timeout = '2s'",
            "ALTER TABLE jobs_archive RENAME TO jobs_archive_old",
            # The parent's indexes take these names; the old ones are attached to them.
            "ALTER INDEX jobs_archive_finished_at_idx RENAME TO jobs_archive_old_finished_idx",
            "ALTER INDEX jobs_archive_workflow_id_idx RENAME TO jobs_archive_old_workflow_idx",
            "CREATE TABLE jobs_archive (LIKE jobs_archive_old INCLUDING DEFAULTS)"
            " PARTITION BY RANGE (archived_at)",
            "ALTER TABLE jobs_archive_old DROP CONSTRAINT jobs_archive_pkey",
            "ALTER TABLE jobs_archive_old ADD CONSTRAINT jobs_archive_old_pkey"
            " PRIMARY KEY USING INDEX jobs_archive_id_at",
            "ALTER TABLE jobs_archive ADD PRIMARY KEY (id, archived_at)",
            "ALTER TABLE jobs_archive ATTACH PARTITION jobs_archive_old"
            f" FOR VALUES FROM (MINVALUE) TO ({bound})",
            "CREATE INDEX jobs_archive_finished_at_idx ON jobs_archive (finished_at)",
            "CREATE INDEX jobs_archive_workflow_id_idx ON jobs_archive (workflow_id)"
            " WHERE workflow_id IS NOT NULL",
            "CREATE TABLE jobs_archive_next PARTITION OF jobs_archive"
            f" FOR VALUES FROM ({bound}) TO ({ahead})",
        )
    return out


def downgrade(conn: psycopg.Connection[Any], batch: int = 10_000) -> list[Step]:
    """Back to a plain ``jobs_archive``: the first partition detached and renamed back in
    one short transaction, then the rows archived since the upgrade moved into it in
    batches (absent from ``show`` until moved), its primary key ``(id)`` again."""
    out: list[Step] = []
    with conn.transaction():
        _timed(
            out,
            conn,
            "swap back: DETACH the first partition, rename both",
            "ACCESS EXCLUSIVE on the parent, one transaction",
            "SET LOCAL lock_timeout = '2s'",
            "ALTER TABLE jobs_archive DETACH PARTITION jobs_archive_old",
            "ALTER TABLE jobs_archive RENAME TO jobs_archive_parted",
            "ALTER TABLE jobs_archive_old RENAME TO jobs_archive",
            "ALTER TABLE jobs_archive DROP CONSTRAINT jobs_archive_old_range",
            "ALTER INDEX jobs_archive_pkey RENAME TO jobs_archive_parted_pkey",
            "ALTER INDEX jobs_archive_finished_at_idx RENAME TO jobs_archive_parted_finished_idx",
            "ALTER INDEX jobs_archive_workflow_id_idx RENAME TO jobs_archive_parted_workflow_idx",
            "ALTER INDEX jobs_archive_old_finished_idx RENAME TO jobs_archive_finished_at_idx",
            "ALTER INDEX jobs_archive_old_workflow_idx RENAME TO jobs_archive_workflow_id_idx",
        )
    t0 = time.perf_counter()
    moved = 0
    while True:
        with conn.transaction():
            n = conn.execute(
                "WITH picked AS (SELECT id, archived_at FROM jobs_archive_parted LIMIT %s),"
                " gone AS (DELETE FROM jobs_archive_parted p USING picked"
                "  WHERE p.id = picked.id AND p.archived_at = picked.archived_at"
                "  RETURNING p.*)"
                " INSERT INTO jobs_archive SELECT * FROM gone",
                (batch,),
            ).rowcount
        moved += n
        if n < batch:
            break
    out.append(
        (f"move {moved:,} newer rows back, {batch:,} a transaction", "row locks", _since(t0))
    )
    _timed(
        out,
        conn,
        "unique index (id), CONCURRENTLY",
        "SHARE UPDATE EXCLUSIVE",
        "CREATE UNIQUE INDEX CONCURRENTLY jobs_archive_id ON jobs_archive (id)",
    )
    with conn.transaction():
        _timed(
            out,
            conn,
            "primary key (id) from that index; drop the partitioned remains",
            "ACCESS EXCLUSIVE, no scan",
            "SET LOCAL lock_timeout = '2s'",
            "ALTER TABLE jobs_archive DROP CONSTRAINT jobs_archive_old_pkey",
            "ALTER TABLE jobs_archive ADD CONSTRAINT jobs_archive_pkey"
            " PRIMARY KEY USING INDEX jobs_archive_id",
            "DROP TABLE jobs_archive_parted",
        )
    return out


def _since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def round_trip(url: str, engine: sa.Engine) -> list[tuple[str, list[Step], int]]:
    """Upgrade, archive 1,000 rows into the new partition, downgrade, upgrade: each
    phase's steps and the archived rows counted after it (none may be lost)."""

    def count() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM jobs_archive")).scalar_one())

    def shape(conn: psycopg.Connection[Any]) -> set[tuple[Any, ...]]:
        # The plain table's indexes and constraints, by name and definition.
        return set(
            conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'jobs_archive'"
                " UNION ALL SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = 'jobs_archive'::regclass"
            ).fetchall()
        )

    phases = []
    with psycopg.connect(url, autocommit=True) as conn:
        before = shape(conn)
        phases.append(("upgrade", upgrade(conn), count()))
        with engine.begin() as c:
            c.exec_driver_sql(_ARCHIVABLE)
        with Session(engine) as s:
            assert ops.archive(s, timedelta(days=7)) == 1000
        # Archived before the bound (tomorrow): routed to the old table, now a partition.
        phases.append(("ops.archive of 1,000 rows", [], count()))
        conn.execute(_AFTER_BOUND)
        phases.append(("1,000 rows archived after the bound (the partition ahead)", [], count()))
        phases.append(("downgrade", downgrade(conn), count()))
        assert shape(conn) == before, shape(conn) ^ before
        # Its bound past the rows archived after the first one's.
        phases.append(("upgrade again", upgrade(conn, days=2), count()))
    return phases


def section(quick: bool, step: Callable[[str], None]) -> list[Any]:
    """Prints the table of this section (the run's rows are the look-up ratios)."""
    import run

    rows = int(os.environ.get("SQLA_JOBS_BENCH_ARCHIVE_ROWS", 1_000_000))
    repeats = 11 if quick else 21
    results: dict[str, dict[str, float]] = {}
    plans: dict[str, dict[str, Any]] = {}
    week: dict[str, tuple[float, int]] = {}
    migration: list[tuple[str, list[Step], int]] = []
    job_id = 1_000_000_000 + rows // 3 * 2
    chosen = os.environ.get("SQLA_JOBS_BENCH_ARCHIVE_SIDES")
    sides = [s for s in _SIDES if not chosen or s == "plain" or s in chosen.split(",")]
    for side in sides:
        step(f"archive partitions: {side}, {rows:,} archived rows")
        with _side(side, rows) as (url, engine):
            results[side] = measure(url, engine, rows, repeats)
            with engine.connect() as conn:
                wid = conn.execute(
                    sa.text("SELECT workflow_id FROM jobs_archive WHERE id = :id"), {"id": job_id}
                ).scalar_one()
            plans[side] = _plans(engine, job_id, wid)
            week[side] = _drop_oldest_week(url, engine, side)
            if side == "plain":
                migration = round_trip(url, engine)
    print(
        "  client ms (median) per side; 'at N': by archived_at, N partitions ('ids': closed"
        " ones CHECK their id range); 'id N': by id"
    )
    print("    " + " | ".join(["operation", *sides]))
    for name in results["plain"]:
        print(f"    {name} | " + " | ".join(f"{results[p][name]:.2f}" for p in sides))
    cells = [f"{week[p][0]:.0f} ms / {week[p][1]:,} rows" for p in sides]
    print("    remove the oldest week | " + " | ".join(cells))
    print("  server cost per statement: execution buffers / planning buffers / server ms:")
    for name in plans["plain"]:
        cells = [
            f"{plans[p][name].buffers} / {plans[p][name].planning_buffers} /"
            f" {plans[p][name].server_ms:.2f}"
            for p in sides
        ]
        print(f"    {name} | " + " | ".join(cells))
    print("  the migration's round trip on the plain side (after its week was pruned):")
    for phase, steps, archived in migration:
        print(f"    {phase}: {archived:,} archived rows after it")
        for name, lock, ms in steps:
            print(f"      {name} | {lock} | {ms:.0f} ms")
    out = []
    for side in sides[1:]:
        for name in ("show archived (ops.get_job)", "show archived, new connection"):
            out.append(
                run.Row.at_most(
                    "archive-partitions",
                    f"{name}: partitioned {side}",
                    results[side][name],
                    "ms",
                    "plain archive",
                    results["plain"][name],
                    1.2,
                )
            )
    return out
