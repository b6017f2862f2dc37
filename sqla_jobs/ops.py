"""Operations: see the queue, act on jobs, keep the table small.

The functions here back the ``sqla-jobs`` commands (``stats``, ``list``, ``show``,
``retry``, ``cancel``, ``delete``, ``archive``, ``prune``; ``pause``, ``resume``,
``limit``, ``limits`` and ``workers`` for queue control, revision 0006) and can be called
from your own code, a shell, or an admin view::

    from sqla_jobs import ops

    with Session(engine) as session:
        s = ops.stats(session, registry)
        if s.total.dead:
            page = ops.list_jobs(session, status="dead", limit=20)
            ops.retry_jobs(session, ids=[job.id for job in page])
            session.commit()

**Stats stay cheap however much history piles up.** Every figure is read through an
index: queued rows (``jobs_claim_idx``), running rows (``jobs_status_id_idx``: the
fleet's concurrency bounds them), and finished rows by status then ``finished_at``
(``jobs_finished_idx``, revision 0002): dead and cancelled counts are a range on
``status``, "done in the last hour" a range on ``(status, finished_at)``. Nothing counts
every done row; the table's total and the split by status are the planner's estimates
(``pg_class.reltuples`` and ``pg_stats``), refreshed by autovacuum/ANALYZE. A test
checks the plans.

**Actions are safe while workers claim.** ``retry_jobs``, ``cancel_jobs`` and
``delete_jobs`` lock their rows with ``FOR UPDATE SKIP LOCKED`` and test the status: a
row a worker is claiming at that instant is skipped, a running job's row is never
changed by retry or delete (``cancel`` only flags it for its worker, revision 0005),
and the returned count is exactly the rows changed. They run in the caller's
transaction and never commit (like ``enqueue``); the command-line tool commits.

**Archiving** moves finished rows from ``jobs`` to ``jobs_archive`` in batches, one
short transaction each (``WITH moved AS (DELETE ... RETURNING *) INSERT ...``), so it
never holds many locks for long nor blocks a claim. ``archive`` and ``prune`` commit
after every batch: call them outside your own unit of work. Workers can archive for you
(``--archive-every``); a PostgreSQL advisory lock (``sql.locks.ARCHIVE_LOCK_KEY``)
makes sure one worker of the fleet does it at a time. ``jobs_archive`` is partitioned
by week of ``archived_at`` (revision 0022): ``archive`` first makes sure this week's
partition exists (``prepare_archive``), ``prune`` first drops whole weeks past its
cutoff, both through ``SECURITY DEFINER`` functions, so the caller's role needs no DDL
right.

**Async apps** call the ``_async`` twin of each function (``await ops.pause_async(session,
"mail")``, ``ops.stats_async``, ...): it runs the function below on the ``AsyncSession``'s
own ``Session``, in its transaction (``sqla_jobs._sessions``). Either form given the
other kind of session raises ``TypeError`` at once, naming the right call.

Times are the database's (the time of the statement that writes or reads them, not of
its transaction's start); durations are ``timedelta``.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from sqla_jobs import _health, _sessions, exceptions, models, validation
from sqla_jobs._health import Finding as Finding
from sqla_jobs._health import Health as Health
from sqla_jobs._health import HealthThresholds as HealthThresholds
from sqla_jobs.exceptions import (
    ConfigError,
    InvalidJobError,
    JobNotDoneError,
    JobNotFoundError,
    SchemaNotReadyError,
)
from sqla_jobs.models import JobStatus
from sqla_jobs.sql import _common, admin, locks, schema
from sqla_jobs.sql import audit as audit_sql
from sqla_jobs.sql import control as control_sql
from sqla_jobs.sql import periodic as periodic_sql
from sqla_jobs.sql import stats as stats_sql
from sqla_jobs.sql import workers as workers_sql
from sqla_jobs.sql import workflows as workflows_sql

if TYPE_CHECKING:  # only annotations: the CLI's stats need none of the handler registry
    from sqla_jobs.tasks import Registry

#: Rows moved (archive) or deleted (prune) per transaction. Defaults to 10,000.
DEFAULT_BATCH = 10_000
#: Default page size of ``list_jobs``, and its largest.
DEFAULT_LIMIT = 50
MAX_LIMIT = 10_000
#: Key of the session-level advisory lock a worker holds while it archives.

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``"30s"``, ``"15m"``, ``"12h"``, ``"7d"`` or ``"2w"`` as a timedelta; ConfigError else."""
    match = _DURATION_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(
            f"invalid duration {text!r}: use a number and a unit s, m, h, d or w "
            "(e.g. 30s, 15m, 12h, 7d)"
        )
    try:
        return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    except OverflowError:
        raise ConfigError(f"invalid duration {text!r}: too long") from None


def _seconds(name: str, value: timedelta | None, *, allow_zero: bool = True) -> float | None:
    return validation.seconds(name, value, numbers=False, allow_zero=allow_zero, error=ConfigError)


def _status(value: JobStatus | str) -> JobStatus:
    try:
        return JobStatus(value)
    except ValueError:
        names = ", ".join(s.value for s in JobStatus)
        raise ConfigError(f"unknown status {value!r}: use one of {names}") from None


def _positive_int(name: str, value: int, maximum: int | None = None) -> int:
    return validation.integer(name, value, minimum=1, maximum=maximum, error=ConfigError)


def _ids(ids: Sequence[int] | None) -> list[int] | None:
    return validation.ids("ids", ids, error=ConfigError)


# --- schema -------------------------------------------------------------------------


@_sessions.sync_form
def check_schema(session: Session) -> None:
    """Raise SchemaNotReadyError unless revision 0002 (cancelled, jobs_archive) and 0022
    (the partitioned jobs_archive and its functions) are applied."""
    schema.check_schema(session.connection(), archive=True)


# --- stats --------------------------------------------------------------------------


@dataclass(frozen=True)
class KindStats:
    """Counts for one (queue, kind). ``oldest_ready_seconds`` is None when nothing is ready."""

    queue: str
    kind: str
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    expired: int = 0
    dead: int = 0
    cancelled: int = 0
    done_last_minute: int = 0
    done_last_hour: int = 0
    oldest_ready_seconds: float | None = None
    #: Workflow steps waiting for their dependencies (revision 0014): neither ready
    #: nor scheduled, no worker claims them until their last dependency ends.
    waiting: int = 0


@dataclass(frozen=True)
class TableStats:
    """Size and bloat of the jobs table, from the planner and the statistics collector.

    ``estimated_rows`` is ``pg_class.reltuples`` (-1 or 0 before the first ANALYZE);
    ``estimated_by_status`` splits it with ``pg_stats``' status frequencies (empty before
    the first ANALYZE). ``dead_tuples`` is ``n_dead_tup``: row versions waiting for vacuum.
    """

    estimated_rows: int
    estimated_by_status: Mapping[str, int]
    live_tuples: int
    dead_tuples: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_autoanalyze: datetime | None

    @property
    def dead_tuple_ratio(self) -> float:
        total = self.live_tuples + self.dead_tuples
        return self.dead_tuples / total if total else 0.0

    @property
    def rows_estimated(self) -> bool:
        """Whether the planner has counted the table yet (an ANALYZE or VACUUM ran):
        before that ``estimated_rows`` reads 0 whatever the table holds."""
        seen = self.last_autoanalyze or self.last_autovacuum or self.last_vacuum
        return bool(self.estimated_rows or self.estimated_by_status or seen)


@dataclass(frozen=True)
class ScheduleStatus:
    """One periodic schedule: what the app declares and where the database says it stands.

    ``last_tick`` is the most recent tick handled (enqueued, or dropped by the ``missed``
    policy); before the first tick, the moment a worker first saw the schedule. The last
    job is the one enqueued for the most recent tick that got a job, live or archived
    (``last_job_status`` None once pruned). ``in_app`` is False for a schedule that
    has a row in ``jobs_periodic`` but is no longer in the app's code: no worker
    enqueues its ticks. ``next_tick`` (by the database's clock) is None for those, and
    ``last_tick`` None for a schedule no worker has seen yet.
    """

    name: str
    kind: str
    expression: str
    timezone: str | None
    missed: str | None
    next_tick: datetime | None
    last_tick: datetime | None
    last_job_id: int | None
    last_job_status: str | None
    in_app: bool


@dataclass(frozen=True)
class UnservedJobs:
    """Ready jobs of ``kind`` waiting in ``queue``, which no live worker running ``kind``
    serves (see ``Stats.unserved_jobs``)."""

    kind: str
    queue: str
    ready: int


@dataclass(frozen=True)
class Stats:
    """A snapshot of the queue, all figures as of ``taken_at`` (the database's clock).

    ``by_kind`` has one entry per (queue, kind) that has anything queued, waiting (a
    workflow step, #26), running, dead, cancelled, or done in the last hour, sorted.
    ``unknown_kinds`` lists the kinds with jobs queued, running or dead that the
    registry given to ``stats`` has no handler for (its workers never claim
    them, and a retry of a dead one would not run; kinds with only done or cancelled jobs are
    history, not listed); ``unserved_queues``, queues holding ready jobs that no handler
    of that registry declares (a worker started without ``--queues`` does not claim from
    them). ``unserved_jobs`` (with or without a registry) lists the ready jobs, per kind
    and queue, of kinds some live worker runs, waiting in a queue none of those workers
    serves: usually jobs a plain ``enqueue`` put in ``default`` while the workers serve
    their handler's queue.
    """

    taken_at: datetime
    by_kind: tuple[KindStats, ...]
    total: KindStats
    table: TableStats
    unknown_kinds: tuple[str, ...] = ()
    unserved_queues: tuple[str, ...] = ()
    periodic: tuple[ScheduleStatus, ...] = ()
    unserved_jobs: tuple[UnservedJobs, ...] = ()
    controls: tuple[ControlState, ...] = ()
    workers: tuple[WorkerInfo, ...] = ()
    #: The figures (``ready``, ``scheduled``, ``oldest_ready``, ``waiting``, ``dead``,
    #: ``cancelled``)
    #: that are estimates, not counts (``stats(exact_up_to=...)``); empty: all exact.
    estimated: frozenset[str] = frozenset()

    @property
    def paused_queues(self) -> tuple[str, ...]:
        """Queues no worker starts jobs from ([``pause``][sqla_jobs.ops.pause])."""
        return tuple(c.name for c in self.controls if c.scope == "queue" and c.paused)

    @property
    def paused_kinds(self) -> tuple[str, ...]:
        """Kinds no worker starts jobs of ([``pause``][sqla_jobs.ops.pause] with ``kind=``)."""
        return tuple(c.name for c in self.controls if c.scope == "kind" and c.paused)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO 8601 text."""
        data = asdict(self)
        data["table"]["dead_tuple_ratio"] = self.table.dead_tuple_ratio
        data["paused_queues"] = list(self.paused_queues)
        data["paused_kinds"] = list(self.paused_kinds)
        data["estimated"] = sorted(self.estimated)
        return _jsonable(data)  # type: ignore[no-any-return]


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


_COUNTS = (
    *("ready", "scheduled", "running", "expired", "dead", "cancelled"),
    *("done_last_minute", "done_last_hour", "waiting"),
)


#: The families of counts ``stats`` can estimate: their statuses, their exact
#: statement (without ``exact_up_to``), the figures they give.
_ESTIMABLE = (
    ((JobStatus.QUEUED,), stats_sql.stats_queued, ("ready", "scheduled", "oldest_ready")),
    ((JobStatus.DEAD, JobStatus.CANCELLED), stats_sql.stats_dead, ("dead", "cancelled")),
    ((JobStatus.WAITING,), stats_sql.stats_waiting, ("waiting",)),
)
_STATUS_OF = {
    "ready": "queued",
    "scheduled": "queued",
    "dead": "dead",
    "cancelled": "cancelled",
    "waiting": "waiting",
}


@_sessions.sync_form
def stats(
    session: Session, registry: Registry | None = None, *, exact_up_to: int | None = None
) -> Stats:
    """Read the queue's state in one read-only snapshot (index-backed queries).

    Reads on a connection of its own from the session's engine, in one REPEATABLE READ
    transaction, every figure as of the same instant (``taken_at``); the session's
    own transaction, if any, is not touched.

    Every count is exact unless ``exact_up_to`` is given (the dashboard's overview):
    then queued, waiting, dead and cancelled jobs are read from the newest ``exact_up_to
    + 1`` of each status. A status with no more than ``exact_up_to`` jobs is counted
    exactly so; above that, counting it per (queue, kind) would read every row, and its
    figures are estimates instead: the shares of each (queue, kind) among those newest
    jobs, scaled to the planner's total for the status (``pg_stats``, as of the last
    ANALYZE, never less than the jobs seen), and for queued jobs the oldest ready among
    them (a lower bound of the age). ``Stats.estimated`` names those figures.
    """
    if exact_up_to is not None:
        exact_up_to = _positive_int("exact_up_to", exact_up_to)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    estimated: set[str] = set()

    def merge(result: Iterable[Any], names: Sequence[str]) -> None:
        for row in result:
            entry = rows.setdefault((row.queue, row.kind), {})
            for name in names:
                entry[name] = getattr(row, name)

    def merge_sample(status: JobStatus, names: Sequence[str], sample: Sequence[Any]) -> None:
        # The newest exact_up_to + 1 rows of one status: all of them (exact) or a sample
        # whose shares are scaled to the planner's total for the status (an estimate).
        counts = [n for n in names if _STATUS_OF.get(n) == status.value]
        seen = sum(getattr(r, n) for r in sample for n in counts)
        scale = 1.0
        if exact_up_to is not None and seen > exact_up_to:
            scale = max(table.estimated_by_status.get(status.value, 0), seen) / seen
            estimated.update(n for n in names if _STATUS_OF.get(n, status.value) == status.value)
        for row in sample:
            entry = rows.setdefault((row.queue, row.kind), {})
            for name in counts:
                entry[name] = entry.get(name, 0) + round(getattr(row, name) * scale)
            if "oldest_ready" in names and row.oldest_ready is not None:
                entry["oldest_ready"] = row.oldest_ready

    bind = session.get_bind()
    engine = bind if isinstance(bind, sa.Engine) else bind.engine
    try:
        # Read only, REPEATABLE READ: set on the driver's connection, so its BEGIN says so
        # (one round trip fewer than a SET TRANSACTION after it).
        options = {"isolation_level": "REPEATABLE READ", "postgresql_readonly": True}
        with engine.connect().execution_options(**options) as conn:
            head = conn.execute(_stats_head()).one()
            taken_at, table = head.taken_at, _table_stats(head)
            # Every figure as of taken_at (each statement's own time would differ), all
            # asked in one statement (the overview's time is mostly round trips).
            names, statement = _stats_statement(exact_up_to)
            found: dict[str, list[Any]] = {name: [] for name in names}
            for row in conn.execute(statement, {"taken_at": taken_at}):
                found[row.part].append(row)
            for statuses, _, names in _ESTIMABLE:
                if exact_up_to is None:
                    merge(found[statuses[0].value], names)
                    continue
                for status in statuses:
                    merge_sample(status, names, found[status.value])
            merge(found["running"], ("running", "expired"))
            merge(found["done"], ("done_last_minute", "done_last_hour"))
            controls_ = tuple(_control(r) for r in conn.execute(_controls()))
            workers_ = tuple(_worker(r) for r in conn.execute(_live_workers()))
            # The schedules in the same snapshot: no second connection and transaction.
            schedules = _schedule_states(conn) if registry and registry.schedules else None
            conn.rollback()
    except sa_exc.ProgrammingError as exc:
        raise SchemaNotReadyError(
            f"cannot read the jobs tables; {schema.UPGRADE}: {exceptions.db_error_text(exc)}"
        ) from None

    by_kind = tuple(
        KindStats(
            queue=queue,
            kind=kind,
            oldest_ready_seconds=_float(values.get("oldest_ready")),
            **{name: int(values.get(name) or 0) for name in _COUNTS},
        )
        for (queue, kind), values in sorted(rows.items())
    )
    ages = [k.oldest_ready_seconds for k in by_kind if k.oldest_ready_seconds is not None]
    total = KindStats(
        queue="*",
        kind="*",
        oldest_ready_seconds=max(ages) if ages else None,
        **{name: sum(getattr(k, name) for k in by_kind) for name in _COUNTS},
    )
    unknown: tuple[str, ...] = ()
    unserved: tuple[str, ...] = ()
    if registry is not None:
        pending = {
            k.kind for k in by_kind if k.ready or k.scheduled or k.waiting or k.running or k.dead
        }
        unknown = tuple(sorted(pending - set(registry.kinds)))
        ready_in = {k.queue for k in by_kind if k.ready}
        unserved = tuple(sorted(ready_in - set(registry.queues())))
    return Stats(
        taken_at=taken_at,
        by_kind=by_kind,
        total=total,
        table=table,
        unknown_kinds=unknown,
        unserved_queues=unserved,
        periodic=(
            _schedule_statuses(registry, taken_at, schedules)
            if registry is not None and schedules is not None
            else ()
        ),
        controls=controls_,
        workers=workers_,
        unserved_jobs=_unserved_jobs(by_kind, workers_),
        estimated=frozenset(estimated),
    )


def _unserved_jobs(
    by_kind: Sequence[KindStats], live: Sequence[WorkerInfo]
) -> tuple[UnservedJobs, ...]:
    """Ready jobs of kinds some live worker runs, in queues none of those workers serves."""
    served: dict[str, set[str]] = {}
    for worker in live:
        for kind in worker.kinds:
            served.setdefault(kind, set()).update(worker.queues)
    return tuple(
        UnservedJobs(k.kind, k.queue, k.ready)
        for k in sorted(by_kind, key=lambda k: (k.kind, k.queue))
        if k.ready and k.kind in served and k.queue not in served[k.kind]
    )


@_sessions.sync_form
def periodic_statuses(session: Session, registry: Registry) -> tuple[ScheduleStatus, ...]:
    """Every schedule of ``registry`` and every one the database knows, sorted by name.

    Reads ``jobs_periodic`` (revision 0004) and the status of each schedule's last job
    on a connection of its own, like ``stats``.
    """
    bind = session.get_bind()
    engine = bind if isinstance(bind, sa.Engine) else bind.engine
    with engine.connect() as conn:
        now = conn.execute(periodic_sql.database_now()).scalar_one()
        states = _schedule_states(conn)
        conn.rollback()
    return _schedule_statuses(registry, now, states)


def _schedule_states(conn: sa.Connection) -> dict[str, Any]:
    """The rows of ``jobs_periodic`` by name, with their last job's status."""
    try:
        return {row.name: row for row in conn.execute(_list_states())}
    except sa_exc.ProgrammingError as exc:
        raise SchemaNotReadyError(
            f"cannot read jobs_periodic (revision 0004); {schema.UPGRADE}: "
            f"{exceptions.db_error_text(exc)}"
        ) from None


def _schedule_statuses(
    registry: Registry, now: datetime, states: Mapping[str, Any]
) -> tuple[ScheduleStatus, ...]:
    declared = {s.name: s for s in registry.schedules}
    found = []
    for name in sorted(set(declared) | set(states)):
        schedule, state = declared.get(name), states.get(name)
        source: Any = schedule if schedule is not None else state
        found.append(
            ScheduleStatus(
                name=name,
                kind=source.kind,
                expression=source.expression,
                timezone=schedule.timezone if schedule else None,
                missed=schedule.missed if schedule else None,
                next_tick=schedule.next_after(now).astimezone(schedule.zone) if schedule else None,
                last_tick=state.last_tick if state else None,
                last_job_id=state.last_job_id if state else None,
                last_job_status=state.last_job_status if state else None,
                in_app=schedule is not None,
            )
        )
    return tuple(found)


def _float(value: Any) -> float | None:
    return None if value is None else max(0.0, float(value))


# The statements of stats() and throughput() are built once and reused (their instant a
# parameter, _common.TAKEN_AT): building them and computing their SQLAlchemy cache keys
# cost more CPU than the database spends answering them (the dashboard asks every second).
_stats_head = functools.cache(stats_sql.stats_head)
_list_states = functools.cache(periodic_sql.list_states)
_controls = functools.cache(control_sql.controls)
_live_workers = functools.cache(workers_sql.live)
_throughput_now = functools.lru_cache(maxsize=8)(stats_sql.throughput_now)


@functools.lru_cache(maxsize=8)
def _stats_statement(exact_up_to: int | None) -> tuple[tuple[str, ...], sa.Select[Any]]:
    """``stats``' per-(queue, kind) statement, as of ``{"taken_at": ...}``,
    and the
    names of its parts."""
    parts = _stats_parts(_common.TAKEN_AT, exact_up_to)
    return tuple(name for name, _ in parts), stats_sql.stats_parts(parts)


def _stats_parts(taken_at: _common.At, exact_up_to: int | None) -> list[tuple[str, sa.Select[Any]]]:
    """The per-(queue, kind) statements of ``stats``, named: exact counts, or
    the
    newest ``exact_up_to + 1`` rows of each status the overview may estimate."""
    parts: list[tuple[str, sa.Select[Any]]] = []
    for statuses, exact, _ in _ESTIMABLE:
        if exact_up_to is None:
            parts.append((statuses[0].value, exact(taken_at)))
        else:
            parts += [
                (s.value, stats_sql.stats_sample(s, exact_up_to + 1, taken_at)) for s in statuses
            ]
    parts.append(("running", stats_sql.stats_running(taken_at)))
    parts.append(("done", stats_sql.stats_done_recent(taken_at)))
    return parts


def _table_stats(row: Any) -> TableStats:
    """[``TableStats``][sqla_jobs.ops.TableStats] from a ``sqla_jobs.sql.stats.stats_head`` row (its
    table
    columns NULL when the table is missing from the statistics views)."""
    estimates: dict[str, int] = {}
    reltuples = max(0, int(row.reltuples or 0))
    if row.vals is not None:
        for value, freq in zip(row.vals, row.freqs, strict=False):
            estimates[value] = round(reltuples * freq)
    return TableStats(
        estimated_rows=reltuples,
        estimated_by_status=estimates,
        live_tuples=int(row.n_live_tup or 0),
        dead_tuples=int(row.n_dead_tup or 0),
        last_vacuum=row.last_vacuum,
        last_autovacuum=row.last_autovacuum,
        last_autoanalyze=row.last_autoanalyze,
    )


# --- health (issue #25) ----------------------------------------------------------------


#: Every health check's name (``Finding.check``).
HEALTH_CHECKS = _health.CHECKS


@_sessions.sync_form
def health(session: Session, /, **thresholds: Any) -> Health:
    """What pins the MVCC horizon, bloat, expired leases, waits and silent workers.

    ``thresholds`` override ``HealthThresholds`` (``max_transaction_age``,
    ``max_slot_xid_age``, ``max_dead_tuples``, ``max_dead_ratio``, ``max_vacuum_age``,
    ``max_jobs_table_bytes``, ``max_expired_leases``, ``max_ready_age``,
    ``max_heartbeat_age``; defaults in ``sqla_jobs._health``). Each figure over
    its threshold is a ``Finding`` that says what to do; ``Health.ok`` is
    True when there is none. Reads catalog views and the live-job partial indexes on
    a connection of its own: cheap however long the history. Raises ConfigError for
    an unknown or bad threshold.
    """
    return _health.health(session, **thresholds)


# --- looking at jobs ----------------------------------------------------------------


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a job (revision 0011), as
    [``JobRecord.history``][sqla_jobs.ops.JobRecord.history] tells it.

    ``attempt`` is its number: a snoozed attempt is not spent, so the next claim has
    the same number; a retry by hand starts again at 1. ``claimed_at`` is when its
    worker claimed it (the handler starts then, or after the jobs ahead of it in the
    worker's prefetch buffer); ``ended_at`` is None while it runs. ``outcome`` is one of
    ``running``, ``done``, ``failed``, ``snoozed``, ``lease expired`` or ``cancelled``;
    ``then`` the status it left the job in (``queued`` again, ``dead``, ...). ``error``
    is the beginning of its error, at most 2,000 characters (``last_error`` holds the latest
    one in full).
    """

    attempt: int
    worker: str | None
    claimed_at: datetime | None
    ended_at: datetime | None
    outcome: str
    then: str | None = None
    error: str | None = None

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> AttemptRecord:
        """An object of ``jobs.errors``, as ``sqla_jobs.sql.lease`` writes them."""
        return cls(
            attempt=int(entry.get("attempt") or 0),
            worker=entry.get("worker"),
            claimed_at=_instant(entry.get("claimed_at")),
            ended_at=_instant(entry.get("at")),
            outcome=str(entry.get("outcome", "")),
            then=entry.get("then"),
            error=entry.get("error"),
        )


#: The fraction of a second in an ISO 8601 timestamp, before its offset.
_FRACTION = re.compile(r"(?<=:\d\d)\.(\d{1,6})(?=[+-]|Z|$)")


def _instant(value: Any) -> datetime | None:
    """A timestamp as ``to_jsonb(timestamptz)`` writes it (ISO 8601 with its offset).

    PostgreSQL drops the fraction's trailing zeros (``...:27.11095+00:00``), and Python
    3.10's ``fromisoformat`` reads only 3 or 6 digits there (3.11 reads any): the fraction
    is padded to 6 first.
    """
    if not isinstance(value, str):
        return None
    return datetime.fromisoformat(_FRACTION.sub(lambda m: "." + m.group(1).ljust(6, "0"), value))


def _current_error(
    status: JobStatus, attempts: int, snoozes: int, last_error: str | None
) -> str | None:
    """``last_error`` if it is why the job is where it is (see
    [``JobRecord.current_error``][sqla_jobs.ops.JobRecord.current_error]), else None: it is
    history."""
    failed = status in (JobStatus.DEAD, JobStatus.CANCELLED) or (
        status is JobStatus.QUEUED and (attempts > 0 or snoozes > 0)
    )
    return last_error if failed else None


@dataclass(frozen=True)
class JobRecord:
    """A job as read by [``list_jobs``][sqla_jobs.ops.list_jobs] /
    [``get_job``][sqla_jobs.ops.get_job]: a snapshot, not an ORM object.

    ``archived_at`` is set when the job was read from ``jobs_archive`` (see
    [``archive``][sqla_jobs.ops.archive]). ``run_at`` is when the job was (or will be) ready for its
    latest attempt; a dead job keeps that of its last attempt. ``last_error`` is the latest failure,
    kept after a retry succeeds: ``current_error`` is it only while the failure is the job's state.
    """

    id: int
    kind: str
    queue: str
    priority: int
    payload: dict[str, Any]
    status: JobStatus
    run_at: datetime
    locked_until: datetime | None
    attempts: int
    #: None: not claimed yet, enqueued without one (the handler's, else 8, once claimed).
    max_attempts: int | None
    idempotency_key: str | None
    worker: str | None
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None
    result: Any = None
    timeout: float | None = None
    snoozes: int = 0
    cancel_requested_at: datetime | None = None
    #: When the latest attempt was claimed (revision 0011; None before its first claim).
    attempted_at: datetime | None = None
    #: The attempts that ended other than done, as stored (revision 0011): see ``history``.
    errors: list[dict[str, Any]] | None = None
    archived_at: datetime | None = None
    #: The job's metadata (revision 0013): ``{}`` and ``[]`` when it has none.
    meta: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    #: The workflow this job is a step of, and its step name (revision 0014; else None).
    workflow_id: uuid.UUID | None = None
    step: str | None = None

    @property
    def archived(self) -> bool:
        return self.archived_at is not None

    @property
    def history(self) -> tuple[AttemptRecord, ...]:
        """Every attempt recorded, oldest first: those that ended other than done (from
        ``errors``), then the latest one if it runs or ended done (from ``attempted_at``,
        ``worker`` and ``finished_at``). Empty for a job written before revision 0011."""
        ended = tuple(AttemptRecord.from_entry(e) for e in self.errors or ())
        latest = self._latest_attempt(ended)
        return ended if latest is None else (*ended, latest)

    def _latest_attempt(self, ended: tuple[AttemptRecord, ...]) -> AttemptRecord | None:
        if self.attempted_at is None:
            return None
        if ended and ended[-1].claimed_at == self.attempted_at:
            return None  # the latest claim's attempt ended with an entry in ``errors``
        if self.status is JobStatus.RUNNING:
            return AttemptRecord(self.attempts, self.worker, self.attempted_at, None, "running")
        if self.status is JobStatus.DONE:
            return AttemptRecord(
                self.attempts, self.worker, self.attempted_at, self.finished_at, "done", "done"
            )
        return None

    @property
    def current_error(self) -> str | None:
        """``last_error`` when a failure or a decision is why the job is where it is:
        dead, cancelled, or queued for a retry or after a snooze. None for a job that ran
        again since (done, running, retried by hand)."""
        return _current_error(self.status, self.attempts, self.snoozes, self.last_error)

    def to_dict(self) -> dict[str, Any]:
        data = _jsonable(asdict(self))
        data["status"] = self.status.value
        return data  # type: ignore[no-any-return]


_RECORD_FIELDS = tuple(f.name for f in fields(JobRecord))


def _record(row: Any) -> JobRecord:
    values: dict[str, Any] = {name: getattr(row, name, None) for name in _RECORD_FIELDS}
    values["status"] = JobStatus(values["status"])
    values["meta"] = values["meta"] or {}
    values["tags"] = list(values["tags"] or ())
    return JobRecord(**values)


@_sessions.sync_form
def list_jobs(
    session: Session,
    status: JobStatus | str | Sequence[JobStatus | str] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: timedelta | None = None,
    limit: int = DEFAULT_LIMIT,
    after_id: int | None = None,
    *,
    key: str | None = None,
    min_id: int | None = None,
    max_id: int | None = None,
    newer_than: timedelta | None = None,
    payload: Mapping[str, Any] | None = None,
    newest_first: bool = False,
    tag: str | Sequence[str] | None = None,
    meta: Mapping[str, Any] | None = None,
    workflow: uuid.UUID | str | None = None,
    expired: bool = False,
) -> list[JobRecord]:
    """One page of jobs, oldest id first, filtered by status, kind, queue and age.

    ``older_than`` keeps jobs created more than that long ago, ``newer_than`` those
    created since. ``key`` is an idempotency key; ``min_id`` and ``max_id`` bound the id
    (inclusive); ``payload`` keeps jobs whose payload contains it (``{"user": 7}``
    matches ``{"user": 7, "plan": "pro"}``; PostgreSQL's ``@>``), ``meta`` likewise for
    the job's metadata, and ``tag`` keeps jobs with that tag (a list: with every one of
    them); ``workflow`` (a workflow id) keeps that workflow's steps, read from its own
    index whatever else is given; ``expired=True`` keeps running jobs whose lease has
    expired (``locked_until`` past: their worker stopped renewing it; the rescuer puts
    them back). Pages by keyset: pass
    the last id of a page as ``after_id`` to get the next one (stable while rows change);
    with ``newest_first``, the highest ids come first and the next page holds ids below
    ``after_id``.
    """
    statuses = _statuses(status)
    if min_id is not None and max_id is not None and min_id > max_id:
        raise ConfigError(f"min_id {min_id} is above max_id {max_id}: no job is in that range")
    if not isinstance(expired, bool):
        raise ConfigError(f"expired must be True or False, got {expired!r}")
    if expired:
        if statuses not in (None, [JobStatus.RUNNING]):
            raise ConfigError(
                "expired keeps running jobs whose lease has expired: give no status, or running"
            )
        statuses = [JobStatus.RUNNING]
    page = functools.partial(
        admin.list_jobs,
        statuses=statuses,
        kind=kind,
        queue=queue,
        older_than=_seconds("older_than", older_than),
        limit=_positive_int("limit", limit, MAX_LIMIT),
        after_id=None if after_id is None else _non_negative_id(after_id),
        key=_text_filter("key", key),
        min_id=None if min_id is None else _non_negative_id(min_id, "min_id"),
        max_id=None if max_id is None else _non_negative_id(max_id, "max_id"),
        newer_than=_seconds("newer_than", newer_than),
        payload=None if payload is None else _payload_match(payload),
        newest_first=bool(newest_first),
        tags=_tags_filter(tag),
        meta=None if meta is None else _payload_match(meta, "meta"),
        workflow=None if workflow is None else _workflow_id(workflow),
        expired=expired,
    )
    contains = (payload, meta, tag)
    found = session.execute(page(payload_scan=admin.NEAR)).all()
    if workflow is not None:
        pass  # one statement: the workflow's steps (admin.list_jobs)
    elif len(found) < limit and admin.payload_in_two_steps(statuses, kind, queue, *contains):
        # Not a page among the ids near the cursor: every match, from the GIN index,
        # unless those ids were all the table has past the cursor (the last page).
        lowest, highest = session.execute(admin.id_edges()).one()
        if not admin.near_window_was_everything(after_id, bool(newest_first), lowest, highest):
            found = session.execute(page(payload_scan=admin.MATCHES)).all()
    return [_record(row) for row in found]


def _text_filter(name: str, value: str | None) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _payload_match(value: Mapping[str, Any], name: str = "payload") -> str:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{name} must be a JSON object (a dict) the {name} contains, got {value!r}"
        )
    try:
        return json.dumps(dict(value), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} is not JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{name} is nested too deeply to encode as JSON") from None


def _tags_filter(tag: str | Sequence[str] | None) -> list[str] | None:
    """``tag`` as the list of tags a job must have, or ConfigError."""
    if tag is None:
        return None
    tags = [tag] if isinstance(tag, str) else tag
    if not isinstance(tags, Sequence) or not tags:
        raise ConfigError(f"tag must be a tag or a non-empty list of tags, got {tag!r}")
    for one in tags:
        if not isinstance(one, str) or not one:
            raise ConfigError(f"each tag must be a non-empty string, got {one!r}")
    return list(tags)


def _non_negative_id(value: int, name: str = "after_id") -> int:
    return validation.integer(name, value, minimum=0, error=ConfigError)


def _statuses(
    status: JobStatus | str | Sequence[JobStatus | str] | None,
) -> list[JobStatus] | None:
    if status is None:
        return None
    if isinstance(status, (str, JobStatus)):
        return [_status(status)]
    return [_status(s) for s in status]


def timeout_text(job: JobRecord, registry: Registry | None) -> str:
    """A job's timeout in words, as its worker applies it: its own, else its handler's
    (from ``registry``, said to be the handler's); without a registry, that it is the
    handler's and unknown here (``sqla-jobs show``, the dashboard's job page)."""
    if job.timeout is not None:
        return f"{job.timeout:g} s"
    if registry is None:
        return "its handler's (unknown without the app's registry)"
    if job.kind not in registry.kinds:
        return f"its handler's (unknown: the registry has no handler for {job.kind!r})"
    declared = registry[job.kind].timeout
    return "none (its handler's)" if declared is None else f"{declared:g} s (its handler's)"


@_sessions.sync_form
def get_job(session: Session, id: int, *, archived: bool = True) -> JobRecord:
    """The job with this id, from ``jobs`` or else (unless ``archived=False``) from
    ``jobs_archive`` (then ``archived_at`` is set); JobNotFoundError if there is none."""
    row = session.execute(admin.get_job(id)).one_or_none()
    if row is None and archived:
        row = session.execute(admin.get_archived_job(id)).one_or_none()
    if row is None:
        where = (
            " (never existed, deleted, or pruned from the archive)"
            if archived
            else " (not looking in jobs_archive)"
        )
        raise JobNotFoundError(f"no job with id {id}{where}")
    return _record(row)


@dataclass(frozen=True)
class JobState:
    """Where one job stands, as [``job_states``][sqla_jobs.ops.job_states] reads it (the dashboard's
    live view)."""

    id: int
    status: JobStatus
    attempts: int
    max_attempts: int | None
    cancel_requested: bool


#: The channels the queue NOTIFYs on (inserts while a worker waits and queue control
#: changes; running jobs asked to stop): what a live view can LISTEN to.
NOTIFY_CHANNELS = (locks.NOTIFY_CHANNEL, locks.CANCEL_CHANNEL)

#: Most ids ``job_states`` looks up at once (a page of the dashboard shows 50).
MAX_STATE_IDS = 500


@_sessions.sync_form
def job_states(session: Session, ids: Sequence[int]) -> dict[int, JobState]:
    """The state of each job in ``ids`` still in ``jobs``, by id (archived or deleted jobs
    are absent). At most ``MAX_STATE_IDS`` ids; each is a primary key look-up."""
    ids_ = _ids(ids) or []
    if len(ids_) > MAX_STATE_IDS:
        raise ConfigError(f"job_states takes at most {MAX_STATE_IDS} ids, got {len(ids_)}")
    if not ids_:
        return {}
    return {
        row.id: JobState(
            row.id,
            JobStatus(row.status),
            row.attempts,
            row.max_attempts,
            row.cancel_requested_at is not None,
        )
        for row in session.execute(admin.job_states(ids_))
    }


# --- acting on jobs -----------------------------------------------------------------

#: The statuses each job action applies to: what its call changes (cancel asks a
#: running job to stop). The CLI and the dashboard offer the action and word their
#: refusals from these (``applies_text``), so all three agree.
ACTION_STATUSES: dict[str, tuple[JobStatus, ...]] = {
    "retry": (JobStatus.DEAD, JobStatus.CANCELLED),
    "cancel": (JobStatus.QUEUED, JobStatus.WAITING, JobStatus.RUNNING),
    "delete": (
        JobStatus.QUEUED,
        JobStatus.WAITING,
        JobStatus.DONE,
        JobStatus.DEAD,
        JobStatus.CANCELLED,
    ),
}
_RETRYABLE = ACTION_STATUSES["retry"]
_DELETABLE = ACTION_STATUSES["delete"]


def applies_text(action: str) -> str:
    """The statuses ``action`` applies to, in words: "queued, waiting or running"."""
    names = [s.value for s in ACTION_STATUSES[action]]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _check_filters(ids: list[int] | None, kind: str | None, queue: str | None) -> None:
    for name, value in (("kind", kind), ("queue", queue)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{name} must be a non-empty string, got {value!r}")


@_sessions.sync_form
def retry_jobs(
    session: Session,
    ids: Sequence[int] | None = None,
    *,
    kind: str | None = None,
    queue: str | None = None,
    older_than: timedelta | None = None,
    status: JobStatus | str | Sequence[JobStatus | str] = JobStatus.DEAD,
) -> int:
    """Put dead (or cancelled) jobs back in the queue; return how many were changed.

    Matching jobs (by ``ids`` and/or the filters; with neither, every job in ``status``)
    become ``queued`` with ``run_at = now()`` and ``attempts = 0``, so they get their
    full ``max_attempts`` again. ``last_error`` is kept until the next failure replaces
    it. Only ``dead`` and ``cancelled`` jobs can be retried. Never commits.

    A retried workflow step reopens, in the same transaction, the steps downstream of it
    that were cancelled because it failed (transitively): they wait for it again, and
    the workflow resumes when it succeeds. One that also depends on another step that
    failed and is not retried stays cancelled, and so do its dependents (retry that
    step too, or the whole workflow with [``retry_workflow``][sqla_jobs.ops.retry_workflow]). The
    count returned is of the jobs matched, not of the steps reopened.

    A step whose dependency failed (it was cancelled because of it) is not queued on
    its own: the call raises [``ConfigError``][sqla_jobs.ConfigError] naming the dependency and
    changes nothing, unless that dependency is retried in the same call; then the step
    waits for it (so does any retried step whose dependency is retried with it).
    """
    statuses = _statuses(status) or []
    bad = [s.value for s in statuses if s not in _RETRYABLE]
    if bad or not statuses:
        raise ConfigError(
            f"only {applies_text('retry')} jobs can be retried, not {bad or statuses}"
        )
    ids_ = _ids(ids)
    _check_filters(ids_, kind, queue)
    stmt = admin.retry_jobs(
        statuses=statuses,
        ids=ids_,
        kind=kind,
        queue=queue,
        older_than=_seconds("older_than", older_than),
    )
    # A savepoint: a refused step (below) undoes the whole call, not only its own row.
    with session.begin_nested():
        retried = session.execute(stmt).all()
        steps = sorted(r.id for r in retried if r.workflow_id is not None)
        if steps:
            _refuse_failed_dependencies(session, steps)
            # A step retried with its failed dependency waits for it (their edge waits
            # again), rather than running beside it.
            session.execute(workflows_sql.reopen_edges(steps))
            session.execute(workflows_sql.wait_again(steps))
            _reopen_downstream(session, steps)
    return len(retried)


def _refuse_failed_dependencies(session: Session, steps: list[int]) -> None:
    """ConfigError if a step of ``steps`` needs a dependency that failed and is not
    retried with it: queued, it would run without what it needs (#26)."""
    found = session.execute(workflows_sql.failed_dependencies(steps)).all()
    if not found:
        return
    first = found[0]
    child = f"step {first.child_step!r} (job {first.child_id})"
    parent = (
        f"{first.parent_step!r} (job {first.parent_id})"
        if first.parent_step is not None
        else f"job {first.parent_id}"
    )
    ended = "was deleted" if first.outcome == "deleted" else f"ended {first.outcome}"
    others = f" ({len(found) - 1} more such dependencies)" if len(found) > 1 else ""
    if first.outcome == "deleted":
        fix = f"it cannot run in workflow {first.workflow_id} as built"
    else:
        fix = (
            f"retry job {first.parent_id} instead (sqla-jobs retry {first.parent_id}; the "
            "steps its failure cancelled wait for it again), or with it, or the whole "
            f"workflow (sqla-jobs workflow retry {first.workflow_id})"
        )
    raise ConfigError(
        f"{child} was not retried: its dependency {parent} {ended}{others}, and it runs "
        f"only after that succeeds; {fix}. Nothing was retried."
    )


def _reopen_downstream(session: Session, retried: list[int]) -> None:
    """The steps cancelled because a step of ``retried`` failed wait for it again (#26)."""
    below = list(session.execute(workflows_sql.cancelled_downstream(retried)).scalars())
    if not below:
        return
    kept = sorted({*retried, *below})
    reopened = set(session.execute(workflows_sql.reopen_cancelled(below, kept)).scalars())
    # Into every one of them, reopened or not: an edge from a step that runs again
    # waits for its new outcome (a step left cancelled now is reopened by a later retry
    # of its other failed dependency only if this one's edge no longer says it failed).
    session.execute(workflows_sql.reopen_edges_into(kept, below))
    blocked = sorted(set(below) - reopened)
    if blocked:
        # A step left cancelled (another dependency failed) cancels again, with a reason
        # naming it, the steps reopened after it (their edge from it was just reopened).
        session.execute(workflows_sql.resolve(blocked))


@dataclass(frozen=True)
class CancelResult:
    """What [``cancel``][sqla_jobs.ops.cancel] did: queued jobs ``cancelled`` at once, and running
    jobs asked to stop (``stopping``: their worker rolls the attempt back and ends them
    ``cancelled``; one that finishes first stays ``done``)."""

    cancelled: tuple[int, ...]
    stopping: tuple[int, ...]


@_sessions.sync_form
def cancel(
    session: Session,
    ids: Sequence[int] | None = None,
    *,
    kind: str | None = None,
    queue: str | None = None,
    older_than: timedelta | None = None,
    running: bool = True,
) -> CancelResult:
    """Cancel queued jobs and waiting workflow steps, and (``running``) ask running ones
    to stop (``ACTION_STATUSES``).

    Give ``ids`` or at least one filter: cancelling every job takes an explicit ``kind``
    or ``queue``. A queued job becomes ``cancelled`` (a job a worker claims while this
    runs is skipped, then handled as a running one would be next time). A waiting step
    becomes ``cancelled`` too, and its dependents follow as the workflow rules say (those
    that need it to succeed are cancelled, an on-failure step is released). A running job
    gets ``cancel_requested_at``, and its worker is told when you commit (NOTIFY on
    ``sqla_jobs_cancel``; its heartbeat reads the flag too): the handler is stopped as
    for a timeout, its writes rolled back, and the job ends ``cancelled``, never retried.
    Never commits.
    """
    ids_ = _ids(ids)
    _check_filters(ids_, kind, queue)
    if ids_ is None and kind is None and queue is None:
        raise ConfigError("cancel needs job ids or a --kind/--queue filter")
    age = _seconds("older_than", older_than)
    stmt = admin.cancel_jobs(ids=ids_, kind=kind, queue=queue, older_than=age)
    cancelled = tuple(sorted(r.id for r in session.execute(stmt)))
    stopping: tuple[int, ...] = ()
    if running:
        marked = admin.request_cancel(ids=ids_, kind=kind, queue=queue, older_than=age)
        stopping = tuple(r.id for r in session.execute(marked))
    return CancelResult(cancelled, stopping)


@_sessions.sync_form
def cancel_jobs(
    session: Session,
    ids: Sequence[int] | None = None,
    *,
    kind: str | None = None,
    queue: str | None = None,
    older_than: timedelta | None = None,
    running: bool = True,
) -> int:
    """[``cancel``][sqla_jobs.ops.cancel], returning how many jobs were cancelled or asked to stop.

    With ``running=False``, running jobs are left alone (the behaviour before 0005).
    Never commits.
    """
    done = cancel(session, ids, kind=kind, queue=queue, older_than=older_than, running=running)
    return len(done.cancelled) + len(done.stopping)


@_sessions.sync_form
def result(session: Session, job_id: int) -> Any:
    """The value the handler of a ``done`` job returned (None if it returned None).

    Reads the job, or its archived copy. [``JobNotFoundError``][sqla_jobs.JobNotFoundError] if there
    is neither; [``JobNotDoneError``][sqla_jobs.JobNotDoneError] if the job is not ``done`` (yet).
    Runs in the session's transaction.
    """
    validation.integer("job_id", job_id, minimum=0, error=ConfigError)
    row = session.execute(admin.job_result(job_id)).one_or_none()
    if row is None:  # archived (or never was): a job leaves jobs only for the archive
        row = session.execute(admin.job_result(job_id, archived=True)).one_or_none()
    if row is None:
        raise JobNotFoundError(
            f"no job with id {job_id} (never existed, deleted, or pruned from the archive)"
        )
    status = JobStatus(row.status)
    if status is not JobStatus.DONE:
        raise JobNotDoneError(f"job {job_id} is {status.value}: only done jobs have a result")
    return row.result


@_sessions.sync_form
def delete_jobs(
    session: Session,
    ids: Sequence[int] | None = None,
    *,
    status: JobStatus | str | Sequence[JobStatus | str] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: timedelta | None = None,
    dry_run: bool = False,
) -> int:
    """Delete jobs that are not running; return how many were deleted.

    Give ``ids`` or ``status`` (any but ``running``: queued, waiting, done, dead or
    cancelled; a deleted workflow step's dependents follow as the workflow rules say),
    optionally narrowed by kind, queue
    and age. ``dry_run``: delete nothing, return how many would be deleted now
    ([``jobs_to_delete``][sqla_jobs.ops.jobs_to_delete] says which). Never commits. Prefer
    [``archive``][sqla_jobs.ops.archive] for finished jobs: it keeps history.
    """
    if dry_run:
        return len(
            jobs_to_delete(
                session, ids, status=status, kind=kind, queue=queue, older_than=older_than
            )
        )
    stmt = admin.delete_jobs(**_delete_filters(ids, status, kind, queue, older_than))
    return len(session.execute(stmt).all())


# --- archive and prune --------------------------------------------------------------


def _batch(session: Session, stmt: Any, floors: dict[str, datetime]) -> list[Any]:
    """One archive or prune batch in a transaction of its own, committed, with JIT off.

    When the statistics count many rows under the cutoff (a long history), the planner's
    estimate of a batch passes ``jit_above_cost``, and compiling it took 45 ms (1,000,000
    archived rows) to 100-160 ms (10,000,000, a shared host) of calls whose plan ran in
    2 ms: a 1,000-row prune 5-7x its cost with an empty history (#25).
    """
    session.execute(workflows_sql.set_jit("off"))  # SET LOCAL: until the commit
    rows = list(session.execute(stmt, floors).all())
    session.commit()
    return rows


#: (database, UTC day) this process already prepared ``jobs_archive`` for: the
#: partitions of the week and the next exist, so one call a day per database is enough.
_PREPARED: set[tuple[str, Any]] = set()
#: How many times ``prepare_archive`` calls the function in a row: create partitions
#: and add id CHECKs, validate them, see nothing left.
_PREPARE_CALLS = 3


def _prepared_key(session: Session) -> tuple[str, Any]:
    bind = session.get_bind()
    return (bind.engine.url.render_as_string(hide_password=True), datetime.now(timezone.utc).date())


def _forget_prepared(session: Session) -> None:
    _PREPARED.discard(_prepared_key(session))


def _no_partition(exc: sa_exc.IntegrityError) -> bool:
    """The archive's row had no partition to go to (SQLSTATE 23514, check_violation)."""
    return getattr(exc.orig, "sqlstate", None) == "23514" and "no partition of relation" in str(
        exc.orig
    )


@_sessions.sync_form
def prepare_archive(session: Session) -> int:
    """Make ``jobs_archive`` ready to take this week's rows (revision 0022): the
    partitions of this week and the next exist, closed partitions carry a validated id
    CHECK. Runs ``jobs_archive_prepare`` (a ``SECURITY DEFINER`` function: no DDL
    right needed) until it has nothing left to do, each call committed; once a day per
    process and database after that (forgotten when an archive batch finds no partition
    for its rows: it prepares again and retries the batch once). Returns how many
    changes were made.
    [``archive``][sqla_jobs.ops.archive] calls it first; call it yourself before an
    archive statement of your own. Commits."""
    key = _prepared_key(session)
    if key in _PREPARED:
        return 0
    if session.in_transaction():
        session.commit()
    total = 0
    for _ in range(_PREPARE_CALLS):
        try:
            changes = int(session.execute(admin.prepare_archive()).scalar_one())
        except sa_exc.ProgrammingError as exc:
            session.rollback()
            if schema.missing_function(exc):
                raise SchemaNotReadyError(
                    "jobs_archive_prepare() does not exist: " + schema.PARTITIONED_MISSING
                ) from None
            raise
        session.commit()
        total += changes
        if not changes:
            break
    _PREPARED.add(key)
    return total


@_sessions.sync_form
def archive_batches(
    session: Session,
    older_than: timedelta,
    batch: int = DEFAULT_BATCH,
    include_dead_after: timedelta | None = None,
) -> Iterator[int]:
    """Like [``archive``][sqla_jobs.ops.archive], yielding each committed batch's row count (the
    worker uses it
    to stop between batches)."""
    done_age = _seconds("older_than", older_than)
    dead_age = _seconds("include_dead_after", include_dead_after)
    assert done_age is not None
    stmt = admin.archive_batch(
        done_older_than=done_age,
        dead_older_than=dead_age,
        batch=_positive_int("batch", batch),
    )
    if session.in_transaction():
        session.commit()
    prepare_archive(session)
    floors: dict[str, datetime] = {}  # each batch starts where the previous one stopped
    while True:
        try:
            rows = _batch(session, stmt, floors)
        except sa_exc.IntegrityError as exc:
            session.rollback()
            if not _no_partition(exc):
                raise
            # This week's partition is gone (dropped by hand, or by a drop_before of
            # code older than its future-time guard) though this process prepared it
            # today: prepare again, retry the batch once.
            _forget_prepared(session)
            prepare_archive(session)
            rows = _batch(session, stmt, floors)
        if rows:
            yield len(rows)
        if len(rows) < batch:
            return
        floors = admin.next_floors(rows[0], floors)


@_sessions.sync_form
def archive(
    session: Session,
    older_than: timedelta,
    batch: int = DEFAULT_BATCH,
    include_dead_after: timedelta | None = None,
) -> int:
    """Move finished jobs to ``jobs_archive``; return how many were moved.

    Done jobs finished more than ``older_than`` ago are moved; dead and cancelled jobs
    only when ``include_dead_after`` is given (usually longer: dead jobs are the error
    log someone still has to read). At most ``batch`` rows per transaction, each
    committed at once (so this commits: do not call it inside a unit of work). Rows
    locked by someone else are skipped and picked up next time.
    """
    return sum(archive_batches(session, older_than, batch, include_dead_after))


@dataclass(frozen=True)
class Pruned:
    """What [``prune_counts``][sqla_jobs.ops.prune_counts] removed, and how."""

    #: Rows that went with whole partitions dropped (``jobs_archive_drop_before``).
    dropped_rows: int
    #: How many partitions were dropped.
    dropped_partitions: int
    #: Rows removed by the batched DELETEs that followed.
    deleted_rows: int

    @property
    def total(self) -> int:
        """Every archived job removed: what [``prune``][sqla_jobs.ops.prune] returns."""
        return self.dropped_rows + self.deleted_rows

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


@_sessions.sync_form
def prune_counts(session: Session, older_than: timedelta, batch: int = DEFAULT_BATCH) -> Pruned:
    """[``prune``][sqla_jobs.ops.prune], saying how the rows went: whole partitions
    dropped (how many, their rows) and rows deleted in batches. Commits."""
    age = _seconds("older_than", older_than)
    assert age is not None
    stmt = admin.prune_batch(older_than=age, batch=_positive_int("batch", batch))
    if session.in_transaction():
        session.commit()
    before = set(session.execute(admin.archive_partitions()).scalars())
    dropped = int(session.execute(admin.drop_archive_before(older_than=age)).scalar_one())
    # Partitions are created (prepare) and dropped (this) under one advisory lock; one
    # missing now was dropped by this call.
    gone = len(before - set(session.execute(admin.archive_partitions()).scalars()))
    session.commit()
    deleted = 0
    floors: dict[str, datetime] = {}  # each batch starts where the previous one stopped
    while True:
        rows = _batch(session, stmt, floors)
        deleted += len(rows)
        if len(rows) < batch:
            return Pruned(dropped_rows=dropped, dropped_partitions=gone, deleted_rows=deleted)
        floors = admin.next_floors(rows[0], floors)


@_sessions.sync_form
def prune(session: Session, older_than: timedelta, batch: int = DEFAULT_BATCH) -> int:
    """Delete archived jobs finished more than ``older_than`` ago; return how many were
    deleted ([``prune_counts``][sqla_jobs.ops.prune_counts] says how).

    First whole partitions of ``jobs_archive`` archived before the cutoff are dropped
    (``jobs_archive_drop_before``, revision 0022: one short ACCESS EXCLUSIVE lock, no
    dead rows), then the rows left (the newest partition the cutoff falls in, the
    initial partition until its bound is past) go in ``batch``-row DELETEs, each
    committed."""
    return prune_counts(session, older_than, batch).total


@dataclass(frozen=True)
class ArchivePartition:
    """One partition of ``jobs_archive`` (revision 0022), as
    [``archive_partitions``][sqla_jobs.ops.archive_partitions] reads it from the catalog."""

    name: str
    #: Its rows' ``archived_at`` from (None: MINVALUE, the initial partition) ...
    lower_bound: datetime | None
    #: ... up to, not included.
    upper_bound: datetime | None
    #: Whether its ``CHECK (id BETWEEN ...)`` is validated (a look-up by id then skips it).
    id_check: bool
    #: The planner's estimate of its rows (``pg_class.reltuples``); None until the
    #: partition was first vacuumed or analyzed.
    estimated_rows: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: times as ISO 8601 strings."""
        return dict(_jsonable(asdict(self)))


@_sessions.sync_form
def archive_partitions(session: Session) -> list[ArchivePartition]:
    """The partitions of ``jobs_archive``, oldest first: bounds, whether the id CHECK
    is validated, estimated rows. Reads the catalog only (no scan of the archive)."""
    return [
        ArchivePartition(
            name=r.partition,
            lower_bound=r.lower_bound,
            upper_bound=r.upper_bound,
            id_check=bool(r.id_check),
            estimated_rows=None
            if r.estimated_rows is None or r.estimated_rows < 0
            else int(r.estimated_rows),
        )
        for r in session.execute(admin.archive_partitions())
    ]


# --- queue control: pause, limits, workers (revision 0006) ---------------------------


@dataclass(frozen=True)
class ControlState:
    """A paused or limited queue or kind, as every worker of the fleet obeys it.

    ``concurrency`` and ``rate`` are the effective limits: the operator's override
    (``*_override``) when set, else what the code declares (``declared_*``: written by
    the last worker that started with that kind or queue). ``rate`` reads like ``"100/min"``.
    """

    scope: str
    name: str
    paused: bool
    concurrency: int | None
    rate: str | None
    concurrency_override: int | None
    rate_override: str | None
    declared_concurrency: int | None
    declared_rate: str | None
    updated_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class WorkerInfo:
    """A live worker, from the registry its heartbeat refreshes (``sqla-jobs workers``).

    ``running`` is the number of jobs its handlers ran at its last heartbeat (every
    ``lock_seconds / 3``); ``expires_at`` is when it leaves the registry unless it beats again.
    """

    id: str
    host: str
    pid: int
    version: str
    queues: tuple[str, ...]
    kinds: tuple[str, ...]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    running: int

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))  # type: ignore[no-any-return]


def _rate_text(count: int | None, seconds: float | None) -> str | None:
    if count is None or seconds is None:
        return None
    return str(validation.Rate(count, seconds))


def _scope(queue: str | None, kind: str | None) -> tuple[str, str]:
    if (queue is None) == (kind is None):
        raise ConfigError("name a queue or a kind (one of them)")
    try:
        if queue is not None:
            return control_sql.QUEUE, validation.check_queue(queue)
        return control_sql.KIND, validation.check_kind(kind)
    except InvalidJobError as exc:
        raise ConfigError(str(exc)) from None


@_sessions.sync_form
def pause(session: Session, queue: str | None = None, *, kind: str | None = None) -> bool:
    """Stop every worker of the fleet from starting jobs of ``queue`` (or of ``kind``).

    Takes effect when the caller commits: every claim that begins after the commit
    leaves the queue out (the claim's own SQL reads the pause), on every host, and it
    stays paused across restarts until [``resume``][sqla_jobs.ops.resume]. Running jobs finish;
    enqueueing keeps working. Returns False, writing nothing, when it was paused already. Any name
    is accepted (a queue may get its first job later): [``unserved``][sqla_jobs.ops.unserved] says
    when no live worker serves it. Never commits.
    """
    scope, name = _scope(queue, kind)
    return _changed(session, control_sql.set_control(scope, name, paused=True))


@_sessions.sync_form
def resume(session: Session, queue: str | None = None, *, kind: str | None = None) -> bool:
    """Undo [``pause``][sqla_jobs.ops.pause]; at commit, a notification wakes the idle workers.
    Returns
    False, writing nothing, when it was not paused. Never commits."""
    scope, name = _scope(queue, kind)
    return _changed(session, control_sql.update_control(scope, name, paused=False), notify=True)


@_sessions.sync_form
def set_limit(
    session: Session,
    queue: str | None = None,
    *,
    kind: str | None = None,
    concurrency: int | None = None,
    rate: str | validation.Rate | None = None,
) -> bool:
    """Override the limits of ``queue`` (or ``kind``) across the fleet, at run time.

    ``concurrency``: at most this many of its jobs run at once; ``rate`` (``"100/min"``):
    at most that many start in any window of that length. Only what is given changes;
    [``clear_limits``][sqla_jobs.ops.clear_limits] drops the overrides. Workers pick the change up
    within about a second (at once for a raised or removed limit). Every bad value is named in one
    ConfigError. Returns False, writing nothing, when the limits were so already. Never
    commits.
    """
    problems: list[str] = []
    values: dict[str, Any] = {}
    try:
        scope, name = _scope(queue, kind)
    except ConfigError as exc:
        problems.append(str(exc))
    if concurrency is not None:
        try:
            values["concurrency"] = validation.check_limit("concurrency", concurrency, ConfigError)
        except ConfigError as exc:
            problems.append(str(exc))
    if rate is not None:
        try:
            checked = validation.check_rate("rate", rate, ConfigError)
            values.update(rate_count=checked.count, rate_seconds=checked.seconds)
        except ConfigError as exc:
            problems.append(str(exc))
    if concurrency is None and rate is None:
        problems.append("set_limit needs a concurrency or a rate")
    if problems:
        raise ConfigError("; ".join(problems))
    return _changed(session, control_sql.set_control(scope, name, **values), notify=True)


@_sessions.sync_form
def clear_limits(
    session: Session, queue: str | None = None, *, kind: str | None = None, declared: bool = False
) -> bool:
    """Drop the operator's limits of ``queue`` (or ``kind``): the code's declared ones apply
    again; with ``declared``, those are dropped too (until a worker declaring them starts).
    Returns False, writing nothing, when there were none to drop. Never commits."""
    scope, name = _scope(queue, kind)
    values: dict[str, Any] = dict(concurrency=None, rate_count=None, rate_seconds=None)
    if declared:
        values.update(
            declared_concurrency=None, declared_rate_count=None, declared_rate_seconds=None
        )
    return _changed(session, control_sql.update_control(scope, name, **values), notify=True)


def _changed(session: Session, statement: sa.Executable, notify: bool = False) -> bool:
    """Run a control change; whether it changed anything (then, with ``notify``, wake
    the listening workers at commit)."""
    changed = session.execute(statement).first() is not None
    if changed and notify:
        session.execute(control_sql.notify_control())
    return changed


@dataclass(frozen=True)
class Unserved:
    """No live worker serves a queue (or kind) that has live workers around it: a pause
    or limit of it is kept, but the name may be a typo. ``str()`` says so in a sentence."""

    scope: str
    name: str
    live_workers: int

    def __str__(self) -> str:
        return (
            f"none of the {self.live_workers} live worker(s) serves {self.scope} {self.name} "
            "(a typo?); the setting is kept and applies to its jobs wherever they run"
        )


@_sessions.sync_form
def unserved(
    session: Session, queue: str | None = None, *, kind: str | None = None
) -> Unserved | None:
    """[``Unserved``][sqla_jobs.ops.Unserved] when live workers exist and none of them serves
    ``queue`` (or ``kind``); None when one does, or when no worker is live (nothing to compare
    with).

    Any name is accepted by [``pause``][sqla_jobs.ops.pause] and
    [``set_limit``][sqla_jobs.ops.set_limit] (a queue may get its first job later), so a typo would
    pass unnoticed: the CLI and the dashboard ask this after those actions and show its sentence.
    """
    scope, name = _scope(queue, kind)
    live = workers(session)
    served = any(name in (w.queues if scope == control_sql.QUEUE else w.kinds) for w in live)
    return Unserved(scope, name, len(live)) if live and not served else None


def _control(row: Any) -> ControlState:
    return ControlState(
        scope=row.scope,
        name=row.name,
        paused=row.paused,
        concurrency=row.concurrency,
        rate=_rate_text(row.rate_count, row.rate_seconds),
        concurrency_override=row.concurrency_override,
        rate_override=_rate_text(row.rate_count_override, row.rate_seconds_override),
        declared_concurrency=row.declared_concurrency,
        declared_rate=_rate_text(row.declared_rate_count, row.declared_rate_seconds),
        updated_at=row.updated_at,
    )


@_sessions.sync_form
def controls(session: Session) -> list[ControlState]:
    """Every paused or limited queue and kind, queues first, by name."""
    return [_control(row) for row in session.execute(control_sql.controls())]


def _worker(row: Any) -> WorkerInfo:
    values = {f.name: getattr(row, f.name) for f in fields(WorkerInfo)}
    values.update(queues=tuple(row.queues), kinds=tuple(row.kinds))
    return WorkerInfo(**values)


@_sessions.sync_form
def workers(session: Session) -> list[WorkerInfo]:
    """The live workers of the fleet (heartbeat within their lease time), by id."""
    return [_worker(row) for row in session.execute(workers_sql.live())]


@_sessions.sync_form
def jobs_to_delete(
    session: Session,
    ids: Sequence[int] | None = None,
    *,
    status: JobStatus | str | Sequence[JobStatus | str] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    older_than: timedelta | None = None,
) -> list[tuple[int, str, str, str]]:
    """``(id, status, queue, kind)`` of each job [``delete_jobs``][sqla_jobs.ops.delete_jobs] with
    the same
    arguments would delete now, by id. Deletes nothing (``sqla-jobs delete --dry-run``)."""
    stmt = admin.matching_jobs(**_delete_filters(ids, status, kind, queue, older_than))
    return [(r.id, JobStatus(r.status).value, r.queue, r.kind) for r in session.execute(stmt)]


def _delete_filters(
    ids: Sequence[int] | None,
    status: JobStatus | str | Sequence[JobStatus | str] | None,
    kind: str | None,
    queue: str | None,
    older_than: timedelta | None,
) -> dict[str, Any]:
    """The checked filters of [``delete_jobs``][sqla_jobs.ops.delete_jobs] and
    [``jobs_to_delete``][sqla_jobs.ops.jobs_to_delete]."""
    ids_ = _ids(ids)
    _check_filters(ids_, kind, queue)
    statuses = _statuses(status)
    if statuses is None:
        if ids_ is None:
            raise ConfigError("delete needs job ids or a --status filter")
        statuses = list(_DELETABLE)
    if JobStatus.RUNNING in statuses:
        raise ConfigError(
            "running jobs cannot be deleted: cancel them (sqla-jobs cancel ID, ops.cancel) "
            "and delete them once they are cancelled"
        )
    return {
        "statuses": statuses,
        "ids": ids_,
        "kind": kind,
        "queue": queue,
        "older_than": _seconds("older_than", older_than),
    }


# --- throughput and the audit trail (the dashboard; revision 0009) -------------------


@dataclass(frozen=True)
class MinuteCount:
    """Jobs that ended in one minute: ``done``, and ``dead`` (failed for good)."""

    minute: datetime
    done: int
    dead: int


@dataclass(frozen=True)
class Throughput:
    """Done and dead jobs per minute, oldest minute first, the current one last.

    ``minutes`` has one entry for each minute of the window, zero where nothing ended.
    """

    taken_at: datetime
    minutes: tuple[MinuteCount, ...]


#: Longest window ``throughput`` reads, in minutes (a day).
MAX_THROUGHPUT_MINUTES = 1440


@_sessions.sync_form
def throughput(session: Session, minutes: int = 60) -> Throughput:
    """Done and dead jobs per minute over the last ``minutes`` (the current minute included).

    A range on jobs_finished_idx for each status: the cost follows what finished in the
    window, never the table's history. Runs in the session's transaction.
    """
    span = _positive_int("minutes", minutes, MAX_THROUGHPUT_MINUTES)
    found: dict[datetime, tuple[int, int]] = {}
    for row in session.execute(_throughput_now(span)):
        taken_at = row.taken_at
        if row.minute is not None:
            found[row.minute] = (int(row.done), int(row.dead))
    last = taken_at.replace(second=0, microsecond=0)
    window = [last - timedelta(minutes=n) for n in range(span - 1, -1, -1)]
    return Throughput(
        taken_at=taken_at,
        minutes=tuple(MinuteCount(m, *found.get(m, (0, 0))) for m in window),
    )


@dataclass(frozen=True)
class AuditEntry:
    """One recorded action (``jobs_audit``): who (``actor``) did what to which target, when."""

    id: int
    at: datetime
    actor: str
    action: str
    scope: str
    target: str
    detail: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))  # type: ignore[no-any-return]


#: Longest ``actor`` and ``action`` text ``record_action`` accepts.
MAX_AUDIT_TEXT = 200


def _audit_scope(scope: str) -> str:
    if scope not in models.AUDIT_SCOPES:
        raise ConfigError(f"unknown audit scope {scope!r}: use one of {models.AUDIT_SCOPES}")
    return scope


def _audit_text(name: str, value: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_AUDIT_TEXT:
        raise ConfigError(
            f"{name} must be a non-empty string of at most {MAX_AUDIT_TEXT} characters, "
            f"got {value!r}"
        )
    return value


def _audit_schema_error(exc: sa_exc.ProgrammingError) -> SchemaNotReadyError:
    return SchemaNotReadyError(
        "cannot use the audit trail (jobs_audit); run `alembic upgrade heads` "
        f"(revision 0009): {exceptions.db_error_text(exc)}"
    )


@_sessions.sync_form
def record_action(
    session: Session,
    *,
    actor: str,
    action: str,
    scope: str,
    target: str | int,
    detail: Mapping[str, Any] | None = None,
) -> int:
    """Record that ``actor`` did ``action`` to ``target`` (a job id, a queue or a kind name;
    ``scope`` says which: ``job``, ``jobs``, ``queue`` or ``kind``); return the entry's id.

    Call it in the transaction of the action, so the entry commits (or rolls back) with
    it. ``detail`` is a JSON object of what was asked and done. Never commits.
    """
    text = json.dumps(dict(detail), default=str) if detail is not None else None
    stmt = audit_sql.record(
        actor=_audit_text("actor", actor),
        action=_audit_text("action", action),
        scope=_audit_scope(scope),
        target=_audit_text("target", str(target)),
        detail=text,
    )
    try:
        return int(session.execute(stmt).scalar_one())
    except sa_exc.ProgrammingError as exc:
        raise _audit_schema_error(exc) from None


@_sessions.sync_form
def audit_log(
    session: Session,
    *,
    scope: str | Sequence[str] | None = None,
    target: str | int | None = None,
    limit: int = DEFAULT_LIMIT,
    before_id: int | None = None,
) -> list[AuditEntry]:
    """Recorded actions, newest first; those of one ``scope`` (or of several, as
    ``("queue", "kind")``; and ``target``) if given.

    Pages by keyset: pass the last entry's id as ``before_id``.
    """
    if target is not None and scope is None:
        raise ConfigError("audit_log: a target needs its scope (job, jobs, queue or kind)")
    scopes: str | tuple[str, ...] | None = None
    if isinstance(scope, str):
        scopes = _audit_scope(scope)
    elif scope is not None:
        scopes = tuple(_audit_scope(s) for s in dict.fromkeys(scope))
        if not scopes:
            raise ConfigError("audit_log: scope names no scope")
    params = {
        "target": None if target is None else str(target),
        "limit": _positive_int("limit", limit, MAX_LIMIT),
        "before_id": None if before_id is None else _non_negative_id(before_id, "before_id"),
    }
    stmt = _audit_entries(scopes, target is not None, before_id is not None)
    try:
        found = session.execute(stmt, {k: v for k, v in params.items() if v is not None}).all()
    except sa_exc.ProgrammingError as exc:
        raise _audit_schema_error(exc) from None
    return [AuditEntry(**row._asdict()) for row in found]


@functools.lru_cache(maxsize=32)
def _audit_entries(
    scope: str | tuple[str, ...] | None, by_target: bool, before: bool
) -> sa.Select[Any]:
    """[``audit_log``][sqla_jobs.ops.audit_log]'s statement, built once per shape: its target, limit
    and
    before_id are the execution's parameters."""
    return audit_sql.entries(
        scope=scope, target="" if by_target else None, limit=1, before_id=0 if before else None
    )


# --- the async twins (see sqla_jobs._sessions) --------------------------------------------
# Each runs the function above on the AsyncSession's own Session, in its transaction: the
# same statements, for an async app's endpoint or test (``await ops.pause_async(session,
# "emails")``). archive_async and prune_async commit each batch, like their sync forms.


# --- workflows (#26) ------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowStep:
    """One step of a workflow: its job, state, and the dependencies it still waits on."""

    id: int
    step: str | None
    kind: str
    status: JobStatus
    last_error: str | None
    waiting_on: tuple[str, ...]
    archived: bool
    #: Every dependency (by step name; a deleted one by its job id), ended or not, in job
    #: id order: the graph's edges into this step. Empty for an archived step (its edges
    #: went with it). ``waiting_on`` is in the same order.
    depends_on: tuple[str, ...] = ()
    #: Attempts and snoozes of its current run (0 after a retry by hand).
    attempts: int = 0
    snoozes: int = 0

    @property
    def current_error(self) -> str | None:
        """``last_error`` while it is the step's state (dead, cancelled, queued for
        another attempt); None once the step ran again since (a retried step now
        ``done``, ``waiting`` or ``queued`` afresh): ``last_error`` is then history, as
        for [``JobRecord.current_error``][sqla_jobs.ops.JobRecord.current_error]."""
        return _current_error(self.status, self.attempts, self.snoozes, self.last_error)


@dataclass(frozen=True)
class WorkflowStatus:
    """A workflow's steps (in id order) and how many are in each status."""

    id: uuid.UUID
    steps: tuple[WorkflowStep, ...]

    @property
    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for step in self.steps:
            found[step.status.value] = found.get(step.status.value, 0) + 1
        return found

    @property
    def finished(self) -> bool:
        """True once no step waits, is queued or runs."""
        return all(s.status in models.FINISHED_STATUSES for s in self.steps)

    @property
    def archived(self) -> bool:
        """True when every step is in ``jobs_archive``: read-only."""
        return all(s.archived for s in self.steps)


def _workflow_id(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ConfigError(f"a workflow id is a UUID, got {value!r}") from None


def _workflow_step(r: Any) -> WorkflowStep:
    return WorkflowStep(
        id=r.id,
        step=r.step,
        kind=r.kind,
        status=JobStatus(r.status),
        last_error=r.last_error,
        waiting_on=tuple(r.waiting_on or ()),
        archived=r.archived,
        depends_on=tuple(r.depends_on or ()),
        attempts=r.attempts,
        snoozes=r.snoozes,
    )


def _workflow_steps(session: Session, workflow_id: uuid.UUID) -> tuple[WorkflowStep, ...]:
    found = session.execute(workflows_sql.steps(workflow_id)).all()
    if not found:
        raise JobNotFoundError(f"no workflow with id {workflow_id}")
    return tuple(_workflow_step(r) for r in found)


@dataclass(frozen=True)
class WorkflowPage:
    """One page of a workflow's steps ([``workflow_page``][sqla_jobs.ops.workflow_page]), with the
    whole workflow's
    counts."""

    id: uuid.UUID
    #: Every step of the workflow (live and archived) by status.
    counts: dict[str, int]
    #: This page's steps, in id order (a step comes after every step it depends on).
    steps: tuple[WorkflowStep, ...]
    #: True when steps with higher ids follow: pass the last one's id as ``after_id``.
    more: bool
    #: How many of its steps are in ``jobs_archive``.
    archived_steps: int = 0

    @property
    def size(self) -> int:
        return sum(self.counts.values())

    @property
    def archived(self) -> bool:
        """True when every step is in ``jobs_archive`` (the archiver moves a finished
        workflow as a unit): there is nothing left to cancel or retry."""
        return self.archived_steps == self.size

    @property
    def finished(self) -> bool:
        """True once no step waits, is queued or runs."""
        return not any(self.counts.get(s.value) for s in workflows_sql.OPEN_STATUSES)


@_sessions.sync_form
def workflow_page(
    session: Session,
    workflow_id: uuid.UUID | str,
    *,
    after_id: int | None = None,
    limit: int = DEFAULT_LIMIT,
) -> WorkflowPage:
    """One page of a workflow's steps (live or archived) in id order, from a keyset
    cursor (``after_id``: the last id of the previous page), and how many steps of the
    whole workflow are in each status: [``workflow_status``][sqla_jobs.ops.workflow_status] for a
    workflow too big
    to read at once. [``JobNotFoundError``][sqla_jobs.JobNotFoundError] if no step has this id."""
    wid = _workflow_id(workflow_id)
    limit = _positive_int("limit", limit, MAX_LIMIT)
    after = None if after_id is None else _non_negative_id(after_id)
    by_status = session.execute(workflows_sql.step_counts(wid)).all()
    if not by_status:
        raise JobNotFoundError(f"no workflow with id {wid}")
    counts = {JobStatus(r.status).value: r.n for r in by_status}
    found = session.execute(workflows_sql.step_page(wid, after_id=after, limit=limit + 1)).all()
    steps = tuple(_workflow_step(r) for r in found[:limit])
    archived = sum(r.archived for r in by_status)
    return WorkflowPage(wid, counts, steps, more=len(found) > limit, archived_steps=archived)


@_sessions.sync_form
def workflow_status(session: Session, workflow_id: uuid.UUID | str) -> WorkflowStatus:
    """Every step of a workflow (live or archived), its status and what it waits on.

    [``JobNotFoundError``][sqla_jobs.JobNotFoundError] if no step has this workflow id.
    """
    wid = _workflow_id(workflow_id)
    return WorkflowStatus(wid, _workflow_steps(session, wid))


@_sessions.sync_form
def cancel_workflow(session: Session, workflow_id: uuid.UUID | str) -> CancelResult:
    """Cancel a whole workflow in the session's transaction: its waiting and queued steps
    end ``cancelled``, its running steps are asked to stop (as [``cancel``][sqla_jobs.ops.cancel]
    does).
    Never commits."""
    wid = _workflow_id(workflow_id)
    _workflow_steps(session, wid)  # JobNotFoundError for an unknown id
    # Running steps first: a worker ending one locks it, then (its release trigger) its
    # waiting dependents; taking the rows in the same order cannot deadlock with it.
    running = list(session.execute(workflows_sql.running_steps(wid)).scalars())
    stopping: tuple[int, ...] = ()
    if running:
        stopping = tuple(r.id for r in session.execute(admin.request_cancel(ids=running)))
    cancelled = tuple(sorted(r.id for r in session.execute(workflows_sql.cancel_workflow(wid))))
    return CancelResult(cancelled, stopping)


#: ``retry_workflow(mode=...)``: the steps that ended dead or cancelled, or those and
#: every step downstream of them (done ones included).
RETRY_MODES = ("failed", "failed_and_downstream")


@_sessions.sync_form
def retry_workflow(
    session: Session, workflow_id: uuid.UUID | str, *, mode: str = "failed"
) -> tuple[int, ...]:
    """Run a workflow's failed steps again; returns the ids of the steps retried.

    ``mode="failed"``: every step that ended dead or cancelled (a step cancelled because
    of its dependency is one); ``"failed_and_downstream"``: those and every step that
    depends on one of them, transitively, done ones included. A retried step whose
    dependency is retried too waits for it again; the others are queued, ready now,
    with a fresh set of attempts. Never commits.
    """
    if mode not in RETRY_MODES:
        raise ConfigError(f"mode must be one of {', '.join(RETRY_MODES)}, got {mode!r}")
    wid = _workflow_id(workflow_id)
    _workflow_steps(session, wid)
    ids = list(
        session.execute(
            workflows_sql.retry_set(wid, downstream=mode == "failed_and_downstream")
        ).scalars()
    )
    if not ids:
        return ()
    session.execute(workflows_sql.reopen_edges(ids))
    return tuple(sorted(r.id for r in session.execute(workflows_sql.reopen_steps(ids))))


@dataclass(frozen=True)
class WorkflowSummary:
    """One workflow as [``list_workflows``][sqla_jobs.ops.list_workflows] reads it: its steps (live
    and archived)
    counted by status, when its first step was created and when its last one ended."""

    id: uuid.UUID
    size: int
    #: Steps by status (only statuses some step is in).
    counts: dict[str, int]
    created_at: datetime
    #: When its last step ended; None while a step waits, is queued or runs.
    finished_at: datetime | None
    #: How many of its steps are in ``jobs_archive`` (all of them once it was archived:
    #: the archiver moves a finished workflow as a unit).
    archived_steps: int = 0

    @property
    def archived(self) -> bool:
        """True when every step is in ``jobs_archive``: shown read-only."""
        return self.archived_steps == self.size

    @property
    def finished(self) -> bool:
        """True once no step waits, is queued or runs."""
        return not any(self.counts.get(s.value) for s in workflows_sql.OPEN_STATUSES)

    @property
    def failed(self) -> int:
        """How many steps ended dead or cancelled."""
        return self.counts.get("dead", 0) + self.counts.get("cancelled", 0)

    @property
    def state(self) -> str:
        """``running`` while a step has not ended, then ``failed`` if a step ended dead or
        cancelled, else ``succeeded``."""
        if not self.finished:
            return "running"
        return "failed" if self.failed else "succeeded"

    def to_dict(self) -> dict[str, Any]:
        data = _jsonable(asdict(self))
        data["state"] = self.state
        data["archived"] = self.archived
        return data  # type: ignore[no-any-return]


#: ``list_workflows(state=...)``: a step not ended yet; every step ended; a step ended
#: dead or cancelled (the workflow running or not).
WORKFLOW_STATES = workflows_sql.LIST_STATES


@_sessions.sync_form
def list_workflows(
    session: Session,
    *,
    state: str | None = None,
    limit: int = DEFAULT_LIMIT,
    before: uuid.UUID | str | None = None,
) -> list[WorkflowSummary]:
    """One page of workflows, newest first: each one's id, size, steps by status, and
    when it was created and finished.

    ``state``: ``"running"`` (a step waits, is queued or runs), ``"finished"`` (every
    step ended) or ``"failed"`` (a step ended dead or cancelled, whether or not the rest
    still runs). Pages by keyset: pass the last id of a page as ``before`` for the next
    one. Newest first is by workflow id, which is time-ordered (a UUID version 7 made
    at enqueue, by the enqueuing host's clock). Archived workflows are listed too
    (``archived``; ``state="running"`` never has one). A page reads its workflows'
    steps (one aggregate each, in both tables) and one index descent per workflow and
    table, not the tables (revisions 0015, 0016).
    """
    if state is not None and state not in WORKFLOW_STATES:
        raise ConfigError(f"state must be one of {', '.join(WORKFLOW_STATES)}, got {state!r}")
    limit = _positive_int("limit", limit, MAX_LIMIT)
    params: dict[str, Any] = {"limit": limit}
    if before is not None:
        params["before"] = _workflow_id(before)
    stmt = workflows_sql.list_workflows(state=state, before=before is not None)
    # JIT off for this statement only (see sql.workflows.set_jit), then as it was.
    jit = session.execute(workflows_sql.set_jit("off")).scalar_one()
    try:
        found = session.execute(stmt, params).all()
    finally:
        session.execute(workflows_sql.set_jit(jit))
    return [
        WorkflowSummary(
            id=row.id,
            size=row.size,
            counts={s.value: getattr(row, s.value) for s in JobStatus if getattr(row, s.value)},
            created_at=row.created_at,
            finished_at=row.finished_at,
            archived_steps=row.archived,
        )
        for row in found
    ]


check_schema_async = _sessions.async_form(check_schema)
stats_async = _sessions.async_form(stats)
health_async = _sessions.async_form(health)
periodic_statuses_async = _sessions.async_form(periodic_statuses)
list_jobs_async = _sessions.async_form(list_jobs)
get_job_async = _sessions.async_form(get_job)
job_states_async = _sessions.async_form(job_states)
retry_jobs_async = _sessions.async_form(retry_jobs)
cancel_async = _sessions.async_form(cancel)
cancel_jobs_async = _sessions.async_form(cancel_jobs)
result_async = _sessions.async_form(result)
delete_jobs_async = _sessions.async_form(delete_jobs)
jobs_to_delete_async = _sessions.async_form(jobs_to_delete)
archive_async = _sessions.async_form(archive)
prepare_archive_async = _sessions.async_form(prepare_archive)
prune_async = _sessions.async_form(prune)
prune_counts_async = _sessions.async_form(prune_counts)
archive_partitions_async = _sessions.async_form(archive_partitions)
pause_async = _sessions.async_form(pause)
resume_async = _sessions.async_form(resume)
unserved_async = _sessions.async_form(unserved)
set_limit_async = _sessions.async_form(set_limit)
clear_limits_async = _sessions.async_form(clear_limits)
controls_async = _sessions.async_form(controls)
workflow_status_async = _sessions.async_form(workflow_status)
cancel_workflow_async = _sessions.async_form(cancel_workflow)
retry_workflow_async = _sessions.async_form(retry_workflow)
list_workflows_async = _sessions.async_form(list_workflows)
workflow_page_async = _sessions.async_form(workflow_page)
workers_async = _sessions.async_form(workers)
throughput_async = _sessions.async_form(throughput)
record_action_async = _sessions.async_form(record_action)
audit_log_async = _sessions.async_form(audit_log)
