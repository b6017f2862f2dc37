"""What an operator sees of workflows (#26) from ``sqla-jobs``, as real commands: a
step's job names its workflow and ``list --workflow`` finds its steps (from the
workflow's own index); a retried workflow's steps that then ran show their old failure
as earlier, one line each; ``workflow cancel --wait`` says how running steps ended; a
flag an action does not take is refused, not ignored."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import flowapp
import psycopg
import pytest
import sqlalchemy as sa
import test_worker
from controlapp import registry as control_registry
from flowapp import registry
from helpers import rows, scalar, setup_app_tables, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from test_dashboard_plans import _assert_uses
from test_fence_plans import _plans
from test_ops_cli import cli, ok
from test_workflows import drain, enqueue, fix, statuses

from sqla_jobs import enqueue as plain_enqueue
from sqla_jobs import ops
from sqla_jobs.models import JobStatus
from sqla_jobs.sql import admin
from sqla_jobs.workflows import Workflow


@pytest.fixture
def flow_engine(engine: sa.Engine) -> sa.Engine:
    flowapp.setup(engine)
    return engine


def chain_with_a_failure(engine: sa.Engine) -> Any:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step", {"value": 1})
    flow.add("bad", "flow.fail", {"why": "the card expired"}, after="a")
    flow.add("c", "flow.step", after="bad")
    return enqueue(engine, flow)


def step_lines(text: str) -> dict[str, str]:
    """``workflow show``'s table rows by step name."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ID "))
    return {line.split()[1]: line for line in lines[start + 1 :]}


# --- a step's job and its workflow ---------------------------------------------------


def test_show_names_a_steps_workflow_and_step_and_how_to_see_it(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    ids = chain_with_a_failure(flow_engine)
    text = ok(db_url, "show", str(ids["bad"]))
    assert re.search(
        rf"^workflow: +{ids.id} step: bad \(its steps: sqla-jobs workflow show {ids.id}\)$",
        text,
        re.M,
    ), text
    with Session(flow_engine) as s:
        job_id = plain_enqueue(s, "noop", {})
        s.commit()
    assert "workflow:" not in ok(db_url, "show", str(job_id))


def test_list_keeps_one_workflows_steps_with_the_other_filters_and_pages(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    ids = chain_with_a_failure(flow_engine)
    other = chain_with_a_failure(flow_engine)
    steps = [ids["a"], ids["bad"], ids["c"]]

    def listed(*args: str) -> list[int]:
        found = json.loads(ok(db_url, "list", "--json", "--workflow", str(ids.id), *args))
        return [j["id"] for j in found["jobs"]]

    assert listed() == steps
    assert listed("--newest-first") == steps[::-1]
    assert listed("--status", "waiting") == steps[1:]
    assert listed("--kind", "flow.fail") == [ids["bad"]]
    assert listed("--limit", "2", "--after-id", str(ids["a"])) == steps[1:]
    assert listed("--newest-first", "--after-id", str(ids["c"])) == steps[1::-1]
    assert listed("--payload", '{"why": "the card expired"}') == [ids["bad"]]
    text = ok(db_url, "list", "--workflow", str(other.id))
    assert [int(line.split()[0]) for line in text.splitlines()[1:]] == [
        other["a"],
        other["bad"],
        other["c"],
    ]
    assert ok(db_url, "list", "--workflow", str(uuid.uuid4())).splitlines()[1:] == []
    bad = cli(db_url, "list", "--workflow", "nope")
    assert bad.returncode == 2
    assert bad.stderr == "sqla_jobs: error: a workflow id is a UUID, got 'nope'\n"
    with Session(flow_engine) as s:
        assert [j.id for j in ops.list_jobs(s, workflow=ids.id, status="queued")] == [ids["a"]]
        assert [j.step for j in ops.list_jobs(s, workflow=str(other.id))] == ["a", "bad", "c"]


ROWS = 20_000
STEPS = 30
BIG_STEPS = 2_000
#: The workflow's own index (revision 0014), or with a status (revision 0015).
WORKFLOW_INDEXES = ("jobs_workflow_finished_idx", "jobs_workflow_status_idx")


def _assert_uses_a_workflow_index(plan: Any) -> None:
    for index in WORKFLOW_INDEXES:
        try:
            _assert_uses(plan, index)
            return
        except AssertionError:
            if index == WORKFLOW_INDEXES[-1]:
                raise


@pytest.mark.parametrize(
    "stats",
    ["empty-table", "most-jobs-in-no-workflow", "many-workflows", "a-big-recent-workflow"],
)
def test_a_workflows_page_reads_the_workflow_index_not_the_table(
    engine: sa.Engine, driver: psycopg.Connection[Any], stats: str
) -> None:
    """``list --workflow`` reads the workflow's index entries and sorts its steps; never
    a sequential scan or a walk of the primary key testing each job's workflow (with a
    status, the (status, workflow_id) index serves as well)."""
    wid = uuid.uuid4()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        if stats == "empty-table":
            conn.exec_driver_sql("ANALYZE jobs")
        # Every job in a workflow of its own, or (most-jobs-in-no-workflow) in none.
        each = "NULL" if stats == "most-jobs-in-no-workflow" else "gen_random_uuid()"
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload, workflow_id, step)"
            f" SELECT 'common', '{{}}', {each}, 's' || g FROM generate_series(1, %(n)s) AS g",
            {"n": ROWS},
        )
        if stats == "a-big-recent-workflow":
            # A tenth of the table, its newest jobs: walking the primary key in id order
            # looks cheap (one job in ten matches) and reads the other 18,000 first.
            conn.exec_driver_sql(
                "UPDATE jobs SET workflow_id = %(w)s WHERE id > %(n)s - %(k)s",
                {"w": wid, "n": ROWS, "k": BIG_STEPS},
            )
        else:
            conn.exec_driver_sql(
                "UPDATE jobs SET workflow_id = %(w)s WHERE id %% (%(n)s / %(k)s) = 0",
                {"w": wid, "n": ROWS, "k": STEPS},
            )
        if stats != "empty-table":
            conn.exec_driver_sql("ANALYZE jobs")
    for newest_first in (True, False):
        for after_id in (None, ROWS // 2):
            for extra in ({}, {"kind": "common"}, {"statuses": [JobStatus.QUEUED]}):
                stmt = admin.list_jobs(
                    workflow=wid, limit=51, after_id=after_id, newest_first=newest_first, **extra
                )
                for mode, plan in _plans(driver, stmt).items():
                    try:
                        _assert_uses_a_workflow_index(plan)
                    except AssertionError as exc:
                        where = f"{stats}, {mode}, {newest_first=}, {after_id=}, {extra}"
                        raise AssertionError(f"{where}: {exc}") from None
            with Session(engine) as s:
                page = ops.list_jobs(
                    s, workflow=wid, limit=51, after_id=after_id, newest_first=newest_first
                )
            found = [j.id for j in page]
            assert found == sorted(found, reverse=newest_first)
            steps = sorted(
                r[0] for r in rows(engine, "SELECT id FROM jobs WHERE workflow_id = :w", w=wid)
            )
            if after_id is not None:
                steps = [i for i in steps if (i < after_id if newest_first else i > after_id)]
            assert found == (steps[::-1] if newest_first else steps)[:51]


# --- errors: the state, or history ----------------------------------------------------


def test_a_failed_steps_error_shows_its_first_line_and_after_a_retry_it_is_earlier(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    ids = chain_with_a_failure(flow_engine)
    drain(db_url)
    stored = str(scalar(flow_engine, "SELECT last_error FROM jobs WHERE id = :i", i=ids["bad"]))
    assert "\n" in stored  # the handler's error with its traceback
    first = stored.splitlines()[0]
    assert "the card expired" in first
    lines = step_lines(ok(db_url, "workflow", "show", str(ids.id)))
    assert lines["a"].endswith(" -")
    assert lines["bad"].endswith(f"  {first}") and "Traceback" not in lines["bad"]
    assert lines["c"].endswith(f'  upstream step "bad" (job {ids["bad"]}) ended dead: {first}')
    assert "Traceback" not in lines["c"]

    fix(flow_engine, ids["bad"])
    assert ok(db_url, "workflow", "retry", str(ids.id)) == "retried 2 step(s)\n"
    drain(db_url)
    assert set(statuses(flow_engine, ids).values()) == {"done"}
    text = ok(db_url, "workflow", "show", str(ids.id))
    lines = step_lines(text)
    # Done now: the old failure is history, labelled so; never the step's error.
    assert lines["bad"].split()[3] == "done"
    assert re.search(r"  earlier: \S", lines["bad"]) and "Traceback" not in text
    assert '  earlier: upstream step "bad"' in lines["c"]
    data = {
        s["step"]: s
        for s in json.loads(ok(db_url, "workflow", "show", str(ids.id), "--json"))["steps"]
    }
    assert data["bad"]["current_error"] is None and data["c"]["current_error"] is None
    assert data["bad"]["last_error"] == stored  # kept, in full, for history
    # `show --json` of one step says the same.
    one = json.loads(ok(db_url, "show", str(ids["c"]), "--json"))
    assert one["current_error"] is None and one["last_error"] == data["c"]["last_error"]
    with Session(flow_engine) as s:
        by_step = {st.step: st for st in ops.workflow_status(s, ids.id).steps}
    assert by_step["c"].current_error is None
    assert by_step["c"].last_error is not None
    assert by_step["c"].last_error.startswith('upstream step "bad"')


def test_a_step_still_failed_or_waiting_again_after_a_retry_shows_the_right_error(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    ids = chain_with_a_failure(flow_engine)
    drain(db_url)
    assert ok(db_url, "workflow", "retry", str(ids.id)) == "retried 2 step(s)\n"
    with Session(flow_engine) as s:
        by_step = {st.step: st for st in ops.workflow_status(s, ids.id).steps}
    # Queued afresh, and waiting for it again: neither is failed now.
    assert (by_step["bad"].status.value, by_step["bad"].current_error) == ("queued", None)
    assert (by_step["c"].status.value, by_step["c"].current_error) == ("waiting", None)
    drain(db_url)  # not fixed: dead again, and its dependent cancelled again
    with Session(flow_engine) as s:
        by_step = {st.step: st for st in ops.workflow_status(s, ids.id).steps}
    assert by_step["bad"].current_error == by_step["bad"].last_error
    shown = json.loads(ok(db_url, "show", str(ids["c"]), "--json"))
    assert shown["current_error"] == by_step["c"].last_error
    assert shown["current_error"].startswith('upstream step "bad"')
    assert by_step["c"].current_error is not None
    assert by_step["c"].current_error.startswith('upstream step "bad"')
    lines = step_lines(ok(db_url, "workflow", "show", str(ids.id)))
    assert "earlier:" not in lines["bad"] and "earlier:" not in lines["c"]


# --- workflow cancel --wait -----------------------------------------------------------


def test_workflow_cancel_waits_for_running_steps_to_stop_and_says_how_each_ended(
    db_url: URL, engine: sa.Engine
) -> None:
    setup_app_tables(engine)
    flow = Workflow()
    flow.add("long", "cancellable", {})
    flow.add("after", "quick", {}, after="long")
    ids = enqueue(engine, flow)
    with test_worker.running(control_registry, db_url, poll_interval=0.1):
        wait_for(lambda: statuses(engine, ids)["long"] == "running", message="the step started")
        out = ok(db_url, "workflow", "cancel", str(ids.id), "--wait", "30")
    assert out == (
        "cancelled 1 step(s); asked 1 running step(s) to stop\n"
        f"job {ids['long']}: stopped and cancelled (its attempt's writes rolled back)\n"
    )
    assert statuses(engine, ids) == {"long": "cancelled", "after": "cancelled"}


def test_workflow_cancel_with_no_wait_says_a_running_step_still_runs(
    db_url: URL, engine: sa.Engine
) -> None:
    setup_app_tables(engine)
    flow = Workflow()
    flow.add("long", "cancellable", {})
    ids = enqueue(engine, flow)
    with engine.begin() as conn:  # claimed by a worker that is not there to stop it
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = 'running', attempts = 1, worker = 'gone:1', "
                "locked_until = now() + interval '1 hour' WHERE id = :i"
            ),
            {"i": ids["long"]},
        )
    out = ok(db_url, "workflow", "cancel", str(ids.id), "--wait", "0")
    assert out == (
        "cancelled 0 step(s); asked 1 running step(s) to stop\n"
        f"job {ids['long']}: still running after 0s; its worker stops it at its next check "
        "(or it ends cancelled when its lease expires)\n"
    )
    # Asked already: a second cancel asks no step again.
    out = ok(db_url, "workflow", "cancel", str(ids.id).upper(), "--wait", "0", "--json")
    assert json.loads(out) == {"id": str(ids.id), "cancelled": [], "stopping": []}
    # --json: one document, each running step with its status after the wait.
    other = enqueue(engine, flow)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = 'running', attempts = 1, worker = 'gone:1', "
                "locked_until = now() + interval '1 hour' WHERE id = :i"
            ),
            {"i": other["long"]},
        )
    out = ok(db_url, "workflow", "cancel", str(other.id), "--wait", "0", "--json")
    assert json.loads(out) == {
        "id": str(other.id),
        "cancelled": [],
        "stopping": [{"id": other["long"], "status": "running"}],
    }


def test_workflow_cancel_and_retry_json_give_the_steps_they_changed(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step")
    flow.add("b", "flow.step", after="a")
    flow.add("c", "flow.step", after="b")
    ids = enqueue(flow_engine, flow)
    cancelled = json.loads(ok(db_url, "workflow", "cancel", str(ids.id), "--json"))
    assert cancelled == {
        "id": str(ids.id),
        "cancelled": [ids["a"], ids["b"], ids["c"]],
        "stopping": [],
    }
    retried = json.loads(ok(db_url, "workflow", "retry", str(ids.id), "--json"))
    assert retried == {
        "id": str(ids.id),
        "mode": "failed",
        "retried": [ids["a"], ids["b"], ids["c"]],
    }
    again = ok(db_url, "workflow", "retry", str(ids.id), "--downstream", "--json")
    assert json.loads(again) == {"id": str(ids.id), "mode": "failed_and_downstream", "retried": []}


# --- flags an action does not take ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["show", "--downstream"],
            "workflow show takes no --downstream (it goes with workflow retry)",
        ),
        (["show", "--wait", "5"], "workflow show takes no --wait (it goes with workflow cancel)"),
        (["retry", "--wait", "5"], "workflow retry takes no --wait (it goes with workflow cancel)"),
        (
            ["cancel", "--state", "failed"],
            "workflow cancel takes no --state (it goes with workflow list)",
        ),
        (["show", "--limit", "3"], "workflow show takes no --limit (it goes with workflow list)"),
        (
            ["retry", "--before", "x"],
            "workflow retry takes no --before (it goes with workflow list)",
        ),
        (
            ["list", "--downstream"],
            "workflow list takes no --downstream (it goes with workflow retry)",
        ),
    ],
    ids=lambda value: "-".join(value).replace("--", "") if isinstance(value, list) else "",
)
def test_a_workflow_flag_the_action_does_not_take_is_a_usage_error(
    db_url: URL, args: list[str], message: str
) -> None:
    action, *flags = args
    wid = [] if action == "list" else [str(uuid.uuid4())]
    result = cli(db_url, "workflow", action, *wid, *flags)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"sqla_jobs: error: {message} (see sqla-jobs workflow --help)\n"


def test_workflow_cancel_refuses_a_negative_wait(db_url: URL, flow_engine: sa.Engine) -> None:
    ids = chain_with_a_failure(flow_engine)
    result = cli(db_url, "workflow", "cancel", str(ids.id), "--wait", "-1")
    assert result.returncode == 2
    assert result.stderr == "sqla_jobs: error: --wait must be >= 0 seconds, got -1\n"
    assert "cancelled" not in set(statuses(flow_engine, ids).values())
