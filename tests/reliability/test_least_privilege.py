"""Scenario 9: the worker and the enqueue path run as a role with only DML on jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import docpages
import psycopg
import pytest
import sqlalchemy as sa
from archivetime import WEEK, archive_at, migrated_long_ago, partition_name, partitions
from helpers import rows, scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from reliability.support import all_done, count, exactly_once, oracle, setup_app, spawn, stop_all
from sqla_jobs import enqueue, ops

pytestmark = pytest.mark.reliability

JOBS = 50

DOCS = Path(__file__).resolve().parents[2] / "docs" / "least-privilege.md"


def _docs_grants(db: str, role: str) -> str:
    """The GRANT statements of docs/least-privilege.md (its first sql block), for this
    test's role and database (the role is created by the fixture)."""
    block = next(b for b in docpages.blocks(DOCS) if b.language == "sql")
    statements = []
    for statement in block.code.split(";"):
        body = "\n".join(x for x in statement.splitlines() if not x.startswith("--")).strip()
        if body.startswith("GRANT"):
            statements.append(
                body.replace("app_jobs", role).replace("ON DATABASE app ", f'ON DATABASE "{db}" ')
            )
    assert any("jobs_archive_drop_before" in x for x in statements), statements
    return ";\n".join(statements) + ";"


#: The test handlers' own tables (not sqla_jobs'), as an application would grant them.
APP_GRANTS = """
GRANT SELECT, INSERT, UPDATE ON TABLE effects, runs TO {role};
GRANT USAGE ON SEQUENCE runs_id_seq TO {role};
"""

SCHEMA_SNAPSHOT = """
SELECT c.relname, c.relkind::text, pg_get_userbyid(c.relowner),
       (SELECT string_agg(a.attname || ':' || format_type(a.atttypid, a.atttypmod), ','
                          ORDER BY a.attnum)
          FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0),
       (SELECT string_agg(t.tgname, ',' ORDER BY t.tgname)
          FROM pg_trigger t WHERE t.tgrelid = c.oid)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public'
 ORDER BY 1
"""


@pytest.fixture
def dml_role(engine: sa.Engine, db_url: URL) -> Iterator[str]:
    role = f"sqla_jobs_dml_{uuid.uuid4().hex[:8]}"
    setup_app(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(_docs_grants(str(db_url.database), role))
        conn.exec_driver_sql(APP_GRANTS.format(role=role))
    try:
        yield role
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
            )
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")


@pytest.mark.parametrize(
    "ddl",
    [
        "CREATE TABLE intruder (x int)",
        "ALTER TABLE jobs ADD COLUMN intruder int",
        "CREATE INDEX intruder ON jobs (kind)",
        "DROP TABLE jobs",
        "TRUNCATE jobs",
        "ALTER TYPE job_status ADD VALUE 'intruder'",
        "DROP TRIGGER jobs_notify ON jobs",
        # The archive's partitions are made and dropped by revision 0022's functions.
        "CREATE TABLE intruder PARTITION OF jobs_archive"
        " FOR VALUES FROM ('2000-01-03') TO ('2000-01-10')",
        "DROP TABLE jobs_archive_p_initial",
    ],
)
def test_the_dml_role_cannot_run_ddl(db_url: URL, dml_role: str, ddl: str) -> None:
    engine = sa.create_engine(db_url.set(username=dml_role), poolclass=sa.NullPool)
    try:
        with pytest.raises(sa.exc.ProgrammingError) as info, engine.begin() as conn:
            conn.exec_driver_sql(ddl)
        assert isinstance(info.value.orig, psycopg.errors.InsufficientPrivilege)
    finally:
        engine.dispose()


def test_worker_and_enqueue_run_as_a_role_with_only_dml(
    engine: sa.Engine, db_url: URL, dml_role: str, tmp_path: Path
) -> None:
    before = rows(engine, SCHEMA_SNAPSHOT)
    assert before[[r[0] for r in before].index("jobs")][:3] == ("jobs", "r", "postgres")
    role_url = db_url.set(username=dml_role)
    role_engine = sa.create_engine(role_url, poolclass=sa.NullPool)
    log = tmp_path / "worker.log"
    try:
        with Session(role_engine) as s:
            for i in range(JOBS):
                enqueue(s, "work", {"i": i}, key=f"k{i}")
            assert enqueue(s, "work", {}, key="k0") is None  # ON CONFLICT works too
            s.commit()
        proc = spawn(role_url, log, "--concurrency", "2", "--lock-seconds", "1")
        try:
            wait_for(lambda: all_done(engine, JOBS), message="all jobs done by the DML role")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            stop_all([proc])
    finally:
        role_engine.dispose()
    out = log.read_text()
    assert "permission denied" not in out and "Traceback" not in out, out
    assert oracle(engine) == exactly_once(JOBS)
    assert count(engine, "SELECT count(DISTINCT worker) FROM jobs") == 1
    assert rows(engine, SCHEMA_SNAPSHOT) == before  # nothing created, altered or dropped


def test_the_dml_role_archives_and_prunes_through_the_partition_functions(
    engine: sa.Engine, db_url: URL, dml_role: str, tmp_path: Path
) -> None:
    """Partitions are created (by a worker's archiver) and dropped (by ``ops.prune``)
    for a role that owns nothing: revision 0022's SECURITY DEFINER functions."""
    start = migrated_long_ago(engine, 6)  # this week's partition does not exist yet
    role_url = db_url.set(username=dml_role)
    role_engine = sa.create_engine(role_url, poolclass=sa.NullPool)
    log = tmp_path / "worker.log"
    try:
        # Older weeks archived by the role itself, with an explicit time.
        old = archive_at(role_engine, start - 5 * WEEK + timedelta(days=1), 10, workflows=1)
        with Session(role_engine) as s:
            for i in range(JOBS):
                enqueue(s, "work", {"i": i})
            s.commit()
        proc = spawn(
            role_url,
            log,
            "--concurrency",
            "2",
            "--archive-every",
            "0.2",
            "--archive-older-than",
            "0s",
        )
        try:
            wait_for(
                lambda: (
                    count(engine, "SELECT count(*) FROM jobs_archive WHERE kind = 'work'") == JOBS
                ),
                message="the worker's archiver moved every job",
            )
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            stop_all([proc])
        assert partition_name(start) in partitions(engine)
        assert scalar(engine, f"SELECT count(*) FROM {partition_name(start)}") == JOBS
        cutoff = start - 3 * WEEK
        with Session(role_engine) as s:
            pruned = ops.prune(s, scalar(engine, "SELECT now()") - cutoff)
        assert pruned == len(old)
        assert partition_name(start - 5 * WEEK) not in partitions(engine)
    finally:
        role_engine.dispose()
    out = log.read_text()
    assert "permission denied" not in out and "Traceback" not in out, out
    owners = rows(
        engine,
        "SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'jobs_archive'::regclass",
    )
    assert owners == [("postgres",)]  # made by the functions, as their owner


def _monitor_statements(db: str, role: str) -> list[str]:
    """docs/least-privilege.md's monitoring role (its second sql block), for this test's
    role and database: the GRANTs (the role itself is made by the test)."""
    blocks = [b for b in docpages.blocks(DOCS) if b.language == "sql"]
    statements = []
    for statement in blocks[1].code.split(";"):
        body = "\n".join(x for x in statement.splitlines() if not x.startswith("--")).strip()
        if body.startswith("GRANT"):
            statements.append(
                body.replace("app_monitor", role).replace(
                    "ON DATABASE app ", f'ON DATABASE "{db}" '
                )
            )
    return statements


def _cli(url: URL, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": url.render_as_string(hide_password=False)}
    return subprocess.run(
        [sys.executable, "-m", "sqla_jobs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_pages_monitoring_role_reads_health_and_stats_a_role_without_grants_is_told_so(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app(engine)
    role, bare = (f"sqla_jobs_{name}_{uuid.uuid4().hex[:8]}" for name in ("mon", "bare"))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(f"CREATE ROLE {bare} LOGIN")
        for statement in _monitor_statements(str(db_url.database), role):
            conn.exec_driver_sql(statement)
    try:
        as_monitor = db_url.set(username=role)
        for args in (("health", "--json"), ("stats",), ("list",), ("workers",), ("partitions",)):
            done = _cli(as_monitor, *args)
            assert done.returncode in (0, 1) if args[0] == "health" else done.returncode == 0, (
                args,
                done.stderr,
            )
            assert "permission denied" not in done.stderr, (args, done.stderr)
        assert '"visibility"' not in _cli(as_monitor, "health", "--json").stdout
        refused = _cli(db_url.set(username=bare), "stats")
        assert refused.returncode == 2
        assert "this role may not read sqla_jobs' tables (permission denied for" in refused.stderr
        assert "a migration has not run" not in refused.stderr
    finally:
        with engine.begin() as conn:
            for name in (role, bare):
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    f" WHERE usename = '{name}'"
                )
                conn.exec_driver_sql(f"DROP OWNED BY {name}")
                conn.exec_driver_sql(f"DROP ROLE {name}")
