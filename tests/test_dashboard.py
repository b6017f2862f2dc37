"""The dashboard over HTTP (httpx.ASGITransport), against real PostgreSQL: every page,
every action, the permissions, CSRF, escaping, and mounting under a prefix."""

from __future__ import annotations

import asyncio
import base64
import html
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, MutableMapping
from html.parser import HTMLParser
from typing import Any

import docpages
import pytest
import sqlalchemy as sa
from dashboard_client import CSRF_COOKIE, Client, flash, forms, landing, said
from fastapi import FastAPI
from helpers import rows, scalar, url_text
from jobapp import registry as app_registry
from periodicapp import registry as periodic_registry
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session
from starlette.requests import Request

from sqla_jobs import ConfigError, enqueue, ops
from sqla_jobs.dashboard import ACTIONS, CONTENT_SECURITY_POLICY, Decision, _flash, create_app

MakeClient = Callable[..., Client]


@pytest.fixture
def make_client(engine: sa.Engine) -> Iterator[MakeClient]:
    made: list[Client] = []

    def make(**options: Any) -> Client:
        options.setdefault("registry", app_registry)
        client = Client(create_app(engine, **options))
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def sql(engine: sa.Engine, text: str, **params: Any) -> Any:
    with engine.begin() as conn:
        result = conn.execute(sa.text(text), params)
        return result.scalar() if result.returns_rows else None


def dead_job(engine: sa.Engine, kind: str = "fail", **columns: Any) -> int:
    values = {"queue": "default", "payload": "{}", "last_error": "ValueError: boom", **columns}
    return int(
        sql(
            engine,
            "INSERT INTO jobs (kind, queue, payload, status, attempts, finished_at, last_error) "
            "VALUES (:kind, :queue, CAST(:payload AS jsonb), 'dead', 3, now(), :last_error) "
            "RETURNING id",
            kind=kind,
            **values,
        )
    )


def new_job(session: Session, kind: str, payload: dict[str, Any], **options: Any) -> int:
    job_id = enqueue(session, kind, payload, **options)
    assert job_id is not None
    return job_id


def status_of(engine: sa.Engine, job_id: int) -> str | None:
    found = scalar(engine, "SELECT status::text FROM jobs WHERE id = :i", i=job_id)
    return None if found is None else str(found)


def audit(engine: sa.Engine) -> list[tuple[str, str, str, str]]:
    return [
        tuple(r)
        for r in rows(engine, "SELECT actor, action, scope, target FROM jobs_audit ORDER BY id")
    ]


# --- pages -------------------------------------------------------------------------------


def seed(engine: sa.Engine, session: Session) -> dict[str, int]:
    queued = new_job(session, "noop", {"n": 1}, key="key-1")
    mail = new_job(session, "effect", {"to": "a@example.com"}, queue="mail")
    session.commit()
    dead = dead_job(engine)
    done = int(
        sql(
            engine,
            "INSERT INTO jobs (kind, payload, status, attempts, finished_at, result) "
            "VALUES ('noop', '{}', 'done', 1, now(), '{\"sent\": 3}') RETURNING id",
        )
    )
    sql(
        engine,
        "INSERT INTO jobs_workers (id, host, pid, version, queues, kinds, concurrency, "
        "started_at, heartbeat_at, expires_at) VALUES ('w-1', 'box', 42, '0.1.0', "
        "'{default,mail}', '{noop}', 4, now(), now(), now() + interval '1 minute')",
    )
    return {"queued": queued, "mail": mail, "dead": dead, "done": done}


def test_every_page_renders_with_its_data_and_the_security_headers(
    engine: sa.Engine, session: Session, make_client: MakeClient
) -> None:
    ids = seed(engine, session)
    client = make_client(registry=periodic_registry)
    expected = {
        "/": ["Overview", "Jobs ended per minute", "<svg", "default", "mail"],
        "/queues": ["Queues and kinds", "mail", "Pause"],
        "/jobs": [f"/jobs/{ids['queued']}", f"/jobs/{ids['dead']}", "effect"],
        "/dead": ["Dead jobs", f"/jobs/{ids['dead']}", "ValueError: boom"],
        f"/jobs/{ids['dead']}": ["Job", "ValueError: boom", "Retry", "Delete"],
        f"/jobs/{ids['done']}": ["Result", "&#34;sent&#34;: 3"],
        "/periodic": ["Periodic schedules", "ticked"],
        "/workers": ["w-1", "box", "default, mail"],
        "/audit": ["Audit trail", "No action recorded yet."],
    }
    for path, texts in expected.items():
        response = client.get(path)
        assert response.status_code == 200, (path, response.text)
        for text in texts:
            assert text in response.text, (path, text)
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["cache-control"] == "no-store"
        # Nothing the policy would block: every script is a file, no style attribute.
        assert re.findall(r"<script(?![^>]*\ssrc=)", response.text) == []
        assert " style=" not in response.text and "<style" not in response.text
    css = client.get("/static/dashboard.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]
    assert css.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert client.get("/static/dashboard.js").status_code == 200


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids += [value or "" for name, value in attrs if name == "id"]


def html_ids(page: str) -> list[str]:
    parser = _Ids()
    parser.feed(page)
    return parser.ids


def test_no_page_repeats_an_html_id(
    engine: sa.Engine, session: Session, make_client: MakeClient
) -> None:
    ids = seed(engine, session)
    client = make_client(registry=periodic_registry)
    client.get("/")
    # An entry in every audit table a page shows (job, queue, kind), so each is drawn.
    client.post(f"/jobs/{ids['dead']}/retry")
    client.post("/queues/pause", {"scope": "queue", "name": "mail"})
    client.post("/queues/pause", {"scope": "kind", "name": "effect"})
    pages = {
        path: client.get(path).text
        for path in (
            "/",
            "/queues",
            "/jobs",
            "/dead",
            f"/jobs/{ids['dead']}",
            f"/jobs/{ids['done']}",
            "/periodic",
            "/workers",
            "/audit",
            "/jobs/999999",  # the error page
        )
    }
    pages["bulk review"] = client.post(
        "/jobs/bulk", {"op": "retry", "scope": "matching", "filter": ""}
    ).text
    for name, page in pages.items():
        found = html_ids(page)
        assert "main" in found, name  # the parser saw the page
        repeated = sorted({i for i in found if found.count(i) > 1})
        assert repeated == [], (name, repeated)


def test_overview_counts_and_chart_come_from_ops(
    engine: sa.Engine, session: Session, make_client: MakeClient
) -> None:
    seed(engine, session)
    ops.pause(session, "mail")
    session.commit()
    page = make_client().get("/").text
    assert "queue <strong>mail</strong>" in page  # the paused queue is called out
    assert "1 done, 1 dead" in page  # the chart's summary: this minute's two ended jobs
    assert page.count('class="done"') >= 1 and page.count('class="dead"') >= 1


def test_the_queues_page_reads_in_five_statements_on_two_connections(
    engine: sa.Engine, session: Session, make_client: MakeClient
) -> None:
    seed(engine, session)
    client = make_client(registry=periodic_registry)  # schedules: not read for this page
    client.get("/queues")
    statements: list[str] = []
    checkouts: list[object] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    sa.event.listen(engine, "checkout", lambda *a: checkouts.append(a))
    page = client.get("/queues")
    assert page.status_code == 200 and "Actions on queues and kinds" in page.text
    # stats' snapshot: its head, the counts, the controls, the workers; then the audit
    # entries of queues and kinds in one statement, on the read session.
    assert len(statements) == 5, statements
    assert len(checkouts) == 2
    assert not [s for s in statements if "jobs_periodic" in s]
    assert len([s for s in statements if "FROM jobs_audit" in s]) == 1


def test_jobs_page_filters_and_pages_by_keyset(
    engine: sa.Engine, session: Session, make_client: MakeClient
) -> None:
    made = [new_job(session, "noop", {"n": n, "user": n % 2}) for n in range(60)]
    keyed = new_job(session, "effect", {"user": 9}, key="the-key", queue="mail")
    session.commit()
    client = make_client()

    def listed(query: str) -> list[int]:
        page = client.get(f"/jobs?{query}")
        assert page.status_code == 200, page.text
        return [int(i) for i in re.findall(r'<td class="num"><a href="/jobs/(\d+)">', page.text)]

    assert listed("key=the-key") == [keyed]
    assert listed("queue=mail") == [keyed] and listed("kind=effect") == [keyed]
    assert listed(f"min_id={made[3]}&max_id={made[5]}") == made[5:2:-1]
    assert listed("payload=%7B%22user%22%3A+9%7D") == [keyed]
    assert listed("status=dead") == [] and listed("older_than=1d") == []
    assert len(listed("newer_than=1h")) == 50
    first = client.get("/jobs?kind=noop").text
    assert listed("kind=noop") == made[:-51:-1]
    next_link = re.search(r'<a href="\?([^"]+)" rel="next">', first)
    assert next_link is not None
    second = listed(next_link.group(1).replace("&amp;", "&"))
    assert second == made[9::-1]
    assert 'rel="prev">Newer jobs</a>' not in first
    back = re.search(
        r'<a href="\?([^"]+)" rel="prev">Newer jobs</a>',
        client.get("/jobs?" + next_link.group(1).replace("&amp;", "&")).text,
    )
    assert back is not None and back.group(1).replace("&amp;", "&") == f"kind=noop&above={made[9]}"
    assert listed(back.group(1).replace("&amp;", "&")) == made[:-51:-1]
    newest = client.get("/jobs?" + back.group(1).replace("&amp;", "&")).text
    assert "Newer jobs" not in newest  # nothing above the newest page
    assert f'href="?kind=noop&amp;after={made[10]}" rel="next">Older jobs' in newest
    assert listed(f"kind=noop&above={made[40]}") == made[:40:-1]
    assert 'rel="prev">Newer jobs' not in client.get(f"/jobs?kind=noop&above={made[40]}").text


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("status=bogus", "Status (status): unknown status &#39;bogus&#39;"),
        ("min_id=9&max_id=3", "Id from (min_id) 9 is above Id to (max_id) 3: no job is in that"),
        ("min_id=abc", "Id from (min_id) must be a whole number from 0 to"),
        ("max_id=99999999999999999999", "Id to (max_id) must be a whole number from 0 to"),
        ("older_than=soon", "Older than (older_than): invalid duration"),
        ("older_than=99999999999w", "Older than (older_than): invalid duration"),
        ("newer_than=100000w", "Newer than (newer_than): at most 5200w (about 100 years)"),
        ("payload=%5B1%5D", "Payload contains (payload) must be a JSON object"),
        ("payload=%7Bnope", "Payload contains (payload) is not JSON"),
        ("payload=%7B%22a%22%3A1e999%7D", "Payload contains (payload) is not JSON"),
        ("payload=%7B%22a%22%3ANaN%7D", "Payload contains (payload) is not JSON"),
        ("payload=%7B%22a%22%3A%22%5Cu0000%22%7D", "must not contain a NUL character"),
        ("kind=a%00b", "Kind (kind) must not contain a NUL character"),
        ("key=%00", "Key (key) must not contain a NUL character"),
        ("after=-5", "The page link&#39;s after must be a whole number from 0 to"),
    ],
)
def test_jobs_page_says_which_filter_is_wrong(
    make_client: MakeClient, query: str, error: str
) -> None:
    page = make_client().get(f"/jobs?{query}")
    assert page.status_code == 400
    assert error in page.text


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/jobs/abc", 400, "A job id must be a whole number from 1 to 9223372036854775807"),
        ("/jobs/-3", 400, "A job id must be a whole number from 1 to"),
        ("/jobs/99999999999999999999", 400, "A job id must be a whole number from 1 to"),
        ("/jobs/424242", 404, "no job with id 424242"),
        ("/jobs/go?id=x1", 400, "A job id must be a whole number from 1 to"),
        ("/jobs/go?id=", 400, "Give a job id to open."),
        ("/audit?before=99999999999999999999", 400, "The page link&#39;s before must be"),
        ("/nope", 404, "No page at /nope"),
        ("/queues/pause", 405, "/queues/pause does not answer a GET"),
    ],
)
def test_a_bad_address_gets_the_dashboards_own_error_page_saying_what_is_wrong(
    make_client: MakeClient, path: str, status: int, message: str
) -> None:
    page = make_client().get(path)
    assert page.status_code == status
    assert message in page.text
    assert page.headers["content-type"].startswith("text/html")
    assert 'href="/static/dashboard.css"' in page.text and 'aria-label="Dashboard"' in page.text
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


def test_a_bad_job_id_in_an_action_is_refused_on_the_error_page(make_client: MakeClient) -> None:
    client = make_client()
    client.get("/")
    refused = client.post("/jobs/abc/retry")
    assert refused.status_code == 400 and "A job id must be a whole number" in refused.text


def test_error_messages_speak_of_the_page_not_of_python_names(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    client = make_client()
    client.get("/queues")
    pages = [
        client.post("/queues/limit", {"scope": "queue", "name": "mail"}),
        client.post("/queues/limit", {"scope": "queue", "name": "mail", "concurrency": "x"}),
        client.get("/jobs?after=-1"),
        client.get("/jobs?min_id=-1"),
        client.get("/audit?before=-1"),
        client.get("/jobs/0"),
    ]
    assert "Give a concurrency, a rate or both before pressing Set limit" in pages[0].text
    for page in pages:
        assert page.status_code == 400, page.text
        text = page.text.split('role="alert">', 1)[1].split("<", 1)[0]
        for python in ("set_limit", "after_id", "before_id", "min_id must", "ops."):
            assert python not in text, text


def test_jobs_page_says_which_query_parameters_it_does_not_know(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    dead_job(engine)
    client = make_client()
    typo = client.get("/jobs?staus=dead&kind=fail")
    assert typo.status_code == 200
    assert (
        "Unknown filter staus, ignored: the jobs below are not filtered by it. The filters "
        "are status, kind, queue, key, min_id, max_id, older_than, newer_than, payload, tag, "
        "meta, expired, workflow."
    ) in typo.text
    assert "Unknown filters colour, size, ignored" in client.get("/dead?colour=1&size=2").text
    for known in ("/jobs?status=dead&after=99", "/dead?status=dead&kind=fail"):
        assert "Unknown filter" not in client.get(known).text, known


def test_jobs_pages_say_which_repeated_or_inapplicable_parameters_they_ignore(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    dead_job(engine)
    client = make_client()
    twice = html.unescape(client.get("/jobs?status=dead&status=done").text)
    assert (
        "status is given 2 times: only the last, 'done', applies (one value per filter)."
    ) in twice
    other = html.unescape(client.get("/dead?status=done").text)
    assert (
        "status=done does not apply here: this page lists dead jobs only (the Jobs page "
        "filters by any status)."
    ) in other
    for fine in ("/jobs?status=dead", "/dead?status=dead&kind=fail", "/dead"):
        assert "does not apply" not in client.get(fine).text, fine
        assert "times: only the last" not in client.get(fine).text, fine


def test_overview_says_the_table_size_is_not_estimated_before_analyze(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    client = make_client()
    before = client.get("/").text
    assert "Table: row count not estimated yet (the planner counts at the first ANALYZE)" in before
    assert "about 0 rows" not in before
    for _ in range(3):
        dead_job(engine)
    sql(engine, "ANALYZE jobs")
    assert "Table: about 3 rows (planner estimate)" in client.get("/").text


def test_job_page_shows_an_archived_job_read_only_and_404s_a_missing_one(
    engine: sa.Engine, make_client: MakeClient, session: Session
) -> None:
    dead = dead_job(engine)
    sql(engine, "UPDATE jobs SET finished_at = now() - interval '2 days' WHERE id = :i", i=dead)
    assert (
        ops.archive(
            session,
            older_than=ops.parse_duration("1d"),
            include_dead_after=ops.parse_duration("1d"),
        )
        == 1
    )
    client = make_client()
    page = client.get(f"/jobs/{dead}")
    assert page.status_code == 200 and "read-only" in page.text
    assert forms(page.text) == []
    missing = client.get("/jobs/999999")
    assert missing.status_code == 404 and "no job with id 999999" in missing.text
    assert client.get("/jobs/go?id=999999").headers["location"] == "/jobs/999999"


# --- actions -----------------------------------------------------------------------------


def test_retry_cancel_and_delete_act_through_ops_and_are_audited(
    engine: sa.Engine, session: Session, make_client: MakeClient
) -> None:
    dead = dead_job(engine)
    queued = new_job(session, "noop", {})
    session.commit()
    client = make_client(auth=lambda request: Decision("allow", user="alice"))
    client.get("/")
    response = client.post(f"/jobs/{dead}/retry")
    assert response.status_code == 303
    assert landing(response) == f"/jobs/{dead}"
    assert status_of(engine, dead) == "queued"
    assert said(client, response) == "1 job(s) put back in the queue."
    assert client.post(f"/jobs/{queued}/cancel").status_code == 303
    assert status_of(engine, queued) == "cancelled"
    deleted = client.post(f"/jobs/{queued}/delete")
    assert landing(deleted) == "/jobs" and said(client, deleted) == "1 job(s) deleted."
    assert status_of(engine, queued) is None
    assert audit(engine) == [
        ("alice", "retry", "job", str(dead)),
        ("alice", "cancel", "job", str(queued)),
        ("alice", "delete", "job", str(queued)),
    ]
    page = client.get(f"/jobs/{dead}").text
    assert "Actions on this job" in page and "alice" in page and "retry" in page


def test_cancel_of_a_running_job_asks_its_worker_to_stop(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    running = int(
        sql(
            engine,
            "INSERT INTO jobs (kind, payload, status, attempts, worker, locked_until) VALUES "
            "('noop', '{}', 'running', 1, 'w-1', now() + interval '1 minute') RETURNING id",
        )
    )
    client = make_client()
    client.get("/")
    response = client.post(f"/jobs/{running}/cancel")
    assert landing(response) == f"/jobs/{running}"
    assert said(client, response) == (
        "1 running job(s) asked to stop; the worker ends them cancelled."
    )
    assert scalar(
        engine, "SELECT cancel_requested_at IS NOT NULL FROM jobs WHERE id = :i", i=running
    )
    page = client.get(f"/jobs/{running}").text
    assert "cancel requested" in page and "Stop and cancel" not in page


def test_pause_resume_and_limits_of_queues_and_kinds(
    engine: sa.Engine, session: Session, make_client: MakeClient
) -> None:
    client = make_client(auth=lambda request: Decision("allow", user="ops@example"))
    client.get("/queues")
    assert client.post("/queues/pause", {"scope": "queue", "name": "mail"}).status_code == 303
    paused = client.post("/queues/pause", {"scope": "kind", "name": "effect"})
    assert paused.status_code == 303
    state = ops.stats(session)
    assert state.paused_queues == ("mail",) and state.paused_kinds == ("effect",)
    page = client.get(paused.headers["location"]).text
    assert flash(page) == "Paused kind effect: no worker starts its jobs until it is resumed."
    assert "Resume" in page
    resumed = client.post("/queues/resume", {"scope": "queue", "name": "mail"})
    assert said(client, resumed) == "Resumed queue mail."
    code, n, made, _, signature = resumed.headers["location"].partition("done=")[2].split(".")
    forged = f"{code}.{n}.{made}.{base64.urlsafe_b64encode(b'queue evil').decode()}.{signature}"
    assert flash(client.get(f"/queues?done={forged}").text) is None  # the name is signed too
    response = client.post(
        "/queues/limit", {"scope": "kind", "name": "effect", "concurrency": "3", "rate": "10/min"}
    )
    assert landing(response) == "/queues" and said(client, response) == "Limit of kind effect set."
    limits = {c.name: c for c in ops.controls(session)}
    assert limits["effect"].concurrency == 3 and limits["effect"].rate == "10/min"
    assert "10/min" in client.get("/queues").text
    cleared = client.post("/queues/clear", {"scope": "kind", "name": "effect"})
    assert html.unescape(said(client, cleared) or "") == (
        "Operator's limits of kind effect cleared: the code's limits apply."
    )
    session.rollback()
    assert ops.controls(session)[0].concurrency is None
    assert [a[1:] for a in audit(engine)] == [
        ("pause", "queue", "mail"),
        ("pause", "kind", "effect"),
        ("resume", "queue", "mail"),
        ("limit", "kind", "effect"),
        ("clear-limits", "kind", "effect"),
    ]
    bad = client.post("/queues/limit", {"scope": "kind", "name": "effect", "rate": "fast"})
    assert bad.status_code == 400 and "Rate must be a count" in bad.text
    assert client.post("/queues/pause", {"scope": "table", "name": "x"}).status_code == 400


def live_worker(engine: sa.Engine, queues: str = "{default,mail}", kinds: str = "{noop}") -> None:
    sql(
        engine,
        "INSERT INTO jobs_workers (id, host, pid, version, queues, kinds, concurrency, "
        "started_at, heartbeat_at, expires_at) VALUES ('w-1', 'box', 42, '0.1.0', "
        "CAST(:q AS text[]), CAST(:k AS text[]), 4, now(), now(), now() + interval '1 minute')",
        q=queues,
        k=kinds,
    )


def warning(page: str) -> str | None:
    """The note a page adds after an action, if any."""
    found = re.search(r'<p class="warn-box" role="alert">([^<]*)</p>', page)
    return None if found is None else html.unescape(found.group(1))


def test_pausing_or_limiting_a_name_no_live_worker_serves_notes_a_possible_typo(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    live_worker(engine)
    client = make_client()
    client.get("/queues")
    typo = client.post("/queues/pause", {"scope": "queue", "name": "mial"})
    page = client.get(typo.headers["location"]).text
    assert flash(page) == "Paused queue mial: no worker starts its jobs until it is resumed."
    # The sentence of ops.Unserved, the rule the CLI's pause and limit use too.
    assert warning(page) == f"Note: {ops.Unserved('queue', 'mial', 1)}"
    assert warning(page) == (
        "Note: none of the 1 live worker(s) serves queue mial (a typo?); the setting is kept "
        "and applies to its jobs wherever they run"
    )
    again = client.get(
        client.post("/queues/pause", {"scope": "queue", "name": "mial"}).headers["location"]
    )
    assert warning(again.text) is not None  # paused already: still a typo
    limited = client.post("/queues/limit", {"scope": "kind", "name": "nope", "concurrency": "2"})
    assert warning(client.get(limited.headers["location"]).text) == (
        f"Note: {ops.Unserved('kind', 'nope', 1)}"
    )
    for scope, name in (("queue", "mail"), ("kind", "noop")):  # served: no note
        served = client.post("/queues/pause", {"scope": scope, "name": name})
        assert warning(client.get(served.headers["location"]).text) is None
    resumed = client.post("/queues/resume", {"scope": "queue", "name": "mial"})
    assert warning(client.get(resumed.headers["location"]).text) is None  # only pause and limit


def test_an_action_that_changes_nothing_says_so_and_is_not_recorded(
    engine: sa.Engine, session: Session, make_client: MakeClient
) -> None:
    queued = new_job(session, "noop", {})
    session.commit()
    client = make_client(auth=lambda request: Decision("allow", user="olga"))
    client.get("/queues")
    for path, fields, said_ in (
        ("/queues/resume", {"scope": "queue", "name": "mail"}, "queue mail was not paused."),
        ("/queues/clear", {"scope": "kind", "name": "noop"}, "kind noop had no operator's limits."),
    ):
        response = client.post(path, fields)
        assert html.unescape(said(client, response) or "") == (
            f"Nothing changed, so nothing was recorded: {said_}"
        )
    assert audit(engine) == []
    client.post("/queues/pause", {"scope": "queue", "name": "mail"})
    paused = client.post("/queues/pause", {"scope": "queue", "name": "mail"})
    assert said(client, paused) == (
        "Nothing changed, so nothing was recorded: queue mail was paused already."
    )
    limit = {"scope": "kind", "name": "noop", "concurrency": "2", "rate": "10/min"}
    client.post("/queues/limit", limit)
    same = client.post("/queues/limit", {**limit, "rate": "10/60s"})  # the same rate
    assert html.unescape(said(client, same) or "") == (
        "Nothing changed, so nothing was recorded: the limits of kind noop were so already."
    )
    retried = client.post(f"/jobs/{queued}/retry")  # a queued job: nothing to retry
    assert said(client, retried) == (
        f"Job {queued} is queued: only jobs that are dead or cancelled can be retried."
    )
    assert [a[1:] for a in audit(engine)] == [
        ("pause", "queue", "mail"),
        ("limit", "kind", "noop"),
    ]


def test_limit_form_names_every_bad_value_at_once(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    client = make_client()
    client.get("/queues")
    bad = client.post(
        "/queues/limit", {"scope": "queue", "name": "mail", "concurrency": "0", "rate": "fast"}
    )
    assert bad.status_code == 400
    text = html.unescape(bad.text)
    assert "Concurrency must be a whole number from 1 to 1000000, got '0'. Rate must be a " in text
    assert "(like 100/min or 5/10s), got 'fast'" in text
    assert audit(engine) == []


# --- security ----------------------------------------------------------------------------


def test_read_only_viewers_see_no_action_and_cannot_post_one(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    dead = dead_job(engine)
    for client in (
        make_client(auth=lambda request: "read-only"),
        make_client(read_only=True),
    ):
        for path in ("/queues", f"/jobs/{dead}"):
            page = client.get(path)
            assert page.status_code == 200 and forms(page.text) == []
        refused = client.post(f"/jobs/{dead}/retry")
        assert refused.status_code == 403 and "You may not retry" in refused.text
        assert client.post("/queues/pause", {"scope": "queue", "name": "x"}).status_code == 403
    assert status_of(engine, dead) == "dead" and audit(engine) == []


def test_permissions_grant_each_action_on_its_own(
    engine: sa.Engine, session: Session, make_client: MakeClient
) -> None:
    dead = dead_job(engine)
    client = make_client(permissions={"retry"})
    page = client.get(f"/jobs/{dead}").text
    assert forms(page) == [f"/jobs/{dead}/retry"]
    assert client.post(f"/jobs/{dead}/delete").status_code == 403
    assert client.post("/queues/pause", {"scope": "queue", "name": "q"}).status_code == 403
    assert client.post("/queues/limit", {"scope": "queue", "name": "q"}).status_code == 403
    assert client.post(f"/jobs/{dead}/retry").status_code == 303

    async def only_pause(request: Request, action: str) -> bool:
        return action == "pause"

    other = make_client(permissions=only_pause)
    assert set(forms(other.get("/queues").text)) == {"/queues/pause"}
    assert other.post(f"/jobs/{dead}/cancel").status_code == 403
    assert other.post("/queues/pause", {"scope": "queue", "name": "q"}).status_code == 303


def test_a_viewer_without_the_permission_is_told_so_even_without_a_form_token(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    dead = dead_job(engine)
    retry_only = make_client(permissions={"retry"})
    retry_only.get("/")
    # No pause form on their pages, so no token in the request: the refusal says why.
    refused = retry_only.post("/queues/pause", {"scope": "queue", "name": "q"}, csrf=False)
    assert refused.status_code == 403 and "You may not pause here" in refused.text
    missing = retry_only.post(f"/jobs/{dead}/retry", csrf=False)
    assert missing.status_code == 403 and "CSRF token is missing" in missing.text
    assert status_of(engine, dead) == "dead"


def test_the_permissions_hook_reads_the_user_the_auth_hook_named(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    dead = dead_job(engine)

    def staff(request: Request) -> Decision:
        return Decision("allow", user=request.headers.get("x-user", "nobody"))

    def per_user(request: Request, action: str) -> bool:
        return request.state.dashboard_user == "alice" or action == "pause"

    client = make_client(auth=staff, permissions=per_user)
    client.get("/", headers={"x-user": "bob"})
    bob = client.post(f"/jobs/{dead}/retry", headers={"x-user": "bob"})
    assert bob.status_code == 403 and "You may not retry" in bob.text
    alice = client.post(f"/jobs/{dead}/retry", headers={"x-user": "alice"})
    assert alice.status_code == 303 and status_of(engine, dead) == "queued"


def test_auth_hook_may_be_async_and_deny(engine: sa.Engine, make_client: MakeClient) -> None:
    async def by_header(request: Request) -> str:
        return "allow" if request.headers.get("x-staff") == "yes" else "deny"

    client = make_client(auth=by_header)
    denied = client.get("/")
    assert denied.status_code == 403 and "Access denied." in denied.text
    assert "Overview" not in denied.text
    assert client.get("/", headers={"x-staff": "yes"}).status_code == 200
    assert client.post("/queues/pause", {"scope": "queue", "name": "q"}).status_code == 403


def test_actions_need_post_and_the_csrf_token_of_this_browser(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    dead = dead_job(engine)
    client = make_client()
    first = client.get("/")
    cookie = first.headers["set-cookie"]
    assert f"{CSRF_COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert client.get(f"/jobs/{dead}/retry").status_code == 405  # no action through GET
    missing = client.post(f"/jobs/{dead}/retry", csrf=False)
    assert missing.status_code == 403 and "CSRF token is missing" in missing.text
    wrong = client.post(f"/jobs/{dead}/retry", {"csrf": "x" * 43})
    assert wrong.status_code == 403 and "CSRF token is wrong" in wrong.text
    elsewhere = client.post(f"/jobs/{dead}/retry", headers={"origin": "https://evil.example"})
    assert elsewhere.status_code == 403 and "sent from another site" in elsewhere.text
    assert status_of(engine, dead) == "dead"
    same_site = client.post(f"/jobs/{dead}/retry", headers={"origin": "http://testserver"})
    assert same_site.status_code == 303 and status_of(engine, dead) == "queued"
    # The token field is on every action form of the page.
    page = client.get(f"/jobs/{dead}").text
    token = client.csrf_token()
    assert page.count(f'name="csrf" value="{token}"') == len(forms(page)) >= 1


def test_a_link_cannot_make_a_page_claim_an_action_nobody_took(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    dead = dead_job(engine)
    client = make_client()
    assert flash(client.get("/jobs?did=bulk-retry&n=999999").text) is None  # the old form
    taken = client.post(f"/jobs/{dead}/retry")
    signed = taken.headers["location"].partition("done=")[2]
    assert said(client, taken) == "1 job(s) put back in the queue."
    token = client.csrf_token()
    forged = {
        "a count changed": signed.replace("retry.1.", "retry.999999.", 1),
        "another action": signed.replace("retry.", "bulk-delete.", 1),
        "signed with a guessed key": _flash.sign("guess" * 8, "bulk-retry", 999999),
        "signed too long ago": _flash.sign(token, "retry", 5, now=time.time() - 120),
        "not signed": "bulk-retry.999999.1700000000",
    }
    for why, value in forged.items():
        assert flash(client.get(f"/jobs?done={value}").text) is None, why
    other_browser = make_client()
    other_browser.get("/")
    assert flash(other_browser.get(f"/jobs/{dead}?done={signed}").text) is None


def test_a_client_that_leaves_in_the_middle_of_a_post_is_let_go_quietly(
    engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(engine)
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b"csrf=abc&scope=que", "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/queues/pause",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/x-www-form-urlencoded"),
            (b"content-length", b"200"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    asyncio.run(app(scope, receive, send))  # ClientDisconnect escaped the app here
    assert sent[0]["status"] == 400
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert audit(engine) == []


SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'


@pytest.mark.parametrize("attack", [SCRIPT, IMG], ids=["script", "img"])
@pytest.mark.parametrize(
    "field",
    [
        "payload",
        "kind",
        "queue",
        "error",
        "result",
        "worker",
        "attempt_worker",
        "attempt_error",
        "attempt_outcome",
    ],
)
def test_every_database_value_renders_as_text(
    engine: sa.Engine, make_client: MakeClient, field: str, attack: str
) -> None:
    # One earlier attempt in the history (revision 0011), then the job's last one.
    earlier = {
        "attempt": 1,
        "worker": attack if field == "attempt_worker" else "w-1",
        "claimed_at": "2026-12-01T10:00:00+00:00",
        "at": "2026-12-01T10:00:01+00:00",
        "outcome": attack if field == "attempt_outcome" else "failed",
        "then": "queued",
        "error": attack if field == "attempt_error" else "boom",
    }
    values = {
        "kind": attack if field == "kind" else "noop",
        "queue": attack if field == "queue" else "default",
        "payload": json.dumps({"v": attack} if field == "payload" else {}),
        "err": attack if field == "error" else "boom",
        "result": json.dumps({"v": attack} if field == "result" else None),
        "worker": attack if field == "worker" else "w-2",
        "errors": json.dumps([earlier]),
    }
    status = "done" if field == "result" else "dead"
    job_id = int(
        sql(
            engine,
            "INSERT INTO jobs (kind, queue, payload, status, attempts, finished_at, last_error, "
            "result, worker, attempted_at, errors) VALUES (:kind, :queue, "
            f"CAST(:payload AS jsonb), '{status}', 2, now(), :err, CAST(:result AS jsonb), "
            ":worker, now(), CAST(:errors AS jsonb)) RETURNING id",
            **values,
        )
    )
    client = make_client()
    pages = ["/", "/queues", "/jobs", "/dead", f"/jobs/{job_id}"]
    for path in pages:
        html = client.get(path).text
        assert attack not in html, path
        assert "<img" not in html and "alert(1)</script>" not in html, path
    detail = client.get(f"/jobs/{job_id}").text
    escaped = attack.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert escaped.replace('"', "&#34;") in detail or escaped.replace('"', "\\&#34;") in detail


def test_audit_trail_names_render_as_text(engine: sa.Engine, make_client: MakeClient) -> None:
    client = make_client(auth=lambda request: Decision("allow", user=SCRIPT))
    client.get("/")
    client.post("/queues/pause", {"scope": "kind", "name": IMG})
    for path in ("/", "/audit", "/queues"):
        html = client.get(path).text
        assert SCRIPT not in html and "<img" not in html, path
        assert "&lt;script&gt;" in html, path


# --- wiring ------------------------------------------------------------------------------


def test_mounted_under_a_prefix_in_fastapi_every_link_and_action_keeps_it(
    engine: sa.Engine, session: Session
) -> None:
    dead = dead_job(engine)
    app = FastAPI()
    app.mount("/admin/jobs", create_app(engine, registry=app_registry))
    client = Client(app)
    try:
        page = client.get(f"/admin/jobs/jobs/{dead}")
        assert page.status_code == 200
        links = re.findall(r'(?:href|src|action)="([^"#?]+)', page.text)
        assert links and all(
            link.startswith("/admin/jobs/") or link == "/admin/jobs" for link in links
        ), links
        assert "Path=/admin/jobs" in page.headers["set-cookie"]
        assert client.get("/admin/jobs/static/dashboard.css").status_code == 200
        response = client.post(f"/admin/jobs/jobs/{dead}/retry")
        assert landing(response) == f"/admin/jobs/jobs/{dead}"
        assert said(client, response) == "1 job(s) put back in the queue."
        assert status_of(engine, dead) == "queued"
        assert client.get("/admin/jobs/").status_code == 200
    finally:
        client.close()


def test_create_app_refuses_what_it_cannot_use(engine: sa.Engine, db_url: Any) -> None:
    async_engine = create_async_engine(db_url)
    with pytest.raises(TypeError, match="takes a synchronous Engine, got an AsyncEngine"):
        create_app(async_engine)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"unknown dashboard actions \['reboot'\]"):
        create_app(engine, permissions={"retry", "reboot"})
    with pytest.raises(ConfigError, match="not the string"):
        create_app(engine, permissions="retry")
    assert set(ACTIONS) == {"retry", "cancel", "delete", "pause", "limit"}


def broken_permissions(request: Request, action: str) -> bool:
    raise KeyError("role")


async def vague_permissions(request: Request, action: str) -> Any:
    return "yes"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"auth": lambda request: True}, "the dashboard's auth hook returned True: return"),
        ({"auth": lambda request: "admin"}, "the dashboard's auth hook returned 'admin'"),
        (
            {"auth": lambda request: Decision("root")},
            "the dashboard's auth hook failed: ConfigError: auth decision 'root' is not one of",
        ),
        (
            {"permissions": broken_permissions},
            "the dashboard's permissions hook failed: KeyError: 'role'",
        ),
        (
            {"permissions": vague_permissions},
            "the dashboard's permissions hook returned 'yes' for 'retry': return True or False",
        ),
    ],
)
def test_a_failing_auth_or_permissions_hook_refuses_on_the_error_page_and_logs_why(
    engine: sa.Engine,
    make_client: MakeClient,
    caplog: pytest.LogCaptureFixture,
    options: dict[str, Any],
    error: str,
) -> None:
    dead = dead_job(engine)
    client = make_client(**options)
    for path in ("/", "/jobs", f"/jobs/{dead}", "/no-such-page"):
        page = client.get(path)
        assert page.status_code == 500, path
        assert error in html.unescape(page.text) and 'class="error"' in page.text
        assert "Overview</h1>" not in page.text
    refused = client.post(f"/jobs/{dead}/retry", {"csrf": "x" * 43})
    assert refused.status_code == 500 and status_of(engine, dead) == "dead"
    assert client.get("/events?counts=1").status_code == 500
    logged = [r for r in caplog.records if r.name == "sqla_jobs.dashboard"]
    assert logged and error in logged[0].getMessage() and logged[0].exc_info is not None


def test_readme_fastapi_example_mounts_the_dashboard_behind_its_auth_hook(
    engine: sa.Engine, db_url: Any
) -> None:
    section = docpages.section("Dashboard")
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    namespace: dict[str, Any] = {"__name__": "readme_dashboard"}
    os.environ["DATABASE_URL"] = url_text(db_url)
    try:
        exec(compile(code, "<docs example>", "exec"), namespace)
    finally:
        del os.environ["DATABASE_URL"]
    dead = dead_job(engine)
    client = Client(namespace["app"])
    try:
        assert client.get("/admin/jobs/").status_code == 403
        bob = {"x-staff-token": "token-bob"}
        page = client.get(f"/admin/jobs/jobs/{dead}", headers=bob)
        assert page.status_code == 200 and forms(page.text) == []
        assert client.post(f"/admin/jobs/jobs/{dead}/retry", headers=bob).status_code == 403
        alice = {"x-staff-token": "token-alice"}
        page = client.get(f"/admin/jobs/jobs/{dead}", headers=alice)
        assert forms(page.text) == [f"/admin/jobs/jobs/{dead}/retry"]  # no delete button
        assert client.post(f"/admin/jobs/jobs/{dead}/delete", headers=alice).status_code == 403
        assert client.post(f"/admin/jobs/jobs/{dead}/retry", headers=alice).status_code == 303
        assert audit(engine) == [("alice", "retry", "job", str(dead))]
    finally:
        client.close()
        namespace["engine"].dispose()


def test_readme_cookie_auth_hook_lets_in_the_signed_cookie_only(
    engine: sa.Engine, db_url: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    section = docpages.section("Dashboard")
    first, cookie = re.findall(r"```python\n(.*?)```", section, re.S)[:2]
    monkeypatch.setenv("DATABASE_URL", url_text(db_url))
    monkeypatch.setenv("SECRET_KEY", "s3cret")
    namespace: dict[str, Any] = {"__name__": "readme_dashboard"}
    exec(compile(first + cookie, "<docs example>", "exec"), namespace)
    namespace["engine"].dispose()
    import hashlib
    import hmac

    mac = hmac.new(b"s3cret", b"alice", hashlib.sha256).hexdigest()
    client = Client(create_app(engine, auth=namespace["staff_by_cookie"]))
    try:
        assert client.get("/").status_code == 403
        client.http.cookies.set("staff_session", f"alice.{mac}")
        page = client.get("/")
        assert page.status_code == 200 and "alice" in page.text
        client.http.cookies.set("staff_session", f"bob.{mac}")
        assert client.get("/").status_code == 403
    finally:
        client.close()


@pytest.mark.parametrize("value", ["abc", "-1", "0", "1.5", "1000001", "99999999999999"])
def test_limit_form_gives_one_message_with_the_real_range_for_every_bad_concurrency(
    engine: sa.Engine, make_client: MakeClient, value: str
) -> None:
    client = make_client()
    client.get("/queues")
    bad = client.post("/queues/limit", {"scope": "queue", "name": "mail", "concurrency": value})
    assert bad.status_code == 400
    assert f"Concurrency must be a whole number from 1 to 1000000, got {value!r}" in html.unescape(
        bad.text
    )
    assert '<a href="/queues">Back to the queues</a>' in bad.text
    assert audit(engine) == []


@pytest.mark.parametrize("value", ["fast", "0/min", "-1/min", "2000000/s", "5/0s"])
def test_limit_form_gives_one_message_with_the_real_range_for_every_bad_rate(
    engine: sa.Engine, make_client: MakeClient, value: str
) -> None:
    client = make_client()
    client.get("/queues")
    bad = client.post("/queues/limit", {"scope": "queue", "name": "mail", "rate": value})
    assert bad.status_code == 400
    assert (
        "Rate must be a count from 1 to 1000000, '/', an optional number and a unit s, min, h "
        f"or day (like 100/min or 5/10s), got {value!r}" in html.unescape(bad.text)
    )
    assert audit(engine) == []


def test_a_job_without_max_attempts_shows_the_limit_its_worker_will_use_never_none(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = {
        kind: sql(
            engine,
            "INSERT INTO jobs (kind, queue, payload) VALUES (:kind, 'default', '{}') RETURNING id",
            kind=kind,
        )
        for kind in ("fail", "noop", "nobody_serves")
    }
    client = make_client()  # the registry of tests/jobapp.py: fail declares 3
    listed = client.get("/jobs").text
    assert "None" not in listed
    for kind, shown in (("fail", "3"), ("noop", "8"), ("nobody_serves", "handler's")):
        assert f'data-job-attempts="{ids[kind]}">0</span>/{shown}</td>' in html.unescape(listed)
    page = html.unescape(client.get(f"/jobs/{ids['fail']}").text)
    assert "0</span> of 3 (its handler's, set when a worker claims it)" in page
    page = html.unescape(make_client(registry=None).get(f"/jobs/{ids['noop']}").text)
    assert "0</span> of the handler's (else 8), set when a worker claims it" in page


def test_an_action_that_does_nothing_to_a_job_says_why(
    engine: sa.Engine, session: Session, make_client: MakeClient
) -> None:
    queued = new_job(session, "noop", {})
    done = dead_job(engine)
    sql(engine, "UPDATE jobs SET status = 'done' WHERE id = :id", id=done)
    session.commit()
    client = make_client()
    client.get("/")
    retried = client.post(f"/jobs/{queued}/retry")
    assert landing(retried) == f"/jobs/{queued}"
    assert said(client, retried) == (
        f"Job {queued} is queued: only jobs that are dead or cancelled can be retried."
    )
    cancelled = client.post(f"/jobs/{done}/cancel")
    assert said(client, cancelled) == (
        f"Job {done} is done: only jobs that are queued, waiting or running can be cancelled."
    )
    assert client.post(f"/jobs/{queued}/delete").status_code == 303
    again = client.post(f"/jobs/{queued}/delete")
    assert landing(again) == "/jobs"
    assert said(client, again) == (
        f"Job {queued} is not in the jobs table (deleted, archived or never enqueued): "
        "nothing to do."
    )
    assert status_of(engine, done) == "done"
    # Only the action that changed something is in the audit trail.
    assert [a[1:] for a in audit(engine)] == [("delete", "job", str(queued))]


def test_audit_page_filters_by_scope_and_target_and_names_unknown_parameters(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    client = make_client()
    client.get("/")
    client.post("/queues/pause", {"scope": "queue", "name": "mail"})
    client.post("/queues/pause", {"scope": "kind", "name": "effect"})
    everything = client.get("/audit").text
    assert "mail" in everything and "effect" in everything
    mail = client.get("/audit?scope=queue&target=mail").text
    assert "Only the actions on queue <code>mail</code>" in mail and "effect" not in mail
    typo = client.get("/audit?actor=olga").text
    assert (
        "Unknown parameter actor, ignored: the entries below are not filtered by it. The "
        "filters are scope (job, jobs, queue or kind) and target."
    ) in typo
    for path, error in (
        ("/audit?target=mail", "target needs its scope: ?scope=queue&amp;target=mail"),
        ("/audit?scope=table", "unknown scope &#39;table&#39;: use one of job, jobs, queue"),
        ("/audit?scope=job&target=abc", "A job&#39;s target (its id) must be a whole number"),
    ):
        refused = client.get(path)
        assert refused.status_code == 400 and error in refused.text, path


def test_a_schedule_watched_but_never_ticked_says_so_instead_of_a_last_tick(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    # What a worker writes when it first sees a schedule: the moment, not a tick.
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO jobs_periodic (name, kind, expression, last_tick) "
            "VALUES ('ticked', 'ticked', '* * * * * *', '2026-01-02 03:04:05.678+00')"
        )
    page = make_client(registry=periodic_registry).get("/periodic").text
    assert "none enqueued yet (watched since 2026-01-02 03:04:05" in page


@pytest.mark.parametrize(
    ("scope", "said"),
    [
        ("job", "Only the actions on one job each."),
        ("jobs", "Only the actions on sets of jobs (bulk actions, workflows)."),
        ("queue", "Only the actions on queues."),
        ("kind", "Only the actions on kinds."),
    ],
)
def test_audit_page_filters_by_scope_alone(make_client: MakeClient, scope: str, said: str) -> None:
    client = make_client()
    client.get("/")
    client.post("/queues/pause", {"scope": "queue", "name": "mail"})
    page = client.get(f"/audit?scope={scope}")
    assert page.status_code == 200
    assert said in page.text
    assert ("queue mail</td>" in page.text) == (scope == "queue")


def test_an_unexpected_error_gets_the_dashboards_own_error_page_and_is_logged(
    engine: sa.Engine, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    # A column the dashboard reads is gone: not a request's fault, not a schema the ops
    # recognise as unmigrated, so nothing but the catch-all handles it.
    sql(engine, "ALTER TABLE jobs_workers RENAME COLUMN expires_at TO someone")
    with caplog.at_level(logging.ERROR, logger="sqla_jobs.dashboard"):
        page = make_client().get("/workers")
    assert page.status_code == 500
    assert page.headers["content-type"].startswith("text/html")
    assert "The dashboard failed on this page" in page.text
    assert 'aria-label="Dashboard"' in page.text and "Internal Server Error" not in page.text
    assert "dashboard error on GET /workers" in caplog.text and "expires_at" not in page.text


def test_overview_counts_link_to_their_jobs_and_ready_and_scheduled_to_the_queued_ones(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    client = make_client()
    page = client.get("/").text
    cards = dict(
        (count, link)
        for link, count in re.findall(
            r'<a class="card" href="([^"]+)"[^>]*>.*?data-count="(\w+)"', page
        )
    )
    assert cards == {
        "ready": "/jobs?status=queued",
        "scheduled": "/jobs?status=queued",
        "waiting": "/jobs?status=waiting",
        "running": "/jobs?status=running",
        "claimed": "/jobs?status=running",
        "expired": "/jobs?expired=1",
        "dead": "/dead",
    }
    assert "Ready and scheduled both open the queued jobs" in page
    for link in set(cards.values()):
        assert client.get(link).status_code == 200, link


def test_the_expired_leases_card_lists_the_running_jobs_whose_lease_has_expired(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    def running(lease: str) -> int:
        return int(
            sql(
                engine,
                "INSERT INTO jobs (kind, payload, status, attempts, worker, locked_until)"
                f" VALUES ('k', '{{}}', 'running', 1, 'w', now() + interval '{lease}')"
                " RETURNING id",
            )
        )

    lapsed = [running("-1 minute"), running("-1 hour")]
    held = running("5 minutes")
    sql(engine, "INSERT INTO jobs (kind, payload) VALUES ('k', '{}')")
    client = make_client()
    overview = client.get("/").text
    assert re.search(r'href="/jobs\?expired=1"><span class="n" data-count="expired">2<', overview)
    page = client.get("/jobs?expired=1")
    assert page.status_code == 200
    listed = [int(i) for i in re.findall(r'href="/jobs/(\d+)"', page.text)]
    assert sorted(set(listed)) == sorted(lapsed) and held not in listed
    assert 'name="expired" value="1" checked' in page.text
    # The same with status=running, which the filter implies.
    again = client.get("/jobs?expired=1&status=running").text
    assert sorted(set(int(i) for i in re.findall(r'href="/jobs/(\d+)"', again))) == sorted(lapsed)


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("expired=yes", "Lease expired (expired): 1 or nothing, got 'yes'"),
        ("expired=1&status=done", "expired leases are running jobs' (status done has none)"),
    ],
)
def test_the_expired_filter_refuses_what_it_cannot_mean(
    make_client: MakeClient, query: str, error: str
) -> None:
    page = make_client().get(f"/jobs?{query}")
    assert page.status_code == 400
    assert error in html.unescape(page.text) and 'class="error"' in page.text


def test_the_overview_says_why_done_in_the_last_hour_and_oldest_ready_have_no_list(
    make_client: MakeClient,
) -> None:
    page = make_client().get("/").text
    assert "no list: finished time is not a filter (id order)" in page
    assert "no list: ready is not a filter (id order)" in page
    assert '<a href="/jobs?status=done">all done</a>' in page
    assert '<a href="/jobs?status=queued">all queued</a>' in page


@pytest.mark.parametrize("word", ["ready", "scheduled"])
def test_a_status_filter_of_ready_or_scheduled_points_to_queued(
    make_client: MakeClient, word: str
) -> None:
    page = make_client().get(f"/jobs?status={word}")
    assert page.status_code == 400
    assert (
        f"unknown status &#39;{word}&#39;: use one of queued, running, done, dead, cancelled, "
        f"waiting ({word} jobs have status queued: status=queued lists ready and scheduled "
        "jobs together)"
    ) in page.text


def test_the_dead_page_shows_when_each_job_died(engine: sa.Engine, make_client: MakeClient) -> None:
    job_id = dead_job(engine)
    sql(
        engine,
        "UPDATE jobs SET created_at = '2026-03-01 08:00:00+00', "
        "finished_at = '2026-03-02 09:30:15+00' WHERE id = :id",
        id=job_id,
    )
    client = make_client()
    dead = client.get("/dead").text
    header = re.findall(r'<th scope="col">(\w+)</th>', dead)
    assert header[-3:] == ["Created", "Died", "Error"]
    row = re.search(rf'value="{job_id}".*?</tr>', dead, re.S)
    assert row is not None
    cells = re.findall(r"<td>([^<]*)</td>", row.group(0))
    assert "2026-03-02 09:30:15+00:00" in cells and "2026-03-01 08:00:00+00:00" in cells
    assert "Died" not in client.get("/jobs").text


def test_a_denied_viewer_is_offered_no_link_it_could_not_follow(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    denied = make_client(auth=lambda request: "deny")
    for path in ("/", "/jobs", "/nope"):
        page = denied.get(path)
        assert page.status_code == 403 and "Access denied." in page.text, path
        assert "<a " not in page.text.split("<main", 1)[1], path
        assert "Back to the overview" not in page.text, path
    # A viewer let in but refused one action still gets the way back.
    client = make_client(permissions=set())
    client.get("/")
    refused = client.post("/queues/pause", {"scope": "queue", "name": "q"})
    assert refused.status_code == 403 and "Back to the overview" in refused.text
