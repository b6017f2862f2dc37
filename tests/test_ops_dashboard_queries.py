"""The ops the dashboard reads and writes: job search, throughput by minute, the audit trail."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqla_jobs import ConfigError, enqueue, ops
from sqla_jobs.sql import admin, audit, stats


def insert(engine: sa.Engine, sql: str, **params: Any) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(sql), params)


def _plan(conn: sa.Connection, stmt: sa.ClauseElement) -> str:
    compiled = stmt.compile(dialect=conn.dialect)
    return "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params).scalars())


# --- search -----------------------------------------------------------------------------


def test_list_jobs_filters_by_key_id_range_age_and_payload_containment(
    session: Session, engine: sa.Engine
) -> None:
    a = enqueue(session, "mail", {"user": 7, "plan": "pro"}, key="welcome-7")
    b = enqueue(session, "mail", {"user": 8, "plan": "pro"})
    c = enqueue(session, "bill", {"user": 7, "tags": ["x", "y"]})
    session.commit()
    insert(engine, "UPDATE jobs SET created_at = now() - interval '2 days' WHERE id = :id", id=c)

    def ids(**filters: Any) -> list[int]:
        return [j.id for j in ops.list_jobs(session, **filters)]

    assert ids(key="welcome-7") == [a]
    assert ids(min_id=b) == [b, c] and ids(max_id=b) == [a, b]
    assert ids(min_id=a, max_id=a) == [a]
    assert ids(newer_than=timedelta(days=1)) == [a, b]
    assert ids(payload={"user": 7}) == [a, c]
    assert ids(payload={"tags": ["y"]}) == [c]
    assert ids(payload={"user": 7}, kind="mail") == [a]
    assert ids(payload={"user": 9}) == []


def test_list_jobs_newest_first_pages_down_by_keyset(session: Session) -> None:
    made = [enqueue(session, "noop", {"n": n}) for n in range(5)]
    session.commit()
    first = ops.list_jobs(session, newest_first=True, limit=2)
    assert [j.id for j in first] == made[:-3:-1]
    second = ops.list_jobs(session, newest_first=True, limit=2, after_id=first[-1].id)
    assert [j.id for j in second] == [made[2], made[1]]
    last = ops.list_jobs(session, newest_first=True, limit=2, after_id=second[-1].id)
    assert [j.id for j in last] == [made[0]]


def test_list_jobs_search_filters_refuse_bad_values(session: Session) -> None:
    with pytest.raises(ConfigError, match="payload must be a JSON object"):
        ops.list_jobs(session, payload=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="payload is not JSON"):
        ops.list_jobs(session, payload={"when": object()})
    with pytest.raises(ConfigError, match="key must be a non-empty string"):
        ops.list_jobs(session, key="")
    with pytest.raises(ConfigError, match="min_id"):
        ops.list_jobs(session, min_id=-1)


# --- throughput -------------------------------------------------------------------------


def test_throughput_counts_done_and_dead_per_minute_zero_filled(
    session: Session, engine: sa.Engine
) -> None:
    # Minutes are truncated on the database clock: each row sits well inside its minute.
    insert(
        engine,
        """
        INSERT INTO jobs (kind, payload, status, finished_at)
        SELECT 'noop', '{}', s::job_status, date_trunc('minute', now()) - m * interval '1 minute'
                                            + interval '20 seconds'
          FROM (VALUES ('done', 1), ('done', 1), ('dead', 1), ('done', 5),
                       ('cancelled', 5), ('done', 61), ('dead', 90)) AS v(s, m)
        """,
    )
    found = ops.throughput(session, minutes=60)
    assert len(found.minutes) == 60
    assert found.minutes[-1].minute == found.taken_at.replace(second=0, microsecond=0)
    assert [m.minute for m in found.minutes] == sorted(m.minute for m in found.minutes)
    by_age = {59 - n: (m.done, m.dead) for n, m in enumerate(found.minutes)}
    assert by_age[1] == (2, 1) and by_age[5] == (1, 0)  # cancelled is neither
    assert sum(m.done for m in found.minutes) == 3  # 61 and 90 minutes ago: outside
    assert sum(m.dead for m in found.minutes) == 1
    with pytest.raises(ConfigError, match="minutes"):
        ops.throughput(session, minutes=0)


# --- audit trail ------------------------------------------------------------------------


def test_record_action_commits_with_the_action_and_reads_back_newest_first(
    session: Session,
) -> None:
    first = ops.record_action(
        session, actor="alice", action="pause", scope="queue", target="mail", detail={"n": 1}
    )
    second = ops.record_action(session, actor="bob", action="retry", scope="job", target=42)
    session.commit()
    ops.record_action(session, actor="eve", action="delete", scope="job", target=42)
    session.rollback()  # the action rolled back: so did its entry
    entries = ops.audit_log(session)
    assert [(e.id, e.actor, e.action) for e in entries] == [
        (second, "bob", "retry"),
        (first, "alice", "pause"),
    ]
    assert entries[1].detail == {"n": 1} and entries[1].scope == "queue"
    assert entries[0].at is not None
    assert [e.id for e in ops.audit_log(session, scope="job", target=42)] == [second]
    assert ops.audit_log(session, scope="queue", target="other") == []
    assert [e.id for e in ops.audit_log(session, before_id=second)] == [first]
    assert json.loads(json.dumps(entries[0].to_dict()))["target"] == "42"


def test_audit_log_of_several_scopes_merges_the_newest_of_each_in_one_statement(
    engine: sa.Engine, session: Session
) -> None:
    ids = {}
    for n, (scope, target) in enumerate(
        [("queue", "mail"), ("job", "1"), ("kind", "a"), ("queue", "mail"), ("kind", "b")]
    ):
        ids[n] = ops.record_action(
            session, actor="olga", action="pause", scope=scope, target=target
        )
    session.commit()
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    found = ops.audit_log(session, scope=("queue", "kind"), limit=3)
    assert len(statements) == 1
    assert [e.id for e in found] == [ids[4], ids[3], ids[2]]
    assert [e.id for e in ops.audit_log(session, scope=["kind", "queue"], limit=9)] == [
        ids[4],
        ids[3],
        ids[2],
        ids[0],
    ]
    older = ops.audit_log(session, scope=("queue", "kind"), before_id=ids[3], target="mail")
    assert [e.id for e in older] == [ids[0]]
    assert [e.id for e in ops.audit_log(session, scope=("job",))] == [ids[1]]
    with pytest.raises(ConfigError, match="unknown audit scope 'table'"):
        ops.audit_log(session, scope=("queue", "table"))
    with pytest.raises(ConfigError, match="scope names no scope"):
        ops.audit_log(session, scope=())


def test_record_action_refuses_what_it_cannot_record(session: Session) -> None:
    with pytest.raises(ConfigError, match="unknown audit scope 'table'"):
        ops.record_action(session, actor="a", action="x", scope="table", target="t")
    with pytest.raises(ConfigError, match="actor must be a non-empty string"):
        ops.record_action(session, actor=" ", action="x", scope="job", target=1)
    with pytest.raises(ConfigError, match="a target needs its scope"):
        ops.audit_log(session, target=1)


# --- plans ------------------------------------------------------------------------------


def test_dashboard_queries_read_indexes_not_the_jobs_table(engine: sa.Engine) -> None:
    insert(
        engine,
        """
        INSERT INTO jobs (kind, payload, status, finished_at, idempotency_key)
        SELECT 'noop', jsonb_build_object('n', g),
               (CASE WHEN g % 10 = 0 THEN 'dead' ELSE 'done' END)::job_status,
               now() - (g % 100000) * interval '1 second', 'k' || g
          FROM generate_series(1, 100000) AS g;
        INSERT INTO jobs_audit (actor, action, scope, target)
        SELECT 'a', 'retry', 'job', (g % 5000)::text FROM generate_series(1, 20000) AS g;
        """,
    )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE jobs")
        conn.exec_driver_sql("VACUUM ANALYZE jobs_audit")
    expected = {
        "throughput": (stats.throughput(60), "jobs_finished_idx"),
        "key": (admin.list_jobs(key="k5", limit=50), "jobs_idempotency_key_key"),
        "id range": (
            admin.list_jobs(min_id=500, max_id=900, limit=50, newest_first=True),
            "jobs_pkey",
        ),
        "newest page": (admin.list_jobs(limit=50, after_id=9000, newest_first=True), "jobs_pkey"),
        "audit of a job": (
            audit.entries(scope="job", target="7", limit=20),
            "jobs_audit_scope_target_id_idx",
        ),
        # The queues page's: each scope read on the index as it is alone, not the
        # primary key walked back through the jobs' entries.
        "audit of queues and kinds": (
            audit.entries(scope=("queue", "kind"), limit=20),
            "jobs_audit_scope_target_id_idx",
        ),
    }
    with engine.connect() as conn:
        for name, (stmt, index) in expected.items():
            plan = _plan(conn, stmt)
            assert "Seq Scan" not in plan, (name, plan)
            assert index in plan, (name, plan)


# --- live view ------------------------------------------------------------------------


def test_job_states_reads_status_attempts_and_cancel_flag_of_the_ids_given(
    session: Session, engine: sa.Engine
) -> None:
    a = enqueue(session, "mail", {})
    b = enqueue(session, "mail", {})
    gone = enqueue(session, "mail", {})
    session.commit()
    assert a is not None and b is not None and gone is not None
    insert(
        engine,
        "UPDATE jobs SET status = 'running', attempts = 1, cancel_requested_at = now() "
        "WHERE id = :id",
        id=b,
    )
    insert(engine, "DELETE FROM jobs WHERE id = :id", id=gone)

    states = ops.job_states(session, [a, b, gone])

    assert sorted(states) == [a, b]
    assert (states[a].status.value, states[a].attempts, states[a].cancel_requested) == (
        "queued",
        0,
        False,
    )
    assert (states[b].status.value, states[b].attempts, states[b].cancel_requested) == (
        "running",
        1,
        True,
    )
    assert ops.job_states(session, []) == {}


def test_job_states_refuses_more_ids_than_a_page_could_show(session: Session) -> None:
    with pytest.raises(ConfigError, match="at most 500 ids, got 501"):
        ops.job_states(session, list(range(1, 502)))


def _all_pages(session: Session, newest_first: bool, **filters: Any) -> list[int]:
    """Every id ``ops.list_jobs`` gives with ``filters``, page after page by its cursor."""
    found: list[int] = []
    after = None
    while True:
        page = ops.list_jobs(
            session, **filters, limit=50, after_id=after, newest_first=newest_first
        )
        found += [j.id for j in page]
        if len(page) < 50:
            return found
        after = page[-1].id


def test_newer_than_pages_are_exact_when_created_at_is_out_of_step_with_id(
    session: Session, engine: sa.Engine
) -> None:
    # 12,000 jobs, oldest first: 8,400 two days old, then 3,600 in the last half hour
    # (none near the hour's bound, which moves while the test runs).
    # Ids 6,000 and 7,000 were created recently (a short transaction that began late
    # would not do this, a clock set back or a row rewritten would); ids 11,000 and
    # 11,500 long ago (enqueued in a transaction that began days before it committed).
    # The page's walk starts at the lowest id created in the hour (6,000), not at the
    # first by created_at (8,401), and tests created_at on every row.
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, created_at)"
        " SELECT 'k', '{}', CASE WHEN g <= 8400"
        " THEN now() - interval '2 days' + interval '1 second' * g"
        " ELSE now() - interval '0.5 second' * (12000 - g) END"
        " FROM generate_series(1, 12000) AS g",
    )
    first = int(session.execute(sa.text("SELECT min(id) FROM jobs")).scalar_one()) - 1
    insert(
        engine,
        "UPDATE jobs SET created_at = now() - interval '10 seconds' WHERE id = ANY(:ids)",
        ids=[first + 6_000, first + 7_000],
    )
    insert(
        engine,
        "UPDATE jobs SET created_at = now() - interval '5 days' WHERE id = ANY(:ids)",
        ids=[first + 11_000, first + 11_500],
    )
    expected = list(
        session.execute(
            sa.text("SELECT id FROM jobs WHERE created_at >= now() - interval '1 hour' ORDER BY id")
        ).scalars()
    )
    assert first + 6_000 in expected and first + 11_000 not in expected
    hour = timedelta(hours=1)
    assert _all_pages(session, False, newer_than=hour) == expected
    assert _all_pages(session, True, newer_than=hour) == expected[::-1]
    # The first page oldest first starts from the lowest id created in the hour.
    page = ops.list_jobs(session, newer_than=hour, limit=5)
    assert [j.id for j in page] == expected[:5]
    assert page[0].id == first + 6_000


def test_older_than_pages_are_exact_when_created_at_is_out_of_step_with_id(
    session: Session, engine: sa.Engine
) -> None:
    # 15,000 jobs, oldest first: 8,400 two days old, 600 around the hour's bound (10 to
    # 15 minutes either side of it, so the bound's own hour holds jobs of both sides
    # whatever the clock), then 6,000 in the last half hour. Ids 14,000 and 14,500 were
    # enqueued in a transaction that began days before it committed (old created_at,
    # high id); ids 6,000 and 7,000 were created recently. Newest first, the first page
    # starts at 14,500 (the highest id created before the bound), then passes the last
    # half hour's other jobs to 8,700; oldest first, the walk stops at 14,500.
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, created_at)"
        " SELECT 'k', '{}', CASE WHEN g <= 8400"
        " THEN now() - interval '2 days' + interval '1 second' * g"
        " WHEN g <= 8700 THEN now() - interval '80 minutes' + interval '1 second' * (g - 8400)"
        " WHEN g <= 9000 THEN now() - interval '50 minutes' + interval '1 second' * (g - 8700)"
        " ELSE now() - interval '0.3 second' * (15000 - g) END"
        " FROM generate_series(1, 15000) AS g",
    )
    first = int(session.execute(sa.text("SELECT min(id) FROM jobs")).scalar_one()) - 1
    insert(
        engine,
        "UPDATE jobs SET created_at = now() - interval '10 seconds' WHERE id = ANY(:ids)",
        ids=[first + 6_000, first + 7_000],
    )
    insert(
        engine,
        "UPDATE jobs SET created_at = now() - interval '5 days' WHERE id = ANY(:ids)",
        ids=[first + 14_000, first + 14_500],
    )
    expected = list(
        session.execute(
            sa.text("SELECT id FROM jobs WHERE created_at < now() - interval '1 hour' ORDER BY id")
        ).scalars()
    )
    assert first + 14_500 in expected and first + 6_000 not in expected
    assert first + 8_500 in expected and first + 8_800 not in expected
    hour = timedelta(hours=1)
    assert _all_pages(session, False, older_than=hour) == expected
    assert _all_pages(session, True, older_than=hour) == expected[::-1]
    # The first page newest first starts from the highest id created before the bound.
    page = ops.list_jobs(session, older_than=hour, limit=5, newest_first=True)
    assert [j.id for j in page] == expected[::-1][:5]
    assert [j.id - first for j in page] == [14_500, 14_000, 8_700, 8_699, 8_698]
    # Both bounds at once: a window between them, exact in both orders.
    window = list(
        session.execute(
            sa.text(
                "SELECT id FROM jobs WHERE created_at < now() - interval '1 hour'"
                " AND created_at >= now() - interval '1 day' ORDER BY id"
            )
        ).scalars()
    )
    assert window and first + 14_000 not in window
    both = {"older_than": hour, "newer_than": timedelta(days=1)}
    assert _all_pages(session, False, **both) == window
    assert _all_pages(session, True, **both) == window[::-1]


def test_an_older_than_page_before_the_first_match_is_empty(
    session: Session, engine: sa.Engine
) -> None:
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, created_at)"
        " SELECT 'k', '{}', now() - interval '1 minute' FROM generate_series(1, 6000)",
    )
    assert ops.list_jobs(session, older_than=timedelta(hours=1)) == []
    assert ops.list_jobs(session, older_than=timedelta(hours=1), newest_first=True) == []


def test_a_newer_than_page_after_the_last_match_is_empty(
    session: Session, engine: sa.Engine
) -> None:
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, created_at)"
        " SELECT 'k', '{}', now() - interval '1 day' FROM generate_series(1, 6000)",
    )
    assert ops.list_jobs(session, newer_than=timedelta(hours=1)) == []
    assert ops.list_jobs(session, newer_than=timedelta(hours=1), newest_first=True) == []


def test_list_jobs_expired_keeps_running_jobs_whose_lease_is_past(
    session: Session, engine: sa.Engine
) -> None:
    insert(
        engine,
        "INSERT INTO jobs (kind, payload, status, attempts, worker, locked_until)"
        " SELECT 'k', '{}', 'running', 1, 'w', now() + interval '1 minute' * (g - 2.5)"
        " FROM generate_series(1, 5) AS g",
    )
    insert(engine, "INSERT INTO jobs (kind, payload) VALUES ('k', '{}')")
    lapsed = list(
        session.execute(
            sa.text("SELECT id FROM jobs WHERE locked_until < now() ORDER BY id")
        ).scalars()
    )
    assert len(lapsed) == 2
    assert [j.id for j in ops.list_jobs(session, expired=True)] == lapsed
    assert [j.id for j in ops.list_jobs(session, status="running", expired=True)] == lapsed
    assert [j.id for j in ops.list_jobs(session, expired=True, newest_first=True)] == lapsed[::-1]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"expired": "yes"}, "expired must be True or False, got 'yes'"),
        (
            {"expired": True, "status": "done"},
            "expired keeps running jobs whose lease has expired: give no status, or running",
        ),
    ],
)
def test_list_jobs_expired_refuses_what_it_cannot_mean(
    session: Session, arguments: dict[str, Any], error: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        ops.list_jobs(session, **arguments)
    assert str(caught.value) == error


def test_a_payload_filters_pages_near_the_table_edge_are_exact_and_the_far_ones_too(
    session: Session, engine: sa.Engine
) -> None:
    # 20,000 jobs; "x" on ids 3, 9,000, 19,990 and 19,999 (counted from the first id).
    # A page whose window of ids after its cursor (admin.PAYLOAD_WINDOW) reaches the
    # table's edge is complete from that window alone; one whose window ends short of it
    # (the cursor at 3: 9,000 is past the window) still finds the far matches.
    insert(
        engine,
        "INSERT INTO jobs (kind, payload) SELECT 'k', jsonb_build_object('n', g)"
        " FROM generate_series(1, 20000) AS g",
    )
    first = int(session.execute(sa.text("SELECT min(id) FROM jobs")).scalar_one()) - 1
    marked = [first + n for n in (3, 9_000, 19_990, 19_999)]
    insert(
        engine,
        """UPDATE jobs SET payload = '{"t": "x"}' WHERE id = ANY(:ids)""",
        ids=marked,
    )
    x = {"t": "x"}
    assert _all_pages(session, False, payload=x) == marked
    assert _all_pages(session, True, payload=x) == marked[::-1]
    # Past the first match, oldest first: the window (ids 4..5,003) holds no match.
    after_first = ops.list_jobs(session, payload=x, after_id=marked[0], limit=50)
    assert [j.id for j in after_first] == marked[1:]
    # Near the end, both ways: the window reaches the edge.
    near_end = ops.list_jobs(session, payload=x, after_id=first + 19_000, limit=50)
    assert [j.id for j in near_end] == marked[2:]
    newest = ops.list_jobs(session, payload=x, newest_first=True, after_id=first + 1_000)
    assert [j.id for j in newest] == [marked[0]]
    # A job inserted past the edge after the page's cursor is found, not cut off.
    insert(engine, """INSERT INTO jobs (kind, payload) VALUES ('k', '{"t": "x"}')""")
    newer = ops.list_jobs(session, payload=x, after_id=first + 19_000, limit=50)
    assert [j.id for j in newer][:2] == marked[2:] and len(newer) == 3
