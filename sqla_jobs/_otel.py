"""OpenTelemetry tracing across the queue (the optional ``otel`` extra, #27).

Only ``opentelemetry-api`` is used; the application installs and configures the SDK (or
not). Without the API installed nothing is imported after the first look; installed
but with no SDK configured (no span is ever recording), an inserted job (and a flush)
costs one ``get_current_span()`` and a worker's attempt one non-recording span.

* **Insert**: when a job is inserted (``enqueue``, ``enqueue_many``, or the flush of a
  ``session.add(Job(...))``) while a valid span is current (a request's, say), a short
  PRODUCER span ``publish {queue}`` is recorded and the W3C trace context of that span
  is stored in the job's ``meta`` (``traceparent``, and ``tracestate`` when there is
  one), so it commits with the job. Building a ``NewJob`` or a ``Job`` records nothing:
  the context is the inserting code's. Those keys are reserved: a context the
  application put there itself must be well formed (``validation``) and is the publish
  span's parent (see ``with_trace_context``). The context comes on top of the
  application's meta and its size limit, bounded (``validation.MAX_TRACE_CONTEXT_BYTES``).
* **Worker**: each attempt runs in a CONSUMER span ``process {queue}`` made a child of
  the stored context (``PARENT``, the default) or a new trace linked to it
  (``LINK``, ``SQLA_JOBS_OTEL_PARENT=link``), with the messaging semantic
  conventions' attributes and the time the job waited in the queue (from its
  ``run_at`` to the claim, both database times). It is the current span while the
  handler runs, so the handler's own spans (SQLAlchemy's instrumentation of its
  session) nest under it; a process-isolated handler's child gets its context too.
  It ends once the worker has recorded the attempt, with what it recorded on it
  (``settled``: done, a retry, a death, a lost claim, ...), whichever path records
  it: see ``AttemptSpan`` for a done-mark left to the worker's next batch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

#: The stored context becomes the process span's parent (one trace), or a link of a
#: span that starts a new trace; from ``SQLA_JOBS_OTEL_PARENT`` (``child`` / ``link``).
PARENT = "child"
LINK = "link"
MODE_ENV = "SQLA_JOBS_OTEL_PARENT"

SYSTEM = "sqla_jobs"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_SCOPE = "sqla_jobs"
#: Seconds the job waited in the queue before this attempt was claimed (from its run_at).
QUEUE_WAIT = "sqla_jobs.job.queue_wait"

_api: Any = None  # the opentelemetry modules once looked up; False: not installed
#: The API's variable naming a tracer provider to load, and whether it was set (read once).
_PROVIDER_ENV = "OTEL_PYTHON_TRACER_PROVIDER"
_provider_from_env: bool | None = None
_UNKNOWN = object()


def _otel() -> Any:
    """``(trace, propagate)`` of opentelemetry-api, or None when it is not installed."""
    global _api
    if _api is None:
        try:
            from opentelemetry import propagate, trace
        except ImportError:
            _api = False
        else:
            _api = (trace, propagate)
    return _api or None


def recording() -> bool:
    """Whether a valid span is current (so an insert now records a publish span)."""
    api = _otel()
    return api is not None and bool(api[0].get_current_span().get_span_context().is_valid)


def with_trace_context(meta: Mapping[str, Any] | None, queue: str | None) -> Any:
    """``meta`` plus the trace context of a publish span recorded now, or ``meta`` as it
    is when no valid span is current and it holds no ``traceparent`` of its own.

    A ``traceparent`` (and ``tracestate``) the application put in ``meta`` (checked well
    formed by ``validation.dump_meta``) is the publish span's parent, and the current
    span, if any, only a link of it. That is someone propagating a context by hand: a
    consumer that received one with a message, or a handler passing its ``job.meta`` on
    to a follow-up job. Refusing it while a span is current would make that code fail
    only once tracing is turned on; replacing it silently would drop the trace it names.
    The publish span is still recorded (as that context's child), so the job's process
    span hangs under it like any other.
    """
    api = _otel()
    if api is None:
        return meta
    trace = api[0]
    given = meta is not None and TRACEPARENT in meta
    current = trace.get_current_span().get_span_context()
    if not given and not current.is_valid:
        return meta
    given_context = None
    links = []
    if given:
        assert meta is not None
        headers = {k: str(meta[k]) for k in (TRACEPARENT, TRACESTATE) if k in meta}
        given_context = _w3c().extract(headers)
        links = [trace.Link(current)] if current.is_valid else []
    destination = queue or "default"
    tracer = trace.get_tracer(_SCOPE)
    with tracer.start_as_current_span(
        f"publish {destination}",
        context=given_context,
        kind=trace.SpanKind.PRODUCER,
        links=links,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": destination,
        },
    ):
        carrier: dict[str, str] = {}
        _w3c().inject(carrier)
    found = {TRACEPARENT: carrier[TRACEPARENT]} if TRACEPARENT in carrier else {}
    state = bounded_tracestate(carrier.get(TRACESTATE, ""))
    if state:
        found[TRACESTATE] = state
    context = {k: v for k, v in (meta or {}).items() if k not in (TRACEPARENT, TRACESTATE)}
    return {**context, **found}


def _w3c() -> Any:
    """The W3C Trace Context propagator: the meta's keys are its headers, whichever
    propagators the application configured for its own requests."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def bounded_tracestate(value: str) -> str:
    """``value`` cut to at most ``validation.MAX_TRACESTATE_BYTES`` as JSON, as W3C says a
    vendor may: entries longer than 128 characters go first, then entries from the end."""
    from sqla_jobs import validation

    limit = validation.MAX_TRACESTATE_BYTES

    def size(entries: list[str]) -> int:
        return len(json.dumps(",".join(entries))) - 2

    entries = [e.strip() for e in value.split(",") if e.strip()]
    if size(entries) <= limit:
        return ",".join(entries)
    entries = [e for e in entries if len(e) <= 128]
    while entries and size(entries) > limit:
        entries.pop()
    return ",".join(entries)


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers, for another process (empty without
    the API or a current span)."""
    api = _otel()
    found: dict[str, str] = {}
    if api is not None:
        api[1].inject(found)
    return found


@contextmanager
def attached(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Inside the block the trace context of ``headers`` (``carrier``) is current:
    spans started there are its children."""
    api = _otel()
    if api is None or not headers:
        yield
        return
    from opentelemetry import context

    token = context.attach(api[1].extract(dict(headers)))
    try:
        yield
    finally:
        context.detach(token)


def _mode() -> str:
    return LINK if os.environ.get(MODE_ENV, PARENT).strip().lower() == LINK else PARENT


class ClaimedJob(Protocol):
    """What the process span reads of a claimed job (the worker's ``Claimed``)."""

    @property
    def id(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def meta(self) -> dict[str, Any] | None: ...
    @property
    def waited(self) -> float | None: ...


class AttemptSpan:
    """One attempt's recording process span, and who ends it.

    The executor's block (``process_span``) ends it when the attempt's outcome was
    recorded on the executor's own thread or task: a done-mark in the handler's
    transaction, a failure, a process-isolated child's done-mark. A handler that wrote
    nothing is marked done later, in the completer's next batch (one statement for up
    to a thousand jobs, on the completer's thread), and only that batch's commit tells
    whether the attempt is done or its claim was lost. So the completer takes the span
    over when it queues the done-mark (``hand_over``), and ends it after the batch,
    with the outcome on it: the span's end is then a little later than the handler's,
    but its recorded outcome is the real one. Ending it on the handler's thread and
    recording the outcome as a separate span (or not at all) would leave the attempt's
    own span without the one fact an operator looks for.
    """

    __slots__ = ("handed_over", "span")

    def __init__(self, span: Any) -> None:
        self.span = span
        #: The completer ends the span (after its batch); the executor's block does not.
        self.handed_over = False

    def hand_over(self) -> None:
        """The completer ends the span from now on (after the batch that marks it done)."""
        self.handed_over = True

    def end(self) -> None:
        self.span.end()


def process_span(job: ClaimedJob) -> AbstractContextManager[AttemptSpan | None]:
    """The span of one attempt, current inside the block; None without the API or
    when the span records nothing (no SDK, not sampled).

    Yields it so the worker records the outcome (``ended``, ``settled``). An
    exception escaping the block is recorded on it. It ends with the block unless it
    was handed over to the completer (``AttemptSpan``).
    """
    api = _otel()
    if api is None or _no_sdk(api[0]):
        # One shared do-nothing block: a generator context manager per attempt was
        # a tenth of a no-op job's time on its thread (benchmarks/README.md, #23).
        return _NO_SPAN
    return _process_span(job, api[0])


_NO_SPAN: AbstractContextManager[None] = nullcontext(None)


@contextmanager
def _process_span(job: ClaimedJob, trace: Any) -> Iterator[AttemptSpan | None]:
    meta = job.meta
    carrier = {k: str(meta[k]) for k in (TRACEPARENT, TRACESTATE) if meta and k in meta}
    parent = _w3c().extract(carrier) if carrier else None
    links = []
    if parent is not None and _mode() == LINK:
        linked = trace.get_current_span(parent).get_span_context()
        links = [trace.Link(linked)] if linked.is_valid else []
        parent = None
    tracer = trace.get_tracer(_SCOPE)
    span = tracer.start_span(
        f"process {job.queue}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=_attributes(job),
    )
    traced = AttemptSpan(span) if span.is_recording() else None
    try:
        with trace.use_span(
            span, end_on_exit=False, record_exception=True, set_status_on_exception=True
        ):
            yield traced
    finally:
        if traced is None or not traced.handed_over:
            span.end()


def _no_sdk(trace: Any) -> bool:
    """Whether no tracer provider is configured (the API alone): its spans are invalid
    and record nothing, so an attempt skips building one (measured: 18 us an attempt,
    0.85x of the drain's throughput with no-op handlers, with the API and no SDK)."""
    global _provider_from_env
    if _provider_from_env is None:
        _provider_from_env = _PROVIDER_ENV in os.environ
    # ``get_tracer_provider()`` looks the variable up in ``os.environ`` on every call
    # until a provider is set: 10% of a no-op drain's worker time under load (#23). The
    # API reads the variable only to load a provider, so once per process is enough;
    # with none set by code either (the API's own global), nothing records.
    if not _provider_from_env and getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None:
        return True
    return isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def _attributes(job: ClaimedJob) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "sqla_jobs.job.kind": job.kind,
        "sqla_jobs.job.attempt": job.attempt,
    }
    if job.waited is not None:
        # From the job's run_at to its claim, both by the database's clock (the claim
        # computes it): a worker whose clock is off does not skew it.
        attributes[QUEUE_WAIT] = job.waited
    return attributes


def ended(traced: AttemptSpan | None, error: BaseException | None, outcome: str) -> None:
    """Record how the handler ended on its attempt's span: the outcome, and the error if
    any."""
    if traced is None:
        return
    span = traced.span
    trace = _otel()[0]
    span.set_attribute("sqla_jobs.job.outcome", outcome)
    if error is not None:
        span.record_exception(error)
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.add_event(outcome, {"exception.type": type(error).__name__})


#: What the worker recorded for the attempt (the completer's outcome: ``done``,
#: ``retry``, ``dead``, ``lost``, ``snoozed``, ``cancelled``), once it is known.
RECORDED = "sqla_jobs.job.recorded_outcome"
#: The event each recorded outcome adds to the span (the others add none).
_EVENTS = {"retry": "retry scheduled", "dead": "dead", "lost": "claim lost"}


def settled(traced: AttemptSpan | None, outcome: Any) -> None:
    """Record on the attempt's span what the worker recorded for it (an ``Outcome``):
    done, a failure's retry or death, or a lost claim (its fenced update matched nothing:
    the lease expired and another worker took the job, or an operator changed it), which
    also sets the span's status to ERROR. The completer calls it, wherever it records
    an outcome."""
    if traced is None:
        return
    span = traced.span
    value = str(getattr(outcome, "value", outcome))
    span.set_attribute(RECORDED, value)
    event = _EVENTS.get(value)
    if event is not None:
        span.add_event(event)
    if value == "lost":
        trace = _otel()[0]
        span.set_status(
            trace.Status(trace.StatusCode.ERROR, "claim lost: nothing of this run was recorded")
        )


def given_up(traced: AttemptSpan | None, outcome: Any) -> None:
    """The worker gave up on the run (its handler ignored its timeout or cancel past
    the grace) and recorded ``outcome`` (an ``Outcome``: a retry, a death, a cancel)
    without it; the handler came back since, too late to change anything. ``outcome``
    None: not known here (the handler came back while it was being recorded)."""
    if traced is None:
        return
    trace = _otel()[0]
    traced.span.add_event("given up")
    if outcome is None:
        settled(traced, "lost")
        return
    settled(traced, outcome)
    traced.span.set_status(
        trace.Status(
            trace.StatusCode.ERROR,
            "the worker gave up on the handler: it ran past its timeout or cancel and grace",
        )
    )


def outcome_of(error: BaseException | None) -> str:
    """The attempt's outcome as its span tells it (a failure's retry or death is the
    completer's to decide: ``failed`` covers both)."""
    if error is None:
        return "done"
    from sqla_jobs import exceptions

    for kind, name in (
        (exceptions.Snooze, "snoozed"),
        (exceptions.RetryIn, "retry"),
        (exceptions.Discard, "cancelled"),
        (exceptions.JobTimeout, "timeout"),
        (exceptions.JobCancelled, "cancelled"),
    ):
        if isinstance(error, kind):
            return name
    return "failed"
