"""Bulk actions on the dashboard's jobs page over HTTP, against real PostgreSQL: each of
retry, cancel and delete, on ticked jobs or on every job matching the filter, is first
reviewed (a page with the count, acting on nothing) and then confirmed; each is audited;
permissions, read-only and CSRF are enforced at both steps."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from dashboard_client import Client, forms, landing, said
from helpers import rows
from sqlalchemy.orm import Session

from sqla_jobs import enqueue
from sqla_jobs.dashboard import create_app

MakeClient = Callable[..., Client]


@pytest.fixture
def make_client(engine: sa.Engine) -> Iterator[MakeClient]:
    made: list[Client] = []

    def make(**options: Any) -> Client:
        client = Client(create_app(engine, **options))
        client.get("/")  # the CSRF cookie
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def job(engine: sa.Engine, status: str = "dead", kind: str = "mail", queue: str = "default") -> int:
    with engine.begin() as conn:
        return int(
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (kind, queue, payload, status, attempts, finished_at) "
                    "VALUES (:kind, :queue, '{}', CAST(:status AS job_status), "
                    "CASE WHEN :status = 'queued' THEN 0 ELSE 1 END, "
                    "CASE WHEN :status IN ('dead', 'done', 'cancelled') THEN now() END) "
                    "RETURNING id"
                ),
                {"kind": kind, "queue": queue, "status": status},
            ).scalar_one()
        )


def statuses(engine: sa.Engine, *ids: int) -> list[str | None]:
    found = dict(
        rows(engine, "SELECT id, status::text FROM jobs WHERE id = ANY(:ids)", ids=list(ids))
    )
    return [found.get(i) for i in ids]


def hidden_fields(page: str) -> dict[str, str]:
    """The hidden fields of the confirmation form, as the browser would post them."""
    form = page.split('action="/jobs/bulk/apply"', 1)[1].split("</form>", 1)[0]
    return {
        html.unescape(name): html.unescape(value)
        for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form)
    }


def audit(engine: sa.Engine) -> list[tuple[Any, ...]]:
    return [
        (actor, action, scope, target, detail)
        for actor, action, scope, target, detail in rows(
            engine, "SELECT actor, action, scope, target, detail FROM jobs_audit ORDER BY id"
        )
    ]


def test_bulk_retry_of_ticked_jobs_shows_the_count_then_retries_and_is_audited(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    a, b, queued, untouched = job(engine), job(engine), job(engine, "queued"), job(engine)
    client = make_client()
    review = client.post("/jobs/bulk", {"op": "retry", "scope": "selected", "id": [a, b, queued]})
    assert review.status_code == 200
    assert "<h1>Retry 2 job(s)?</h1>" in review.text
    assert statuses(engine, a, b) == ["dead", "dead"]  # reviewing acts on nothing
    assert audit(engine) == []

    done = client.post("/jobs/bulk/apply", hidden_fields(review.text))

    assert (done.status_code, landing(done)) == (303, "/jobs")
    assert statuses(engine, a, b, queued, untouched) == ["queued", "queued", "queued", "dead"]
    ((actor, action, scope, target, detail),) = audit(engine)
    assert (actor, action, scope, target) == ("anonymous@127.0.0.1", "retry", "jobs", "3 selected")
    assert detail == {"scope": "selected", "ids": [a, b], "done": 2}
    assert said(client, done) == "2 job(s) put back in the queue."


def test_bulk_cancel_of_every_matching_job_leaves_jobs_enqueued_after_the_review(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    waiting = [job(engine, "queued", queue="mail") for _ in range(3)]
    running = job(engine, "running", queue="mail")
    elsewhere = job(engine, "queued", queue="other")
    client = make_client()
    review = client.post(
        "/jobs/bulk", {"op": "cancel", "scope": "matching", "filter": "queue=mail"}
    )
    assert "<h1>Cancel 4 job(s)?</h1>" in review.text
    with Session(engine) as session:
        later = enqueue(session, "mail", {}, queue="mail")
        session.commit()
    assert later is not None

    done = client.post("/jobs/bulk/apply", hidden_fields(review.text))

    assert landing(done) == "/jobs?queue=mail"
    assert said(client, done) == "4 job(s) cancelled or asked to stop."
    assert statuses(engine, *waiting, running, elsewhere, later) == [
        "cancelled",
        "cancelled",
        "cancelled",
        "running",  # asked to stop: its worker ends it cancelled
        "queued",
        "queued",  # enqueued after the review: not in what was confirmed
    ]
    ((_, action, scope, target, detail),) = audit(engine)
    assert (action, scope, target) == ("cancel", "jobs", "matching queue=mail")
    assert detail["asked_to_stop"] == 1 and detail["up_to_id"] == running


def test_bulk_delete_from_the_dead_page_deletes_the_filtered_dead_jobs_only(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    gone = [job(engine, kind="a"), job(engine, kind="a")]
    kept = [job(engine, kind="b"), job(engine, "done", kind="a")]
    client = make_client()
    page = client.get("/dead?kind=a").text
    assert 'name="filter" value="status=dead&amp;kind=a"' in page
    review = client.post(
        "/jobs/bulk",
        {"op": "delete", "scope": "matching", "filter": "status=dead&kind=a", "page": "dead"},
    )
    assert "<h1>Delete 2 job(s)?</h1>" in review.text
    back = re.findall(r'<a href="([^"]+)">Back to the list, doing nothing</a>', review.text)
    assert [html.unescape(b) for b in back] == ["/dead?status=dead&kind=a"]
    back_page = client.get(html.unescape(back[0])).text
    assert "does not apply" not in back_page and 'value="a"' in back_page

    done = client.post("/jobs/bulk/apply", hidden_fields(review.text))

    assert landing(done) == "/dead?kind=a" and said(client, done) == "2 job(s) deleted."
    assert statuses(engine, *gone, *kept) == [None, None, "dead", "done"]
    assert [a[1:4] for a in audit(engine)] == [("delete", "jobs", "matching status=dead&kind=a")]


def test_bulk_review_with_nothing_applicable_offers_no_confirmation(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    queued = job(engine, "queued")
    review = make_client().post("/jobs/bulk", {"op": "retry", "scope": "selected", "id": queued})
    assert "<h1>Retry 0 job(s)?</h1>" in review.text
    assert "/jobs/bulk/apply" not in review.text and "nothing to do" in review.text


def test_jobs_page_offers_the_bulk_actions_the_viewer_may_take(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    dead = job(engine)
    page = make_client(permissions={"retry", "delete"}).get("/jobs").text
    assert forms(page) == ["/jobs/bulk"]
    assert f'<input type="checkbox" name="id" value="{dead}"' in page
    ops = page.split('<select name="op">', 1)[1].split("</select>", 1)[0]
    assert re.findall(r'<option value="(\w+)">', ops) == ["retry", "delete"]
    for client in (make_client(read_only=True), make_client(permissions=set())):
        page = client.get("/jobs").text
        assert forms(page) == [] and 'type="checkbox" name="id"' not in page


def offered(page: str) -> list[str]:
    """The bulk actions a jobs page offers, in order."""
    if '<select name="op">' not in page:
        return []
    ops = page.split('<select name="op">', 1)[1].split("</select>", 1)[0]
    return re.findall(r'<option value="(\w+)">', ops)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/dead", ["retry", "delete"]),
        ("/jobs?status=dead", ["retry", "delete"]),
        ("/jobs?status=done", ["delete"]),
        ("/jobs?status=running", ["cancel"]),
        ("/jobs?status=queued", ["cancel", "delete"]),
        ("/jobs?status=waiting", ["cancel", "delete"]),
        ("/jobs?status=cancelled", ["retry", "delete"]),
        ("/jobs", ["retry", "cancel", "delete"]),
    ],
)
def test_a_jobs_page_offers_only_the_bulk_actions_that_can_apply_to_its_jobs(
    engine: sa.Engine, make_client: MakeClient, path: str, expected: list[str]
) -> None:
    for status in ("dead", "done", "running", "queued", "waiting", "cancelled"):
        job(engine, status)
    assert offered(make_client().get(path).text) == expected


def test_the_dead_page_offers_no_bulk_form_to_a_viewer_who_may_only_cancel(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    job(engine)
    page = make_client(permissions={"cancel"}).get("/dead").text
    assert forms(page) == [] and 'type="checkbox"' not in page


def test_bulk_actions_refuse_what_the_viewer_may_not_do_at_both_steps(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    dead = job(engine)
    ask = {"op": "delete", "scope": "selected", "id": dead}
    confirm = {**ask, "ids": str(dead), "upto": str(dead)}
    retry_only = make_client(permissions={"retry"})
    for path, fields in (("/jobs/bulk", ask), ("/jobs/bulk/apply", confirm)):
        refused = retry_only.post(path, fields)
        assert refused.status_code == 403 and "You may not delete here" in refused.text
        refused = make_client(read_only=True).post(path, fields)
        assert refused.status_code == 403 and "You may not delete here" in refused.text
        refused = make_client().post(path, fields, csrf=False)
        assert refused.status_code == 403 and "CSRF token is missing" in refused.text
        wrong = make_client().post(path, {**fields, "csrf": "x" * 43})
        assert wrong.status_code == 403 and "CSRF token is wrong" in wrong.text
    assert make_client().get("/jobs/bulk").status_code == 405  # no action through GET
    assert statuses(engine, dead) == ["dead"] and audit(engine) == []


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"op": "reboot", "scope": "selected", "id": "1"}, "bulk action must be one of retry"),
        ({"op": "retry", "scope": "selected"}, "no job selected: tick the jobs"),
        ({"op": "retry", "scope": "some"}, "scope must be selected or matching, got 'some'"),
        ({"op": "retry", "scope": "matching", "filter": "min_id=x"}, "Id from (min_id) must be"),
    ],
)
def test_bulk_review_refuses_a_bad_form_with_a_clear_error(
    make_client: MakeClient, fields: dict[str, str], error: str
) -> None:
    refused = make_client().post("/jobs/bulk", fields)
    assert refused.status_code == 400 and error in html.unescape(refused.text)


def test_bulk_apply_without_a_review_is_refused(engine: sa.Engine, make_client: MakeClient) -> None:
    dead = job(engine)
    refused = make_client().post(
        "/jobs/bulk/apply", {"op": "retry", "scope": "matching", "filter": ""}
    )
    assert refused.status_code == 400 and "review the bulk action first" in refused.text
    assert statuses(engine, dead) == ["dead"]


def test_bulk_action_without_a_filter_says_it_is_every_job_and_needs_a_second_tick(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    waiting = [job(engine, "queued", queue="mail"), job(engine, "queued", queue="other")]
    client = make_client()
    page = client.get("/jobs?staus=dead").text  # a typo: ignored, so no filter applies
    assert 'name="filter" value=""' in page
    review = client.post("/jobs/bulk", {"op": "cancel", "scope": "matching", "filter": ""})
    text = html.unescape(review.text)
    assert '<p class="count"><strong>2 job(s)</strong> to cancel.</p>' in text
    assert (
        "Every job in the table (no filter) that is queued, waiting or running, up to job "
        f"{waiting[1]}." in text
    )
    assert 'name="everything" value="yes" required' in text

    refused = client.post("/jobs/bulk/apply", hidden_fields(review.text))
    assert refused.status_code == 400
    assert (
        'this acts on every job in the table (no filter): tick "Yes, every job in the table" '
        "on the confirmation page to do it" in html.unescape(refused.text)
    )
    assert statuses(engine, *waiting) == ["queued", "queued"]

    done = client.post("/jobs/bulk/apply", {**hidden_fields(review.text), "everything": "yes"})
    assert said(client, done) == "2 job(s) cancelled or asked to stop."
    assert statuses(engine, *waiting) == ["cancelled", "cancelled"]


def test_bulk_review_says_delete_applies_to_any_state_but_running(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    job(engine, kind="a")
    review = make_client().post(
        "/jobs/bulk", {"op": "delete", "scope": "matching", "filter": "kind=a"}
    )
    assert "that is queued, waiting, done, dead or cancelled, up to job" in review.text


@pytest.mark.parametrize(
    ("fields", "back"),
    [
        ({"op": "retry", "scope": "selected", "filter": "kind=a"}, "/jobs?kind=a"),
        ({"op": "retry", "scope": "selected", "filter": "status=dead", "page": "dead"}, "/dead"),
    ],
)
def test_a_refused_bulk_form_links_back_to_the_list_it_came_from(
    make_client: MakeClient, fields: dict[str, str], back: str
) -> None:
    refused = make_client().post("/jobs/bulk", fields)
    assert refused.status_code == 400 and "no job selected" in refused.text
    assert f'<a href="{back}">Back to the list</a>' in refused.text


def test_a_bulk_action_that_finds_nothing_left_to_do_says_so_and_records_nothing(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    a = job(engine)
    client = make_client()
    review = client.post("/jobs/bulk", {"op": "retry", "scope": "selected", "id": [a]})
    assert "<h1>Retry 1 job(s)?</h1>" in review.text
    with engine.begin() as conn:  # someone else retried it between review and confirm
        conn.execute(sa.text("UPDATE jobs SET status = 'queued' WHERE id = :i"), {"i": a})
    done = client.post("/jobs/bulk/apply", hidden_fields(review.text))
    assert (done.status_code, landing(done)) == (303, "/jobs")
    assert said(client, done) == (
        "Nothing changed, so nothing was recorded: no job was in a state the action applies to."
    )
    assert audit(engine) == []
