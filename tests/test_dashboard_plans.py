"""Every filter of the dashboard's jobs page reads its own index, whatever the statistics.

The jobs page (``ops.list_jobs``, newest or oldest first, from a keyset cursor) once
walked the primary key and tested each row against the filter: a kind that 30 jobs out
of millions have was found by reading the whole table. Revision 0010 gives each filter
an index in the page's order ((status, id), (kind, id), (queue, id), GIN on payload;
revision 0013, GIN on meta and on tags). An
index only helps if the planner takes it, and statistics mislead it: taken when the
table was empty, or when the filtered value was on every row (a backlog of one kind
since drained, a night when everything failed). These tests build both on a table of
20,000 jobs (100,000 for the payload, meta and tags: on fewer, reading the whole table
is truly the cheapest way to find a payload) where the filtered value is on 30 of them, read the
plans (custom, and generic as a prepared statement gets) of the first page and of a page
after a cursor, in both orders: the filter's index is used, ``jobs`` is never read by a
sequential scan or by a walk of the primary key filtering rows. The pages are also read
with ``ops.list_jobs``, to prove they find the 30 jobs in order. Nothing is timed
(``benchmarks/run.py --only dashboard`` times them).

Age filters (``older_than``, ``newer_than``) walk the primary key (``created_at`` mostly
follows ``id``); their page bounds that walk with the lowest id created since a
``newer_than`` bound and the highest created before an ``older_than`` one, read from
``jobs_created_hour_idx`` (revision 0016): its plan is tested last, under those kinds of
misleading statistics and one more (every job a month old).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from test_fence_plans import _nodes, _plans

from sqla_jobs import ops
from sqla_jobs.models import JobStatus
from sqla_jobs.sql import admin

ROWS = 20_000
#: The payload's table: its plans differ from a small table's.
PAYLOAD_ROWS = 100_000
RARE = 30

# filter name -> (list_jobs arguments, the column's SQL value when rare / common, index)
FILTERS: dict[str, tuple[dict[str, Any], str, str, str]] = {
    **{
        f"status={s.value}": (
            {"statuses": [s]},
            f"status = '{s.value}'",
            "status = '{other}'",
            "jobs_status_id_idx",
        )
        for s in JobStatus
    },
    "kind": ({"kind": "rare.kind"}, "kind = 'rare.kind'", "kind = 'common'", "jobs_kind_id_idx"),
    "queue": (
        {"queue": "rare.queue"},
        "queue = 'rare.queue'",
        "queue = 'default'",
        "jobs_queue_id_idx",
    ),
    "payload": (
        {"payload": json.dumps({"tenant": "rare"})},
        """payload = '{"tenant": "rare", "n": 1}'""",
        """payload = '{"tenant": "common", "n": 1}'""",
        "jobs_payload_idx",
    ),
    # Revision 0013: job metadata, filtered like the payload (GIN, in two steps); most
    # jobs of a real table have none (NULL), or the same tenant.
    "meta": (
        {"meta": json.dumps({"tenant": "rare"})},
        """meta = '{"tenant": "rare", "request": 1}'""",
        """meta = '{"tenant": "common", "request": 1}'""",
        "jobs_meta_idx",
    ),
    "meta, others none": (
        {"meta": json.dumps({"tenant": "rare"})},
        """meta = '{"tenant": "rare", "request": 1}'""",
        "meta = NULL",
        "jobs_meta_idx",
    ),
    "tag": (
        {"tags": ["rare"]},
        "tags = ARRAY['rare', 'signup']",
        "tags = ARRAY['common', 'signup']",
        "jobs_tags_idx",
    ),
    "tag, others none": (
        {"tags": ["rare"]},
        "tags = ARRAY['rare', 'signup']",
        "tags = NULL",
        "jobs_tags_idx",
    ),
}
#: The filters asked in two steps (a window of the primary key, then the GIN index).
CONTAINMENT = {"payload", "meta", "meta, others none", "tag", "tag, others none"}


def _rows(name: str) -> int:
    return PAYLOAD_ROWS if name in CONTAINMENT else ROWS


def _other(status: str) -> str:
    return "queued" if status == "done" else "done"


def _load(engine: sa.Engine, name: str, stats: str) -> None:
    """``_rows(name)`` jobs, the filtered value on ``RARE`` of them spread over the table; the
    statistics taken on an empty table, or when every row had the filtered value."""
    _, rare, common, _ = FILTERS[name]
    if name.startswith("status="):
        common = common.format(other=_other(name.removeprefix("status=")))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # No autoanalyze may refresh the statistics while the test reads plans.
        conn.exec_driver_sql("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        if stats == "empty-table":
            conn.exec_driver_sql("ANALYZE jobs")
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, queue, payload, idempotency_key, created_at)"
            " SELECT 'common', 'default', jsonb_build_object('tenant', 'common', 'n', g),"
            " 'key-' || g, now() - interval '1 second' * (%(n)s - g)"
            " FROM generate_series(1, %(n)s) AS g",
            {"n": _rows(name)},
        )
        if stats == "value-on-every-row":
            conn.exec_driver_sql(f"UPDATE jobs SET {rare}")
            conn.exec_driver_sql("ANALYZE jobs")
        conn.exec_driver_sql(f"UPDATE jobs SET {common}")
        conn.exec_driver_sql(
            f"UPDATE jobs SET {rare} WHERE id %% (%(n)s / %(rare)s) = 0",
            {"n": _rows(name), "rare": RARE},
        )


def _assert_uses(plan: Any, index: str) -> None:
    text = json.dumps(plan)
    for node, _ in _nodes(plan):
        if node.get("Relation Name") == "jobs":
            assert node["Node Type"] != "Seq Scan", text
            # A walk of the primary key testing each row is what the index replaces.
            assert not (node.get("Index Name") == "jobs_pkey" and "Filter" in node), text
    assert f'"Index Name": "{index}"' in text, text


def _statements(name: str, newest_first: bool, after_id: int | None) -> list[Any]:
    """The statements of one page: one; for a payload filter, both steps."""
    args = dict(FILTERS[name][0], limit=51, after_id=after_id, newest_first=newest_first)
    if name not in CONTAINMENT:
        return [(FILTERS[name][3], admin.list_jobs(**args))]
    return [
        ("jobs_pkey", admin.list_jobs(**args, payload_scan=admin.NEAR)),
        (FILTERS[name][3], admin.list_jobs(**args, payload_scan=admin.MATCHES)),
    ]


def _ops_arguments(name: str) -> dict[str, Any]:
    args = dict(FILTERS[name][0])
    if "statuses" in args:
        args["status"] = args.pop("statuses")[0]
    for name in ("payload", "meta"):
        if name in args:
            args[name] = json.loads(args[name])
    if "tags" in args:
        args["tag"] = args.pop("tags")
    return args


STATS = ["empty-table", "value-on-every-row"]


@pytest.mark.parametrize(
    ("name", "stats"),
    [(name, stats) for name in FILTERS for stats in STATS],
)
def test_each_jobs_page_filter_reads_its_index_whatever_the_statistics(
    engine: sa.Engine, driver: psycopg.Connection[Any], name: str, stats: str
) -> None:
    _load(engine, name, stats)
    found = {}
    for newest_first in (True, False):
        for after_id in (None, _rows(name) // 2):
            for index, stmt in _statements(name, newest_first, after_id):
                for mode, plan in _plans(driver, stmt).items():
                    where = f"{name}, {mode}, newest_first={newest_first}, after_id={after_id}"
                    try:
                        if index == "jobs_pkey":
                            _assert_bounded(plan)
                        else:
                            _assert_uses(plan, index)
                    except AssertionError as exc:
                        raise AssertionError(f"{where}: {exc}") from None
            with Session(engine) as session:
                page = ops.list_jobs(
                    session,
                    **_ops_arguments(name),
                    limit=51,
                    after_id=after_id,
                    newest_first=newest_first,
                )
            ids = [job.id for job in page]
            assert ids == sorted(ids, reverse=newest_first)
            found[(newest_first, after_id)] = len(ids)
    half = _rows(name) // 2
    assert found == {(True, None): RARE, (False, None): RARE, (True, half): 15, (False, half): 15}


def _assert_bounded(plan: Any) -> None:
    """The primary key read over a range of ids (the payload's first step)."""
    text = json.dumps(plan)
    for node, _ in _nodes(plan):
        if node.get("Relation Name") == "jobs":
            assert node["Node Type"] != "Seq Scan", text
            if node.get("Index Name") == "jobs_pkey" and "Filter" in node:
                assert "id >=" in node.get("Index Cond", "") or "id <=" in node.get(
                    "Index Cond", ""
                ), text


@pytest.mark.parametrize("stats", ["empty-table", "value-on-every-row"])
def test_key_and_id_range_pages_are_index_probes_whatever_the_statistics(
    engine: sa.Engine, driver: psycopg.Connection[Any], stats: str
) -> None:
    _load(engine, "kind", stats)
    for args, index in (
        ({"key": "key-123"}, "jobs_idempotency_key_key"),
        ({"min_id": 5_000, "max_id": 5_999}, "jobs_pkey"),
    ):
        for newest_first in (True, False):
            stmt = admin.list_jobs(**args, limit=51, newest_first=newest_first)
            for plan in _plans(driver, stmt).values():
                text = json.dumps(plan)
                assert f'"Index Name": "{index}"' in text, text
                assert '"Seq Scan"' not in text, text


#: The age filters: (list_jobs arguments, how the walk is bounded).
AGES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "newer_than": ({"newer_than": 3600.0}, ("id >=",)),
    "older_than": ({"older_than": 3600.0}, ("id <=",)),
    # Both: the bound the page starts from (see admin._age_walk).
    "both": ({"older_than": 3600.0, "newer_than": 2 * 86400.0}, ()),
}


@pytest.mark.parametrize("stats", ["empty-table", "every-job-recent", "every-job-old"])
@pytest.mark.parametrize("age", list(AGES))
def test_age_filters_bound_their_walk_from_the_created_hour_index(
    engine: sa.Engine, driver: psycopg.Connection[Any], stats: str, age: str
) -> None:
    """The age filters' page (revision 0016): the lowest id created since a
    ``newer_than`` bound and the highest created before an ``older_than`` one come from
    ``jobs_created_hour_idx`` alone (index-only, one descent per hour), and the page
    walks the primary key between them; whatever the statistics say (taken on an empty
    table, when every job was recent, or when every job was a month old). On 100,000
    jobs, as for the payload: on fewer, reading the table is truly cheaper."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        if stats == "empty-table":
            conn.exec_driver_sql("ANALYZE jobs")
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload, created_at)"
            " SELECT 'k', '{}', now() - interval '1 second' * (%(n)s - g)"
            " FROM generate_series(1, %(n)s) AS g",
            {"n": PAYLOAD_ROWS},
        )
        if stats == "every-job-old":
            conn.exec_driver_sql("UPDATE jobs SET created_at = created_at - interval '30 days'")
        if stats != "empty-table":
            conn.exec_driver_sql("ANALYZE jobs")
        # A week of jobs: the last hour holds the newest few.
        conn.exec_driver_sql(
            "UPDATE jobs SET created_at = now() - interval '7 days' * (1 - id::float8 / %(n)s)",
            {"n": PAYLOAD_ROWS},
        )
        conn.exec_driver_sql("VACUUM jobs")  # all-visible: the bound is read index-only
    arguments, bounds = AGES[age]
    for newest_first in (True, False):
        for after_id in (None, PAYLOAD_ROWS // 2):
            stmt = admin.list_jobs(
                **arguments,
                limit=51,
                after_id=after_id,
                newest_first=newest_first,
            )
            for mode, plan in _plans(driver, stmt).items():
                text = json.dumps(plan)
                where = f"{mode}, newest_first={newest_first}, after_id={after_id}: {text}"
                scans = [n for n, _ in _nodes(plan) if n.get("Relation Name") == "jobs"]
                assert all(n["Node Type"] != "Seq Scan" for n in scans), where
                # The bounds: the hour index only, never a table row.
                hours = [n for n in scans if n.get("Index Name") == "jobs_created_hour_idx"]
                assert hours and all(n["Node Type"] == "Index Only Scan" for n in hours), where
                # The walk: the primary key in the page's order from one bound, not a
                # sort of the rows between them (the table's edge past the window is
                # read from the primary key too, an index-only probe of one entry).
                walk = [
                    n
                    for n in scans
                    if n.get("Index Name") == "jobs_pkey" and n["Node Type"] == "Index Scan"
                ]
                assert len(walk) == 1, where
                starts = ("id <=",) if newest_first else ("id >=",)
                assert all(b in walk[0].get("Index Cond", "") for b in bounds or starts), where
                sorts = [n for n, _ in _nodes(plan) if n["Node Type"] == "Sort"]
                assert not any("jobs.id" in " ".join(n["Sort Key"]) for n in sorts), where
