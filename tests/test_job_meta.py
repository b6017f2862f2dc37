"""Job metadata (#27, revision 0013): ``meta`` and ``tags`` from every route that creates a
job, checked where they enter, read by the handler (``job.meta``, ``job.tags``) in a real
worker, shown and filtered by ``ops``, the CLI and the dashboard, kept by the archive."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, start_worker, stop, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from test_ops_cli import cli, ok

from sqla_jobs import (
    InvalidJobError,
    Job,
    NewJob,
    Registry,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    ops,
    periodic,
)
from sqla_jobs.exceptions import WorkflowError
from sqla_jobs.validation import MAX_META_BYTES, MAX_TAG_LENGTH, MAX_TAGS
from sqla_jobs.workflows import Workflow

META = {"tenant": 7, "request": "r-1"}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TAGS = ["vip", "signup"]


def stored(engine: sa.Engine, job_id: int | None) -> tuple[Any, Any]:
    assert job_id is not None
    [row] = rows(engine, "SELECT meta, tags FROM jobs WHERE id = :id", id=job_id)
    return row.meta, row.tags


# --- checked where they enter -------------------------------------------------------

BAD: list[tuple[dict[str, Any], str]] = [
    ({"meta": ["tenant"]}, "meta must be a JSON object (a dict), got list"),
    ({"meta": {"at": datetime(2026, 1, 1)}}, "meta is not JSON-serializable: meta['at']"),
    ({"meta": {"n": float("nan")}}, "jsonb refuses NaN and infinity"),
    ({"meta": {1: "a"}}, "meta: the key 1 is an int, not a string"),
    ({"meta": {"a": "x\x00"}}, "meta must not contain NUL characters"),
    ({"meta": {"a": "x" * MAX_META_BYTES}}, f"meta is larger than {MAX_META_BYTES} bytes"),
    ({"tags": "vip"}, 'tags must be a list of strings, e.g. ["vip", "signup"], got str'),
    ({"tags": ["vip", 7]}, "each tag must be a string, got int"),
    ({"tags": [""]}, "each tag must be a non-empty string without NUL, got ''"),
    ({"tags": ["x" * (MAX_TAG_LENGTH + 1)]}, f"each tag must be at most {MAX_TAG_LENGTH}"),
    ({"tags": [f"t{n}" for n in range(MAX_TAGS + 1)]}, f"a job has at most {MAX_TAGS} tags"),
    (
        {"tags": {"vip", "nightly"}},
        "tags must be a list of strings, got a set, which has no order: give a list "
        "(e.g. sorted(tags))",
    ),
    (
        {"tags": ["a,b"]},
        "a tag must not contain a comma (tags are listed comma-separated, where it would "
        "read as two tags), got 'a,b'",
    ),
    (
        {"meta": {"traceparent": "00-bogus-bogus-01"}},
        'meta["traceparent"] is reserved for the job\'s trace context and must be a W3C '
        "traceparent (version 00: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, "
        'lowercase, ids not all zero, e.g. "00-4bf92f3577b34da6a3ce929d0e0e4736-'
        "00f067aa0ba902b7-01\"), got '00-bogus-bogus-01'",
    ),
    (
        {"meta": {"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"}},
        "ids not all zero",
    ),
    ({"meta": {"traceparent": 7}}, 'meta["traceparent"] is reserved'),
    (
        {"meta": {"tracestate": "vendor=1"}},
        'meta["tracestate"] is reserved for the job\'s trace context and needs a '
        'meta["traceparent"] it belongs to',
    ),
    (
        {"meta": {"traceparent": TRACEPARENT, "tracestate": "v=" + "x" * 511}},
        'meta["tracestate"] is reserved for the job\'s trace context and must be a W3C '
        "tracestate: a string of printable ASCII characters, at most 512 bytes as JSON, got str",
    ),
]


#: Test ids without spaces (the mutation script reads FAILED lines by id).
BAD_IDS = [
    "meta-list",
    "meta-datetime",
    "meta-nan",
    "meta-int-key",
    "meta-nul",
    "meta-too-large",
    "tags-string",
    "tags-int",
    "tags-empty",
    "tags-too-long",
    "tags-too-many",
    "tags-set",
    "tags-comma",
    "traceparent-malformed",
    "traceparent-zero-trace-id",
    "traceparent-not-a-string",
    "tracestate-alone",
    "tracestate-too-long",
]


@pytest.mark.parametrize(("options", "error"), BAD, ids=BAD_IDS)
def test_bad_metadata_is_refused_at_enqueue_and_the_transaction_stays_usable(
    session: Session, options: dict[str, Any], error: str
) -> None:
    with pytest.raises(InvalidJobError, match=None) as raised:
        enqueue(session, "k", {}, **options)
    assert error in str(raised.value)
    with pytest.raises(InvalidJobError) as raised:
        NewJob("k", **options)
    assert error in str(raised.value)
    with pytest.raises(InvalidJobError) as raised:
        Job(kind="k", payload={}, **options)
    assert error in str(raised.value)
    assert enqueue(session, "k") is not None  # nothing was sent; the transaction is fine


def test_tags_given_as_a_tuple_are_stored_in_the_order_given(
    engine: sa.Engine, session: Session
) -> None:
    job_id = enqueue(session, "k", tags=("nightly", "vip", "nightly"))
    session.commit()
    assert stored(engine, job_id) == (None, ["nightly", "vip"])


def test_a_schedule_with_bad_metadata_is_refused_naming_it() -> None:
    registry = Registry()
    handler = registry.handler("tick")(lambda session, payload: None)
    with pytest.raises(Exception, match="schedule 'tick': each tag must be a string"):
        registry.schedule("tick", "@hourly", handler, tags=[1])  # type: ignore[list-item]


def test_empty_metadata_is_stored_as_none_and_tags_keep_their_first_order(
    engine: sa.Engine, session: Session
) -> None:
    empty = enqueue(session, "k", meta={}, tags=[])
    doubled = enqueue(session, "k", tags=["b", "a", "b"])
    session.commit()
    assert stored(engine, empty) == (None, None)
    assert stored(engine, doubled) == (None, ["b", "a"])


# --- every route stores them ----------------------------------------------------------


def test_every_sync_route_stores_meta_and_tags(engine: sa.Engine, session: Session) -> None:
    registry = Registry()
    handler = registry.handler("meta.k", queue="q")(lambda session, payload: None)
    ids = [
        enqueue(session, "k", {}, meta=META, tags=TAGS),
        enqueue(session, "k", {}, meta=META, tags=TAGS, key="one", delay=5),
        handler.enqueue(session, {}, meta=META, tags=TAGS),
        registry.enqueue(session, "meta.k", meta=META, tags=TAGS),
    ]
    many = enqueue_many(
        session,
        [
            NewJob("k", meta=META, tags=TAGS),
            NewJob("k"),  # none, beside some
            handler.new({}, meta=META, tags=TAGS, key="two"),
        ],
    )
    # The ORM style: a plain job (enqueue's statement), a keyed one, a delayed one, and
    # more than a few (the ORM's own batched insert).
    objects = [Job(kind="k", payload={}, meta=META, tags=TAGS) for _ in range(5)]
    objects += [
        Job(kind="k", payload={}, key="three", meta=META, tags=TAGS),
        Job(kind="k", payload={}, delay=5, meta=META, tags=TAGS),
    ]
    session.add_all(objects)
    session.flush()
    lone = Job(kind="k", payload={}, meta=META, tags=TAGS)
    session.add(lone)
    session.commit()
    ids += [*many, *(o.id for o in objects), lone.id]
    found = {r.id: (r.meta, r.tags) for r in rows(engine, "SELECT id, meta, tags FROM jobs")}
    assert len(found) == len(ids) == 15
    without = [i for i, v in found.items() if v == (None, None)]
    assert len(without) == 1 and without[0] in many  # the NewJob given none
    assert all(v == (META, TAGS) for i, v in found.items() if i not in without), found
    assert lone.meta == META and lone.tags == TAGS


def test_async_routes_store_meta_and_tags(engine: sa.Engine, db_url: URL) -> None:
    async def main() -> list[int | None]:
        aengine = create_async_engine(db_url)
        try:
            async with AsyncSession(aengine) as session:
                one = await enqueue_async(session, "k", {}, meta=META, tags=TAGS)
                many = await enqueue_many_async(session, [NewJob("k", meta=META, tags=TAGS)])
                orm = Job(kind="k", payload={}, meta=META, tags=TAGS)
                session.add(orm)
                await session.flush()
                orm_id = orm.id
                await session.commit()
                return [one, *many, orm_id]
        finally:
            await aengine.dispose()

    for job_id in asyncio.run(main()):
        assert stored(engine, job_id) == (META, TAGS)


def test_periodic_ticks_carry_their_schedules_metadata(engine: sa.Engine) -> None:
    registry = Registry()
    registry.periodic(every=timedelta(minutes=1), meta={"source": "cron"}, tags=["periodic"])(
        registry.handler("meta.tick")(lambda session, payload: None)
    )
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    periodic.enqueue_due(engine, registry, now=t0)
    periodic.enqueue_due(engine, registry, now=t0 + timedelta(minutes=1))
    found = rows(engine, "SELECT meta, tags FROM jobs WHERE kind = 'meta.tick'")
    assert [(r.meta, r.tags) for r in found] == [({"source": "cron"}, ["periodic"])]


@pytest.mark.parametrize(("options", "error"), BAD, ids=BAD_IDS)
@pytest.mark.parametrize("with_registry", [False, True], ids=["plain", "registry"])
def test_bad_metadata_on_a_workflow_step_is_refused_at_add_naming_the_step(
    options: dict[str, Any], error: str, with_registry: bool
) -> None:
    registry = Registry()
    registry.handler("meta.k")(lambda session, payload: None)
    flow = Workflow(registry=registry if with_registry else None)
    flow.add("first", "meta.k")
    with pytest.raises(InvalidJobError, match=None) as raised:
        flow.add("second", "meta.k", **options)
    assert isinstance(raised.value, WorkflowError)
    assert str(raised.value).startswith("step 'second': ")
    assert error in str(raised.value)
    assert flow.steps == ("first",)  # the refused step was not added


def test_workflow_steps_store_their_meta_and_tags(engine: sa.Engine, session: Session) -> None:
    flow = Workflow()
    flow.add("a", "k", meta=META, tags=TAGS)
    flow.add("b", "k", after="a", tags=["b", "a", "b"])
    flow.add("c", "k", after="a", meta={}, tags=[])
    ids = flow.enqueue(session)
    more = Workflow(append_to=ids.id)
    more.add("d", "k", after="b", meta={"appended": True})
    appended = more.enqueue(session)
    session.commit()
    assert stored(engine, ids["a"]) == (META, TAGS)
    assert stored(engine, ids["b"]) == (None, ["b", "a"])
    assert stored(engine, ids["c"]) == (None, None)
    assert stored(engine, appended["d"]) == ({"appended": True}, None)
    assert [j.id for j in ops.list_jobs(session, tag="vip")] == [ids["a"]]


# --- the handler reads them -------------------------------------------------------------


def test_handlers_read_meta_and_tags_in_a_real_worker(engine: sa.Engine, db_url: URL) -> None:
    from metaapp import SETUP_SQL

    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP_SQL)
    with Session(engine) as session:
        ids = {
            kind: enqueue(session, kind, {}, meta=META, tags=TAGS)
            for kind in ("meta.thread", "meta.async", "meta.process")
        }
        bare = enqueue(session, "meta.thread")
        session.commit()
    proc = start_worker(db_url, app="metaapp:registry")
    try:
        wait_for(lambda: len(rows(engine, "SELECT job_id FROM seen")) == 4, message="4 runs")
    finally:
        out = stop(proc)
    seen = {r.job_id: (r.meta, r.tags) for r in rows(engine, "SELECT * FROM seen")}
    assert seen == {**{i: (META, TAGS) for i in ids.values()}, bare: ({}, [])}, out


# --- operators see and filter them ------------------------------------------------------


def test_list_jobs_filters_by_tag_and_meta_and_archived_jobs_keep_them(
    engine: sa.Engine, session: Session
) -> None:
    a = enqueue(session, "k", meta={"tenant": 7, "plan": "pro"}, tags=["vip", "signup"])
    b = enqueue(session, "k", meta={"tenant": 8}, tags=["signup"])
    c = enqueue(session, "k")
    session.commit()
    assert a is not None and c is not None

    def ids(**filters: Any) -> list[int]:
        return [j.id for j in ops.list_jobs(session, **filters)]

    assert ids(tag="signup") == [a, b]
    assert ids(tag=["signup", "vip"]) == [a]
    assert ids(meta={"tenant": 7}) == [a]
    assert ids(meta={"tenant": 8}, tag="signup") == [b]
    assert ids(meta={"tenant": 8}, tag="vip") == []
    assert ids(tag="signup", kind="k", status="queued") == [a, b]  # beside a leading filter
    record = ops.get_job(session, a)
    assert (record.meta, record.tags) == ({"tenant": 7, "plan": "pro"}, ["vip", "signup"])
    assert (ops.get_job(session, c).meta, ops.get_job(session, c).tags) == ({}, [])
    assert record.to_dict()["meta"] == {"tenant": 7, "plan": "pro"}

    session.execute(
        sa.text("UPDATE jobs SET status = 'done', finished_at = now() - interval '2 days'")
    )
    session.commit()
    assert ops.archive(session, older_than=timedelta(days=1)) == 3
    archived = ops.get_job(session, a)
    assert archived.archived and (archived.meta, archived.tags) == (record.meta, record.tags)


@pytest.mark.parametrize(
    ("filters", "error"),
    [
        ({"tag": ""}, "each tag must be a non-empty string, got ''"),
        ({"tag": []}, "tag must be a tag or a non-empty list of tags, got []"),
        ({"tag": [3]}, "each tag must be a non-empty string, got 3"),
        ({"meta": [1]}, "meta must be a JSON object (a dict) the meta contains, got [1]"),
    ],
)
def test_list_jobs_says_which_metadata_filter_is_wrong(
    session: Session, filters: dict[str, Any], error: str
) -> None:
    with pytest.raises(Exception) as raised:
        ops.list_jobs(session, **filters)
    assert error in str(raised.value)


def test_cli_lists_by_tag_and_meta_and_shows_them(
    engine: sa.Engine, session: Session, db_url: URL
) -> None:
    a = enqueue(session, "k", meta={"tenant": 7}, tags=["vip", "signup"])
    b = enqueue(session, "k", meta={"tenant": 8}, tags=["signup"])
    session.commit()

    def listed(*args: str) -> list[int]:
        data = json.loads(ok(db_url, "list", "--json", *args))
        return [j["id"] for j in data["jobs"]]

    assert listed("--tag", "signup") == [a, b]
    assert listed("--tag", "signup", "--tag", "vip") == [a]
    assert listed("--meta", '{"tenant": 8}') == [b]
    shown = ok(db_url, "show", str(a))
    assert "tags:            vip, signup" in shown
    assert 'meta:\n{\n  "tenant": 7\n}' in shown
    bad = cli(db_url, "list", "--meta", "[7]")
    assert bad.returncode != 0
    assert '--meta must be a JSON object, e.g. {"user": 7}, got list' in bad.stderr


def test_dashboard_jobs_page_filters_by_tag_and_meta(engine: sa.Engine, session: Session) -> None:
    import re

    from dashboard_client import Client

    from sqla_jobs.dashboard import create_app

    a = enqueue(session, "k", meta={"tenant": 7}, tags=["vip"])
    b = enqueue(session, "k", meta={"tenant": 8}, tags=["vip"])
    session.commit()
    client = Client(create_app(engine))
    try:

        def listed(query: str) -> list[int]:
            page = client.get(f"/jobs?{query}")
            assert page.status_code == 200, page.text
            found = re.findall(r'<td class="num"><a href="/jobs/(\d+)">', page.text)
            return [int(i) for i in found]

        assert listed("tag=vip") == [b, a]
        assert listed("meta=%7B%22tenant%22%3A+7%7D") == [a]
        bad = client.get("/jobs?meta=%5B1%5D")
        assert bad.status_code == 400
        assert "Meta contains (meta) must be a JSON object" in bad.text
        shown = client.get(f"/jobs/{a}").text
        assert "<h2>Metadata</h2>" in shown and "<code>vip</code>" in shown
    finally:
        client.close()
