"""Traced handlers for the OpenTelemetry tests; workers load ``otelapp:registry``.

Importing it configures the OpenTelemetry SDK in the worker process, exporting every
ended span at once as one JSON line to the file named by ``SQLA_JOBS_TEST_SPANS``, which
the test process reads.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_jobs import Backoff, JobContext, Registry


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """What the tests compare of a span, as JSON (ids as hex, as W3C writes them)."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "attributes": dict(span.attributes or {}),
        "events": [event.name for event in span.events],
        "status": span.status.status_code.name,
    }


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.lock, open(self.path, "a") as out:
            for span in spans:
                out.write(json.dumps(span_record(span)) + "\n")
        return SpanExportResult.SUCCESS


_path = os.environ.get("SQLA_JOBS_TEST_SPANS")
if _path:
    _provider = TracerProvider(resource=Resource.create({"service.name": "worker"}))
    _provider.add_span_processor(SimpleSpanProcessor(FileExporter(_path)))
    trace.set_tracer_provider(_provider)

if os.environ.get("SQLA_JOBS_TEST_INSTRUMENT_SQLALCHEMY"):
    # As an app would, before its engines are made: the worker's engine (so each
    # handler's session) is instrumented; its statements' spans nest under the span
    # current when they run.
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    SQLAlchemyInstrumentor().instrument()

registry = Registry()
tracer = trace.get_tracer("otelapp")


@registry.handler("traced.ok")
def traced_ok(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    with tracer.start_as_current_span("handler work"):
        pass


@registry.handler("traced.fail", max_attempts=2, backoff=Backoff(base=0.05, cap=0.1))
def traced_fail(session: Session, payload: dict[str, Any]) -> None:
    raise ValueError("boom")


@registry.handler("traced.async")
async def traced_async(session: AsyncSession, payload: dict[str, Any]) -> None:
    with tracer.start_as_current_span("async handler work"):
        pass


@registry.handler("traced.isolated", isolation="process")
def traced_isolated(session: Session, payload: dict[str, Any]) -> None:
    with tracer.start_as_current_span("isolated handler work"):  # in the child process
        pass


def take_over(job_id: int) -> None:
    """Another worker "takes the job over" (the running claim's fence no longer
    matches), as after an expired lease; on a connection of its own."""
    engine = sa.create_engine(os.environ["DATABASE_URL"])
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE jobs SET worker = 'someone else' WHERE id = :id"), {"id": job_id}
            )
    finally:
        engine.dispose()


@registry.handler("traced.lost")
def traced_lost(session: Session, payload: dict[str, Any], job: JobContext) -> str:
    """Writes, then loses its claim before the done-mark."""
    take_over(job.id)
    return "written"  # a result: its done-mark goes in the handler's transaction


@registry.handler("traced.quiet_lost")
def traced_quiet_lost(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    """Loses its claim, writes and returns nothing: its done-mark goes in a batch."""
    take_over(job.id)


@registry.handler("traced.async_quiet_lost")
async def traced_async_quiet_lost(
    session: AsyncSession, payload: dict[str, Any], job: JobContext
) -> None:
    take_over(job.id)  # blocks the loop for a moment: fine in a test


@registry.handler("traced.isolated_lost", isolation="process")
def traced_isolated_lost(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    take_over(job.id)  # the child's own done-mark then matches nothing


@registry.handler("traced.result")
def traced_result(session: Session, payload: dict[str, Any]) -> int:
    return 42  # a result: its done-mark goes in the handler's transaction


@registry.handler("traced.async_result")
async def traced_async_result(session: AsyncSession, payload: dict[str, Any]) -> int:
    return 42


@registry.handler("traced.async_fail", max_attempts=2, backoff=Backoff(base=0.05, cap=0.1))
async def traced_async_fail(session: AsyncSession, payload: dict[str, Any]) -> None:
    raise ValueError("boom")


@registry.handler("traced.sql")
def traced_sql(session: Session, payload: dict[str, Any]) -> None:
    session.execute(sa.text("SELECT 41 + 1 AS sync_handler_sql"))


@registry.handler("traced.async_sql")
async def traced_async_sql(session: AsyncSession, payload: dict[str, Any]) -> None:
    await session.execute(sa.text("SELECT 41 + 1 AS async_handler_sql"))


@registry.handler("traced.stubborn", timeout=0.3, max_attempts=1)
def traced_stubborn(session: Session, payload: dict[str, Any]) -> None:
    """Ignores its timeout (a sleep no cancel reaches): the worker gives up on it."""
    time.sleep(payload["sleep"])
