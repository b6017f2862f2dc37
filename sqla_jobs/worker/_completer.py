"""The completer: records each attempt's outcome in the database, fenced.

* a handler that wrote: its done-mark in the handler's own transaction, then commit
  (``Completer.complete_in``, on the handler's thread; ``complete_in_async``
  for an ``async def`` handler's AsyncSession, on the event loop);
* a handler that wrote nothing: done-marks in batches (``complete_later``, written
  by the completer's own thread);
* a failed attempt: queued again after the handler's backoff, or dead at its last
  attempt (``fail``); a retry due before the next poll sets the dispatcher's timer;
* a job claimed but never started (shutdown): queued again, attempt not spent
  (``release``).

Every statement is fenced on ``(id, attempt, worker, status running)``; a claim found
lost is logged here, in ``_lost``, and nowhere else. Each outcome is emitted as a
``WorkerEvent`` and recorded on the attempt's OpenTelemetry
process span (``_emit``), whichever path recorded it; a batched done-mark's span
is ended here, after its batch (see ``_otel.AttemptSpan``).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncSession

from sqla_jobs import _otel
from sqla_jobs.config import WorkerConfig
from sqla_jobs.control import Control
from sqla_jobs.exceptions import (
    Discard,
    JobCancelled,
    JobTimeout,
    RetryIn,
    Snooze,
    SqlaJobsError,
)
from sqla_jobs.models import JobStatus
from sqla_jobs.sql import lease
from sqla_jobs.tasks import Registry
from sqla_jobs.worker import _connlost, _db, _session
from sqla_jobs.worker._events import Events, Outcome, WorkerEvent
from sqla_jobs.worker._inflight import Attempt, Claimed, Inflight, State
from sqla_jobs.worker._session import HandlerSession

# Re-exported: testing.py records inline failures with it.
from sqla_jobs.worker._tracebacks import describe as describe

log = logging.getLogger("sqla_jobs.worker")

#: Largest batch the completer marks done in one statement.
COMPLETE_BATCH = 1_000
#: Runs of one job this worker gives back for a lost connection before it records the
#: next one as a failed attempt: a handler that breaks its own connection every time
#: (e.g. writes inside ``SET TRANSACTION READ ONLY``) must not loop for ever unspent.
MAX_LOST_GIVEBACKS = 3
#: Tries of a batch done-mark before its jobs are left to their leases.
BATCH_TRIES = 5


_OUTCOMES = {
    JobStatus.QUEUED: Outcome.RETRY,
    JobStatus.DEAD: Outcome.DEAD,
    JobStatus.CANCELLED: Outcome.CANCELLED,
}


def _worker_commit(session: Any) -> None:
    session.worker_commit()  # the HandlerSession under an AsyncSession, in its greenlet


def fields(job: Claimed, **more: Any) -> dict[str, Any]:
    """The structured log fields of a job."""
    return {"job_id": job.id, "kind": job.kind, "attempt": job.attempt, **more}


class Completer:
    """Applies outcomes; owns the batch of no-op done-marks and its thread."""

    def __init__(
        self,
        engine: sa.Engine,
        config: WorkerConfig,
        registry: Registry,
        ledger: Inflight,
        events: Events,
        wake_at: Callable[[float], None],
    ) -> None:
        self.engine = engine
        self.config = config
        self.registry = registry
        self.ledger = ledger
        self.events = events
        self.wake_at = wake_at
        self._complete_sql = _db.compile_statement(
            engine, lease.complete(worker=config.worker_id, leases=[])
        )
        self._complete_one_sql = _db.compile_statement(
            engine, lease.complete_one(worker=config.worker_id, job_id=0, attempt=0)
        )
        self._complete_before_commit_sql = _db.compile_statement(
            engine, lease.complete_one_before_commit(worker=config.worker_id, job_id=0, attempt=0)
        )
        self._batch: queue.SimpleQueue[Attempt | None] = queue.SimpleQueue()
        self._givebacks: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._givebacks_lock = threading.Lock()
        #: What ``give_up`` recorded for a run whose handler has not come back yet
        #: (by lease): its span, still open on the handler's thread or task, gets it then.
        self._given_up: dict[tuple[int, int], Outcome] = {}

    # --- on the handler's thread -------------------------------------------------------

    def complete_in(self, session: HandlerSession, attempt: Attempt) -> Outcome:
        """Done-mark in the handler's transaction and commit; rolled back if the claim was lost."""
        job = attempt.job
        self.ledger.move(job, State.SETTLING)
        try:
            sql, params = self._complete_before_commit_sql
            values = {**params, "job_id": job.id, "attempt": job.attempt, "result": attempt.result}
            session.connection()  # the transaction is on the thread's connection
            try:
                # The done-mark goes in the COMMIT's round trip: the slot (of a limited
                # kind too) is free one round trip sooner. Prepared (unlike the other
                # fenced statements): its scalar fence makes the generic plan a
                # primary-key probe, and it runs once per job that wrote.
                session.worker_commit(done_mark=(sql, values, self.config.prepared_statements))
            except _session.ClaimLost:
                session.rollback()
                return self._lost(attempt, "rolled back this run's writes")
            return self._done(attempt)
        finally:
            self.ledger.remove([job])

    def finished_in_child(self, attempt: Attempt, done: bool) -> Outcome:
        """A process-isolated handler's child wrote the done-mark itself (``done``), or
        found its claim lost and rolled back."""
        self.ledger.move(attempt.job, State.SETTLING)
        self.ledger.remove([attempt.job])
        if done:
            return self._done(attempt)
        return self._lost(attempt, "the handler's process rolled back its writes")

    async def complete_in_async(self, session: AsyncSession, attempt: Attempt) -> Outcome:
        """``complete_in`` for an ``async def`` handler's AsyncSession (the same fence,
        and the result stored with the done-mark)."""
        job = attempt.job
        self.ledger.move(job, State.SETTLING)
        try:
            sql, params = self._complete_one_sql
            conn = await session.connection()
            result = await conn.exec_driver_sql(
                sql,
                {**params, "job_id": job.id, "attempt": job.attempt, "result": attempt.result},
            )
            if not result.rowcount:
                await session.rollback()
                return self._lost(attempt, "rolled back this run's writes")
            await session.run_sync(_worker_commit)
            return self._done(attempt)
        finally:
            self.ledger.remove([job])

    def complete_later(self, attempt: Attempt) -> None:
        """A handler that wrote nothing: its done-mark goes in the next batch (which
        then records the outcome on the attempt's span and ends it)."""
        if attempt.span is not None:
            attempt.span.hand_over()  # before the put: the batch may end it at once
        self.ledger.move(attempt.job, State.COMPLETING)
        self._batch.put(attempt)

    def fail(self, attempt: Attempt) -> Outcome:
        """Record an attempt that raised: retry after the handler's backoff (or the
        ``RetryIn`` delay), dead, snoozed (``Snooze``) or cancelled (``Discard``, an
        operator's cancel)."""
        job, exc = attempt.job, attempt.error
        assert exc is not None
        if _connlost.is_lost(exc) and self._may_give_back(job.id):
            return self._connection_lost(attempt)
        handler = self.registry[job.kind]
        if isinstance(exc, Snooze) and job.snoozes >= handler.max_snoozes:
            exc = SqlaJobsError(
                f"the job snoozed {job.snoozes} times, its handler's max_snoozes; one more "
                f"snooze counts as a failed attempt ({exc})"
            )
            attempt = attempt._replace(error=exc)
        self.ledger.move(job, State.SETTLING)
        delay = 0.0
        try:
            if isinstance(exc, Snooze):
                delay = exc.seconds
                stmt = lease.snooze(
                    worker=self.config.worker_id,
                    job_id=job.id,
                    attempt=job.attempt,
                    delay_seconds=delay,
                    note=f"snooze {job.snoozes + 1} of at most {handler.max_snoozes}: {exc}",
                )
            elif isinstance(exc, (Discard, JobCancelled)):
                stmt = lease.cancel_running(
                    worker=self.config.worker_id,
                    job_id=job.id,
                    attempt=job.attempt,
                    reason=str(exc) if isinstance(exc, Discard) else describe(exc),
                )
            else:
                delay = (
                    exc.seconds if isinstance(exc, RetryIn) else handler.backoff.delay(job.attempt)
                )
                stmt = lease.record_failure(
                    worker=self.config.worker_id,
                    job_id=job.id,
                    attempt=job.attempt,
                    delay_seconds=delay,
                    error=describe(exc),
                )
            with self.engine.begin() as conn:
                found = _db.fenced(self.engine, conn, stmt)
        finally:
            self.ledger.remove([job])
        row = found[0] if found else None
        if row is None:
            return self._lost(attempt, f"before its outcome was recorded: {exc!r}")
        outcome = _OUTCOMES[row.status]
        if isinstance(exc, Snooze) and outcome is Outcome.RETRY:
            outcome = Outcome.SNOOZED
        self._log_failure(attempt, outcome, delay)
        self._emit(outcome, attempt)
        if outcome in (Outcome.RETRY, Outcome.SNOOZED) and delay < self.config.poll_interval:
            # A retry is an UPDATE, which fires no notification: wake up for it
            # ourselves instead of leaving it to the next poll.
            self.wake_at(time.monotonic() + delay)
        return outcome

    def _may_give_back(self, job_id: int) -> bool:
        with self._givebacks_lock:
            given = self._givebacks.pop(job_id, 0)
            if given >= MAX_LOST_GIVEBACKS:
                return False
            self._givebacks[job_id] = given + 1
            while len(self._givebacks) > 10_000:  # the oldest first: a bounded memory
                self._givebacks.popitem(last=False)
            return True

    def _connection_lost(self, attempt: Attempt) -> Outcome:
        """The handler's connection was lost (a failover, a read-only node, a server
        shutdown; see _connlost): not the job's failure, so no attempt is spent. Its
        writes went with the transaction; the claim is given back, fenced (if the new
        primary never saw the claim, the job is queued there already)."""
        job = attempt.job
        _connlost.THROTTLE.warning(
            "job %s (%s): the database connection was lost while its handler ran (%s); "
            "given back without spending an attempt",
            job.id,
            job.kind,
            _db.reason(attempt.error) if attempt.error is not None else "?",
            extra={**fields(job), "outcome": "connection_lost"},
        )
        self._release_lost(job)
        _otel.settled(attempt.span, Outcome.RELEASED)
        return Outcome.RELEASED

    def _release_lost(self, job: Claimed) -> None:
        """Give back a claim whose connection was lost, trying again while a failover has
        no primary yet (up to half the lease): past that, the lease expires and the rescuer
        requeues it (an attempt spent)."""
        deadline = time.monotonic() + self.config.lock_seconds / 2
        pause = 0.1
        while True:
            try:
                self.release([job], quiet=time.monotonic() < deadline)
                return
            except sa_exc.SQLAlchemyError:
                time.sleep(pause)
                pause = min(1.0, pause * 2)

    def outcome_unknown(self, job: Claimed, exc: Exception) -> None:
        """Recording ``job``'s outcome failed. A lost connection (see _connlost) gets its
        claim given back at once, fenced: if the done-mark did commit, the release
        matches nothing; if not, the job is queued again without spending an attempt.
        Past MAX_LOST_GIVEBACKS give-backs of the same job (shared with ``fail``'s), the
        run is recorded as a failed attempt instead, on a fresh connection and fenced:
        a server that closes the session of every run of it (an
        idle_in_transaction_session_timeout shorter than the handler) must not keep it
        ``running`` for ever with no attempt spent. Any other failure (the database
        down) leaves it to its lease."""
        if _connlost.is_lost(exc):
            if not self._may_give_back(job.id):
                self._lost_while_recording(job, exc)
                return
            _connlost.THROTTLE.warning(
                "job %s (%s): the connection was lost while its outcome was recorded (%s); "
                "given back unless it committed",
                job.id,
                job.kind,
                _db.reason(exc),
                extra={**fields(job), "outcome": "connection_lost"},
            )
            self._release_lost(job)
            return
        log.error(
            "could not record the outcome of job %s; it will be retried after its lease expires",
            job.id,
            exc_info=exc,
            extra=fields(job),
        )
        self.ledger.remove([job])

    def _lost_while_recording(self, job: Claimed, exc: Exception) -> None:
        error = SqlaJobsError(
            f"the database connection was lost while the job's outcome was recorded "
            f"({str(_db.reason(exc)).strip()}); given back {MAX_LOST_GIVEBACKS} times "
            "already, this run counts as a failed attempt. Likely causes: an "
            "idle_in_transaction_session_timeout (or transaction_timeout) of the worker's "
            "role shorter than the handler (its transaction stays open while it runs), a "
            "terminated backend (pg_terminate_backend), or a failover"
        )
        try:
            self.fail(Attempt(job, 0.0, error))
        except sa_exc.SQLAlchemyError as again:  # the database is down: the lease decides
            log.error(
                "could not record the failed attempt of job %s; it will be retried after "
                "its lease expires: %s",
                job.id,
                _db.reason(again),
                extra=fields(job),
            )
            self.ledger.remove([job])

    def give_up(self, job: Claimed, control: Control) -> Outcome | None:
        """Record the outcome of a run whose handler ignored its timeout or cancel.

        Called by the lease keeper ``timeout_grace`` seconds after the deadline (or the
        cancel), while the handler's thread is still inside the handler. Fenced like
        every outcome: if the handler's own outcome got in first, nothing happens (None).
        Whatever that thread does later is fenced away (logged in ``_lost``).
        """
        if not control.abandon():
            return None  # the handler returned meanwhile: its thread records the outcome
        stop = control.interruption() or JobTimeout("the job ran past its timeout")
        exc = type(stop)(
            f"{stop} and did not stop within the {self.config.timeout_grace:g}s grace; the "
            "worker gave up on it (its writes are rolled back when its thread returns)"
        )
        duration = time.monotonic() - control.started
        attempt = Attempt(job, duration, exc, control=control)
        outcome = self.fail(attempt)
        if len(self._given_up) < 10_000:  # one per stuck handler; bounded all the same
            self._given_up[job.lease] = outcome
        return None

    def release(self, jobs: Iterable[Claimed], *, quiet: bool = False) -> None:
        """Give back claims no handler started: queued again, attempt not spent.

        ``quiet``: a database error is raised (the caller tries again), not logged."""
        jobs = list(jobs)
        for job in jobs:
            self.ledger.move(job, State.SETTLING)
        leases = [j.lease for j in jobs]
        try:
            with self.engine.begin() as conn:
                _db.fenced(
                    self.engine, conn, lease.release(worker=self.config.worker_id, leases=leases)
                )
        except sa_exc.SQLAlchemyError as exc:  # incl. pool timeouts
            if quiet:
                raise
            log.warning(
                "could not release %d unstarted job(s); they return when their lease expires: %s",
                len(leases),
                _db.reason(exc),
            )
        finally:
            self.ledger.remove(jobs)
        for job in jobs:
            self._emit(Outcome.RELEASED, Attempt(job, 0.0))

    def give_back_expired(self, job: Claimed) -> None:
        """A buffered job whose lease may have expired before a handler was free for it:
        not started here (another worker may run it already); released, fenced, in case
        nobody took it."""
        log.warning(
            "job %s: its lease may have expired while it waited for a free handler (was "
            "this process paused?); not started here, given back",
            job.id,
            extra={"job_id": job.id, "kind": job.kind, "attempt": job.attempt, "outcome": "lost"},
        )
        self.release([job])

    # --- the completer's thread --------------------------------------------------------

    def run(self) -> None:
        """Mark done, in batches, the jobs whose handlers wrote nothing; until stop()."""
        stopping = False
        while not stopping:
            batch: list[Attempt] = []
            item = self._batch.get()
            while True:
                if item is None:
                    stopping = True
                else:
                    batch.append(item)
                if len(batch) >= COMPLETE_BATCH:
                    break
                try:
                    item = self._batch.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._complete_batch(batch)

    def stop(self) -> None:
        """Write what is queued, then end ``run``."""
        self._batch.put(None)

    def _complete_batch(self, batch: list[Attempt]) -> None:
        sql = self._complete_sql[0]
        params = {**self._complete_sql[1], **_db.lease_arrays(a.job.lease for a in batch)}
        done: set[int] = set()
        for attempt in range(BATCH_TRIES):
            try:
                with self.engine.begin() as conn:
                    found = _db.rows(conn, sql, params, prepare=False, tuples=True)
                    done = {r[0] for r in found}
                break
            except sa_exc.SQLAlchemyError as exc:  # incl. pool timeouts
                log.warning(
                    "could not mark %d job(s) done (try %d): %s",
                    len(batch),
                    attempt + 1,
                    _db.reason(exc),
                )
                time.sleep(min(5.0, 0.2 * 2**attempt))
        self.ledger.remove([a.job for a in batch])
        for item in batch:
            if item.job.id in done:
                self._done(item)
            else:
                self._lost(item, "before its done-mark; it may run again")
            if item.span is not None:
                item.span.end()  # handed over by complete_later; its outcome is on it

    # --- outcomes ----------------------------------------------------------------------

    def _done(self, attempt: Attempt) -> Outcome:
        job = attempt.job
        # Checked first: building the structured fields cost as much as a no-op job.
        level = logging.INFO if self.config.log_outcomes else logging.DEBUG
        if log.isEnabledFor(level):
            log.log(
                level,
                "job %s (%s) done in %.3fs",
                job.id,
                job.kind,
                attempt.duration,
                extra=fields(job, duration=round(attempt.duration, 6), outcome="done"),
            )
        self._emit(Outcome.DONE, attempt)
        return Outcome.DONE

    def _lost(self, attempt: Attempt, what: str) -> Outcome:
        """The one place a lost claim is logged: the lease expired and the job was taken over."""
        job = attempt.job
        if attempt.control is not None and attempt.control.abandoned:
            log.warning(
                "job %s: its handler came back after the worker had given up on it "
                "(timeout or cancel), so this late outcome has no effect (%s)",
                job.id,
                what,
                extra=fields(job, outcome="late"),
            )
            # The span tells what the worker recorded when it gave up (a retry, a
            # death), not this late return's fenced-away write.
            _otel.given_up(attempt.span, self._given_up.pop(job.lease, None))
            self._emit(Outcome.LOST, attempt._replace(span=None))
            return Outcome.LOST
        log.warning(
            "job %s: claim lost (lease expired and the job was taken over, or an operator "
            "changed it): %s",
            job.id,
            what,
            extra=fields(job, outcome="lost"),
        )
        self._emit(Outcome.LOST, attempt)
        return Outcome.LOST

    def _log_failure(self, attempt: Attempt, outcome: Outcome, delay: float) -> None:
        job, exc = attempt.job, attempt.error
        extra = fields(
            job,
            duration=round(attempt.duration, 6),
            error=f"{type(exc).__name__}: {exc}",
            outcome=outcome.value,
        )
        if outcome is Outcome.SNOOZED:
            log.info(
                "job %s (%s) snoozed for %.1fs: %s",
                job.id,
                job.kind,
                delay,
                exc,
                extra=extra,
            )
        elif outcome is Outcome.CANCELLED:
            log.warning(
                "job %s (%s) cancelled on attempt %s: %s",
                job.id,
                job.kind,
                job.attempt,
                exc,
                extra=extra,
            )
        elif outcome is Outcome.DEAD:
            log.error(
                "job %s (%s) dead after attempt %s/%s: %r",
                job.id,
                job.kind,
                job.attempt,
                job.max_attempts,
                exc,
                extra=extra,
            )
        else:
            log.warning(
                "job %s (%s) failed attempt %s/%s, retry in %.1fs: %r",
                job.id,
                job.kind,
                job.attempt,
                job.max_attempts,
                delay,
                exc,
                extra=extra,
            )

    def _emit(self, outcome: Outcome, attempt: Attempt) -> None:
        if attempt.span is not None:
            _otel.settled(attempt.span, outcome)
        if not self.events:
            return
        job, exc = attempt.job, attempt.error
        self.events.emit(
            WorkerEvent(
                outcome=outcome,
                job_id=job.id,
                kind=job.kind,
                queue=job.queue,
                attempt=job.attempt,
                duration=attempt.duration,
                error=None if exc is None else f"{type(exc).__name__}: {exc}",
            )
        )
