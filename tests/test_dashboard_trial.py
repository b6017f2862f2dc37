"""Findings of a new user's trial of the dashboard (#22), each proved over HTTP against
real PostgreSQL (and, where the CLI or ops share the rule, there too): what each job
action applies to, filters that can never match, the timeout a handler declares,
periodic times, multipart forms and the workflow page's live updates."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from typing import Any

import flowapp
import pytest
import sqlalchemy as sa
import trialapp
from dashboard_client import Client, forms, said
from flowapp import registry
from helpers import rows
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from test_ops_cli import cli

from sqla_jobs import enqueue, ops
from sqla_jobs.dashboard import create_app
from sqla_jobs.workflows import Workflow, WorkflowIds

MakeClient = Callable[..., Client]


@pytest.fixture
def make_client(engine: sa.Engine) -> Iterator[MakeClient]:
    flowapp.setup(engine)
    made: list[Client] = []

    def make(**options: Any) -> Client:
        client = Client(create_app(engine, **{"registry": registry, **options}))
        made.append(client)
        client.get("/")  # the CSRF cookie
        return client

    yield make
    for client in made:
        client.close()


def fan_in(engine: sa.Engine) -> WorkflowIds:
    flow = Workflow(registry=registry)
    flow.add("fetch", "flow.step", {"value": 1})
    flow.add("left", "flow.step", {"value": 2}, after="fetch")
    flow.add("right", "flow.step", {"value": 3}, after="fetch")
    flow.add("zip", "flow.sum", after=["left", "right"])
    with Session(engine) as s:
        ids = flow.enqueue(s)
        s.commit()
    return ids


def statuses(engine: sa.Engine, ids: WorkflowIds) -> dict[str, str]:
    found = rows(engine, "SELECT step, status::text FROM jobs WHERE workflow_id = :w", w=ids.id)
    return {str(step): str(status) for step, status in found}


# --- 1. what each action applies to: a waiting step -------------------------------


def test_a_waiting_step_can_be_cancelled_from_its_page_and_its_dependents_follow(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    client = make_client()
    page = client.get(f"/jobs/{ids['left']}").text
    assert f"/jobs/{ids['left']}/cancel" in forms(page)
    assert f"/jobs/{ids['left']}/delete" in forms(page)
    done = client.post(f"/jobs/{ids['left']}/cancel")
    assert said(client, done) == "1 job(s) cancelled."
    # zip needs left to succeed: the workflow rules cancel it in the same transaction.
    assert statuses(engine, ids) == {
        "fetch": "queued",
        "left": "cancelled",
        "right": "waiting",
        "zip": "cancelled",
    }
    shown = client.get(f"/jobs/{ids['left']}").text
    assert "cancelled by an operator while it was waiting" in shown


def test_a_waiting_step_can_be_deleted_and_the_list_offers_both_actions_for_waiting(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    client = make_client()
    listed = client.get("/jobs?status=waiting").text
    assert 'value="cancel"' in listed and 'value="delete"' in listed
    assert 'value="retry"' not in listed
    review = client.post(
        "/jobs/bulk",
        {"op": "delete", "scope": "selected", "ids": f"{ids['right']}", "page": "jobs"},
    )
    assert "<strong>1 job(s)</strong> to delete." in review.text
    done = client.post(f"/jobs/{ids['left']}/delete")
    assert said(client, done) == "1 job(s) deleted."
    assert statuses(engine, ids)["zip"] == "cancelled"


def test_refusals_name_the_states_each_action_applies_to_in_ops_cli_and_dashboard(
    engine: sa.Engine, db_url: URL, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET status = 'running' WHERE id = :i"), {"i": ids["fetch"]}
        )
    client = make_client()
    refused = client.post(f"/jobs/{ids['fetch']}/delete")
    assert said(client, refused) == (
        f"Job {ids['fetch']} is running: only jobs that are queued, waiting, done, dead or "
        "cancelled can be deleted."
    )
    retry = client.post(f"/jobs/{ids['left']}/retry")
    assert said(client, retry) == (
        f"Job {ids['left']} is waiting: only jobs that are dead or cancelled can be retried."
    )
    deleted = cli(db_url, "delete", str(ids["fetch"]))
    assert deleted.returncode != 0
    assert (
        f"job {ids['fetch']} is running; only queued, waiting, done, dead or cancelled jobs "
        "can be deleted"
    ) in deleted.stderr
    waiting = cli(db_url, "delete", "--dry-run", str(ids["right"]))
    assert waiting.returncode == 0 and "would delete 1 job(s)" in waiting.stdout, waiting.stderr
    cancelled = cli(db_url, "cancel", str(ids["left"]), "--wait", "0")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled 1 job(s)" in cancelled.stdout
    with Session(engine) as s:
        assert ops.applies_text("cancel") == "queued, waiting or running"
        assert ops.delete_jobs(s, [ids["right"]]) == 1


# --- 2. JSON nested too deeply --------------------------------------------------------


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


#: JSON text nested 2,000 deep: the decoder recurses once per level.
DEEP_TEXT = '{"a":' * 2_000 + "{}" + "}" * 2_000


@pytest.mark.parametrize("name", ["payload", "meta"])
def test_a_json_filter_nested_too_deeply_is_a_400_naming_it(
    make_client: MakeClient, name: str
) -> None:
    page = make_client().get("/jobs", params={name: DEEP_TEXT})
    assert page.status_code == 400
    assert "is nested too deeply to decode" in page.text
    label = "Payload contains" if name == "payload" else "Meta contains"
    assert label in page.text


def test_json_nested_too_deeply_is_refused_by_the_cli_ops_and_enqueue(
    engine: sa.Engine, db_url: URL
) -> None:
    from sqla_jobs import InvalidJobError
    from sqla_jobs.exceptions import ConfigError

    listed = cli(db_url, "list", "--payload", DEEP_TEXT)
    assert listed.returncode != 0 and "--payload is nested too deeply" in listed.stderr
    with Session(engine) as s:
        for name in ("payload", "meta"):
            with pytest.raises(ConfigError, match=f"{name} is nested too deeply"):
                ops.list_jobs(s, **{name: nested(100_000)})  # type: ignore[arg-type]
        with pytest.raises(InvalidJobError, match="payload is not JSON-serializable"):
            enqueue(s, "flow.step", nested(100_000))
        with pytest.raises(InvalidJobError, match="meta is not JSON-serializable"):
            enqueue(s, "flow.step", {}, meta=nested(100_000))


# --- 4. filters that can never match ---------------------------------------------------


@pytest.mark.parametrize(
    ("query", "refusal"),
    [
        ({"tag": "a,b"}, "Tag (tag) can match no job: a tag must not contain a comma"),
        ({"tag": "t" * 500}, "Tag (tag) can match no job: each tag must be at most 100"),
        ({"queue": "bad queue"}, "Queue (queue) can match no job: queue must match"),
        ({"kind": "k" * 300}, "Kind (kind) can match no job: kind is longer than 255"),
    ],
    ids=["tag-comma", "tag-long", "queue-space", "kind-long"],
)
def test_a_filter_no_job_can_match_is_a_400_naming_it_and_the_rule(
    make_client: MakeClient, query: dict[str, str], refusal: str
) -> None:
    page = make_client().get("/jobs", params=query)
    assert page.status_code == 400
    assert refusal in html.unescape(page.text)


def test_the_cli_list_refuses_a_filter_no_job_can_match(db_url: URL) -> None:
    for args, refusal in (
        (("--tag", "a,b"), "--tag can match no job: a tag must not contain a comma"),
        (("--queue", "bad queue"), "--queue can match no job: queue must match"),
        (("--kind", "k" * 300), "--kind can match no job: kind is longer than 255"),
    ):
        result = cli(db_url, "list", *args)
        assert result.returncode != 0 and refusal in result.stderr, result.stderr


# --- 3. the timeout a handler declares --------------------------------------------------


def timeout_shown(page: str) -> str:
    found = re.search(r"<dt>Timeout</dt><dd>([^<]*)</dd>", page)
    assert found is not None
    return html.unescape(found.group(1))


def test_a_jobs_timeout_falls_back_to_its_handlers_on_the_page_and_in_show(
    engine: sa.Engine, db_url: URL, make_client: MakeClient
) -> None:
    with Session(engine) as s:
        slow = enqueue(s, "trial.slow", {})
        open_ended = enqueue(s, "trial.open", {})
        own = enqueue(s, "trial.slow", {}, timeout=5)
        s.commit()
    known = make_client(registry=trialapp.registry)
    assert timeout_shown(known.get(f"/jobs/{slow}").text) == "120 s (its handler's)"
    assert timeout_shown(known.get(f"/jobs/{open_ended}").text) == "none (its handler's)"
    assert timeout_shown(known.get(f"/jobs/{own}").text) == "5 s"
    unknown = make_client(registry=None)
    assert timeout_shown(unknown.get(f"/jobs/{slow}").text) == (
        "its handler's (unknown without the app's registry)"
    )
    shown = cli(db_url, "show", str(slow), "--app", "trialapp:registry")
    assert shown.returncode == 0, shown.stderr
    assert "timeout:         120 s (its handler's)\n" in shown.stdout
    bare = cli(db_url, "show", str(slow))
    assert "timeout:         its handler's (unknown without the app's registry)\n" in bare.stdout


# --- 6. multipart forms -----------------------------------------------------------------


def test_a_multipart_form_is_refused_saying_forms_are_sent_urlencoded(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    client = make_client()
    sent = client.loop.run_until_complete(
        client.http.post(
            f"/jobs/{ids['fetch']}/cancel",
            data={"csrf": client.csrf_token()},
            files={"note": ("note.txt", b"x")},
        )
    )
    assert sent.status_code == 400
    text = html.unescape(sent.text)
    assert "forms must be sent urlencoded (application/x-www-form-urlencoded" in text
    assert "not multipart/form-data" in text and "CSRF" not in text
    assert statuses(engine, ids)["fetch"] == "queued"
    # The same form urlencoded, as the page sends it, acts.
    assert said(client, client.post(f"/jobs/{ids['fetch']}/cancel")) == "1 job(s) cancelled."


# --- 5. periodic times in the schedule's zone ------------------------------------------


def test_a_schedules_next_and_last_tick_are_shown_in_its_own_zone(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO jobs_periodic (name, kind, expression, last_tick, last_job_id) "
            "VALUES ('trial.nightly', 'trial.nightly', '0 2 * * *', "
            "'2026-01-01 20:30:00+00', 1)"
        )
    page = make_client(registry=trialapp.registry).get("/periodic").text
    row = re.search(r"<th scope=\"row\">trial.nightly</th>(.*?)</tr>", page, re.S)
    assert row is not None
    cells = re.findall(r"<td>(.*?)</td>", row.group(1), re.S)
    next_tick, last_tick = cells[4], cells[5]
    # 20:30 UTC is 02:00 in Kolkata: the last tick on the schedule's clock, as the next.
    assert last_tick == "2026-01-02 02:00:00+05:30"
    assert next_tick.endswith(" 02:00:00+05:30"), next_tick


# --- 7. the workflow page's live parts --------------------------------------------------


def test_a_cancelled_step_waits_on_nothing_and_the_page_carries_what_the_script_updates(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    import json

    ids = fan_in(engine)
    with engine.begin() as conn:  # fetch runs: the cancel asks it to stop
        conn.execute(
            sa.text("UPDATE jobs SET status = 'running' WHERE id = :i"), {"i": ids["fetch"]}
        )
    client = make_client()
    before = client.get(f"/workflows/{ids.id}").text
    waits = re.search(rf'<tr id="step-{ids["left"]}"[^>]*>.*?data-waits=\'([^\']*)\'', before, re.S)
    assert waits is not None and json.loads(html.unescape(waits.group(1))) == [
        ["fetch", ids["fetch"]]
    ]
    client.post(f"/workflows/{ids.id}/cancel")
    page = client.get(f"/workflows/{ids.id}").text
    counts = re.search(r"data-flow-counts='([^']*)'", page)
    assert counts is not None
    assert json.loads(html.unescape(counts.group(1))) == {"cancelled": 3, "running": 1}
    assert f'data-step="{ids["left"]}" data-drawn="cancelled"' in page
    cells = re.findall(r'<td data-label="Waits on"[^>]*>(.*?)</td>', page, re.S)
    # Every cancelled step waits on nothing, though fetch still runs.
    assert cells.count("-") == 4, cells
