"""The dispatcher's claims of limited queues and kinds (revision 0006).

Unlimited jobs go through the dispatcher's one compiled claim, whose SQL leaves out
every paused or limited queue and kind by itself. Limited ones are claimed here, one
*group* at a time: a limited kind in the unlimited queues, a limited queue's unlimited
kinds, and each limited kind in each limited queue. A group's claim is a short
transaction of its own, sent in one round trip (psycopg's pipeline); the claim sets
``synchronous_commit`` off for it (see ``sqla_jobs.sql.lease.claim``, as the
dispatcher's claims):

1. ``pg_advisory_xact_lock`` on each of the group's scopes (sorted keys: no deadlock);
2. ``sqla_jobs.sql.control.capacity``, a statement of its own so that its snapshot
   is taken after the lock was granted: jobs running on other workers, starts in the
   rate window, and the limits as they are now;
3. the claim, whose LIMIT is ``sqla_jobs.sql.control.room`` (the limit minus the
   jobs running elsewhere minus this worker's own, from its ledger, as parameters),
   naming the locked scopes so the claim's SQL lets them through; then commit.

A group with a rate limit records its starts (``jobs_rate_starts``) in the claim's
transaction, so its claim is sent once steps 1-2 are back (two round trips).
Other workers claiming the same scope wait at step 1 and see this claim at step 2.

A group of one limited scope (concurrency only) may claim beyond its limit while other
workers leave it room (a *reserve*, sized to about ``RESERVE_AHEAD_SECONDS``
of its jobs) and start them through the worker's *gate*, as its own jobs end: see
"reserves" below for why the limit still holds.

Each group's claim starts each priority's walk of ``jobs_claim_idx`` at the group's own
floors, with a full claim from the start when one is due, as the dispatcher's claims do
(``sqla_jobs.worker._floors``: a job ready below a floor waits at most
``FULL_CLAIM_MAX_SECONDS`` for it). A floor only narrows which queued rows the claim
looks at: the room it may take (the limit minus the running rows, under the scopes'
locks) is computed from the same statements as without one, so the limit holds alike.

Which groups exist is read from ``jobs_controls`` at most every
``REFRESH_SECONDS``; a stale view can only delay a claim: the claim's SQL still
refuses a paused or limited scope it does not hold the lock of.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from sqla_jobs import validation
from sqla_jobs.config import WorkerConfig
from sqla_jobs.sql import control, lease
from sqla_jobs.tasks import Registry
from sqla_jobs.worker import _db
from sqla_jobs.worker._floors import Floors
from sqla_jobs.worker._inflight import KIND, QUEUE, SYNC_POOL, Claimed, Inflight

log = logging.getLogger("sqla_jobs.worker")

#: How often a worker re-reads which queues and kinds are limited.
REFRESH_SECONDS = 1.0
#: A limited scope full of other workers' jobs is looked at again this soon (their
#: completions wake no one here).
RECHECK_SECONDS = 0.1
#: A rate-limited start is counted when it is claimed; its handler starts a moment
#: later (the commit, a thread picking the job up: milliseconds, up to 100 ms seen on
#: a loaded 2-core machine). Starts stay counted for a quarter of the window longer,
#: up to this many seconds, so that handler starts whose delays differ by less than
#: that still never put more than the rate into any window. The price: a rate of
#: 10/s runs at 8/s when saturated; 100/min at 99.6/min.
RATE_MARGIN_SECONDS = 0.25
#: Jobs held back by a gate (see _release) start only while the limits their group's
#: last claim read are at most this old; then the next claim reads them again (a pause
#: or a lower limit is obeyed within this time).
RESERVE_SECONDS = 0.25
#: A group holds back about this many seconds of its jobs (at the pace its limit lets
#: this worker run them, from how long they have been taking here), within the pool's
#: prefetch buffer: as the dispatcher's PREFETCH_SECONDS.
RESERVE_AHEAD_SECONDS = 0.05
#: ... or, when longer, this many of its claims' round trips (the time a slot would wait
#: for a claim of the next job: on a loaded machine, tens of milliseconds).
RESERVE_CLAIMS = 2


@dataclass(frozen=True)
class Group:
    """Jobs of ``kinds`` in ``queues`` whose claim holds the locks of ``scopes``."""

    queues: tuple[str, ...]
    kinds: tuple[str, ...]
    scopes: tuple[tuple[str, str], ...]


def declared_rows(registry: Registry) -> list[dict[str, Any]]:
    """The limits the code declares, as rows for ``sqla_jobs.sql.control.declare_limits``."""

    def row(
        scope: str, name: str, limit: int | None, rate: validation.Rate | None
    ) -> dict[str, Any]:
        return {
            "scope": scope,
            "name": name,
            "declared_concurrency": limit,
            "declared_rate_count": None if rate is None else rate.count,
            "declared_rate_seconds": None if rate is None else rate.seconds,
        }

    rows = [row(control.KIND, h.kind, h.limit, h.rate) for h in registry.handlers()]
    rows += [
        row(control.QUEUE, q, limit, rate) for q, (limit, rate) in registry.queue_limits().items()
    ]
    return rows


@dataclass(frozen=True)
class GroupSQL:
    """A group's statements, compiled: its locks (in key order), capacity, claims."""

    locks: tuple[_db.Compiled, ...]
    capacity: _db.Compiled
    claim: _db.Compiled  # of ``limit`` jobs, sized by the caller
    claim_in_room: _db.Compiled  # of the room it computes (control.room)


@dataclass
class Gates:
    """Per limited scope, how many of its jobs this worker may run at once: the limit
    minus the jobs running elsewhere as the worker's latest claim of it (under the
    scope's lock) saw them. One per worker: a queue's jobs may be in both pools."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    gates: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass
class Room:
    """How many jobs a group's claim may take, and what limits it."""

    size: int
    #: Concurrency limits that bind: (scope, name, limit).
    capped: list[tuple[str, str, int]] = field(default_factory=list)
    #: Rate-limited scopes: (scope, name, window seconds).
    rated: list[tuple[str, str, float]] = field(default_factory=list)
    #: Seconds until a rate window frees a start, when a rate binds.
    wait: float | None = None
    #: A scope of the group is paused.
    paused: bool = False


class Limits:
    """Claims of limited groups for the dispatcher; knows which groups there are."""

    def __init__(
        self,
        engine: sa.Engine,
        config: WorkerConfig,
        registry: Registry,
        ledger: Inflight,
        wake_at: Callable[[float], None],
        *,
        give_back: Callable[[list[Claimed]], None] | None = None,
        start: Callable[[Claimed], None] | None = None,
        wake: Callable[[], None] | None = None,
        gates: Gates | None = None,
        kinds: tuple[str, ...] | None = None,
        pool: int = SYNC_POOL,
        slots: int | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.registry = registry
        # One Limits per pool of handler slots (#12): its kinds, its ledger pool, its
        # slots. The groups' locks make the limits hold across pools as across workers.
        self.kinds = tuple(registry.kinds) if kinds is None else kinds
        self.pool = pool
        self.slots = config.concurrency if slots is None else slots
        self.ledger = ledger
        self.wake_at = wake_at
        #: Releases claims no handler started (the completer's release).
        self.give_back = give_back
        #: Hands a held-back job to the pool's handlers (its buffer's put), and wakes
        #: the dispatcher (to claim more): both from the thread whose job ended.
        self.start = start
        self.wake = wake
        # The worker's gates, shared by its pools' Limits; their lock also guards the
        # reserves, which handler threads take from as their jobs end.
        self._shared = gates or Gates()
        self._lock = self._shared.lock
        self._gates = self._shared.gates
        self.groups: list[Group] = []
        self._read_at: float | None = None
        self._declared = False
        self._claims: dict[Group, GroupSQL] = {}
        self._tried_at = 0.0
        self._known: dict[tuple[str, str], int] = {}  # last concurrency limits read
        self._empty: dict[Group, float] = {}  # groups with nothing ready, until then
        self._floors: dict[Group, Floors] = {}  # where each group's claims start
        self._rated: set[Group] = set()  # groups with a rate limit, last we looked
        # Jobs claimed beyond a single-scope group's gate, held back (see _release), and
        # when the group's limits were last read (a reserve is started from only while
        # that view is fresh).
        self._reserves: dict[Group, collections.deque[Claimed]] = {}
        self._read_group_at: dict[Group, float] = {}
        self._ahead = 0  # the pool's prefetch buffer, at the last claim
        # The group of each reserve's scope (a job that ends finds its group by it).
        self._reserve_of: dict[tuple[str, str], Group] = {}
        # How long a gated group's jobs take here, from their hand-off to a handler to
        # the end of their slot (a moving average): what a reserve is sized by. Per
        # group, not counted per second: a limit's jobs shared by several workers end
        # on each at a fraction of their pace, however short they are.
        self._handed: dict[tuple[int, int], float] = {}  # lease -> when handed off
        self._took: dict[Group, float] = {}
        self._claim_seconds = 0.0  # a claim's round trip (a moving average)
        self._unlimited_empty_until = 0.0

    def refresh(self) -> None:
        """Declare the code's limits (once), and re-read the groups if the view is old."""
        now = time.monotonic()
        if self._read_at is not None and now - self._read_at < REFRESH_SECONDS:
            return
        with self.engine.begin() as conn:
            if not self._declared:
                conn.execute(control.declare_limits(declared_rows(self.registry)))
            rows = conn.execute(control.controls()).all()
        self._declared = True
        self._read_at = now
        self._known = {(r.scope, r.name): r.concurrency for r in rows if r.concurrency is not None}
        queues = self.config.served_queues
        limited_kinds = {
            r.name for r in rows if r.scope == control.KIND and _limits(r) and r.name in self.kinds
        }
        limited_queues = {
            r.name for r in rows if r.scope == control.QUEUE and _limits(r) and r.name in queues
        }
        open_queues = tuple(q for q in queues if q not in limited_queues)
        open_kinds = tuple(k for k in self.kinds if k not in limited_kinds)
        groups = [
            Group(open_queues, (k,), ((control.KIND, k),))
            for k in sorted(limited_kinds)
            if open_queues
        ]
        groups += [
            Group((q,), open_kinds, ((control.QUEUE, q),))
            for q in sorted(limited_queues)
            if open_kinds
        ]
        groups += [
            Group((q,), (k,), ((control.KIND, k), (control.QUEUE, q)))
            for k in sorted(limited_kinds)
            for q in sorted(limited_queues)
        ]
        self.groups = groups

    def due(self) -> bool:
        """Whether the limited groups should be tried before the unlimited claim.

        After the unlimited claim they are tried whenever it leaves room; before it,
        every ``RECHECK_SECONDS``, so a backlog of unlimited jobs that keeps every
        slot busy neither starves limited kinds nor pays their locks on every batch.
        """
        return bool(self.groups) and time.monotonic() - self._tried_at >= RECHECK_SECONDS

    def claim(
        self, free: int, run: Callable[..., list[Claimed]], *, ahead: int = 0
    ) -> list[Claimed]:
        """Claim up to ``free`` jobs from the limited groups; ``run`` executes a claim.

        ``ahead``: the jobs the pool may hold beyond its handler slots (its prefetch
        buffer's size, from its handlers' pace), which bounds the reserves.
        Claimed jobs are added to the ledger (each group's, after its commit)."""
        self._tried_at = time.monotonic()
        self._ahead = ahead
        for group in [g for g in self._reserves if g not in self.groups]:
            self._give_back(group)  # its limits changed: claim its jobs afresh
        claimed: list[Claimed] = []
        for group in self.groups:
            if len(claimed) >= free:
                break
            claimed += self._claim_group(group, free - len(claimed), run)
        return claimed

    def look_at_reserves(self, run: Callable[..., list[Claimed]]) -> list[Claimed]:
        """With no room in the pool for a claim: read the limits again (a claim of
        nothing) for each reserve whose view of them is old, or that other workers'
        jobs kept below the limit; return the held-back jobs that may start now.

        A reserve is jobs in the pool's buffer: when the pool's pace slows, its buffer
        shrinks below them, the dispatcher stops claiming, and a stale reserve would
        never be looked at again (nor started, nor given back) without this.
        """
        started: list[Claimed] = []
        for group in self.groups:
            with self._lock:
                held = bool(self._reserves.get(group))
            if held and (not self._fresh(group) or self._sharing(group)):
                started += self._claim_again(group, 0, run, [])
        return started

    def poke(self) -> None:
        """New jobs may be ready (a notification, the rescuer, a retry's timer): look at
        every group, and the unlimited kinds, again."""
        self._empty.clear()
        self._unlimited_empty_until = 0.0

    def unlimited_drained(self) -> None:
        """The unlimited claim came back short: nothing more of them is ready."""
        if self.groups:
            self._unlimited_empty_until = time.monotonic() + self.config.poll_interval

    def skip_unlimited(self) -> bool:
        """Whether to skip the unlimited claim this round.

        While only limited kinds have work, the dispatcher wakes every time one of them
        frees a slot; the unlimited claim found nothing last time and nothing has been
        enqueued since (a notification or a retry coming due would have poked), so its
        three round trips would be wasted. The poll interval still bounds the skip.
        """
        return time.monotonic() < self._unlimited_empty_until

    def take_reserves(self) -> list[Claimed]:
        """Every job held back by a gate (for release when the worker stops)."""
        with self._lock:
            held = [job for reserve in self._reserves.values() for job in reserve]
            self._reserves.clear()
            self._reserve_of.clear()
        return held

    def _claim_group(
        self, group: Group, free: int, run: Callable[..., list[Claimed]]
    ) -> list[Claimed]:
        started: list[Claimed] = []
        with self._lock:
            reserve = len(self._reserves.get(group, ()))
            if reserve and self._fresh(group):
                started = self._release(group)
                reserve -= len(started)
        if reserve:
            if not self._fresh(group):
                # Read the limits again (a claim, of nothing if there is no room) before
                # starting any of them: a pause or a lower limit may have come since.
                return self._claim_again(group, free, run, [])
            if self._sharing(group):
                # Other workers ran some of the limit at the last look: their jobs end
                # and, while this reserve is held, are not claimed again. Look again to
                # take up the room they leave (the claim sets the gate anew).
                return self._claim_again(group, free - len(started), run, started)
            if started or reserve >= self._gate(group):
                # Enough held back: they start as running ones end (job_ended). Running
                # low: claim more on the next round, once these are with the handlers.
                self._watch_reserve(group)
                if reserve < self._gate(group) and self.wake is not None:
                    self.wake()
                return started
            free -= len(started)
        elif self._own_jobs_fill(group):
            return started  # the ledger wakes us when one of them is done
        if self._empty.get(group, 0.0) > time.monotonic():
            return started  # nothing was ready: until a notification or the poll interval
        return self._claim_again(group, free, run, started)

    def _claim_again(
        self, group: Group, free: int, run: Callable[..., list[Claimed]], started: list[Claimed]
    ) -> list[Claimed]:
        # This worker's own jobs of the group's scopes, read once: the room the claim
        # computes and the room computed here must agree.
        mine = {scope: self.ledger.holding(scope, name) for scope, name in group.scopes}
        floors = self._floors.setdefault(group, Floors())
        if group not in self._rated:
            since = time.monotonic()  # the claims' leases run from here at the latest
            full = floors.full_due(since)
            rows, room, found = self._claim_in_one_trip(
                group, free, mine, None if full else floors.values()
            )
            trip = time.monotonic() - since
            self._claim_seconds = 0.8 * self._claim_seconds + 0.2 * trip
            if found or not _rates(rows):
                self._walked(floors, full, since, room, found)
                return started + self._claimed(group, rows, room, found, since)
            # A rate was set since we last looked (the claim took nothing): claim again
            # the way that records starts.
            self._rated.add(group)
        since = time.monotonic()
        full = floors.full_due(since)
        rows, room, found = self._claim_counting_starts(
            group, free, mine, run, None if full else floors.values()
        )
        if not _rates(rows):
            self._rated.discard(group)
        self._walked(floors, full, since, room, found)
        return started + self._claimed(group, rows, room, found, since)

    def _walked(
        self, floors: Floors, full: bool, since: float, room: Room, found: list[Claimed]
    ) -> None:
        """After a group's claim: its floors, and its next full claim (see _floors)."""
        when = floors.claimed(
            found, room=room.size, full=full, started=since, ended=time.monotonic()
        )
        if when is not None:
            # Short: a job may be ready below a floor, and the group now rests
            # (_claimed) until a wake-up: this one pokes it.
            self.wake_at(when)

    def _claim_in_one_trip(
        self, group: Group, free: int, mine: dict[str, int], floors: list[Any] | None
    ) -> tuple[list[Any], Room, list[Claimed]]:
        """Locks, capacity, the claim (of the room it computes itself) and the commit,
        pipelined: one round trip. Claims nothing of a rate-limited scope."""
        sql = self._compiled(group)
        reserve = self._reserve_size(group)
        params = {
            **sql.claim_in_room[1],
            "limit": free,
            "mine_kind": mine.get(control.KIND, 0),
            "mine_queue": mine.get(control.QUEUE, 0),
            "reserve": reserve,
            "floors": floors,
        }
        with self.engine.begin() as conn:
            rows, found, after = _db.pipelined(
                conn,
                sql.locks,
                (sql.capacity, (sql.claim_in_room[0], params), sql.capacity),
                commit=True,
                prepare=self.config.prepared_statements,
                json_loads=_db.load_payload,
            )
        room = self._room(rows, free, mine, reserve, gates=after)
        return rows, room, [Claimed(*r) for r in found]

    def _claim_counting_starts(
        self,
        group: Group,
        free: int,
        mine: dict[str, int],
        run: Callable[..., list[Claimed]],
        floors: list[Any] | None,
    ) -> tuple[list[Any], Room, list[Claimed]]:
        """Locks and capacity (one round trip), then the claim of the room left and, for
        each rate-limited scope, one row of starts (another)."""
        sql = self._compiled(group)
        prepare = self.config.prepared_statements
        with self.engine.begin() as conn:
            (rows,) = _db.pipelined(
                conn,
                sql.locks,
                (sql.capacity,),
                commit=False,
                prepare=prepare,
            )
            room = self._room(rows, free, mine)
            # Without starts to record, the claim and the commit go in one round trip.
            claim = (sql.claim[0], {**sql.claim[1], "floors": floors})
            found = run(conn, claim, room.size, commit=not room.rated) if room.size > 0 else []
            if found:
                for scope, name, window in room.rated:
                    conn.execute(control.record_starts(scope=scope, name=name, count=len(found)))
                    conn.execute(
                        control.forget_starts(
                            scope=scope, name=name, older_than=window * 1.25 + RATE_MARGIN_SECONDS
                        )
                    )
        return rows, room, found

    def _room(
        self,
        rows: list[Any],
        free: int,
        mine: dict[str, int],
        reserve: int = 0,
        gates: list[Any] | None = None,
    ) -> Room:
        """The room ``sqla_jobs.sql.control.capacity``'s rows leave for a claim (as
        ``sqla_jobs.sql.control.room`` computes it); the scopes' gates."""
        room = Room(free)
        for r in rows:
            if r.paused:
                room.size = 0
                room.paused = True
            if r.concurrency is not None:
                self._known[(r.scope, r.name)] = r.concurrency
                left = r.concurrency - r.running - mine.get(r.scope, 0)
                if r.running < r.concurrency:
                    left += reserve
                if left <= room.size:
                    room.size = left
                    room.capped.append((r.scope, r.name, r.concurrency))
            if r.rate_count is not None:
                room.rated.append((r.scope, r.name, float(r.rate_seconds)))
                # Only as many as free handlers: a buffered job would start late.
                room.size = min(room.size, self.slots - self.ledger.taken(self.pool))
                left = r.rate_count - int(r.started)
                if left <= room.size:
                    room.size = left
                    # The window frees a start when its oldest one leaves it.
                    due = max(0.001, float(r.next_start_in or 0.0))
                    room.wait = due if room.wait is None else min(room.wait, due)
        with self._lock:  # before the claimed jobs are held: they start by it
            for r in rows if gates is None else gates:
                if r.concurrency is not None:
                    self._gates[(r.scope, r.name)] = r.concurrency - r.running
        return room

    def _claimed(
        self, group: Group, rows: list[Any], room: Room, found: list[Claimed], since: float
    ) -> list[Claimed]:
        """Hold the claimed jobs (after the commit: a claim that failed holds nothing);
        arrange the next look at the group. Returns the jobs to start now."""
        self.ledger.add(found, self.pool, since)
        self._read_group_at[group] = time.monotonic()
        if room.size > 0 and len(found) < room.size:
            # Nothing more of the group is ready: skip its locks and round trips until
            # a notification wakes the worker (poke) or the poll interval passes.
            self._empty[group] = time.monotonic() + self.config.poll_interval
        gated = self._gated(group)
        if room.paused or not gated:
            self._give_back(group)  # if it holds any: claimed again when they may run
        started, held = found, 0
        if gated and (found or self._reserves.get(group)):
            # Through the reserve: start what the gate lets through, hold the rest.
            with self._lock:
                reserve = self._reserves.setdefault(group, collections.deque())
                self._reserve_of[group.scopes[0]] = group
                reserve.extend(found)
                started = self._release(group)
                held = len(reserve)
        wait = room.wait
        if held:
            self._watch_reserve(group)
        elif room.capped and len(found) >= room.size:
            # The limit binds (not the supply of ready jobs). This worker's own jobs of
            # the scope wake it when one is done.
            # Other workers' finishing jobs wake no one here: look again soon.
            for scope, name, limit in room.capped:
                mine = self.ledger.holding(scope, name)
                if mine:
                    self.ledger.wake_after(scope, name, mine - _refill_at(limit))
            wait = RECHECK_SECONDS if wait is None else min(wait, RECHECK_SECONDS)
        if wait is not None:
            self.wake_at(time.monotonic() + wait)
        return started

    # --- reserves: claimed beyond the limit, started as this worker's own jobs end -----
    #
    # A no-op job limited to 16 ends long before the next claim's round trip returns:
    # claiming only the room left, the handlers waited for the claims (0.13x the
    # unlimited drain). A group of one limited scope (concurrency only), on a worker
    # whose pool could run the whole limit, claims beyond it while other workers leave
    # it room under the limit: what its limit's worth of slots finish within
    # RESERVE_AHEAD_SECONDS (or RESERVE_CLAIMS of its claims' round trips, when longer)
    # at the time the group's jobs have been taking here (none before that is known,
    # none beyond the pool's prefetch buffer), and holds them back. Each job of the
    # scope that ends starts the next one, on its own thread (job_ended), so the claims
    # overlap the handlers. A reserve is started from
    # only while its group's last claim is at most RESERVE_SECONDS old, so a pause or a
    # lower limit applies within that; the claim after a pause gives the reserve back.
    #
    # Why at most N jobs of the scope run fleet-wide. Each worker starts a job of the
    # scope only while its running ones stay within its gate: the limit minus the rows
    # of other workers that its latest claim of the scope saw, under the lock (new
    # claims are held only after their gate is set). A worker's running jobs are among
    # its running rows, and its rows grow only by its own claims. Take, at any moment,
    # the worker whose latest claim is the latest of all: every other worker's rows
    # have only shrunk since that claim saw them, so its gate plus their rows (bounding
    # what they run) is at most N. Held-back jobs are rows too: other workers find no
    # room while one holds a reserve, and claim again once its rows leave them room.
    # The gate is read by a capacity statement after the claim's own (same transaction,
    # under the lock: other rows have only shrunk since the claim's snapshot), so a job
    # the claim took because it saw another worker's job end may start at once. While
    # other workers run part of the limit (the gate below it), their rows shrink as
    # their jobs end and are not claimed again past this reserve: each job that ends
    # here looks again (a claim, of nothing if there is no room) to take up that room.

    def job_ended(self, job: Claimed, pool: int) -> None:
        """A job's handler slot freed up (the ledger's ``on_end``, on that job's thread):
        start a held-back job of its scope in its place, if the gate lets it."""
        handed = self._handed.pop(job.lease, None)
        if pool != self.pool or not self._reserve_of:
            return
        group = self._reserve_of.get((KIND, job.kind)) or self._reserve_of.get((QUEUE, job.queue))
        if group is None:
            return
        started: list[Claimed] = []
        with self._lock:
            if handed is not None:
                took = time.monotonic() - handed
                average = self._took.get(group)
                self._took[group] = took if average is None else 0.5 * average + 0.5 * took
            reserve = self._reserves.get(group)
            if not reserve:
                return
            fresh = self._fresh(group)
            if fresh:
                started = self._release(group)
            # Claim more (or read the limits again) while these run.
            # And while other workers' jobs keep the gate below the limit: they are not
            # claimed again while this reserve is held, so the next look finds the room
            # they leave.
            wake = not fresh or len(reserve) < self._gate(group) or self._sharing(group)
            wake = wake and self._empty.get(group, 0.0) <= time.monotonic()
        if self.start is not None:
            for held in started:
                self.start(held)
        if wake and self.wake is not None:
            self.wake()

    def _gated(self, group: Group) -> bool:
        """Whether the group's claims go through a reserve (single scope, concurrency
        only, a limit this worker could run whole: else it leaves room to others)."""
        if len(group.scopes) != 1 or group in self._rated or self.start is None:
            return False
        limit = self._known.get(group.scopes[0])
        return limit is not None and limit <= self.slots and group.scopes[0] in self._gates

    def _reserve_size(self, group: Group) -> int:
        """How many a claim of ``group`` may take beyond its limit (0: none)."""
        took = self._took.get(group)
        if took is None or not self._gated(group):
            return 0  # not before its jobs' pace is known
        # The limit's worth of jobs run at once, each taking ``took``: the jobs that end
        # here within RESERVE_AHEAD_SECONDS. Within the pool's prefetch buffer, so
        # held-back jobs never take the handler slots of other kinds (none for jobs slow
        # enough to need no buffer at all).
        pace = self._known.get(group.scopes[0], 0) / max(took, 1e-6)
        ahead = max(RESERVE_AHEAD_SECONDS, RESERVE_CLAIMS * self._claim_seconds)
        return min(self._ahead, int(pace * ahead))

    def _gate(self, group: Group) -> int:
        return self._gates.get(group.scopes[0], 0)

    def _sharing(self, group: Group) -> bool:
        """Whether other workers ran some of the limit at the group's last look."""
        return self._gate(group) < self._known.get(group.scopes[0], 0)

    def _fresh(self, group: Group) -> bool:
        return time.monotonic() - self._read_group_at.get(group, 0.0) <= RESERVE_SECONDS

    def _release(self, group: Group) -> list[Claimed]:
        """Take from the group's reserve the jobs its gate lets start now (under the lock)."""
        reserve = self._reserves[group]
        scope, name = group.scopes[0]
        # Held back and running jobs alike are in the ledger (held back jobs of a queue
        # in the other pool's reserve count as running here: fewer start, never more).
        # Read without the ledger's lock (once per job): the claims in the reserve were
        # added to the ledger before the reserve (a stale count can only be higher).
        running = self.ledger.holding_unlocked(scope, name) - len(reserve)
        count = min(len(reserve), self._gate(group) - running)
        started = [reserve.popleft() for _ in range(max(0, count))]
        now = time.monotonic()
        for job in started:
            self._handed[job.lease] = now
        return started

    def _watch_reserve(self, group: Group) -> None:
        """Held-back jobs start as this worker's running ones end (job_ended); with none
        running, look again when the reserve's view of the limits gets old."""
        scope, name = group.scopes[0]
        with self._lock:
            running = self.ledger.holding(scope, name) - len(self._reserves.get(group, ()))
        if running <= 0:
            self.wake_at(time.monotonic() + RESERVE_SECONDS)

    def _give_back(self, group: Group) -> None:
        with self._lock:
            held = list(self._reserves.pop(group, ()))
            if self._reserve_of.get(group.scopes[0]) == group:
                del self._reserve_of[group.scopes[0]]
        if held and self.give_back is not None:
            self.give_back(held)  # outside the lock: the ledger calls job_ended
            self._empty.pop(group, None)  # they are ready again

    def _own_jobs_fill(self, group: Group) -> bool:
        """Whether this worker alone holds a whole limit of the group (no room, no trip)."""
        extra = self._reserve_size(group)
        for scope, name in group.scopes:
            limit = self._known.get((scope, name))
            if limit is None:
                continue
            mine = self.ledger.holding(scope, name)
            if mine > _refill_at(limit) + extra:
                self.ledger.wake_after(scope, name, 1 if extra else mine - _refill_at(limit))
                return True
        return False

    def _compiled(self, group: Group) -> GroupSQL:
        # Built and compiled once per group: building the statements on every claim
        # cost more Python time than running them.
        compiled = self._claims.get(group)
        if compiled is None:

            def claim(room: sa.ColumnElement[Any] | None = None) -> sa.Select[Any]:
                return lease.claim(
                    worker=self.config.worker_id,
                    lock_seconds=self.config.lock_seconds,
                    queues=group.queues,
                    kinds=group.kinds,
                    limit=1,
                    locked_queues=[n for s, n in group.scopes if s == control.QUEUE],
                    locked_kinds=[n for s, n in group.scopes if s == control.KIND],
                    room=room,
                    max_attempts=self.registry.max_attempts_by_kind(),
                )

            room = control.room(worker=self.config.worker_id, scopes=group.scopes)
            capacity = control.capacity(
                worker=self.config.worker_id, scopes=group.scopes, margin=RATE_MARGIN_SECONDS
            )
            keys = sorted(control.lock_key(s, n) for s, n in group.scopes)  # no deadlock
            compiled = self._claims[group] = GroupSQL(
                locks=tuple(
                    _db.compile_statement(self.engine, control.lock_scope(k)) for k in keys
                ),
                capacity=_db.compile_statement(self.engine, capacity),
                claim=_db.compile_statement(self.engine, claim()),
                claim_in_room=_db.compile_statement(self.engine, claim(room)),
            )
        return compiled


def _refill_at(limit: int) -> int:
    """Claim a limited scope again once this worker holds no more than this many of it.

    At once, on the first free slot: a limited claim costs a few round trips, and the
    slots that free while it runs are claimed by the next one. (Waiting for a batch to
    free up left handlers idle: a 2 ms job limited to 16 drained at a third the rate.)
    """
    return limit - 1


def _rates(rows: list[Any]) -> bool:
    """Whether a scope in ``sqla_jobs.sql.control.capacity``'s rows has a rate limit."""
    return any(r.rate_count is not None for r in rows)


def _limits(row: Any) -> bool:
    return bool(row.concurrency is not None or row.rate_count is not None)
