"""Revision 0022 (the partitioned ``jobs_archive``) run for real on a million archived rows (#25).

A scratch database at revision 0021 gets ``ROWS`` archived rows (generated in SQL:
archived evenly over the last 98 days, every other row a step of a five-step workflow,
as ``archive_partitions.py``) and a role granted ``SELECT, INSERT, UPDATE, DELETE`` on
``jobs_archive``. Then ``upgrade`` to 0022, ``downgrade`` to 0021, ``upgrade`` again,
through ``sqla_jobs.migrations`` (Alembic, the shipped revision), while a second
connection keeps archiving one row at a time (an ``INSERT`` into ``jobs_archive``, as
code built before 0022 does) and showing an archived job (``ops.get_job``).

Printed per phase: each statement the migration sent, its milliseconds and the strongest
lock the migrating backend held on ``jobs_archive`` (or its partitions) while it ran
(``pg_locks``, polled every 5 ms; a step shorter than that may show none), and
the longest archive and show of the second connection during the phase. Asserted: no
row lost or added (the count after each phase is the rows generated plus those the
second connection archived), the grants carried, and after the downgrade the table's
indexes and constraints are revision 0021's by name and definition.

    python benchmarks/archive_migration.py            # 1,000,000 rows
    SQLA_JOBS_BENCH_ARCHIVE_ROWS=100000 python benchmarks/archive_migration.py
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import archive_partitions
from _db import scratch_database

from sqla_jobs import config, migrations, ops, testing

BEFORE = "0021_leaf_steps"
SPAN_DAYS = 98
ROLE = "bench_archive_worker"

ARCHIVE_ONE = """
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, attempts,
                          created_at, finished_at, archived_at)
VALUES (nextval('jobs_id_seq'), 'noop', 'default', 0, '{}', 'done', now(), 1, now(), now(),
        statement_timestamp())
"""
SHAPE = """
SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'jobs_archive'
UNION ALL SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = 'jobs_archive'::regclass ORDER BY 1, 2
"""
LOCKS = """
SELECT l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid = %s AND l.granted AND c.relname LIKE 'jobs_archive%%' AND c.relkind IN ('r', 'p')
"""
#: Lock modes, weakest first.
MODES = [
    "AccessShareLock",
    "RowShareLock",
    "RowExclusiveLock",
    "ShareUpdateExclusiveLock",
    "ShareLock",
    "ShareRowExclusiveLock",
    "ExclusiveLock",
    "AccessExclusiveLock",
]


class Busy:
    """A second connection archiving one row and showing an archived job, in a loop;
    the longest of each since the last ``take()``."""

    def __init__(self, url: str, job_id: int) -> None:
        self.engine = sa.create_engine(config.database_url(url), poolclass=sa.NullPool)
        self.job_id = job_id
        self.stop = threading.Event()
        self.archived = 0
        self.errors: list[BaseException] = []
        self.longest = [0.0, 0.0]
        self.thread = threading.Thread(target=self.run)
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                with self.lock:  # counted with the table, never in between
                    with self.engine.begin() as conn:
                        conn.exec_driver_sql(ARCHIVE_ONE)
                    self.archived += 1
                t1 = time.perf_counter()
                with Session(self.engine) as s:
                    assert ops.get_job(s, self.job_id).archived_at is not None
                t2 = time.perf_counter()
                self.longest = [
                    max(self.longest[0], (t1 - t0) * 1000),
                    max(self.longest[1], (t2 - t1) * 1000),
                ]
                time.sleep(0.01)
        except BaseException as exc:  # reported by the caller
            self.errors.append(exc)

    def take(self) -> tuple[float, float]:
        out = (self.longest[0], self.longest[1])
        self.longest = [0.0, 0.0]
        return out


class Watch:
    """The migrating connection's statements, each timed, with the strongest lock its
    backend held on the archive's tables while it ran (polled from another one)."""

    def __init__(self, url: str, pid: int) -> None:
        self.url = url
        self.pid = pid
        self.stop = threading.Event()
        self.seen: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                now = time.perf_counter()
                for (mode,) in conn.execute(LOCKS, (self.pid,)):
                    self.seen.append((now, mode))
                time.sleep(0.005)

    def strongest(self, t0: float, t1: float) -> str:
        modes = [m for t, m in self.seen if t0 <= t <= t1]
        return max(modes, key=MODES.index, default="-")


@contextmanager
def _migrating(url: str) -> Iterator[tuple[sa.Connection, list[tuple[str, float, float, str]]]]:
    engine = sa.create_engine(config.database_url(url), poolclass=sa.NullPool)
    steps: list[tuple[str, float, float, str]] = []

    @event.listens_for(engine, "connect")
    def connect(dbapi_conn: Any, record: Any) -> None:
        record.info["pid"] = dbapi_conn.info.backend_pid

    @event.listens_for(engine, "before_cursor_execute")
    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        conn.info["t0"] = time.perf_counter()
        conn.info["pid"] = cursor.connection.info.backend_pid

    @event.listens_for(engine, "after_cursor_execute")
    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        t1 = time.perf_counter()
        # What this backend holds now: in a transaction, every lock taken since its start.
        held = [m for (m,) in cursor.connection.execute(LOCKS, (conn.info["pid"],))]
        steps.append(
            (
                " ".join(statement.split()),
                conn.info["t0"],
                t1,
                max(held, key=MODES.index, default="-"),
            )
        )

    try:
        with engine.connect() as conn:
            yield conn, steps
    finally:
        engine.dispose()


def _count(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT count(*) FROM jobs_archive").fetchone()[0])  # type: ignore[index]


def _shape(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return list(conn.execute(SHAPE).fetchall())


def _phase(url: str, busy: Busy, name: str, revision: str) -> dict[str, Any]:
    with _migrating(url) as (conn, steps):
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        conn.commit()
        steps.clear()
        conn.info["pid"] = pid
        watch = Watch(url, pid)
        watch.thread.start()
        busy.take()
        t0 = time.perf_counter()
        try:
            if revision == BEFORE:
                migrations.downgrade(conn, revision)
            else:
                migrations.upgrade(conn, revision)
        finally:
            total = (time.perf_counter() - t0) * 1000
            watch.stop.set()
            watch.thread.join()
    archive_ms, show_ms = busy.take()
    rows = []
    for statement, s0, s1, after in steps:
        if "alembic_version" in statement or statement.startswith(
            ("SELECT set_config", "SELECT current_", "SELECT pg_catalog")
        ):
            continue
        lock = max(
            watch.strongest(s0, s1), after, key=lambda m: MODES.index(m) if m in MODES else -1
        )
        rows.append((statement[:110], (s1 - s0) * 1000, lock))
    return {
        "name": name,
        "total": total,
        "steps": rows,
        "archive_ms": archive_ms,
        "show_ms": show_ms,
    }


def run(rows: int) -> None:
    with scratch_database("bench_archive_migration") as url:
        testing.migrate(url, BEFORE)
        with psycopg.connect(url, autocommit=True) as conn:
            t0 = time.perf_counter()
            conn.execute(archive_partitions.ROWS_SQL % {"span": SPAN_DAYS, "rows": rows})
            conn.execute("VACUUM ANALYZE jobs_archive")
            took = time.perf_counter() - t0
            print(f"  {rows:,} archived rows generated and vacuumed in {took:.1f} s")
            conn.execute(
                f"DO $$ BEGIN CREATE ROLE {ROLE}; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            )
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON jobs_archive TO {ROLE}")
        shape = _shape(url)
        busy = Busy(url, 1_000_000_000 + rows // 3 * 2)
        busy.thread.start()
        phases = []
        try:
            for name, revision in (
                ("upgrade", "heads"),
                ("downgrade", BEFORE),
                ("upgrade again", "heads"),
            ):
                phase = _phase(url, busy, name, revision)
                with busy.lock:
                    phase["rows"] = _count(url)
                    phase["expected"] = rows + busy.archived
                if revision == BEFORE:
                    phase["shape_ok"] = _shape(url) == shape
                phases.append(phase)
        finally:
            busy.stop.set()
            busy.thread.join()
        with psycopg.connect(url) as conn:
            grants = conn.execute(
                "SELECT string_agg(privilege_type, ',' ORDER BY privilege_type)"
                " FROM information_schema.role_table_grants"
                " WHERE table_name = 'jobs_archive' AND grantee = %s",
                (ROLE,),
            ).fetchone()[0]  # type: ignore[index]
            parts = conn.execute(
                "SELECT partition, upper_bound FROM jobs_archive_partitions()"
            ).fetchall()
            conn.execute(f"DROP OWNED BY {ROLE}")
            conn.execute(f"DROP ROLE {ROLE}")
            conn.commit()
    assert busy.errors == [], busy.errors
    for phase in phases:
        print(
            f"  {phase['name']}: {phase['total']:.0f} ms; {phase['rows']:,} rows after it"
            f" (expected {phase['expected']:,}); the second connection's longest archive"
            f" {phase['archive_ms']:.0f} ms, show {phase['show_ms']:.0f} ms"
            + (
                f"; 0021's indexes and constraints: {phase['shape_ok']}"
                if "shape_ok" in phase
                else ""
            )
        )
        for statement, ms, lock in phase["steps"]:
            print(f"    {ms:9.1f} ms | {lock:24} | {statement}")
        assert phase["rows"] == phase["expected"], phase
        assert phase.get("shape_ok", True), phase["name"]
    print(f"  grants on jobs_archive for {ROLE} after it all: {grants}")
    print(f"  partitions: {[(p, str(u)) for p, u in parts]}")
    assert grants == "DELETE,INSERT,SELECT,UPDATE"


def section(quick: bool, step: Any) -> list[Any]:
    rows = int(os.environ.get("SQLA_JOBS_BENCH_ARCHIVE_ROWS", 100_000 if quick else 1_000_000))
    step(f"archive migration: revision 0022 both ways on {rows:,} archived rows")
    run(rows)
    return []


if __name__ == "__main__":
    run(int(os.environ.get("SQLA_JOBS_BENCH_ARCHIVE_ROWS", 1_000_000)))
