"""The overview counts exactly up to a bound, estimates above it, and says which.

Counting dead (or queued) jobs per queue and kind reads every such row: at a million
rows that is hundreds of milliseconds, on every open overview and every live round.
``ops.stats(exact_up_to=n)`` counts a family exactly while it has at most ``n`` jobs and
estimates it above (the newest ``n`` jobs' shares, scaled to the planner's total); the
overview uses it and marks the estimated figures.
"""

from __future__ import annotations

import sqlalchemy as sa
from dashboard_client import Client
from sqlalchemy.orm import Session

from sqla_jobs import ConfigError, ops
from sqla_jobs.dashboard import _live, create_app


def _load(engine: sa.Engine, dead: int, queued: int) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, queue, payload, status, attempts, max_attempts,"
            " finished_at) SELECT CASE WHEN g %% 4 = 0 THEN 'b' ELSE 'a' END, 'q', '{}',"
            " 'dead', 8, 8, now() FROM generate_series(1, %(n)s) AS g",
            {"n": dead},
        )
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, queue, payload) SELECT 'a', 'q', '{}'"
            " FROM generate_series(1, %(n)s)",
            {"n": queued},
        )
        conn.exec_driver_sql("VACUUM ANALYZE jobs")


def test_stats_estimates_a_family_above_exact_up_to_and_names_its_figures(
    engine: sa.Engine, session: Session
) -> None:
    _load(engine, dead=2_000, queued=40)
    exact = ops.stats(session)
    assert exact.estimated == frozenset()
    assert exact.total.dead == 2_000
    found = ops.stats(session, exact_up_to=99)
    # No job is cancelled: that count is exact (0).
    assert found.estimated == {"dead"}
    # 40 queued jobs are within the bound: counted.
    assert found.total.ready == 40
    # The planner's total (ANALYZE saw every row), split 3:1 as the newest 100
    # (exact_up_to + 1) are.
    assert found.total.dead == 2_000
    by_kind = {k.kind: k.dead for k in found.by_kind}
    assert by_kind == {"a": 1_500, "b": 500}
    assert found.to_dict()["estimated"] == ["dead"]


def test_stats_counts_exactly_up_to_the_bound(engine: sa.Engine, session: Session) -> None:
    _load(engine, dead=100, queued=0)
    assert ops.stats(session, exact_up_to=100).estimated == frozenset()
    assert ops.stats(session, exact_up_to=99).estimated == {"dead"}


def test_stats_refuses_a_bound_below_one(session: Session) -> None:
    try:
        ops.stats(session, exact_up_to=0)
    except ConfigError as exc:
        assert "exact_up_to" in str(exc)
    else:
        raise AssertionError("exact_up_to=0 was accepted")


def test_overview_marks_the_estimated_figures(engine: sa.Engine) -> None:
    _load(engine, dead=_live.EXACT_UP_TO + 50, queued=3)
    client = Client(create_app(engine, listen=False))
    try:
        page = client.get("/").text
    finally:
        client.close()
    assert (
        '<abbr class="estimate" title="estimate" data-estimate="dead">≈</abbr>'
        '<span class="n" data-count="dead">'
    ) in page
    # Drawn hidden: the live counts show it when the figure turns estimated.
    assert 'data-estimate="ready" hidden>≈</abbr><span class="n" data-count="ready">' in page
    assert (
        '<span data-estimated-note>Figures marked ≈ (<span data-count="estimated">dead</span>)'
        " are estimates"
    ) in page
    assert "<span data-exact-note hidden>" in page
