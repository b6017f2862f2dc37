"""The dispatcher's claims of limited queues and kinds (revision 0006).

Unlimited jobs go through the dispatcher's one compiled claim, whose SQL leaves out
every paused or limited queue and kind by itself. Limited ones are claimed here, one
*group* at a time: a limited kind in the unlimited queues, a limited queue's unlimited
kinds, and each limited kind in each limited queue. A group's claim is a short
transaction of its own:

1. ``pg_advisory_xact_lock`` on each of the group's scopes (sorted keys: no deadlock);
2. :func:`sqla_jobs.sql.control.capacity`, a statement of its own so that its snapshot
   is taken after the lock was granted: jobs running on other workers, starts in the
   rate window, and the limits as they are now;
3. the claim, of at most the room left (minus this worker's own jobs of the scope,
   from its ledger), naming the locked scopes so the claim's SQL lets them through;
4. for a rate-limited scope, one row in ``jobs_rate_starts``; then commit.

Other workers claiming the same scope wait at step 1 and see this claim at step 2.

Which groups exist is read from ``jobs_controls`` at most every
:data:`REFRESH_SECONDS`; a stale view can only delay a claim: the claim's SQL still
refuses a paused or limited scope it does not hold the lock of.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from sqla_jobs import validation
from sqla_jobs.config import WorkerConfig
from sqla_jobs.sql import control, lease
from sqla_jobs.tasks import Registry
from sqla_jobs.worker import _db
from sqla_jobs.worker._inflight import SYNC_POOL, Claimed, Inflight

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


@dataclass(frozen=True)
class Group:
    """Jobs of ``kinds`` in ``queues`` whose claim holds the locks of ``scopes``."""

    queues: tuple[str, ...]
    kinds: tuple[str, ...]
    scopes: tuple[tuple[str, str], ...]


def declared_rows(registry: Registry) -> list[dict[str, Any]]:
    """The limits the code declares, as rows for :func:`sqla_jobs.sql.control.declare_limits`."""

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
    """A group's statements, compiled: its locks (in key order), capacity, claim."""

    locks: tuple[_db.Compiled, ...]
    capacity: _db.Compiled
    claim: _db.Compiled


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
        self.groups: list[Group] = []
        self._read_at: float | None = None
        self._declared = False
        self._claims: dict[Group, GroupSQL] = {}
        self._tried_at = 0.0
        self._known: dict[tuple[str, str], int] = {}  # last concurrency limits read
        self._empty: dict[Group, float] = {}  # groups with nothing ready, until then
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
        every :data:`RECHECK_SECONDS`, so a backlog of unlimited jobs that keeps every
        slot busy neither starves limited kinds nor pays their locks on every batch.
        """
        return bool(self.groups) and time.monotonic() - self._tried_at >= RECHECK_SECONDS

    def claim(self, free: int, run: Callable[..., list[Claimed]]) -> list[Claimed]:
        """Claim up to ``free`` jobs from the limited groups; ``run`` executes a claim.

        Claimed jobs are added to the ledger (each group's, after its commit)."""
        self._tried_at = time.monotonic()
        claimed: list[Claimed] = []
        for group in self.groups:
            if len(claimed) >= free:
                break
            claimed += self._claim_group(group, free - len(claimed), run)
        return claimed

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

    def _claim_group(
        self, group: Group, free: int, run: Callable[..., list[Claimed]]
    ) -> list[Claimed]:
        if self._own_jobs_fill(group):
            return []  # the ledger wakes us when one of them is done
        if self._empty.get(group, 0.0) > time.monotonic():
            return []  # nothing was ready: until a notification or the poll interval
        sql = self._compiled(group)
        prepare = self.config.prepared_statements
        since = time.monotonic()
        with self.engine.begin() as conn:
            # The locks, then what is running: one round trip, two statements.
            rows = _db.rows_after(conn, sql.locks, sql.capacity, prepare=prepare)
            room, rated, capped, wait = free, [], [], None
            for r in rows:
                if r.paused:
                    room = 0
                if r.concurrency is not None:
                    self._known[(r.scope, r.name)] = r.concurrency
                    left = r.concurrency - r.running - self.ledger.holding(r.scope, r.name)
                    if left <= room:
                        room = left
                        capped.append((r.scope, r.name, r.concurrency))
                if r.rate_count is not None:
                    rated.append((r.scope, r.name, float(r.rate_seconds)))
                    # Only as many as free handlers: a buffered job would start late.
                    room = min(room, self.slots - self.ledger.taken(self.pool))
                    left = r.rate_count - int(r.started)
                    if left <= room:
                        room = left
                        # The window frees a start when its oldest one leaves it.
                        due = max(0.001, float(r.next_start_in or 0.0))
                        wait = due if wait is None else min(wait, due)
            # Without starts to record, the claim and the commit go in one round trip.
            found = run(conn, sql.claim, room, commit=not rated) if room > 0 else []
            if found:
                for scope, name, window in rated:
                    conn.execute(control.record_starts(scope=scope, name=name, count=len(found)))
                    conn.execute(
                        control.forget_starts(
                            scope=scope, name=name, older_than=window * 1.25 + RATE_MARGIN_SECONDS
                        )
                    )
        self.ledger.add(
            found, self.pool, since
        )  # after the commit: a claim that failed holds nothing
        if room > 0 and len(found) < room:
            # Nothing more of the group is ready: skip its locks and round trips until
            # a notification wakes the worker (poke) or the poll interval passes.
            self._empty[group] = time.monotonic() + self.config.poll_interval
        if capped and len(found) >= room:
            # The limit binds (not the supply of ready jobs). This worker's own jobs of
            # the scope wake it when one is done.
            # Other workers' finishing jobs wake no one here: look again soon.
            for scope, name, limit in capped:
                mine = self.ledger.holding(scope, name)
                if mine:
                    self.ledger.wake_after(scope, name, mine - _refill_at(limit))
            wait = RECHECK_SECONDS if wait is None else min(wait, RECHECK_SECONDS)
        if wait is not None:
            self.wake_at(time.monotonic() + wait)
        return found

    def _own_jobs_fill(self, group: Group) -> bool:
        """Whether this worker alone holds a whole limit of the group (no room, no trip)."""
        for scope, name in group.scopes:
            limit = self._known.get((scope, name))
            if limit is None:
                continue
            mine = self.ledger.holding(scope, name)
            if mine > _refill_at(limit):
                self.ledger.wake_after(scope, name, mine - _refill_at(limit))
                return True
        return False

    def _compiled(self, group: Group) -> GroupSQL:
        # Built and compiled once per group: building the statements on every claim
        # cost more Python time than running them.
        compiled = self._claims.get(group)
        if compiled is None:
            claim = lease.claim(
                worker=self.config.worker_id,
                lock_seconds=self.config.lock_seconds,
                queues=group.queues,
                kinds=group.kinds,
                limit=1,
                locked_queues=[n for s, n in group.scopes if s == control.QUEUE],
                locked_kinds=[n for s, n in group.scopes if s == control.KIND],
            )
            capacity = control.capacity(
                worker=self.config.worker_id, scopes=group.scopes, margin=RATE_MARGIN_SECONDS
            )
            keys = sorted(control.lock_key(s, n) for s, n in group.scopes)  # no deadlock
            compiled = self._claims[group] = GroupSQL(
                locks=tuple(
                    _db.compile_statement(self.engine, control.lock_scope(k)) for k in keys
                ),
                capacity=_db.compile_statement(self.engine, capacity),
                claim=_db.compile_statement(self.engine, claim),
            )
        return compiled


def _refill_at(limit: int) -> int:
    """Claim a limited scope again once this worker holds no more than this many of it.

    At once, on the first free slot: a limited claim costs a few round trips, and the
    slots that free while it runs are claimed by the next one. (Waiting for a batch to
    free up left handlers idle: a 2 ms job limited to 16 drained at a third the rate.)
    """
    return limit - 1


def _limits(row: Any) -> bool:
    return bool(row.concurrency is not None or row.rate_count is not None)
