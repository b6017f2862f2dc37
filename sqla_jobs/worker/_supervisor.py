"""The supervisor: builds the worker's parts, runs them, and stops them in phases.

Phases, in order: ``NEW`` -> ``RUNNING`` (claiming) -> ``DRAINING`` (no more claims;
buffered jobs given back; running handlers get ``shutdown_timeout``) -> ``STOPPED``
(services ended). SIGTERM or SIGINT (when ``run`` installs the handlers) or
``Worker.stop`` starts the drain; a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

import sqlalchemy as sa

from sqla_jobs import models
from sqla_jobs.config import WorkerConfig
from sqla_jobs.exceptions import SqlaJobsError
from sqla_jobs.sql import schema
from sqla_jobs.tasks import Registry
from sqla_jobs.worker import _connlost
from sqla_jobs.worker._async_executor import CANCEL_GRACE_SECONDS, AsyncExecutor, LoopBuffer
from sqla_jobs.worker._buffer import ThreadBuffer
from sqla_jobs.worker._completer import Completer
from sqla_jobs.worker._dispatcher import Dispatcher, Pool
from sqla_jobs.worker._events import Events, Subscriber
from sqla_jobs.worker._executor import ThreadExecutor
from sqla_jobs.worker._inflight import ASYNC_POOL, SYNC_POOL, Claimed, Inflight
from sqla_jobs.worker._limits import Gates, Limits
from sqla_jobs.worker._services import (
    Archiver,
    DeadlineWatch,
    LeaseKeeper,
    Listener,
    PeriodicEnqueuer,
    Rescuer,
    Service,
    UnservedWatch,
    WorkflowSweeper,
)

log = logging.getLogger("sqla_jobs.worker")


#: How often a worker started without a primary tries again (see Worker.run).
PRIMARY_WAIT_SECONDS = 1.0


class Phase(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


class Lifecycle:
    """The current phase, and an Event per phase that loops wait on."""

    def __init__(self) -> None:
        self.phase = Phase.NEW
        self.draining = threading.Event()  # set from DRAINING on
        self.stopped = threading.Event()  # set at STOPPED

    def enter(self, phase: Phase) -> None:
        self.phase = phase
        if phase in (Phase.DRAINING, Phase.STOPPED):
            self.draining.set()
        if phase is Phase.STOPPED:
            self.stopped.set()


class Worker:
    """Runs the handlers of ``registry`` until stopped.

    ``run()`` blocks; ``stop()`` (or SIGTERM/SIGINT when ``run`` installs the handlers)
    stops claiming, lets running handlers finish for up to ``shutdown_timeout`` seconds
    and returns. Jobs not finished by then keep their lease until it expires and are
    then taken by another worker: never lost.

    With no ``queues`` in the config, the worker serves ``default`` plus every queue its
    handlers declare.

    Plain ``def`` handlers run on ``concurrency`` threads; ``async def`` handlers on one
    event loop of its own thread, ``async_concurrency`` at once. A registry may mix both.
    """

    def __init__(
        self, registry: Registry, config: WorkerConfig, *, engine: sa.Engine | None = None
    ) -> None:
        if not len(registry):
            raise SqlaJobsError("the registry has no handlers")
        self.registry = registry
        self.queues = config.queues if config.queues is not None else registry.queues()
        self.config = config.with_queues(self.queues)
        self.engine = engine or sa.create_engine(
            config.url,
            pool_size=config.concurrency + 4,
            max_overflow=config.concurrency + 4,
            # No pre-ping (it would cost a round trip per checkout): a disconnect error
            # invalidates the whole pool, and every caller below retries or records it.
            pool_timeout=60,
            # Handlers' own statements keep psycopg's default (prepared on their 5th
            # run); the worker's statements choose explicitly (see _db.rows).
            connect_args={} if config.prepared_statements else {"prepare_threshold": None},
        )
        # A read-only or recovering server's errors lose the connection, a new connection
        # is used only on a primary, and gets TCP keepalives where nothing set them, on
        # this engine or one passed in (see _connlost).
        _connlost.install(self.engine)
        self.lifecycle = Lifecycle()
        self.events = Events()
        self._room = threading.Event()  # the ledger changed: the drain looks again
        self._buffer = ThreadBuffer()
        self.ledger = Inflight(
            on_room=self._on_room, lease_seconds=config.lock_seconds, on_end=self._job_ended
        )
        sync_kinds, async_kinds = registry.kinds_where(False), registry.kinds_where(True)
        pools: list[Pool] = []
        if sync_kinds:
            pools.append(Pool(SYNC_POOL, sync_kinds, self.config.concurrency, self._buffer))
        async_pool: Pool | None = None
        if async_kinds:
            async_pool = Pool(ASYNC_POOL, async_kinds, self.config.async_concurrency, LoopBuffer())
            pools.append(async_pool)
        gates = Gates()  # the worker's, for both pools: a queue's jobs may be in both
        for pool in pools:  # each pool claims its own limited groups (revision 0006)
            pool.limits = Limits(
                self.engine,
                self.config,
                registry,
                self.ledger,
                self._recheck_at,
                give_back=self._give_back,
                start=pool.buffer.put,
                wake=self._on_room,
                gates=gates,
                kinds=pool.kinds,
                pool=pool.number,
                slots=pool.slots,
            )
        self._pools = pools
        self._dispatcher = Dispatcher(
            self.engine,
            self.config,
            list(registry.kinds),
            self.ledger,
            self._buffer,
            pools,
            max_attempts=registry.max_attempts_by_kind(),
        )
        self._completer = Completer(
            self.engine, self.config, registry, self.ledger, self.events, self._dispatcher.wake_at
        )
        self._executor = ThreadExecutor(
            self.engine,
            self.config,
            registry,
            self.ledger,
            self._buffer,
            self._completer,
            self.lifecycle.draining,
            pools[0].job_took,
            threads=self.config.concurrency if sync_kinds else 0,
        )
        self._lease_keeper = LeaseKeeper(
            self.lifecycle.stopped, self.engine, self.config, self.ledger, kinds=registry.kinds
        )
        self._async_executor: AsyncExecutor | None = None
        if async_pool is not None:
            assert isinstance(async_pool.buffer, LoopBuffer)
            self._async_executor = AsyncExecutor(
                self.config,
                registry,
                self.ledger,
                async_pool.buffer,
                self._completer,
                self.lifecycle.draining,
                async_pool.job_took,
                on_failure=self.stop,
            )
        self._threads: list[threading.Thread] = []
        self._signals = 0

    # --- public ----------------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> None:
        """Call ``callback(WorkerEvent)`` for every recorded outcome (see WorkerEvent)."""
        self.events.subscribe(callback)

    def check_schema(self) -> None:
        """Raise SchemaNotReadyError unless the jobs table has every column and status.

        Waits for a primary first (see ``_wait_for_primary``)."""
        if not self._wait_for_primary():
            return
        with self.engine.connect() as conn:
            periodic = self.config.periodic and bool(self.registry.schedules)
            # An archiving worker needs revision 0022's jobs_archive_prepare (#25).
            archive = self.config.archive_every is not None
            schema.check_schema(conn, periodic=periodic, archive=archive)

    def run(self, *, install_signal_handlers: bool = False) -> None:
        """Work until ``stop()`` (or a signal); returns after a graceful drain."""
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        if not self._wait_for_primary():
            return  # stopped while waiting
        self.check_schema()
        self._start_parts()
        self.lifecycle.enter(Phase.RUNNING)
        log.info(
            "worker %s started: queues=%s kinds=%s concurrency=%d async_concurrency=%s",
            self.config.worker_id,
            ",".join(self.queues),
            ",".join(self.registry.kinds),
            self._executor.threads,
            self.config.async_concurrency if self._async_executor is not None else "-",
        )
        if self.config.archive_every is not None:
            dead_after = self.config.archive_dead_after
            log.info(
                "archiving every %gs (one worker of the fleet at a time): done jobs finished "
                "over %gs ago; dead and cancelled jobs %s",
                self.config.archive_every,
                self.config.archive_older_than,
                "stay in jobs" if dead_after is None else f"finished over {dead_after:g}s ago",
            )
        self._warn_unserved_queues()
        self._run_dispatcher()

    def _wait_for_primary(self) -> bool:
        """Wait until the database URL leads to a writable primary; False if stopped first.

        A worker started while only a standby answers (a failover under way, or a URL
        naming replicas only) waits, saying so once, instead of exiting: a supervisor
        restarting it in a loop would do the same, noisily. It never claims on a standby.
        """
        said = False
        while True:
            try:
                with self.engine.connect():
                    pass  # the connect event checked pg_is_in_recovery()
            except sa.exc.DBAPIError as exc:
                if not _connlost.only_standbys(exc):
                    raise  # no server at all: the caller says "cannot connect" and exits
                if not said:
                    log.warning(
                        "waiting for a primary: %s (trying again every %.0fs; the worker "
                        "starts once a server in the URL accepts writes)",
                        _connlost.reason_line(exc),
                        PRIMARY_WAIT_SECONDS,
                    )
                    said = True
            else:
                if said:
                    log.info("a primary answers; starting")
                return True
            if self.lifecycle.draining.wait(PRIMARY_WAIT_SECONDS):
                return False

    async def run_async(self) -> None:
        """``await worker.run_async()``: run the worker from an application's event loop.

        The worker runs as [``run``][sqla_jobs.worker._supervisor.Worker.run] does, on threads of
        its own (its ``async def`` handlers on its own event loop, not the caller's), so nothing it
        does blocks the caller's loop. Cancelling the awaiting task stops the worker gracefully (the
        drain of [``stop``][sqla_jobs.worker._supervisor.Worker.stop]) and re-raises the
        cancellation once it has stopped.
        """
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if finished.done():
                return
            if error is None:
                finished.set_result(None)
            else:
                finished.set_exception(error)

        def target() -> None:
            error: BaseException | None = None
            try:
                self.run()
            except BaseException as exc:
                error = exc
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed
                loop.call_soon_threadsafe(settle, error)

        thread = threading.Thread(target=target, name="sqla_jobs-run-async", daemon=True)
        thread.start()
        try:
            await asyncio.shield(finished)
        except asyncio.CancelledError:
            self.stop()
            await asyncio.shield(finished)
            raise

    def stop(self) -> None:
        """Stop claiming; running handlers finish (up to shutdown_timeout)."""
        if self.lifecycle.phase in (Phase.NEW, Phase.RUNNING):
            self.lifecycle.enter(Phase.DRAINING)
        self._dispatcher.wake()

    # --- wiring ----------------------------------------------------------------------

    def _start_parts(self) -> None:
        stopped, draining = self.lifecycle.stopped, self.lifecycle.draining
        self._start_thread(self._lease_keeper.run)
        self._start_thread(self._completer.run, "completer")
        for i in range(self._executor.threads):
            self._start_thread(self._executor.thread_main, f"job-{i}")
        if self._async_executor is not None:
            self._threads.append(self._async_executor.start())
        self._executor.await_connections()
        services: list[Service] = [
            Rescuer(draining, self.engine, self.config, self._wake),
            DeadlineWatch(
                stopped,
                self.config,
                self.ledger,
                self._completer.give_up,
                self._executor.replace_thread,
            ),
        ]
        if self.config.listen:
            services.append(
                Listener(
                    stopped,
                    self.config,
                    self._wake,
                    self.ledger.request_cancel,
                    connected=self._dispatcher.listener_connected,
                )
            )
        if self.config.archive_every is not None:
            services.append(Archiver(draining, self.engine, self.config))
        services.append(WorkflowSweeper(draining, self.engine, self.config))
        if self.config.periodic and self.registry.schedules:
            services.append(PeriodicEnqueuer(draining, self.engine, self.registry))
        services.append(UnservedWatch(draining, self.engine, self.config, self.registry.kinds))
        for service in services:
            self._start_thread(service.run, service.name.replace(" ", "-"))

    def _wake(self) -> None:
        for pool in self._pools:  # a notification or a rescue: limited groups may have jobs
            if pool.limits is not None:
                pool.limits.poke()
        self._dispatcher.wake()

    def _job_ended(self, job: Claimed, pool: int) -> None:
        for each in self._pools:
            if each.limits is not None:
                each.limits.job_ended(job, pool)

    def _give_back(self, jobs: list[Claimed]) -> None:
        self._completer.release(jobs)

    def _recheck_at(self, when: float) -> None:
        self._dispatcher.wake_at(when, poke=False)

    def _on_room(self) -> None:
        self._dispatcher.room_freed()
        self._room.set()

    def _start_thread(self, target: Callable[[], None], name: str = "heartbeat") -> None:
        thread = threading.Thread(target=target, name=f"sqla_jobs-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _warn_unserved_queues(self) -> None:
        """One warning per queue this worker does not serve that some handler enqueues
        into by default (its ``queue=``, or ``default`` when it names none)."""
        unserved: dict[str, list[str]] = {}
        for handler in self.registry.handlers():
            queue_name = handler.queue if handler.queue is not None else models.DEFAULT_QUEUE
            if queue_name not in self.queues:
                unserved.setdefault(queue_name, []).append(handler.kind)
        for queue_name, kinds in unserved.items():
            who = (
                f"handler {kinds[0]!r} enqueues"
                if len(kinds) == 1
                else (f"handlers {', '.join(map(repr, kinds))} enqueue")
            )
            log.warning(
                "%s into queue %r by default, which this worker does not serve (--queues "
                "%s); add it to --queues or those jobs wait for another worker",
                who,
                queue_name,
                ",".join(self.queues),
            )

    def _run_dispatcher(self) -> None:
        # The dispatcher and the drain run on a thread of their own, and the calling
        # thread only joins it. A signal handler runs on the main thread between two
        # bytecodes, and stop() sets Events: had the main thread been the dispatcher,
        # interrupted inside a wait while holding that Event's lock, stop() would wait
        # for the lock forever (seen once in about 30 SIGTERMs).
        failure: list[BaseException] = []

        def dispatch_then_drain() -> None:
            try:
                self._dispatcher.run(self.lifecycle.draining)
            except BaseException as exc:
                failure.append(exc)
            finally:
                self.lifecycle.enter(Phase.DRAINING)
                self._drain()

        thread = threading.Thread(
            target=dispatch_then_drain, name="sqla_jobs-dispatcher", daemon=True
        )
        thread.start()
        try:
            while thread.is_alive():
                thread.join(0.5)
        except BaseException:  # e.g. KeyboardInterrupt without our signal handlers
            self.stop()
            thread.join()
            raise
        if failure:
            raise failure[0]

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning(
                "second %s: exiting now; unfinished jobs go back when their lease expires",
                signal.Signals(signum).name,
            )
            logging.shutdown()
            os._exit(1)
        log.info("received %s: no more claims, draining", signal.Signals(signum).name)
        self.stop()

    # --- the drain -------------------------------------------------------------------

    def _report_unfinished(self) -> None:
        """Name the jobs still running now, at the end of the drain.

        Read now, not when the timeout passed: a job that finished since (its handler
        returned during the waits above, its done-mark written and logged) is not
        running, and async handlers cancelled at the timeout have logged their own line.
        """
        running, unmarked = self.ledger.unfinished()
        if running:
            log.warning(
                "shutdown timeout: %d job(s) still running (%s); their leases will expire "
                "and another worker will take them",
                len(running),
                _job_list(running),
            )
        if unmarked:
            log.warning(
                "%d job(s) finished but their done-mark was not written before the stop "
                "(%s); they run again when their leases expire",
                len(unmarked),
                _job_list(unmarked),
            )

    def _drain(self) -> None:
        deadline = time.monotonic() + self.config.shutdown_timeout
        unstarted = self._dispatcher.give_back_buffered()
        if unstarted:
            self._completer.release(unstarted)
            log.info("released %d buffered job(s) no handler had started", len(unstarted))
        self._executor.stop()
        if self._async_executor is not None:
            self._async_executor.stop()
        while len(self.ledger) and time.monotonic() < deadline:
            self._room.wait(0.05)
            self._room.clear()
        unfinished = len(self.ledger)  # decides how long to wait below, not what is reported
        if self._async_executor is not None:
            # Past the timeout: cancel the async handlers still running (their writes are
            # rolled back, their jobs left to their leases); a loop a handler blocks
            # never gets to it, and the process exits around it.
            self._async_executor.cancel_running()
            self._async_executor.join(CANCEL_GRACE_SECONDS if unfinished else 30.0)
        self._completer.stop()  # write the last batch of done-marks, then end
        for thread in self._threads:
            if thread.name == "sqla_jobs-completer":
                thread.join(max(1.0, deadline - time.monotonic()))
        self.lifecycle.enter(Phase.STOPPED)
        for thread in self._threads:
            if not thread.name.startswith("sqla_jobs-job-"):  # handlers may outlive the timeout
                thread.join(2.0)  # the listener and heartbeat notice STOPPED within a second
        self._report_unfinished()
        self._lease_keeper.retire()
        log.info("worker %s stopped", self.config.worker_id)


def _job_list(jobs: list[Claimed]) -> str:
    """``id kind`` of each job, for a log line (the first 20, then how many more)."""
    shown = ", ".join(f"{job.id} {job.kind}" for job in jobs[:20])
    return shown if len(jobs) <= 20 else f"{shown} and {len(jobs) - 20} more"
