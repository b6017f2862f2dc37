"""Workflows (#26): built in the caller's transaction, released in the transaction that
ends a step, failures cancelling dependents transitively; a worker runs them here."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from typing import Any

import flowapp
import pytest
import sqlalchemy as sa
from flowapp import registry
from helpers import rows, scalar, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from test_ops_cli import cli, ok

from sqla_jobs import models, ops, testing, workflows
from sqla_jobs.exceptions import ConfigError, JobNotFoundError, WorkflowError
from sqla_jobs.sql import admin, lease
from sqla_jobs.workflows import Workflow, WorkflowIds, upstream_results


def statuses(engine: sa.Engine, ids: WorkflowIds) -> dict[str, str]:
    found = rows(
        engine,
        "SELECT step, status::text AS status FROM jobs WHERE workflow_id = :w",
        w=ids.id,
    )
    return {r.step: r.status for r in found}


def last_error(engine: sa.Engine, job_id: int) -> str:
    return str(scalar(engine, "SELECT last_error FROM jobs WHERE id = :id", id=job_id))


def enqueue(engine: sa.Engine, flow: Workflow) -> WorkflowIds:
    with Session(engine) as s:
        ids = flow.enqueue(s)
        s.commit()
    return ids


def drain(url: URL) -> Any:
    return testing.drain(url_text(url), registry, timeout=60)


@pytest.fixture
def flow_engine(engine: sa.Engine) -> sa.Engine:
    flowapp.setup(engine)
    return engine


def fan_in(n: int = 3, *, middle: str = "flow.step", when: str | None = None) -> Workflow:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step", {"value": 1})
    for i in range(n):
        flow.add(f"b{i}", middle, {"value": 10 + i}, after="a")
    flow.add("c", "flow.sum", after=[f"b{i}" for i in range(n)], when=when)
    return flow


# --- building ------------------------------------------------------------------------


def test_steps_with_dependencies_wait_and_the_claim_never_sees_them(
    flow_engine: sa.Engine,
) -> None:
    ids = enqueue(flow_engine, fan_in())
    assert statuses(flow_engine, ids) == {
        "a": "queued",
        "b0": "waiting",
        "b1": "waiting",
        "b2": "waiting",
        "c": "waiting",
    }
    edges = scalar(
        flow_engine, "SELECT count(*) FROM jobs_workflow_edges WHERE workflow_id = :w", w=ids.id
    )
    assert edges == 6


def test_a_workflow_rolls_back_with_the_callers_transaction(flow_engine: sa.Engine) -> None:
    with Session(flow_engine) as s:
        fan_in().enqueue(s)
        s.rollback()
    assert scalar(flow_engine, "SELECT count(*) FROM jobs") == 0
    assert scalar(flow_engine, "SELECT count(*) FROM jobs_workflow_edges") == 0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda f: f.add("b", "flow.step", after="nope"), "depends on 'nope', which is not a step"),
        (lambda f: f.add("a", "flow.step"), "step 'a' was already added"),
        (lambda f: f.add("b", "flow.nothing"), "step 'b': "),
        (lambda f: f.add("b", "flow.step", after=[42]), "a dependency on a job or step of another"),
        (lambda f: f.add("b", "flow.step", after="b"), "step 'b' cannot depend on itself"),
        (lambda f: f.add("b", "flow.step", when="sometimes"), "when must be one of"),
        (
            lambda f: (f.add("b", "flow.step", after="c"), f.add("c", "flow.step", after="b")),
            "the workflow has a cycle: 'b' -> 'c' -> 'b'",
        ),
    ],
)
def test_a_workflow_that_cannot_run_is_refused_before_anything_is_written(
    flow_engine: sa.Engine, build: Any, message: str
) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step")
    with pytest.raises(WorkflowError, match=None) as caught:
        build(flow)
        with Session(flow_engine) as s:
            flow.enqueue(s)
            s.commit()
    assert message in str(caught.value)
    assert scalar(flow_engine, "SELECT count(*) FROM jobs") == 0


def test_a_kind_with_no_handler_is_named_with_its_step(flow_engine: sa.Engine) -> None:
    flow = Workflow(registry=registry)
    with pytest.raises(WorkflowError, match=r"step 'x': .*flow\.nothing"):
        flow.add("x", "flow.nothing")


def test_a_longer_cycle_is_reported_as_the_loop_it_is() -> None:
    flow = Workflow()
    flow.add("a", "k", after="c")
    flow.add("b", "k", after="a")
    flow.add("c", "k", after="b")
    flow.add("d", "k", after="a")
    with pytest.raises(
        WorkflowError,
        match=re.escape("the workflow has a cycle: 'a' -> 'b' -> 'c' -> 'a'"),
    ):
        flow.check()


def test_an_empty_workflow_is_refused() -> None:
    with pytest.raises(WorkflowError, match="at least one step"):
        Workflow().check()


def test_enqueue_async_writes_in_the_async_session(db_url: URL, flow_engine: sa.Engine) -> None:
    async def main() -> WorkflowIds:
        engine = create_async_engine(db_url)
        try:
            async with AsyncSession(engine) as s:
                ids = await fan_in().enqueue_async(s)
                await s.commit()
                return ids
        finally:
            await engine.dispose()

    ids = asyncio.run(main())
    assert statuses(flow_engine, ids)["c"] == "waiting"


def test_a_workflow_given_the_other_kind_of_session_fails_at_once_naming_its_twin(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    async def main() -> None:
        engine = create_async_engine(db_url)
        try:
            async with AsyncSession(engine) as s:
                with pytest.raises(TypeError) as wrong:
                    fan_in().enqueue(s)  # type: ignore[arg-type]
                assert str(wrong.value) == (
                    "Workflow.enqueue() takes a Session or Connection, got AsyncSession: "
                    "with an AsyncSession use `await flow.enqueue_async(session)`"
                )
        finally:
            await engine.dispose()

    asyncio.run(main())
    with Session(flow_engine) as s, pytest.raises(TypeError) as wrong:
        asyncio.run(fan_in().enqueue_async(s))  # type: ignore[arg-type]
    assert str(wrong.value) == (
        "Workflow.enqueue_async() takes an AsyncSession or AsyncConnection, got Session: "
        "with a Session use flow.enqueue(session)"
    )
    assert scalar(flow_engine, "SELECT count(*) FROM jobs") == 0


# --- running -------------------------------------------------------------------------


def test_a_fan_in_runs_each_step_once_after_its_dependencies_and_sees_their_results(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    ids = enqueue(flow_engine, fan_in(5))
    drain(db_url)
    assert set(statuses(flow_engine, ids).values()) == {"done"}
    runs = rows(flow_engine, "SELECT job_id, seen FROM flow_runs ORDER BY job_id")
    assert [r.job_id for r in runs] == sorted(ids.steps.values())
    seen = {r.job_id: r.seen for r in runs}
    assert seen[ids["b3"]] == {"a": 1}
    assert seen[ids["c"]] == {f"b{i}": 10 + i for i in range(5)}
    assert scalar(flow_engine, "SELECT result FROM jobs WHERE id = :id", id=ids["c"]) == 60
    finished = {
        r.id: r.finished_at
        for r in rows(flow_engine, "SELECT id, finished_at, attempted_at FROM jobs")
    }
    started = {r.id: r.attempted_at for r in rows(flow_engine, "SELECT id, attempted_at FROM jobs")}
    assert all(started[ids["c"]] >= finished[ids[f"b{i}"]] for i in range(5))


def test_a_chain_runs_in_order(db_url: URL, flow_engine: sa.Engine) -> None:
    flow = Workflow(registry=registry)
    previous: list[str] = []
    for i in range(6):
        previous = [flow.add(f"s{i}", "flow.step", {"value": i}, after=previous)]
    ids = enqueue(flow_engine, flow)
    drain(db_url)
    order = [r.job_id for r in rows(flow_engine, "SELECT job_id FROM flow_runs ORDER BY ctid")]
    assert order == [ids[f"s{i}"] for i in range(6)]


def test_a_dead_dependency_cancels_its_dependents_transitively_naming_the_upstream_step(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step")
    flow.add("bad", "flow.fail", {"why": "disk full"}, after="a")
    flow.add("ok", "flow.step", after="a")
    flow.add("c", "flow.step", after=["bad", "ok"])
    flow.add("d", "flow.step", after="c")
    ids = enqueue(flow_engine, flow)
    drain(db_url)
    assert statuses(flow_engine, ids) == {
        "a": "done",
        "bad": "dead",
        "ok": "done",
        "c": "cancelled",
        "d": "cancelled",
    }
    error = last_error(flow_engine, ids["c"])
    assert error.startswith(f'upstream step "bad" (job {ids["bad"]}) ended dead: ')
    assert "disk full" in error
    assert last_error(flow_engine, ids["d"]).startswith(
        f'upstream step "c" (job {ids["c"]}) ended cancelled: upstream step "bad"'
    )


def test_a_discarded_dependency_cancels_and_a_finished_step_runs_anyway(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    ids = enqueue(flow_engine, fan_in(2, middle="flow.discard", when="finished"))
    drain(db_url)
    got = statuses(flow_engine, ids)
    assert got == {"a": "done", "b0": "cancelled", "b1": "cancelled", "c": "done"}
    assert scalar(flow_engine, "SELECT result FROM jobs WHERE id = :id", id=ids["c"]) == 0


def test_batch_callbacks_on_success_on_failure_and_on_complete(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    def batch(kind: str) -> Workflow:
        flow = Workflow(registry=registry)
        parts = [flow.add(f"p{i}", kind, {"value": i}) for i in range(3)]
        flow.add("on_success", "flow.step", after=parts)
        flow.add("on_failure", "flow.step", after=parts, when="failed")
        flow.add("on_complete", "flow.step", after=parts, when="finished")
        return flow

    good = enqueue(flow_engine, batch("flow.step"))
    bad = enqueue(flow_engine, batch("flow.fail"))
    drain(db_url)
    assert {k: v for k, v in statuses(flow_engine, good).items() if k.startswith("on_")} == {
        "on_success": "done",
        "on_failure": "cancelled",
        "on_complete": "done",
    }
    assert last_error(flow_engine, good["on_failure"]) == (
        "runs only if an upstream step fails; all 3 ended done"
    )
    assert {k: v for k, v in statuses(flow_engine, bad).items() if k.startswith("on_")} == {
        "on_success": "cancelled",
        "on_failure": "done",
        "on_complete": "done",
    }


def test_an_operator_cancel_or_delete_of_a_dependency_cancels_its_dependents(
    flow_engine: sa.Engine,
) -> None:
    one = enqueue(flow_engine, fan_in(1))
    two = enqueue(flow_engine, fan_in(1))
    with Session(flow_engine) as s:
        ops.cancel_jobs(s, ids=[one["a"]])
        ops.delete_jobs(s, ids=[two["a"]], status="queued")
        s.commit()
    assert statuses(flow_engine, one) == {"a": "cancelled", "b0": "cancelled", "c": "cancelled"}
    assert statuses(flow_engine, two) == {"b0": "cancelled", "c": "cancelled"}
    assert last_error(flow_engine, one["b0"]).startswith(
        f'upstream step "a" (job {one["a"]}) ended cancelled: cancelled by an operator'
    )
    assert last_error(flow_engine, two["b0"]) == f"upstream step (job {two['a']}) was deleted"


def test_upstream_results_are_read_from_the_archive(db_url: URL, flow_engine: sa.Engine) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step", {"value": 7})
    flow.add("b", "flow.step", after="a")
    ids = enqueue(flow_engine, flow)
    with flow_engine.begin() as conn:
        # The parent ran and was archived by hand (the archiver would not: see below).
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = 'done', result = '7', finished_at = now() WHERE id = :id"
            ),
            {"id": ids["a"]},
        )
        names = ", ".join(c.name for c in models.jobs.c)
        conn.execute(
            sa.text(
                "WITH moved AS (DELETE FROM jobs WHERE id = :id RETURNING *) "
                f"INSERT INTO jobs_archive ({names}) SELECT {names} FROM moved"
            ),
            {"id": ids["a"]},
        )
    with Session(flow_engine) as s:
        assert upstream_results(s, ids["b"]) == {"a": 7}
    assert statuses(flow_engine, ids) == {"b": "queued"}


def test_the_archiver_leaves_every_step_of_an_unfinished_workflow(
    flow_engine: sa.Engine,
) -> None:
    ids = enqueue(flow_engine, fan_in(1))
    with flow_engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = 'done', finished_at = now() - interval '2 days' "
                "WHERE id = :id"
            ),
            {"id": ids["a"]},
        )
    with Session(flow_engine) as s:
        moved = ops.archive(s, older_than=ops.parse_duration("1h"))
        s.commit()
    assert moved == 0
    with flow_engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = 'done', finished_at = now() - interval '2 days' "
                "WHERE workflow_id = :w AND status = 'queued'"
            ),
            {"w": ids.id},
        )
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = 'done', finished_at = now() - interval '2 days' "
                "WHERE workflow_id = :w AND status = 'queued'"
            ),
            {"w": ids.id},
        )
    with Session(flow_engine) as s:
        moved = ops.archive(s, older_than=ops.parse_duration("1h"))
        s.commit()
    assert moved == 3
    assert scalar(flow_engine, "SELECT count(*) FROM jobs_workflow_edges") == 0


def fan_out(n: int) -> Workflow:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step")
    for i in range(n):
        flow.add(f"b{i}", "flow.step", after="a")
    return flow


def end_steps(engine: sa.Engine, where: str, ago: str, status: str = "done", **params: Any) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"UPDATE jobs SET status = '{status}', finished_at = now() - interval '{ago}' "
                f"WHERE {where}"
            ),
            params,
        )


def plain_jobs(engine: sa.Engine, n: int, ago: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobs (kind, payload, status, finished_at) SELECT 'flow.step', '{}', "
                f"'done', now() - interval '{ago}' FROM generate_series(1, :n)"
            ),
            {"n": n},
        )


def where_steps(engine: sa.Engine) -> dict[str, tuple[int, int]]:
    """workflow id -> (steps in jobs, steps in jobs_archive)."""
    found = rows(
        engine,
        "SELECT workflow_id::text AS w, sum(live) AS live, sum(archived) AS archived FROM ("
        " SELECT workflow_id, 1 AS live, 0 AS archived FROM jobs WHERE workflow_id IS NOT NULL"
        " UNION ALL SELECT workflow_id, 0, 1 FROM jobs_archive WHERE workflow_id IS NOT NULL"
        ") AS s GROUP BY workflow_id",
    )
    return {r.w: (r.live, r.archived) for r in found}


def test_the_archiver_moves_a_finished_workflow_bigger_than_a_batch_in_one_batch(
    flow_engine: sa.Engine,
) -> None:
    big = enqueue(flow_engine, fan_out(24))
    small = enqueue(flow_engine, fan_out(2))
    end_steps(flow_engine, "workflow_id IS NOT NULL", "2 days")
    plain_jobs(flow_engine, 15, "2 days")
    seen = []
    with Session(flow_engine) as s:
        for moved in ops.archive_batches(s, older_than=ops.parse_duration("1h"), batch=10):
            # After every committed batch each workflow is all in jobs or all archived.
            seen.append(moved)
            assert all(0 in split for split in where_steps(flow_engine).values())
    assert sum(seen) == 25 + 3 + 15
    assert max(seen) >= 25  # the big workflow's batch went past the batch size
    assert where_steps(flow_engine) == {str(big.id): (0, 25), str(small.id): (0, 3)}
    assert scalar(flow_engine, "SELECT count(*) FROM jobs") == 0


def test_the_archiver_waits_for_a_workflows_last_step_and_its_failed_steps_window(
    flow_engine: sa.Engine,
) -> None:
    young = enqueue(flow_engine, fan_out(3))
    end_steps(flow_engine, "workflow_id = :w", "2 days", w=young.id)
    end_steps(flow_engine, "id = :id", "1 minute", id=young["b2"])  # its last step: recent
    failed = enqueue(flow_engine, fan_out(3))
    end_steps(flow_engine, "workflow_id = :w", "2 days", w=failed.id)
    end_steps(flow_engine, "id = :id", "3 days", status="dead", w=failed.id, id=failed["b1"])
    with Session(flow_engine) as s:
        assert ops.archive(s, older_than=ops.parse_duration("1h"), batch=2) == 0
        # Dead jobs kept for 4 days: the failed workflow stays whole, all of it.
        assert (
            ops.archive(
                s,
                older_than=ops.parse_duration("1h"),
                batch=2,
                include_dead_after=ops.parse_duration("4d"),
            )
            == 0
        )
        assert (
            ops.archive(
                s,
                older_than=ops.parse_duration("1h"),
                batch=2,
                include_dead_after=ops.parse_duration("1d"),
            )
            == 4
        )
    assert where_steps(flow_engine) == {str(young.id): (4, 0), str(failed.id): (0, 4)}


def test_a_workflow_with_a_step_locked_elsewhere_is_left_whole_for_the_next_batch(
    flow_engine: sa.Engine,
) -> None:
    ids = enqueue(flow_engine, fan_out(3))
    end_steps(flow_engine, "workflow_id IS NOT NULL", "2 days")
    plain_jobs(flow_engine, 2, "2 days")
    with flow_engine.connect() as other:
        # Someone (an operator's retry, another archiver) holds one step's row lock.
        other.execute(sa.text("SELECT 1 FROM jobs WHERE id = :id FOR UPDATE"), {"id": ids["b1"]})
        with Session(flow_engine) as s:
            assert ops.archive(s, older_than=ops.parse_duration("1h")) == 2
        assert where_steps(flow_engine) == {str(ids.id): (4, 0)}
        other.rollback()
    with Session(flow_engine) as s:
        assert ops.archive(s, older_than=ops.parse_duration("1h")) == 4
    assert where_steps(flow_engine) == {str(ids.id): (0, 4)}


def test_an_archiver_killed_mid_statement_leaves_the_whole_workflow_in_jobs(
    flow_engine: sa.Engine,
) -> None:
    ids = enqueue(flow_engine, fan_out(12))
    end_steps(flow_engine, "workflow_id IS NOT NULL", "2 days")
    blocker = flow_engine.connect()
    # The archive's partition of this week (the initial one, revision 0022) locked
    # against writes: the archiver's INSERT waits for it when its first row is routed
    # there, after its DELETE took the steps out of jobs, until its backend is killed.
    blocker.execute(sa.text("LOCK TABLE jobs_archive_p_initial IN SHARE MODE"))
    failed: list[BaseException] = []

    def archive() -> None:
        try:
            with Session(flow_engine) as s:
                ops.archive(s, older_than=ops.parse_duration("1h"), batch=5)
        except sa.exc.OperationalError as exc:
            failed.append(exc)

    worker = threading.Thread(target=archive)
    worker.start()
    try:
        pid = wait_for(
            lambda: scalar(
                flow_engine,
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                # The archiver's statement (its text is cut at 1 KiB, before the INSERT).
                " AND query LIKE 'WITH picked AS MATERIALIZED%' AND datname = current_database()",
            ),
            message="the archiver to wait mid-statement",
        )
        assert scalar(flow_engine, "SELECT pg_terminate_backend(:p)", p=pid)
        worker.join(timeout=30)
    finally:
        blocker.rollback()
        blocker.close()
    assert failed and not worker.is_alive()
    assert where_steps(flow_engine) == {str(ids.id): (13, 0)}
    with Session(flow_engine) as s:
        assert ops.archive(s, older_than=ops.parse_duration("1h"), batch=5) == 13
    assert where_steps(flow_engine) == {str(ids.id): (0, 13)}


def test_an_unfinished_workflows_old_steps_do_not_hold_up_other_jobs(
    flow_engine: sa.Engine,
) -> None:
    ids = enqueue(flow_engine, fan_out(4))
    end_steps(flow_engine, "workflow_id = :w AND step <> 'b3'", "3 days", w=ids.id)
    plain_jobs(flow_engine, 3, "2 days")
    with Session(flow_engine) as s:
        # Batches of 2: the workflow's four older rows come first in finished_at order.
        assert ops.archive(s, older_than=ops.parse_duration("1h"), batch=2) == 3
    assert where_steps(flow_engine) == {str(ids.id): (5, 0)}


def test_prune_deletes_an_archived_workflow_as_a_unit(flow_engine: sa.Engine) -> None:
    big = enqueue(flow_engine, fan_out(14))
    end_steps(flow_engine, "workflow_id = :w", "10 days", w=big.id)
    end_steps(flow_engine, "id = :id", "2 days", id=big["b13"])
    plain_jobs(flow_engine, 3, "10 days")
    with Session(flow_engine) as s:
        assert ops.archive(s, older_than=ops.parse_duration("1d")) == 18
        # Its last step ended 2 days ago: none of it goes with the 5-day cutoff.
        assert ops.prune(s, older_than=ops.parse_duration("5d"), batch=4) == 3
        assert where_steps(flow_engine) == {str(big.id): (0, 15)}
        assert ops.prune(s, older_than=ops.parse_duration("1d"), batch=4) == 15
    assert where_steps(flow_engine) == {}


def append_late_step(conn: sa.Connection, workflow_id: uuid.UUID) -> WorkflowIds:
    more = Workflow(registry=registry, append_to=workflow_id)
    more.add("late", "flow.step", after="a")
    return more.enqueue(conn)


def test_a_step_appended_while_the_archiver_runs_keeps_its_workflow_whole(
    flow_engine: sa.Engine,
) -> None:
    ids = enqueue(flow_engine, fan_out(2))
    end_steps(flow_engine, "workflow_id = :w", "2 days", w=ids.id)
    plain_jobs(flow_engine, 2, "2 days")
    with flow_engine.connect() as appender:
        # Not committed yet when the archiver's snapshot is taken: the archiver cannot
        # see the new step, so only the append's own lock keeps the workflow whole.
        append_late_step(appender, ids.id)
        with Session(flow_engine) as s:
            assert ops.archive(s, older_than=ops.parse_duration("1h")) == 2
        appender.commit()
    assert where_steps(flow_engine) == {str(ids.id): (4, 0)}
    assert statuses(flow_engine, ids)["late"] == "queued"
    # Archived steps (its dependency "a" here) are appended to the same way: prune waits.
    end_steps(flow_engine, "workflow_id = :w", "10 days", w=ids.id)
    with Session(flow_engine) as s:
        assert ops.archive(s, older_than=ops.parse_duration("1h")) == 4
    with flow_engine.connect() as appender:
        later = Workflow(registry=registry, append_to=ids.id)
        later.add("later", "flow.step", after="a")
        later.enqueue(appender)
        with Session(flow_engine) as s:
            assert ops.prune(s, older_than=ops.parse_duration("1d")) == 2  # the plain jobs
        appender.commit()
    assert where_steps(flow_engine) == {str(ids.id): (1, 4)}


def test_an_append_waits_for_an_archiver_that_locked_the_workflow_first(
    flow_engine: sa.Engine,
) -> None:
    ids = enqueue(flow_engine, fan_out(2))
    end_steps(flow_engine, "workflow_id = :w", "2 days", w=ids.id)
    archiver = Session(flow_engine)
    done = threading.Event()
    try:
        batch = admin.archive_batch(done_older_than=3600, dead_older_than=None, batch=10)
        moved = archiver.execute(batch).all()
        assert len(moved) == 3  # not committed: its row locks are held

        def append() -> None:
            with flow_engine.connect() as conn:
                append_late_step(conn, ids.id)
                conn.commit()
            done.set()

        thread = threading.Thread(target=append)
        thread.start()
        assert not done.wait(0.5)  # waits on the archiver's row locks
        archiver.commit()
        thread.join(30)
        assert done.is_set()
    finally:
        archiver.close()
    # Serialized: the workflow was archived whole, then the step appended to it (its
    # dependency read from the archive).
    assert where_steps(flow_engine) == {str(ids.id): (1, 3)}
    assert statuses(flow_engine, ids) == {"late": "queued"}


# --- the fence, the sweep ------------------------------------------------------------


def claim_step(engine: sa.Engine, job_id: int, worker: str = "w1") -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = 'running', worker = :w, attempts = attempts + 1, "
                "max_attempts = 3, locked_until = now() + interval '1 minute' WHERE id = :id"
            ),
            {"id": job_id, "w": worker},
        )


def done_mark(engine: sa.Engine, job_id: int, attempt: int, worker: str = "w1") -> int:
    with engine.begin() as conn:
        stmt = lease.complete_one(worker=worker, job_id=job_id, attempt=attempt)
        return conn.execute(stmt).rowcount


def test_a_stale_workers_done_mark_releases_nothing_and_the_current_one_releases_once(
    flow_engine: sa.Engine,
) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step")
    flow.add("b", "flow.step", after="a")
    ids = enqueue(flow_engine, flow)
    claim_step(flow_engine, ids["a"], "stale")
    claim_step(flow_engine, ids["a"], "w2")  # the lease expired and w2 took over: attempt 2
    assert done_mark(flow_engine, ids["a"], attempt=1, worker="stale") == 0
    assert statuses(flow_engine, ids) == {"a": "running", "b": "waiting"}
    assert done_mark(flow_engine, ids["a"], attempt=2, worker="w2") == 1
    assert statuses(flow_engine, ids) == {"a": "done", "b": "queued"}
    assert done_mark(flow_engine, ids["a"], attempt=2, worker="w2") == 0


def test_the_sweep_releases_a_step_whose_release_was_missed(flow_engine: sa.Engine) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step")
    flow.add("b", "flow.step", after="a")
    flow.add("c", "flow.step", after="b")
    ids = enqueue(flow_engine, flow)
    with flow_engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE jobs DISABLE TRIGGER jobs_workflow_step_ended"))
        conn.execute(
            sa.text("UPDATE jobs SET status = 'done', finished_at = now() WHERE id = :id"),
            {"id": ids["a"]},
        )
        conn.execute(sa.text("ALTER TABLE jobs ENABLE TRIGGER jobs_workflow_step_ended"))
    assert statuses(flow_engine, ids)["b"] == "waiting"
    with flow_engine.begin() as conn:
        assert workflows.sweep(conn) == 1
    with flow_engine.begin() as conn:
        assert workflows.sweep(conn) == 0
    assert statuses(flow_engine, ids) == {"a": "done", "b": "queued", "c": "waiting"}


def edge_outcomes(engine: sa.Engine, ids: WorkflowIds) -> dict[str, str | None]:
    """ "parent>child" -> the edge's parent_outcome."""
    found = rows(
        engine,
        "SELECT p.step || '>' || c.step AS edge, e.parent_outcome FROM jobs_workflow_edges AS e"
        " JOIN jobs AS c ON c.id = e.child_id JOIN jobs AS p ON p.id = e.parent_id"
        " WHERE e.workflow_id = :w",
        w=ids.id,
    )
    return {r.edge: r.parent_outcome for r in found}


def test_a_fan_outs_children_are_released_without_writing_their_edges(
    flow_engine: sa.Engine,
) -> None:
    flow = fan_out(2)
    flow.add("c", "flow.step", after=["b0", "b1"])
    ids = enqueue(flow_engine, flow)
    end = "UPDATE jobs SET status = 'done', finished_at = now() WHERE id = :id"
    with flow_engine.begin() as conn:
        conn.execute(sa.text(end), {"id": ids["a"]})
    # b0 and b1 depend on "a" alone: released, their edges left unwritten (revision
    # 0018); c waits on two, whose edges are written as each ends.
    assert statuses(flow_engine, ids) == {
        "a": "done",
        "b0": "queued",
        "b1": "queued",
        "c": "waiting",
    }
    assert edge_outcomes(flow_engine, ids) == {
        "a>b0": None,
        "a>b1": None,
        "b0>c": None,
        "b1>c": None,
    }
    with Session(flow_engine) as s:
        waits = {st.step: st.waiting_on for st in ops.workflow_status(s, ids.id).steps}
    assert waits == {"a": (), "b0": (), "b1": (), "c": ("b0", "b1")}
    with flow_engine.begin() as conn:
        conn.execute(sa.text(end), {"id": ids["b0"]})
    assert edge_outcomes(flow_engine, ids)["b0>c"] == "done"
    assert statuses(flow_engine, ids)["c"] == "waiting"
    # The sweep takes an unwritten edge whose child no longer waits as resolved: with
    # room for one parent, it finds the missed one, not "a".
    missed = Workflow(registry=registry)
    missed.add("x", "flow.step")
    missed.add("y", "flow.step", after="x")
    other = enqueue(flow_engine, missed)
    with flow_engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE jobs DISABLE TRIGGER jobs_workflow_step_ended"))
        conn.execute(sa.text(end), {"id": other["x"]})
        conn.execute(sa.text("ALTER TABLE jobs ENABLE TRIGGER jobs_workflow_step_ended"))
    with flow_engine.begin() as conn:
        assert workflows.sweep(conn, limit=1) == 1
    assert statuses(flow_engine, other) == {"x": "done", "y": "queued"}
    # Retried, a child released alone runs again at once (its parent has ended)...
    end_steps(flow_engine, "id = :id", "1 minute", status="dead", id=ids["b1"])
    with Session(flow_engine) as s:
        ops.retry_jobs(s, ids=[ids["b1"]])
        s.commit()
    assert statuses(flow_engine, ids)["b1"] == "queued"
    # ...and, retried with its parent, waits for it.
    end_steps(flow_engine, "id IN (:a, :b)", "1 minute", status="dead", a=ids["a"], b=ids["b1"])
    with Session(flow_engine) as s:
        ops.retry_jobs(s, ids=[ids["a"], ids["b1"]])
        s.commit()
    assert statuses(flow_engine, ids)["a"] == "queued"
    assert statuses(flow_engine, ids)["b1"] == "waiting"


def test_two_parents_ending_in_concurrent_transactions_release_their_child_once(
    flow_engine: sa.Engine,
) -> None:
    flow = Workflow(registry=registry)
    flow.add("p1", "flow.step")
    flow.add("p2", "flow.step")
    flow.add("c", "flow.step", after=["p1", "p2"])
    ids = enqueue(flow_engine, flow)
    end = sa.text("UPDATE jobs SET status = 'done', finished_at = now() WHERE id = :id")
    first = flow_engine.connect()
    second = flow_engine.connect()
    try:
        first.execute(end, {"id": ids["p1"]})  # holds the child's lock until it commits
        done = threading.Event()

        def other() -> None:
            second.execute(end, {"id": ids["p2"]})
            second.commit()
            done.set()

        thread = threading.Thread(target=other)
        thread.start()
        assert not done.wait(0.5)  # waits for the first transaction, on the child's row
        first.commit()
        thread.join(30)
        assert done.is_set()
    finally:
        first.close()
        second.close()
    assert statuses(flow_engine, ids) == {"p1": "done", "p2": "done", "c": "queued"}


# --- operating -----------------------------------------------------------------------


def test_workflow_status_shows_each_step_and_what_it_waits_on(flow_engine: sa.Engine) -> None:
    ids = enqueue(flow_engine, fan_in(2))
    with Session(flow_engine) as s:
        status = ops.workflow_status(s, str(ids.id))
    assert status.counts == {"queued": 1, "waiting": 3}
    assert not status.finished
    by_step = {step.step: step for step in status.steps}
    assert by_step["c"].waiting_on == ("b0", "b1")
    assert by_step["a"].waiting_on == ()
    assert by_step["c"].depends_on == ("b0", "b1")
    assert by_step["b0"].depends_on == ("a",)
    assert by_step["a"].depends_on == ()


def test_workflow_status_keeps_ended_dependencies_and_a_step_knows_its_workflow(
    flow_engine: sa.Engine,
) -> None:
    ids = enqueue(flow_engine, fan_in(2))
    with Session(flow_engine) as s:
        ops.cancel(s, [ids["a"]])
        s.commit()
        status = ops.workflow_status(s, ids.id)
        job = ops.get_job(s, ids["b0"])
    by_step = {step.step: step for step in status.steps}
    assert by_step["b0"].status == models.JobStatus.CANCELLED
    assert by_step["b0"].waiting_on == ()
    assert by_step["b0"].depends_on == ("a",)
    assert (job.workflow_id, job.step) == (ids.id, "b0")


def test_workflow_status_async_reads_the_same_steps(db_url: URL, flow_engine: sa.Engine) -> None:
    ids = enqueue(flow_engine, fan_in(2))

    async def read() -> ops.WorkflowStatus:
        engine = create_async_engine(db_url)
        try:
            async with AsyncSession(engine) as s:
                return await ops.workflow_status_async(s, ids.id)
        finally:
            await engine.dispose()

    status = asyncio.run(read())
    assert {st.step: st.depends_on for st in status.steps}["c"] == ("b0", "b1")


def test_workflow_status_of_an_unknown_or_malformed_id_says_so(flow_engine: sa.Engine) -> None:
    with Session(flow_engine) as s:
        with pytest.raises(JobNotFoundError, match="no workflow with id"):
            ops.workflow_status(s, uuid.uuid4())
        with pytest.raises(ConfigError, match="a workflow id is a UUID, got 'nope'"):
            ops.workflow_status(s, "nope")


def test_cancel_workflow_cancels_every_waiting_and_queued_step_in_one_transaction(
    flow_engine: sa.Engine,
) -> None:
    ids = enqueue(flow_engine, fan_in(2))
    with Session(flow_engine) as s:
        done = ops.cancel_workflow(s, ids.id)
        s.commit()
    assert done.cancelled == tuple(sorted(ids.steps.values()))
    assert set(statuses(flow_engine, ids).values()) == {"cancelled"}
    assert last_error(flow_engine, ids["c"]) == "cancelled by an operator with its whole workflow"


def test_retry_workflow_runs_the_failed_steps_again_and_their_dependents_wait(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step", {"value": 1})
    flow.add("bad", "flow.fail", after="a")
    flow.add("c", "flow.step", after="bad")
    ids = enqueue(flow_engine, flow)
    drain(db_url)
    assert statuses(flow_engine, ids) == {"a": "done", "bad": "dead", "c": "cancelled"}
    with flow_engine.begin() as conn:  # the operator fixed the cause: now it succeeds
        conn.execute(
            sa.text("UPDATE jobs SET kind = 'flow.step' WHERE id = :id"), {"id": ids["bad"]}
        )
    with Session(flow_engine) as s:
        retried = ops.retry_workflow(s, ids.id)
        s.commit()
    assert retried == (ids["bad"], ids["c"])
    assert statuses(flow_engine, ids) == {"a": "done", "bad": "queued", "c": "waiting"}
    drain(db_url)
    assert set(statuses(flow_engine, ids).values()) == {"done"}
    with Session(flow_engine) as s:
        again = ops.retry_workflow(s, ids.id, mode="failed_and_downstream")
        assert again == ()
        with pytest.raises(ConfigError, match="mode must be one of"):
            ops.retry_workflow(s, ids.id, mode="everything")


def fix(engine: sa.Engine, *job_ids: int) -> None:
    """The operator fixed the cause: the step now succeeds when it runs again."""
    with engine.begin() as conn:
        for job_id in job_ids:
            conn.execute(
                sa.text("UPDATE jobs SET kind = 'flow.step' WHERE id = :id"), {"id": job_id}
            )


def test_retrying_a_dead_step_reopens_the_steps_it_cancelled_and_the_workflow_resumes(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step", {"value": 1})
    flow.add("bad", "flow.fail", after="a")
    flow.add("c", "flow.step", after="bad")
    flow.add("d", "flow.step", after="c")
    flow.add("side", "flow.step", after="a")
    ids = enqueue(flow_engine, flow)
    drain(db_url)
    assert statuses(flow_engine, ids) == {
        "a": "done",
        "bad": "dead",
        "c": "cancelled",
        "d": "cancelled",
        "side": "done",
    }
    fix(flow_engine, ids["bad"])
    with Session(flow_engine) as s:
        assert ops.retry_jobs(s, ids=[ids["bad"]]) == 1
        s.commit()
    assert statuses(flow_engine, ids) == {
        "a": "done",
        "bad": "queued",
        "c": "waiting",
        "d": "waiting",
        "side": "done",
    }
    with Session(flow_engine) as s:
        waits = {st.step: st.waiting_on for st in ops.workflow_status(s, ids.id).steps}
    assert waits["c"] == ("bad",) and waits["d"] == ("c",)
    drain(db_url)
    assert set(statuses(flow_engine, ids).values()) == {"done"}


def test_retrying_a_step_cancelled_by_its_failed_dependency_alone_is_refused_naming_it(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step", {"value": 1})
    flow.add("bad", "flow.fail", after="a")
    flow.add("c", "flow.step", after="bad")
    flow.add("d", "flow.step", after="c")
    ids = enqueue(flow_engine, flow)
    drain(db_url)
    ended = {"a": "done", "bad": "dead", "c": "cancelled", "d": "cancelled"}
    assert statuses(flow_engine, ids) == ended
    fix(flow_engine, ids["bad"])
    message = (
        f"step 'c' (job {ids['c']}) was not retried: its dependency 'bad' (job {ids['bad']}) "
        f"ended dead, and it runs only after that succeeds; retry job {ids['bad']} instead "
        f"(sqla-jobs retry {ids['bad']}; the steps its failure cancelled wait for it again), "
        f"or with it, or the whole workflow (sqla-jobs workflow retry {ids.id}). "
        "Nothing was retried."
    )
    with Session(flow_engine) as s:
        with pytest.raises(ConfigError) as refused:
            ops.retry_jobs(s, ids=[ids["c"]], status="cancelled")
        assert str(refused.value) == message
        s.commit()  # the caller commits anyway: the call changed nothing
        with pytest.raises(ConfigError, match=re.escape(message)):
            # Every cancelled job (c and d; d's dependency c is among them), not the dead
            # dependency of c: refused too.
            ops.retry_jobs(s, status="cancelled")
    assert statuses(flow_engine, ids) == ended
    refused_cli = cli(db_url, "retry", str(ids["c"]))
    assert refused_cli.returncode != 0 and message in " ".join(refused_cli.stderr.split())
    assert statuses(flow_engine, ids) == ended
    # With its dependency, in one call: the dependency is queued, the step waits for it.
    with Session(flow_engine) as s:
        assert ops.retry_jobs(s, ids=[ids["c"], ids["bad"]], status=["dead", "cancelled"]) == 2
        s.commit()
    assert statuses(flow_engine, ids) == {
        "a": "done",
        "bad": "queued",
        "c": "waiting",
        "d": "waiting",
    }
    drain(db_url)
    assert set(statuses(flow_engine, ids).values()) == {"done"}


def test_a_retried_steps_dependent_that_another_failed_step_cancelled_stays_cancelled(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    flow = Workflow(registry=registry)
    flow.add("x", "flow.fail")
    flow.add("y", "flow.fail")
    flow.add("c", "flow.step", after=["x", "y"])
    flow.add("d", "flow.step", after="c")
    ids = enqueue(flow_engine, flow)
    drain(db_url)
    assert statuses(flow_engine, ids) == {
        "x": "dead",
        "y": "dead",
        "c": "cancelled",
        "d": "cancelled",
    }
    fix(flow_engine, ids["x"], ids["y"])
    with Session(flow_engine) as s:
        assert ops.retry_jobs(s, ids=[ids["x"]]) == 1
        s.commit()
    # c still lacks y (dead): it and d stay cancelled, nothing waits for a step that
    # will not run; d's reason names c again.
    assert statuses(flow_engine, ids) == {
        "x": "queued",
        "y": "dead",
        "c": "cancelled",
        "d": "cancelled",
    }
    assert last_error(flow_engine, ids["d"]).startswith(
        f'upstream step "c" (job {ids["c"]}) ended cancelled'
    )
    drain(db_url)
    assert statuses(flow_engine, ids) == {
        "x": "done",
        "y": "dead",
        "c": "cancelled",
        "d": "cancelled",
    }
    # Retrying y later resumes the rest: x's edge now says done.
    with Session(flow_engine) as s:
        assert ops.retry_jobs(s, ids=[ids["y"]]) == 1
        s.commit()
    assert statuses(flow_engine, ids) == {
        "x": "done",
        "y": "queued",
        "c": "waiting",
        "d": "waiting",
    }
    drain(db_url)
    assert set(statuses(flow_engine, ids).values()) == {"done"}


def test_retrying_a_step_leaves_a_dependent_an_operator_cancelled_cancelled(
    flow_engine: sa.Engine,
) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step")
    flow.add("b", "flow.step", after="a")
    ids = enqueue(flow_engine, flow)
    with Session(flow_engine) as s:
        ops.cancel_jobs(s, ids=[ids["a"]])  # b: cancelled because of a
        s.commit()
    with flow_engine.begin() as conn:  # as if an operator had cancelled b instead
        conn.execute(
            sa.text("UPDATE jobs SET last_error = 'not wanted' WHERE id = :id"), {"id": ids["b"]}
        )
    with Session(flow_engine) as s:
        assert ops.retry_jobs(s, ids=[ids["a"]], status="cancelled") == 1
        s.commit()
    assert statuses(flow_engine, ids) == {"a": "queued", "b": "cancelled"}


def test_retry_downstream_reruns_done_dependents_too(flow_engine: sa.Engine) -> None:
    flow = Workflow(registry=registry, when="finished")
    flow.add("a", "flow.step")
    flow.add("b", "flow.step", after="a")
    ids = enqueue(flow_engine, flow)
    with flow_engine.begin() as conn:
        for step, status in (("a", "dead"), ("b", "done")):
            conn.execute(
                sa.text(f"UPDATE jobs SET status = '{status}', finished_at = now() WHERE id = :id"),
                {"id": ids[step]},
            )
    with Session(flow_engine) as s:
        assert ops.retry_workflow(s, ids.id) == (ids["a"],)
        s.rollback()
        assert ops.retry_workflow(s, ids.id, mode="failed_and_downstream") == (ids["a"], ids["b"])
        s.commit()
    assert statuses(flow_engine, ids) == {"a": "queued", "b": "waiting"}


def test_cli_workflow_show_cancel_and_retry(db_url: URL, flow_engine: sa.Engine) -> None:
    ids = enqueue(flow_engine, fan_in(1))
    shown = ok(db_url, "workflow", "show", str(ids.id))
    assert f"workflow {ids.id}: 1 queued, 2 waiting" in shown
    assert "WAITING ON" in shown and "b0" in shown
    assert "cancelled 3 step(s)" in ok(db_url, "workflow", "cancel", str(ids.id))
    assert "retried 3 step(s)" in ok(db_url, "workflow", "retry", str(ids.id))
    assert statuses(flow_engine, ids) == {"a": "queued", "b0": "waiting", "c": "waiting"}
    shown = ok(db_url, "workflow", "show", str(ids.id), "--json")
    assert json.loads(shown)["counts"] == {"queued": 1, "waiting": 2}


def test_stats_count_waiting_steps_apart_from_ready_and_scheduled(
    db_url: URL, flow_engine: sa.Engine
) -> None:
    enqueue(flow_engine, fan_in(2))  # a queued; b0, b1 (flow.step) and c (flow.sum) waiting
    with Session(flow_engine) as s:
        exact = ops.stats(s)
        sampled = ops.stats(s, exact_up_to=2)  # 3 waiting > 2: an estimate
    assert exact.total.waiting == 3 and exact.total.ready == 1
    assert {k.kind: k.waiting for k in exact.by_kind} == {"flow.step": 2, "flow.sum": 1}
    assert "waiting" not in exact.estimated
    assert "waiting" in sampled.estimated and sampled.total.waiting >= 3
    table = ok(db_url, "stats")
    header = next(line for line in table.splitlines() if line.startswith("QUEUE")).split()
    total = next(line for line in table.splitlines() if line.startswith("TOTAL")).split()
    assert total[1 + header.index("WAITING") - 2] == "3"
    assert json.loads(ok(db_url, "stats", "--json"))["total"]["waiting"] == 3


def test_steps_appended_to_a_running_workflow_wait_for_its_steps_or_run_at_once(
    flow_engine: sa.Engine,
) -> None:
    flow = Workflow(registry=registry)
    flow.add("a", "flow.step")
    flow.add("b", "flow.step", after="a")
    ids = enqueue(flow_engine, flow)
    claim_step(flow_engine, ids["b"])  # b "runs" (a test shortcut: a is not done)
    with flow_engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET status = 'done' WHERE id = :id"), {"id": ids["a"]})
    more = Workflow(registry=registry, append_to=ids["b"])  # from b's handler: its job id
    more.add("after_a", "flow.step", after="a")  # a already ended: released at once
    more.add("after_b", "flow.step", after="b")  # b is running: waits for it
    with Session(flow_engine) as s:
        added = more.enqueue(s)
        s.commit()
    assert added.id == ids.id
    assert statuses(flow_engine, ids) == {
        "a": "done",
        "b": "running",
        "after_a": "queued",
        "after_b": "waiting",
    }
    assert done_mark(flow_engine, ids["b"], attempt=1) == 1
    assert statuses(flow_engine, ids)["after_b"] == "queued"


def leaves(engine: sa.Engine, ids: WorkflowIds) -> dict[str, bool | None]:
    found = rows(engine, "SELECT step, workflow_leaf FROM jobs WHERE workflow_id = :w", w=ids.id)
    return {r.step: r.workflow_leaf for r in found}


def test_a_step_no_step_depends_on_is_a_leaf_until_a_step_is_appended_after_it(
    flow_engine: sa.Engine,
) -> None:
    # A leaf's done-mark is not listed by the row trigger (revision 0021): nothing to
    # resolve. A step that is anyone's parent never is one.
    flow = fan_out(2)
    flow.add("c", "flow.step", after="b0")
    ids = enqueue(flow_engine, flow)
    assert leaves(flow_engine, ids) == {"a": False, "b0": False, "b1": True, "c": True}
    more = Workflow(registry=registry, append_to=ids.id)
    more.add("d", "flow.step", after="b1")
    more.add("e", "flow.step", after="d")
    added = enqueue(flow_engine, more)
    assert leaves(flow_engine, added) == {
        **{"a": False, "b0": False, "c": True},
        **{"b1": False, "d": False, "e": True},
    }


def test_a_step_appended_by_a_leaf_after_itself_is_released_by_its_done_mark(
    flow_engine: sa.Engine,
) -> None:
    # The handler's transaction appends after its own step, then the worker marks that
    # step done in the same transaction: the done-mark found a leaf (not listed), and the
    # append's deferred trigger resolves it at commit.
    ids = enqueue(flow_engine, fan_out(1))
    end_steps(flow_engine, "id = :id", "1 second", id=ids["a"])
    claim_step(flow_engine, ids["b0"])
    with flow_engine.begin() as conn:
        more = Workflow(registry=registry, append_to=ids["b0"])
        more.add("next", "flow.step", after="b0")
        more.enqueue(conn)
        done = conn.execute(lease.complete_one(worker="w1", job_id=ids["b0"], attempt=1))
        assert done.rowcount == 1
    assert statuses(flow_engine, ids) == {"a": "done", "b0": "done", "next": "queued"}


def test_a_step_appended_after_a_leaf_that_ended_meanwhile_is_released_at_commit(
    flow_engine: sa.Engine,
) -> None:
    # The leaf's done-mark (not listed: a leaf) commits after the append read it running
    # and before the append commits: the append's commit resolves it, not the sweep.
    ids = enqueue(flow_engine, fan_out(1))
    end_steps(flow_engine, "id = :id", "1 second", id=ids["a"])
    claim_step(flow_engine, ids["b0"])
    with flow_engine.connect() as worker, flow_engine.connect() as appender:
        done = worker.execute(lease.complete_one(worker="w1", job_id=ids["b0"], attempt=1))
        assert done.rowcount == 1
        more = Workflow(registry=registry, append_to=ids.id)
        more.add("next", "flow.step", after="b0")
        more.enqueue(appender)
        worker.commit()
        waits = sa.text("SELECT status::text FROM jobs WHERE workflow_id = :w AND step = 'next'")
        assert appender.execute(waits, {"w": ids.id}).scalar() == "waiting"
        appender.commit()
    assert statuses(flow_engine, ids) == {"a": "done", "b0": "done", "next": "queued"}
    assert leaves(flow_engine, ids)["b0"] is False


def test_appending_checks_names_against_the_existing_workflow(flow_engine: sa.Engine) -> None:
    ids = enqueue(flow_engine, fan_in(1))
    with Session(flow_engine) as s:
        taken = Workflow(append_to=ids.id)
        taken.add("a", "flow.step")
        with pytest.raises(WorkflowError, match="already has a step named 'a'"):
            taken.enqueue(s)
        unknown = Workflow(append_to=str(ids.id))
        unknown.add("x", "flow.step", after="zz")
        with pytest.raises(WorkflowError, match="depends on 'zz', which is not a step"):
            unknown.enqueue(s)
        nowhere = Workflow(append_to=uuid.uuid4())
        nowhere.add("x", "flow.step")
        with pytest.raises(WorkflowError, match=r"cannot append to workflow .*: it has no step"):
            nowhere.enqueue(s)
    with pytest.raises(WorkflowError, match="append_to is a workflow id"):
        Workflow(append_to="not-a-uuid")
    assert scalar(flow_engine, "SELECT count(*) FROM jobs") == 3
