"""``jobs_archive`` partitioned by week of ``archived_at`` (revision 0022, #25).

Time is moved by the functions' own arguments, never by sleeping (``archivetime``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from archivetime import (
    INITIAL,
    WEEK,
    archive_at,
    migrated_long_ago,
    partition_name,
    partitions,
    prepare,
)
from helpers import scalar
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_jobs import ops
from sqla_jobs.sql import admin


def _archived(engine: sa.Engine, ids: list[int]) -> int:
    return scalar(engine, "SELECT count(*) FROM jobs_archive WHERE id = ANY(:ids)", ids=ids)  # type: ignore[no-any-return]


def test_archive_creates_the_partition_of_its_week_before_moving_rows(
    engine: sa.Engine, session: Session
) -> None:
    start = migrated_long_ago(engine, 0)  # nothing covers this week any more
    assert partition_name(start) not in partitions(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload, status, attempts, finished_at)"
            " SELECT 'noop', '{}', 'done', 1, now() - interval '2 days' FROM generate_series(1, 5)"
        )
    assert ops.archive(session, timedelta(days=1)) == 5
    parts = partitions(engine)
    assert partition_name(start) in parts and partition_name(start + WEEK) in parts
    assert scalar(engine, f"SELECT count(*) FROM {partition_name(start)}") == 5


def test_prepare_is_safe_to_call_again_and_refuses_a_null_time(engine: sa.Engine) -> None:
    start = migrated_long_ago(engine, 0)
    prepare(engine, start)
    before = partitions(engine)
    with engine.begin() as conn:
        assert conn.execute(admin.prepare_archive(start)).scalar_one() == 0
    assert partitions(engine) == before
    with engine.connect() as conn:
        try:
            conn.exec_driver_sql("SELECT jobs_archive_prepare(NULL)")
        except sa.exc.DBAPIError as exc:
            assert "jobs_archive_prepare: at must be a time, got NULL" in str(exc)
        else:
            raise AssertionError("NULL accepted")


def test_prune_drops_whole_partitions_and_archived_jobs_kept_are_still_found(
    engine: sa.Engine, session: Session
) -> None:
    start = migrated_long_ago(engine, 6)
    day = timedelta(days=1)
    oldest = archive_at(engine, start - 5 * WEEK + day, 40, workflows=2)
    older = archive_at(engine, start - 4 * WEEK + day, 30, workflows=1)
    kept = archive_at(engine, start - 1 * WEEK + day, 20, workflows=1)
    assert {partition_name(start - 5 * WEEK), partition_name(start - 4 * WEEK)} <= set(
        partitions(engine)
    )
    cutoff = start - 4 * WEEK + 2 * day  # inside the week of `older`
    now = scalar(engine, "SELECT now()")
    pruned = ops.prune(session, now - cutoff)
    assert pruned == len(oldest) + len(older)
    parts = partitions(engine)
    # Partitions wholly before the cutoff were dropped, not emptied row by row.
    assert INITIAL not in parts and partition_name(start - 5 * WEEK) not in parts
    assert partition_name(start - 4 * WEEK) in parts  # its upper bound is after the cutoff
    assert _archived(engine, oldest + older) == 0
    assert _archived(engine, kept) == len(kept)
    for job_id in (kept[0], kept[-1]):  # a plain job, a workflow's last step
        job = ops.get_job(session, job_id)
        assert job.id == job_id and job.archived_at is not None
    assert ops.result(session, kept[0]) == {"n": 1}
    # The kept workflow is whole, every step in one partition.
    workflow = scalar(engine, "SELECT workflow_id FROM jobs_archive WHERE id = :i", i=kept[-1])
    with engine.connect() as conn:
        where = conn.execute(
            sa.text(
                "SELECT count(*), count(DISTINCT tableoid) FROM jobs_archive WHERE workflow_id = :w"
            ),
            {"w": workflow},
        ).one()
    assert tuple(where) == (3, 1)


def test_drop_before_keeps_a_partition_whose_bound_is_after_the_cutoff(engine: sa.Engine) -> None:
    start = migrated_long_ago(engine, 6)
    day = timedelta(days=1)
    oldest = archive_at(engine, start - 5 * WEEK + day, 10)
    older = archive_at(engine, start - 4 * WEEK + day, 10)
    with engine.begin() as conn:
        dropped = conn.execute(
            sa.text("SELECT jobs_archive_drop_before(:c)"), {"c": start - 4 * WEEK + 3 * day}
        ).scalar_one()
    assert dropped == len(oldest)
    assert _archived(engine, older) == len(older)
    assert partition_name(start - 4 * WEEK) in partitions(engine)


def test_a_partition_holding_a_workflow_appended_to_after_archiving_is_not_dropped(
    engine: sa.Engine,
) -> None:
    start = migrated_long_ago(engine, 6)
    ids = archive_at(engine, start - 5 * WEEK + timedelta(days=1), 2, workflows=1)
    workflow = scalar(engine, "SELECT workflow_id FROM jobs_archive WHERE id = :i", i=ids[-1])
    with engine.begin() as conn:  # a step appended later, still live
        conn.execute(
            sa.text(
                "INSERT INTO jobs (kind, payload, workflow_id, step)"
                " VALUES ('noop', '{}', :w, 'late')"
            ),
            {"w": workflow},
        )
    drop = sa.text("SELECT jobs_archive_drop_before(:c)")
    with engine.begin() as conn:
        assert conn.execute(drop, {"c": start}).scalar_one() == 0
    assert _archived(engine, ids) == len(ids)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM jobs WHERE workflow_id = :w"), {"w": workflow})
        assert conn.execute(drop, {"c": start}).scalar_one() == len(ids)


def _plan_relations(engine: sa.Engine, stmt: Any) -> tuple[set[str], int]:
    """The relations an EXPLAIN ANALYZE of ``stmt`` reads, and its shared buffers."""
    compiled = stmt.compile(dialect=engine.dialect)
    with engine.connect() as conn:
        (plan,) = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {compiled}", dict(compiled.params)
        ).scalar_one()
    names: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node:
            names.add(node["Relation Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    top = plan["Plan"]
    return names, top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


def test_a_look_up_by_id_reads_only_the_closed_partition_that_can_hold_it(
    engine: sa.Engine,
) -> None:
    start = migrated_long_ago(engine, 10)
    day = timedelta(days=1)
    weeks = {w: archive_at(engine, start - w * WEEK + day, 50) for w in range(9, 1, -1)}
    prepare(engine, scalar(engine, "SELECT now()"))
    parts = partitions(engine)
    closed = {partition_name(start - w * WEEK) for w in weeks}
    assert all(parts[name] for name in closed), parts  # each has a validated id CHECK
    found: dict[int, tuple[set[str], int]] = {}
    for w in (9, 5, 2):
        job_id = weeks[w][len(weeks[w]) // 2]
        found[w] = _plan_relations(engine, admin.get_archived_job(job_id))
        # Of the closed partitions only the one holding the id is read; the open ones
        # (no CHECK yet) are probed too, each an empty index.
        assert found[w][0] & closed == {partition_name(start - w * WEEK)}, found[w]
    assert max(b for _, b in found.values()) <= 3 * (len(parts) - len(closed) + 1), found


def test_health_sums_the_partitions_of_the_archive(engine: sa.Engine, session: Session) -> None:
    start = migrated_long_ago(engine, 6)
    archive_at(engine, start - 5 * WEEK + timedelta(days=1), 300)
    archive_at(engine, start - 2 * WEEK + timedelta(days=1), 300)
    with engine.connect() as conn:
        sizes = [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT pg_table_size(relid), pg_indexes_size(relid)"
                    " FROM pg_partition_tree('jobs_archive') WHERE isleaf"
                )
            )
        ]
    (archive,) = [t for t in ops.health(session).tables if t.name == "jobs_archive"]
    assert archive.table_bytes == sum(s[0] for s in sizes) > max(s[0] for s in sizes)
    assert archive.index_bytes == sum(s[1] for s in sizes)
    assert json.dumps(archive.name) == '"jobs_archive"'


def test_the_async_archive_and_prune_create_and_drop_partitions(
    engine: sa.Engine, db_url: URL
) -> None:
    start = migrated_long_ago(engine, 6)
    old = archive_at(engine, start - 5 * WEEK + timedelta(days=1), 7)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload, status, attempts, finished_at)"
            " SELECT 'noop', '{}', 'done', 1, now() - interval '2 days' FROM generate_series(1, 3)"
        )
    cutoff = start - 3 * WEEK

    async def run() -> tuple[int, int]:
        aengine = create_async_engine(db_url)
        try:
            async with AsyncSession(aengine) as s:
                moved = await ops.archive_async(s, timedelta(days=1))
                listed = await ops.archive_partitions_async(s)
                assert [p.name for p in listed] == list(partitions(engine))
                assert listed[0].lower_bound is None  # the initial partition: MINVALUE
                counted = await ops.prune_counts_async(s, scalar(engine, "SELECT now()") - cutoff)
                assert counted.dropped_partitions >= 2 and counted.deleted_rows == 0
            return moved, counted.total
        finally:
            await aengine.dispose()

    assert asyncio.run(run()) == (3, len(old))
    parts = partitions(engine)
    assert partition_name(start) in parts and partition_name(start - 5 * WEEK) not in parts


def test_a_long_reader_of_a_closed_partition_delays_its_id_check_not_the_archive(
    engine: sa.Engine, session: Session
) -> None:
    start = migrated_long_ago(engine, 3)
    ids = archive_at(engine, start - 2 * WEEK + timedelta(days=1), 5)
    closed = partition_name(start - 2 * WEEK)
    with engine.connect() as reader:
        reader.exec_driver_sql(f"SELECT count(*) FROM {closed}")  # holds ACCESS SHARE
        # Waits the function's lock_timeout (5 s) for that partition, then goes on.
        assert ops.prepare_archive(session) >= 1  # this week's partitions: made
        assert partition_name(start) in partitions(engine)
        assert partitions(engine)[closed] is False
        reader.rollback()
    prepare(engine, scalar(engine, "SELECT now()"))
    assert partitions(engine)[closed] is True
    assert _archived(engine, ids) == len(ids)


def test_a_role_with_only_connect_cannot_drop_or_make_archive_partitions(
    engine: sa.Engine, db_url: URL
) -> None:
    """Revision 0022's SECURITY DEFINER functions are not executable by PUBLIC: they
    run as the table's owner."""
    role = f"sqla_jobs_connect_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(f'GRANT CONNECT ON DATABASE "{db_url.database}" TO {role}')
    other = sa.create_engine(db_url.set(username=role), poolclass=sa.NullPool)
    try:
        for call in ("jobs_archive_drop_before('2030-01-01')", "jobs_archive_prepare()"):
            with pytest.raises(sa.exc.ProgrammingError) as denied, other.connect() as conn:
                conn.exec_driver_sql(f"SELECT {call}")
            name = call.split("(")[0]
            assert f"permission denied for function {name}" in str(denied.value)
        with other.connect() as conn:  # catalog only: still readable
            conn.execute(admin.archive_partitions()).all()
    finally:
        other.dispose()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")
    assert INITIAL in partitions(engine)


def test_prepare_and_drop_before_refuse_a_future_time(engine: sa.Engine) -> None:
    """A future ``at`` would close the open partitions with an empty id range (every
    archive then fails); a future cutoff would drop the partition archived into now."""
    before = partitions(engine)
    refused = {
        "jobs_archive_prepare(now() + interval '6 weeks')": (
            "jobs_archive_prepare: at must not be in the future (got ",
            "); call it with no argument",
        ),
        "jobs_archive_drop_before(now() + interval '6 weeks')": (
            "jobs_archive_drop_before: cutoff must not be in the future (got ",
            "); pass now() minus the retention",
        ),
    }
    for call, (head, tail) in refused.items():
        with pytest.raises(sa.exc.DBAPIError) as info, engine.begin() as conn:
            conn.exec_driver_sql(f"SELECT {call}")
        first = str(info.value.orig).splitlines()[0]
        assert first.startswith(head) and first.endswith(tail), first
    assert partitions(engine) == before
    with engine.begin() as conn:  # now itself is not the future
        conn.exec_driver_sql("SELECT jobs_archive_prepare(now()), jobs_archive_drop_before(now())")


def test_an_archive_whose_partition_went_missing_prepares_again_and_moves_its_rows(
    engine: sa.Engine, session: Session
) -> None:
    start = migrated_long_ago(engine, 0)
    finished = (
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at)"
        " SELECT 'noop', '{}', 'done', 1, now() - interval '2 days' FROM generate_series(1, 4)"
    )
    with engine.begin() as conn:
        conn.exec_driver_sql(finished)
    assert ops.archive(session, timedelta(days=1)) == 4  # prepared: cached for today
    with engine.begin() as conn:  # this week's partition dropped behind its back
        conn.exec_driver_sql(f"DROP TABLE {partition_name(start)}")
        conn.exec_driver_sql(finished)
    assert ops.archive(session, timedelta(days=1)) == 4
    assert scalar(engine, f"SELECT count(*) FROM {partition_name(start)}") == 4


def test_one_prepare_archive_adds_and_validates_a_closed_partitions_id_check(
    engine: sa.Engine, session: Session
) -> None:
    start = migrated_long_ago(engine, 3)
    archive_at(engine, start - 2 * WEEK + timedelta(days=1), 5)
    closed = partition_name(start - 2 * WEEK)
    assert closed in partitions(engine) and partitions(engine)[closed] is False
    assert ops.prepare_archive(session) >= 2  # added, then validated
    assert partitions(engine)[closed] is True
