"""Periodic schedules: tick computation, registration errors, enqueue_due on a pinned clock.

The database's clock is pinned through ``enqueue_due(..., now=...)`` (every statement
takes it instead of ``now()``), so each policy's result is exact. Real worker processes
are in tests/test_periodic_process.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from helpers import TESTS, rows, scalar, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Registry, RegistryError, ops, periodic, testing

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
T0 = datetime(2026, 6, 1, 12, 0, 0, 250_000, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def berlin(*args: int, fold: int = 0) -> datetime:
    """A Berlin wall time as an instant in UTC, so that adding a timedelta adds real time."""
    return datetime(*args, fold=fold, tzinfo=BERLIN).astimezone(UTC)  # type: ignore[arg-type,misc]


def local(ticks: Any) -> list[str]:
    return [t.astimezone(BERLIN).isoformat() for t in ticks]


def noop(session: Session, payload: dict[str, Any]) -> None:
    pass


def registry_with(**schedule: Any) -> Registry:
    registry = Registry()
    handler = registry.register("report", noop, queue="reports", priority=3)
    registry.schedule("s", schedule.pop("cron", None), handler, **schedule)
    return registry


# --- ticks ----------------------------------------------------------------------------


def test_a_fixed_time_in_the_skipped_spring_forward_hour_runs_once_right_after_the_gap() -> None:
    s = registry_with(cron="30 2 * * *", timezone="Europe/Berlin").schedules[0]
    start = berlin(2026, 3, 27, 12)
    assert local(s.ticks_between(start, start + timedelta(days=3))) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that night: 03:00, once
        "2026-03-30T02:30:00+02:00",
    ]
    # The same tick, looked for backwards (missed="latest" after an outage).
    assert local([s.latest_at_or_before(berlin(2026, 3, 29, 9))]) == ["2026-03-29T03:00:00+02:00"]


def test_elapsed_time_schedules_have_no_tick_in_the_skipped_hour() -> None:
    s = registry_with(cron="*/30 * * * *", timezone="Europe/Berlin").schedules[0]
    start = berlin(2026, 3, 29, 1, 0)
    assert local(s.ticks_between(start, start + timedelta(hours=2))) == [
        "2026-03-29T01:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 30 real minutes after 01:30 CET
        "2026-03-29T03:30:00+02:00",
        "2026-03-29T04:00:00+02:00",  # two real hours after the start
    ]


def test_a_fixed_time_in_the_repeated_fall_back_hour_runs_once_at_its_first_occurrence() -> None:
    s = registry_with(cron="30 2 * * *", timezone="Europe/Berlin").schedules[0]
    start = berlin(2026, 10, 24, 12)
    assert local(s.ticks_between(start, start + timedelta(days=2))) == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    # Starting inside the repeated hour, after the first 02:30: no second run that night.
    inside = berlin(2026, 10, 25, 2, 10, fold=1)
    assert local([s.next_after(inside)]) == ["2026-10-26T02:30:00+01:00"]
    assert local([s.latest_at_or_before(inside)]) == ["2026-10-25T02:30:00+02:00"]


def test_elapsed_time_schedules_tick_in_both_occurrences_of_a_repeated_hour_distinctly() -> None:
    s = registry_with(cron="*/30 * * * *", timezone="Europe/Berlin").schedules[0]
    start = berlin(2026, 10, 25, 1, 0)
    ticks = list(s.ticks_between(start, start + timedelta(hours=3)))
    assert local(ticks) == [
        "2026-10-25T01:30:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]
    assert len({periodic.tick_key("s", t) for t in ticks}) == 6
    newest_first = [s.latest_at_or_before(start + timedelta(hours=3))]
    for _ in range(5):
        newest_first.append(s.latest_at_or_before(newest_first[-1] - timedelta(microseconds=1)))
    assert newest_first == ticks[::-1]


def test_a_star_minute_inside_the_skipped_hour_has_no_tick_that_night_unlike_listed_minutes() -> (
    None
):
    star = registry_with(cron="*/30 2 * * *", timezone="Europe/Berlin").schedules[0]
    listed = registry_with(cron="0,30 2 * * *", timezone="Europe/Berlin").schedules[0]
    spring = berlin(2026, 3, 28, 12)
    assert local(star.ticks_between(spring, spring + timedelta(days=2))) == [
        "2026-03-30T02:00:00+02:00",  # elapsed-time rules: nothing on the 29th
        "2026-03-30T02:30:00+02:00",
    ]
    assert local(listed.ticks_between(spring, spring + timedelta(days=2))) == [
        "2026-03-29T03:00:00+02:00",  # fixed-time rules: both fold onto 03:00, once
        "2026-03-30T02:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    autumn = berlin(2026, 10, 24, 12)
    assert local(star.ticks_between(autumn, autumn + timedelta(hours=24))) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
    ]
    assert local(listed.ticks_between(autumn, autumn + timedelta(hours=24))) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
    ]


def test_aliases_are_their_cron_expressions() -> None:
    start = datetime(2026, 6, 1, 10, 15, tzinfo=UTC)
    for alias, first in [
        ("@hourly", "2026-06-01T11:00:00+00:00"),
        ("@daily", "2026-06-02T00:00:00+00:00"),
        ("@midnight", "2026-06-02T00:00:00+00:00"),
        ("@weekly", "2026-06-07T00:00:00+00:00"),  # a Sunday
        ("@monthly", "2026-07-01T00:00:00+00:00"),
        ("@yearly", "2027-01-01T00:00:00+00:00"),
        ("@annually", "2027-01-01T00:00:00+00:00"),
    ]:
        s = registry_with(cron=alias).schedules[0]
        assert s.next_after(start).isoformat() == first, alias
        assert s.expression == alias


def test_intervals_count_from_the_unix_epoch() -> None:
    s = registry_with(every=timedelta(minutes=15)).schedules[0]
    assert s.expression == "every 15m"
    assert s.next_after(datetime(2026, 6, 1, 10, 7, 3, tzinfo=UTC)) == datetime(
        2026, 6, 1, 10, 15, tzinfo=UTC
    )
    assert s.next_after(datetime(2026, 6, 1, 10, 15, tzinfo=UTC)) == datetime(
        2026, 6, 1, 10, 30, tzinfo=UTC
    )
    assert s.latest_at_or_before(datetime(2026, 6, 1, 10, 15, tzinfo=UTC)) == datetime(
        2026, 6, 1, 10, 15, tzinfo=UTC
    )


# --- registration errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (
            {"cron": "61 * * * *"},
            "schedule 's': invalid cron expression '61 * * * *': Bad minute (0-59)",
        ),
        ({"cron": "0 25 * * *"}, "invalid cron expression '0 25 * * *': Bad hour (0-23)"),
        (
            {"cron": "0 2 * *"},
            "schedule 's': invalid cron expression '0 2 * *': a cron expression has 5",
        ),
        ({"cron": "0 0 2 * * *"}, "for seconds use every=timedelta(...)"),
        ({"cron": "@reboot"}, "schedule 's': unknown cron alias '@reboot'"),
        (
            {"cron": "0 0 31 2 *"},
            "schedule 's': invalid cron expression '0 0 31 2 *': Bad day-of-month (1-31, and a "
            "day its months have: '0 0 30 2 *' never fires)",
        ),
        (
            {"cron": "0 2 * * *", "timezone": "Europe/Berlinn"},
            "schedule 's': unknown time zone 'Europe/Berlinn'",
        ),
        ({"cron": "0 2 * * *", "timezone": "../etc/passwd"}, "unknown time zone '../etc/passwd'"),
        ({}, "schedule 's': give a cron expression or every=timedelta(...), exactly one"),
        ({"cron": "0 2 * * *", "every": SECOND}, "exactly one"),
        ({"every": timedelta(milliseconds=500)}, "every must be a timedelta of at least 1 second"),
        ({"every": 30}, "every must be a timedelta"),
        ({"every": SECOND, "timezone": "Europe/Berlin"}, "an interval counts from the Unix epoch"),
        ({"cron": "@daily", "missed": "some"}, "missed must be one of 'skip', 'latest', 'all'"),
        ({"cron": "@daily", "missed": "all"}, 'missed="all" needs a bound'),
        ({"cron": "@daily", "missed": "all", "catch_up": 0}, "catch_up must be positive"),
        ({"cron": "@daily", "catch_up": 3}, 'catch_up applies to missed="all" only'),
        ({"cron": "@daily", "grace": timedelta(0)}, "grace must be a positive timedelta"),
        ({"cron": "@daily", "payload": {"scheduled_for": 1}}, "'scheduled_for' is reserved"),
        ({"cron": "@daily", "payload": {"x": float("nan")}}, "schedule 's': payload"),
    ],
)
def test_a_schedule_that_cannot_run_is_refused_at_import_naming_it(
    schedule: dict[str, Any], message: str
) -> None:
    with pytest.raises(RegistryError) as caught:
        registry_with(**schedule)
    assert message in str(caught.value)


def test_schedule_names_kinds_and_decorator_order_are_checked() -> None:
    registry = Registry()
    handler = registry.register("report", noop)
    registry.schedule("nightly", "@daily", handler)
    with pytest.raises(RegistryError, match="schedule 'nightly' is already registered"):
        registry.schedule("nightly", "@hourly", "report")
    with pytest.raises(RegistryError, match="kind 'other' has no handler in this registry"):
        registry.schedule("x", "@daily", "other")
    with pytest.raises(RegistryError, match="schedule name must be a non-empty string"):
        registry.schedule("", "@daily", handler)
    with pytest.raises(RegistryError, match=r"goes above @registry\.handler"):

        @registry.periodic("@daily")  # type: ignore[arg-type]
        def not_a_handler(session: Session, payload: dict[str, Any]) -> None: ...


def test_stacked_periodic_decorators_give_one_kind_several_named_schedules() -> None:
    registry = Registry()

    @registry.periodic("0 2 * * *", timezone="Europe/Berlin", name="berlin")
    @registry.periodic("0 2 * * *", timezone="America/New_York", name="new-york")
    @registry.handler("report")
    def report(session: Session, payload: dict[str, Any]) -> None: ...

    assert [(s.name, s.kind, s.timezone) for s in registry.schedules] == [
        ("berlin", "report", "Europe/Berlin"),
        ("new-york", "report", "America/New_York"),
    ]
    assert registry["report"] is report


# --- enqueue_due on a pinned database clock ------------------------------------------------


def jobs_of(engine: sa.Engine) -> list[Any]:
    return rows(
        engine,
        "SELECT idempotency_key, payload, run_at, queue, priority FROM jobs ORDER BY run_at",
    )


def ticks_of(engine: sa.Engine) -> list[datetime]:
    return [r.run_at for r in jobs_of(engine)]


def test_a_new_schedule_starts_at_the_next_tick_and_each_tick_is_enqueued_once(
    engine: sa.Engine,
) -> None:
    registry = registry_with(every=SECOND, payload={"region": "eu"})
    first = periodic.enqueue_due(engine, registry, now=T0)
    assert first.ticks == {} and ticks_of(engine) == []  # nothing before it existed
    assert first.next_in == pytest.approx(0.75 + periodic.WAKE_MARGIN)
    done = periodic.enqueue_due(engine, registry, now=T0 + SECOND)
    tick = datetime(2026, 6, 1, 12, 0, 1, tzinfo=UTC)
    assert done.ticks == {"s": (tick,)}
    again = periodic.enqueue_due(engine, registry, now=T0 + SECOND)
    assert again.ticks == {}
    (job,) = jobs_of(engine)
    assert job.idempotency_key == "periodic:s:2026-06-01T12:00:01+00:00"
    assert job.payload == {"region": "eu", "scheduled_for": "2026-06-01T12:00:01+00:00"}
    assert (job.run_at, job.queue, job.priority) == (tick, "reports", 3)
    state = rows(engine, "SELECT kind, expression, last_tick, last_job_id FROM jobs_periodic")
    assert [tuple(state[0])] == [
        ("report", "every 1s", tick, scalar(engine, "SELECT id FROM jobs"))
    ]


def test_ticks_at_most_grace_late_are_all_enqueued_whatever_the_policy(engine: sa.Engine) -> None:
    registry = registry_with(every=SECOND, missed="skip", grace=timedelta(seconds=5))
    periodic.enqueue_due(engine, registry, now=T0)
    periodic.enqueue_due(engine, registry, now=T0 + 4 * SECOND)
    assert [t.second for t in ticks_of(engine)] == [1, 2, 3, 4]


OUTAGE = [
    # (missed, catch_up, seconds of the ticks enqueued after ticks 1..20 fell due)
    ("latest", None, [20]),
    ("skip", None, [19, 20]),  # within grace (1.5 s) of 12:00:20.25
    ("all", timedelta(seconds=4), [17, 18, 19, 20]),
    ("all", 3, [18, 19, 20]),
    ("all", 50, list(range(1, 21))),
]


@pytest.mark.parametrize(("missed", "catch_up", "expected"), OUTAGE)
def test_after_an_outage_each_missed_policy_enqueues_exactly_its_ticks(
    engine: sa.Engine, missed: str, catch_up: Any, expected: list[int]
) -> None:
    registry = registry_with(
        every=SECOND, missed=missed, catch_up=catch_up, grace=timedelta(seconds=1.5)
    )
    periodic.enqueue_due(engine, registry, now=T0)
    periodic.enqueue_due(engine, registry, now=T0 + 20 * SECOND)
    assert [t.second for t in ticks_of(engine)] == expected
    # Every due tick counts as handled: none comes back later.
    assert scalar(engine, "SELECT last_tick FROM jobs_periodic") == T0.replace(
        second=20, microsecond=0
    )
    periodic.enqueue_due(engine, registry, now=T0 + 21 * SECOND)
    assert [t.second for t in ticks_of(engine)] == [*expected, 21]


def test_a_nightly_schedule_after_three_missed_nights_runs_once_for_the_latest(
    engine: sa.Engine,
) -> None:
    registry = registry_with(cron="0 2 * * *", timezone="Europe/Berlin")
    start = berlin(2026, 3, 26, 12)
    periodic.enqueue_due(engine, registry, now=start)
    periodic.enqueue_due(engine, registry, now=start + timedelta(days=3, hours=1))
    (job,) = jobs_of(engine)
    # The night of the spring-forward: 02:00 does not exist, the tick is 03:00 CEST.
    assert job.payload["scheduled_for"] == "2026-03-29T03:00:00+02:00"


def test_an_archived_tick_is_not_enqueued_again(engine: sa.Engine, session: Session) -> None:
    registry = registry_with(every=SECOND)
    periodic.enqueue_due(engine, registry, now=T0)
    periodic.enqueue_due(engine, registry, now=T0 + SECOND)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET status = 'done', finished_at = now()"))
    assert ops.archive(session, timedelta(0)) == 1  # the tick's key is free again
    assert periodic.enqueue_due(engine, registry, now=T0 + SECOND).ticks == {}
    assert ticks_of(engine) == []


def test_a_reset_state_row_does_not_enqueue_a_tick_twice(engine: sa.Engine) -> None:
    registry = registry_with(every=SECOND, missed="all", catch_up=100)
    periodic.enqueue_due(engine, registry, now=T0)
    periodic.enqueue_due(engine, registry, now=T0 + 3 * SECOND)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs_periodic SET last_tick = :t"), {"t": T0})
    periodic.enqueue_due(engine, registry, now=T0 + 4 * SECOND)
    # Ticks 1-3 exist already (their keys); only 4 is new.
    assert [t.second for t in ticks_of(engine)] == [1, 2, 3, 4]
    assert scalar(engine, "SELECT count(*) FROM jobs") == 4


def test_a_changed_expression_continues_after_the_last_tick_without_duplicates(
    engine: sa.Engine,
) -> None:
    every_minute = registry_with(every=timedelta(minutes=1))
    start = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    periodic.enqueue_due(engine, every_minute, now=start)
    periodic.enqueue_due(engine, every_minute, now=start + timedelta(minutes=1))  # 12:01
    # Next deploy: the same name, now a cron every 2 minutes (12:02 is a tick of both).
    two_minutes = registry_with(cron="*/2 * * * *")
    periodic.enqueue_due(engine, two_minutes, now=start + timedelta(minutes=3))
    assert [t.strftime("%H:%M") for t in ticks_of(engine)] == ["12:01", "12:02"]
    assert scalar(engine, "SELECT expression FROM jobs_periodic") == "*/2 * * * *"


def test_a_schedule_removed_from_the_code_stops_and_is_listed_as_removed(
    engine: sa.Engine, session: Session
) -> None:
    registry = registry_with(every=SECOND)
    periodic.enqueue_due(engine, registry, now=T0)
    periodic.enqueue_due(engine, registry, now=T0 + SECOND)
    without = Registry()
    without.register("report", noop)
    other = without.schedule("other", "@daily", "report")
    assert periodic.enqueue_due(engine, without, now=T0 + 5 * SECOND).ticks == {}
    assert len(ticks_of(engine)) == 1
    listed = {s.name: s for s in ops.periodic_statuses(session, without)}
    assert listed["s"].in_app is False and listed["s"].next_tick is None
    assert listed["s"].expression == "every 1s" and listed["s"].last_job_status == "queued"
    assert listed["other"].in_app is True and listed["other"].last_tick is not None
    db_now = scalar(engine, "SELECT now()")
    assert listed["other"].next_tick == other.next_after(db_now)  # the database's clock
    assert listed["other"].next_tick.time().isoformat() == "00:00:00"


def test_stats_lists_the_schedules_as_periodic_statuses_does_from_its_own_snapshot(
    engine: sa.Engine, session: Session
) -> None:
    registry = registry_with(every=SECOND)
    periodic.enqueue_due(engine, registry, now=T0)
    periodic.enqueue_due(engine, registry, now=T0 + SECOND)
    without = Registry()
    without.register("report", noop)
    without.schedule("other", "@daily", "report")
    checkouts: list[object] = []
    sa.event.listen(engine, "checkout", lambda *a: checkouts.append(a))
    found = ops.stats(session, without)
    assert len(checkouts) == 1  # the schedules are read on the snapshot's connection
    assert found.periodic == ops.periodic_statuses(session, without)
    assert [(s.name, s.in_app) for s in found.periodic] == [("other", True), ("s", False)]
    assert found.periodic[1].last_job_status == "queued"


def test_two_workers_enqueueing_at_once_enqueue_each_tick_once(engine: sa.Engine) -> None:
    import threading

    registry = registry_with(every=SECOND, missed="all", catch_up=1000)
    periodic.enqueue_due(engine, registry, now=T0)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for i in range(1, 30):
                barrier.wait()
                periodic.enqueue_due(engine, registry, now=T0 + i * SECOND)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert [t.second for t in ticks_of(engine)] == list(range(1, 30))


# --- the tick reaches the handler -----------------------------------------------------------


def test_the_handler_gets_its_tick_as_job_scheduled_for(engine: sa.Engine, db_url: URL) -> None:
    registry = Registry()
    seen: list[tuple[Any, Any]] = []

    @registry.periodic("0 2 * * *", timezone="Europe/Berlin", missed="all", catch_up=5)
    @registry.handler("nightly")
    def nightly(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        seen.append((job.scheduled_for, payload["scheduled_for"]))

    @registry.handler("plain")
    def plain(session: Session, payload: dict[str, Any], job: JobContext) -> None:
        seen.append((job.scheduled_for, None))

    start = berlin(2026, 10, 23, 12)
    periodic.enqueue_due(engine, registry, now=start)
    periodic.enqueue_due(engine, registry, now=start + timedelta(days=3))
    with Session(engine) as s:
        registry["plain"].enqueue(s, {"scheduled_for": "2026-01-01T00:00:00+00:00"})
        s.commit()
    testing.drain(db_url, registry)
    ticks = sorted(seen, key=lambda pair: pair[1] or "")
    assert [t.isoformat() if t else None for t, _ in ticks] == [
        None,  # a job not enqueued by a schedule has none, whatever its payload says
        "2026-10-24T02:00:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-26T02:00:00+01:00",
    ]


# --- operations -------------------------------------------------------------------------------


def python_path(*first: Path) -> str:
    """The tests' modules first, then the PYTHONPATH of this run (the code under test)."""
    return os.pathsep.join(p for p in (*map(str, first), os.environ.get("PYTHONPATH", "")) if p)


def cli(db_url: URL, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqla_jobs", *args],
        env={"DATABASE_URL": url_text(db_url), "PYTHONPATH": python_path(TESTS), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=TESTS,
    )


def test_sqla_jobs_periodic_lists_schedules_with_next_and_last_tick_and_job_status(
    engine: sa.Engine, db_url: URL
) -> None:
    import periodicapp

    periodic.enqueue_due(engine, periodicapp.registry, now=T0)
    periodic.enqueue_due(engine, periodicapp.registry, now=T0 + SECOND)
    text = cli(db_url, "periodic", "--app", "periodicapp:registry")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == [
        *("NAME", "KIND", "SCHEDULE", "TIME", "ZONE", "MISSED"),
        *("NEXT", "TICK", "(UTC)", "LAST", "TICK", "(UTC)", "LAST", "JOB"),
    ]
    assert [line.split()[0] for line in lines[1:]] == [
        "all-2",
        "all-3s",
        "latest",
        "skip",
        "ticked",
    ]
    assert "every 1s  UTC        latest" in text.stdout and "queued" in text.stdout
    out = cli(db_url, "periodic", "--app", "periodicapp:registry", "--json")
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    latest = next(s for s in listed if s["name"] == "latest")
    assert latest["last_tick"] == "2026-06-01T12:00:01+00:00"
    assert latest["last_job_status"] == "queued" and latest["in_app"] is True
    assert latest["next_tick"] is not None
    stats = cli(db_url, "stats", "--json", "--app", "periodicapp:registry")
    assert stats.returncode == 0, stats.stderr
    assert [s["name"] for s in json.loads(stats.stdout)["periodic"]] == [
        "all-2",
        "all-3s",
        "latest",
        "skip",
        "ticked",
    ]
    missing = cli(db_url, "periodic")
    assert missing.returncode == 2 and "--app" in missing.stderr


def test_sqla_jobs_periodic_shows_every_time_in_utc_whatever_zone_it_came_in(
    engine: sa.Engine, db_url: URL, tmp_path: Path
) -> None:
    """A schedule's next tick came in its own zone and the last tick in the database
    session's: one table showed both, in two zones, under one header."""
    (tmp_path / "berlinapp.py").write_text(
        "from sqla_jobs import Registry\n"
        "registry = Registry()\n\n"
        '@registry.periodic("0 3 * * *", timezone="Europe/Berlin")\n'
        '@registry.handler("nightly")\n'
        "def nightly(session, payload):\n"
        "    pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import berlinapp  # type: ignore[import-not-found]

        periodic.enqueue_due(engine, berlinapp.registry, now=T0)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("berlinapp", None)
    result = subprocess.run(
        [sys.executable, "-m", "sqla_jobs", "periodic", "--app", "berlinapp:registry"],
        env={
            "DATABASE_URL": url_text(db_url),
            "PYTHONPATH": python_path(tmp_path),
            "PATH": "",
            "PGTZ": "America/New_York",  # the session's zone: neither UTC nor Berlin
        },
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert "NEXT TICK (UTC)" in header and "LAST TICK (UTC)" in header
    next_tick, last_tick = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row)
    assert last_tick == "2026-06-01 12:00:00"  # T0, not 08:00 (New York)
    assert next_tick[11:] in ("01:00:00", "02:00:00")  # 03:00 in Berlin, not 03:00


def test_a_worker_with_schedules_refuses_a_database_without_revision_0004(
    empty_db_url: URL,
) -> None:
    import periodicapp

    from sqla_jobs import SchemaNotReadyError, WorkerConfig
    from sqla_jobs.worker import Worker

    testing.migrate(empty_db_url, "0003_notify_only_idle_workers")
    url = url_text(empty_db_url)
    worker = Worker(periodicapp.registry, WorkerConfig(database_url=url))
    try:
        with pytest.raises(
            SchemaNotReadyError,
            match=r"jobs_periodic \(revision 0004\) is missing.*run `alembic upgrade heads`",
        ):
            worker.check_schema()
    finally:
        worker.engine.dispose()
    # --no-periodic: this worker only runs jobs; since revision 0005 (job control) it
    # needs that revision's columns, which come after 0004 anyway.
    quiet = Worker(periodicapp.registry, WorkerConfig(database_url=url, periodic=False))
    try:
        with pytest.raises(SchemaNotReadyError, match=r"column jobs\.result does not exist"):
            quiet.check_schema()
    finally:
        quiet.engine.dispose()


def test_a_worker_with_schedules_on_an_empty_database_says_the_whole_schema_is_missing(
    empty_db_url: URL,
) -> None:
    import periodicapp

    from sqla_jobs import SchemaNotReadyError, WorkerConfig
    from sqla_jobs.worker import Worker

    worker = Worker(periodicapp.registry, WorkerConfig(database_url=url_text(empty_db_url)))
    try:
        with pytest.raises(SchemaNotReadyError) as caught:
            worker.check_schema()
    finally:
        worker.engine.dispose()
    message = str(caught.value)
    assert "this database has no sqla_jobs schema (the jobs table does not exist)" in message
    assert "jobs_periodic" not in message.split("(", 1)[0]
    # An app with its own Alembic history has two heads: `head` alone would not do.
    assert "run `alembic upgrade heads` (in an app with its own Alembic history, " in message
    assert "`heads`, because sqla_jobs' revisions are a branch of their own" in message
    assert "an install from pip migrates" in message


def test_the_workers_enqueue_loop_survives_database_errors_and_stops_when_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import threading

    from sqla_jobs.worker._services import PeriodicEnqueuer

    registry = registry_with(every=SECOND)
    unreachable = sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    stop = threading.Event()
    loop = threading.Thread(target=PeriodicEnqueuer(stop, unreachable, registry).run)
    with caplog.at_level("WARNING", logger="sqla_jobs.worker"):
        loop.start()
        wait_for(
            lambda: (
                sum("periodic ticks could not be enqueued" in r.message for r in caplog.records)
                >= 2
            ),
            message="two failed attempts, logged",
        )
        stop.set()
        loop.join(10)
    assert not loop.is_alive()
    unreachable.dispose()


#: Holds back the insert of a tick's job by a connection named ``gate_<x>`` while the test
#: holds the advisory lock ``hashtext('gate_<x>')``: a pause between an enqueuer's read of
#: its schedule's row and its insert.
GATE_SQL = """
CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF left(current_setting('application_name'), 5) = 'gate_' THEN
    PERFORM pg_advisory_xact_lock_shared(hashtext(current_setting('application_name')));
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER gate BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION gate();
"""


def test_an_enqueuer_that_read_the_schedule_before_a_tick_was_archived_does_not_run_it_again(
    engine: sa.Engine, db_url: URL
) -> None:
    """The row lock, not the key, keeps a tick from running twice once its job is archived.

    Enqueuer A reads the schedule's row and is held before its insert; B starts while A
    holds the row. B must leave the row to A (SKIP LOCKED). If B read it too, it would
    plan the same tick; A commits, the tick's job is archived (its key freed), and B's
    insert of the tick would then find no key in its way.
    """
    import threading

    registry = registry_with(every=SECOND)
    periodic.enqueue_due(engine, registry, now=T0)  # the schedule's row, last_tick T0
    with engine.begin() as conn:
        conn.exec_driver_sql(GATE_SQL)
    gates = {
        name: sa.create_engine(db_url, connect_args={"application_name": f"gate_{name}"})
        for name in ("a", "b")
    }
    outcome: dict[str, Any] = {}

    def enqueue(name: str) -> None:
        try:
            outcome[name] = periodic.enqueue_due(gates[name], registry, now=T0 + SECOND).ticks
        except BaseException as exc:
            outcome[name] = exc

    def held(name: str) -> bool:
        return bool(
            scalar(
                engine,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = :n "
                "AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
                n=f"gate_{name}",
            )
        )

    holder = engine.connect()
    threads = {name: threading.Thread(target=enqueue, args=(name,)) for name in ("a", "b")}
    try:
        for name in ("a", "b"):
            holder.execute(sa.text("SELECT pg_advisory_lock(hashtext(:n))"), {"n": f"gate_{name}"})
        holder.commit()
        threads["a"].start()
        wait_for(lambda: held("a"), message="enqueuer A held before its insert")
        threads["b"].start()
        # B either finishes (it skipped the row A holds) or reaches its own insert.
        wait_for(lambda: "b" in outcome or held("b"), message="enqueuer B done or held")
        holder.execute(sa.text("SELECT pg_advisory_unlock(hashtext('gate_a'))"))
        holder.commit()
        threads["a"].join(30)
        assert outcome["a"] == {"s": (T0.replace(microsecond=0) + SECOND,)}
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET status = 'done', finished_at = now()"))
        with Session(engine) as session:
            assert ops.archive(session, timedelta(0)) == 1  # the tick's key is free again
            session.commit()
    finally:
        holder.execute(sa.text("SELECT pg_advisory_unlock_all()"))
        holder.commit()
        holder.close()
        for thread in threads.values():
            if thread.is_alive() or thread.ident is not None:
                thread.join(30)
        for gate in gates.values():
            gate.dispose()
    assert outcome["b"] == {}
    archived = scalar(engine, "SELECT count(*) FROM jobs_archive")
    assert (archived, scalar(engine, "SELECT count(*) FROM jobs")) == (1, 0)
