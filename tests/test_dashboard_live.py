"""The dashboard's live view over real HTTP (uvicorn in a thread, httpx reading the
server-sent events), against real PostgreSQL: an event arrives after a job is committed,
a watched job's new status arrives, the tabs share one LISTEN connection, and the stream
goes on by polling when LISTEN is off or its connection is killed."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from dashboard_client import Client
from helpers import running_jobs, serve_in_thread, start_worker, stop, wait_for
from jobapp import registry
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from starlette.applications import Starlette
from starlette.routing import Mount

from sqla_jobs import ConfigError, NewJob, enqueue, enqueue_many, ops
from sqla_jobs.dashboard import create_app

Events = Iterator[tuple[str, Any]]


@contextmanager
def serve(engine: sa.Engine, **options: Any) -> Iterator[str]:
    """The dashboard served by uvicorn on a free 127.0.0.1 port, in a thread."""
    with serve_in_thread(create_app(engine, refresh=1.0, **options)) as url:
        yield url


@contextmanager
def stream(url: str) -> Iterator[Events]:
    """The (event, data) pairs of one event stream, as a browser's EventSource sees them."""
    with (
        httpx.Client(timeout=httpx.Timeout(30.0)) as client,
        client.stream("GET", url) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        yield _events(response.iter_lines())


def _events(lines: Iterator[str]) -> Events:
    name, data = "message", []
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data.append(line.removeprefix("data: "))
        elif line == "" and data:
            yield name, json.loads("\n".join(data))
            name, data = "message", []


def next_event(
    events: Events, name: str, matches: Callable[[Any], bool], timeout: float = 15.0
) -> Any:
    """The first ``name`` event whose data ``matches``, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    seen = []
    for got, data in events:
        if got == name:
            if matches(data):
                return data
            seen.append(data)
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"no matching {name!r} event in {timeout}s; saw {seen}")


def listeners(engine: sa.Engine) -> list[int]:
    """The dashboard's LISTEN connections to this database."""
    with engine.connect() as conn:
        found = conn.execute(
            sa.text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'sqla_jobs dashboard' AND query LIKE 'LISTEN %'"
            )
        )
        return [int(pid) for pid in found.scalars()]


def done_jobs(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT count(*) FROM jobs WHERE status = 'done'"))
        return int(found.scalar_one())


def add_job(engine: sa.Engine, kind: str = "mail") -> int:
    with Session(engine) as session:
        job_id = enqueue(session, kind, {})
        session.commit()
    assert job_id is not None
    return job_id


def test_counts_event_arrives_after_a_job_is_enqueued_and_committed(engine: sa.Engine) -> None:
    with serve(engine) as base, stream(base + "/events?counts=1") as events:
        first = next_event(events, "counts", lambda c: True)
        assert (first["ready"], first["queues"]) == (0, {})
        add_job(engine)
        later = next_event(events, "counts", lambda c: c["ready"] == 1)
        assert later["queues"]["default"]["ready"] == 1


def test_jobs_event_reports_the_new_status_of_a_watched_job(engine: sa.Engine) -> None:
    job = add_job(engine)
    other = add_job(engine)
    with serve(engine) as base, stream(f"{base}/events?ids={job}") as events:
        first = next_event(events, "jobs", lambda j: True)
        assert first == {str(job): {"status": "queued", "attempts": 0, "stopping": False}}
        with Session(engine) as session:
            ops.cancel(session, [job, other])
            session.commit()
        after = next_event(events, "jobs", lambda j: j[str(job)]["status"] == "cancelled")
        assert list(after) == [str(job)]  # only the jobs this tab watches
        with Session(engine) as session:
            ops.delete_jobs(session, [job])
            session.commit()
        next_event(events, "jobs", lambda j: j[str(job)]["status"] == "gone")


def test_open_tabs_share_one_listen_connection_which_goes_with_the_last_tab(
    engine: sa.Engine,
) -> None:
    with serve(engine) as base:
        with stream(base + "/events?counts=1") as one, stream(base + "/events?ids=1") as two:
            next_event(one, "counts", lambda c: True)
            next_event(two, "jobs", lambda j: True)
            assert len(wait_for(lambda: listeners(engine), message="a LISTEN backend")) == 1
        wait_for(lambda: listeners(engine) == [], message="the LISTEN connection to close")


def test_a_tab_joining_a_running_hub_gets_the_state_of_its_own_jobs(engine: sa.Engine) -> None:
    first, second = add_job(engine), add_job(engine)
    with serve(engine) as base, stream(f"{base}/events?ids={first}") as one:
        next_event(one, "jobs", lambda j: True)
        with stream(f"{base}/events?ids={second}") as two:
            # Not "gone": the round before this tab joined did not ask about its job.
            got = next_event(two, "jobs", lambda j: True)
            assert got == {str(second): {"status": "queued", "attempts": 0, "stopping": False}}


def test_stream_polls_when_told_not_to_listen(engine: sa.Engine) -> None:
    """Behind PgBouncer in transaction mode notifications never arrive: listen=False."""
    with serve(engine, listen=False) as base, stream(base + "/events?counts=1") as events:
        next_event(events, "counts", lambda c: c["ready"] == 0)
        add_job(engine)
        next_event(events, "counts", lambda c: c["ready"] == 1)
        assert listeners(engine) == []


def test_stream_goes_on_by_polling_when_its_listen_connection_is_killed(
    engine: sa.Engine,
) -> None:
    with serve(engine) as base, stream(base + "/events?counts=1") as events:
        next_event(events, "counts", lambda c: c["ready"] == 0)
        (pid,) = wait_for(lambda: listeners(engine), message="a LISTEN backend")
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        wait_for(lambda: listeners(engine) == [], message="the LISTEN backend to end")
        add_job(engine)
        next_event(events, "counts", lambda c: c["ready"] == 1)


def test_stream_refuses_a_denied_viewer_and_bad_ids(engine: sa.Engine) -> None:
    denied = Client(create_app(engine, auth=lambda request: "deny"))
    try:
        assert denied.get("/events?counts=1").status_code == 403
    finally:
        denied.close()
    client = Client(create_app(engine))
    try:
        bad = client.get("/events?ids=1,x")
        assert (bad.status_code, bad.text) == (
            400,
            "ids must be job ids separated by commas, got 'x'",
        )
    finally:
        client.close()


def test_pages_name_their_event_stream_and_the_script_is_the_only_one(
    engine: sa.Engine,
) -> None:
    job = add_job(engine)
    client = Client(create_app(engine))
    try:
        assert 'data-live="/events?counts=1"' in client.get("/").text
        assert f'data-live="/events?ids={job}"' in client.get("/jobs").text
        detail = client.get(f"/jobs/{job}").text
        assert f'data-live="/events?ids={job}"' in detail
        assert "<script>" not in detail and detail.count("<script") == 1
        assert "data-live" not in client.get("/queues").text
    finally:
        client.close()
    mounted = Client(Starlette(routes=[Mount("/admin/jobs", create_app(engine))]))
    try:
        page = mounted.get("/admin/jobs/").text
        assert 'data-live="/admin/jobs/events?counts=1"' in page
    finally:
        mounted.close()


def test_refresh_below_one_second_is_refused(engine: sa.Engine) -> None:
    with pytest.raises(ConfigError, match="refresh must be at least 1 second"):
        create_app(engine, refresh=0.2)


def test_running_counts_the_handlers_at_work_and_claimed_counts_the_buffered_jobs_too(
    engine: sa.Engine, db_url: URL
) -> None:
    """A real worker with 2 handler slots and a prefetch buffer of 5 holds 7 long jobs:
    2 run, 5 wait in its buffer, all 7 with status running. The overview says 2 running
    (from the worker's heartbeat) and 7 claimed, on the page and in its live counts."""
    worker = start_worker(db_url, "--concurrency", "2", "--prefetch", "5", "--lock-seconds", "1.5")
    try:
        with Session(engine) as session:
            enqueue_many(session, [NewJob("noop", {}) for _ in range(20)])
            session.commit()
        # Short jobs first: at their pace the buffer is sized to its full 5 jobs.
        wait_for(lambda: done_jobs(engine) == 20, message="the short jobs to run")
        with Session(engine) as session:
            enqueue_many(session, [NewJob("until_cancelled", {}) for _ in range(10)])
            session.commit()
        wait_for(lambda: running_jobs(engine) == 7, message="2 running and 5 buffered jobs")
        with serve(engine) as url, stream(url + "/events?counts=1") as events:
            counts = next_event(events, "counts", lambda c: c["running"] == 2)
            assert counts["claimed"] == 7 and counts["workers"] == 1
            assert counts["queues"]["default"]["claimed"] == 7
            assert "running" not in counts["queues"]["default"]  # unknown per queue
        client = Client(create_app(engine))
        try:
            page = client.get("/").text
            queues = client.get("/queues").text
        finally:
            client.close()
        assert 'data-count="running">2<' in page and 'data-count="claimed">7<' in page
        assert 'data-field="claimed">7<' in page
        assert "Claimed</abbr>" in queues and ">Running<" not in queues
    finally:
        stop(worker)


def test_close_streams_ends_the_open_streams_of_a_mounted_dashboard(engine: sa.Engine) -> None:
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from sqla_jobs.dashboard import close_streams

    dashboard = create_app(engine, refresh=1.0)

    async def stopping(request: Request) -> PlainTextResponse:
        close_streams(dashboard)  # on the server's loop, as a shutdown hook would be
        return PlainTextResponse("closed")

    app = Starlette(routes=[Route("/stop", stopping), Mount("/admin/jobs", dashboard)])
    with serve_in_thread(app) as base, stream(base + "/admin/jobs/events?counts=1") as events:
        assert next_event(events, "counts", lambda c: True) is not None
        assert httpx.get(base + "/stop", timeout=10).text == "closed"
        started = time.monotonic()
        for _ in events:  # to its end, cleanly: an abrupt close would raise here
            pass
        assert time.monotonic() - started < 5
    with pytest.raises(TypeError, match=r"takes an app made by sqla_jobs\.dashboard\.create_app"):
        close_streams(Starlette())


@pytest.mark.parametrize(
    ("options", "actionable"),
    [
        ({}, "cancelled dead done queued running waiting"),
        ({"permissions": {"retry", "cancel"}}, "cancelled dead queued running waiting"),
        ({"permissions": {"retry"}}, "cancelled dead"),
        ({"permissions": set()}, None),
        ({"read_only": True}, None),
    ],
)
def test_the_job_page_offers_a_reload_only_for_states_with_an_action_the_viewer_may_take(
    engine: sa.Engine, options: dict[str, Any], actionable: str | None
) -> None:
    with Session(engine) as s:
        job_id = enqueue(s, "noop", {})
        s.commit()
    client = Client(create_app(engine, registry=registry, listen=False, **options))
    try:
        page = client.get(f"/jobs/{job_id}").text
    finally:
        client.close()
    found = re.search(r'data-stale-job="\d+" data-drawn="queued" data-actionable="([^"]*)"', page)
    assert (found.group(1) if found else None) == actionable
    assert ("reload for its actions" in page) == (actionable is not None)
