"""The asyncio executor: runs ``async def`` handlers on lanes of one event loop.

One thread (``sqla_jobs-asyncio``) runs an event loop; up to ``async_concurrency`` jobs
run on it at once, each on a *lane* (a long-lived task that runs one job after another,
started when a job finds every lane busy) with an ``AsyncSession`` of its own. The session's sync
half is the same ``HandlerSession`` a thread's handler gets, so the same guard
refuses every way to end the job's transaction (``await session.commit()`` goes through
``HandlerSession.commit``; ``AsyncConnection.commit()`` through
``GuardedConnection.commit``). Its transaction runs on a connection of the loop's small
pool, taken when the handler first uses the session (a handler that only awaits other
I/O holds none) and given back when the job's outcome is recorded.

Each run ends in the same ``Attempt`` as a thread's, recorded by the same
``Completer``: the done-mark in the handler's transaction (fenced, then commit),
a batch done-mark for a handler that wrote nothing, a retry or a dead job for one that
raised (``BaseException`` and a ``CancelledError`` it raised itself included). The
blocking parts of the completer (failures, releases) run in the loop's default thread
pool, never on the loop.

Leases are renewed by the lease keeper on its own thread, so a handler that blocks the
loop (``time.sleep``, a CPU loop) delays the other tasks but never loses its claims.
At shutdown the feed stops; running tasks get the shutdown timeout, then are
cancelled: their transactions are rolled back and their jobs left to their leases
(never marked done, never lost).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from sqla_jobs import _otel
from sqla_jobs.config import WorkerConfig
from sqla_jobs.control import Control
from sqla_jobs.sql import lease
from sqla_jobs.tasks import Registry
from sqla_jobs.worker import _connlost, _session
from sqla_jobs.worker._buffer import Waiting
from sqla_jobs.worker._completer import Completer, fields
from sqla_jobs.worker._inflight import Attempt, Claimed, Inflight
from sqla_jobs.worker._session import HandlerSession, ThreadConnection

log = logging.getLogger("sqla_jobs.worker")

#: Connections of the loop's pool: this many (at most ``async_concurrency``), and as
#: many again as overflow. Handlers that wait for one await it; they do not block the loop.
ASYNC_POOL_SIZE = 10
#: The GIL switch interval of a worker process that runs ``async def`` handlers (the
#: CLI sets it; a worker embedded in an application leaves the application's). The event
#: loop's thread holds the GIL through a run of short jobs, and the dispatcher and the
#: completer, back from a round trip, waited for Python's default 5 ms before they could
#: hand it more jobs or take their outcomes: 0.72-0.74x the no-op rate of plain
#: handlers, about 0.9-1.0x with 0.5 ms (see benchmarks/README.md).
ASYNC_SWITCH_INTERVAL = 0.0005
#: How long the drain waits for cancelled tasks to roll back before it moves on.
CANCEL_GRACE_SECONDS = 5.0


class LoopBuffer:
    """The event loop's buffer: any thread puts claimed jobs in; the loop hands them out.

    Jobs wait most urgent first (``Waiting``, safe from any
    thread), so the drain can take back the jobs no lane started (``get_nowait``)
    from its own thread. A put wakes the loop (``call_soon_threadsafe``) only if no
    hand-out is scheduled yet: one wake-up per claimed batch, not one per job.
    """

    def __init__(self) -> None:
        self.jobs = Waiting()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hand_out: Callable[[], None] | None = None
        # Set by any thread when it schedules a hand-out; cleared by the hand-out first.
        self.scheduled = False

    def attach(self, loop: asyncio.AbstractEventLoop, hand_out: Callable[[], None]) -> None:
        self._loop, self._hand_out = loop, hand_out

    def put(self, item: Claimed | None) -> None:
        if item is not None:
            self.jobs.push(item)
        self.wake()

    def wake(self) -> None:
        loop, hand_out = self._loop, self._hand_out
        if not self.scheduled and loop is not None and hand_out is not None:
            self.scheduled = True
            with contextlib.suppress(RuntimeError):  # a closed loop has nothing to wake
                loop.call_soon_threadsafe(hand_out)

    def get_nowait(self) -> Claimed | None:
        try:
            return self.jobs.pop()
        except IndexError:
            raise queue.Empty from None


@dataclass
class _Running:
    """One task's job, and whether the drain cancelled it (then nothing is recorded)."""

    job: Claimed
    in_handler: bool = True
    cancelled: bool = False
    task: asyncio.Task[None] | None = None


class AsyncExecutor:
    """One event loop on its own thread, running up to ``async_concurrency`` handlers."""

    def __init__(
        self,
        config: WorkerConfig,
        registry: Registry,
        ledger: Inflight,
        buffer: LoopBuffer,
        completer: Completer,
        draining: threading.Event,
        job_took: Callable[[float], None],
        on_failure: Callable[[], None],
    ) -> None:
        self.config = config
        #: Called if the loop ends by an error: the worker stops (and gives back the jobs
        #: claimed for the loop) rather than claim jobs nothing will run.
        self.on_failure = on_failure
        self.registry = registry
        self.ledger = ledger
        self.buffer = buffer
        self.completer = completer
        self.draining = draining
        self.job_took = job_took
        self.slots = config.async_concurrency
        self.engine: AsyncEngine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stopping = False
        # Each lane's task, and the run it is in (None while it waits for a job).
        self._lanes: dict[asyncio.Task[None], _Running | None] = {}
        self._idle: collections.deque[asyncio.Future[Claimed | None]] = collections.deque()
        self._all_out: asyncio.Event | None = None

    # --- called from the supervisor's threads -----------------------------------------

    def start(self, timeout: float = 30.0) -> threading.Thread:
        self._thread = threading.Thread(target=self._main, name="sqla_jobs-asyncio", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            log.warning("the event loop of async handlers is still starting after %.0fs", timeout)
        return self._thread

    def stop(self) -> None:
        """Start no more jobs; running ones go on (see ``cancel_running``)."""
        self._stopping = True
        self.buffer.scheduled = False  # a hand-out must run after this, to end idle lanes
        self.buffer.wake()

    def cancel_running(self) -> None:
        """The shutdown timeout passed: cancel the handlers still running."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already ended
            loop.call_soon_threadsafe(self._cancel_all)

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # --- on the loop ------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException:
            log.exception("the event loop of async handlers failed; stopping the worker")
            self.on_failure()
        finally:
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._all_out = asyncio.Event()
        self.buffer.attach(self._loop, self._hand_out)
        size = min(self.slots, ASYNC_POOL_SIZE)
        self.engine = create_async_engine(
            self.config.url,
            pool_size=size,
            max_overflow=size,
            pool_timeout=60,
            connect_args={} if self.config.prepared_statements else {"prepare_threshold": None},
        )
        _connlost.install(self.engine.sync_engine)  # as the worker's own engine (keepalives too)
        self._started.set()
        try:
            self._hand_out()  # jobs put before the loop was attached
            await self._all_out.wait()
        finally:
            await self.engine.dispose()

    # Lanes: up to ``slots`` long-lived tasks, each running one job after another (a
    # task per job, with a semaphore for the slots, cost a third of a no-op job). A lane
    # is started when a job finds every lane busy, and waits, idle, for the next job.

    def _hand_out(self) -> None:
        """On the loop: give buffered jobs to idle lanes, starting lanes while there is
        room; at shutdown, tell idle lanes to end."""
        buffer = self.buffer
        buffer.scheduled = False  # first: a put from now on schedules another hand-out
        while buffer.jobs:
            if self._idle:
                waiter = self._idle.popleft()
                if waiter.done():
                    continue
                try:
                    waiter.set_result(buffer.jobs.pop())
                except IndexError:  # the drain took it back meanwhile
                    waiter.set_result(None)
            elif len(self._lanes) < self.slots and not self._stopping:
                try:
                    job = buffer.jobs.pop()
                except IndexError:
                    break
                self._start_lane(job)
            else:
                break  # every lane is busy: each takes the next job when it is done
        if self._stopping:
            while self._idle:
                waiter = self._idle.popleft()
                if not waiter.done():
                    waiter.set_result(None)
            if not self._lanes and self._all_out is not None:
                self._all_out.set()

    def _start_lane(self, job: Claimed) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._lane(job), name=f"sqla_jobs-lane-{len(self._lanes)}")
        self._lanes[task] = None

    async def _lane(self, job: Claimed | None) -> None:
        task = asyncio.current_task()
        assert task is not None and self._loop is not None
        try:
            while job is not None:
                running = _Running(job, task=task)
                self._lanes[task] = running
                await self._run(running)
                self._lanes[task] = None
                if self._stopping and running.cancelled:
                    return
                _uncancel_all(task)  # a handler that swallowed a cancel leaves none behind
                # Let the loop run other lanes and callbacks between jobs: a handler that
                # never suspends would otherwise keep the loop from one job to the next.
                await asyncio.sleep(0)
                job = await self._next_job()
        finally:
            self._lanes.pop(task, None)
            if self._stopping and not self._lanes and self._all_out is not None:
                self._all_out.set()

    async def _next_job(self) -> Claimed | None:
        """The next buffered job; None once stopping and nothing is left."""
        buffer = self.buffer
        if buffer.jobs:
            try:
                return buffer.jobs.pop()
            except IndexError:
                pass  # the drain took it back
        if self._stopping:
            return None
        assert self._loop is not None
        waiter: asyncio.Future[Claimed | None] = self._loop.create_future()
        self._idle.append(waiter)
        if buffer.jobs:  # put after the look above, before the wait: hand it out now
            self._hand_out()
        return await waiter

    def _cancel_all(self) -> None:
        for task, running in list(self._lanes.items()):
            if running is not None and running.in_handler:
                running.cancelled = True
                task.cancel()

    async def _run(self, running: _Running) -> None:
        job = running.job
        if self.draining.is_set():
            # Claimed but not started before shutdown: hand it back unspent.
            await asyncio.to_thread(self.completer.release, [job])
            return
        if not self.ledger.start(job):
            await asyncio.to_thread(self.completer.give_back_expired, job)
            return
        assert self.engine is not None
        handler = self.registry[job.kind]
        control = Control(job.timeout if job.timeout is not None else handler.timeout)
        conn = ThreadConnection(self.engine.sync_engine, in_greenlet=True)
        conn.control = control  # its transaction begins with statement_timeout = time left
        loop = asyncio.get_running_loop()
        control.on_interrupt(conn.cancel_statement)
        control.on_interrupt(lambda: _call_soon(loop, self._interrupt, running))
        self.ledger.watch(job, control)
        session = AsyncSession(
            self.engine,
            sync_session_class=HandlerSession,
            autoflush=True,
            expire_on_commit=False,
        )
        handler_session: HandlerSession = session.sync_session  # type: ignore[assignment]
        handler_session._sqla_jobs_thread_conn = conn
        # The attempt carries its span to the completer (see _executor._run).
        with _otel.process_span(job) as span:
            try:
                try:
                    attempt = await self._attempt(running, session, conn, control, span)
                    if attempt is None:
                        log.warning(
                            "job %s: cancelled at the shutdown timeout; its writes were rolled "
                            "back and it runs again when its lease expires",
                            job.id,
                            extra=fields(job, outcome="cancelled"),
                        )
                        self.ledger.remove([job])
                        return
                    self.job_took(attempt.duration)
                    if attempt.error is None and (attempt.wrote or attempt.result is not None):
                        await self.completer.complete_in_async(session, attempt)
                        return
                finally:
                    if conn.conn is not None or _has_state(handler_session):
                        await session.run_sync(_release, conn)
                    # else: a session that never took a connection or held an object has
                    # nothing to end; a greenlet to say so cost a tenth of a no-op job.
                if attempt.error is None:
                    self.completer.complete_later(attempt)
                else:
                    await asyncio.to_thread(self.completer.fail, attempt)
            except Exception as exc:  # bookkeeping itself failed (database down or lost)
                await asyncio.to_thread(self.completer.outcome_unknown, job, exc)

    def _interrupt(self, running: _Running) -> None:
        """On the loop: the run's timeout passed, an operator cancelled it, or the worker
        gave up on it; its handler's task is cancelled (what it raises is recorded as
        the timeout or the cancel, see ``_attempt``)."""
        if running.in_handler and running.task is not None:
            running.task.cancel()

    async def _attempt(
        self,
        running: _Running,
        session: AsyncSession,
        conn: ThreadConnection,
        control: Control,
        span: _otel.AttemptSpan | None,
    ) -> Attempt | None:
        """The handler's run as an Attempt, how it ended on its OpenTelemetry ``span``
        (which the attempt carries to the completer); None if the drain cancelled it."""
        attempt = await self._run_handler(running, session, conn, control)
        if attempt is None or span is None:
            return attempt
        _otel.ended(span, attempt.error, _otel.outcome_of(attempt.error))
        return attempt._replace(span=span)

    async def _run_handler(
        self, running: _Running, session: AsyncSession, conn: ThreadConnection, control: Control
    ) -> Attempt | None:
        """The handler's run as an Attempt; None if the drain cancelled it.

        The same checks and decisions as a thread's run (``_executor._attempt``): a
        returned un-run coroutine fails, the result is stored with the done-mark,
        ``Snooze``/``RetryIn``/``Discard`` reach the completer, and the handler runs
        under ``asyncio.timeout_at`` of the run's deadline.
        """
        job = running.job
        handler = self.registry[job.kind]
        ctx = job.context(self.config.worker_id, control)
        started = control.started
        try:
            try:
                control.check()  # cancelled while it waited in the buffer: do not start it
                if control.deadline is None:  # no context manager to enter: most jobs
                    value = await handler.run_async(session, job.payload, ctx)
                else:
                    async with _deadline(control, running, self._interrupt):
                        value = await handler.run_async(session, job.payload, ctx)
            finally:
                running.in_handler = False
                control.finish()
                _session.disarm(conn)
            if running.cancelled:  # it swallowed the cancellation: still not recorded
                return None
            sync_session: HandlerSession = session.sync_session  # type: ignore[assignment]
            result, wrote = _session.returned(value, sync_session, conn, control)
            if wrote:
                await session.flush()
            if control.timeout is not None and sync_session.in_transaction():
                # The done-mark follows in this transaction: not under the handler's limit.
                await session.execute(lease.reset_statement_timeout())
            return Attempt(job, time.monotonic() - started, None, wrote, result, control)
        except BaseException as exc:  # CancelledError, SystemExit...: a failed attempt
            # Caught here, inside the task: an asyncio Task would re-raise SystemExit
            # and KeyboardInterrupt out of the loop and stop every other handler.
            control.finish()
            if running.cancelled:
                return None
            # The CancelledError of its deadline or a cancel, or a statement cancelled at
            # the deadline: recorded as the timeout or the cancel.
            recorded = control.failure(exc)
            if recorded is not exc and isinstance(exc, asyncio.CancelledError):
                task = asyncio.current_task()
                if task is not None:
                    _uncancel(task)  # the task goes on to record the outcome
            exc = recorded
            return Attempt(job, time.monotonic() - started, exc, control=control)


@contextlib.asynccontextmanager
async def _deadline(
    control: Control, running: _Running, interrupt: Callable[[_Running], None]
) -> AsyncIterator[None]:
    """``asyncio.timeout_at(control.deadline)`` (Python 3.11+); on 3.10, a timer that
    cancels the handler's task at the deadline (the loop's clock is ``time.monotonic()``,
    the deadline's)."""
    if control.deadline is None:
        yield
    elif sys.version_info >= (3, 11):
        async with asyncio.timeout_at(control.deadline):
            yield
    else:
        timer = asyncio.get_running_loop().call_at(control.deadline, interrupt, running)
        try:
            yield
        finally:
            timer.cancel()


def _uncancel(task: asyncio.Task[Any]) -> None:
    if sys.version_info >= (3, 11):
        task.uncancel()


def _uncancel_all(task: asyncio.Task[Any]) -> None:
    if sys.version_info >= (3, 11):
        while task.cancelling():
            task.uncancel()


def _call_soon(
    loop: asyncio.AbstractEventLoop, fn: Callable[[_Running], None], arg: _Running
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop already ended
        loop.call_soon_threadsafe(fn, arg)


def _has_state(session: HandlerSession) -> bool:
    return bool(session.in_transaction() or session.identity_map or session.new or session.deleted)


def _release(session: Any, conn: ThreadConnection) -> None:
    """End the job's session and give its connection back to the loop's pool.

    Run in the session's greenlet (``run_sync``): the pool is asyncio's.
    """
    _session.discard(session, conn)
    conn.close()
