"""The worker's figures as OpenTelemetry instruments (#27), read with the SDK's in-memory
reader from a real worker (run in this process so the test can read its meter)."""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa
from helpers import rows, url_text, wait_for
from jobapp import registry
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import Worker, WorkerConfig, enqueue, metrics


def points(reader: InMemoryMetricReader) -> dict[str, dict[tuple[Any, ...], Any]]:
    """metric name -> {(queue, kind): value (a sum, a gauge's value, a histogram's count)}."""
    found: dict[str, dict[tuple[Any, ...], Any]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    labels = dict(point.attributes or {})
                    key = (
                        labels.get("messaging.destination.name"),
                        labels.get("sqla_jobs.job.kind"),
                    )
                    value = getattr(point, "value", None)
                    if value is None:  # a histogram: how many it recorded
                        value = getattr(point, "count", None)
                    found.setdefault(metric.name, {})[key] = value
    return found


def test_outcomes_durations_and_queue_gauges_are_opentelemetry_instruments(
    engine: sa.Engine, db_url: URL
) -> None:
    with Session(engine) as session:
        for _ in range(3):
            enqueue(session, "noop")
        enqueue(session, "fail", max_attempts=1)
        enqueue(session, "ghost")  # no handler: stays ready, so the depth gauge shows it
        session.commit()
    reader = InMemoryMetricReader()
    worker = Worker(
        registry,
        WorkerConfig(
            database_url=url_text(db_url), concurrency=2, listen=False, poll_interval=0.05
        ),
    )
    metrics.instrument(worker, meter_provider=MeterProvider(metric_readers=[reader]), refresh=0.01)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: len(rows(engine, "SELECT 1 FROM jobs WHERE status IN ('done', 'dead')")) == 4,
            message="4 jobs ended",
        )

        def recorded() -> dict[str, dict[tuple[Any, ...], Any]]:
            found = points(reader)
            return found if found.get("sqla_jobs.jobs.dead") else {}

        found = wait_for(recorded, message="the dead count")
    finally:
        worker.stop()
        thread.join(30)
    assert found["sqla_jobs.jobs.succeeded"] == {("default", "noop"): 3}
    assert found["sqla_jobs.jobs.failed"] == {("default", "fail"): 1}
    assert found["sqla_jobs.jobs.dead"] == {("default", "fail"): 1}
    assert found["sqla_jobs.handler.duration"] == {("default", "noop"): 3, ("default", "fail"): 1}
    assert found["sqla_jobs.queue.depth"][("default", "ghost")] == 1
    assert found["sqla_jobs.queue.dead"][("default", "fail")] == 1
