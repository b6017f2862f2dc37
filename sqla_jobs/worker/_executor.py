"""The executor: runs one job's handler and says what happened (an :class:`Attempt`).

This is the seam where other ways of running a handler plug in (an asyncio loop, a
child process, a deadline). The thread executor here runs ``concurrency`` threads; each
takes a job from the buffer, runs its handler in a :class:`HandlerSession` on the
thread's own connection, and passes the attempt to the completer, which records the
outcome (done, retry, dead, lost). A handler's writes and the done-mark commit in one
transaction; a handler that wrote nothing is marked done in a batch.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa

from sqla_jobs.config import WorkerConfig
from sqla_jobs.exceptions import HandlerTransactionError
from sqla_jobs.tasks import JobContext, Registry
from sqla_jobs.worker import _session
from sqla_jobs.worker._completer import Completer
from sqla_jobs.worker._inflight import Attempt, Claimed, Inflight, State
from sqla_jobs.worker._session import HandlerSession, ThreadConnection

log = logging.getLogger("sqla_jobs.worker")


class ThreadExecutor:
    """``concurrency`` handler threads fed from the dispatcher's buffer."""

    def __init__(
        self,
        engine: sa.Engine,
        config: WorkerConfig,
        registry: Registry,
        ledger: Inflight,
        buffer: queue.SimpleQueue[Claimed | None],
        completer: Completer,
        draining: threading.Event,
        job_took: Callable[[float], None],
    ) -> None:
        self.engine = engine
        self.config = config
        self.registry = registry
        self.ledger = ledger
        self.buffer = buffer
        self.completer = completer
        self.draining = draining
        self.job_took = job_took
        self.pool_generation = 0  # bumped when a pooled connection is invalidated
        sa.event.listen(engine, "invalidate", self._on_invalidate)
        self._ready = threading.Semaphore(0)  # one release per connected thread

    def thread_main(self) -> None:
        """One handler thread: connect, then run jobs until the stop sentinel."""
        get = self.buffer.get
        thread_conn = ThreadConnection(self.engine)
        try:
            try:
                thread_conn.connect()
                thread_conn.used = False
            except Exception:  # the first job connects again (and records a failure)
                log.warning("a handler thread could not connect yet", exc_info=True)
            finally:
                self._ready.release()
            while (job := get()) is not None:
                self._run(job, thread_conn)
        finally:
            thread_conn.close()

    def await_connections(self, timeout: float = 30.0) -> None:
        # "started" means ready to run jobs at full speed: opening a connection per
        # handler thread on its first job cost the first few hundred jobs of a burst
        # (a backend start each, on the same cores as the jobs).
        deadline = time.monotonic() + timeout
        for _ in range(self.config.concurrency):
            if not self._ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                log.warning("handler threads still connecting after %.0fs", timeout)
                return

    def stop(self) -> None:
        for _ in range(self.config.concurrency):
            self.buffer.put(None)  # one stop sentinel per handler thread

    def _on_invalidate(self, *_args: object) -> None:
        # A connection was invalidated; on a disconnect the whole pool was. Handler
        # threads take a new connection before their next job, as a pool checkout would.
        self.pool_generation += 1

    def _run(self, job: Claimed, thread_conn: ThreadConnection) -> None:
        if self.draining.is_set():
            # Claimed but not started before shutdown: hand it back unspent.
            self.completer.release([job])
            return
        self.ledger.move(job, State.RUNNING)
        if thread_conn.generation != self.pool_generation:
            thread_conn.close()
            thread_conn.generation = self.pool_generation
        try:
            session = _session.open_session(self.engine, thread_conn)
            try:
                attempt = self._attempt(job, session, thread_conn)
                self.job_took(attempt.duration)
                if attempt.error is None and attempt.wrote:
                    self.completer.complete_in(session, attempt)
                    return
            finally:
                _session.discard(session, thread_conn)
            if attempt.error is None:
                self.completer.complete_later(attempt)
            else:
                self.completer.fail(attempt)
        except Exception:  # bookkeeping itself failed (database down): the lease expires
            log.exception(
                "could not record the outcome of job %s; it will be retried after "
                "its lease expires",
                job.id,
                extra={"job_id": job.id, "kind": job.kind, "attempt": job.attempt},
            )
            self.ledger.remove([job])

    def _attempt(
        self, job: Claimed, session: HandlerSession, thread_conn: ThreadConnection
    ) -> Attempt:
        handler = self.registry[job.kind]
        ctx = JobContext(
            job.id, job.kind, job.queue, job.attempt, job.max_attempts, self.config.worker_id
        )
        started = time.monotonic()
        try:
            returned = handler(session, job.payload, ctx)
            _session.disarm(thread_conn)
            _check_ran(returned)
            _check_transaction(session, thread_conn)
            # session.add() alone does not begin a transaction: pending objects
            # count as writes too, or they would never be flushed.
            wrote = session.in_transaction() or bool(
                session.new or session.dirty or session.deleted
            )
            if wrote:
                session.flush()
            return Attempt(job, time.monotonic() - started, None, wrote)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: a failed attempt
            _session.disarm(thread_conn)
            return Attempt(job, time.monotonic() - started, exc)


def _check_ran(returned: object) -> None:
    """A coroutine or generator returned by a wrapped handler means its body never ran."""
    if inspect.isawaitable(returned) or inspect.isgenerator(returned):
        close = getattr(returned, "close", None)
        if close is not None:
            close()  # no "never awaited" warning: the failure below says it
        raise TypeError(
            f"the handler returned {type(returned).__name__} object instead of running: "
            "an async or generator function behind a plain one; its body never ran"
        )


def _check_transaction(session: HandlerSession, thread_conn: ThreadConnection) -> None:
    """The last line: the handler's transaction must still be the one the worker opened."""
    refused = session._sqla_jobs_violation
    guard = thread_conn.guard
    problem = refused
    if problem is None and guard is not None:
        problem = guard.ended_by_handler(thread_conn.conn)
    if problem is None:
        return
    if refused is None and guard is not None and guard.violation is None:
        # Found by the driver's status: the commit happened below SQLAlchemy.
        raise HandlerTransactionError(
            f"the handler ended the job's transaction ({problem}); what it committed that "
            "way stays committed, the rest was rolled back, and the attempt counts as failed"
        )
    raise HandlerTransactionError(
        f"the handler ended, or tried to end, the job's transaction ({problem}); "
        "its writes were rolled back and the attempt counts as failed"
    )
