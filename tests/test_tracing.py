"""OpenTelemetry tracing across the queue (#27): the enqueuing request's trace continues in
the worker's process span, in another process, through retries, async handlers,
``enqueue_many`` and periodic ticks.

The test process records its spans (the request's, the publish spans) with the SDK's
in-memory exporter; the worker (``otelapp``) writes its own to a file, one JSON line per
span, which the test reads.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import rows, start_worker, stop, url_text, wait_for
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otelapp import span_record
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_jobs import (
    InvalidJobError,
    Job,
    NewJob,
    Registry,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    periodic,
)
from sqla_jobs._otel import bounded_tracestate
from sqla_jobs.validation import MAX_META_BYTES, MAX_TRACE_CONTEXT_BYTES
from sqla_jobs.workflows import Workflow

_EXPORTER = InMemorySpanExporter()
RECORDED = "sqla_jobs.job.recorded_outcome"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The test process's spans; its tracer provider is set once per process."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def worker_spans(path: Path, count: int) -> list[dict[str, Any]]:
    def read() -> list[dict[str, Any]]:
        if not path.exists():
            return []
        found = [json.loads(line) for line in path.read_text().splitlines()]
        return found if len([s for s in found if s["kind"] == "CONSUMER"]) >= count else []

    return wait_for(read, message=f"{count} process spans")


def skewed_worker(db_url: URL, env: dict[str, str]) -> subprocess.Popen[str]:
    """A worker of ``otelapp`` whose wall clock is ``SQLA_JOBS_TEST_CLOCK_OFFSET`` off."""
    tests = Path(__file__).parent
    return subprocess.Popen(
        [sys.executable, str(tests / "skewed_worker.py"), "otelapp:registry"],
        env={
            **os.environ,
            "DATABASE_URL": url_text(db_url),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(tests), os.environ.get("PYTHONPATH")) if p
            ),
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_worker(
    db_url: URL,
    path: Path,
    processes: int,
    until: str | None = None,
    args: tuple[str, ...] = (),
    **env: str,
) -> list[dict[str, Any]]:
    """A worker of ``otelapp`` (with ``args``) until it exported ``processes`` process
    spans (and the engine's query ``until`` returns a row); its spans. With
    ``SQLA_JOBS_TEST_CLOCK_OFFSET`` in ``env``, its wall clock is that far off."""
    env = {"SQLA_JOBS_TEST_SPANS": str(path), **env}
    if "SQLA_JOBS_TEST_CLOCK_OFFSET" in env:
        proc = skewed_worker(db_url, env)
    else:
        proc = start_worker(db_url, *args, app="otelapp:registry", env=env)
    try:
        found = worker_spans(path, processes)
        if until is not None:
            engine = sa.create_engine(db_url)
            try:
                wait_for(lambda: rows(engine, until), message=until)
            finally:
                engine.dispose()
        return found
    finally:
        out = stop(proc)
        assert "Traceback" not in out or "boom" in out, out
        # The SDK's warnings of a span changed or ended twice (its end is handed over).
        assert "ended span" not in out, out


def traceparent(engine: sa.Engine, job_id: int | None) -> str:
    [row] = rows(engine, "SELECT meta FROM jobs WHERE id = :id", id=job_id)
    value = row.meta["traceparent"]
    assert isinstance(value, str)
    return value


def test_one_trace_runs_from_the_request_through_enqueue_to_the_handler_in_another_process(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("POST /signup") as request, Session(engine) as session:
        job_id = enqueue(session, "traced.ok", {"user": 7}, meta={"tenant": 7})
        session.commit()
    here = [span_record(s) for s in spans.get_finished_spans()]
    publish = next(s for s in here if s["name"] == "publish default")
    trace_id = f"{request.get_span_context().trace_id:032x}"
    assert publish["kind"] == "PRODUCER" and publish["trace_id"] == trace_id
    assert publish["parent_id"] == f"{request.get_span_context().span_id:016x}"
    assert traceparent(engine, job_id).startswith(f"00-{trace_id}-{publish['span_id']}-")

    found = run_worker(db_url, tmp_path / "spans.jsonl", 1)
    process = next(s for s in found if s["kind"] == "CONSUMER")
    assert process["name"] == "process default"
    assert process["trace_id"] == trace_id and process["parent_id"] == publish["span_id"]
    assert process["attributes"] == {
        "messaging.system": "sqla_jobs",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job_id),
        "sqla_jobs.job.kind": "traced.ok",
        "sqla_jobs.job.attempt": 1,
        "sqla_jobs.job.queue_wait": process["attributes"]["sqla_jobs.job.queue_wait"],
        "sqla_jobs.job.outcome": "done",
        "sqla_jobs.job.recorded_outcome": "done",  # from the batch: the handler wrote nothing
    }
    assert process["attributes"]["sqla_jobs.job.queue_wait"] >= 0
    work = next(s for s in found if s["name"] == "handler work")
    assert work["parent_id"] == process["span_id"]  # the handler's spans nest under it


@pytest.mark.parametrize("kind", ["traced.fail", "traced.async_fail"])
def test_each_retry_is_a_process_span_of_the_same_trace_with_the_error_recorded(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter, kind: str
) -> None:
    """A thread's handler and an ``async def`` one: the same spans."""
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("request") as request, Session(engine) as session:
        enqueue(session, kind)
        session.commit()
    dead = "SELECT 1 FROM jobs WHERE status = 'dead'"
    found = run_worker(db_url, tmp_path / "spans.jsonl", 2, until=dead)
    attempts = sorted(
        (s for s in found if s["kind"] == "CONSUMER"),
        key=lambda s: s["attributes"]["sqla_jobs.job.attempt"],
    )
    trace_id = f"{request.get_span_context().trace_id:032x}"
    assert [s["attributes"]["sqla_jobs.job.attempt"] for s in attempts] == [1, 2]
    for span in attempts:
        assert span["trace_id"] == trace_id
        assert span["status"] == "ERROR"
        assert span["attributes"]["sqla_jobs.job.outcome"] == "failed"
        assert "exception" in span["events"] and "failed" in span["events"]
    retried, last = attempts
    assert retried["attributes"]["sqla_jobs.job.recorded_outcome"] == "retry"
    assert "retry scheduled" in retried["events"] and "dead" not in retried["events"]
    assert last["attributes"]["sqla_jobs.job.recorded_outcome"] == "dead"
    assert "dead" in last["events"] and "retry scheduled" not in last["events"]


def test_a_lost_claim_is_an_event_and_the_error_status_of_its_process_span(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    with Session(engine) as session:
        enqueue(session, "traced.lost")
        session.commit()
    found = run_worker(db_url, tmp_path / "spans.jsonl", 1)
    process = next(s for s in found if s["kind"] == "CONSUMER")
    assert process["attributes"]["sqla_jobs.job.outcome"] == "done"  # the handler's
    assert process["attributes"]["sqla_jobs.job.recorded_outcome"] == "lost"
    assert process["events"] == ["claim lost"] and process["status"] == "ERROR"
    [job] = rows(engine, "SELECT status, worker FROM jobs")
    assert (job.status, job.worker) == ("running", "someone else")  # nothing recorded


def enqueued(engine: sa.Engine, kinds: list[str]) -> dict[str, int]:
    with Session(engine) as session:
        ids = {kind: enqueue(session, kind) for kind in kinds}
        session.commit()
    return {kind: job_id for kind, job_id in ids.items() if job_id is not None}


def process_spans(found: list[dict[str, Any]], ids: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The process span of each job, by its kind."""
    by_id = {s["attributes"]["messaging.message.id"]: s for s in found if s["kind"] == "CONSUMER"}
    return {kind: by_id[str(job_id)] for kind, job_id in ids.items()}


def test_every_path_that_marks_a_job_done_records_it_on_the_process_span(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """Done-marks in the worker's batch (a thread's or an async handler that wrote and
    returned nothing), in the handler's transaction (one that returned a result) and in
    a process-isolated handler's child: each attempt's span says ``done``."""
    kinds = ["traced.ok", "traced.async", "traced.result", "traced.async_result"]
    ids = enqueued(engine, [*kinds, "traced.isolated"])
    found = process_spans(run_worker(db_url, tmp_path / "spans.jsonl", len(ids)), ids)
    for kind, span in found.items():
        attributes = span["attributes"]
        recorded = attributes["sqla_jobs.job.outcome"], attributes[RECORDED]
        assert (kind, recorded, span["status"]) == (kind, ("done", "done"), "UNSET")
        assert span["events"] == []
    statuses = rows(engine, "SELECT status::text AS status FROM jobs")
    assert [r.status for r in statuses] == ["done"] * len(ids)


def test_a_claim_lost_at_a_batched_or_child_done_mark_is_on_the_process_span(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """Handlers that wrote nothing (a thread's, an async one) lose their claim before
    the batch marks them done, and a process-isolated one before its child does: each
    attempt's span says ``lost``, with the event and the ERROR status."""
    kinds = ["traced.quiet_lost", "traced.async_quiet_lost", "traced.isolated_lost"]
    ids = enqueued(engine, kinds)
    found = process_spans(run_worker(db_url, tmp_path / "spans.jsonl", len(ids)), ids)
    for kind, span in found.items():
        recorded = span["attributes"]["sqla_jobs.job.recorded_outcome"]
        assert (kind, recorded, span["events"], span["status"]) == (
            kind,
            "lost",
            ["claim lost"],
            "ERROR",
        )
    found_rows = rows(engine, "SELECT status::text AS status, worker FROM jobs")
    assert {(r.status, r.worker) for r in found_rows} == {("running", "someone else")}


def test_a_handler_the_worker_gave_up_on_has_the_given_up_runs_outcome_on_its_span(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """The handler ignores its 0.3 s timeout; 0.2 s later the worker records the attempt
    (dead: its last) without it. When the handler comes back, its span ends with that
    outcome, not with its own late return's fenced-away done-mark."""
    with Session(engine) as session:
        enqueue(session, "traced.stubborn", {"sleep": 2})
        session.commit()
    found = run_worker(db_url, tmp_path / "spans.jsonl", 1, args=("--timeout-grace", "0.2"))
    process = next(s for s in found if s["kind"] == "CONSUMER")
    assert process["attributes"][RECORDED] == "dead"
    # The handler's own late end (its timeout), then what the worker had recorded.
    assert process["events"] == ["exception", "timeout", "given up", "dead"]
    assert process["attributes"]["sqla_jobs.job.outcome"] == "timeout"
    assert process["status"] == "ERROR"
    [job] = rows(engine, "SELECT status::text AS status, last_error FROM jobs")
    assert job.status == "dead" and "the worker gave up on it" in job.last_error


def test_an_async_handler_runs_in_the_process_span(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("request") as request, Session(engine) as session:
        enqueue(session, "traced.async")
        session.commit()
    found = run_worker(db_url, tmp_path / "spans.jsonl", 1)
    process = next(s for s in found if s["kind"] == "CONSUMER")
    assert process["trace_id"] == f"{request.get_span_context().trace_id:032x}"
    work = next(s for s in found if s["name"] == "async handler work")
    assert work["parent_id"] == process["span_id"]


def test_a_handler_in_a_child_process_runs_in_the_process_span_of_its_attempt(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("request") as request, Session(engine) as session:
        enqueue(session, "traced.isolated")
        session.commit()
    found = run_worker(db_url, tmp_path / "spans.jsonl", 1)
    process = next(s for s in found if s["kind"] == "CONSUMER")
    assert process["trace_id"] == f"{request.get_span_context().trace_id:032x}"
    assert process["attributes"]["sqla_jobs.job.outcome"] == "done"
    # The child's own span (exported by the child, which imported otelapp) nests under
    # the process span of the attempt: the worker handed it its context.
    work = next(s for s in found if s["name"] == "isolated handler work")
    assert (work["trace_id"], work["parent_id"]) == (process["trace_id"], process["span_id"])


def test_link_mode_starts_a_trace_per_attempt_linked_to_the_enqueue(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("request") as request, Session(engine) as session:
        enqueue(session, "traced.ok")
        session.commit()
    publish = next(
        span_record(s) for s in spans.get_finished_spans() if s.name == "publish default"
    )
    found = run_worker(db_url, tmp_path / "spans.jsonl", 1, SQLA_JOBS_OTEL_PARENT="link")
    process = next(s for s in found if s["kind"] == "CONSUMER")
    assert process["parent_id"] is None
    assert process["trace_id"] != f"{request.get_span_context().trace_id:032x}"
    assert process["links"] == [publish["span_id"]]


def test_enqueue_many_gives_each_job_the_context_of_its_own_publish_span(
    engine: sa.Engine, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("request") as request, Session(engine) as session:
        ids = enqueue_many(session, [NewJob("k", queue="mail"), NewJob("k")])
        session.commit()
    trace_id = f"{request.get_span_context().trace_id:032x}"
    records = [span_record(s) for s in spans.get_finished_spans()]
    published = {s["span_id"]: s["name"] for s in records if s["name"].startswith("publish")}
    contexts = [traceparent(engine, i).split("-") for i in sorted(ids)]
    assert {c[1] for c in contexts} == {trace_id}
    assert sorted(published[c[2]] for c in contexts) == ["publish default", "publish mail"]


def test_workflow_steps_carry_the_enqueuing_trace_to_their_process_spans(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """Each step gets a publish span of its own when the workflow is enqueued (not when
    it is built), and a step released by its dependency continues that trace too."""
    with trace.get_tracer("app").start_as_current_span("built"):
        flow = Workflow()
        flow.add("first", "traced.ok", meta={"tenant": 7}, tags=["flow"])
        flow.add("then", "traced.ok", after="first")
    assert [s.name for s in spans.get_finished_spans()] == ["built"]  # add records nothing
    spans.clear()
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("request") as request, Session(engine) as session:
        ids = flow.enqueue(session)
        session.commit()
    trace_id = f"{request.get_span_context().trace_id:032x}"
    publish = [span_record(s) for s in spans.get_finished_spans() if s.name != "request"]
    assert [s["name"] for s in publish] == ["publish default"] * 2
    for span in publish:
        assert span["trace_id"] == trace_id and span["kind"] == "PRODUCER"
        assert span["parent_id"] == f"{request.get_span_context().span_id:016x}"
    [first] = rows(engine, "SELECT meta, tags FROM jobs WHERE id = :id", id=ids["first"])
    assert first.meta["tenant"] == 7 and first.tags == ["flow"]
    published = {step: traceparent(engine, ids[step]).split("-")[2] for step in ids.steps}
    assert sorted(published.values()) == sorted(s["span_id"] for s in publish)

    found = run_worker(db_url, tmp_path / "spans.jsonl", 2)
    process = {
        int(s["attributes"]["messaging.message.id"]): s for s in found if s["kind"] == "CONSUMER"
    }
    for step, job_id in ids.steps.items():
        assert process[job_id]["parent_id"] == published[step]
        assert process[job_id]["trace_id"] == trace_id


def test_no_trace_context_is_stored_without_a_current_span_as_for_a_periodic_tick(
    engine: sa.Engine, spans: InMemorySpanExporter
) -> None:
    registry = Registry()
    registry.periodic(every=timedelta(minutes=1))(
        registry.handler("tick")(lambda session, payload: None)
    )
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    periodic.enqueue_due(engine, registry, now=t0)  # registers the schedule
    periodic.enqueue_due(engine, registry, now=t0 + timedelta(minutes=1))  # one tick
    with Session(engine) as session:
        enqueue(session, "plain")
        session.commit()
    assert [r.meta for r in rows(engine, "SELECT meta FROM jobs")] == [None, None]
    assert spans.get_finished_spans() == ()


def test_a_job_built_in_a_span_but_never_inserted_records_no_publish_span(
    engine: sa.Engine, spans: InMemorySpanExporter
) -> None:
    from sqla_jobs import Job

    with trace.get_tracer("app").start_as_current_span("request"):
        NewJob("k", meta={"tenant": 7})
        Job(kind="k", payload={}, meta={"tenant": 7})
    assert [s.name for s in spans.get_finished_spans()] == ["request"]


@pytest.mark.parametrize("how", ["enqueue", "enqueue_many", "flush", "flush_keyed", "flush_many"])
def test_the_stored_context_is_the_inserting_codes_not_the_building_codes(
    engine: sa.Engine, spans: InMemorySpanExporter, how: str
) -> None:
    """``flush`` inserts one job as enqueue does, ``flush_many`` four with the ORM's own
    insert (more than ONE_BY_ONE_UP_TO), ``flush_keyed`` one with a key."""
    from sqla_jobs import Job
    from sqla_jobs.producer import insert_one

    tracer = trace.get_tracer("app")
    count = 4 if how == "flush_many" else 1
    with tracer.start_as_current_span("built"):
        if how.startswith("flush"):
            key = "k1" if how == "flush_keyed" else None
            jobs: list[Any] = [
                Job(kind="k", payload={}, meta={"tenant": 7}, key=key) for _ in range(count)
            ]
        else:
            jobs = [NewJob("k", meta={"tenant": 7})]
    with tracer.start_as_current_span("inserted") as inserting, Session(engine) as session:
        if how == "enqueue":
            insert_one(session, jobs[0])
        elif how == "enqueue_many":
            enqueue_many(session, jobs)
        else:
            session.add_all(jobs)
            session.flush()
        session.commit()
    publish = [span_record(s) for s in spans.get_finished_spans() if s.name.startswith("publish")]
    assert len(publish) == count
    parent = f"{inserting.get_span_context().span_id:016x}"
    assert {p["parent_id"] for p in publish} == {parent}
    trace_id = f"{inserting.get_span_context().trace_id:032x}"
    stored = [r.meta for r in rows(engine, "SELECT meta FROM jobs ORDER BY id")]
    assert sorted(m.pop("traceparent").split("-")[1:3] for m in stored) == sorted(
        [trace_id, p["span_id"]] for p in publish
    )
    assert stored == [{"tenant": 7}] * count


def test_a_job_built_in_a_span_and_inserted_outside_any_stores_no_context(
    engine: sa.Engine, spans: InMemorySpanExporter
) -> None:
    from sqla_jobs import Job

    with trace.get_tracer("app").start_as_current_span("built"):
        new, added = NewJob("k"), Job(kind="k", payload={})
    with Session(engine) as session:
        enqueue_many(session, [new])
        session.add(added)
        session.commit()
    assert [r.meta for r in rows(engine, "SELECT meta FROM jobs")] == [None, None]


def test_the_process_span_tells_the_time_in_queue_by_the_databases_clock_not_the_workers(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """The job was due an hour ago (by the database); the worker's wall clock is two
    hours behind: the wait is still about an hour, not minus one."""
    [due] = rows(engine, "SELECT now() - interval '1 hour' AS at")
    with Session(engine) as session:
        enqueue(session, "traced.ok", run_at=due.at)
        session.commit()
    found = run_worker(
        db_url, tmp_path / "spans.jsonl", 1, SQLA_JOBS_TEST_CLOCK_OFFSET=str(-2 * 3600)
    )
    process = next(s for s in found if s["kind"] == "CONSUMER")
    waited = process["attributes"]["sqla_jobs.job.queue_wait"]
    [row] = rows(engine, "SELECT extract(epoch FROM attempted_at - run_at)::float AS w FROM jobs")
    assert 3600 <= waited == pytest.approx(row.w, abs=1e-3)


@pytest.mark.parametrize("kind", ["traced.sql", "traced.async_sql"])
def test_the_handlers_session_sql_nests_under_the_process_span_with_sqlalchemy_instrumented(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter, kind: str
) -> None:
    """opentelemetry-instrumentation-sqlalchemy, enabled in the worker process as an app
    would, records the handler's statement as a span of the job's trace."""
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("request") as request, Session(engine) as session:
        enqueue(session, kind)
        session.commit()
    marker = "async_handler_sql" if kind == "traced.async_sql" else "sync_handler_sql"

    def handler_sql(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in found if marker in json.dumps(s["attributes"])]

    def exported() -> list[dict[str, Any]]:
        if not path.exists():
            return []
        found = [json.loads(line) for line in path.read_text().splitlines()]
        done = handler_sql(found) and any(s["kind"] == "CONSUMER" for s in found)
        return found if done else []

    path = tmp_path / "spans.jsonl"
    proc = start_worker(
        db_url,
        app="otelapp:registry",
        env={"SQLA_JOBS_TEST_SPANS": str(path), "SQLA_JOBS_TEST_INSTRUMENT_SQLALCHEMY": "1"},
    )
    try:
        found = wait_for(exported, message="the handler's SQL span")
    finally:
        stop(proc)
    process = next(s for s in found if s["kind"] == "CONSUMER")
    [sql] = handler_sql(found)
    assert sql["kind"] == "CLIENT"
    assert sql["parent_id"] == process["span_id"]
    assert sql["trace_id"] == f"{request.get_span_context().trace_id:032x}"


# --- the application's meta and the trace context (#27) ------------------------------

#: A meta exactly at the size limit as JSON ({"x":"aaa..."}).
FULL_META = {"x": "a" * (MAX_META_BYTES - len('{"x":""}'))}
#: A trace context an application propagates by hand (W3C's own example).
GIVEN_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
GIVEN_PARENT = "00f067aa0ba902b7"
GIVEN = f"00-{GIVEN_TRACE}-{GIVEN_PARENT}-01"


def insert_on_every_route(session: Session, meta: dict[str, Any]) -> list[int | None]:
    """One job with ``meta`` by each sync route that inserts one (ids, None: refused)."""
    registry = Registry()
    handler = registry.handler("meta.k")(lambda session, payload: None)
    ids: list[int | None] = [
        enqueue(session, "k", {}, meta=meta),
        enqueue(session, "k", {}, meta=meta, key="keyed"),
        handler.enqueue(session, {}, meta=meta),
        registry.enqueue(session, "meta.k", meta=meta),
        *enqueue_many(session, [NewJob("k", meta=meta), handler.new({}, meta=meta, key="two")]),
    ]
    routed = Job(kind="k", payload={}, meta=meta)  # inserted as enqueue does
    session.add(routed)
    session.flush()
    orm_own = [Job(kind="k", payload={}, meta=meta) for _ in range(4)]  # the ORM's insert
    session.add_all(orm_own)
    session.flush()
    flow = Workflow()
    flow.add("step", "k", meta=meta)
    return [*ids, routed.id, *(j.id for j in orm_own), flow.enqueue(session)["step"]]


def test_a_meta_at_the_size_limit_is_accepted_inside_a_span_on_every_route(
    engine: sa.Engine, db_url: URL, spans: InMemorySpanExporter
) -> None:
    """The limit is the application's meta's: the trace context comes on top of it."""
    registry = Registry()
    registry.periodic(every=timedelta(minutes=1), meta=FULL_META)(
        registry.handler("tick")(lambda session, payload: None)
    )
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with trace.get_tracer("app").start_as_current_span("request"):
        with Session(engine) as session:
            ids = insert_on_every_route(session, FULL_META)
            session.commit()
        periodic.enqueue_due(engine, registry, now=t0)
        periodic.enqueue_due(engine, registry, now=t0 + timedelta(minutes=1))

        async def main() -> list[int | None]:
            aengine = create_async_engine(db_url)
            try:
                async with AsyncSession(aengine) as session:
                    one = await enqueue_async(session, "k", {}, meta=FULL_META)
                    many = await enqueue_many_async(session, [NewJob("k", meta=FULL_META)])
                    orm = Job(kind="k", payload={}, meta=FULL_META)
                    session.add(orm)
                    await session.flush()
                    orm_id = orm.id
                    await session.commit()
                    return [one, *many, orm_id]
            finally:
                await aengine.dispose()

        ids += asyncio.run(main())
    assert None not in ids and len(ids) == 15
    found = rows(engine, "SELECT meta, length(meta::text) AS size FROM jobs")
    assert len(found) == 16  # and the tick's
    for row in found:
        assert set(row.meta) == {"x", "traceparent"} and row.meta["x"] == FULL_META["x"]
    published = [s for s in spans.get_finished_spans() if s.name.startswith("publish")]
    assert len(published) == 16
    # A handler passing its job.meta (the context included) on to a follow-up job.
    with trace.get_tracer("app").start_as_current_span("handler"), Session(engine) as session:
        follow_up = enqueue(session, "k", {}, meta=found[0].meta)
        session.commit()
    [row] = rows(engine, "SELECT meta FROM jobs WHERE id = :id", id=follow_up)
    assert row.meta["x"] == FULL_META["x"]


def test_the_trace_context_stored_is_bounded_however_large_the_current_tracestate(
    engine: sa.Engine, spans: InMemorySpanExporter
) -> None:
    """A tracestate of 32 entries of 256-character values (about 8 KiB) is cut as W3C
    says (long entries first): the stored meta exceeds the limit by at most
    MAX_TRACE_CONTEXT_BYTES."""
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    huge = TraceState([(f"v{n}", "x" * 256) for n in range(30)] + [("a", "1"), ("b", "2")])
    remote = SpanContext(int(GIVEN_TRACE, 16), int(GIVEN_PARENT, 16), True, TraceFlags(1), huge)
    context = trace.set_span_in_context(NonRecordingSpan(remote))
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("request", context=context), Session(engine) as session:
        job_id = enqueue(session, "k", {}, meta=FULL_META)
        session.commit()
    [row] = rows(engine, "SELECT meta FROM jobs WHERE id = :id", id=job_id)
    assert row.meta["tracestate"] == "a=1,b=2"  # the long entries went first
    assert row.meta["traceparent"].startswith(f"00-{GIVEN_TRACE}-")
    assert len(json.dumps(row.meta, separators=(",", ":"))) <= (
        MAX_META_BYTES + MAX_TRACE_CONTEXT_BYTES
    )
    assert bounded_tracestate(",".join(f"k{n}=" + "y" * 60 for n in range(20))) == ",".join(
        f"k{n}=" + "y" * 60 for n in range(8)
    )  # 8 entries of 63 characters and their commas: 511 bytes; the last ones go


@pytest.mark.parametrize("current", [True, False], ids=["in-a-span", "no-span"])
def test_a_traceparent_given_in_meta_is_the_parent_of_the_jobs_publish_span(
    engine: sa.Engine, db_url: URL, tmp_path: Path, spans: InMemorySpanExporter, current: bool
) -> None:
    """A context propagated by hand is kept as the job's parent: the publish span is its
    child (linked to the current span, if any) and the worker's process span the
    publish span's child, all in the given trace."""
    meta = {"tenant": 7, "traceparent": GIVEN, "tracestate": "vendor=abc"}
    tracer = trace.get_tracer("app")
    scope = tracer.start_as_current_span("request") if current else nullcontext()
    with scope as request, Session(engine) as session:
        job_id = enqueue(session, "traced.ok", {}, meta=meta)
        session.commit()
    [publish] = [span_record(s) for s in spans.get_finished_spans() if s.name != "request"]
    assert publish["name"] == "publish default" and publish["kind"] == "PRODUCER"
    assert publish["trace_id"] == GIVEN_TRACE and publish["parent_id"] == GIVEN_PARENT
    [finished] = [s for s in spans.get_finished_spans() if s.name == "publish default"]
    linked = [f"{link.context.span_id:016x}" for link in finished.links]
    assert linked == ([f"{request.get_span_context().span_id:016x}"] if request else [])
    [row] = rows(engine, "SELECT meta FROM jobs WHERE id = :id", id=job_id)
    assert row.meta == {
        "tenant": 7,
        "traceparent": f"00-{GIVEN_TRACE}-{publish['span_id']}-01",
        "tracestate": "vendor=abc",
    }
    found = run_worker(db_url, tmp_path / "spans.jsonl", 1)
    process = next(s for s in found if s["kind"] == "CONSUMER")
    assert process["trace_id"] == GIVEN_TRACE and process["parent_id"] == publish["span_id"]


def test_a_malformed_traceparent_in_meta_is_refused_inside_a_span_too(
    session: Session, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("request"), pytest.raises(InvalidJobError) as raised:
        enqueue(session, "k", {}, meta={"traceparent": "00-bogus-bogus-01"})
    assert str(raised.value).startswith(
        'meta["traceparent"] is reserved for the job\'s trace context and must be a W3C '
        "traceparent (version 00:"
    )
    assert [s.name for s in spans.get_finished_spans()] == ["request"]  # no publish span


def test_with_the_api_and_no_sdk_an_attempt_builds_no_span() -> None:
    """The API alone (a library pulled it in, nobody configured an SDK): each attempt
    skips the span, the tracer and the context switch, which cost 0.85x of a no-op drain."""
    code = (
        "from types import SimpleNamespace\n"
        "from opentelemetry import trace\n"
        "from sqla_jobs import _otel\n"
        "def no_tracer(*a, **k):\n"
        "    raise AssertionError('a tracer was asked for with no SDK configured')\n"
        "trace.get_tracer = no_tracer\n"
        "job = SimpleNamespace(id=1, kind='k', queue='default', attempt=1, waited=0.0,\n"
        "    meta={'traceparent': '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'})\n"
        "with _otel.process_span(job) as span:\n"
        "    assert span is None, span\n"
        "    assert not trace.get_current_span().get_span_context().is_valid\n"
        "print('no span')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no span"
