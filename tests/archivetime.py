"""Moving ``jobs_archive``'s clock in tests (revision 0022): no sleeping.

The template's (empty) initial partition is re-attached to end some weeks ago, as if
the migration had run months before, and rows are archived with an explicit ``now``
(``admin.archive_batch(now=...)``) after ``jobs_archive_prepare(at)`` made their week.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import sqlalchemy as sa
from helpers import scalar

from sqla_jobs.sql import admin

WEEK = timedelta(weeks=1)
INITIAL = "jobs_archive_p_initial"


def this_week(engine: sa.Engine) -> datetime:
    return scalar(engine, "SELECT date_trunc('week', now(), 'UTC')")  # type: ignore[no-any-return]


def migrated_long_ago(engine: sa.Engine, weeks: int) -> datetime:
    """The initial partition ends ``weeks`` weeks before this week's Monday, as if
    revision 0022 ran that long ago; returns this week's Monday."""
    start = this_week(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE jobs_archive DETACH PARTITION {INITIAL}")
        conn.execute(
            sa.text(
                f"ALTER TABLE jobs_archive ATTACH PARTITION {INITIAL}"
                " FOR VALUES FROM (MINVALUE) TO ('{}')".format((start - weeks * WEEK).isoformat())
            )
        )
    return start


def partition_name(week: datetime) -> str:
    return "jobs_archive_p" + week.strftime("%Y%m%d")


def prepare(engine: sa.Engine, at: datetime) -> None:
    """``jobs_archive_prepare(at)`` until it has nothing left to do, each call committed."""
    for _ in range(3):
        with engine.begin() as conn:
            if not conn.execute(admin.prepare_archive(at)).scalar_one():
                return
    raise AssertionError("jobs_archive_prepare kept changing things")


def partitions(engine: sa.Engine) -> dict[str, bool]:
    with engine.connect() as conn:
        return {r.partition: r.id_check for r in conn.execute(admin.archive_partitions())}


def archive_at(engine: sa.Engine, at: datetime, n: int, workflows: int = 0) -> list[int]:
    """``n`` done jobs (and ``workflows`` three-step workflows) finished an hour before
    ``at``, archived at ``at``; their ids."""
    prepare(engine, at)
    with engine.begin() as conn:
        ids = list(
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (kind, payload, status, attempts, finished_at, result)"
                    " SELECT 'noop', '{}', 'done', 1, :f, jsonb_build_object('n', g)"
                    " FROM generate_series(1, :n) AS g RETURNING id"
                ),
                {"f": at - timedelta(hours=1), "n": n},
            ).scalars()
        )
        for _ in range(workflows):
            ids += conn.execute(
                sa.text(
                    "INSERT INTO jobs (kind, payload, status, attempts, finished_at,"
                    "                  workflow_id, step)"
                    " SELECT 'noop', '{}', 'done', 1, :f, :w, 's' || g"
                    " FROM generate_series(1, 3) AS g RETURNING id"
                ),
                {"f": at - timedelta(hours=1), "w": uuid.uuid4()},
            ).scalars()
        stmt = admin.archive_batch(done_older_than=0, dead_older_than=None, batch=100_000, now=at)
        moved = conn.execute(stmt).all()
    assert len(moved) == len(ids)
    return ids
