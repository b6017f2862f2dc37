"""Operations API: stats, list/show, retry/cancel/delete, archive/prune, on real PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, running_jobs, scalar, setup_app_tables, start_worker, stop, wait_for
from jobapp import registry as app_registry
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import (
    ConfigError,
    JobNotFoundError,
    JobStatus,
    NewJob,
    enqueue,
    enqueue_many,
    ops,
)
from sqla_jobs.sql import admin, stats


def insert(engine: sa.Engine, sql: str, **params: Any) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(sql), params)


def seed_states(engine: sa.Engine) -> None:
    """Two queues, every state: the fixture most stats/action tests read."""
    insert(
        engine,
        """
        INSERT INTO jobs (kind, queue, payload, status, run_at, locked_until, attempts,
                          finished_at, last_error, created_at)
        VALUES
          ('noop', 'default', '{}', 'queued',  now() - interval '90 seconds', NULL, 0, NULL,
           NULL, now() - interval '2 days'),
          ('noop', 'default', '{}', 'queued',  now() - interval '10 seconds', NULL, 0, NULL,
           NULL, now()),
          ('noop', 'default', '{}', 'queued',  now() + interval '1 hour', NULL, 0, NULL,
           NULL, now()),
          ('noop', 'default', '{}', 'running', now(), now() + interval '1 minute', 1, NULL,
           NULL, now()),
          ('noop', 'default', '{}', 'running', now(), now() - interval '1 minute', 1, NULL,
           NULL, now()),
          ('fail', 'default', '{}', 'dead',    now(), NULL, 3, now() - interval '1 day',
           'ValueError: boom', now() - interval '2 days'),
          ('fail', 'default', '{}', 'dead',    now(), NULL, 3, now(), 'ValueError: boom', now()),
          ('noop', 'default', '{}', 'done',    now(), NULL, 1, now() - interval '10 seconds',
           NULL, now()),
          ('noop', 'default', '{}', 'done',    now(), NULL, 1, now() - interval '30 minutes',
           NULL, now()),
          ('noop', 'default', '{}', 'done',    now(), NULL, 1, now() - interval '2 hours',
           NULL, now()),
          ('ghost', 'other',  '{}', 'queued',  now(), NULL, 0, NULL, NULL, now()),
          ('noop', 'other',   '{}', 'cancelled', now(), NULL, 0, now(), NULL, now())
        """,
    )


# --- stats ---------------------------------------------------------------------------


def test_stats_counts_every_state_per_queue_and_kind(session: Session, engine: sa.Engine) -> None:
    seed_states(engine)
    pending = enqueue(session, "noop", {}, queue="later")  # the caller's open unit of work
    s = ops.stats(session, app_registry)
    session.commit()  # stats left it alone: still open, still committable
    assert scalar(engine, "SELECT queue FROM jobs WHERE id = :i", i=pending) == "later"
    by = {(k.queue, k.kind): k for k in s.by_kind}
    noop = by[("default", "noop")]
    assert (noop.ready, noop.scheduled, noop.running, noop.expired) == (2, 1, 2, 1)
    assert (noop.done_last_minute, noop.done_last_hour, noop.dead) == (1, 2, 0)
    assert noop.oldest_ready_seconds is not None and 85 < noop.oldest_ready_seconds < 120
    assert by[("default", "fail")].dead == 2
    assert by[("other", "noop")].cancelled == 1
    assert s.total.ready == 3 and s.total.dead == 2 and s.total.expired == 1
    assert s.unknown_kinds == ("ghost",)
    data = json.loads(json.dumps(s.to_dict()))
    assert data["total"]["dead"] == 2 and "dead_tuple_ratio" in data["table"]


@pytest.mark.parametrize("exact_up_to", [None, 500])
def test_stats_figures_refer_to_each_reads_own_instant_though_its_statement_is_reused(
    session: Session, engine: sa.Engine, exact_up_to: int | None
) -> None:
    """ops.stats builds its statement once and gives it the instant at execution: a
    later read's oldest ready age has grown by exactly the time between the reads."""
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, run_at) VALUES ('noop', '{}', now() - interval '1 hour')",
    )
    first = ops.stats(session, exact_up_to=exact_up_to)
    time.sleep(1.0)  # so the second read's instant is another one
    second = ops.stats(session, exact_up_to=exact_up_to)
    assert first.total.oldest_ready_seconds is not None
    assert second.total.oldest_ready_seconds is not None
    between = (second.taken_at - first.taken_at).total_seconds()
    grown = second.total.oldest_ready_seconds - first.total.oldest_ready_seconds
    assert between >= 1.0
    assert abs(grown - between) < 0.001


def test_stats_table_figures_come_from_planner_estimates(
    session: Session, engine: sa.Engine
) -> None:
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, status, finished_at) "
        "SELECT 'noop', '{}', 'done', now() - interval '2 hours' FROM generate_series(1, 3000)",
    )
    insert(engine, "DELETE FROM jobs WHERE id % 3 = 0")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE jobs")
    s = ops.stats(session)
    assert s.table.estimated_rows == 2000
    assert s.table.estimated_by_status == {"done": 2000}
    # Nothing was counted: no (queue, kind) has recent or live rows.
    assert s.by_kind == ()
    assert s.total.oldest_ready_seconds is None


STATS_QUERIES = {
    # (status, id) (revision 0010) reads one status's rows as well as the partial ones.
    "queued": (stats.stats_queued, ("jobs_claim_idx", "jobs_status_id_idx")),
    "running": (stats.stats_running, ("jobs_status_id_idx",)),
    "dead": (stats.stats_dead, ("jobs_finished_idx", "jobs_status_id_idx")),
    "waiting": (stats.stats_waiting, ("jobs_status_id_idx",)),
    "done_recent": (stats.stats_done_recent, ("jobs_finished_idx",)),
}


def test_stats_queries_use_the_partial_indexes_on_200k_finished_rows(engine: sa.Engine) -> None:
    insert(
        engine,
        """
        INSERT INTO jobs (kind, payload, status, finished_at, created_at)
        SELECT 'noop', '{}', 'done', now() - (g % 100000) * interval '1 second',
               now() - interval '3 days'
          FROM generate_series(1, 200000) AS g
        """,
    )
    seed_states(engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE jobs")
    plans: dict[str, str] = {}
    with engine.connect() as conn:
        for name, (build, indexes) in STATS_QUERIES.items():
            compiled = build().compile(dialect=conn.dialect)
            plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params).scalars())
            plans[name] = plan
            assert "Seq Scan on jobs" not in plan, plan
            assert any(index in plan for index in indexes), plan
        for stmt in (stats.stats_table(), stats.stats_status_estimates()):
            compiled = stmt.compile(dialect=conn.dialect)
            plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params).scalars())
            assert "on jobs " not in plan, plan
        # Archiving a week-old batch reads the same index, not the whole table.
        for dead_age in (None, 30 * 86400.0):
            archive = admin.archive_batch(
                done_older_than=7 * 86400.0, dead_older_than=dead_age, batch=10_000
            )
            compiled = archive.compile(dialect=conn.dialect)
            plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params).scalars())
            plans[f"archive dead_age={dead_age}"] = plan
            assert "Seq Scan on jobs" not in plan and "jobs_finished_idx" in plan, plan
    print(json.dumps(plans, indent=1))  # the evidence, with -s


# --- list / show ---------------------------------------------------------------------


def test_list_jobs_filters_and_pages_by_keyset(session: Session, engine: sa.Engine) -> None:
    seed_states(engine)
    queued = ops.list_jobs(session, status="queued")
    assert [j.kind for j in queued] == ["noop", "noop", "noop", "ghost"]
    assert [j.id for j in queued] == sorted(j.id for j in queued)
    first = ops.list_jobs(session, status=JobStatus.QUEUED, kind="noop", limit=2)
    second = ops.list_jobs(session, status="queued", kind="noop", limit=2, after_id=first[-1].id)
    assert len(first) == 2 and len(second) == 1
    assert {j.id for j in first}.isdisjoint(j.id for j in second)
    old = ops.list_jobs(session, older_than=timedelta(days=1))
    assert sorted(j.status.value for j in old) == ["dead", "queued"]
    assert ops.list_jobs(session, queue="other", status=["cancelled", "queued"])[0].kind == "ghost"
    with pytest.raises(ConfigError, match="unknown status 'bogus'"):
        ops.list_jobs(session, status="bogus")
    with pytest.raises(ConfigError, match="limit"):
        ops.list_jobs(session, limit=0)


def test_list_jobs_refuses_a_payload_filter_that_is_not_json(session: Session) -> None:
    with pytest.raises(ConfigError, match="payload is not JSON: Out of range float values"):
        ops.list_jobs(session, payload={"score": float("nan")})
    with pytest.raises(ConfigError, match="payload must be a JSON object"):
        ops.list_jobs(session, payload=[1])  # type: ignore[arg-type]


def test_get_job_returns_everything_or_raises_not_found(session: Session) -> None:
    job_id = enqueue(session, "noop", {"a": 1}, key="k1", priority=3)
    session.commit()
    assert job_id is not None
    job = ops.get_job(session, job_id)
    assert (job.kind, job.payload, job.idempotency_key, job.priority) == ("noop", {"a": 1}, "k1", 3)
    assert job.to_dict()["status"] == "queued"
    with pytest.raises(JobNotFoundError, match="no job with id 999999"):
        ops.get_job(session, 999999)


# --- retry / cancel / delete ---------------------------------------------------------


def test_retry_puts_dead_jobs_back_with_fresh_attempts_and_keeps_last_error(
    session: Session, engine: sa.Engine
) -> None:
    seed_states(engine)
    assert ops.retry_jobs(session, kind="fail") == 2
    session.commit()
    got = rows(
        engine,
        "SELECT status::text, attempts, run_at <= now(), finished_at, last_error "
        "FROM jobs WHERE kind = 'fail'",
    )
    assert got == [("queued", 0, True, None, "ValueError: boom")] * 2
    assert ops.retry_jobs(session, kind="fail") == 0  # nothing dead any more
    done_id = scalar(engine, "SELECT min(id) FROM jobs WHERE status = 'done'")
    assert ops.retry_jobs(session, ids=[done_id]) == 0  # done jobs are not retried
    with pytest.raises(ConfigError, match="only dead or cancelled"):
        ops.retry_jobs(session, status="done")


def test_cancel_ends_queued_jobs_and_only_flags_running_ones(
    session: Session, engine: sa.Engine
) -> None:
    seed_states(engine)
    done = ops.cancel(session, kind="noop")
    assert len(done.cancelled) == 3  # 2 ready + 1 scheduled
    running = [r[0] for r in rows(engine, "SELECT id FROM jobs WHERE status = 'running'")]
    assert sorted(done.stopping) == sorted(running)
    session.commit()
    # The running rows stay running (their worker ends them) with the request recorded.
    assert (
        scalar(
            engine,
            "SELECT count(*) FROM jobs WHERE status = 'running' AND cancel_requested_at IS NULL",
        )
        == 0
    )
    # Asked again: nothing new to flag.
    assert ops.cancel_jobs(session, kind="noop") == 0
    session.commit()
    counts = dict(
        rows(engine, "SELECT status::text, count(*) FROM jobs WHERE kind = 'noop' GROUP BY 1")
    )
    assert counts == {"cancelled": 4, "running": 2, "done": 3}
    assert (
        scalar(
            engine, "SELECT count(*) FROM jobs WHERE status = 'cancelled' AND finished_at IS NULL"
        )
        == 0
    )
    with pytest.raises(ConfigError, match="cancel needs"):
        ops.cancel_jobs(session)
    # A cancelled job can be retried (un-cancelled).
    assert ops.retry_jobs(session, status="cancelled", queue="other") == 1


def test_delete_never_touches_running_jobs(session: Session, engine: sa.Engine) -> None:
    seed_states(engine)
    running = [r[0] for r in rows(engine, "SELECT id FROM jobs WHERE status = 'running'")]
    assert ops.delete_jobs(session, ids=running) == 0
    assert ops.delete_jobs(session, status="dead") == 2
    with pytest.raises(ConfigError, match="running jobs cannot be deleted"):
        ops.delete_jobs(session, status="running")
    with pytest.raises(ConfigError, match="delete needs"):
        ops.delete_jobs(session, kind="noop")
    session.commit()
    assert scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'dead'") == 0
    assert running_jobs(engine) == 2


def test_bulk_action_skips_a_row_another_transaction_holds(
    session: Session, engine: sa.Engine
) -> None:
    seed_states(engine)
    dead = [r[0] for r in rows(engine, "SELECT id FROM jobs WHERE status = 'dead' ORDER BY id")]
    with engine.connect() as other:
        other.execute(sa.text("SELECT 1 FROM jobs WHERE id = :i FOR UPDATE"), {"i": dead[0]})
        # Does not wait for the lock: the held row is skipped and not counted.
        assert ops.retry_jobs(session, ids=dead) == 1
        session.commit()
        other.rollback()
    assert rows(engine, "SELECT id FROM jobs WHERE status = 'dead'") == [(dead[0],)]


def test_cancel_while_a_worker_drains_ends_queued_jobs_and_stops_running_ones(
    engine: sa.Engine, db_url: URL
) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        enqueue_many(s, [NewJob("effect", {"sleep": 0.002}) for _ in range(400)])
        s.commit()
    proc = start_worker(db_url, "--concurrency", "4")
    try:
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM effects") >= 20, message="effects")
        with Session(engine) as s:
            asked = ops.cancel(s, kind="effect")
            s.commit()
        wait_for(
            lambda: running_jobs(engine) == 0,
            message="running jobs to finish",
        )
    finally:
        out = stop(proc)
    counts = dict(rows(engine, "SELECT status::text, count(*) FROM jobs GROUP BY 1"))
    status_of = dict(rows(engine, "SELECT id, status::text FROM jobs"))
    assert {status_of[i] for i in asked.cancelled} <= {"cancelled"}, out
    # A running job either stopped (cancelled) or finished first (done).
    assert {status_of[i] for i in asked.stopping} <= {"cancelled", "done"}, out
    stopped = sum(status_of[i] == "cancelled" for i in asked.stopping)
    assert counts.get("cancelled", 0) == len(asked.cancelled) + stopped, out
    assert counts.get("done", 0) + counts.get("cancelled", 0) == 400, (counts, out)
    # No cancelled job ran; every done job ran exactly once.
    assert (
        scalar(
            engine,
            "SELECT count(*) FROM effects e JOIN jobs j ON j.id = e.job_id "
            "WHERE j.status = 'cancelled'",
        )
        == 0
    )
    assert scalar(engine, "SELECT count(*) FROM effects") == counts.get("done", 0)


# --- archive / prune -----------------------------------------------------------------


def test_archive_moves_old_finished_rows_in_batches(session: Session, engine: sa.Engine) -> None:
    seed_states(engine)
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, status, finished_at) "
        "SELECT 'noop', '{}', 'done', now() - interval '8 days' FROM generate_series(1, 25)",
    )
    batches = list(ops.archive_batches(session, timedelta(days=7), batch=10))
    assert batches == [10, 10, 5]
    assert scalar(engine, "SELECT count(*) FROM jobs_archive WHERE archived_at IS NOT NULL") == 25
    # Dead rows go only when asked, and only past their own age.
    assert ops.archive(session, timedelta(hours=1), include_dead_after=timedelta(hours=12)) == 2
    assert dict(rows(engine, "SELECT status::text, count(*) FROM jobs_archive GROUP BY 1")) == {
        "done": 26,
        "dead": 1,
    }
    assert scalar(engine, "SELECT count(*) FROM jobs WHERE status = 'dead'") == 1
    assert ops.archive(session, timedelta(hours=1), include_dead_after=timedelta(0)) == 2
    # prune deletes by finished_at in the archive.
    assert ops.prune(session, timedelta(days=7), batch=7) == 25
    assert scalar(engine, "SELECT count(*) FROM jobs_archive") == 4
    with pytest.raises(ConfigError, match="older_than must be"):
        ops.archive(session, timedelta(days=-1))


def test_archive_under_load_loses_and_duplicates_nothing(engine: sa.Engine, db_url: URL) -> None:
    setup_app_tables(engine)
    total = 3000
    with Session(engine) as s:
        enqueue_many(s, [NewJob("effect", {}) for _ in range(total)])
        s.commit()
    procs = [start_worker(db_url, "--concurrency", "4") for _ in range(2)]
    moved = 0
    stop_archiving = threading.Event()

    def archiver() -> None:
        nonlocal moved
        with Session(engine) as s:
            while not stop_archiving.is_set():
                moved += ops.archive(s, timedelta(0), batch=50)

    thread = threading.Thread(target=archiver)
    thread.start()
    try:
        wait_for(
            lambda: scalar(engine, "SELECT count(*) FROM jobs WHERE status <> 'done'") == 0,
            timeout=60,
        )
    finally:
        stop_archiving.set()
        thread.join(30)
        out = "".join(stop(p) for p in procs)
    moved += ops.archive(Session(engine), timedelta(0))
    assert moved > 0
    # Every job is in exactly one of the two tables, and ran exactly once.
    assert scalar(engine, "SELECT count(*) FROM jobs") == 0, out
    assert scalar(engine, "SELECT count(DISTINCT id) FROM jobs_archive") == total
    assert scalar(engine, "SELECT count(*) FROM jobs_archive WHERE status = 'done'") == total
    assert scalar(engine, "SELECT count(*) FROM effects") == total
    assert scalar(engine, "SELECT max(attempts) FROM jobs_archive") == 1
    assert "claim lost" not in out


def test_cancel_without_running_leaves_running_jobs_alone(
    session: Session, engine: sa.Engine
) -> None:
    seed_states(engine)
    assert ops.cancel_jobs(session, kind="noop", running=False) == 3
    session.commit()
    assert scalar(engine, "SELECT count(*) FROM jobs WHERE cancel_requested_at IS NOT NULL") == 0
