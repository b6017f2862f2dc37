"""Prometheus metrics for a worker (the optional ``prometheus`` extra).

``python -m sqla_jobs.worker app:registry --metrics-port 9187`` serves, on
``http://HOST:9187/metrics``:

Counters of this process, labelled ``queue`` and ``kind``:

* ``sqla_jobs_jobs_succeeded_total``: handler returned, job done;
* ``sqla_jobs_jobs_failed_total``: handler raised (every failed attempt);
* ``sqla_jobs_jobs_retried_total``: failed attempts that were scheduled again;
* ``sqla_jobs_jobs_dead_total``: failed attempts that were the last one.

``sqla_jobs_handler_duration_seconds`` (histogram, label ``kind``): handler run time.

Gauges of the whole queue (every worker reports the same values; aggregate with ``max``,
not ``sum``), refreshed every ``--metrics-refresh`` seconds from
``sqla_jobs.ops.stats``, labelled ``queue`` and ``kind``:
``sqla_jobs_queue_depth`` (ready now), ``sqla_jobs_scheduled``, ``sqla_jobs_running``,
``sqla_jobs_expired_leases``, ``sqla_jobs_dead``, ``sqla_jobs_oldest_ready_age_seconds``;
and ``sqla_jobs_table_dead_tuples`` / ``sqla_jobs_table_live_tuples`` for bloat.

From [``sqla_jobs.ops.health``][sqla_jobs.ops.health] on the same refresh (issue #25):
``sqla_jobs_horizon_age_seconds`` (the oldest transaction or prepared transaction of
this database holding the xmin horizon; 0 when none), ``sqla_jobs_horizon_xid_age``
(how many transactions back any session, slot or prepared transaction holds it),
``sqla_jobs_stale_workers``, per queue table (label ``table``)
``sqla_jobs_table_dead_tuples_by_table``, ``sqla_jobs_table_bytes`` and
``sqla_jobs_table_index_bytes``, and ``sqla_jobs_health_findings`` (label ``check``:
how many findings over their default thresholds). Another role's transaction counts in
``sqla_jobs_horizon_age_seconds`` only when the worker's role is a superuser or a member
of ``pg_read_all_stats``; otherwise ``sqla_jobs_health_findings{check="visibility"}`` is 1.

The alerts that matter: ``max(sqla_jobs_dead) > 0`` (see docs/operations.md) and
``max(sqla_jobs_health_findings) > 0`` (run ``sqla-jobs health`` to see what to do).

The same figures as OpenTelemetry instruments: ``instrument`` (``sqla-jobs worker
--otel-metrics``), on the application's meter provider.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from sqla_jobs import ops, validation
from sqla_jobs.exceptions import ConfigError

if TYPE_CHECKING:
    from sqla_jobs.worker import Worker, WorkerEvent

log = logging.getLogger("sqla_jobs.metrics")

#: Seconds between two refreshes of the queue gauges. Defaults to 15.
DEFAULT_REFRESH = 15.0
#: Handler duration buckets (seconds): from a no-op job to a long one.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

_GAUGES = {
    "ready": ("sqla_jobs_queue_depth", "Jobs ready to run now (queued, run_at <= now())."),
    "scheduled": ("sqla_jobs_scheduled", "Jobs queued for later (run_at > now())."),
    "running": ("sqla_jobs_running", "Jobs claimed by a worker."),
    "expired": ("sqla_jobs_expired_leases", "Running jobs whose lease expired."),
    "dead": ("sqla_jobs_dead", "Dead jobs in the jobs table: something needs a human."),
}


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError(
            "--metrics-port needs prometheus-client: pip install 'sqla-jobs[prometheus]'"
        ) from None
    return prometheus_client


class Metrics:
    """The metrics of one worker, in their own registry (never the global default)."""

    def __init__(self) -> None:
        client = _client()
        self.client = client
        self.registry = client.CollectorRegistry(auto_describe=True)
        labels = ("queue", "kind")

        def counter(name: str, doc: str) -> Any:
            return client.Counter(name, doc, labels, registry=self.registry)

        self.succeeded = counter("sqla_jobs_jobs_succeeded", "Jobs whose handler succeeded.")
        self.failed = counter("sqla_jobs_jobs_failed", "Failed attempts (retried or dead).")
        self.retried = counter("sqla_jobs_jobs_retried", "Failed attempts scheduled again.")
        self.dead = counter("sqla_jobs_jobs_dead", "Failed attempts that were the last one.")
        self.duration = client.Histogram(
            "sqla_jobs_handler_duration_seconds",
            "Handler run time.",
            ("kind",),
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.gauges = {
            field: client.Gauge(name, doc, labels, registry=self.registry)
            for field, (name, doc) in _GAUGES.items()
        }
        self.oldest_ready = client.Gauge(
            "sqla_jobs_oldest_ready_age_seconds",
            "Age of the oldest ready job (0 when none is ready).",
            labels,
            registry=self.registry,
        )
        self.table_dead = client.Gauge(
            "sqla_jobs_table_dead_tuples", "n_dead_tup of the jobs table.", registry=self.registry
        )
        self.table_live = client.Gauge(
            "sqla_jobs_table_live_tuples", "n_live_tup of the jobs table.", registry=self.registry
        )

        self._health_gauges(client)

    def _health_gauges(self, client: Any) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return client.Gauge(name, doc, labels, registry=self.registry)

        self.horizon_age = gauge(
            "sqla_jobs_horizon_age_seconds",
            "Age of the oldest transaction of this database holding the xmin horizon.",
        )
        self.horizon_xids = gauge(
            "sqla_jobs_horizon_xid_age",
            "Transactions the oldest session, slot or prepared transaction holds back.",
        )
        self.stale_workers = gauge(
            "sqla_jobs_stale_workers", "Registered workers whose heartbeat is late."
        )
        table = ("table",)
        self.tables_dead = gauge(
            "sqla_jobs_table_dead_tuples_by_table", "n_dead_tup of a queue table.", table
        )
        self.tables_bytes = gauge("sqla_jobs_table_bytes", "Size of a queue table.", table)
        self.index_bytes = gauge(
            "sqla_jobs_table_index_bytes", "Size of a queue table's indexes.", table
        )
        self.findings = gauge(
            "sqla_jobs_health_findings",
            "Health checks over their default threshold (sqla-jobs health).",
            ("check",),
        )

    def refresh_health(self, session: Session) -> None:
        """Set the health gauges from one [``sqla_jobs.ops.health``][sqla_jobs.ops.health] look."""
        found = ops.health(session)
        ages = [h.age_seconds for h in found.horizon if h.age_seconds is not None]
        xids = [h.xid_age for h in found.horizon if h.xid_age is not None]
        self.horizon_age.set(max(ages, default=0.0))
        self.horizon_xids.set(max(xids, default=0))
        self.stale_workers.set(len(found.stale_workers))
        for t in found.tables:
            self.tables_dead.labels(t.name).set(t.dead_tuples)
            self.tables_bytes.labels(t.name).set(t.table_bytes)
            self.index_bytes.labels(t.name).set(t.index_bytes)
        self.findings.clear()  # a check that recovered must read 0, not its last count
        for check in ops.HEALTH_CHECKS:
            self.findings.labels(check).set(sum(f.check == check for f in found.findings))

    def on_event(self, event: WorkerEvent) -> None:
        """Subscribed to the worker's events (``Worker.subscribe``)."""
        outcome = event.outcome.value  # a str enum: no import of the worker needed here
        if outcome not in ("done", "retry", "dead"):
            return  # lost and released attempts ran no handler to its recorded end
        self.duration.labels(event.kind).observe(event.duration)
        labels = (event.queue, event.kind)
        if outcome == "done":
            self.succeeded.labels(*labels).inc()
            return
        self.failed.labels(*labels).inc()
        (self.dead if outcome == "dead" else self.retried).labels(*labels).inc()

    def refresh(self, session: Session) -> None:
        """Set the queue gauges from one ``sqla_jobs.ops.stats`` snapshot."""
        snapshot = ops.stats(session)
        for gauge in (*self.gauges.values(), self.oldest_ready):
            gauge.clear()  # a (queue, kind) that emptied must not keep its last value
        for k in snapshot.by_kind:
            for field, gauge in self.gauges.items():
                gauge.labels(k.queue, k.kind).set(getattr(k, field))
            self.oldest_ready.labels(k.queue, k.kind).set(k.oldest_ready_seconds or 0.0)
        self.table_dead.set(snapshot.table.dead_tuples)
        self.table_live.set(snapshot.table.live_tuples)
        self.refresh_health(session)


def serve(
    worker: Worker, port: int, *, addr: str = "0.0.0.0", refresh: float = DEFAULT_REFRESH
) -> Metrics:
    """Attach metrics to ``worker``, serve them on ``addr:port`` and refresh the gauges.

    Raises ConfigError if prometheus-client is missing or the port cannot be bound.
    """
    validation.integer("metrics port", port, minimum=0, maximum=65535, error=ConfigError)
    validation.number("metrics refresh", refresh, allow_minimum=False, error=ConfigError)
    metrics = Metrics()
    try:
        metrics.client.start_http_server(port, addr=addr, registry=metrics.registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc.strerror}") from None
    worker.subscribe(metrics.on_event)

    def refresh_loop() -> None:
        while True:
            try:
                with Session(worker.engine) as session:
                    metrics.refresh(session)
            except sa_exc.SQLAlchemyError as exc:
                log.warning("could not refresh queue metrics: %s", exc)
            except Exception:
                log.exception("could not refresh queue metrics")
            time.sleep(refresh)

    thread = threading.Thread(target=refresh_loop, name="sqla_jobs-metrics", daemon=True)
    thread.start()
    return metrics


# --- the same figures as OpenTelemetry instruments (the ``otel`` extra, #27) ------------


class OtelMetrics:
    """The figures of ``Metrics`` as OpenTelemetry instruments of one meter.

    Counters ``sqla_jobs.jobs.succeeded``, ``.failed``, ``.retried``, ``.dead`` and the
    histogram ``sqla_jobs.handler.duration`` (seconds), with attributes
    ``messaging.destination.name`` (the queue) and ``sqla_jobs.job.kind``; observable
    gauges ``sqla_jobs.queue.depth``, ``.scheduled``, ``.running``, ``.expired_leases``,
    ``.dead`` and ``.oldest_ready_age`` read from one ``sqla_jobs.ops.stats``
    snapshot per collection (no older than ``refresh`` seconds).
    """

    def __init__(
        self, worker: Worker, meter_provider: Any = None, refresh: float = DEFAULT_REFRESH
    ) -> None:
        try:
            from opentelemetry import metrics as otel_metrics
        except ImportError:
            raise ConfigError(
                "OpenTelemetry metrics need opentelemetry-api: pip install 'sqla-jobs[otel]'"
            ) from None
        provider = meter_provider or otel_metrics.get_meter_provider()
        meter = provider.get_meter("sqla_jobs")
        self.worker = worker
        self.refresh = refresh
        self._snapshot: Any = None
        self._taken = 0.0
        self._lock = threading.Lock()
        self.succeeded = meter.create_counter("sqla_jobs.jobs.succeeded", "{job}")
        self.failed = meter.create_counter("sqla_jobs.jobs.failed", "{attempt}")
        self.retried = meter.create_counter("sqla_jobs.jobs.retried", "{attempt}")
        self.dead = meter.create_counter("sqla_jobs.jobs.dead", "{job}")
        self.duration = meter.create_histogram(
            "sqla_jobs.handler.duration", "s", "Handler run time."
        )
        for field, name in (
            ("ready", "sqla_jobs.queue.depth"),
            ("scheduled", "sqla_jobs.queue.scheduled"),
            ("running", "sqla_jobs.queue.running"),
            ("expired", "sqla_jobs.queue.expired_leases"),
            ("dead", "sqla_jobs.queue.dead"),
            ("oldest_ready_seconds", "sqla_jobs.queue.oldest_ready_age"),
        ):
            meter.create_observable_gauge(name, [self._observer(field, otel_metrics)])

    def on_event(self, event: WorkerEvent) -> None:
        """Subscribed to the worker's events, as ``Metrics.on_event`` is."""
        outcome = event.outcome.value
        if outcome not in ("done", "retry", "dead"):
            return
        labels = {"messaging.destination.name": event.queue, "sqla_jobs.job.kind": event.kind}
        self.duration.record(event.duration, labels)
        if outcome == "done":
            self.succeeded.add(1, labels)
            return
        self.failed.add(1, labels)
        (self.dead if outcome == "dead" else self.retried).add(1, labels)

    def _stats(self) -> Any:
        with self._lock:
            if self._snapshot is None or time.monotonic() - self._taken > self.refresh:
                with Session(self.worker.engine) as session:
                    self._snapshot = ops.stats(session)
                self._taken = time.monotonic()
            return self._snapshot

    def _observer(self, field: str, otel_metrics: Any) -> Any:
        def observe(_options: Any) -> list[Any]:
            try:
                snapshot = self._stats()
            except sa_exc.SQLAlchemyError as exc:
                log.warning("could not read queue metrics: %s", exc)
                return []
            return [
                otel_metrics.Observation(
                    getattr(k, field) or 0,
                    {"messaging.destination.name": k.queue, "sqla_jobs.job.kind": k.kind},
                )
                for k in snapshot.by_kind
            ]

        return observe


def instrument(
    worker: Worker, *, meter_provider: Any = None, refresh: float = DEFAULT_REFRESH
) -> OtelMetrics:
    """Record ``worker``'s figures as OpenTelemetry instruments (the global meter provider
    unless given; the application configures its SDK and exporter). ConfigError without
    opentelemetry-api."""
    validation.number("metrics refresh", refresh, allow_minimum=False, error=ConfigError)
    found = OtelMetrics(worker, meter_provider, refresh)
    worker.subscribe(found.on_event)
    return found
