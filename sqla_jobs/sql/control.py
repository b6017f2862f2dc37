"""Queue control (revision 0006): pauses and limits the claim obeys, and their upkeep.

``jobs_controls`` holds one row per paused or limited queue or kind. The claim
(``sqla_jobs.sql.lease.claim``) takes its queues and kinds through
``claimable``, which removes, inside the claim's own statement, every paused queue
or kind and every limited one whose lock the claim does not hold: a worker with a stale
idea of the controls can fail to claim, never claim what it must not.

A limited queue or kind is claimed in a transaction of its own that first takes a
transaction-level advisory lock keyed by it (``lock_key``), then reads what is
running and what started (``capacity``: a statement of its own, so its snapshot is
taken after the lock was granted and sees every claim committed before), then claims at
most the room left. Claims of one limited kind are thereby serialized across the fleet;
unlimited kinds never take the lock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, insert

from sqla_jobs.models import JobStatus, jobs, queue_controls, rate_starts
from sqla_jobs.sql import _common, locks

#: The two scopes a control applies to.
QUEUE = "queue"
KIND = "kind"
SCOPES = (QUEUE, KIND)


def lock_key(scope: str, name: str) -> int:
    """The advisory lock key (a signed bigint) that serializes claims of one scope."""
    digest = hashlib.blake2b(f"sqla_jobs:{scope}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _effective_concurrency() -> sa.ColumnElement[Any]:
    c = queue_controls.c
    return sa.func.coalesce(c.concurrency, c.declared_concurrency)


def _effective_rate() -> tuple[sa.ColumnElement[Any], sa.ColumnElement[Any]]:
    c = queue_controls.c
    return (
        sa.func.coalesce(c.rate_count, c.declared_rate_count),
        sa.func.coalesce(c.rate_seconds, c.declared_rate_seconds),
    )


def _limited() -> sa.ColumnElement[bool]:
    return sa.or_(_effective_concurrency().is_not(None), _effective_rate()[0].is_not(None))


def claimable(
    scope: str, values: Sequence[str], locked: Sequence[str], param: str
) -> sa.ColumnElement[Any]:
    """``ARRAY(values EXCEPT paused EXCEPT limited-but-not-locked)``, evaluated once per claim.

    An uncorrelated subquery: the planner runs it once (an InitPlan over the few rows of
    jobs_controls), not per candidate job.
    """
    c = queue_controls.c
    held_back = sa.select(c.name).where(
        c.scope == sa.literal(scope, sa.Text),
        sa.or_(
            c.paused,
            sa.and_(
                _limited(),
                c.name != sa.all_(sa.bindparam(f"locked_{param}", list(locked), ARRAY(sa.Text))),
            ),
        ),
    )
    wanted = sa.select(
        sa.func.unnest(sa.bindparam(param, list(values), ARRAY(sa.Text))).label("name")
    )
    return sa.func.array(wanted.except_(held_back).scalar_subquery(), type_=ARRAY(sa.Text))


def controls() -> sa.Select[Any]:
    """Every control row that pauses or limits something, with its effective limits."""
    c = queue_controls.c
    count, seconds = _effective_rate()
    return (
        sa.select(
            c.scope,
            c.name,
            c.paused,
            _effective_concurrency().label("concurrency"),
            count.label("rate_count"),
            seconds.label("rate_seconds"),
            c.concurrency.label("concurrency_override"),
            c.declared_concurrency,
            c.rate_count.label("rate_count_override"),
            c.rate_seconds.label("rate_seconds_override"),
            c.declared_rate_count,
            c.declared_rate_seconds,
            c.updated_at,
        )
        .where(sa.or_(c.paused, _limited()))
        .order_by(c.scope, c.name)
    )


def lock_scope(key: int) -> sa.Select[Any]:
    """``pg_advisory_xact_lock(key)``: held until the claim's transaction ends."""
    return sa.select(sa.func.pg_advisory_xact_lock(sa.bindparam("key", key, sa.BigInteger)))


def _running_elsewhere(worker: str) -> sa.ScalarSelect[Any]:
    """Jobs of the control row's scope running on workers other than ``worker``."""
    c = queue_controls.c
    in_scope = sa.or_(
        sa.and_(c.scope == KIND, jobs.c.kind == c.name),
        sa.and_(c.scope == QUEUE, jobs.c.queue == c.name),
    )
    return (
        sa.select(sa.func.count())
        .where(
            jobs.c.status == _common.status(JobStatus.RUNNING),
            jobs.c.worker.is_distinct_from(sa.bindparam("worker", worker, sa.Text)),
            in_scope,
        )
        .scalar_subquery()
    )


def _in_scopes(scopes: Sequence[tuple[str, str]]) -> sa.ColumnElement[bool]:
    c = queue_controls.c
    return sa.tuple_(c.scope, c.name).in_(
        [sa.tuple_(sa.literal(s, sa.Text), sa.literal(n, sa.Text)) for s, n in scopes]
    )


def capacity(
    *, worker: str, scopes: Sequence[tuple[str, str]], margin: float = 0.0
) -> sa.Select[Any]:
    """For each limited scope: its limits, jobs running on other workers, recent starts.

    Run after ``lock_scope``, in its own statement. ``running`` counts other workers'
    running jobs (read from jobs_status_id_idx, running rows only); the claiming worker
    adds its own from its ledger, where a job whose handler already returned no longer
    counts although its done-mark is still on the way. ``started`` sums the starts inside the
    rate window ending now (clock_timestamp(): the lock may have been waited for), the
    window made longer by a quarter of itself, up to ``margin`` seconds;
    ``next_start_in`` says in how many seconds the oldest of them leaves it.
    """
    c = queue_controls.c
    count, seconds = _effective_rate()
    window = seconds + sa.func.least(seconds / 4, sa.bindparam("margin", margin, sa.Float))
    window_start = sa.func.clock_timestamp() - _common.seconds(window)
    running = _running_elsewhere(worker)
    recent = sa.and_(
        rate_starts.c.scope == c.scope,
        rate_starts.c.name == c.name,
        rate_starts.c.started_at > window_start,
    )
    started = (
        sa.select(sa.func.coalesce(sa.func.sum(rate_starts.c.count), 0))
        .where(recent)
        .scalar_subquery()
    )
    oldest = sa.select(sa.func.min(rate_starts.c.started_at)).where(recent).scalar_subquery()
    return sa.select(
        c.scope,
        c.name,
        c.paused,
        _effective_concurrency().label("concurrency"),
        running.label("running"),
        count.label("rate_count"),
        seconds.label("rate_seconds"),
        started.label("started"),
        _common.epoch(oldest - window_start).label("next_start_in"),
    ).where(_in_scopes(scopes))


def room(*, worker: str, scopes: Sequence[tuple[str, str]]) -> sa.ScalarSelect[Any]:
    """How many jobs a claim of ``scopes`` may take, computed inside the claim's statement.

    The claim's LIMIT (``sqla_jobs.sql.lease.claim``, ``room=``), so that the claim
    of a group whose limits are concurrency only goes in the same round trip as its
    advisory locks and commit: ``least(:limit, concurrency - running elsewhere - mine)``
    over the scopes, where ``mine_kind`` / ``mine_queue`` are the claiming worker's own
    jobs of its kind and queue scope (its ledger: buffered, running and settling, not
    those whose handler has returned). Sent after ``lock_scope``, in a statement of
    its own, so its snapshot sees every claim committed before the lock was granted, as
    ``capacity`` does. A paused scope leaves no room, and so does a rate-limited
    one: its claim must record its starts, which the caller does in a second round
    trip (the count is only known once the claim returns).

    ``reserve``: while no other worker runs a job of the scope, the claim may take that
    many more than the limit. The claiming worker holds them back and starts them only
    as its own running ones end (its *gate*: the limit minus the jobs running elsewhere,
    as seen here); every other worker sees them as running, so finds no room.
    """
    c = queue_controls.c
    per_scope = (
        sa.select(
            c.scope,
            c.paused,
            _effective_rate()[0].label("rate_count"),
            _effective_concurrency().label("concurrency"),
            _running_elsewhere(worker).label("running"),
        )
        .where(_in_scopes(scopes))
        .subquery("per_scope")
    )
    s = per_scope.c
    mine = sa.case(
        (s.scope == KIND, sa.bindparam("mine_kind", 0, sa.Integer)),
        else_=sa.bindparam("mine_queue", 0, sa.Integer),
    )
    reserve = sa.case((s.running < s.concurrency, sa.bindparam("reserve", 0, sa.Integer)), else_=0)
    left = sa.case(
        (s.paused, 0),
        (s.rate_count.is_not(None), 0),
        else_=s.concurrency - s.running - mine + reserve,
    )
    # least() and min() skip NULLs: a scope without a concurrency limit (or no control
    # row at all) leaves the room at :limit.
    limit = sa.bindparam("limit", 1, sa.Integer)
    return sa.select(sa.func.greatest(0, sa.func.least(limit, sa.func.min(left)))).scalar_subquery()


def record_starts(*, scope: str, name: str, count: int) -> sa.Insert:
    """Count ``count`` starts against a rate-limited scope, now (clock_timestamp())."""
    return sa.insert(rate_starts).values(
        scope=sa.bindparam("scope", scope, sa.Text),
        name=sa.bindparam("name", name, sa.Text),
        started_at=sa.func.clock_timestamp(),
        count=sa.bindparam("count", count, sa.Integer),
    )


def forget_starts(*, scope: str, name: str, older_than: float) -> sa.Delete:
    """Delete a scope's starts older than its rate window (``older_than`` seconds)."""
    return sa.delete(rate_starts).where(
        rate_starts.c.scope == sa.bindparam("scope", scope, sa.Text),
        rate_starts.c.name == sa.bindparam("name", name, sa.Text),
        rate_starts.c.started_at
        < sa.func.clock_timestamp()
        - _common.seconds(sa.bindparam("older_than", older_than, sa.Float)),
    )


def set_control(scope: str, name: str, **values: Any) -> sa.Insert:
    """Upsert one control row, setting only ``values`` (paused, concurrency, rate_*).

    RETURNING the row's scope when it changed something (a new row, or a value that
    differs): no row back means nothing changed and nothing was written, so an action
    that changes nothing is known as such (the dashboard records no audit entry for it).
    """
    stmt = insert(queue_controls).values(scope=scope, name=name, **values)
    return stmt.on_conflict_do_update(
        index_elements=[queue_controls.c.scope, queue_controls.c.name],
        set_={**{k: stmt.excluded[k] for k in values}, "updated_at": _common.clock(None)},
        where=sa.or_(*(queue_controls.c[k].is_distinct_from(stmt.excluded[k]) for k in values)),
    ).returning(queue_controls.c.scope)


def update_control(scope: str, name: str, **values: Any) -> sa.Update:
    """Set ``values`` of an existing control row where one differs, RETURNING its scope.

    For what only lifts (a resume, cleared limits): without a row there is nothing to
    lift, and none is written; no row back means nothing changed.
    """
    c = queue_controls.c
    params = {k: sa.bindparam(f"new_{k}", v, c[k].type) for k, v in values.items()}
    return (
        sa.update(queue_controls)
        .where(
            c.scope == sa.bindparam("scope", scope, sa.Text),
            c.name == sa.bindparam("name", name, sa.Text),
            sa.or_(*(c[k].is_distinct_from(p) for k, p in params.items())),
        )
        .values(**params, updated_at=_common.clock(None))
        .returning(c.scope)
    )


def declare_limits(rows: Sequence[dict[str, Any]]) -> sa.Insert:
    """Write the limits a worker's code declares (``declared_*``) for its kinds and queues.

    Rows: ``scope, name, declared_concurrency, declared_rate_count, declared_rate_seconds``
    (None where the code declares nothing). Operators' overrides are left as they are.
    """
    stmt = insert(queue_controls).values(list(rows))
    names = ("declared_concurrency", "declared_rate_count", "declared_rate_seconds")
    return stmt.on_conflict_do_update(
        index_elements=[queue_controls.c.scope, queue_controls.c.name],
        set_={k: stmt.excluded[k] for k in names},
        # No write (and no row lock) when nothing changed: every worker declares at start.
        where=sa.or_(*(queue_controls.c[k].is_distinct_from(stmt.excluded[k]) for k in names)),
    )


def notify_control() -> sa.Select[Any]:
    """Wake every listening worker: a queue was resumed or a limit changed."""
    return sa.select(
        sa.func.pg_notify(sa.literal(locks.NOTIFY_CHANNEL, sa.Text), sa.literal("control", sa.Text))
    )
