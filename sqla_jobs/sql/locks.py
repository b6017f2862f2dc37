"""Advisory locks and the notification channel: the keys every process must agree on."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

#: LISTEN/NOTIFY channel the insert trigger notifies (the seed design's channel).
NOTIFY_CHANNEL = "jobs"
#: Channel ``sqla_jobs.ops.cancel_jobs`` notifies, at commit, with the id of each running
#: job it asked to stop; workers LISTEN on it (revision 0005).
CANCEL_CHANNEL = "sqla_jobs_cancel"
#: Advisory lock key idle workers hold (shared) while they wait; the insert trigger
#: notifies only when it is held (revision 0003, which freezes the same number).
#: ``b"sqlajob\x02"`` as a bigint.
IDLE_LOCK_KEY = int.from_bytes(b"sqlajob\x02", "big")
#: Advisory lock key producers' commits hold (shared, to the end of the transaction)
#: from the moment their insert trigger looks at the idle flag (revision 0007, which
#: freezes the same number). ``b"sqlajob\x03"`` as a bigint.
COMMIT_LOCK_KEY = int.from_bytes(b"sqlajob\x03", "big")
#: Advisory lock key of the archiver: one worker (or ``sqla-jobs archive``) at a time.
ARCHIVE_LOCK_KEY = int.from_bytes(b"sqlajob\x01", "big")
#: Advisory lock key of the workflow sweep (#26): one worker at a time.
WORKFLOW_SWEEP_LOCK_KEY = int.from_bytes(b"sqlajob\x04", "big")


def try_advisory_xact_lock(key: int) -> sa.Select[Any]:
    """``pg_try_advisory_xact_lock(key)``: true if this transaction now holds the lock."""
    return sa.select(sa.func.pg_try_advisory_xact_lock(sa.bindparam("key", key, sa.BigInteger)))


def try_advisory_lock(key: int) -> sa.Select[Any]:
    """``pg_try_advisory_lock(key)``: true if this session now holds the lock."""
    return sa.select(sa.func.pg_try_advisory_lock(sa.bindparam("key", key, sa.BigInteger)))


def advisory_unlock(key: int) -> sa.Select[Any]:
    return sa.select(sa.func.pg_advisory_unlock(sa.bindparam("key", key, sa.BigInteger)))


def idle_flag(*, raise_: bool) -> sa.Select[Any]:
    """Raise (take, shared) or lower the advisory lock waiting workers hold (rev. 0003).

    Shared, so any number of workers can wait at once; the insert trigger tries the key
    exclusively to learn whether anyone waits (see IDLE_LOCK_KEY).
    """
    key = sa.bindparam("key", IDLE_LOCK_KEY, sa.BigInteger)
    if raise_:
        return sa.select(sa.func.pg_advisory_lock_shared(key))
    return sa.select(sa.func.pg_advisory_unlock_shared(key))


def no_commit_in_flight() -> sa.Select[Any]:
    """True if no producer's commit that looked at the idle flag is still in flight.

    Tries ``COMMIT_LOCK_KEY`` exclusively (run in autocommit, it is let go with the
    statement's own transaction). Producers hold it shared from the moment their commit
    trigger looks at the flag until the commit is visible (revision 0007), so once this
    is true after the flag went up, a claim sees every job that did not notify, and
    every later commit sees the flag. It never waits: producers' commits never queue
    behind a worker.
    """
    key = sa.bindparam("key", COMMIT_LOCK_KEY, sa.BigInteger)
    return sa.select(sa.func.pg_try_advisory_xact_lock(key))


def _not_a_primary() -> sa.ColumnElement[bool]:
    # transaction_read_only too: a node turned read-only (Aurora, a demoted primary with
    # default_transaction_read_only) is not in recovery, and refuses every write.
    return sa.or_(
        sa.func.pg_is_in_recovery(),
        sa.func.current_setting("transaction_read_only") == "on",
    )


def not_a_primary() -> sa.Select[Any]:
    """True when this connection cannot write: a standby, or a node turned read-only (the
    worker's check of every new connection)."""
    return sa.select(_not_a_primary().label("not_a_primary"))


def listener_probe(channel: str, token: str) -> sa.Select[Any]:
    """The listener's probe: NOTIFY ``channel`` with ``token`` (it LISTENs there itself)
    and say whether the node can still write."""
    return sa.select(
        sa.func.pg_notify(channel, token).label("sent"),
        _not_a_primary().label("not_a_primary"),
    )
