"""``ops.health`` and ``sqla-jobs health`` (issue #25) on real PostgreSQL.

What holds the horizon is made for real: a REPEATABLE READ transaction left open on
another connection, a prepared transaction (where the server allows them). Thresholds
of zero make a finding without waiting for a clock.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import scalar, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from test_ops import insert
from test_ops_cli import cli

from sqla_jobs import ConfigError, config, ops, testing
from sqla_jobs.sql import health as health_sql


@pytest.fixture
def held(engine: sa.Engine) -> Iterator[int]:
    """A REPEATABLE READ transaction of 'nightly-report', idle in transaction: its pid."""
    with engine.connect() as conn:
        conn.exec_driver_sql("SET application_name = 'nightly-report'")
        conn.commit()
        conn.exec_driver_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.exec_driver_sql("SELECT count(*) FROM jobs").scalar_one()  # takes the snapshot
        yield conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        conn.rollback()


def test_health_names_the_repeatable_read_transaction_holding_the_horizon(
    session: Session, held: int
) -> None:
    found = ops.health(session, max_transaction_age=timedelta(0))
    holder = next(h for h in found.horizon if h.name == str(held))
    assert holder.holder == "session"
    assert holder.detail["application_name"] == "nightly-report"
    assert holder.detail["state"] == "idle in transaction"
    assert holder.age_seconds is not None and holder.age_seconds >= 0
    assert holder.detail["query_start"] is not None
    finding = next(f for f in found.findings if f.subject == f"pid {held}")
    assert finding.check == "transaction" and "nightly-report" in finding.message
    assert "idle_in_transaction_session_timeout" in finding.advice
    assert f"pg_terminate_backend({held})" in finding.advice
    assert not found.ok
    # Under the default threshold (5 minutes) the same young transaction is no finding.
    assert not [f for f in ops.health(session).findings if f.check == "transaction"]


def test_health_leaves_out_its_own_connection_and_committed_sessions(
    session: Session, engine: sa.Engine
) -> None:
    with engine.connect() as conn:  # a session that committed holds nothing
        conn.exec_driver_sql("SELECT txid_current()")
        conn.commit()
        # health reads on a connection of its own, whose snapshot is always the
        # newest: with a zero threshold it would be a finding if it were not left out.
        found = ops.health(session, max_transaction_age=timedelta(0))
    assert found.horizon == () and found.ok, found.findings


def test_health_command_exits_1_naming_the_pid_and_age_and_0_when_healthy(
    db_url: URL, engine: sa.Engine
) -> None:
    clean = cli(db_url, "health")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "OK: every check is within its threshold." in clean.stdout
    with engine.connect() as conn:
        conn.exec_driver_sql("SET application_name = 'nightly-report'")
        conn.commit()
        conn.exec_driver_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.exec_driver_sql("SELECT 1").scalar_one()
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        result = cli(db_url, "health", "--max-transaction-age", "0s")
        as_json = cli(db_url, "health", "--max-transaction-age", "0s", "--json")
        conn.rollback()
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"PROBLEM [transaction] pid {pid} (nightly-report" in result.stdout
    assert "what to do: end it (SELECT pg_terminate_backend" in result.stdout
    row = next(line for line in result.stdout.splitlines() if f" {pid} " in line)
    assert row.split()[0] == "session"
    assert as_json.returncode == 1
    data = json.loads(as_json.stdout)
    assert data["ok"] is False
    assert [h["name"] for h in data["horizon"]].count(str(pid)) == 1
    assert data["thresholds"]["max_transaction_age"] == 0.0


@pytest.fixture
def prepared_url(engine: sa.Engine, db_url: URL) -> Iterator[URL]:
    """A migrated database on a server that allows prepared transactions: the shared one
    if its max_prepared_transactions > 0, else a private embedded server started with 4
    (the setting needs a restart, which a shared server must not get)."""
    if scalar(engine, "SELECT current_setting('max_prepared_transactions')::int"):
        yield db_url
        return
    try:
        import pgserver
    except ImportError:
        pytest.skip(
            "the server has max_prepared_transactions = 0 and the embedded server "
            "(pip install 'sqla-jobs[embedded]') is missing to start one that allows them"
        )
    # Run as root, pgserver starts the server as its own user, which must reach the
    # directory: a fresh one under /tmp (pgserver opens it up), not pytest's tmp_path.
    parent = Path(tempfile.mkdtemp(prefix="sqla_jobs_prepared_"))
    data = parent / "data"
    first = pgserver.get_server(str(data), cleanup_mode="stop")  # type: ignore[attr-defined]
    first.psql("ALTER SYSTEM SET max_prepared_transactions = 4;")
    first.cleanup()  # stopped: the setting takes effect at the next start
    server = pgserver.get_server(str(data), cleanup_mode="delete")  # type: ignore[attr-defined]
    try:
        admin = config.database_url(server.get_uri())
        url = testing.create_database(admin, "health_prepared")
        testing.migrate(url)
        yield url
    finally:
        server.cleanup()
        shutil.rmtree(parent, ignore_errors=True)


def test_health_finds_a_prepared_transaction(prepared_url: URL) -> None:
    engine = sa.create_engine(prepared_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        conn.exec_driver_sql("BEGIN")
        conn.exec_driver_sql("SELECT txid_current()")
        conn.exec_driver_sql("PREPARE TRANSACTION 'forgotten-2pc'")
    try:
        with Session(engine) as session:
            found = ops.health(session, max_transaction_age=timedelta(0))
        holder = next(h for h in found.horizon if h.holder == "prepared")
        assert holder.name == "forgotten-2pc" and holder.xid_age is not None
        finding = next(f for f in found.findings if f.check == "prepared")
        assert "ROLLBACK PREPARED 'forgotten-2pc'" in finding.advice
        result = cli(prepared_url, "health", "--max-transaction-age", "0s")
        assert result.returncode == 1, result.stdout + result.stderr
        assert "PROBLEM [prepared] prepared transaction 'forgotten-2pc'" in result.stdout
    finally:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ROLLBACK PREPARED 'forgotten-2pc'")
        engine.dispose()


def test_health_reports_expired_leases_waiting_jobs_and_stale_workers(
    session: Session, engine: sa.Engine, db_url: URL
) -> None:
    insert(
        engine,
        """
        INSERT INTO jobs (kind, payload, status, run_at, locked_until, attempts, priority)
        VALUES ('noop', '{}', 'running', now(), now() - interval '10 minutes', 1, 5),
               ('noop', '{}', 'running', now(), now() + interval '10 minutes', 1, 5),
               ('noop', '{}', 'queued', now() - interval '20 minutes', NULL, 0, 9),
               ('noop', '{}', 'queued', now() - interval '1 minute', NULL, 0, 0),
               ('noop', '{}', 'queued', now() + interval '1 day', NULL, 0, 0);
        INSERT INTO jobs_workers (id, host, pid, version, queues, kinds, concurrency,
                                  started_at, heartbeat_at, expires_at)
        VALUES ('w-hung', 'box', 4242, '0', '{default}', '{noop}', 1,
                now() - interval '1 hour', now() - interval '5 minutes', now() + interval '1 hour'),
               ('w-fine', 'box', 4243, '0', '{default}', '{noop}', 1,
                now(), now(), now() + interval '30 seconds')
        """,
    )
    found = ops.health(session)
    assert found.expired_leases == 1
    assert found.oldest_ready_seconds is not None and 1190 < found.oldest_ready_seconds < 1300
    assert [w.id for w in found.stale_workers] == ["w-hung"]
    assert sorted(f.check for f in found.findings) == [
        "expired_leases",
        "ready_age",
        "stale_workers",
    ]
    lenient = ops.health(
        session,
        max_expired_leases=1,
        max_ready_age=timedelta(hours=1),
        max_heartbeat_age=timedelta(hours=1),
    )
    assert lenient.ok, lenient.findings
    result = cli(db_url, "health")
    assert result.returncode == 1
    assert "PROBLEM [stale_workers] worker w-hung (pid 4242 on box)" in result.stdout
    assert cli(db_url, "health", "--max-expired-leases", "1", "--max-ready-age", "1h",
               "--max-heartbeat-age", "1h").returncode == 0  # fmt: skip


def test_health_reports_dead_tuples_and_hot_updates_of_the_jobs_table(
    session: Session, engine: sa.Engine
) -> None:
    insert(
        engine,
        "INSERT INTO jobs (kind, payload) SELECT 'noop', '{}' FROM generate_series(1, 2000)",
    )
    insert(engine, "DELETE FROM jobs WHERE id % 2 = 0")

    def counted() -> Any:
        found = ops.health(session, max_dead_tuples=500, max_dead_ratio=0.1)
        jobs = next(t for t in found.tables if t.name == "jobs")
        return found if jobs.dead_tuples >= 1000 else None

    found = wait_for(counted, message="the statistics collector counting the deletes")
    jobs = next(t for t in found.tables if t.name == "jobs")
    assert jobs.live_tuples == 1000 and jobs.table_bytes > 0 and jobs.index_bytes > 0
    assert {t.name for t in found.tables} == {"jobs", "jobs_archive", "jobs_workers"}
    finding = next(f for f in found.findings if f.check == "dead_tuples")
    assert finding.subject == "jobs" and "VACUUM (ANALYZE) jobs" in finding.advice
    # Never vacuumed, with 1,000 dead tuples: the vacuum check too.
    assert "vacuum" in {f.check for f in found.findings}
    assert not [f for f in ops.health(session).findings if f.check == "dead_tuples"]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"max_dead_ratio": 2}, "max_dead_ratio must be between 0 and 1, got 2"),
        ({"max_dead_tuples": -1}, "max_dead_tuples must be a non-negative integer, got -1"),
        ({"max_ready_age": 300}, "max_ready_age must be a timedelta (e.g. timedelta(minutes=5))"),
        ({"max_ready_age": timedelta(seconds=-1)}, "max_ready_age must be >= 0"),
        ({"max_age": timedelta(1)}, "unknown health threshold max_age: use max_transaction_age"),
    ],
)
def test_bad_thresholds_are_refused_with_their_name(
    session: Session, given: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        ops.health(session, **given)
    assert message in str(caught.value)


def test_bad_threshold_flags_exit_2_naming_the_flag(db_url: URL) -> None:
    cases = {
        ("--max-dead-ratio", "1.5"): "--max-dead-ratio '1.5': max_dead_ratio must be between",
        ("--max-dead-tuples", "many"): "--max-dead-tuples 'many': not a number: 'many'",
        ("--max-ready-age", "5x"): "--max-ready-age '5x': invalid duration '5x'",
    }
    for args, message in cases.items():
        result = cli(db_url, "health", *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_stats_json_carries_the_health(db_url: URL) -> None:
    result = cli(db_url, "stats", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["health"]["ok"] is True and data["health"]["tables"][0]["name"] == "jobs"


def test_health_async_reads_the_same_on_an_async_session(db_url: URL, held: int) -> None:
    async def scenario() -> Any:
        engine = create_async_engine(db_url)
        try:
            async with AsyncSession(engine) as session:
                return await ops.health_async(session, max_transaction_age=timedelta(0))
        finally:
            await engine.dispose()

    found = asyncio.run(scenario())
    assert str(held) in {f.subject.removeprefix("pid ") for f in found.findings}


HISTORY_PLANS: dict[str, tuple[Callable[[], sa.Select[Any]], str]] = {
    "expired_leases": (lambda: health_sql.expired_leases(60.0), "jobs_status_id_idx"),
    "oldest_ready": (lambda: health_sql.oldest_ready(), "jobs_claim_idx"),
}


def test_health_reads_no_history_on_200k_finished_rows(engine: sa.Engine) -> None:
    insert(
        engine,
        """
        INSERT INTO jobs (kind, payload, status, finished_at)
        SELECT 'noop', '{}', 'done', now() - g * interval '1 second'
          FROM generate_series(1, 200000) AS g;
        INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at,
                                  attempts, created_at, finished_at)
        SELECT -g, 'noop', 'default', 0, '{}', 'done', now(), 1, now(), now()
          FROM generate_series(1, 200000) AS g;
        INSERT INTO jobs (kind, payload, status, locked_until, attempts)
        SELECT 'noop', '{}', 'running', now() + interval '1 minute', 1
          FROM generate_series(1, 50)
        """,
    )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE jobs")
        conn.exec_driver_sql("VACUUM ANALYZE jobs_archive")
    plans = {}
    with engine.connect() as conn:
        for name, (build, index) in HISTORY_PLANS.items():
            compiled = build().compile(dialect=conn.dialect)
            plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params).scalars())
            plans[name] = plan
            assert "Seq Scan" not in plan and index in plan, plan
        catalog = (
            health_sql.horizon_sessions(),
            health_sql.horizon_slots(),
            health_sql.horizon_prepared(),
            health_sql.tables(["jobs", "jobs_archive"]),
            health_sql.stale_workers(60.0),
        )
        for stmt in catalog:
            compiled = stmt.compile(dialect=conn.dialect)
            plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params).scalars())
            assert " on jobs " not in plan and " on jobs_archive " not in plan, plan
    print(json.dumps(plans, indent=1))  # the evidence, with -s


def test_health_threshold_written_with_a_leading_minus_is_explained_not_reported_missing(
    db_url: URL,
) -> None:
    spaced = cli(db_url, "health", "--max-transaction-age", "-1s")
    assert spaced.returncode == 2
    assert (
        "argument --max-transaction-age: expected one argument "
        "(a value starting with '-' is written --max-transaction-age=VALUE)"
    ) in spaced.stderr
    joined = cli(db_url, "health", "--max-transaction-age=-1s")
    assert joined.returncode == 2
    assert "--max-transaction-age '-1s': invalid duration '-1s'" in joined.stderr
