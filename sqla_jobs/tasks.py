"""The handler registry: which function runs each kind of job, and its defaults.

::

    registry = Registry()

    @registry.handler("send_welcome_email", max_attempts=5)
    def send_welcome_email(session, payload):
        ...

    send_welcome_email.enqueue(session, {"user_id": 42})   # kind typed once

A handler takes ``(session, payload)`` or ``(session, payload, job)``; ``job`` is a
[``JobContext``][sqla_jobs.tasks.JobContext] (id, kind, attempt, ...), also available anywhere in
the handler's call stack through [``current_job``][sqla_jobs.tasks.current_job]. The worker imports
the module that builds the registry, so importing it must register every handler.

An ``async def`` handler gets an ``AsyncSession`` instead and runs on the worker's event
loop (``WorkerConfig.async_concurrency`` at once); its writes commit with the done-mark,
in one transaction, as a plain ``def`` handler's do::

    @registry.handler("notify_user")
    async def notify_user(session: AsyncSession, payload, job):
        user = await session.get(User, payload["user_id"])
        ...

    await notify_user.enqueue_async(async_session, {"user_id": 42})
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import inspect
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar, cast

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_jobs import periodic as _periodic
from sqla_jobs import producer, validation
from sqla_jobs.control import Control
from sqla_jobs.exceptions import InvalidJobError, RegistryError
from sqla_jobs.models import DEFAULT_QUEUE
from sqla_jobs.retry import Backoff

R = TypeVar("R")

#: Where a sync handler runs: on a worker thread, or in a child process killed at its deadline.
ISOLATIONS = ("thread", "process")
#: How often a job may raise Snooze before one more counts as a failed attempt.
DEFAULT_MAX_SNOOZES = 100


@dataclass(frozen=True)
class JobContext:
    """What a running handler may know about its own job.

    ``id`` and ``attempt`` together identify this run: derive downstream idempotency
    keys from ``id`` (stable across retries), not from ``attempt``.
    """

    id: int
    kind: str
    queue: str
    attempt: int
    max_attempts: int
    worker: str
    #: The tick a periodic job serves (aware, in its schedule's UTC offset); None for
    #: jobs not enqueued by a schedule. See ``sqla_jobs.periodic``.
    scheduled_for: datetime | None = None
    #: The run's deadline and cancel flag (set by the worker; none in a plain call).
    control: Control | None = field(default=None, repr=False, compare=False)
    #: The job's metadata as enqueued (``enqueue(..., meta=..., tags=...)``); empty
    #: when it has none.
    meta: Mapping[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()

    @property
    def deadline(self) -> float | None:
        """When this run's time is up, on ``time.monotonic()``; None without a timeout.

        The clock of asyncio's default loop too: ``asyncio.timeout_at(job.deadline)``.
        """
        return None if self.control is None else self.control.deadline

    def time_left(self) -> float | None:
        """Seconds until [``deadline``][sqla_jobs.tasks.JobContext.deadline] (0 once passed); None
        without a timeout."""
        return None if self.control is None else self.control.time_left()

    @property
    def cancelled(self) -> bool:
        """True once this run must stop: its timeout passed, or an operator cancelled it."""
        return self.control is not None and self.control.interruption() is not None

    def check(self) -> None:
        """Raise [``JobTimeout``][sqla_jobs.JobTimeout] or
        [``JobCancelled``][sqla_jobs.JobCancelled] if this
        run must stop; call it in long loops. The worker rolls back the run's writes."""
        if self.control is not None:
            self.control.check()


_current: contextvars.ContextVar[JobContext] = contextvars.ContextVar("sqla_jobs_current_job")


def current_job() -> JobContext:
    """The job being run by the calling handler; LookupError outside a handler.

    A context variable: in an ``async def`` handler it is the job of the calling task
    (tasks the handler starts inherit it), whatever else runs on the loop meanwhile.
    """
    try:
        return _current.get()
    except LookupError:
        raise LookupError("current_job() is only available inside a running handler") from None


class Handler(Generic[R]):
    """A registered handler: call it like the function, or ``.enqueue`` a job for it."""

    def __init__(
        self,
        kind: str,
        fn: Callable[..., R],
        *,
        max_attempts: int | None = None,
        queue: str | None = None,
        priority: int | None = None,
        backoff: Backoff | None = None,
        timeout: float | timedelta | None = None,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
        isolation: str = "thread",
        limit: int | None = None,
        rate: str | validation.Rate | None = None,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise RegistryError(
                f"handler {kind!r}: isolation must be 'thread' or 'process', got {isolation!r}"
            )
        self.isolation = isolation
        try:
            self.kind = validation.check_kind(kind)
            self.timeout = validation.check_timeout(timeout)
            self.max_snoozes = validation.integer("max_snoozes", max_snoozes, minimum=0)
            self.limit = None if limit is None else validation.check_limit("limit", limit)
            self.rate = None if rate is None else validation.check_rate("rate", rate)
            self.max_attempts = (
                None if max_attempts is None else validation.check_max_attempts(max_attempts)
            )
            self.queue = None if queue is None else validation.check_queue(queue)
            self.priority = None if priority is None else validation.check_priority(priority)
        except InvalidJobError as exc:
            raise RegistryError(f"handler {kind!r}: {exc}") from None
        if not callable(fn):
            raise RegistryError(f"handler {kind!r} is not callable")
        self.fn = fn
        self.backoff = backoff or Backoff()
        self.wants_job = _takes_job_argument(self.kind, fn)
        self.periodic = False  # set when a schedule enqueues this kind
        #: An ``async def`` handler: the worker runs it on its event loop, with an
        #: AsyncSession (``run_async``).
        self.is_async = _is_async(fn)
        if self.is_async and isolation == "process":
            raise RegistryError(
                f"handler {kind!r}: isolation='process' is for plain def handlers; an async "
                "def handler runs on the worker's event loop (its timeout and cancel cancel "
                "its task): drop isolation='process' or write the handler as a plain def"
            )

    def __call__(self, session: Session, payload: Mapping[str, Any], job: JobContext) -> R:
        if self.is_async:
            raise TypeError(
                f"handler {self.kind!r} is an async def function: await "
                "handler.run_async(async_session, payload, job) instead"
            )
        if self.periodic and job.scheduled_for is None:
            job = dataclasses.replace(job, scheduled_for=_periodic.scheduled_for(payload))
        token = _current.set(job)
        try:
            if self.wants_job:
                return self.fn(session, payload, job)
            return self.fn(session, payload)
        finally:
            _current.reset(token)

    async def run_async(
        self, session: AsyncSession, payload: Mapping[str, Any], job: JobContext
    ) -> Any:
        """Await an ``async def`` handler, with [``current_job``][sqla_jobs.tasks.current_job] set
        for its task."""
        if not self.is_async:
            raise TypeError(f"handler {self.kind!r} is a plain def function: call it")
        if self.periodic and job.scheduled_for is None:
            job = dataclasses.replace(job, scheduled_for=_periodic.scheduled_for(payload))
        # Set inside the coroutine, so in the context of the task (the executor's lane)
        # that runs it: each lane has its own copy, and concurrent jobs on one loop never
        # see each other's; reset when the handler returns.
        token = _current.set(job)
        try:
            fn = cast("Callable[..., Awaitable[Any]]", self.fn)
            if self.wants_job:
                return await fn(session, payload, job)
            return await fn(session, payload)
        finally:
            _current.reset(token)

    def new(
        self,
        payload: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        meta: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
    ) -> producer.NewJob:
        """A [``NewJob``][sqla_jobs.NewJob] of this kind, with this handler's defaults, for
        enqueue_many."""
        return producer.NewJob(
            self.kind,
            {} if payload is None else payload,
            key=key,
            run_at=run_at,
            delay=delay,
            queue=queue if queue is not None else self.queue,
            priority=priority if priority is not None else self.priority,
            max_attempts=max_attempts if max_attempts is not None else self.max_attempts,
            timeout=timeout,
            meta=meta,
            tags=tags,
        )

    def enqueue(
        self,
        session: producer.Executor,
        payload: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> int | None:
        """``sqla_jobs.enqueue`` for this kind with this handler's defaults. Never commits."""
        # The NewJob is validated once, here; insert_one does not check it again.
        return producer.insert_one(session, self.new(payload, **options))

    async def enqueue_async(
        self,
        session: producer.AsyncExecutor,
        payload: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> int | None:
        """``enqueue`` on an ``AsyncSession`` or ``AsyncConnection``. Never commits."""
        return await producer.insert_one_async(session, self.new(payload, **options))

    def __repr__(self) -> str:
        return f"<Handler {self.kind!r} -> {getattr(self.fn, '__qualname__', self.fn)!r}>"


def _takes_job_argument(kind: str, fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` wants ``job`` too; RegistryError unless it can be called as a handler."""
    name = getattr(fn, "__qualname__", repr(fn))
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise RegistryError(
            f"handler {kind!r} ({name}) is a generator function (it contains `yield`): "
            "calling it would not run its body; write it as a plain def (or async def) that "
            "returns"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False  # a builtin without a signature: trust it with (session, payload)
    for wants_job, args in ((True, ("session", "payload", "job")), (False, ("session", "payload"))):
        try:
            signature.bind(*args)
        except TypeError:
            continue
        return wants_job
    raise RegistryError(
        f"handler {kind!r} ({name}{signature}) cannot be called as (session, payload) or "
        "(session, payload, job): write it as def handler(session, payload) or "
        "def handler(session, payload, job) (or async def, with the same arguments)"
    )


def _is_async(fn: Callable[..., Any]) -> bool:
    """An ``async def`` function, or a callable object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (a callable object's async __call__)
    )


class Registry:
    """Maps job kinds to handlers. One registry per application (or per worker)."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler[Any]] = {}
        self._schedules: dict[str, _periodic.Schedule] = {}
        self._queue_limits: dict[str, tuple[int | None, validation.Rate | None]] = {}

    def limit_queue(
        self, queue: str, *, limit: int | None = None, rate: str | validation.Rate | None = None
    ) -> None:
        """Declare a fleet-wide limit for a queue: at most ``limit`` of its jobs run at once,
        at most ``rate`` (``"100/min"``) start per window. Operators can override both."""
        try:
            name = validation.check_queue(queue)
            checked = (
                None if limit is None else validation.check_limit("limit", limit),
                None if rate is None else validation.check_rate("rate", rate),
            )
        except InvalidJobError as exc:
            raise RegistryError(f"queue {queue!r}: {exc}") from None
        if checked == (None, None):
            raise RegistryError(f"queue {queue!r}: limit_queue needs a limit or a rate")
        self._queue_limits[name] = checked

    def queue_limits(self) -> dict[str, tuple[int | None, validation.Rate | None]]:
        """Queues with a declared limit: ``{queue: (limit, rate)}``."""
        return dict(self._queue_limits)

    def handler(
        self,
        kind: str,
        *,
        max_attempts: int | None = None,
        queue: str | None = None,
        priority: int | None = None,
        backoff: Backoff | None = None,
        timeout: float | timedelta | None = None,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
        isolation: str = "thread",
        limit: int | None = None,
        rate: str | validation.Rate | None = None,
    ) -> Callable[[Callable[..., R]], Handler[R]]:
        """Decorator registering ``fn(session, payload[, job])`` for ``kind``.

        ``timeout`` (seconds or timedelta): how long one run may take, unless the job
        sets its own (``enqueue(..., timeout=...)``); see the Job control guide.
        ``max_snoozes``: how often a job may raise [``Snooze``][sqla_jobs.Snooze].
        ``isolation="process"``: run each job in a child process that the worker kills at
        the deadline or a cancel (see the Job control guide).

        ``limit``: at most this many jobs of the kind run at once across every worker;
        ``rate`` (``"100/min"``): at most that many start in any such window. Both are
        the code's defaults; operators override them at run time (``sqla-jobs limit``).
        """
        if not isinstance(kind, str):
            raise RegistryError(
                'registry.handler needs the job\'s kind: write @registry.handler("kind"), '
                f"not @registry.handler (got {getattr(kind, '__qualname__', kind)!r})"
            )

        def register(fn: Callable[..., R]) -> Handler[R]:
            return self.register(
                kind,
                fn,
                max_attempts=max_attempts,
                queue=queue,
                priority=priority,
                backoff=backoff,
                timeout=timeout,
                max_snoozes=max_snoozes,
                isolation=isolation,
                limit=limit,
                rate=rate,
            )

        return register

    def register(
        self,
        kind: str,
        fn: Callable[..., R],
        *,
        max_attempts: int | None = None,
        queue: str | None = None,
        priority: int | None = None,
        backoff: Backoff | None = None,
        timeout: float | timedelta | None = None,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
        isolation: str = "thread",
        limit: int | None = None,
        rate: str | validation.Rate | None = None,
    ) -> Handler[R]:
        if kind in self._handlers:
            raise RegistryError(f"kind {kind!r} is already registered")
        handler = Handler(
            kind,
            fn,
            max_attempts=max_attempts,
            queue=queue,
            priority=priority,
            backoff=backoff,
            timeout=timeout,
            max_snoozes=max_snoozes,
            isolation=isolation,
            limit=limit,
            rate=rate,
        )
        self._handlers[kind] = handler
        return handler

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: timedelta | None = None,
        name: str | None = None,
        timezone: str = "UTC",
        payload: Mapping[str, Any] | None = None,
        missed: _periodic.Missed = "latest",
        catch_up: timedelta | int | None = None,
        grace: timedelta = _periodic.DEFAULT_GRACE,
        meta: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
    ) -> Callable[[Handler[R]], Handler[R]]:
        """Decorator adding a schedule to a registered handler; goes above ``@handler``::

            @registry.periodic("0 2 * * *", timezone="Europe/Berlin")
            @registry.handler("nightly_report")
            def nightly_report(session, payload, job): ...

        ``name`` defaults to the handler's kind; stack several ``@registry.periodic``
        with distinct names for several schedules of one kind. The arguments are those
        of [``schedule``][sqla_jobs.tasks.Registry.schedule]. Returns the handler unchanged.
        """

        def add(handler: Handler[R]) -> Handler[R]:
            if not isinstance(handler, Handler):
                raise RegistryError(
                    f"@registry.periodic goes above @registry.handler(...) (got "
                    f"{getattr(handler, '__qualname__', handler)!r}, not a registered handler)"
                )
            self.schedule(
                handler.kind if name is None else name,
                cron,
                handler,
                every=every,
                timezone=timezone,
                payload=payload,
                missed=missed,
                catch_up=catch_up,
                grace=grace,
                meta=meta,
                tags=tags,
            )
            return handler

        return add

    def schedule(
        self,
        name: str,
        cron: str | None,
        handler: Handler[Any] | str,
        *,
        every: timedelta | None = None,
        timezone: str = "UTC",
        payload: Mapping[str, Any] | None = None,
        missed: _periodic.Missed = "latest",
        catch_up: timedelta | int | None = None,
        grace: timedelta = _periodic.DEFAULT_GRACE,
        meta: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
    ) -> _periodic.Schedule:
        """Enqueue a job of ``handler``'s kind at every tick of a schedule named ``name``.

        ``cron``: a 5-field expression or an alias (``@hourly``, ``@daily``, ...), read in
        ``timezone`` (an IANA name); or ``cron=None`` and ``every=timedelta(...)``.
        ``payload``: the jobs' payload, plus ``"scheduled_for"`` (the tick). ``missed``:
        ``"latest"`` (default), ``"skip"`` or ``"all"`` (with ``catch_up``), applied when
        a due tick is more than ``grace`` old (see [``sqla_jobs.periodic``][sqla_jobs.periodic]).
        ``meta`` and ``tags``: the metadata of every tick's job.
        ``handler``: a registered [``Handler``][sqla_jobs.tasks.Handler] or its kind. Raises
        RegistryError, naming the schedule, for anything that could not run.
        """
        kind = handler.kind if isinstance(handler, Handler) else handler
        if not isinstance(kind, str) or kind not in self._handlers:
            raise RegistryError(
                f"schedule {name!r}: kind {kind!r} has no handler in this registry; register "
                "the handler before its schedule"
            )
        found = _periodic.Schedule(
            name,
            kind,
            cron=cron,
            every=every,
            timezone=timezone,
            payload={} if payload is None else payload,
            missed=missed,
            catch_up=catch_up,
            grace=grace,
            meta=meta,
            tags=tags,
        )
        if found.name in self._schedules:
            raise RegistryError(
                f"schedule {found.name!r} is already registered; give each schedule of a kind "
                "its own name="
            )
        self._schedules[found.name] = found
        self._handlers[kind].periodic = True
        return found

    @property
    def schedules(self) -> tuple[_periodic.Schedule, ...]:
        """Every schedule, sorted by name."""
        return tuple(self._schedules[n] for n in sorted(self._schedules))

    def __getitem__(self, kind: str) -> Handler[Any]:
        return self._handlers[kind]

    def _handler_for(self, kind: str) -> Handler[Any]:
        handler = self._handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            known = ", ".join(self.kinds) or "none"
            raise RegistryError(f"no handler registered for kind {kind!r} (registered: {known})")
        return handler

    def new(
        self, kind: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> producer.NewJob:
        """A [``NewJob``][sqla_jobs.NewJob] of ``kind`` with its handler's defaults (queue,
        priority,
        max_attempts), for ``enqueue_many``. RegistryError for a kind with no handler."""
        return self._handler_for(kind).new(payload, **options)

    def enqueue(
        self,
        session: producer.Executor,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> int | None:
        """Enqueue ``kind`` by name with its handler's defaults, as ``handler.enqueue`` does.

        Plain [``sqla_jobs.enqueue``][sqla_jobs.enqueue] (and ``Job(...)``) never look at a
        registry: a job without ``max_attempts`` gets its handler's when a worker claims it, but
        ``queue`` and ``priority`` default to ``"default"`` and 0 (the worker warns about
        ready jobs left in a queue it does not serve). A kind with no handler here is a
        RegistryError, raised before anything is written. Never commits.
        """
        return self._handler_for(kind).enqueue(session, payload, **options)

    async def enqueue_async(
        self,
        session: producer.AsyncExecutor,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> int | None:
        """``enqueue`` on an ``AsyncSession`` or ``AsyncConnection``. Never commits."""
        return await self._handler_for(kind).enqueue_async(session, payload, **options)

    def __contains__(self, kind: object) -> bool:
        return kind in self._handlers

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._handlers))

    def __len__(self) -> int:
        return len(self._handlers)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted(self._handlers))

    def queues(self) -> tuple[str, ...]:
        """``default`` plus every queue a handler declares: what a worker serves by default."""
        declared = {h.queue for h in self._handlers.values() if h.queue is not None}
        return (DEFAULT_QUEUE, *sorted(declared - {DEFAULT_QUEUE}))

    def handlers(self) -> list[Handler[Any]]:
        """The registered handlers, by kind."""
        return [self._handlers[kind] for kind in sorted(self._handlers)]

    def max_attempts_by_kind(self) -> dict[str, int]:
        """The ``max_attempts`` each handler declares (kinds declaring none left out): what
        a worker's claim gives a job of that kind enqueued without one (else 8)."""
        return {h.kind: h.max_attempts for h in self.handlers() if h.max_attempts is not None}

    def kinds_where(self, is_async: bool) -> tuple[str, ...]:
        """The kinds whose handlers are ``async def`` (True) or plain ``def`` (False)."""
        return tuple(k for k in self.kinds if self._handlers[k].is_async == is_async)


def load_registry(path: str) -> Registry:
    """Import ``"package.module:attribute"`` and return the Registry it names."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise RegistryError(f"app must look like 'package.module:registry', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RegistryError(f"cannot import {module_name!r}: {exc}") from None
    if not hasattr(module, attr):
        raise RegistryError(f"module {module_name!r} has no attribute {attr!r} (in {path!r})")
    registry = getattr(module, attr)
    if not isinstance(registry, Registry):
        raise RegistryError(
            f"{path!r} is not a sqla_jobs.Registry (got {validation.what(registry)})"
        )
    if not len(registry):
        raise RegistryError(f"{path!r} has no handlers registered")
    return registry
