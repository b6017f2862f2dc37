"""``ops.health`` and ``sqla-jobs health`` (issue #25) on real PostgreSQL.

What holds the horizon is made for real: a REPEATABLE READ transaction left open on
another connection, a prepared transaction (where the server allows them). Thresholds
of zero make a finding without waiting for a clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
import threading
import uuid
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

from sqla_jobs import ConfigError, _health, config, ops, testing
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
    ready = next(f for f in found.findings if f.check == "ready_age")
    assert "the oldest ready job (queue 'default', kind 'noop') has waited" in ready.message
    assert "workers are behind or none serves queue 'default' or kind 'noop'" in ready.advice
    stale = next(f for f in found.findings if f.check == "stale_workers")
    assert (
        "its jobs come back to the queue when their leases expire and a live worker rescues "
        "them; `sqla-jobs workers` lists it until its lease expires at "
    ) in stale.advice
    assert "no other worker" not in stale.advice  # w-fine is live and on time
    result = cli(db_url, "health")
    assert result.returncode == 1
    assert "PROBLEM [stale_workers] worker w-hung (pid 4242 on box)" in result.stdout
    assert cli(db_url, "health", "--max-expired-leases", "1", "--max-ready-age", "1h",
               "--max-heartbeat-age", "1h").returncode == 0  # fmt: skip


def test_health_reports_dead_tuples_and_hot_updates_of_the_jobs_table(
    session: Session, engine: sa.Engine
) -> None:
    insert(engine, "ALTER TABLE jobs SET (autovacuum_enabled = false)")  # no vacuum meanwhile
    with engine.connect() as conn:  # statistics begin now (stats_reset)
        conn.exec_driver_sql("SELECT pg_stat_reset()")
        conn.commit()
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
    assert not [f for f in ops.health(session).findings if f.check == "dead_tuples"]


def test_a_never_vacuumed_table_is_as_old_as_its_databases_statistics(
    session: Session, engine: sa.Engine
) -> None:
    """A brand-new database's table with 1,000+ dead tuples is not "vacuumed never, over
    24h00m ago": its age counts from when statistics began (stats_reset, else the
    server's start), and the finding names that moment."""
    insert(engine, "ALTER TABLE jobs SET (autovacuum_enabled = false)")  # no vacuum meanwhile
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT pg_stat_reset()")
        conn.commit()
    insert(
        engine,
        "INSERT INTO jobs (kind, payload) SELECT 'noop', '{}' FROM generate_series(1, 2000)",
    )
    insert(engine, "DELETE FROM jobs WHERE id % 2 = 0")

    def counted() -> Any:
        found = ops.health(session)
        jobs = next(t for t in found.tables if t.name == "jobs")
        return found if jobs.dead_tuples >= 1000 else None

    found = wait_for(counted, message="the statistics collector counting the deletes")
    since = scalar(
        engine, "SELECT stats_reset FROM pg_stat_database WHERE datname = current_database()"
    )
    assert found.stats_since == since
    # Autovacuum is off for this table (and, on the suite's server, for all): that is a
    # finding at once. The age rule is the one for a table autovacuum runs on: the same
    # figures, read as if it did.
    (off,) = [f for f in found.findings if f.check == "vacuum"]
    assert "autovacuum is off" in off.message
    as_if_on = dataclasses.replace(
        found,
        tables=tuple(
            dataclasses.replace(t, server_autovacuum=True, table_autovacuum=True)
            for t in found.tables
        ),
    )
    assert not [f for f in _health._findings(as_if_on, found.thresholds) if f.check == "vacuum"]
    strict = _health._thresholds({"max_vacuum_age": timedelta(0)})
    finding = next(f for f in _health._findings(as_if_on, strict) if f.check == "vacuum")
    assert finding.subject == "jobs"
    assert (
        f"jobs has {next(t for t in found.tables if t.name == 'jobs').dead_tuples} dead "
        f"tuples and no vacuum recorded since {since.isoformat(timespec='seconds')}, over 0s ago"
    ) in finding.message
    assert "never" not in finding.message


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


@pytest.fixture
def stats_blind_url(engine: sa.Engine, db_url: URL) -> Iterator[URL]:
    """A login role of the test's own with the least-privilege grants and without
    pg_read_all_stats: the URL of the test's database as that role."""
    role = f"health_{uuid.uuid4().hex[:8]}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    try:
        yield db_url.set(username=role, password=None)
    finally:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")


def test_health_without_pg_read_all_stats_says_it_cannot_see_other_roles_transactions(
    stats_blind_url: URL, held: int
) -> None:
    """Run as a least-privilege role, another role's old REPEATABLE READ has no visible
    age: health says so (a ``visibility`` finding, exit 1), shows the age as hidden,
    and the worker's findings gauge counts it."""
    role = stats_blind_url.username
    blind = sa.create_engine(stats_blind_url, poolclass=sa.NullPool)
    try:
        with Session(blind) as session:
            found = ops.health(session, max_transaction_age=timedelta(0))
            holder = next(h for h in found.horizon if h.name == str(held))
            assert holder.age_seconds is None and holder.detail["hidden"] is True
            assert found.reader == role and found.sees_other_roles is False
            finding = next(f for f in found.findings if f.check == "visibility")
            assert finding.subject == role
            assert (
                f"role {role} is neither a superuser nor a member of pg_read_all_stats: "
                "health cannot see other roles' transaction ages, states and queries, so it "
                "cannot flag an old transaction of another role"
            ) in finding.message
            assert finding.advice == f"as a superuser: GRANT pg_read_all_stats TO {role}"
            metrics = pytest.importorskip("sqla_jobs.metrics")
            gauges = metrics.Metrics()
            gauges.refresh_health(session)
            text = gauges.client.generate_latest(gauges.registry).decode()
            assert 'sqla_jobs_health_findings{check="visibility"} 1.0' in text
    finally:
        blind.dispose()
    result = cli(stats_blind_url, "health")
    assert result.returncode == 1, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if f" {held} " in line)
    assert row.split()[:3] == ["session", str(held), "hidden"]
    assert f"PROBLEM [visibility] role {role} is neither a superuser" in result.stdout
    assert f"what to do: as a superuser: GRANT pg_read_all_stats TO {role}" in result.stdout


def test_a_superuser_or_member_of_pg_read_all_stats_gets_no_visibility_finding(
    engine: sa.Engine, stats_blind_url: URL, held: int
) -> None:
    role = stats_blind_url.username
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"GRANT pg_read_all_stats TO {role}")
    blind = sa.create_engine(stats_blind_url, poolclass=sa.NullPool)
    try:
        with Session(blind) as session:
            found = ops.health(session, max_transaction_age=timedelta(0))
    finally:
        blind.dispose()
    assert found.sees_other_roles and "visibility" not in {f.check for f in found.findings}
    holder = next(h for h in found.horizon if h.name == str(held))
    assert holder.age_seconds is not None and not holder.detail["hidden"]
    assert f"pid {held}" in {f.subject for f in found.findings if f.check == "transaction"}


@pytest.fixture
def inactive_slot(engine: sa.Engine) -> Iterator[str]:
    """A physical slot that reserves WAL now and that nothing reads (no xmin)."""
    name = f"health_{uuid.uuid4().hex[:8]}"
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"SELECT pg_create_physical_replication_slot('{name}', true)")
    except sa.exc.DBAPIError as exc:
        pytest.skip(f"this server cannot create a replication slot: {exc.orig}")
    try:
        yield name
    finally:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"SELECT pg_drop_replication_slot('{name}')")


def test_an_inactive_replication_slot_without_xmin_is_flagged_with_the_wal_it_retains(
    session: Session, engine: sa.Engine, db_url: URL, inactive_slot: str
) -> None:
    insert(engine, "SELECT pg_switch_wal()")  # some WAL past the slot's restart_lsn
    found = ops.health(session)  # default thresholds: an inactive slot is flagged at any age
    holder = next(h for h in found.horizon if h.name == inactive_slot)
    assert holder.xid_age is None and holder.detail["active"] is False
    wal = holder.detail["retained_wal_bytes"]
    assert isinstance(wal, int) and wal > 0
    finding = next(f for f in found.findings if f.subject == inactive_slot)
    assert finding.check == "slot"
    assert (
        f"inactive physical replication slot '{inactive_slot}' retains {wal} bytes of WAL"
    ) in finding.message
    assert "the disk fills" in finding.message
    assert (
        f"drop it if nobody reads it (SELECT pg_drop_replication_slot('{inactive_slot}'))"
    ) in finding.advice
    result = cli(db_url, "health")
    assert result.returncode == 1, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if f" {inactive_slot} " in line)
    assert row.split()[0] == "slot" and row.split()[-1] == "inactive"
    assert f"PROBLEM [slot] inactive physical replication slot '{inactive_slot}'" in result.stdout


def test_with_no_live_worker_the_ready_age_and_stale_worker_advice_say_start_one(
    session: Session, engine: sa.Engine
) -> None:
    insert(
        engine,
        """
        INSERT INTO jobs (kind, payload, queue, run_at)
        VALUES ('mail', '{}', 'emails', now() - interval '20 minutes');
        INSERT INTO jobs_workers (id, host, pid, version, queues, kinds, concurrency,
                                  started_at, heartbeat_at, expires_at)
        VALUES ('w-gone', 'box', 4242, '0', '{emails}', '{mail}', 1,
                now() - interval '1 hour', now() - interval '5 minutes', now() + interval '1 hour')
        """,
    )
    found = ops.health(session)
    assert found.live_workers == 0
    assert (found.oldest_ready_queue, found.oldest_ready_kind) == ("emails", "mail")
    ready = next(f for f in found.findings if f.check == "ready_age")
    assert "the oldest ready job (queue 'emails', kind 'mail') has waited" in ready.message
    assert ready.advice == (
        "no worker is live and on time (`sqla-jobs workers` lists none, or only late ones: "
        "stale_workers): start one that serves queue 'emails'"
    )
    # `sqla-jobs workers` still lists w-gone (its lease runs an hour): the advice says so.
    assert [w.id for w in ops.workers(session)] == ["w-gone"]
    stale = next(f for f in found.findings if f.check == "stale_workers")
    assert "when their leases expire and a live worker rescues them" in stale.advice
    assert "; `sqla-jobs workers` lists it until its lease expires at " in stale.advice
    assert stale.advice.endswith("; no other worker is live and on time: start one")
    insert(engine, "UPDATE jobs_workers SET expires_at = now() - interval '1 minute'")
    stale = next(f for f in ops.health(session).findings if f.check == "stale_workers")
    assert "; its lease expired: `sqla-jobs workers` no longer lists it;" in stale.advice


@pytest.fixture
def active(engine: sa.Engine) -> Iterator[int]:
    """A transaction that wrote and is running a long statement (state active): its pid."""
    pids: list[int] = []

    def run() -> None:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET application_name = 'long-report'")
            pids.append(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
            conn.exec_driver_sql("SELECT txid_current()")
            with pytest.raises(sa.exc.DBAPIError):  # cancelled at the end of the test
                conn.exec_driver_sql("SELECT pg_sleep(60)")
            conn.rollback()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(lambda: pids, message="the session's pid")
    pid = pids[0]
    wait_for(
        lambda: (
            scalar(engine, "SELECT state FROM pg_stat_activity WHERE pid = :p", p=pid) == "active"
        ),
        message="the long statement running",
    )
    yield pid
    scalar(engine, "SELECT pg_cancel_backend(:p)", p=pid)
    thread.join(30)


def test_an_active_transactions_advice_is_statement_timeout_and_an_idle_ones_the_idle_timeout(
    session: Session, active: int, held: int
) -> None:
    found = ops.health(session, max_transaction_age=timedelta(0))
    by_pid = {f.subject: f for f in found.findings if f.check == "transaction"}
    running, idle = by_pid[f"pid {active}"], by_pid[f"pid {held}"]
    assert "long-report" in running.message and ", active)" in running.message
    for finding, pid in ((running, active), (idle, held)):
        assert finding.advice.startswith(
            f"end it (SELECT pg_terminate_backend({pid}); another role's session takes a "
            "superuser, a member of that role or of pg_signal_backend)"
        )
    assert (
        "on PostgreSQL 15-16 neither idle_in_transaction_session_timeout nor "
        "transaction_timeout (17+ only) stops an active transaction: set statement_timeout "
        "for the app's role"
    ) in running.advice
    assert "transaction_timeout on PostgreSQL 17+" in running.advice
    assert "statement_timeout" not in idle.advice
    assert (
        "set idle_in_transaction_session_timeout (and transaction_timeout on PostgreSQL 17+) "
        "for the app's role"
    ) in idle.advice


def _vacuumed_health(engine: sa.Engine, session: Session, *, live: int) -> Any:
    """``VACUUM ANALYZE jobs``, then health (every size over its limit) once its
    statistics count ``live`` rows in ``jobs``."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE jobs")

    def counted() -> Any:
        found = ops.health(session, max_jobs_table_bytes=0)
        jobs = next(t for t in found.tables if t.name == "jobs")
        return found if jobs.live_tuples == live else None

    return wait_for(counted, message=f"the statistics counting {live:,} live rows")


def test_a_big_jobs_table_is_told_to_archive_and_a_bloated_one_that_archiving_will_not_help(
    session: Session, engine: sa.Engine
) -> None:
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, status, finished_at) "
        "SELECT 'noop', jsonb_build_object('n', g, 'pad', repeat('x', 200)), 'done', now() "
        "FROM generate_series(1, 4000) AS g",
    )
    found = _vacuumed_health(engine, session, live=4000)
    big = next(f for f in found.findings if f.check == "table_size")
    assert big.advice == (
        "move finished jobs out of the hot table: `sqla-jobs archive --older-than 1d` "
        "(or workers' --archive-every 10 --archive-older-than 1d) and "
        "`sqla-jobs prune --older-than 90d` the archive"
    )
    # Most rows gone, spread over every page: the files keep their size.
    insert(engine, "DELETE FROM jobs WHERE id % 400 <> 0")
    found = _vacuumed_health(engine, session, live=10)
    finding = next(f for f in found.findings if f.check == "table_size")
    assert "it is bloated: its 10 live rows take about" in finding.advice
    assert "archiving will not shrink it" in finding.advice
    assert "REINDEX TABLE CONCURRENTLY jobs" in finding.advice
    assert "pg_repack, or VACUUM FULL jobs (takes an ACCESS EXCLUSIVE lock" in finding.advice
    assert "downtime" in finding.advice


def test_with_autovacuum_off_a_queue_table_with_many_dead_tuples_is_a_vacuum_finding_at_once(
    session: Session, engine: sa.Engine
) -> None:
    """This host's server runs with ``autovacuum = off``; elsewhere the table's own
    ``autovacuum_enabled = false`` turns it off. Either way no age is needed."""
    server_on = scalar(engine, "SELECT current_setting('autovacuum')") == "on"
    if server_on:
        insert(engine, "ALTER TABLE jobs SET (autovacuum_enabled = false)")
    insert(
        engine, "INSERT INTO jobs (kind, payload) SELECT 'noop', '{}' FROM generate_series(1, 20)"
    )
    insert(engine, "DELETE FROM jobs")
    wait_for(
        lambda: next(t for t in ops.health(session).tables if t.name == "jobs").dead_tuples >= 20,
        message="the statistics count the deleted rows",
    )
    assert not [f for f in ops.health(session).findings if f.check == "vacuum"]  # a small table
    insert(
        engine, "INSERT INTO jobs (kind, payload) SELECT 'noop', '{}' FROM generate_series(1, 1200)"
    )
    insert(engine, "DELETE FROM jobs")
    wait_for(
        lambda: any(f.check == "vacuum" for f in ops.health(session).findings),
        message="a vacuum finding",
    )
    (finding,) = [f for f in ops.health(session).findings if f.check == "vacuum"]
    assert finding.subject == "jobs"
    if server_on:
        assert finding.message.endswith(
            "dead tuples and autovacuum is off for jobs (autovacuum_enabled = false): "
            "nothing vacuums it"
        )
        assert finding.advice == (
            "autovacuum is off: turn it on (ALTER TABLE jobs RESET (autovacuum_enabled)), "
            "or VACUUM (ANALYZE) jobs from cron"
        )
    else:
        assert finding.message.endswith(
            "dead tuples and autovacuum is off on this server (autovacuum = off): "
            "nothing vacuums it"
        )
        assert finding.advice == (
            "autovacuum is off: turn it on (ALTER SYSTEM SET autovacuum = on; "
            "SELECT pg_reload_conf()), or VACUUM (ANALYZE) jobs from cron"
        )
    table = next(t for t in ops.health(session).tables if t.name == "jobs")
    assert table.server_autovacuum is server_on and table.table_autovacuum is not server_on
