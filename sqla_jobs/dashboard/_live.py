"""Live updates: a server-sent events stream per open tab, all fed by one shared hub.

Cost first: an open tab must not slow the workers down. So the database is not asked
once per tab but once per *round* of the ``Hub``, shared by every open stream of
the app: one ``ops.stats`` (only while some tab shows the counts) and one
``ops.job_states`` for the union of the jobs the tabs show, at most once a second
(``MIN_INTERVAL``), however many tabs are open. With no tab open the hub stops and
costs nothing; a hidden tab closes its stream (``static/dashboard.js``).

Rounds come every ``refresh`` seconds (polling), and sooner after a notification: the
hub LISTENs on one connection of its own for the channels the queue already notifies
(``jobs``: inserts while a worker waits, queue control changes; ``sqla_jobs_cancel``:
a running job asked to stop). Nothing new is notified for the dashboard: a NOTIFY on
every status change would serialize the workers' commits (see revision 0003). When
LISTEN is impossible (``listen=False``, behind PgBouncer in transaction mode, or the
connection fails or is lost) the hub simply polls, and tries to LISTEN again later.

A stream sends an event only when what its tab shows changed: ``counts`` (the
overview's figures; ``counts_of`` says running from claimed) and ``jobs``
(``{id: {status, attempts, stopping}}``), and a comment now and then so proxies keep
the connection open. The browser's ``EventSource``
reconnects by itself after a lost connection (the ``retry`` field sets its delay).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from sqla_jobs import _tcp, ops
from sqla_jobs import config as config_mod
from sqla_jobs.dashboard import _render
from sqla_jobs.exceptions import ConfigError

log = logging.getLogger("sqla_jobs.dashboard")

#: Least time between two rounds of queries, whatever the notifications.
MIN_INTERVAL = 1.0
#: Default seconds between rounds when nothing is notified (``create_app(refresh=...)``).
DEFAULT_REFRESH = 2.0
#: After a failed or lost LISTEN connection, poll this long before trying again.
RELISTEN_AFTER = 30.0
#: The browser waits this long (ms) before reconnecting a lost stream.
RETRY_MS = 2000
#: A comment is sent after this many quiet seconds, so proxies keep the stream open.
KEEPALIVE = 15.0
#: The LISTEN connection's name in ``pg_stat_activity``.
APPLICATION_NAME = "sqla_jobs dashboard"
#: Most job ids one tab may watch (a page shows 50).
MAX_WATCHED = 100
#: The largest bigint: a larger id would fail the shared round's query for every tab.
MAX_ID = 2**63 - 1
#: The overview counts queued (and dead) jobs exactly up to this many; above it, an
#: exact count per queue and kind would read every such row, and the figures are
#: estimates (``ops.stats(exact_up_to=...)``), marked so on the page.
EXACT_UP_TO = 500


@dataclass(eq=False)
class Watch:
    """What one open tab shows: the counts or not, and which jobs."""

    counts: bool
    ids: frozenset[int]
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Snapshot:
    """One round's answers: the counts (None if no tab wanted them) and the states of the
    jobs ``asked`` about (those found)."""

    counts: dict[str, Any] | None
    jobs: dict[int, dict[str, Any]]
    asked: frozenset[int] = frozenset()


def parse_watch(counts: str | None, ids: str | None) -> Watch:
    """A tab's ``?counts=1&ids=1,2,3``; ConfigError if the ids are not numbers."""
    found: set[int] = set()
    for part in (ids or "").split(","):
        if part.strip():
            if not part.strip().isdigit() or int(part) > MAX_ID:
                raise ConfigError(f"ids must be job ids separated by commas, got {part!r}")
            found.add(int(part))
    if len(found) > MAX_WATCHED:
        raise ConfigError(f"a page watches at most {MAX_WATCHED} jobs, got {len(found)}")
    return Watch(counts=counts == "1", ids=frozenset(found))


def counts_of(stats: ops.Stats) -> dict[str, Any]:
    """The overview's figures, as the page prints them.

    ``running``: handlers at work, as the live workers last reported (their heartbeats);
    ``claimed``: jobs whose status is running, those waiting in a worker's prefetch
    buffer included (per queue, only this one is known: a worker reports one total).
    """
    total = stats.total
    queues: dict[str, dict[str, Any]] = {}
    oldest: dict[str, float] = {}
    for k in stats.by_kind:
        q = queues.setdefault(
            k.queue,
            {"ready": 0, "scheduled": 0, "claimed": 0, "expired": 0, "dead": 0, "done": 0},
        )
        for name in ("ready", "scheduled", "expired", "dead"):
            q[name] += getattr(k, name)
        q["claimed"] += k.running
        q["done"] += k.done_last_hour
        if k.oldest_ready_seconds is not None:
            oldest[k.queue] = max(oldest.get(k.queue, 0.0), k.oldest_ready_seconds)
    # The oldest ready job's age, as the table's cell prints it ("-" for none).
    for name, q in queues.items():
        q["oldest"] = _render.age(oldest.get(name))
    return {
        "taken_at": _render.moment(stats.taken_at),
        "ready": total.ready,
        "scheduled": total.scheduled,
        "waiting": total.waiting,
        "running": running_handlers(stats),
        "workers": len(stats.workers),
        "claimed": total.running,
        "expired": total.expired,
        "dead": total.dead,
        "done": total.done_last_hour,
        "oldest": _render.age(total.oldest_ready_seconds),
        "queues": queues,
        # Which figures are estimates now (the page's ≈ marks follow it) and, as the
        # page's note lists them, in words.
        "estimates": sorted(stats.estimated),
        "estimated": ", ".join(sorted(stats.estimated)),
    }


def running_handlers(stats: ops.Stats) -> int:
    """Jobs the live workers' handlers run, summed from their last heartbeats: a job
    claimed into a buffer has status running but no handler yet, so the table's count
    of running jobs says how many are claimed, not how many run."""
    return sum(w.running for w in stats.workers)


def state_of(state: ops.JobState) -> dict[str, Any]:
    return {
        "status": state.status.value,
        "attempts": state.attempts,
        "stopping": state.cancel_requested,
    }


class Hub:
    """The one loop of queries behind every open stream of a dashboard app."""

    def __init__(self, engine: sa.Engine, *, listen: bool, refresh: float) -> None:
        self.engine = engine
        #: Autocommit, as the pages' reads (Views._session): no BEGIN or ROLLBACK round
        #: trip around the job states of each round.
        self.reads = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.listen = listen
        self.refresh = refresh
        self.conninfo = engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        # A LISTEN socket whose server vanished is noticed by keepalives, not by reads.
        self.keepalives: dict[str, Any] = _tcp.with_keepalives(engine.url, {})
        self.watches: set[Watch] = set()
        self.snapshot = Snapshot(None, {}, frozenset())
        self.rounds = 0
        self.listening = False
        self.closing = False
        self._task: asyncio.Task[None] | None = None
        #: The database connections of the round's read in flight (in a worker thread),
        #: so ``close`` can cancel their queries: the process cannot exit before that
        #: thread returns, and on a loaded database a round takes seconds. Every
        #: connection the hub's own engine opens (``ops.stats`` opens one of its own) is
        #: listed, by an event local to that engine (the pages' reads are not).
        self._reading: list[Any] = []
        sa.event.listen(self.reads, "engine_connect", self._opened)

    # --- streams --------------------------------------------------------------------

    async def stream(self, watch: Watch) -> AsyncIterator[str]:
        """The text of one tab's event stream, until the tab goes away or ``close``."""
        if self.closing:
            return
        self._join(watch)
        sent: dict[str, Any] = {}
        try:
            yield f"retry: {RETRY_MS}\n\n"
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watch.changed.wait(), KEEPALIVE)
                if self.closing:
                    return
                if not watch.changed.is_set():
                    yield ": still here\n\n"
                    continue
                watch.changed.clear()
                for name, data in self._events(watch):
                    if sent.get(name) != data:
                        sent[name] = data
                        yield f"event: {name}\ndata: {json.dumps(data, sort_keys=True)}\n\n"
        finally:
            self._leave(watch)

    def _events(self, watch: Watch) -> Iterable[tuple[str, Any]]:
        snap = self.snapshot
        if watch.counts and snap.counts is not None:
            yield "counts", snap.counts
        if watch.ids and watch.ids <= snap.asked:
            # A tab that joined after this round waits for the next one, which asks about
            # its jobs. A job asked about but absent was deleted or archived since.
            jobs = {str(i): snap.jobs.get(i, {"status": "gone"}) for i in sorted(watch.ids)}
            yield "jobs", jobs

    def close(self) -> None:
        """End every open stream (and refuse new ones): the server is stopping, and an
        open stream would otherwise hold its graceful shutdown until a timeout. Call it
        on the event loop."""
        self.closing = True
        for watch in self.watches:
            watch.changed.set()
        for reading in list(self._reading):
            # psycopg's cancel is safe from another thread; the read then fails and
            # its round ends (not logged: the hub is closing).
            with contextlib.suppress(Exception):
                reading.cancel()

    def _opened(self, conn: sa.Connection) -> None:
        self._reading.append(conn.connection.dbapi_connection)

    def _join(self, watch: Watch) -> None:
        self.watches.add(watch)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif self.rounds:
            watch.changed.set()  # the latest round's answers, at once

    def _leave(self, watch: Watch) -> None:
        self.watches.discard(watch)
        if not self.watches and self._task is not None:
            self._task.cancel()
            self._task = None

    # --- the loop -------------------------------------------------------------------

    async def _run(self) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        loop = asyncio.get_running_loop()
        retry_listen_at = loop.time()
        try:
            while self.watches:
                if conn is None and self.listen and loop.time() >= retry_listen_at:
                    conn = await self._connect()
                    if conn is None:
                        retry_listen_at = loop.time() + RELISTEN_AFTER
                self.listening = conn is not None
                await self._round()
                await asyncio.sleep(MIN_INTERVAL)
                rest = max(0.0, self.refresh - MIN_INTERVAL)
                if conn is None:
                    await asyncio.sleep(rest)
                elif not await self._notified(conn, rest):
                    await _close(conn)
                    conn = None
                    retry_listen_at = loop.time() + RELISTEN_AFTER
        finally:
            self.listening = False
            if conn is not None:
                await _close(conn)

    async def _connect(self) -> psycopg.AsyncConnection[Any] | None:
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.conninfo,
                autocommit=True,
                application_name=APPLICATION_NAME,
                **self.keepalives,
            )
        except psycopg.Error as exc:
            log.warning("dashboard: cannot LISTEN (%s); open pages refresh by polling", exc)
            return None
        try:
            for channel in ops.NOTIFY_CHANNELS:
                name = config_mod.check_channel(channel)
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))
        except psycopg.Error as exc:
            await _close(conn)
            log.warning("dashboard: cannot LISTEN (%s); open pages refresh by polling", exc)
            return None
        except BaseException:
            # Cancelled (the last tab went away) while connecting: close, do not leak it.
            await _close(conn)
            raise
        return conn

    async def _notified(self, conn: psycopg.AsyncConnection[Any], timeout: float) -> bool:
        """Wait up to ``timeout`` for a notification; False when the connection failed."""
        notes = conn.notifies(timeout=timeout, stop_after=1)
        try:
            async with contextlib.aclosing(notes):
                async for _ in notes:
                    pass
        except psycopg.Error as exc:
            log.warning("dashboard: LISTEN connection lost (%s); polling for now", exc)
            return False
        return True

    async def _round(self) -> None:
        counts = any(w.counts for w in self.watches)
        ids = sorted({i for w in self.watches for i in w.ids})
        try:
            self.snapshot = await run_in_threadpool(self._read, counts, ids)
        except (sa.exc.SQLAlchemyError, ConfigError) as exc:
            if not self.closing:  # else: the read close() cancelled
                log.warning("dashboard: live update failed: %s", exc)
            return
        self.rounds += 1
        for watch in self.watches:
            watch.changed.set()

    def _read(self, counts: bool, ids: list[int]) -> Snapshot:
        with Session(self.reads) as session:
            try:
                session.connection()
                # Closed before the connection was listed: close() could not cancel.
                if self.closing:
                    return self.snapshot
                found = counts_of(ops.stats(session, exact_up_to=EXACT_UP_TO)) if counts else None
                states: dict[int, dict[str, Any]] = {}
                for chunk in _chunks(ids, ops.MAX_STATE_IDS):
                    found_states = ops.job_states(session, chunk)
                    states.update({i: state_of(s) for i, s in found_states.items()})
                return Snapshot(found, states, frozenset(ids))
            finally:
                self._reading.clear()


def _chunks(ids: list[int], size: int) -> Iterable[list[int]]:
    return (ids[n : n + size] for n in range(0, len(ids), size))


async def _close(conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(psycopg.Error):
        await conn.close()


def check_refresh(refresh: float) -> float:
    if isinstance(refresh, bool) or not isinstance(refresh, (int, float)):
        raise ConfigError(f"refresh must be a number of seconds, got {refresh!r}")
    if not refresh >= MIN_INTERVAL:
        raise ConfigError(
            f"refresh must be at least {MIN_INTERVAL:g} second (the live view queries at "
            f"most once a second), got {refresh!r}"
        )
    return float(refresh)
