"""The dispatcher: claims ready jobs in batches and hands them to the executor.

It claims, in one short committed transaction, up to as many ready jobs as there are
free handler slots plus a prefetch buffer, and puts them in the buffer; it claims again
when at least half the buffer is free, so a short job never waits for a claim round
trip and a batch of jobs costs one claim. It sleeps when nothing is ready, until a
wake-up: a notification (the listener), a freed slot (the ledger), a short retry coming
due (``wake_at``: one timer for all of them), the lease rescuer, or the poll interval.
Once a wake-up that may bring jobs leaves nothing ready, it looks up when the next
queued job comes due and sets the timer for it (a scheduled job starts at its
``run_at``, not at the next poll); after a round that filed jobs, a little later
(``DUE_LOOK_DELAY_SECONDS``), so the look does not compete with their start.

Each claim of a pool's kinds starts each priority's walk of ``jobs_claim_idx`` just below
the newest ``run_at`` it claimed at that priority (``FLOOR_SLACK_SECONDS`` below), not
at the start: while an application's transaction pins the MVCC horizon, the index
entries of every job claimed since stay at the head of the index and a walk from the
start reads past all of them, more with each job run (sqla_jobs.sql.lease._floor). A job
can be ready below the floor (committed late with an older ``run_at``, given back by a
stopping worker): a claim from the start (a full claim) finds it, and is then claimed
in priority order like any other. Full claims come ``FULL_CLAIM_SECONDS`` (1 s) apart
while they are cheap, further apart as they cost more, so they take at most
``FULL_CLAIM_SHARE`` (5%) of the time, and never more than ``FULL_CLAIM_MAX_SECONDS``
(10 s) apart: the longest such a job waits, given a free slot (see
``sqla_jobs.worker._floors``). When a floored claim comes back short, a timer makes
sure that full claim happens even if nothing else wakes the worker.

Each pool of handler slots (the handler threads for ``def`` handlers, the event loop
for ``async def`` ones) has its own buffer, its own pace and its own claim, of its own
kinds only: a worker whose threads are busy never claims their kinds for the loop's
free slots, or the other way round. A pool whose claim came back short rests (is not
claimed for) until the next wake-up that may bring it jobs (a notification, a timer,
the rescuer, the poll interval), so a busy pool's claims do not drag an idle pool's
empty claims along with them; a freed slot does not end the rest.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from sqla_jobs import validation
from sqla_jobs.config import WorkerConfig
from sqla_jobs.sql import lease, locks
from sqla_jobs.worker import _connlost, _db
from sqla_jobs.worker._buffer import Waiting
from sqla_jobs.worker._floors import Floors
from sqla_jobs.worker._inflight import SYNC_POOL, Claimed, Inflight
from sqla_jobs.worker._limits import Limits

log = logging.getLogger("sqla_jobs.worker")

#: Longest pause after a database error before the dispatcher tries again.
MAX_ERROR_BACKOFF = 5.0
#: The prefetch buffer holds about this many seconds of work (at the handlers' recent
#: pace), up to ``WorkerConfig.prefetch`` jobs: thousands of 20-microsecond jobs, but
#: none of the 1-second jobs, which would sit in this worker while others are idle.
PREFETCH_SECONDS = 0.05
#: While a pool's claims come back full (the idle flag is down: producers do not
#: notify), it claims again at least this often, even before half its buffer is free:
#: a more urgent job committed meanwhile waits this long to be claimed (the buffer then
#: hands it out first), not for half a buffer of work (25 ms by design, more when the
#: pace is misjudged). With no room at all, the look claims only jobs more urgent than
#: any buffered (``_claim_more_urgent``). At most 50 small claims a second, only while
#: busy.
BUSY_LOOK_SECONDS = 0.02
#: After raising the idle flag, while producers' commits that decided not to notify are
#: still in flight (revision 0007), look again this soon, twice as late each time up to
#: IDLE_RECHECK_SECONDS, for at most the poll interval.
IN_FLIGHT_RETRY_SECONDS = 0.002
IDLE_RECHECK_SECONDS = 0.05
#: A scheduled job is claimed this long after its ``run_at`` by the timer an idle worker
#: sets (see _look_for_next_due): the claim compares with the server's clock, and a
#: timer that fires first finds nothing.
DUE_MARGIN_SECONDS = 0.001
#: A round that filed jobs and found nothing more ready puts off its look for the next
#: due time (see _loop) until the next round that files nothing, or this long at most:
#: done at once, its statement and its Python ran on the dispatcher's thread just as the
#: handler thread started the job (0.1-0.25 ms more from the buffer to the handler, in
#: the traced pickup benchmark). Bounded, so a delayed job enqueued beside a ready one
#: (one notification for both) still gets its timer while the ready one runs for long.
DUE_LOOK_DELAY_SECONDS = 0.005


class Buffer(Protocol):
    """Where claimed jobs wait for a handler slot, most urgent first (see _buffer)."""

    jobs: Waiting

    def put(self, item: Claimed | None) -> None: ...

    def get_nowait(self) -> Claimed | None: ...


@dataclass(eq=False)
class Pool:
    """One pool of handler slots: its kinds, its buffer and the pace of its handlers."""

    number: int  # the ledger's pool (SYNC_POOL, ASYNC_POOL)
    kinds: tuple[str, ...]
    slots: int
    buffer: Buffer
    claim_sql: _db.Compiled = ("", {})
    # Both follow the buffer's size (see _size_buffer); they start without one.
    capacity: int = 0
    # Claim again once at least this many slots are free: batches of about half the
    # buffer, not one claim per finished job.
    min_claim: int = 1
    job_seconds: float | None = field(default=None)  # moving average of handler run time
    # The last claim came back short: no claim for this pool before this (monotonic) time
    # or the next outside wake-up (see Dispatcher._loop).
    rest_until: float = 0.0
    #: Claims of this pool's limited queues and kinds (revision 0006); None: no limits.
    limits: Limits | None = None
    # The last claim came back full: claim again at this (monotonic) time whatever the
    # room (BUSY_LOOK_SECONDS); 0.0: not busy.
    look_at: float = 0.0
    # Where its claims start in jobs_claim_idx, and when one walks it from the start.
    floors: Floors = field(default_factory=Floors)

    def job_took(self, seconds: float) -> None:
        """A handler ran for ``seconds``: the pace the buffer is sized from."""
        average = self.job_seconds  # a racy update loses a sample at worst
        self.job_seconds = seconds if average is None else 0.9 * average + 0.1 * seconds


class Dispatcher:
    """Claim loop, buffer sizing, the idle flag and the one wake-up timer."""

    def __init__(
        self,
        engine: sa.Engine,
        config: WorkerConfig,
        kinds: list[str],
        ledger: Inflight,
        buffer: Buffer,
        pools: list[Pool] | None = None,
        max_attempts: Mapping[str, int] | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.ledger = ledger
        self.buffer = buffer
        #: With no pools given, one pool of ``concurrency`` threads for every kind.
        self.pools = pools or [Pool(SYNC_POOL, tuple(kinds), config.concurrency, buffer)]
        self._next_due_sql = _db.compile_statement(
            engine, lease.next_due(queues=config.served_queues, kinds=kinds)
        )
        for pool in self.pools:
            pool.capacity = pool.slots
            pool.claim_sql = _db.compile_statement(
                engine,
                lease.claim(
                    worker=config.worker_id,
                    lock_seconds=config.lock_seconds,
                    queues=config.served_queues,
                    kinds=pool.kinds,
                    limit=1,
                    # The handlers' max_attempts, for jobs enqueued without one.
                    max_attempts=max_attempts,
                ),
            )
        #: The clock that times full claims and says when the next is due (monotonic;
        #: replaced by tests to stand for a full claim's cost).
        self.clock: Callable[[], float] = time.monotonic
        self._wake = threading.Event()
        self._woken = False  # a wake-up that may bring jobs (not only a freed slot)
        self._timer_fired = False  # a timer that may bring jobs came due (see _loop)
        self._look_for_due = True  # look up the next due time once nothing is ready
        # When that look is to be made (monotonic), put off after a round that filed
        # jobs (DUE_LOOK_DELAY_SECONDS); 0.0: no look pending.
        self._due_look_at = 0.0
        # Monotonic times to wake at (a heap), each with whether it pokes the limits.
        self._timers: list[tuple[float, bool]] = []
        self._timers_lock = threading.Lock()
        self._idle_conn: sa.Connection | None = None  # holds the idle flag (see _loop)
        self._idle_flag_up = False
        # Set when the listener (re)connects: whatever took its connection (a server
        # restart, terminated backends) may have taken the idle flag's too, and a flag
        # that silently vanished means producers stop notifying this worker.
        self._idle_flag_suspect = False

    def wake(self) -> None:
        self._woken = True
        self._wake.set()

    def room_freed(self) -> None:
        """A handler slot was freed: claim for its pool (a resting pool keeps resting)."""
        self._wake.set()

    def listener_connected(self) -> None:
        """The listener (re)connected: raise the idle flag again, on a new connection, at
        the next wake-up (the listener's poll)."""
        self._idle_flag_suspect = True

    def wake_at(self, when: float, poke: bool = True) -> None:
        """Look at the table again at ``when`` (monotonic): a short retry comes due then.

        ``poke=False``: a limited group's own recheck, which brings no new jobs, so the
        groups and kinds found empty stay skipped (see Limits.poke).
        """
        with self._timers_lock:
            heapq.heappush(self._timers, (when, poke))
            # The loop waits until the earliest timer at the latest: only an earlier one
            # needs it to compute its timeout again. (Woken for every timer, a group
            # that set one on each look kept the loop spinning until it came due.)
            earliest = self._timers[0][0] == when
        if earliest:
            self._wake.set()

    def job_took(self, seconds: float) -> None:
        """A handler of the first pool ran for ``seconds`` (see ``Pool.job_took``)."""
        self.pools[0].job_took(seconds)

    def run(self, draining: threading.Event) -> None:
        """Claim until ``draining`` is set; then lower the idle flag and return."""
        try:
            self._loop(draining)
        finally:
            self._set_idle_flag(False)
            if self._idle_conn is not None:
                self._idle_conn.close()
                self._idle_conn = None

    def give_back_buffered(self) -> list[Claimed]:
        """Take every job still in the buffers or held back by a limit (no handler
        started it), for release."""
        unstarted: list[Claimed] = []
        for pool in self.pools:  # first: a handler whose job ends may start one of them
            if pool.limits is not None:
                unstarted += pool.limits.take_reserves()
        for pool in self.pools:
            while True:
                try:
                    job = pool.buffer.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    unstarted.append(job)
        return unstarted

    def _loop(self, draining: threading.Event) -> None:
        errors = 0
        # After the idle flag went up: the wait before looking for commits in flight
        # again (None: none to look for), and when to leave them to the poll.
        retry_in: float | None = None
        give_up_at = 0.0
        look_again = False  # the next round claims for every pool, resting or not
        timed_out = True  # the last wait ended by its timeout (the poll); first round too
        while not draining.is_set():
            # Cleared before looking at the table, so a wake-up that arrives while we
            # claim is not lost: the wait below then returns at once.
            self._wake.clear()
            self._pop_due_timers()
            # A notification, a timer or the poll (not a freed slot, nor a recheck of
            # commits in flight) may bring scheduled jobs, and a timer that brought one
            # leaves the next one's time unknown: once the table has nothing more ready
            # (this round or a later one), look up when the next job comes due.
            if self._woken or timed_out or self._timer_fired:
                self._look_for_due = True
            self._timer_fired = False
            woken, self._woken, look_again = self._woken or look_again, False, False
            now = time.monotonic()
            # Per pool: (room for a claim, whether the table had fewer ready jobs).
            rounds: list[tuple[bool, bool]] = []
            filed = False  # this round put jobs in a buffer
            try:
                for pool in self.pools:
                    if pool.rest_until > now and not woken and len(self.pools) > 1:
                        rounds.append((False, True))  # resting: nothing was ready for it
                        continue
                    self._size_buffer(pool)
                    # A wake-up that may bring jobs (a notification, a timer), or a busy
                    # pool's look: claim whatever room there is, not only half a buffer.
                    look = woken or 0.0 < pool.look_at <= now
                    min_claim = 1 if look else pool.min_claim
                    free = self.ledger.room(pool.capacity, min_claim, pool.number)
                    has_room = free >= min_claim
                    claimed = self._claim(pool, free) if has_room else []
                    if not has_room and pool.limits is not None:
                        # Held-back jobs of limited groups are in the buffer: they may
                        # fill it, and still need their limits read again to start.
                        claimed = pool.limits.look_at_reserves(self._run_claim)
                    if look and not has_room:
                        # A full buffer (or one the pace now says is too full) would
                        # keep a more urgent job waiting until its jobs ran.
                        claimed += self._claim_more_urgent(pool)
                        pool.look_at = now + BUSY_LOOK_SECONDS
                    for job in claimed:
                        pool.buffer.put(job)
                    filed = filed or bool(claimed)
                    ran_out = has_room and len(claimed) < free
                    if has_room:
                        pool.look_at = 0.0 if ran_out else now + BUSY_LOOK_SECONDS
                    # A pool with limited groups does not rest: a capped group comes
                    # back short while it has jobs, and its limits wake us to refill.
                    limited = pool.limits is not None and bool(pool.limits.groups)
                    rest = ran_out and not limited
                    pool.rest_until = now + self.config.poll_interval if rest else 0.0
                    rounds.append((has_room, ran_out))
                if self._look_for_due and all(ran_out for _, ran_out in rounds):
                    self._look_for_due = False
                    if not self._due_look_at:
                        self._due_look_at = now + (DUE_LOOK_DELAY_SECONDS if filed else 0.0)
                if self._due_look_at and (not filed or time.monotonic() >= self._due_look_at):
                    self._due_look_at = 0.0
                    self._look_for_next_due()
                errors = 0
            except sa_exc.SQLAlchemyError as exc:  # incl. pool timeouts
                errors += 1
                pause = min(MAX_ERROR_BACKOFF, 0.1 * 2**errors)
                lost = _connlost.is_lost(exc)
                # A failover or a server restart: the idle flag's session lock went with
                # the old server; raised again on a new connection.
                self._idle_flag_suspect |= lost
                say = _connlost.THROTTLE.warning if lost else log.warning
                say("database error in dispatcher (retrying in %.1fs): %s", pause, _db.reason(exc))
                draining.wait(pause)
                continue
            exhausted = any(ran_out for _, ran_out in rounds)
            if self.config.listen:
                if self._idle_flag_suspect:
                    self._idle_flag_suspect = False
                    self._drop_idle_flag()  # raised again below, on a new connection
                # The idle flag tells the insert trigger to NOTIFY (revision 0003). Up
                # while the queue keeps up with us; down while claims come back full, so
                # producers' commits are not serialized by NOTIFY under load.
                if exhausted and not self._idle_flag_up:
                    if self._set_idle_flag(True):
                        retry_in, give_up_at = 0.0, now + self.config.poll_interval
                elif not exhausted and self._idle_flag_up and any(r for r, _ in rounds):
                    self._set_idle_flag(False)
                if not self._idle_flag_up:
                    retry_in = None  # lowered or lost: raised (and looked after) again
                elif retry_in is not None:
                    # Jobs committed since our claim, or committing now, that decided
                    # not to notify before the flag went up: once no such commit is in
                    # flight, one more claim sees them all (revision 0007).
                    if self._no_commit_in_flight() or time.monotonic() > give_up_at:
                        retry_in, look_again = None, True
                        continue
                    look_again = True  # claim what did commit; look for the rest again
            if not any(room and not ran_out for room, ran_out in rounds):
                # No room (the ledger wakes us when there is), or nothing more is ready
                # (a notification, a retry's timer, the rescuer or the poll wakes us;
                # finished handlers do not, so a drained queue is not polled per job).
                timeout = self._timeout()
                if retry_in is not None:
                    retry_in = min(IDLE_RECHECK_SECONDS, max(IN_FLIGHT_RETRY_SECONDS, 2 * retry_in))
                    timeout = min(timeout, retry_in)
                timed_out = not self._wait(timeout)
            else:
                timed_out = False

    def _wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a wake-up (True) or not (False); a look for the next
        due time put off past a round (``_due_look_at``) is made when it comes due,
        without ending the wait: a round would send a claim as well."""
        deadline = time.monotonic() + timeout
        while self._due_look_at and self._due_look_at < deadline:
            if self._wake.wait(max(0.0, self._due_look_at - time.monotonic())):
                return True
            try:
                self._look_for_next_due()  # a timer it sets before the deadline wakes us
            except sa_exc.SQLAlchemyError:
                # Left to the next round, which looks again (and backs off on errors).
                log.debug("looking for the next due time", exc_info=True)
                return True
            self._due_look_at = 0.0
        return self._wake.wait(max(0.0, deadline - time.monotonic()))

    def _timeout(self) -> float:
        """The poll interval, or less if a retry's timer or a busy pool's next look
        (BUSY_LOOK_SECONDS) comes due sooner; none if a timer came due since the round."""
        if self._pop_due_timers():
            return 0.0
        now = time.monotonic()
        # A look that is due already waits for room instead (the ledger wakes us).
        looks = [pool.look_at - now for pool in self.pools if pool.look_at > now]
        timeout = min([self.config.poll_interval, *looks])
        with self._timers_lock:
            if self._timers:
                return min(timeout, self._timers[0][0] - now)
        return timeout

    def _pop_due_timers(self) -> bool:
        """Take the timers that came due; whether any did. One that pokes (a retry, a
        scheduled job) is a wake-up that may bring jobs (see _loop)."""
        now = time.monotonic()
        due = poke = False
        with self._timers_lock:
            while self._timers and self._timers[0][0] <= now:
                due = True
                poke = heapq.heappop(self._timers)[1] or poke
        if poke:
            self._woken = self._timer_fired = True
            for pool in self.pools:
                if pool.limits is not None:
                    pool.limits.poke()  # a retry came due: the claims look at every kind again
        return due

    def _size_buffer(self, pool: Pool) -> None:
        """Buffer PREFETCH_SECONDS of work at the pool's handlers' recent pace."""
        per_job = pool.job_seconds
        target = 0
        if per_job is not None and self.config.prefetch:
            target = min(self.config.prefetch, int(self._pace(pool, per_job) * PREFETCH_SECONDS))
        pool.capacity = pool.slots + target
        pool.min_claim = max(1, target // 2)

    def _pace(self, pool: Pool, per_job: float) -> float:
        """Jobs per second the pool's handlers will take from the buffer: a slot whose job
        has run longer than the average so far counts at the pace that job allows.

        The average comes from jobs that ended. At a worker's start it is the first fast
        job's time while slow ones still hold the other slots: counted at that pace, four
        slots of which one was free buffered four times the work one slot does in
        PREFETCH_SECONDS, and a slow job among them held the rest behind it for its
        whole run (fast jobs waited 25 s behind slow ones; tests/test_dispatcher.py).
        At least one slot counts at the average, so a worker whose every slot runs a long
        job still holds the next few jobs (and an urgent one claimed later still goes
        first): the one that ends first finds work without a claim.
        """
        per_job = max(per_job, 1e-6)
        slow = [age for age in self.ledger.running_ages(pool.number) if age > per_job]
        return max(1, pool.slots - len(slow)) / per_job + sum(1.0 / age for age in slow)

    def _claim(self, pool: Pool, limit: int) -> list[Claimed]:
        """Claim for ``pool``: its limited groups (revision 0006) first when due, then
        its unlimited kinds."""
        limits = pool.limits
        first: list[Claimed] = []
        if limits is not None:
            self._pop_due_timers()  # before deciding what to skip
            limits.refresh()
            if limits.due():
                first = limits.claim(limit, self._run_claim, ahead=pool.capacity - pool.slots)
        wanted = limit - len(first)
        if limits is not None and limits.skip_unlimited():
            jobs = []
        else:
            jobs = self._claim_unlimited(pool, wanted)
            if limits is not None and len(jobs) < wanted:
                limits.unlimited_drained()
        jobs = first + jobs
        if limits is not None and limits.groups and not first and len(jobs) < limit:
            jobs += limits.claim(
                limit - len(jobs), self._run_claim, ahead=pool.capacity - pool.slots
            )
        return jobs

    def _look_for_next_due(self) -> None:
        """Nothing was ready: set the wake-up timer for the next scheduled job, if it
        comes due before the poll would find it.

        Only when a wake-up found nothing (one indexed query per idle spell, never while
        claims come back full): a job enqueued with ``delay=`` notifies when it is
        inserted, not when it comes due, and another worker's retry or snooze notifies
        no one; without this they waited for the poll (up to ``poll_interval`` late).
        """
        sql, params = self._next_due_sql
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            found = _db.rows(conn, sql, params, prepare=self.config.prepared_statements)
        seconds = found[0][0] if found else None
        if seconds is not None and float(seconds) < self.config.poll_interval:
            self.wake_at(time.monotonic() + float(seconds) + DUE_MARGIN_SECONDS)

    def _claim_more_urgent(self, pool: Pool) -> list[Claimed]:
        """No room, but a look is due: claim up to ``slots`` jobs more urgent than every
        job the buffer holds. They go past the buffer's size, and out of it first, so
        what they add is bounded by the urgent jobs themselves, not by the backlog.

        Without this, a burst claimed at an idle worker's fast pace (50 ms of quick jobs,
        then the jobs are 2 ms each: 220 buffered where 104 fit) kept every urgent job
        unclaimed until the buffer ran down to its new size, 60-90 ms in the busy-case
        benchmark. Limited kinds are left to their own claims.
        """
        least = pool.buffer.jobs.least_urgent()
        if least is None or least <= validation.MIN_PRIORITY:
            return []
        if pool.limits is not None and pool.limits.skip_unlimited():
            return []
        return self._claim_unlimited(pool, pool.slots, max_priority=least - 1)

    def _claim_unlimited(
        self, pool: Pool, limit: int, max_priority: int = validation.MAX_PRIORITY
    ) -> list[Claimed]:
        """Claim up to ``limit`` of ``pool``'s unlimited kinds, at least ``max_priority``
        urgent, into the ledger."""
        sql, params = pool.claim_sql
        since = time.monotonic()
        # From the start when one is due (full_claim_period), else from each priority's
        # floor (see the module's docstring). Only a claim of every priority counts as
        # the full claim: a look for more urgent jobs walks some of them.
        every = max_priority == validation.MAX_PRIORITY
        full = limit > 0 and every and pool.floors.full_due(self.clock())
        floors = None if full else pool.floors.values()
        values = {**params, "max_priority": max_priority, "floors": floors}
        # Alone in autocommit mode: one statement, one round trip (sql.lease.claim).
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            started = self.clock()  # the claim's own time, not the pool's checkout
            jobs = self._run_claim(conn, (sql, values), limit)
        when = pool.floors.claimed(jobs, room=limit, full=full, started=started, ended=self.clock())
        if when is not None:
            self.wake_at(when)  # short: a job may be ready below a floor
        self.ledger.add(jobs, pool.number, since)
        return jobs

    def _run_claim(
        self,
        conn: sa.Connection,
        compiled: tuple[str, dict[str, Any]],
        limit: int,
        commit: bool = False,
    ) -> list[Claimed]:
        if limit <= 0:
            return []
        sql, params = compiled
        # Prepared: that skips 0.7 ms of planning per batch, and the claim's generic
        # plan is its custom one (an index range scan per priority, primary-key
        # probes; see benchmarks/README.md).
        values = {**params, "limit": limit}
        prepare = self.config.prepared_statements
        if commit:  # the claim and its COMMIT in one round trip
            found = _db.rows_and_commit(
                conn, sql, values, prepare=prepare, json_loads=_db.load_payload
            )
        else:
            found = _db.rows(
                conn, sql, values, prepare=prepare, json_loads=_db.load_payload, tuples=True
            )
        # Columns: id, kind, queue, payload, attempts, max_attempts, timeout, snoozes,
        # priority, meta, tags, waited (sql.lease.claim).
        return [Claimed(*r) for r in found]

    def _set_idle_flag(self, up: bool) -> bool:
        """Raise or lower the idle flag on its own connection; False if that failed.

        A session-level lock, so a worker that dies takes its flag with it. If the flag
        cannot be raised, producers stop notifying this worker: it falls back to polling.
        """
        if up == self._idle_flag_up:
            return True
        try:
            if self._idle_conn is None:
                self._idle_conn = self.engine.connect().execution_options(
                    isolation_level="AUTOCOMMIT"
                )
            self._idle_conn.execute(locks.idle_flag(raise_=up))
            self._idle_flag_up = up
            return True
        except sa_exc.SQLAlchemyError as exc:
            _connlost.THROTTLE.warning(
                "could not %s the idle flag: %s", "raise" if up else "lower", _db.reason(exc)
            )
            self._drop_idle_flag()
            return False

    def _no_commit_in_flight(self) -> bool:
        """Whether no producer's commit that looked at the idle flag before it went up is
        still in flight (``locks.no_commit_in_flight``); False if that cannot be known.

        Without this, a job inserted while we were busy whose transaction commits after
        our next claim would notify no one and wait for the poll.
        """
        if self._idle_conn is None:
            return False
        try:
            return bool(self._idle_conn.execute(locks.no_commit_in_flight()).scalar())
        except sa_exc.SQLAlchemyError as exc:  # the flag may have gone with its connection
            log.warning("could not look for commits in flight: %s", _db.reason(exc))
            self._drop_idle_flag()
            return False

    def _drop_idle_flag(self) -> None:
        """Close the idle flag's connection (the lock goes with it); the flag is down."""
        self._idle_flag_up = False
        if self._idle_conn is not None:
            try:
                self._idle_conn.invalidate()  # closes it: a lock it still held goes too
                self._idle_conn.close()
            except sa_exc.SQLAlchemyError:
                log.debug("closing the idle flag's connection", exc_info=True)
            self._idle_conn = None
