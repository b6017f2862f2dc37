"""The executor: runs one job's handler and says what happened (an ``Attempt``).

This is the seam where other ways of running a handler plug in (an asyncio loop, a
child process, a deadline). The thread executor here runs ``concurrency`` threads; each
takes a job from the buffer, runs its handler in a ``HandlerSession`` on the
thread's own connection, and passes the attempt to the completer, which records the
outcome (done, retry, dead, lost). A handler's writes and the done-mark commit in one
transaction; a handler that wrote nothing is marked done in a batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa

from sqla_jobs import _otel
from sqla_jobs.config import WorkerConfig
from sqla_jobs.control import Control
from sqla_jobs.sql import lease
from sqla_jobs.tasks import Registry
from sqla_jobs.worker import _isolated, _session
from sqla_jobs.worker._buffer import ThreadBuffer
from sqla_jobs.worker._completer import Completer
from sqla_jobs.worker._inflight import Attempt, Claimed, Inflight
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
        buffer: ThreadBuffer,
        completer: Completer,
        draining: threading.Event,
        job_took: Callable[[float], None],
        threads: int | None = None,
    ) -> None:
        self.engine = engine
        #: Handler threads: ``concurrency``, or none when every handler is async.
        self.threads = config.concurrency if threads is None else threads
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
        self._replaced_lock = threading.Lock()
        self._stuck = 0  # threads whose handler was given up and has not returned yet
        self._replacements = 0

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
                if self._run(job, thread_conn):
                    return  # this thread's handler was given up; a replacement took over
        finally:
            thread_conn.close()

    def replace_thread(self) -> bool:
        """Start a handler thread in place of one whose handler was given up (it ignored
        its timeout or cancel); False if too many are stuck already."""
        with self._replaced_lock:
            if self._stuck >= self.config.concurrency:
                return False
            self._stuck += 1
            self._replacements += 1
            name = f"sqla_jobs-job-r{self._replacements}"
        threading.Thread(target=self._replacement_main, name=name, daemon=True).start()
        return True

    def _replacement_main(self) -> None:
        self._ready.release()  # nobody waits for it: keep the semaphore balanced
        self.thread_main()

    def await_connections(self, timeout: float = 30.0) -> None:
        # "started" means ready to run jobs at full speed: opening a connection per
        # handler thread on its first job cost the first few hundred jobs of a burst
        # (a backend start each, on the same cores as the jobs).
        deadline = time.monotonic() + timeout
        for _ in range(self.threads):
            if not self._ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                log.warning("handler threads still connecting after %.0fs", timeout)
                return

    def stop(self) -> None:
        for _ in range(self.threads):
            self.buffer.put(None)  # one stop sentinel per handler thread

    def _on_invalidate(self, *_args: object) -> None:
        # A connection was invalidated; on a disconnect the whole pool was. Handler
        # threads take a new connection before their next job, as a pool checkout would.
        self.pool_generation += 1

    def _run(self, job: Claimed, thread_conn: ThreadConnection) -> bool:
        """Run one job; True if the worker gave it up meanwhile (this thread then ends)."""
        if self.draining.is_set():
            # Claimed but not started before shutdown: hand it back unspent.
            self.completer.release([job])
            return False
        if not self.ledger.start(job):
            self.completer.give_back_expired(job)
            return False
        if thread_conn.generation != self.pool_generation:
            thread_conn.close()
            thread_conn.generation = self.pool_generation
        handler = self.registry[job.kind]
        control = Control(job.timeout if job.timeout is not None else handler.timeout)
        self.ledger.watch(job, control)
        if handler.isolation == "process":
            return self._run_isolated(job, control)
        thread_conn.control = control
        control.on_interrupt(thread_conn.cancel_statement)
        # The attempt carries its span to the completer, which records the outcome on
        # it; the span ends with this block, or after the batch of a done-mark left to
        # the completer (_otel.AttemptSpan).
        with _otel.process_span(job) as span:
            try:
                session = _session.open_session(self.engine, thread_conn)
                try:
                    attempt = self._attempt(job, session, thread_conn, control, span)
                    thread_conn.control = None
                    self.job_took(attempt.duration)
                    if attempt.error is None and (attempt.wrote or attempt.result is not None):
                        self.completer.complete_in(session, attempt)
                        return self._given_up(control)
                finally:
                    thread_conn.control = None
                    _session.discard(session, thread_conn)
                if attempt.error is None:
                    self.completer.complete_later(attempt)
                else:
                    self.completer.fail(attempt)
            except Exception as exc:  # bookkeeping itself failed (database down or lost)
                self.completer.outcome_unknown(job, exc)
        return self._given_up(control)

    def _run_isolated(self, job: Claimed, control: Control) -> bool:
        """``isolation="process"``: the handler runs in a child that is killed at its
        deadline or a cancel; this thread only waits for it (see _isolated)."""
        handler = self.registry[job.kind]
        with _otel.process_span(job) as span:
            try:
                outcome, error = _isolated.run(
                    self.engine, self.config.worker_id, job, handler, control
                )
                _otel.ended(span, error, _otel.outcome_of(error))
                control.finish()
                attempt = Attempt(
                    job, time.monotonic() - control.started, error, control=control, span=span
                )
                self.job_took(attempt.duration)
                if outcome is not None:
                    self.completer.finished_in_child(attempt, outcome == _isolated.DONE)
                else:
                    self.completer.fail(attempt)
            except Exception:
                log.exception(
                    "could not run or record job %s in a child process; it will be retried "
                    "after its lease expires",
                    job.id,
                    extra={"job_id": job.id, "kind": job.kind, "attempt": job.attempt},
                )
                self.ledger.remove([job])
        return self._given_up(control)

    def _given_up(self, control: Control) -> bool:
        if not control.abandoned:
            return False
        with self._replaced_lock:
            self._stuck -= 1
        return True

    def _attempt(
        self,
        job: Claimed,
        session: HandlerSession,
        thread_conn: ThreadConnection,
        control: Control,
        span: _otel.AttemptSpan | None,
    ) -> Attempt:
        """The handler's run; how it ended goes on its OpenTelemetry ``span``, which the
        attempt carries to the completer."""
        attempt = self._run_handler(job, session, thread_conn, control)
        if span is None:
            return attempt
        _otel.ended(span, attempt.error, _otel.outcome_of(attempt.error))
        return attempt._replace(span=span)

    def _run_handler(
        self,
        job: Claimed,
        session: HandlerSession,
        thread_conn: ThreadConnection,
        control: Control,
    ) -> Attempt:
        handler = self.registry[job.kind]
        ctx = job.context(self.config.worker_id, control)
        started = control.started
        try:
            control.check()  # cancelled while it waited in the buffer: do not start it
            value = handler(session, job.payload, ctx)
            control.finish()
            _session.disarm(thread_conn)
            result, wrote = _session.returned(value, session, thread_conn, control)
            if wrote:
                session.flush()
            if control.timeout is not None and session.in_transaction():
                # The done-mark follows in this transaction: not under the handler's limit.
                session.connection().execute(lease.reset_statement_timeout())
            return Attempt(job, time.monotonic() - started, None, wrote, result, control)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: a failed attempt
            control.finish()
            _session.disarm(thread_conn)
            exc = control.failure(exc)  # e.g. the statement cancelled at the deadline
            return Attempt(job, time.monotonic() - started, exc, control=control)
