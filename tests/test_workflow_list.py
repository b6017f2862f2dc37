"""The list of recent workflows (#26): ``ops.list_workflows``, ``sqla-jobs workflow list``;
newest first by their time-ordered ids, each with its size, steps by status and times,
paged by keyset and filtered by state; and its plans, one index descent per workflow
whatever the statistics (revision 0015)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import flowapp
import psycopg
import pytest
import sqlalchemy as sa
from flowapp import registry
from helpers import rows, scalar
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from test_dashboard_plans import _assert_uses
from test_fence_plans import _nodes, _plans
from test_ops_cli import cli, ok

from sqla_jobs import models, ops, workflows
from sqla_jobs.exceptions import ConfigError, JobNotFoundError
from sqla_jobs.sql import workflows as workflows_sql
from sqla_jobs.workflows import Workflow, WorkflowIds


@pytest.fixture
def flow_engine(engine: sa.Engine) -> sa.Engine:
    flowapp.setup(engine)
    return engine


def next_millisecond() -> None:
    """Until the clock's millisecond changes: the next workflow id sorts after the last."""
    now = time.time_ns() // 1_000_000
    while time.time_ns() // 1_000_000 == now:
        pass


def chain(engine: sa.Engine, n: int = 3, *, roots: int = 1) -> WorkflowIds:
    """``roots`` independent steps, then a chain of ``n`` after the first."""
    next_millisecond()
    flow = Workflow(registry=registry)
    for i in range(n):
        flow.add(f"s{i}", "flow.step", after=[f"s{i - 1}"] if i else [])
    for i in range(1, roots):
        flow.add(f"r{i}", "flow.step")
    with Session(engine) as s:
        ids = flow.enqueue(s)
        s.commit()
    return ids


def set_status(engine: sa.Engine, status: str, *job_ids: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = CAST(:s AS job_status), finished_at = "
                "CASE WHEN :s IN ('done', 'dead', 'cancelled') THEN statement_timestamp() END "
                "WHERE id = ANY(:ids)"
            ),
            {"s": status, "ids": list(job_ids)},
        )


def test_workflow_ids_are_time_ordered_uuids() -> None:
    first = workflows.new_workflow_id()
    next_millisecond()
    second = workflows.new_workflow_id()
    assert (first.version, first.variant) == (7, uuid.RFC_4122)
    assert first < second
    assert abs((first.int >> 80) - time.time() * 1000) < 60_000


def test_workflows_are_listed_newest_first_with_their_counts_and_times_by_keyset_pages(
    flow_engine: sa.Engine,
) -> None:
    old, middle, new = chain(flow_engine), chain(flow_engine, 2), chain(flow_engine, 4)
    with Session(flow_engine) as s:
        s.execute(sa.text("SET LOCAL jit = on"))
        page = ops.list_workflows(s)
        # Read with JIT off (see sql.workflows.set_jit); the caller's setting is back.
        assert s.execute(sa.text("SELECT current_setting('jit')")).scalar() == "on"
    assert [w.id for w in page] == [new.id, middle.id, old.id]
    assert [w.size for w in page] == [4, 2, 3]
    assert page[0].counts == {"queued": 1, "waiting": 3}
    assert (page[0].state, page[0].finished, page[0].finished_at) == ("running", False, None)
    created = scalar(
        flow_engine, "SELECT min(created_at) FROM jobs WHERE workflow_id = :w", w=new.id
    )
    assert page[0].created_at == created

    set_status(flow_engine, "done", *middle.steps.values())
    set_status(flow_engine, "dead", old["s0"])
    set_status(flow_engine, "cancelled", old["s1"], old["s2"])
    with Session(flow_engine) as s:
        first = ops.list_workflows(s, limit=2)
        second = ops.list_workflows(s, limit=2, before=first[-1].id)
        assert ops.list_workflows(s, before=str(old.id)) == []
    assert [w.id for w in first] == [new.id, middle.id]
    assert [w.id for w in second] == [old.id]
    done = first[1]
    ended = scalar(
        flow_engine, "SELECT max(finished_at) FROM jobs WHERE workflow_id = :w", w=middle.id
    )
    assert (done.state, done.counts, done.finished_at) == ("succeeded", {"done": 2}, ended)
    assert second[0].counts == {"dead": 1, "cancelled": 2}
    assert (second[0].state, second[0].failed) == ("failed", 3)
    assert second[0].to_dict()["state"] == "failed"


def test_the_state_filter_keeps_running_finished_or_failed_workflows(
    flow_engine: sa.Engine,
) -> None:
    running = chain(flow_engine)
    failing = chain(flow_engine, roots=2)  # a dead step, another one still to run
    succeeded = chain(flow_engine)
    failed = chain(flow_engine)
    set_status(flow_engine, "dead", failing["s0"])
    set_status(flow_engine, "done", *succeeded.steps.values())
    set_status(flow_engine, "done", failed["s0"], failed["s1"])
    set_status(flow_engine, "cancelled", failed["s2"])
    newest = chain(flow_engine)
    with Session(flow_engine) as s:
        everything = ops.list_workflows(s)

        def listed(state: str, **args: Any) -> list[uuid.UUID]:
            return [w.id for w in ops.list_workflows(s, state=state, **args)]

        assert len(everything) == 5
        assert listed("running") == [newest.id, failing.id, running.id]
        assert listed("finished") == [failed.id, succeeded.id]
        assert listed("failed") == [failed.id, failing.id]
        assert listed("running", limit=1, before=failing.id) == [running.id]
        assert listed("failed", before=failed.id) == [failing.id]
        assert listed("finished", before=failed.id) == [succeeded.id]


def test_bad_list_arguments_are_refused_naming_the_argument(flow_engine: sa.Engine) -> None:
    with Session(flow_engine) as s:
        with pytest.raises(ConfigError, match="state must be one of running, finished, failed"):
            ops.list_workflows(s, state="done")
        with pytest.raises(ConfigError, match="limit"):
            ops.list_workflows(s, limit=0)
        with pytest.raises(ConfigError, match="a workflow id is a UUID, got 'nope'"):
            ops.list_workflows(s, before="nope")


def test_list_workflows_async_reads_the_same_page_and_the_wrong_session_is_named(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    ids = chain(flow_engine)

    async def read() -> list[ops.WorkflowSummary]:
        engine = create_async_engine(db_url)
        try:
            async with AsyncSession(engine) as s:
                with pytest.raises(TypeError, match="list_workflows_async"):
                    ops.list_workflows(s)  # type: ignore[arg-type]
                return await ops.list_workflows_async(s, state="running")
        finally:
            await engine.dispose()

    assert [w.id for w in asyncio.run(read())] == [ids.id]


def test_cli_workflow_list_pages_and_filters(db_url: URL, flow_engine: sa.Engine) -> None:
    old, new = chain(flow_engine), chain(flow_engine)
    set_status(flow_engine, "done", *old.steps.values())
    shown = ok(db_url, "workflow", "list")
    assert shown.index(str(new.id)) < shown.index(str(old.id))
    assert "STATE" in shown and "succeeded" in shown and "1 queued, 2 waiting" in shown
    shown = ok(db_url, "workflow", "list", "--limit", "1")
    assert str(old.id) not in shown and f"next page: --before {new.id}" in shown
    assert str(old.id) in ok(db_url, "workflow", "list", "--before", str(new.id))
    listed = json.loads(ok(db_url, "workflow", "list", "--state", "finished", "--json"))
    assert [(w["id"], w["state"], w["counts"]) for w in listed] == [
        (str(old.id), "succeeded", {"done": 3})
    ]
    refused = cli(db_url, "workflow", "list", str(old.id))
    assert refused.returncode != 0 and "takes no WORKFLOW_ID" in refused.stderr
    refused = cli(db_url, "workflow", "show")
    assert refused.returncode != 0 and "workflow show needs a WORKFLOW_ID" in refused.stderr


# --- plans ---------------------------------------------------------------------------

#: Workflows of the plan tests, and their steps: 20,000 jobs with the others.
WORKFLOWS, STEPS, OTHERS = 2_000, 5, 10_000


def _load(engine: sa.Engine, stats: str) -> None:
    """Finished workflows, three old running ones and a few failed ones spread among
    them, beside a backlog of queued jobs outside workflows; the statistics taken on an
    empty table, or when every workflow step was waiting (a big fan-out just enqueued)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        if stats == "empty-table":
            conn.exec_driver_sql("ANALYZE jobs")
            conn.exec_driver_sql("ANALYZE jobs_archive")
        conn.exec_driver_sql(
            # A backlog outside workflows: what jobs_claim_idx holds.
            "INSERT INTO jobs (kind, payload) SELECT 'plain', '{}' FROM generate_series(1, %(n)s)",
            {"n": OTHERS},
        )
        # Ids in creation order, as new_workflow_id makes them.
        conn.exec_driver_sql(
            "INSERT INTO jobs (kind, payload, status, workflow_id, step)"
            " SELECT 'flow.step', '{}', 'waiting',"
            " (lpad(to_hex(w), 12, '0') || substr(md5(w::text), 1, 20))::uuid, 's' || s"
            " FROM generate_series(1, %(w)s) AS w, generate_series(1, %(s)s) AS s",
            {"w": WORKFLOWS, "s": STEPS},
        )
        if stats == "every-step-waiting":
            conn.exec_driver_sql("ANALYZE jobs")
        conn.exec_driver_sql(
            "UPDATE jobs SET status = 'done', finished_at = now()"
            " WHERE workflow_id IS NOT NULL AND workflow_id >= %(old)s",
            {"old": uuid.UUID(int=4 << 80)},
        )
        conn.exec_driver_sql(
            "UPDATE jobs SET status = 'dead' WHERE workflow_id IS NOT NULL AND id %% 997 = 0"
        )
        # The newest quarter archived (as the archiver moves them: whole workflows).
        names = ", ".join(c.name for c in models.jobs.c)
        conn.exec_driver_sql(
            "WITH moved AS (DELETE FROM jobs WHERE workflow_id >= %(new)s RETURNING *)"
            f" INSERT INTO jobs_archive ({names}) SELECT {names} FROM moved",
            {"new": uuid.UUID(int=(WORKFLOWS * 3 // 4) << 80)},
        )


def _archive_partitions(engine: sa.Engine) -> tuple[dict[str, str], set[str]]:
    """jobs_archive's partitioned indexes (revision 0022): each partition's index ->
    the parent's; and the partitions holding no row."""
    indexes = dict(
        rows(
            engine,
            "SELECT c.relname, p.relname FROM pg_inherits i JOIN pg_class c ON c.oid ="
            " i.inhrelid JOIN pg_class p ON p.oid = i.inhparent WHERE c.relkind = 'i'",
        )
    )
    parts = [
        r[0]
        for r in rows(
            engine,
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'jobs_archive'::regclass",
        )
    ]
    empty = {p for p in parts if scalar(engine, f"SELECT NOT EXISTS (SELECT FROM {p})")}
    return indexes, empty


def _index_scans(plan: Any, partitions: tuple[dict[str, str], set[str]]) -> set[str]:
    """The indexes the plan reads (a partition's, by its parent's name); it never reads
    jobs (or a partition holding rows) whole, nor sorts but the page. An empty partition
    (the archive's weeks ahead) may be planned as a Seq Scan: it reads no page."""
    text = json.dumps(plan)
    indexes, empty = partitions
    found = set()
    for node, parent in _nodes(plan):
        assert node["Node Type"] != "Seq Scan" or node.get("Relation Name") in empty, text
        assert node.get("Index Name") != "jobs_pkey", text
        # The walk takes one id per descent: no sort of many ids, only the page's at the
        # top, and (revision 0022) the merge of one look's partitions, when the planner
        # expects a row or so of each: the archived rows of that look (see #25's report).
        assert node["Node Type"] != "Sort" or parent is None or _sorts_partitions(node), text
        if "Index Name" in node:
            found.add(indexes.get(node["Index Name"], node["Index Name"]))
    return found


def _sorts_partitions(node: dict[str, Any]) -> bool:
    """A Sort of an Append whose every child reads a partition of jobs_archive."""
    (child,) = node["Plans"]
    members = child.get("Plans", [])
    return (
        child["Node Type"] == "Append"
        and bool(members)
        and all(m.get("Relation Name", "").startswith("jobs_archive_p") for m in members)
    )


@pytest.mark.parametrize("stats", ["empty-table", "every-step-waiting"])
def test_each_list_of_workflows_is_a_walk_down_an_index_whatever_the_statistics(
    engine: sa.Engine, driver: psycopg.Connection[Any], stats: str
) -> None:
    _load(engine, stats)
    partitions = _archive_partitions(engine)
    # Each walk reads both tables (archived workflows are listed), each workflow's
    # figures both workflow indexes.
    both = {"jobs_workflow_finished_idx", "jobs_archive_workflow_finished_idx"}
    walks = {
        None: both,
        "running": both | {"jobs_workflow_status_idx"},
        "failed": both | {"jobs_workflow_status_idx", "jobs_archive_workflow_status_idx"},
        "finished": both | {"jobs_workflow_status_idx"},
    }
    middle = uuid.UUID(int=(WORKFLOWS // 2) << 80)
    for state, indexes in walks.items():
        for before in (False, True):
            stmt = workflows_sql.list_workflows(state=state, before=before)
            if before:
                stmt = stmt.params(before=middle)
            for mode, plan in _plans(driver, stmt).items():
                where = f"{stats}, state={state}, before={before}, {mode}"
                found = _index_scans(plan, partitions)
                # Either of the archive's workflow indexes leads the walk over archived
                # workflows (partitioned, the planner weighs them per partition).
                if "jobs_archive_workflow_status_idx" not in indexes:
                    found.discard("jobs_archive_workflow_status_idx")
                    found.add("jobs_archive_workflow_finished_idx")
                assert found == indexes, where
    # A page of one workflow's steps starts from its index entries, never from a walk of
    # the primary key testing each job's workflow.
    for after_id in (None, OTHERS + 3):
        stmt = workflows_sql.step_page(uuid.UUID(int=1 << 80), after_id=after_id, limit=51)
        for mode, plan in _plans(driver, stmt).items():
            try:
                _assert_uses(plan, "jobs_workflow_finished_idx")
            except AssertionError as exc:
                raise AssertionError(
                    f"{stats}, step_page after {after_id}, {mode}: {exc}"
                ) from None
    with Session(engine) as s:
        # What the plans read: the three old running workflows, the failed ones.
        running = ops.list_workflows(s, state="running", limit=10)
        failed = ops.list_workflows(s, state="failed", limit=100)
        finished = ops.list_workflows(s, state="finished", before=middle)
    assert [w.id.int >> 80 for w in running] == [3, 2, 1]
    dead = scalar(
        engine,
        "SELECT count(DISTINCT workflow_id) FROM (SELECT workflow_id FROM jobs WHERE status ="
        " 'dead' UNION ALL SELECT workflow_id FROM jobs_archive WHERE status = 'dead') AS d",
    )
    assert len(failed) == dead and all(w.counts.get("dead") for w in failed)
    assert any(w.archived for w in failed) and not all(w.archived for w in failed)
    assert [w.id.int >> 80 for w in finished] == list(
        range(WORKFLOWS // 2 - 1, WORKFLOWS // 2 - 51, -1)
    )


def test_workflow_page_reads_a_page_of_steps_and_counts_the_whole_workflow(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    ids = chain(flow_engine, 5)
    set_status(flow_engine, "done", ids["s0"])
    names = ", ".join(c.name for c in models.jobs.c)
    with flow_engine.begin() as conn:  # s0 archived: still a step of its workflow
        conn.exec_driver_sql(
            "WITH moved AS (DELETE FROM jobs WHERE id = %(id)s RETURNING *)"
            f" INSERT INTO jobs_archive ({names}) SELECT {names} FROM moved",
            {"id": ids["s0"]},
        )
    with Session(flow_engine) as s:
        first = ops.workflow_page(s, ids.id, limit=2)
        rest = ops.workflow_page(s, str(ids.id), after_id=first.steps[-1].id, limit=3)
        with pytest.raises(JobNotFoundError, match=f"no workflow with id {uuid.UUID(int=1)}"):
            ops.workflow_page(s, uuid.UUID(int=1))
        with pytest.raises(ConfigError, match="after_id"):
            ops.workflow_page(s, ids.id, after_id=-1)
    assert [st.step for st in first.steps] == ["s0", "s1"] and first.more
    assert first.steps[0].archived and first.counts == {"done": 1, "queued": 1, "waiting": 3}
    assert (first.size, first.finished) == (5, False)
    assert [st.step for st in rest.steps] == ["s2", "s3", "s4"] and not rest.more
    assert rest.steps[0].waiting_on == ("s1",)

    async def read() -> ops.WorkflowPage:
        engine = create_async_engine(db_url)
        try:
            async with AsyncSession(engine) as s:
                return await ops.workflow_page_async(s, ids.id, limit=1)
        finally:
            await engine.dispose()

    assert [st.step for st in asyncio.run(read()).steps] == ["s0"]


def archive_workflow(engine: sa.Engine, ids: WorkflowIds, *, status: str = "done") -> None:
    """End every step of the workflow and let the archiver move it (as a unit)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = CAST(:s AS job_status),"
                " finished_at = now() - interval '2 days' WHERE workflow_id = :w"
            ),
            {"s": status, "w": ids.id},
        )
    with Session(engine) as s:
        ops.archive(
            s, older_than=ops.parse_duration("1h"), include_dead_after=ops.parse_duration("1d")
        )
    assert scalar(engine, "SELECT count(*) FROM jobs WHERE workflow_id = :w", w=ids.id) == 0


def test_archived_workflows_are_listed_and_shown_read_only(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    old = chain(flow_engine, 3)
    failed = chain(flow_engine, 2)
    running = chain(flow_engine, 2)
    archive_workflow(flow_engine, old)
    archive_workflow(flow_engine, failed, status="dead")
    with Session(flow_engine) as s:
        page = ops.list_workflows(s)
        by_state = {
            state: [w.id for w in ops.list_workflows(s, state=state)]
            for state in ops.WORKFLOW_STATES
        }
        status = ops.workflow_status(s, old.id)
    assert [(w.id, w.state, w.size, w.archived) for w in page] == [
        (running.id, "running", 2, False),
        (failed.id, "failed", 2, True),
        (old.id, "succeeded", 3, True),
    ]
    assert page[2].counts == {"done": 3} and page[2].finished_at is not None
    assert by_state == {
        "running": [running.id],
        "finished": [failed.id, old.id],
        "failed": [failed.id],
    }
    assert status.archived and status.finished and all(s.archived for s in status.steps)
    listed = json.loads(ok(db_url, "workflow", "list", "--json"))
    assert [(w["id"], w["archived"], w["archived_steps"]) for w in listed] == [
        (str(running.id), False, 0),
        (str(failed.id), True, 2),
        (str(old.id), True, 3),
    ]
    assert f"{old.id}  succeeded (archived)" in ok(db_url, "workflow", "list")
    shown = ok(db_url, "workflow", "show", str(old.id))
    assert shown.startswith(f"workflow {old.id}: 3 done (archived: read-only)")
    assert json.loads(ok(db_url, "workflow", "show", str(old.id), "--json"))["archived"] is True
