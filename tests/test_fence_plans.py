"""Every worker statement is planned O(batch), whatever the table's statistics say.

A queue's statistics are stale by nature: taken after a bulk load or by an autovacuum at
a quiet moment, they say that no job runs; taken at a busy moment, that every job does.
A fenced statement once joined ``jobs`` with ``unnest(ids, attempts)``; with statistics
that promised one running row the planner chose a nested loop that re-scanned the 1,000
unnested leases for every job (a million rows per batch, 150-300 ms). These tests build
both kinds of stale statistics on a table of 20,000 jobs, hold 1,000 leases, and read
the plans (custom, and generic as a prepared statement gets) of the claim and of every
fenced statement: jobs is read by index only, never with a sequential scan, and no
nested loop rescans a function (or anything else) for each row of its outer side.
The statements are also run, in a rolled-back transaction, to prove they find all 1,000
leases. Nothing is timed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from sqla_jobs.sql import lease

ROWS = 20_000
LEASES = 1_000
WORKER = "w:1"
DIALECT = make_url("postgresql+psycopg://").get_dialect()()


def _load(engine: sa.Engine, stats: str) -> list[tuple[int, int]]:
    """The table in the state its statistics were taken, ANALYZE, then the real state:
    ``LEASES`` jobs running for ``WORKER`` (attempt 1), the rest queued."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # No autoanalyze may refresh the statistics while the test reads plans.
        conn.exec_driver_sql("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload) SELECT 'k', '{}' FROM generate_series(1, %(n)s)",
            {"n": ROWS},
        )
        if stats == "every row running":
            conn.exec_driver_sql(
                "UPDATE jobs SET status = 'running', attempts = 1, worker = 'other:9',"
                " locked_until = now() + interval '1 hour'"
            )
        conn.exec_driver_sql("VACUUM ANALYZE jobs")
        conn.exec_driver_sql(
            "UPDATE jobs SET status = 'queued', attempts = 0, worker = NULL, locked_until = NULL"
        )
        # Leases spread over the table, in no order (the completer's batches are not sorted).
        ids = [
            r[0]
            for r in conn.exec_driver_sql(
                "UPDATE jobs SET status = 'running', attempts = 1, worker = %(w)s,"
                " locked_until = now() + interval '1 hour'"
                " WHERE id %% (%(rows)s / %(n)s) = 0 RETURNING id",
                {"w": WORKER, "rows": ROWS, "n": LEASES},
            )
        ]
    assert len(ids) == LEASES
    ids.sort(key=lambda i: (i * 7919) % 104729)
    return [(i, 1) for i in ids]


@pytest.fixture(params=["no row running", "every row running"])
def leases(request: pytest.FixtureRequest, engine: sa.Engine) -> list[tuple[int, int]]:
    return _load(engine, request.param)


def _plans(conn: psycopg.Connection[Any], stmt: sa.ClauseElement) -> dict[str, Any]:
    """The custom plan and the generic plan (``PREPARE`` under ``force_generic_plan``)."""
    compiled = stmt.compile(dialect=DIALECT)
    sql, params = str(compiled), dict(compiled.params)
    plans: dict[str, Any] = {}
    conn.execute("SET plan_cache_mode = force_custom_plan")
    custom = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    assert custom is not None
    plans["custom"] = custom[0]
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    conn.execute("PREPARE fenced AS " + re.sub(r"%\((\w+)\)s", number, sql))
    conn.execute("SET plan_cache_mode = force_generic_plan")
    values = ", ".join(["%s"] * len(names))
    generic = (
        psycopg.ClientCursor(conn)
        .execute(f"EXPLAIN (FORMAT JSON) EXECUTE fenced({values})", [params[n] for n in names])
        .fetchone()
    )
    assert generic is not None
    plans["generic"] = generic[0]
    conn.execute("DEALLOCATE fenced")
    conn.execute("RESET plan_cache_mode")
    return plans


def _nodes(plan: Any, parent: dict[str, Any] | None = None) -> Iterator[tuple[dict[str, Any], Any]]:
    node = plan[0]["Plan"] if isinstance(plan, list) else plan
    yield node, parent
    for child in node.get("Plans", []):
        yield from _nodes(child, node)


def _assert_linear(plan: Any, *, probe: str) -> None:
    text = json.dumps(plan)
    for node, parent in _nodes(plan):
        where = f"{node['Node Type']} in {text}"
        assert not (node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "jobs"), where
        # The inner side of a nested loop runs once per outer row: it may only be an
        # index probe of jobs, never a rescan of a function or a whole relation.
        inner = node.get("Parent Relationship") == "Inner"
        if inner and parent is not None and parent["Node Type"] == "Nested Loop":
            assert node["Node Type"] in (
                "Index Scan",
                "Index Only Scan",
                "Subquery Scan",
                "Limit",
                "LockRows",
            ), where
            assert all(
                n["Node Type"] not in ("Function Scan", "CTE Scan", "Seq Scan", "Materialize")
                for n, _ in _nodes(node)
            ), where
    assert probe in text, text


def _fenced_statements(leases: list[tuple[int, int]]) -> dict[str, tuple[sa.ClauseElement, str]]:
    job_id, attempt = leases[0]
    return {
        "complete": (lease.complete(worker=WORKER, leases=leases), "jobs_pkey"),
        "heartbeat": (
            lease.heartbeat(worker=WORKER, leases=leases, lock_seconds=30),
            "jobs_pkey",
        ),
        "release": (lease.release(worker=WORKER, leases=leases), "jobs_pkey"),
        "record_failure": (
            lease.record_failure(
                worker=WORKER, job_id=job_id, attempt=attempt, delay_seconds=1, error="x"
            ),
            "jobs_pkey",
        ),
        "snooze": (
            lease.snooze(
                worker=WORKER, job_id=job_id, attempt=attempt, delay_seconds=1, note="later"
            ),
            "jobs_pkey",
        ),
        "cancel_running": (
            lease.cancel_running(worker=WORKER, job_id=job_id, attempt=attempt, reason="x"),
            "jobs_pkey",
        ),
        "complete_one": (
            lease.complete_one(worker=WORKER, job_id=job_id, attempt=attempt),
            "jobs_pkey",
        ),
        "complete_one_before_commit": (
            lease.complete_one_before_commit(worker=WORKER, job_id=job_id, attempt=attempt),
            "jobs_pkey",
        ),
    }


STATEMENTS: list[str] = [
    "complete",
    "heartbeat",
    "release",
    "record_failure",
    "snooze",
    "cancel_running",
    "complete_one",
    "complete_one_before_commit",
]


@pytest.mark.parametrize("name", STATEMENTS)
def test_fenced_statement_plans_are_index_probes_whatever_the_statistics(
    driver: psycopg.Connection[Any], leases: list[tuple[int, int]], name: str
) -> None:
    stmt, probe = _fenced_statements(leases)[name]
    plans = _plans(driver, stmt)
    for mode, plan in plans.items():
        try:
            _assert_linear(plan, probe=probe)
        except AssertionError as exc:
            raise AssertionError(f"{name}, {mode} plan: {exc}") from None


def _run(conn: psycopg.Connection[Any], stmt: sa.ClauseElement) -> int:
    compiled = stmt.compile(dialect=DIALECT)
    cur = conn.execute(str(compiled), dict(compiled.params))
    return cur.rowcount


def test_fenced_batches_find_every_lease_and_only_their_own(
    driver: psycopg.Connection[Any], leases: list[tuple[int, int]]
) -> None:
    # The same 1,000 leases, plus leases that are not ours in each way the fence checks:
    # a wrong attempt (also beside the right one), a queued job, another worker's job.
    stale = [(job_id, 2) for job_id, _ in leases[:10]]
    queued = driver.execute("SELECT id FROM jobs WHERE status = 'queued' LIMIT 5").fetchall()
    mixed = leases + stale + [(r[0], 0) for r in queued] + [(r[0], 1) for r in queued]
    assert _run(driver, lease.heartbeat(worker=WORKER, leases=mixed, lock_seconds=30)) == LEASES
    assert _run(driver, lease.heartbeat(worker="other:9", leases=leases, lock_seconds=30)) == 0
    assert _run(driver, lease.complete(worker=WORKER, leases=stale)) == 0
    assert _run(driver, lease.complete(worker=WORKER, leases=mixed)) == LEASES
    assert _run(driver, lease.release(worker=WORKER, leases=leases)) == 0  # done now
    driver.rollback()


def test_rescue_of_expired_leases_is_planned_by_index_whatever_the_statistics(
    driver: psycopg.Connection[Any], leases: list[tuple[int, int]]
) -> None:
    ids = [job_id for job_id, _ in leases]
    driver.execute(
        "UPDATE jobs SET locked_until = now() - interval '1 minute' WHERE id = ANY(%s)", (ids,)
    )
    # As the rescuer runs it: no index holds the lease (revision 0018), and with
    # statistics that say every row runs, a sequential scan looks cheaper than the
    # running jobs of jobs_status_id_idx.
    compiled = lease.index_scans_only().compile(dialect=DIALECT)
    driver.execute(str(compiled), dict(compiled.params))
    for mode, plan in _plans(driver, lease.rescue_expired(limit=LEASES)).items():
        try:
            _assert_linear(plan, probe="jobs_pkey")
        except AssertionError as exc:
            raise AssertionError(f"rescue_expired, {mode} plan: {exc}") from None
    assert _run(driver, lease.rescue_expired(limit=LEASES)) == LEASES
    driver.rollback()


def test_claim_is_planned_by_index_whatever_the_statistics(
    driver: psycopg.Connection[Any], leases: list[tuple[int, int]]
) -> None:
    claim = lease.claim(
        worker="w:2", lock_seconds=30, queues=["default"], kinds=["k"], limit=LEASES
    )
    for mode, plan in _plans(driver, claim).items():
        try:
            _assert_linear(plan, probe="jobs_claim_idx")
            assert "jobs_pkey" in json.dumps(plan)
        except AssertionError as exc:
            raise AssertionError(f"claim, {mode} plan: {exc}") from None
    assert _run(driver, claim) == LEASES
    driver.rollback()


def test_the_prepared_claim_of_an_idle_worker_runs_its_generic_plan(
    driver: psycopg.Connection[Any],
) -> None:
    # PostgreSQL plans a prepared statement five times for its values, then keeps the
    # generic plan unless that looks costlier. With ``max_priority`` as generate_series'
    # upper end the generic plan guessed 1,000 priority levels and never won: every
    # claim, an idle worker's too, was planned again, half its round trip (0.35 ms).
    # (Under a backlog the generic plan's unknown LIMIT still loses to the custom plans:
    # there the planning is shared by a batch of jobs.)
    driver.execute("INSERT INTO jobs (kind, payload) SELECT 'k', '{}' FROM generate_series(1, 60)")
    driver.execute("ANALYZE jobs")
    compiled = lease.claim(
        worker="w:2", lock_seconds=30, queues=["default"], kinds=["k"], limit=1
    ).compile(dialect=DIALECT)
    sql, params = str(compiled), {**compiled.params, "limit": 5}
    for _ in range(12):
        assert len(driver.execute(sql, params, prepare=True).fetchall()) == 5
    found = driver.execute(  # psycopg prepared it with $n for the %(name)s placeholders
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE statement LIKE 'WITH picked AS MATERIALIZED%'"
    ).fetchone()
    assert found is not None
    generic, custom = found
    assert generic >= 6 and custom <= 6, (generic, custom)
    driver.rollback()
