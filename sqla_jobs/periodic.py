"""Periodic jobs: schedules that enqueue exactly one job per tick across a fleet.

Declare a schedule next to its handler::

    @registry.periodic("0 2 * * *", timezone="Europe/Berlin", payload={"report": "daily"})
    @registry.handler("nightly_report")
    def nightly_report(session, payload, job):
        ...  # job.scheduled_for: the tick this run serves

or several schedules of one kind with ``registry.schedule(name, cron, handler, ...)``.
A schedule is a 5-field cron expression (or an alias such as ``@hourly``) evaluated in
a ``zoneinfo`` time zone, or a plain interval (``every=timedelta(seconds=30)``, ticks
counted from the Unix epoch, so ``every=timedelta(hours=1)`` ticks on the hour, UTC).

**Once per tick, without a leader.** Every worker of the app evaluates every schedule
([``enqueue_due``][sqla_jobs.periodic.enqueue_due], run by each worker's ``PeriodicEnqueuer``
service). Each schedule has a row in ``jobs_periodic`` holding the last tick enqueued. A worker
locks the row (``FOR UPDATE SKIP LOCKED``: the row another worker holds is being handled), reads the
database's ``now()``, inserts one job per due tick with the idempotency key
``periodic:<name>:<tick in UTC>`` (``INSERT ... ON CONFLICT DO NOTHING``) and moves
``last_tick`` forward, all in one short transaction. The row makes a tick run once even
after its job was archived and its key freed; the key makes it run once even if the row
were reset. Which ticks are due is decided by the database's clock only: a worker whose
own clock is wrong enqueues nothing early and skips nothing (the worker's clock only
measures how long to sleep until the next tick, as a duration).

**Missed ticks.** A tick is *late* while it is at most ``grace`` old (default one
minute) when a worker enqueues it, and *missed* beyond that (no worker ran). Late ticks
are always enqueued, each once. When some due tick was missed, the schedule's
``missed`` policy decides what happens to the due ticks:

* ``"latest"`` (default): only the most recent due tick is enqueued;
* ``"skip"``: only the ticks still within ``grace`` (if any); the missed ones are dropped;
* ``"all"``: every due tick at most ``catch_up`` old (a ``timedelta``), or the newest
  ``catch_up`` ticks (an ``int``); ``catch_up`` is required, so an outage never
  floods the queue unbounded.

Either way ``last_tick`` moves to the most recent due tick: a dropped tick is never
reconsidered.

**Daylight saving time** (cron schedules in a zone that has it; cronsim's rules, the
same as Debian's cron): a schedule at a fixed local time (a number in both the minute
and the hour fields, e.g. ``30 2 * * *``) whose time falls in the hour skipped by the
spring-forward transition runs once, at the first instant after the gap (03:00 in
Europe/Berlin); when the fall-back transition repeats an hour, it runs once, at the
first occurrence (02:30 summer time). Schedules with ``*`` in the minute or hour field
(``*/15 * * * *``, ``0 * * * *``) follow elapsed time: none of their ticks falls in a
skipped hour, and both occurrences of a repeated hour get their ticks (they are
different instants). Ticks are keyed by their instant in UTC, so the two 02:30s of a
fall-back night are two ticks, never one key. Hence ``*/15 2 * * *`` (a ``*`` minute in
a skipped hour) has no tick on the spring-forward night and 8 on the fall-back night;
``0,15,30,45 2 * * *`` is fixed-time (once at 03:00; once in the repeated hour).

Each tick's job carries its tick in the payload (``"scheduled_for"``, ISO 8601 in the
schedule's time zone) and a handler reads it as ``job.scheduled_for``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from sqla_jobs import producer, validation
from sqla_jobs.exceptions import InvalidJobError, RegistryError
from sqla_jobs.sql import periodic as sql

if TYPE_CHECKING:
    from sqla_jobs.tasks import Handler, Registry

log = logging.getLogger("sqla_jobs.periodic")

UTC = timezone.utc
#: The payload key that carries a tick's scheduled time.
SCHEDULED_FOR = "scheduled_for"
#: Missed-tick policies; ``"latest"`` is the default.
MISSED_POLICIES = ("skip", "latest", "all")
Missed = Literal["skip", "latest", "all"]
#: How late a tick may be enqueued and still count as on time. Defaults to one minute.
DEFAULT_GRACE = timedelta(minutes=1)
#: The shortest interval ``every=`` accepts.
MIN_EVERY = timedelta(seconds=1)
#: Longest a schedule name may be (its ticks' keys must fit the 255-character key).
MAX_NAME_LENGTH = 160
#: The enqueue loop looks at the schedules at least this often, even with no tick due
#: sooner: a row another worker held, or a clock the database moved, is seen again soon.
MAX_SLEEP = 60.0
#: Slept past the computed tick, so the database's clock has reached it on waking.
WAKE_MARGIN = 0.005

#: What each cron field allows, appended to cronsim's one-word complaints ("Bad hour").
_FIELD_RANGES = {
    "Bad minute": " (0-59)",
    "Bad hour": " (0-23)",
    "Bad day-of-month": " (1-31, and a day its months have: '0 0 30 2 *' never fires)",
    "Bad month": " (1-12 or jan-dec)",
    "Bad day-of-week": " (0-7 or sun-sat; 0 and 7 are Sunday)",
}
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TINY = timedelta(microseconds=1)


def _cronsim() -> Any:
    # A core dependency; imported here so importing sqla_jobs for enqueue stays light.
    import cronsim

    return cronsim


@dataclass(frozen=True)
class Schedule:
    """One periodic schedule: which kind to enqueue, when, with what payload.

    Built by ``Registry.periodic`` / ``Registry.schedule``, validated when built (bad
    values raise [``RegistryError``][sqla_jobs.exceptions.RegistryError] naming the schedule).
    ``cron`` holds the expression as given (an alias stays an alias); ``every`` the
    interval. ``expression`` describes either, as ``sqla-jobs periodic`` shows it.
    """

    name: str
    kind: str
    cron: str | None = None
    every: timedelta | None = None
    timezone: str = "UTC"
    payload: Mapping[str, Any] = field(default_factory=dict)
    missed: Missed = "latest"
    catch_up: timedelta | int | None = None
    grace: timedelta = DEFAULT_GRACE
    #: The metadata of every tick's job (``enqueue(..., meta=..., tags=...)``).
    meta: Mapping[str, Any] | None = None
    tags: Sequence[str] | None = None
    zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _fields: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH or "\x00" in name:
            raise RegistryError(
                f"schedule name must be a non-empty string of at most {MAX_NAME_LENGTH} "
                f"characters, got {name!r}"
            )

        def fail(message: str) -> RegistryError:
            return RegistryError(f"schedule {name!r}: {message}")

        try:
            validation.check_kind(self.kind)
        except InvalidJobError as exc:
            raise fail(str(exc)) from None
        if (self.cron is None) == (self.every is None):
            raise fail("give a cron expression or every=timedelta(...), exactly one")
        try:
            zone = ZoneInfo(self.timezone) if isinstance(self.timezone, str) else None
        except (ZoneInfoNotFoundError, ValueError):
            zone = None
        if zone is None:
            raise fail(
                f"unknown time zone {self.timezone!r} (use an IANA name, e.g. 'Europe/Berlin')"
            )
        object.__setattr__(self, "zone", zone)
        object.__setattr__(self, "_fields", "")
        if self.every is not None:
            if not isinstance(self.every, timedelta) or self.every < MIN_EVERY:
                raise fail(f"every must be a timedelta of at least 1 second, got {self.every!r}")
            if self.timezone != "UTC":
                raise fail(
                    "timezone applies to cron expressions; an interval counts from the Unix epoch"
                )
        else:
            object.__setattr__(self, "_fields", self._parse_cron(fail))
        if self.missed not in MISSED_POLICIES:
            raise fail(
                f"missed must be one of {', '.join(map(repr, MISSED_POLICIES))}, "
                f"got {self.missed!r}"
            )
        if self.missed == "all":
            if isinstance(self.catch_up, bool) or not isinstance(self.catch_up, (int, timedelta)):
                raise fail(
                    'missed="all" needs a bound: catch_up=timedelta(...) (how far back) or '
                    "an int (how many ticks)"
                )
            if (
                (self.catch_up <= timedelta(0))
                if isinstance(self.catch_up, timedelta)
                else self.catch_up < 1
            ):
                raise fail(f"catch_up must be positive, got {self.catch_up!r}")
        elif self.catch_up is not None:
            raise fail(f'catch_up applies to missed="all" only (missed={self.missed!r})')
        if not isinstance(self.grace, timedelta) or self.grace <= timedelta(0):
            raise fail(f"grace must be a positive timedelta, got {self.grace!r}")
        if not isinstance(self.payload, Mapping):
            raise fail(f"payload must be a JSON object, got {validation.what(self.payload)}")
        object.__setattr__(self, "payload", dict(self.payload))  # later edits change nothing
        if SCHEDULED_FOR in self.payload:
            raise fail(f"payload key {SCHEDULED_FOR!r} is reserved for the tick's time")
        try:
            validation.dump_payload(self.payload)
            object.__setattr__(self, "meta", validation.check_meta(self.meta))
            object.__setattr__(self, "tags", validation.check_tags(self.tags))
        except InvalidJobError as exc:
            raise fail(str(exc)) from None

    def _parse_cron(self, fail: Any) -> str:
        expr = self.cron
        if not isinstance(expr, str) or not expr.strip():
            raise fail(f"cron expression must be a non-empty string, got {expr!r}")
        text = " ".join(expr.split())
        if text.startswith("@"):
            if text.lower() not in ALIASES:
                raise fail(f"unknown cron alias {text!r} (use one of {', '.join(ALIASES)})")
            return ALIASES[text.lower()]
        if len(text.split()) != 5:
            raise fail(
                f"invalid cron expression {expr!r}: a cron expression has 5 fields (minute hour "
                "day-of-month month day-of-week); for seconds use every=timedelta(...)"
            )
        cronsim = _cronsim()
        try:
            next(cronsim.CronSim(text, datetime(2000, 1, 1, tzinfo=UTC)))
        except cronsim.CronSimError as exc:
            hint = _FIELD_RANGES.get(str(exc), "")
            raise fail(f"invalid cron expression {expr!r}: {exc}{hint}") from None
        except StopIteration:
            raise fail(f"cron expression {expr!r} never fires") from None
        return text

    @property
    def expression(self) -> str:
        """The schedule as text: the cron expression as given, or ``every 30s``."""
        if self.cron is not None:
            return " ".join(self.cron.split())
        return f"every {_duration(self.every)}"  # type: ignore[arg-type]

    # --- ticks --------------------------------------------------------------------------

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``, in UTC (as every tick returned here)."""
        moment = moment.astimezone(UTC)
        if self.every is not None:
            steps = (moment - _EPOCH) // self.every + 1
            return _EPOCH + steps * self.every
        return next(self._ascending(moment))

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last tick at or before ``moment``."""
        return next(self._descending(moment))

    def ticks_between(self, after: datetime, upto: datetime) -> Iterator[datetime]:
        """Every tick ``t`` with ``after < t <= upto``, oldest first."""
        upto = upto.astimezone(UTC)
        if self.every is not None:
            tick = self.next_after(after)
            while tick <= upto:
                yield tick
                tick += self.every
            return
        for tick in self._ascending(after):
            if tick > upto:
                return
            yield tick

    def _ascending(self, after: datetime) -> Iterator[datetime]:
        # Ticks are compared in UTC: Python compares two datetimes of one tzinfo by wall
        # time, blind to a repeated hour. cronsim walks local wall time for fixed-time
        # expressions and loses the fold of a repeated hour, so a result can precede
        # the start (from 02:10 CET on a fall-back night: 02:30 CEST); such results are
        # dropped, and every tick yielded is strictly later than the one before.
        last = after.astimezone(UTC)
        dropped = 0
        for found in _cronsim().CronSim(self._fields, last.astimezone(self.zone)):
            tick = found.astimezone(UTC)
            if tick > last:
                last, dropped = tick, 0
                yield tick
            else:
                dropped = _stalled(dropped, self.name)

    def _descending(self, upto: datetime) -> Iterator[datetime]:
        """Ticks at or before ``upto``, newest first, in UTC."""
        upto = upto.astimezone(UTC)
        if self.every is not None:
            tick = _EPOCH + ((upto - _EPOCH) // self.every) * self.every
            while True:
                yield tick
                tick -= self.every
        # cronsim's reverse walk follows local wall time too, and from inside a repeated
        # hour it misses the first occurrence (from 02:10 CET it finds the previous day's
        # 02:30, not 02:30 CEST). So its answer is only a starting point: the ticks from
        # there to ``upto`` are walked forwards, the way ticks_between sees them.
        while True:
            candidate = self._reverse_from(upto)
            yield from reversed([candidate, *self.ticks_between(candidate, upto)])
            upto = candidate - _TINY

    def _reverse_from(self, upto: datetime) -> datetime:
        """Some tick at or before ``upto`` (cronsim's reverse walk; see _descending)."""
        # It starts strictly before a whole second, and at the second itself when given
        # microseconds: one microsecond later covers ``upto`` itself.
        start = upto + _TINY
        dropped = 0
        for found in _cronsim().CronSim(self._fields, start.astimezone(self.zone), reverse=True):
            tick: datetime = found.astimezone(UTC)
            if tick <= upto:
                return tick
            dropped = _stalled(dropped, self.name)
        raise RuntimeError(f"schedule {self.name!r}: no tick before {upto.isoformat()}")

    def plan(self, last_tick: datetime, now: datetime) -> tuple[list[datetime], datetime | None]:
        """``(ticks to enqueue, new last_tick)`` for a schedule last enqueued at ``last_tick``.

        ``new last_tick`` is the most recent due tick (None when nothing is due), also
        when the policy enqueues fewer ticks than were due.
        """
        last_tick, now = last_tick.astimezone(UTC), now.astimezone(UTC)
        first = self.next_after(last_tick)
        if first > now:
            return [], None
        newest = self.latest_at_or_before(now)
        if now - first <= self.grace:  # late at most: every due tick runs
            return list(self.ticks_between(last_tick, now)), newest
        if self.missed == "latest":
            return [newest], newest
        if self.missed == "skip":
            window = now - self.grace - _TINY
            return list(self.ticks_between(max(last_tick, window), now)), newest
        if isinstance(self.catch_up, timedelta):
            window = now - max(self.catch_up, self.grace) - _TINY
            return list(self.ticks_between(max(last_tick, window), now)), newest
        ticks: list[datetime] = []
        for tick in self._descending(now):
            if tick <= last_tick or len(ticks) >= int(self.catch_up or 1):
                break
            ticks.append(tick)
        return ticks[::-1], newest

    def new_job(self, handler: Handler[Any], tick: datetime) -> producer.NewJob:
        """The job of one tick: keyed by schedule and instant, ``scheduled_for`` in the payload."""
        local = tick.astimezone(self.zone)
        return handler.new(
            {**self.payload, SCHEDULED_FOR: local.isoformat()},
            key=tick_key(self.name, tick),
            run_at=tick,
            meta=self.meta,
            tags=self.tags,
        )


def _stalled(dropped: int, name: str) -> int:
    if dropped >= 1000:  # cronsim went round in circles: never loop forever
        raise RuntimeError(f"schedule {name!r}: the cron library returned no later tick")
    return dropped + 1


def tick_key(name: str, tick: datetime) -> str:
    """The idempotency key of one tick: the schedule's name and the tick's instant in UTC."""
    return f"periodic:{name}:{tick.astimezone(UTC).isoformat()}"


def scheduled_for(payload: Mapping[str, Any]) -> datetime | None:
    """The tick a periodic job serves, from its payload; None for any other job."""
    value = payload.get(SCHEDULED_FOR)
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# --- enqueueing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Enqueued:
    """What one [``enqueue_due``][sqla_jobs.periodic.enqueue_due] did: the ticks enqueued per
    schedule; when to call again."""

    ticks: Mapping[str, tuple[datetime, ...]]
    next_in: float


def enqueue_due(engine: sa.Engine, registry: Registry, *, now: datetime | None = None) -> Enqueued:
    """Enqueue the due ticks of ``registry``'s schedules in one short transaction; commits.

    Each tick's job takes its handler's queue, priority and max_attempts. Schedules
    whose row another transaction holds are left to it. Returns what was enqueued and,
    as ``next_in``, the seconds until the next tick of any schedule (at most
    ``MAX_SLEEP``), measured on the database's clock. ``now`` pins the database's
    clock (tests).
    """
    if isinstance(engine, AsyncEngine):
        raise TypeError(
            "periodic.enqueue_due() takes an Engine, got AsyncEngine: with an AsyncEngine "
            "use `await periodic.enqueue_due_async(...)`"
        )
    schedules = registry.schedules
    if not schedules:
        return Enqueued({}, MAX_SLEEP)
    with engine.begin() as conn:
        return _enqueue_due(conn, schedules, registry, now)


async def enqueue_due_async(
    engine: AsyncEngine, registry: Registry, *, now: datetime | None = None
) -> Enqueued:
    """[``enqueue_due``][sqla_jobs.periodic.enqueue_due] for an async app's ``AsyncEngine`` (its
    tests, mostly): the same
    statements in one short transaction, committed."""
    if not isinstance(engine, AsyncEngine):
        raise TypeError(
            f"periodic.enqueue_due_async() takes an AsyncEngine, got {type(engine).__name__}: "
            "with an Engine use periodic.enqueue_due(...)"
        )
    schedules = registry.schedules
    if not schedules:
        return Enqueued({}, MAX_SLEEP)
    async with engine.begin() as conn:
        return await conn.run_sync(_enqueue_due, schedules, registry, now)


def _enqueue_due(
    conn: sa.Connection, schedules: Sequence[Schedule], registry: Registry, now: datetime | None
) -> Enqueued:
    by_name = {s.name: s for s in schedules}
    names = list(by_name)
    conn.execute(
        sql.register(names, [s.kind for s in schedules], [s.expression for s in schedules], now)
    )
    clock: datetime = conn.execute(sql.database_now(now)).scalar_one()
    done: dict[str, tuple[datetime, ...]] = {}
    updates = []
    for row in conn.execute(sql.lock_due(names, now)).all():
        schedule = by_name[row.name]
        ticks, newest = schedule.plan(row.last_tick, row.now)
        if newest is None:
            continue
        handler = registry[schedule.kind]
        jobs = [schedule.new_job(handler, t) for t in ticks]
        job_id = None
        if jobs:
            producer.enqueue_many(conn, jobs[:-1])
            job_id = producer.insert_one(conn, jobs[-1])
        updates.append(
            {
                "b_name": schedule.name,
                "b_last_tick": newest,
                "b_job_id": job_id,
                "b_expression": schedule.expression,
            }
        )
        done[schedule.name] = tuple(ticks)
        skipped = max(0, _count_between(schedule, row.last_tick, newest) - len(ticks))
        if skipped:
            log.info(
                "schedule %s: %d missed tick(s) dropped (missed=%s); enqueued %s",
                schedule.name,
                skipped,
                schedule.missed,
                _describe_ticks(ticks),
                extra={"kind": schedule.kind, "outcome": "missed"},
            )
        elif ticks:
            log.debug(
                "schedule %s: enqueued %s",
                schedule.name,
                _describe_ticks(ticks),
                extra={"kind": schedule.kind, "outcome": "enqueued"},
            )
    if updates:
        conn.execute(sql.advance(now), updates)
    upcoming = min(s.next_after(clock) for s in schedules)
    wait = min(MAX_SLEEP, max(0.0, (upcoming - clock).total_seconds()) + WAKE_MARGIN)
    return Enqueued(done, wait)


def _describe_ticks(ticks: Sequence[datetime]) -> str:
    if len(ticks) <= 3:
        return ", ".join(t.isoformat() for t in ticks) or "none"
    return f"{len(ticks)} ticks, {ticks[0].isoformat()} to {ticks[-1].isoformat()}"


def _count_between(schedule: Schedule, after: datetime, upto: datetime, limit: int = 10_000) -> int:
    """Ticks in ``(after, upto]``, for the log line (cron: counted up to ``limit``)."""
    if schedule.every is not None:
        return (upto - _EPOCH) // schedule.every - (after - _EPOCH) // schedule.every
    count = 0
    for _ in schedule.ticks_between(after, upto):
        count += 1
        if count >= limit:
            break
    return count
