"""``ops.health``: is anything making the queue slow now, or about to (issue #25)?

The queue lives in the app's database, so the app can hurt it: a transaction left open
(an idle-in-transaction session, a long report, a forgotten prepared transaction, a
replication slot nobody reads) pins the MVCC horizon, vacuum cannot remove the queue's
dead rows, and every claim walks them. ``health`` reads, in one short read-only
transaction on a connection of its own, what holds the horizon, the queue tables' dead
and live tuples, last (auto)vacuum and analyze and sizes, leases that expired, the oldest
ready job's wait, and workers whose heartbeat stopped; each check compares one figure
with its threshold (``HealthThresholds``, defaults below) and a figure over its
threshold is a ``Finding`` that says what to do. Every statement reads catalog
views or the live-job partial indexes (``sqla_jobs.sql.health``): cheap however long
the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from sqla_jobs import exceptions, validation
from sqla_jobs.exceptions import ConfigError, SchemaNotReadyError
from sqla_jobs.models import jobs, jobs_archive, worker_records
from sqla_jobs.sql import health as health_sql
from sqla_jobs.sql import schema

#: A transaction (or prepared transaction) open longer than this holds the horizon
#: too long. Defaults to 5 minutes.
DEFAULT_MAX_TRANSACTION_AGE = timedelta(minutes=5)
#: A replication slot holding the horizon this many transactions back. Defaults to
#: 1,000,000 (an inactive slot is a finding whatever it holds: it keeps its WAL).
DEFAULT_MAX_SLOT_XID_AGE = 1_000_000
#: Dead tuples in one queue table, when they are also over ``max_dead_ratio`` of its
#: tuples. Defaults to 50,000 (claims slowed tenfold at 24k in PlanetScale's test).
DEFAULT_MAX_DEAD_TUPLES = 50_000
#: Share of dead tuples among a table's tuples. Defaults to 0.2.
DEFAULT_MAX_DEAD_RATIO = 0.2
#: A table with at least VACUUM_MIN_DEAD dead tuples not vacuumed (by hand or by
#: autovacuum) for this long. Defaults to 1 day.
DEFAULT_MAX_VACUUM_AGE = timedelta(days=1)
VACUUM_MIN_DEAD = 1_000
#: Size of the hot ``jobs`` table with its indexes. Defaults to 2 GiB: archive.
DEFAULT_MAX_JOBS_TABLE_BYTES = 2 * 1024**3
#: A ``jobs`` table over its size limit whose live rows (count x average width) fill
#: less than this share of its heap is bloated: archiving will not shrink it.
BLOAT_LIVE_SHARE = 0.25
#: Running jobs whose lease expired over LEASE_GRACE ago. Defaults to 0.
DEFAULT_MAX_EXPIRED_LEASES = 0
LEASE_GRACE = timedelta(minutes=1)
#: Wait of the oldest ready job. Defaults to 5 minutes.
DEFAULT_MAX_READY_AGE = timedelta(minutes=5)
#: A registered worker whose last heartbeat is older than this. Defaults to 1 minute
#: (a worker beats every third of its lock_seconds, 10 s by default).
DEFAULT_MAX_HEARTBEAT_AGE = timedelta(minutes=1)

#: Every check's name, as ``Finding.check`` spells it.
CHECKS = (
    *("transaction", "prepared", "slot", "dead_tuples", "vacuum", "table_size"),
    *("expired_leases", "ready_age", "stale_workers", "visibility"),
)
#: The queue's tables whose tuples, vacuum and sizes are reported.
TABLES = (jobs.name, jobs_archive.name, worker_records.name)

_END_IT = (
    "end it (SELECT pg_terminate_backend({pid}); another role's session takes a superuser, "
    "a member of that role or of pg_signal_backend) and make the app close its transactions; "
)
_IDLE_ADVICE = _END_IT + (
    "set idle_in_transaction_session_timeout (and transaction_timeout on PostgreSQL 17+) "
    "for the app's role so it cannot happen again"
)
_ACTIVE_ADVICE = _END_IT + (
    "it is running a statement, and on PostgreSQL 15-16 neither "
    "idle_in_transaction_session_timeout nor transaction_timeout (17+ only) stops an active "
    "transaction: set statement_timeout for the app's role (ALTER ROLE app IN DATABASE ... "
    "SET statement_timeout = '1min'), and transaction_timeout on PostgreSQL 17+"
)


@dataclass(frozen=True)
class HealthThresholds:
    """The limit of each check (see the module's DEFAULT_* constants); validated once."""

    max_transaction_age: timedelta = DEFAULT_MAX_TRANSACTION_AGE
    max_slot_xid_age: int = DEFAULT_MAX_SLOT_XID_AGE
    max_dead_tuples: int = DEFAULT_MAX_DEAD_TUPLES
    max_dead_ratio: float = DEFAULT_MAX_DEAD_RATIO
    max_vacuum_age: timedelta = DEFAULT_MAX_VACUUM_AGE
    max_jobs_table_bytes: int = DEFAULT_MAX_JOBS_TABLE_BYTES
    max_expired_leases: int = DEFAULT_MAX_EXPIRED_LEASES
    max_ready_age: timedelta = DEFAULT_MAX_READY_AGE
    max_heartbeat_age: timedelta = DEFAULT_MAX_HEARTBEAT_AGE

    def __post_init__(self) -> None:
        for name in ("max_transaction_age", "max_vacuum_age", "max_ready_age"):
            self._duration(name)
        self._duration("max_heartbeat_age")
        for name in ("max_slot_xid_age", "max_dead_tuples", "max_jobs_table_bytes"):
            validation.integer(name, getattr(self, name), minimum=0, error=ConfigError)
        validation.integer(
            "max_expired_leases", self.max_expired_leases, minimum=0, error=ConfigError
        )
        ratio = validation.number("max_dead_ratio", self.max_dead_ratio, error=ConfigError)
        if ratio > 1:
            raise ConfigError(f"max_dead_ratio must be between 0 and 1, got {ratio}")

    def _duration(self, name: str) -> None:
        value = getattr(self, name)
        if not isinstance(value, timedelta):
            raise ConfigError(
                f"{name} must be a timedelta (e.g. timedelta(minutes=5)), got {value!r}"
            )
        validation.seconds(name, value, numbers=False, error=ConfigError)


@dataclass(frozen=True)
class HorizonHolder:
    """Something keeping vacuum from removing dead rows: a session, a slot or a
    prepared transaction. ``name`` is the pid, slot name or gid; ``age_seconds`` is
    how long its transaction has been open (None for a slot: slots have no clock; None
    too for another role's session the reader may not see, ``detail["hidden"]``);
    ``xid_age`` how many transactions back it holds the horizon (None for an inactive
    slot without an xmin, listed for the WAL it keeps: ``detail["retained_wal_bytes"]``)."""

    holder: str  # "session", "slot" or "prepared"
    name: str
    age_seconds: float | None
    xid_age: int | None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TableHealth:
    """One queue table: ``pg_stat_user_tables`` figures and its sizes in bytes (a
    partitioned table, ``jobs_archive`` since revision 0022: its partitions summed,
    vacuum times the oldest among those with dead rows)."""

    name: str
    live_tuples: int
    dead_tuples: int
    updates: int
    hot_updates: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_analyze: datetime | None
    last_autoanalyze: datetime | None
    table_bytes: int
    index_bytes: int
    #: The server's ``autovacuum`` setting is on.
    server_autovacuum: bool = True
    #: No partition of it (or the table) has ``autovacuum_enabled`` set to false.
    table_autovacuum: bool = True

    @property
    def dead_ratio(self) -> float:
        total = self.live_tuples + self.dead_tuples
        return self.dead_tuples / total if total else 0.0

    @property
    def last_vacuumed(self) -> datetime | None:
        moments = [m for m in (self.last_vacuum, self.last_autovacuum) if m is not None]
        return max(moments) if moments else None


@dataclass(frozen=True)
class StaleWorker:
    id: str
    host: str
    pid: int
    heartbeat_at: datetime
    age_seconds: float
    #: When its lease expires: ``sqla-jobs workers`` lists it until then.
    expires_at: datetime | None = None


@dataclass(frozen=True)
class Finding:
    """A check over its threshold: ``check`` names it (``transaction``, ``slot``,
    ``prepared``, ``dead_tuples``, ``vacuum``, ``table_size``, ``expired_leases``,
    ``ready_age``, ``stale_workers``, ``visibility``), ``subject`` what it is about,
    ``advice`` what to do."""

    check: str
    subject: str
    message: str
    advice: str


@dataclass(frozen=True)
class Health:
    """One look at the queue's health, as of ``taken_at`` (the database's clock).

    ``reader``: the role that read it; ``sees_other_roles``: whether it is a superuser
    or a member of ``pg_read_all_stats`` (else other roles' transaction ages are
    hidden, a ``visibility`` finding); ``stats_since``: when this database's statistics
    began (its last reset, else the server's start); ``oldest_ready_queue`` and
    ``oldest_ready_kind``: the oldest ready job's; ``live_workers``: registered workers
    that beat within ``max_heartbeat_age``; ``jobs_row_bytes``: a live ``jobs`` row's
    average size per ``pg_stats`` (None before its first ANALYZE).
    """

    taken_at: datetime
    thresholds: HealthThresholds
    horizon: tuple[HorizonHolder, ...]
    tables: tuple[TableHealth, ...]
    expired_leases: int
    oldest_expired_lease_seconds: float | None
    oldest_ready_seconds: float | None
    stale_workers: tuple[StaleWorker, ...]
    findings: tuple[Finding, ...]
    reader: str = ""
    sees_other_roles: bool = True
    stats_since: datetime | None = None
    oldest_ready_queue: str | None = None
    oldest_ready_kind: str | None = None
    live_workers: int = 0
    jobs_row_bytes: int | None = None

    @property
    def ok(self) -> bool:
        """True when no check crossed its threshold."""
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO 8601 text, durations in seconds."""
        data = asdict(self)
        data["thresholds"] = {
            k: v.total_seconds() if isinstance(v, timedelta) else v
            for k, v in data["thresholds"].items()
        }
        for table, entry in zip(self.tables, data["tables"], strict=True):
            entry["dead_ratio"] = table.dead_ratio
        data["ok"] = self.ok
        return _jsonable(data)  # type: ignore[no-any-return]


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def health(session: Session, /, **thresholds: Any) -> Health:
    """Read the queue's health; ``thresholds`` override ``HealthThresholds``' defaults
    (``health(session, max_transaction_age=timedelta(minutes=1))``).

    Reads on a connection of its own from the session's engine, in one short read-only
    transaction (left out of the horizon it reports); the session's transaction is not
    touched. Raises ConfigError for an unknown or bad threshold.
    """
    limits = _thresholds(thresholds)
    bind = session.get_bind()
    engine = bind if isinstance(bind, sa.Engine) else bind.engine
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            found = _read(conn, limits)
            conn.rollback()
    except sa_exc.ProgrammingError as exc:
        raise SchemaNotReadyError(
            f"cannot read the jobs tables; {schema.UPGRADE}: {exceptions.db_error_text(exc)}"
        ) from None
    return found


def _thresholds(given: dict[str, Any]) -> HealthThresholds:
    known = HealthThresholds.__dataclass_fields__
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(f"unknown health threshold {', '.join(unknown)}: use {', '.join(known)}")
    return HealthThresholds(**given)


def _read(conn: sa.Connection, limits: HealthThresholds) -> Health:
    taken_at = conn.execute(sa.select(sa.func.statement_timestamp())).scalar_one()
    reader = conn.execute(health_sql.reader()).one()
    horizon = (
        *(_session_holder(r) for r in conn.execute(health_sql.horizon_sessions())),
        *(_slot_holder(r) for r in conn.execute(health_sql.horizon_slots())),
        *(_prepared_holder(r) for r in conn.execute(health_sql.horizon_prepared())),
    )
    tables = tuple(TableHealth(**r._asdict()) for r in conn.execute(health_sql.tables(TABLES)))
    grace = LEASE_GRACE.total_seconds()
    leases = conn.execute(health_sql.expired_leases(grace, taken_at)).one()
    oldest_ready = conn.execute(health_sql.oldest_ready(taken_at)).first()
    heartbeat_age = limits.max_heartbeat_age.total_seconds()
    stale = tuple(
        StaleWorker(**r._asdict())
        for r in conn.execute(health_sql.stale_workers(heartbeat_age, taken_at))
    )
    live = conn.execute(health_sql.live_workers(heartbeat_age, taken_at)).scalar_one()
    row_bytes = conn.execute(health_sql.average_row_bytes(jobs.name)).scalar_one()
    snapshot = Health(
        taken_at=taken_at,
        thresholds=limits,
        horizon=horizon,
        tables=tables,
        expired_leases=int(leases.expired),
        oldest_expired_lease_seconds=_float(leases.oldest_seconds),
        oldest_ready_seconds=None if oldest_ready is None else _float(oldest_ready.seconds),
        stale_workers=stale,
        findings=(),
        reader=reader.role,
        sees_other_roles=bool(reader.sees_all),
        stats_since=reader.stats_since,
        oldest_ready_queue=None if oldest_ready is None else oldest_ready.queue,
        oldest_ready_kind=None if oldest_ready is None else oldest_ready.kind,
        live_workers=int(live),
        jobs_row_bytes=_int(row_bytes),
    )
    return Health(**{**_fields(snapshot), "findings": tuple(_findings(snapshot, limits))})


def _fields(snapshot: Health) -> dict[str, Any]:
    return {name: getattr(snapshot, name) for name in Health.__dataclass_fields__}


def _float(value: Any) -> float | None:
    return None if value is None else max(0.0, float(value))


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _session_holder(row: Any) -> HorizonHolder:
    detail = {
        "user": row.user,
        "application_name": row.application_name,
        "backend_type": row.backend_type,
        "state": row.state,
        "xact_start": row.xact_start,
        "query_start": row.query_start,
        "query": row.query,
        # Another role's session, read without pg_read_all_stats: no state, query or
        # transaction start (its backend_xmin and xid are public).
        "hidden": row.xact_start is None,
    }
    return HorizonHolder(
        "session", str(row.pid), _float(row.age_seconds), _int(row.xid_age), detail
    )


def _slot_holder(row: Any) -> HorizonHolder:
    detail = {
        "slot_type": row.slot_type,
        "active": row.active,
        "retained_wal_bytes": _int(row.retained_wal_bytes),
    }
    return HorizonHolder("slot", row.slot_name, None, _int(row.xid_age), detail)


def _prepared_holder(row: Any) -> HorizonHolder:
    detail = {"owner": row.owner, "prepared": row.prepared}
    return HorizonHolder("prepared", row.gid, _float(row.age_seconds), _int(row.xid_age), detail)


def _age_text(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _findings(h: Health, limits: HealthThresholds) -> Sequence[Finding]:
    found = [*_visibility_findings(h), *_horizon_findings(h.horizon, limits)]
    for table in h.tables:
        found.extend(_table_findings(table, h, limits))
    if h.expired_leases > limits.max_expired_leases:
        found.append(
            Finding(
                "expired_leases",
                "jobs",
                f"{h.expired_leases} running jobs' leases expired over "
                f"{_age_text(LEASE_GRACE.total_seconds())} ago (oldest "
                f"{_age_text(h.oldest_expired_lease_seconds or 0)}), over "
                f"{limits.max_expired_leases}",
                "their workers died and no live worker rescues them: start a worker "
                "(every worker rescues expired leases), or check `sqla-jobs workers`",
            )
        )
    ready_limit = limits.max_ready_age.total_seconds()
    if h.oldest_ready_seconds is not None and h.oldest_ready_seconds > ready_limit:
        found.append(
            Finding(
                "ready_age",
                "jobs",
                f"the oldest ready job (queue {h.oldest_ready_queue!r}, kind "
                f"{h.oldest_ready_kind!r}) has waited {_age_text(h.oldest_ready_seconds)}, "
                f"over {_age_text(ready_limit)}",
                (
                    "no worker is live and on time (`sqla-jobs workers` lists none, or only "
                    f"late ones: stale_workers): start one that serves queue "
                    f"{h.oldest_ready_queue!r}"
                    if not h.live_workers
                    else f"workers are behind or none serves queue {h.oldest_ready_queue!r} "
                    f"or kind {h.oldest_ready_kind!r}: see `sqla-jobs stats` (unserved "
                    "queues, paused queues and kinds, limits) and `sqla-jobs workers`, "
                    "and add workers or concurrency"
                ),
            )
        )
    for worker in h.stale_workers:
        listed = worker.expires_at is not None and worker.expires_at >= h.taken_at
        found.append(
            Finding(
                "stale_workers",
                worker.id,
                f"worker {worker.id} (pid {worker.pid} on {worker.host}) last beat "
                f"{_age_text(worker.age_seconds)} ago, over "
                f"{_age_text(limits.max_heartbeat_age.total_seconds())}",
                "the process is hung or gone: check it on its host; its jobs come back "
                "to the queue when their leases expire and a live worker rescues them"
                + (
                    f"; `sqla-jobs workers` lists it until its lease expires at "
                    f"{worker.expires_at.isoformat(timespec='seconds')}"
                    if listed and worker.expires_at is not None
                    else "; its lease expired: `sqla-jobs workers` no longer lists it"
                )
                + ("" if h.live_workers else "; no other worker is live and on time: start one"),
            )
        )
    return found


def _horizon_findings(holders: Sequence[HorizonHolder], limits: HealthThresholds) -> list[Finding]:
    found = []
    max_age = limits.max_transaction_age.total_seconds()
    for h in holders:
        if h.holder == "session" and (h.age_seconds or 0) > max_age:
            d = h.detail
            found.append(
                Finding(
                    "transaction",
                    f"pid {h.name}",
                    f"pid {h.name} ({d['application_name'] or 'no application_name'}, "
                    f"user {d['user']}, {d['state']}) has held a transaction open "
                    f"{_age_text(h.age_seconds or 0)} (over {_age_text(max_age)}), "
                    f"{h.xid_age} transactions behind: vacuum cannot remove dead rows "
                    "newer than its snapshot",
                    (_IDLE_ADVICE if _idle(d["state"]) else _ACTIVE_ADVICE).format(pid=h.name),
                )
            )
        elif h.holder == "prepared" and (h.age_seconds or 0) > max_age:
            found.append(
                Finding(
                    "prepared",
                    h.name,
                    f"prepared transaction {h.name!r} (owner {h.detail['owner']}) has been "
                    f"open {_age_text(h.age_seconds or 0)}, over {_age_text(max_age)}",
                    f"finish it: COMMIT PREPARED '{h.name}' or ROLLBACK PREPARED '{h.name}' "
                    "(its transaction manager lost track of it)",
                )
            )
        elif h.holder == "slot" and not h.detail["active"]:
            wal = h.detail.get("retained_wal_bytes")
            holds = "" if h.xid_age is None else f" and the horizon {h.xid_age} transactions back"
            found.append(
                Finding(
                    "slot",
                    h.name,
                    f"inactive {h.detail['slot_type']} replication slot {h.name!r} retains "
                    f"{'?' if wal is None else wal} bytes of WAL{holds}: nothing reads it, "
                    "and its WAL grows until the disk fills",
                    f"drop it if nobody reads it (SELECT pg_drop_replication_slot('{h.name}')); "
                    "else bring its standby or consumer back; set max_slot_wal_keep_size "
                    "so a slot cannot fill the disk",
                )
            )
        elif h.holder == "slot" and (h.xid_age or 0) > limits.max_slot_xid_age:
            found.append(
                Finding(
                    "slot",
                    h.name,
                    f"active replication slot {h.name!r} holds the horizon "
                    f"{h.xid_age} transactions back (over {limits.max_slot_xid_age})",
                    f"drop a slot nobody reads (SELECT pg_drop_replication_slot('{h.name}')); "
                    "for a lagging standby or consumer, fix it or turn off "
                    "hot_standby_feedback; set max_slot_wal_keep_size",
                )
            )
    return found


def _idle(state: str | None) -> bool:
    return (state or "").startswith("idle in transaction")


def _visibility_findings(h: Health) -> list[Finding]:
    if h.sees_other_roles:
        return []
    hidden = sum(1 for x in h.horizon if x.detail.get("hidden"))
    return [
        Finding(
            "visibility",
            h.reader,
            f"role {h.reader} is neither a superuser nor a member of pg_read_all_stats: "
            "health cannot see other roles' transaction ages, states and queries, so it "
            "cannot flag an old transaction of another role"
            + (f" ({hidden} horizon holder(s) hidden now)" if hidden else ""),
            f"as a superuser: GRANT pg_read_all_stats TO {h.reader}",
        )
    ]


def _table_findings(t: TableHealth, h: Health, limits: HealthThresholds) -> list[Finding]:
    found = []
    now = h.taken_at
    if t.dead_tuples > limits.max_dead_tuples and t.dead_ratio > limits.max_dead_ratio:
        found.append(
            Finding(
                "dead_tuples",
                t.name,
                f"{t.name} has {t.dead_tuples} dead tuples ({t.dead_ratio:.0%} of its rows), "
                f"over {limits.max_dead_tuples} and {limits.max_dead_ratio:.0%}",
                "if a transaction or slot holds the horizon (above), end it first; then "
                f"VACUUM (ANALYZE) {t.name}, and lower its autovacuum_vacuum_scale_factor",
            )
        )
    vacuumed = t.last_vacuumed
    vacuum_limit = limits.max_vacuum_age
    # A table never vacuumed is as old as the statistics that would record a vacuum:
    # a new database's tables are not "never vacuumed, over a day ago".
    since = vacuumed if vacuumed is not None else h.stats_since
    if t.dead_tuples >= VACUUM_MIN_DEAD and not (t.server_autovacuum and t.table_autovacuum):
        # No age needed: nothing but a VACUUM by hand will remove them.
        if not t.server_autovacuum:
            where = "on this server (autovacuum = off)"
            turn_on = "ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf()"
        else:
            where = f"for {t.name} (autovacuum_enabled = false)"
            turn_on = f"ALTER TABLE {t.name} RESET (autovacuum_enabled)"
        found.append(
            Finding(
                "vacuum",
                t.name,
                f"{t.name} has {t.dead_tuples} dead tuples and autovacuum is off {where}: "
                "nothing vacuums it",
                f"autovacuum is off: turn it on ({turn_on}), or VACUUM (ANALYZE) {t.name} "
                "from cron",
            )
        )
    elif t.dead_tuples >= VACUUM_MIN_DEAD and (since is None or now - since > vacuum_limit):
        when = (
            f"was last vacuumed {vacuumed.isoformat(timespec='seconds')}"
            if vacuumed is not None
            else "no vacuum recorded since "
            + ("statistics began" if since is None else since.isoformat(timespec="seconds"))
        )
        found.append(
            Finding(
                "vacuum",
                t.name,
                f"{t.name} has {t.dead_tuples} dead tuples and {when}, "
                f"over {_age_text(vacuum_limit.total_seconds())} ago",
                f"check that autovacuum runs (pg_stat_activity, autovacuum_max_workers); "
                f"VACUUM (ANALYZE) {t.name}",
            )
        )
    size = t.table_bytes + t.index_bytes
    if t.name == jobs.name and size > limits.max_jobs_table_bytes:
        live_bytes = None if h.jobs_row_bytes is None else t.live_tuples * h.jobs_row_bytes
        if live_bytes is not None and live_bytes < BLOAT_LIVE_SHARE * t.table_bytes:
            advice = (
                f"it is bloated: its {t.live_tuples} live rows take about {live_bytes} bytes, "
                "so archiving will not shrink it (the space is dead rows' and index "
                "entries'). For the indexes: REINDEX TABLE CONCURRENTLY jobs; for the heap: "
                "pg_repack, or VACUUM FULL jobs (takes an ACCESS EXCLUSIVE lock for the "
                "whole rewrite: downtime for enqueue and workers)"
            )
        else:
            advice = (
                "move finished jobs out of the hot table: `sqla-jobs archive --older-than 1d` "
                "(or workers' --archive-every 10 --archive-older-than 1d) and "
                "`sqla-jobs prune --older-than 90d` the archive"
            )
        found.append(
            Finding(
                "table_size",
                t.name,
                f"{t.name} and its indexes take {size} bytes, over {limits.max_jobs_table_bytes}",
                advice,
            )
        )
    return found
