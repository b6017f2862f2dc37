"""The dashboard's workflow page over HTTP (#26), against real PostgreSQL: the steps, their
dependencies and what each waits on, the link from a step's job page, and the cancel and
retry actions behind the permissions, CSRF and the audit trail."""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import flowapp
import pytest
import sqlalchemy as sa
from dashboard_client import Client, forms, landing, said
from flowapp import registry
from helpers import rows
from sqlalchemy.orm import Session

from sqla_jobs import ops
from sqla_jobs.dashboard import Decision, create_app
from sqla_jobs.workflows import Workflow, WorkflowIds

MakeClient = Callable[..., Client]


@pytest.fixture
def make_client(engine: sa.Engine) -> Iterator[MakeClient]:
    flowapp.setup(engine)
    made: list[Client] = []

    def make(**options: Any) -> Client:
        client = Client(create_app(engine, registry=registry, **options))
        made.append(client)
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


def step_rows(page: str) -> dict[str, dict[str, str]]:
    """Each step row of the page: its cells' text by their data-label."""
    found: dict[str, dict[str, str]] = {}
    for row in re.findall(r'<tr id="step-\d+"[^>]*>(.*?)</tr>', page, re.S):
        cells = {
            label: html.unescape(re.sub(r"<[^>]+>", "", text)).strip()
            for label, text in re.findall(r'data-label="([^"]+)"[^>]*>(.*?)</t[dh]>', row, re.S)
        }
        found[cells["Step"]] = cells
    return found


def statuses(engine: sa.Engine, ids: WorkflowIds) -> dict[str, str]:
    found = rows(engine, "SELECT step, status::text FROM jobs WHERE workflow_id = :w", w=ids.id)
    return {str(step): str(status) for step, status in found}


def test_workflow_page_shows_each_step_its_dependencies_and_what_it_waits_on(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    client = make_client()
    page = client.get(f"/workflows/{ids.id}")
    assert page.status_code == 200
    steps = step_rows(page.text)
    assert {name: (s["Stage"], s["State"]) for name, s in steps.items()} == {
        "fetch": ("1", "queued"),
        "left": ("2", "waiting"),
        "right": ("2", "waiting"),
        "zip": ("3", "waiting"),
    }
    assert steps["zip"]["Depends on"] == "left, right"
    assert steps["zip"]["Waits on"] == "left, right"
    assert steps["left"]["Waits on"] == "fetch" and steps["fetch"]["Depends on"] == "-"
    # Each step links to its job, and each dependency to the dependency's row.
    assert f'href="/jobs/{ids["zip"]}"' in page.text
    assert f'href="#step-{ids["left"]}"' in page.text
    # The job page of a step links back to its workflow.
    job_page = client.get(f"/jobs/{ids['left']}").text
    assert f'href="/workflows/{ids.id}"' in job_page and "step left of workflow" in job_page


def test_workflow_page_of_an_unknown_or_malformed_id_says_so(make_client: MakeClient) -> None:
    client = make_client()
    missing = client.get(f"/workflows/{uuid.uuid4()}")
    assert missing.status_code == 404 and "no workflow with id" in missing.text
    bad = client.get("/workflows/not-a-uuid")
    assert bad.status_code == 400 and "a workflow id is a UUID" in bad.text


def test_cancel_and_retry_a_workflow_act_through_ops_and_are_audited(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    client = make_client(auth=lambda request: Decision("allow", user="alice"))
    page = client.get(f"/workflows/{ids.id}").text
    assert forms(page) == [f"/workflows/{ids.id}/cancel"]  # nothing failed: no retry yet
    cancelled = client.post(f"/workflows/{ids.id}/cancel")
    assert cancelled.status_code == 303 and landing(cancelled) == f"/workflows/{ids.id}"
    assert said(client, cancelled) == (
        "4 waiting or queued step(s) cancelled; 0 running step(s) asked to stop."
    )
    assert set(statuses(engine, ids).values()) == {"cancelled"}
    page = client.get(f"/workflows/{ids.id}").text
    assert forms(page) == [f"/workflows/{ids.id}/retry"] * 2
    retried = client.post(f"/workflows/{ids.id}/retry", {"mode": "failed"})
    assert said(client, retried) == "4 step(s) run again."
    assert statuses(engine, ids) == {
        "fetch": "queued",
        "left": "waiting",
        "right": "waiting",
        "zip": "waiting",
    }
    bad = client.post(f"/workflows/{ids.id}/retry", {"mode": "everything"})
    assert bad.status_code == 400 and "mode must be failed (the failed steps) or" in bad.text
    entries = rows(
        engine, "SELECT actor, action, scope, target, detail FROM jobs_audit ORDER BY id"
    )
    assert [tuple(e)[:4] for e in entries] == [
        ("alice", "cancel-workflow", "jobs", str(ids.id)),
        ("alice", "retry-workflow", "jobs", str(ids.id)),
    ]
    assert entries[1].detail == {"mode": "failed", "retried": 4}
    page = client.get(f"/workflows/{ids.id}").text
    assert "Actions on this workflow" in page and "retry-workflow" in page
    # The CLI records no action (as for every command): the page says what it lists.
    assert "Only actions taken from this dashboard are listed" in page


def test_retry_of_failed_and_downstream_reruns_done_steps_after_a_failure(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    with Session(engine) as s:
        ops.cancel(s, [ids["right"]])
        s.commit()
    client = make_client()
    client.get("/")
    client.post(f"/workflows/{ids.id}/retry", {"mode": "failed_and_downstream"})
    assert statuses(engine, ids)["right"] == "waiting"
    assert statuses(engine, ids)["zip"] == "waiting"


def test_read_only_and_unpermitted_viewers_see_no_workflow_action_and_cannot_post_one(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    for client in (
        make_client(read_only=True),
        make_client(auth=lambda request: "read-only"),
        make_client(permissions={"pause"}),
    ):
        page = client.get(f"/workflows/{ids.id}")
        assert page.status_code == 200 and forms(page.text) == []
        refused = client.post(f"/workflows/{ids.id}/cancel")
        assert refused.status_code == 403 and "You may not cancel" in refused.text
        refused = client.post(f"/workflows/{ids.id}/retry", {"mode": "failed"})
        assert refused.status_code == 403 and "You may not retry" in refused.text
    assert set(statuses(engine, ids).values()) == {"queued", "waiting"}
    assert rows(engine, "SELECT id FROM jobs_audit") == []


def test_each_workflow_action_shows_only_to_a_viewer_with_its_permission(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step", {"value": 1})
    flow.add("b", "flow.step", {"value": 2})
    with Session(engine) as s:
        ids = flow.enqueue(s)
        s.commit()
        ops.cancel(s, [ids["b"]])  # one step failed, one still queued
        s.commit()
    retry_only = make_client(permissions={"retry"}).get(f"/workflows/{ids.id}").text
    assert forms(retry_only) == [f"/workflows/{ids.id}/retry"] * 2
    cancel_only = make_client(permissions={"cancel"}).get(f"/workflows/{ids.id}").text
    assert forms(cancel_only) == [f"/workflows/{ids.id}/cancel"]


def test_a_workflow_action_needs_this_browsers_csrf_token(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    client = make_client()
    forged = client.post(f"/workflows/{ids.id}/cancel", csrf=False)
    assert forged.status_code == 403 and "Refused" in forged.text
    assert "cancelled" not in statuses(engine, ids).values()


# --- the list of workflows, and a big workflow a page at a time -----------------------


def one_step(engine: sa.Engine) -> WorkflowIds:
    flow = Workflow(registry=registry)
    flow.add("only", "flow.step")
    with Session(engine) as s:
        ids = flow.enqueue(s)
        s.commit()
    return ids


def listed(page: str) -> list[str]:
    return re.findall(r'<a href="/workflows/([0-9a-f-]{36})"><code>', page)


def test_workflows_page_lists_the_newest_first_links_each_and_pages_by_keyset(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    from sqla_jobs.dashboard import _views

    made = [one_step(engine).id for _ in range(_views.WORKFLOW_ROWS + 1)]
    newest_first = [str(w) for w in sorted(made, reverse=True)]
    client = make_client()
    page = client.get("/workflows")
    assert page.status_code == 200
    assert '<a href="/workflows" aria-current="page">Workflows</a>' in page.text
    assert listed(page.text) == newest_first[: _views.WORKFLOW_ROWS]
    older = re.search(r'<a href="\?([^"]+)" rel="next">Older workflows</a>', page.text)
    assert older is not None
    second = client.get("/workflows?" + html.unescape(older.group(1))).text
    assert listed(second) == newest_first[_views.WORKFLOW_ROWS :]
    assert "Older workflows" not in second and "Newest workflows" in second
    # Every page links to the list; a workflow's page is under it in the navigation.
    assert 'href="/workflows"' in client.get("/").text
    flow_page = client.get(f"/workflows/{made[0]}").text
    assert '<a href="/workflows" aria-current="page">Workflows</a>' in flow_page


def test_workflows_page_filters_by_state_and_refuses_an_unknown_one(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    running = one_step(engine)
    failed = one_step(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET status = 'dead', finished_at = now() WHERE id = :id"),
            {"id": failed["only"]},
        )
    client = make_client()
    both = client.get("/workflows").text
    assert listed(both) == [str(failed.id), str(running.id)]
    assert "running" in both and "failed" in both
    assert listed(client.get("/workflows?state=failed").text) == [str(failed.id)]
    assert listed(client.get("/workflows?state=running").text) == [str(running.id)]
    bad = client.get("/workflows?state=done")
    assert bad.status_code == 400 and "state must be one of running, finished, failed" in bad.text
    bad = client.get("/workflows?before=nope")
    assert bad.status_code == 400 and "a workflow id is a UUID" in bad.text


def test_a_big_workflows_page_shows_its_steps_a_page_at_a_time_with_live_states(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    flow = Workflow(registry=registry)
    flow.add("root", "flow.step")
    parents = [flow.add(f"p{i:03}", "flow.step", after="root") for i in range(70)]
    flow.add("join", "flow.sum", after=parents)
    with Session(engine) as s:
        ids = flow.enqueue(s)
        s.commit()
    client = make_client()
    first = client.get(f"/workflows/{ids.id}").text
    assert "72 step(s):" in first and 'data-label="Stage"' not in first
    steps = step_rows(first)
    assert list(steps) == ["root", *parents[:49]]
    assert steps["p000"]["Depends on"] == "root"
    assert f'href="#step-{ids["root"]}"' in first
    # Each step's state updates live: the page watches its own steps' jobs.
    live = re.search(r'data-live="/events\?ids=([0-9,]+)"', first)
    assert live is not None
    assert live.group(1).split(",") == [str(ids[n]) for n in steps]
    assert f'data-job="{ids["root"]}"' in first
    after = re.search(r'<a href="\?after=(\d+)" rel="next">Next steps</a>', first)
    assert after is not None and int(after.group(1)) == ids[parents[48]]
    second = client.get(f"/workflows/{ids.id}?after={after.group(1)}").text
    steps = step_rows(second)
    assert list(steps) == [*parents[49:], "join"]
    # A fan-in's row names its first dependencies, then how many more; those on
    # another page are not links.
    assert steps["join"]["Depends on"] == ", ".join(parents[:20]) + " and 50 more"
    assert f'href="#step-{ids["p000"]}"' not in second
    assert "Next steps" not in second and "First steps" in second
    bad = client.get(f"/workflows/{ids.id}?after=x")
    assert bad.status_code == 400


@pytest.mark.parametrize(
    ("form", "got"),
    [({}, "none was given"), ({"mode": "everything"}, "got &#39;everything&#39;")],
    ids=["missing", "unknown"],
)
def test_a_workflow_retry_without_a_known_mode_is_refused_and_does_nothing(
    engine: sa.Engine, make_client: MakeClient, form: dict[str, str], got: str
) -> None:
    ids = fan_in(engine)
    with Session(engine) as s:
        ops.cancel(s, [ids["right"]])
        s.commit()
    before = statuses(engine, ids)
    client = make_client()
    client.get("/")
    refused = client.post(f"/workflows/{ids.id}/retry", form)
    assert refused.status_code == 400
    assert (
        "Say which steps to retry: mode must be failed (the failed steps) or "
        "failed_and_downstream (them and every step after them), " + got
    ) in refused.text
    assert f'href="/workflows/{ids.id}">Back to the workflow' in refused.text
    assert statuses(engine, ids) == before
    assert rows(engine, "SELECT action FROM jobs_audit") == []


def test_workflows_page_names_the_parameters_it_does_not_know(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    one_step(engine)
    client = make_client()
    page = client.get("/workflows?x=1&state=running&y=2").text
    assert (
        "Unknown parameters x, y, ignored: the workflows below are not filtered by them. "
        "The filter is state (running, finished, failed)."
    ) in page
    assert "Unknown parameter" not in client.get("/workflows?state=running").text


def test_a_steps_dependencies_keep_their_order_after_a_retry(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    flow = Workflow(registry=registry)
    for n in range(3):
        flow.add(f"c{n}", "flow.step", {"value": n})
    flow.add("sum", "flow.sum", after=["c0", "c1", "c2"])
    with Session(engine) as s:
        ids = flow.enqueue(s)
        ops.cancel(s, [ids["c1"]])
        s.commit()
    client = make_client()
    steps = step_rows(client.get(f"/workflows/{ids.id}").text)
    assert steps["sum"]["Depends on"] == "c0, c1, c2"
    client.post(f"/workflows/{ids.id}/retry", {"mode": "failed"})
    steps = step_rows(client.get(f"/workflows/{ids.id}").text)
    assert steps["sum"]["Depends on"] == "c0, c1, c2"
    assert steps["sum"]["Waits on"] == "c0, c1, c2"


def test_an_archived_workflow_is_listed_and_its_page_is_read_only(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    live = one_step(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = CASE WHEN step = 'zip' THEN 'dead' ELSE 'done' END"
                "::job_status, finished_at = now() - interval '2 days' WHERE workflow_id = :w"
            ),
            {"w": ids.id},
        )
    with Session(engine) as s:
        moved = ops.archive(
            s, older_than=ops.parse_duration("1h"), include_dead_after=ops.parse_duration("1d")
        )
    assert moved == 4
    client = make_client()
    page = client.get("/workflows")
    assert listed(page.text) == [str(live.id), str(ids.id)]
    assert 'failed <span class="tag">archived</span>' in page.text
    assert listed(client.get("/workflows?state=failed").text) == [str(ids.id)]
    shown = client.get(f"/workflows/{ids.id}")
    assert shown.status_code == 200
    assert "shown read-only" in shown.text
    assert {name: s["State"] for name, s in step_rows(shown.text).items()} == {
        "fetch": "done",
        "left": "done",
        "right": "done",
        "zip": "dead",
    }
    # An admin sees no cancel or retry for it: nothing of it is left in jobs.
    assert "/retry" not in shown.text and "/cancel" not in shown.text
    assert "Cancel workflow" in client.get(f"/workflows/{live.id}").text


def test_retrying_a_step_whose_dependency_failed_is_refused_naming_the_dependency(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    client = make_client()
    client.get(f"/workflows/{ids.id}")
    client.post(f"/workflows/{ids.id}/cancel")
    ended = statuses(engine, ids)
    assert set(ended.values()) == {"cancelled"}
    refused = client.post(f"/jobs/{ids['left']}/retry")
    assert refused.status_code == 400
    text = html.unescape(refused.text)
    assert (
        f"step 'left' (job {ids['left']}) was not retried: its dependency 'fetch' "
        f"(job {ids['fetch']}) ended cancelled" in text
    )
    assert f"sqla-jobs workflow retry {ids.id}" in text and "Nothing was retried." in text
    assert "&#39;left&#39;" in refused.text  # the names are escaped
    assert statuses(engine, ids) == ended
    assert rows(engine, "SELECT action FROM jobs_audit") == [("cancel-workflow",)]
    # The call the message names: the whole workflow runs again, left after fetch.
    assert client.post(f"/workflows/{ids.id}/retry", {"mode": "failed"}).status_code == 303
    assert statuses(engine, ids) == {
        "fetch": "queued",
        "left": "waiting",
        "right": "waiting",
        "zip": "waiting",
    }


def test_the_jobs_page_filters_by_workflow_and_the_workflow_page_links_to_it(
    engine: sa.Engine, make_client: MakeClient
) -> None:
    ids = fan_in(engine)
    other = one_step(engine)
    client = make_client()
    page = client.get(f"/workflows/{ids.id}").text
    link = re.search(r'<a href="(/jobs\?workflow=[^"]+)">Its steps on the Jobs page</a>', page)
    assert link is not None and link.group(1) == f"/jobs?workflow={ids.id}"
    jobs = client.get(link.group(1))
    assert jobs.status_code == 200
    shown = set(map(int, re.findall(r'<td data-job="(\d+)"', jobs.text)))
    assert shown == {ids["fetch"], ids["left"], ids["right"], ids["zip"]}
    assert f'name="workflow" value="{ids.id}"' in jobs.text
    # Combined with another filter, and the other workflow's step is not among them.
    queued = client.get(f"/jobs?workflow={ids.id}&status=queued").text
    assert set(map(int, re.findall(r'<td data-job="(\d+)"', queued))) == {ids["fetch"]}
    assert other["only"] not in shown
    # A value that is no workflow id: said, naming the control, and escaped everywhere.
    bad = client.get("/jobs", params={"workflow": '"><script>x</script>'})
    assert bad.status_code == 400
    assert "<script>x</script>" not in bad.text
    assert "&#34;&gt;&lt;script&gt;x&lt;/script&gt;" in bad.text or (
        "&quot;&gt;&lt;script&gt;" in bad.text
    )
    assert "Workflow (workflow): a workflow id is a UUID" in html.unescape(bad.text)
