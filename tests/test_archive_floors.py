"""A long archive or prune reads as much per batch at the end as at the start (#25).

Each batch of ``ops.archive`` and ``ops.prune`` deletes the rows it picked; their index
entries stay, dead, until vacuum. A batch that looked from the start of the range again
walked all of them: batch k of a call read k batches of dead entries (and with
``include_dead_after`` the done and dead ranges were one bitmap, read whole every
batch). The batches now start where the previous one stopped (``admin.next_floors``).

Measured with what the server counts, not time: auto_explain sends each statement's plan
as run (ANALYZE, BUFFERS) back as a notice, and the buffers of the batch's look (the
``picked`` CTE) are read from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from archivetime import WEEK, archive_at, migrated_long_ago, prepare
from helpers import scalar
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import ops

_EXPLAIN_EVERYTHING = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_level = notice",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_buffers = on",
    "SET auto_explain.log_format = json",
)
ROWS = 6_000
BATCH = 200


def _explaining(url: URL, plans: list[dict[str, Any]], *settings: str) -> sa.Engine:
    """An engine whose every statement's executed plan lands in ``plans`` (JSON)."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)

    @sa.event.listens_for(engine, "connect")
    def _explain(dbapi: Any, _record: Any) -> None:
        def keep(notice: Any) -> None:
            text = notice.message_primary or ""
            if "{" in text:
                plans.append(json.loads(text[text.index("{") :]))

        dbapi.add_notice_handler(keep)
        with dbapi.cursor() as cursor:
            for statement in (*_EXPLAIN_EVERYTHING, *settings):
                cursor.execute(statement)
        dbapi.commit()

    return engine


@pytest.fixture
def explained(db_url: URL) -> Iterator[tuple[sa.Engine, list[dict[str, Any]]]]:
    plans: list[dict[str, Any]] = []
    engine = _explaining(db_url, plans)
    try:
        yield engine, plans
    finally:
        engine.dispose()


def _node(plan: dict[str, Any], name: str) -> dict[str, Any] | None:
    if plan.get("Subplan Name") == name:
        return plan
    for child in plan.get("Plans", []):
        if (found := _node(child, name)) is not None:
            return found
    return None


def _looks(plans: list[dict[str, Any]]) -> list[int]:
    """Buffers (hit + read) each batch's look read, in the order the batches ran."""
    looks = []
    for plan in plans:
        picked = _node(plan["Plan"], "CTE picked")
        if picked is not None:
            looks.append(picked["Shared Hit Blocks"] + picked["Shared Read Blocks"])
    return looks


def _assert_flat(looks: list[int], batches: int) -> None:
    assert len(looks) == batches + 1, looks  # the last batch finds what is left: nothing
    full = looks[:-1]
    # Each batch locks BATCH rows (a buffer each), crosses a leaf page or two and
    # descends once into each range already emptied (a few pages each); walking the
    # earlier batches' dead entries added about three pages per batch (90 by the 30th).
    assert max(full) <= full[0] + 20, looks


def _analyze(engine: sa.Engine) -> None:
    """Statistics, as autovacuum keeps them: without any, the planner guesses that the
    range between a floor and the cutoff holds a handful of rows and reads all of it
    (a bitmap, then a sort) where it should walk the index in order."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE jobs, jobs_archive")


def test_each_batch_of_a_long_prune_reads_as_much_as_the_first(
    explained: tuple[sa.Engine, list[dict[str, Any]]],
) -> None:
    engine, plans = explained
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at,"
            " attempts, created_at, finished_at)"
            " SELECT g, 'noop', 'default', 0, '{}', 'done', now(), 1, now(),"
            f" now() - interval '100 days' - g * interval '1 second'"
            f" FROM generate_series(1, {ROWS}) AS g"
        )
    _analyze(engine)
    plans.clear()
    with Session(engine) as session:
        assert ops.prune(session, timedelta(days=90), batch=BATCH) == ROWS
    assert scalar(engine, "SELECT count(*) FROM jobs_archive") == 0
    _assert_flat(_looks(plans), ROWS // BATCH)


def test_each_batch_of_a_long_archive_reads_as_much_as_the_first_in_every_range(
    explained: tuple[sa.Engine, list[dict[str, Any]]],
) -> None:
    engine, plans = explained
    with engine.begin() as conn:
        # Done, dead and cancelled rows, their finished_at interleaved: three ranges.
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload, status, attempts, finished_at)"
            " SELECT 'noop', '{}', (ARRAY['done', 'dead', 'cancelled'])[g %% 3 + 1]::job_status,"
            " 1, now() - interval '40 days' - g * interval '1 second'"
            f" FROM generate_series(1, {ROWS}) AS g"
        )
    _analyze(engine)
    plans.clear()
    with Session(engine) as session:
        moved = list(
            ops.archive_batches(
                session, timedelta(days=7), batch=BATCH, include_dead_after=timedelta(days=30)
            )
        )
    assert sum(moved) == ROWS and set(moved) == {BATCH}
    assert scalar(engine, "SELECT count(*) FROM jobs") == 0
    _assert_flat(_looks(plans), ROWS // BATCH)


def test_archive_and_prune_batches_are_never_jit_compiled(db_url: URL) -> None:
    # With jit_above_cost 0 every statement would be compiled: on a long history the
    # batches' estimates pass the default threshold, and compiling took longer than
    # the batch (a 1,000-row prune 5-7x its cost on an empty history at 10M).
    plans: list[dict[str, Any]] = []
    engine = _explaining(db_url, plans, "SET jit = on", "SET jit_above_cost = 0")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT sum(g) FROM generate_series(1, 10) AS g").all()
        if "JIT" not in plans[-1]:
            pytest.skip("this server cannot JIT-compile (no LLVM)")
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO jobs (kind, payload, status, attempts, finished_at)"
                " SELECT 'noop', '{}', 'done', 1, now() - interval '8 days' - g * interval '1 s'"
                " FROM generate_series(1, 250) AS g"
            )
        plans.clear()
        with Session(engine) as session:
            assert ops.archive(session, timedelta(days=7), batch=100) == 250
            assert ops.prune(session, timedelta(days=1), batch=100) == 250
        batches = [p for p in plans if "picked" in p.get("Query Text", "")]
        assert len(batches) == 6
        assert not [p["Query Text"][:40] for p in batches if "JIT" in p], batches
    finally:
        engine.dispose()


def test_a_prune_batch_deletes_each_row_from_its_own_partition_not_from_every_week(
    explained: tuple[sa.Engine, list[dict[str, Any]]],
) -> None:
    # Revision 0022: jobs_archive is partitioned by archived_at. A batch that deleted
    # by id alone probed the primary key of every weekly partition for each row (38,000
    # buffers for 1,000 rows at 15 partitions, 6,000 unpartitioned); by (id,
    # archived_at) each row's probe is pruned to its own partition at run time.
    engine, plans = explained
    start = migrated_long_ago(engine, 10)
    # Eight closed weeks of history, kept (recent enough), each big enough that the
    # planner probes its primary key rather than reading it whole (one page each).
    for weeks in range(1, 9):
        archive_at(engine, start - weeks * WEEK + timedelta(days=1), 3_000)
    prepare(engine, start)
    with engine.begin() as conn:
        # Late archives: finished long ago, archived this week.
        conn.exec_driver_sql(
            "INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at,"
            " attempts, created_at, finished_at)"
            " SELECT 5000000000 + g, 'noop', 'default', 0, '{}', 'done', now(), 1, now(),"
            " now() - interval '100 days' - g * interval '1 second'"
            f" FROM generate_series(1, {BATCH}) AS g"
        )
    _analyze(engine)
    plans.clear()
    with Session(engine) as session:
        assert ops.prune(session, timedelta(days=90), batch=BATCH * 2) == BATCH
    (batch,) = [p for p in plans if "picked" in p.get("Query Text", "")]
    top = batch["Plan"]
    looked = _node(top, "CTE picked")
    assert looked is not None
    spent = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    deleting = spent - looked["Shared Hit Blocks"] - looked["Shared Read Blocks"]
    # One partition's primary key and heap page per row, and the row's own index
    # entries: 6 buffers a row. Probing every partition's primary key read 22.
    assert deleting <= 10 * BATCH, (deleting, spent)
