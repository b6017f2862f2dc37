"""The worker's background services, each one loop on one base: do a round, wait, repeat.

* ``LeaseKeeper`` renews the lease of every job this worker holds (the heartbeat);
* ``Listener`` LISTENs for inserts on its own connection and wakes the dispatcher;
* ``Rescuer`` requeues jobs whose lease expired (their worker died), or buries a
  job that already used its last attempt;
* ``Archiver`` moves finished jobs to ``jobs_archive`` (``--archive-every``);
* ``PeriodicEnqueuer`` enqueues the due ticks of the registry's periodic schedules,
  waking at each next tick (``sqla_jobs.periodic``; off with ``--no-periodic``);
* ``UnservedWatch`` warns, once per kind and queue, about ready jobs of this
  worker's kinds waiting in a queue it does not serve.

A round that fails on the database is logged and tried again after a backoff that
doubles up to ``MAX_ERROR_BACKOFF``: one policy for all of them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

import sqla_jobs
from sqla_jobs import config as config_mod
from sqla_jobs.config import WorkerConfig
from sqla_jobs.control import Control
from sqla_jobs.models import JobStatus
from sqla_jobs.sql import lease, locks, stats, workers
from sqla_jobs.tasks import Registry
from sqla_jobs.worker import _connlost, _db
from sqla_jobs.worker._inflight import Claimed, Inflight

log = logging.getLogger("sqla_jobs.worker")

#: Longest pause between two tries of a service whose round failed.
MAX_ERROR_BACKOFF = 5.0
#: How often a worker looks for ready jobs of its kinds in queues it does not serve.
UNSERVED_CHECK_SECONDS = 60.0


class Service:
    """A loop that runs ``round`` every ``interval`` seconds until ``until`` is set."""

    name = "service"
    #: The warning's words when a round fails (followed by the pause and the error).
    failure = "failed"

    def __init__(self, until: threading.Event, interval: float) -> None:
        self.until = until
        self.interval = interval
        #: Rounds failed in a row: the backoff's exponent.
        self.failures = 0

    def round(self) -> None:
        raise NotImplementedError

    def settled(self) -> int:
        """A round that lasts (the listener's) reached its steady state: its next failure
        backs off from the shortest pause again, not from where the last outage left it.
        Returns how many rounds had failed before."""
        failed, self.failures = self.failures, 0
        return failed

    def run(self) -> None:
        self.failures = 0
        while not self.until.is_set():
            try:
                self.round()
                self.failures = 0
                pause = self.interval
            except (sa_exc.SQLAlchemyError, psycopg.Error) as exc:  # incl. pool timeouts
                self.failures += 1
                pause = min(MAX_ERROR_BACKOFF, 0.1 * 2**self.failures)
                # A failover fails every service at once, round after round: bounded.
                say = _connlost.THROTTLE.warning if _connlost.is_lost(exc) else log.warning
                say(
                    "%s %s (next try in %.1fs): %s", self.name, self.failure, pause, _db.reason(exc)
                )
            except Exception:
                # A bug, not the database: logged with its traceback, and the service goes
                # on (a dead heartbeat or rescuer thread would fail silently, much later).
                self.failures += 1
                pause = MAX_ERROR_BACKOFF
                log.exception("%s %s (next try in %.1fs)", self.name, self.failure, pause)
            self.until.wait(pause)


class LeaseKeeper(Service):
    """Renews the leases this worker holds, every ``lock_seconds / 3``; with ``kinds``, also
    keeps this worker's row in the registry of workers (``jobs_workers``, revision 0006)."""

    name = "heartbeat"

    def __init__(
        self,
        until: threading.Event,
        engine: sa.Engine,
        config: WorkerConfig,
        ledger: Inflight,
        kinds: Sequence[str] | None = None,
    ) -> None:
        super().__init__(until, config.heartbeat_interval)
        self.engine = engine
        self.config = config
        self.ledger = ledger
        self.kinds = kinds

    def round(self) -> None:
        self._renew()
        if self.kinds is not None:
            self._announce()

    def _announce(self) -> None:
        stmt = workers.beat(
            worker=self.config.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=_version(),
            queues=self.config.served_queues,
            kinds=self.kinds or (),
            concurrency=self.config.concurrency,
            lock_seconds=self.config.lock_seconds,
            running=self.ledger.running(),
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)
            conn.execute(workers.forget_expired())

    def retire(self) -> None:
        """Remove this worker's row from the registry (it stopped); best effort."""
        if self.kinds is None:
            return
        try:
            with self.engine.begin() as conn:
                conn.execute(workers.retire(self.config.worker_id))
        except sa_exc.SQLAlchemyError as exc:
            log.warning("could not remove this worker from jobs_workers: %s", _db.reason(exc))

    def _renew(self) -> None:
        leases = self.ledger.leases()
        if not leases:
            return
        stmt = lease.heartbeat(
            worker=self.config.worker_id, leases=leases, lock_seconds=self.config.lock_seconds
        )
        since = time.monotonic()
        with self.engine.begin() as conn:
            found = _db.fenced(self.engine, conn, stmt)
        kept = {(r.id, r.attempts) for r in found}
        self.ledger.renewed(kept, since)
        for row in found:
            if row.cancelling and self.ledger.request_cancel(row.id):
                log.info(
                    "job %s: cancel requested by an operator (seen at the heartbeat)",
                    row.id,
                    extra={"job_id": row.id, "outcome": "cancelling"},
                )
        for job_id, attempt in leases:
            if (job_id, attempt) not in kept and self.ledger.was_lost(job_id, attempt):
                log.warning(
                    "job %s: lease lost (expired and taken over, or the job was changed by "
                    "an operator)",
                    job_id,
                    extra={"job_id": job_id, "attempt": attempt, "outcome": "lost"},
                )


def _version() -> str:
    # The source, not the installed metadata: a checkout run from PYTHONPATH (or an
    # editable install older than the code) reports the code it runs.
    return sqla_jobs.__version__


class Listener(Service):
    """LISTENs on the jobs channel on a connection of its own; each notification wakes.

    Also LISTENs on the cancel channel (``locks.CANCEL_CHANNEL``, revision 0005): its
    payload is the id of a running job an operator cancelled; ``on_cancel`` tells it
    to the job's handler at once (the lease keeper's round is the fallback).
    """

    name = "listener"
    failure = "connection lost"

    def __init__(
        self,
        until: threading.Event,
        config: WorkerConfig,
        wake: Callable[[], None],
        on_cancel: Callable[[int], object] | None = None,
        connected: Callable[[], None] | None = None,
    ):
        super().__init__(until, 0.0)
        self.channel = config_mod.check_channel(locks.NOTIFY_CHANNEL)
        self.cancel_channel = config_mod.check_channel(locks.CANCEL_CHANNEL)
        # Through the dialect, as the engine connects: a multi-host URL
        # (?host=a:5432&host=b:5432) becomes libpq's host=a,b port=5432,5432.
        self.connect_kwargs = _connlost.connect_kwargs(config.url)
        self.probe_channel = config_mod.check_channel(locks.NOTIFY_CHANNEL + "_probe")
        # How often the listener sends itself a NOTIFY to prove its connection alive, and
        # how long the answer may take: a dead LISTEN connection is noticed within their sum.
        self.probe_every: float | None = config.listener_probe_interval
        self.probe_timeout = config.listener_probe_timeout
        self.worker_id = config.worker_id
        self._probes = 0
        self.wake = wake
        self.on_cancel = on_cancel
        self.connected = connected

    def round(self) -> None:
        with psycopg.connect(**self.connect_kwargs, autocommit=True) as conn:
            _connlost.check_writable(conn)  # a standby refuses LISTEN; a read-only node is stale
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
            if self.on_cancel is not None:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.cancel_channel)))
            if self.probe_every is not None:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.probe_channel)))
            if self.connected is not None:
                # Whatever took our connection may have taken the idle flag's too.
                self.connected()
            self.wake()  # notifications sent while we were away are lost: poll
            _connlost.THROTTLE.flush()
            failed = self.settled()
            if failed:
                log.info(
                    "listener back, on %s:%s, after %d failed tr%s",
                    conn.info.host,
                    conn.info.port,
                    failed,
                    "y" if failed == 1 else "ies",
                )
            self._listen(conn)

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        # The probe: a NOTIFY to ourselves every probe_every seconds, which must come back
        # within probe_timeout. A socket that a failover or a network left open but dead
        # delivers nothing and raises nothing; LISTEN would wait on it for ever.
        sent: str | None = None
        next_probe = time.monotonic() + (self.probe_every or 0.0)
        while not self.until.is_set():
            # Wake for the next probe or its deadline when that comes before a second
            # (settings under a second would otherwise be rounded up to one).
            wait = 1.0
            if self.probe_every is not None:
                due = next_probe - self.probe_every + self.probe_timeout if sent else next_probe
                wait = min(wait, max(0.01, due - time.monotonic()))
            for note in conn.notifies(timeout=wait, stop_after=1):
                if note.channel == self.cancel_channel:
                    self._cancel(note.payload)
                elif note.channel == self.probe_channel:
                    if note.payload == sent:
                        sent = None
                else:
                    self.wake()
            if self.probe_every is None:
                continue
            now = time.monotonic()
            if sent is not None and now > next_probe - self.probe_every + self.probe_timeout:
                raise psycopg.OperationalError(
                    f"no answer to the listener's probe within {self.probe_timeout:g}s"
                )
            if sent is None and now >= next_probe:
                sent = self._probe(conn)
                next_probe = now + self.probe_every

    def _probe(self, conn: psycopg.Connection[Any]) -> str:
        """Send the probe (bounded by ``probe_timeout``); fail on a server turned read-only."""
        self._probes += 1
        token = f"{self.worker_id}:{self._probes}"
        # A statement on a dead socket blocks in the driver: past the timeout, the socket
        # is shut down under it, and the statement fails like a closed connection.
        fired = threading.Event()
        watchdog = threading.Timer(self.probe_timeout, _shut_down, (conn, fired))
        watchdog.daemon = True
        watchdog.start()
        try:
            writable = _connlost.probe(conn, self.probe_channel, token)
        except psycopg.OperationalError as exc:
            if fired.is_set():
                raise psycopg.OperationalError(
                    f"no answer to the listener's probe within {self.probe_timeout:g}s "
                    "(a dead socket)"
                ) from exc
            raise
        finally:
            watchdog.cancel()
        if not writable:
            raise _connlost.ReadOnlyServer("the listener's server turned read-only or standby")
        return token

    def _cancel(self, payload: str) -> None:
        if self.on_cancel is None or not payload.isdigit():
            return
        if self.on_cancel(int(payload)):
            log.info(
                "job %s: cancel requested by an operator",
                payload,
                extra={"job_id": int(payload), "outcome": "cancelling"},
            )


def _shut_down(conn: psycopg.Connection[Any], fired: threading.Event) -> None:
    """Shut ``conn``'s socket down (both ways), from another thread: a read blocked on it
    returns at once with end of file."""
    fired.set()
    try:
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, psycopg.Error):
        log.debug("shutting the listener's socket down", exc_info=True)


class DeadlineWatch(Service):
    """Every quarter second: cancels the database statement of a running job whose
    deadline passed, and gives up on a handler still running ``timeout_grace`` seconds
    after its deadline or an operator's cancel (the completer records the outcome, the
    lease keeper stops renewing it, the executor starts a thread in its place)."""

    name = "deadline watch"

    def __init__(
        self,
        until: threading.Event,
        config: WorkerConfig,
        ledger: Inflight,
        give_up: Callable[[Claimed, Control], object],
        replace_thread: Callable[[], bool],
    ) -> None:
        super().__init__(until, 0.25)
        self.grace = config.timeout_grace
        self.ledger = ledger
        self.give_up = give_up
        self.replace_thread = replace_thread

    def round(self) -> None:
        for control in self.ledger.expiring():
            control.expired()
        for job, control in self.ledger.overdue(self.grace):
            log.warning(
                "job %s (%s): handler still running %.1fs after its %s; giving up on it",
                job.id,
                job.kind,
                self.grace,
                "cancel" if control.cancelled else "timeout",
                extra={"job_id": job.id, "kind": job.kind, "attempt": job.attempt},
            )
            self.give_up(job, control)
            if control.abandoned and not self.replace_thread():
                log.error(
                    "too many handler threads are stuck in handlers that ignore their "
                    "timeout; not starting another (this worker runs fewer jobs at once)"
                )


class Rescuer(Service):
    """Requeues expired leases every ``rescue_interval``; wakes the dispatcher if it did."""

    name = "lease rescue"

    def __init__(
        self,
        until: threading.Event,
        engine: sa.Engine,
        config: WorkerConfig,
        wake: Callable[[], None],
    ) -> None:
        super().__init__(until, config.rescue_interval)
        self.engine = engine
        self.wake = wake

    def round(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(lease.index_scans_only())  # see lease.index_scans_only
            rows = _db.fenced(self.engine, conn, lease.rescue_expired())
        for row in rows:
            status = JobStatus(row.status)
            dead = status is JobStatus.DEAD
            # dead, cancelled (an operator cancelled it while its worker was gone), or
            # queued again.
            said = "requeued" if status is JobStatus.QUEUED else status.value
            log.log(
                logging.ERROR if dead else logging.WARNING,
                "job %s (%s) lease expired on attempt %s (worker %s): %s",
                row.id,
                row.kind,
                row.attempts,
                row.worker,
                said,
                extra={
                    "job_id": row.id,
                    "kind": row.kind,
                    "attempt": row.attempts,
                    "outcome": "rescued" if said == "requeued" else said,
                },
            )
        if rows:
            self.wake()


class Archiver(Service):
    """Archives finished jobs every ``archive_every`` seconds, first right at start-up."""

    name = "archiving"

    def __init__(self, until: threading.Event, engine: sa.Engine, config: WorkerConfig) -> None:
        assert config.archive_every is not None
        super().__init__(until, config.archive_every)
        self.engine = engine
        self.older_than = timedelta(seconds=config.archive_older_than)
        self.dead_after = (
            None
            if config.archive_dead_after is None
            else timedelta(seconds=config.archive_dead_after)
        )

    def round(self) -> None:
        from sqla_jobs import ops  # ops imports the registry and stats: only when archiving

        with self.engine.connect() as conn:
            # A session-level lock: held across the batches' commits, released below or
            # by PostgreSQL when this connection dies. Whoever fails to get it skips its turn.
            got = conn.execute(locks.try_advisory_lock(locks.ARCHIVE_LOCK_KEY)).scalar_one()
            conn.commit()
            if not got:
                log.debug("another worker is archiving; skipping this turn")
                return
            moved = 0
            try:
                with Session(bind=conn) as session:
                    batches = ops.archive_batches(
                        session, self.older_than, include_dead_after=self.dead_after
                    )
                    for count in batches:
                        moved += count
                        if self.until.is_set():
                            break
            finally:
                conn.execute(locks.advisory_unlock(locks.ARCHIVE_LOCK_KEY))
                conn.commit()
        if moved:
            log.info("archived %d finished job(s)", moved, extra={"outcome": "archived"})


class WorkflowSweeper(Service):
    """Runs the workflow repair sweep every ``workflow_sweep_every`` seconds (#26).

    The trigger releases a step in the transaction that ends its last dependency; this
    catches what that transaction could not see. One worker of the fleet at a time: a
    transaction-level advisory lock, tried, never waited for.
    """

    name = "workflow sweep"

    def __init__(self, until: threading.Event, engine: sa.Engine, config: WorkerConfig) -> None:
        super().__init__(until, config.workflow_sweep_every)
        self.engine = engine

    def round(self) -> None:
        from sqla_jobs import workflows

        with self.engine.begin() as conn:
            if not conn.execute(
                locks.try_advisory_xact_lock(locks.WORKFLOW_SWEEP_LOCK_KEY)
            ).scalar_one():
                return
            released = workflows.sweep(conn)
        if released:
            log.warning(
                "workflow sweep released %d step(s) the ending transaction could not see",
                released,
                extra={"outcome": "released"},
            )


class PeriodicEnqueuer(Service):
    """Enqueues the due ticks of ``registry``'s schedules, then sleeps until the next tick.

    Every worker runs one; the database decides which ticks are due and each is
    enqueued once (see [``sqla_jobs.periodic.enqueue_due``][sqla_jobs.periodic.enqueue_due]). The
    pause after a round is the time to the next tick by the database's clock, at most a minute.
    """

    name = "periodic ticks"
    failure = "could not be enqueued"

    def __init__(self, until: threading.Event, engine: sa.Engine, registry: Registry) -> None:
        super().__init__(until, 0.0)
        self.engine = engine
        self.registry = registry
        log.info(
            "enqueueing the ticks of %d periodic schedule(s): %s",
            len(registry.schedules),
            ", ".join(f"{s.name} ({s.expression})" for s in registry.schedules),
        )

    def round(self) -> None:
        from sqla_jobs import periodic

        self.interval = periodic.enqueue_due(self.engine, self.registry).next_in


class UnservedWatch(Service):
    """Warns once per ``(kind, queue)`` about ready jobs of this worker's kinds waiting in
    a queue it does not serve: no claim of this worker takes them.

    Their usual cause: a plain ``enqueue(session, kind)`` (or ``Job(...)``) puts a job
    in ``default``, not in its handler's ``queue=``, and the worker serves the handler's
    queue only. The look is ``sqla_jobs.sql.stats.unserved_ready`` (bounded, read
    through jobs_claim_idx), at start and every ``UNSERVED_CHECK_SECONDS``.
    """

    name = "unserved queue check"

    def __init__(
        self, until: threading.Event, engine: sa.Engine, config: WorkerConfig, kinds: Sequence[str]
    ) -> None:
        super().__init__(until, UNSERVED_CHECK_SECONDS)
        self.engine = engine
        self.queues = config.served_queues
        self.statement = stats.unserved_ready(kinds, self.queues)
        self.warned: set[tuple[str, str]] = set()

    def round(self) -> None:
        with self.engine.connect() as conn:
            found = conn.execute(self.statement).all()
            conn.rollback()
        for row in found:
            if (row.kind, row.queue) in self.warned:
                continue
            self.warned.add((row.kind, row.queue))
            log.warning(
                "%d ready job(s) of kind %r wait in queue %r, which this worker does not "
                "serve (--queues %s): no worker of this app claims them unless one serves "
                "%r. Enqueue with registry.enqueue(...) or handler.enqueue(...) to use the "
                "handler's queue, or pass queue= to enqueue",
                row.ready,
                row.kind,
                row.queue,
                ",".join(self.queues),
                row.queue,
                extra={"kind": row.kind, "queue": row.queue, "outcome": "unserved"},
            )
