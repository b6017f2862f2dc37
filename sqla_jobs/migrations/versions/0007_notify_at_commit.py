"""Decide whether to notify at commit, under a lock a worker going idle can wait out.

Revision ID: 0007_notify_at_commit
Revises: 0006_queue_control
Create Date: 2026-11-30

Revision 0003 decided at INSERT time: the statement trigger notified only if some
worker held the idle flag then. A job inserted while every worker was busy, whose
transaction committed after a worker went idle (raised its flag and claimed once more,
before the commit), notified no one and waited for that worker's poll (up to
``--poll-interval``). The worker's second look 50 ms later only narrowed the window.

Now the decision is taken at commit time, by a deferred constraint trigger, and under a
lock the worker can wait out:

* The trigger fires once per transaction (its ``WHEN`` lets the first inserted row
  through and marks the transaction in a transaction-local setting, so a batch of
  5,000 rows queues one event, not 5,000). At commit it takes the *commit lock*
  (``COMMIT_LOCK_KEY``) shared, for the rest of the transaction, and only then tries
  the idle flag: held by a waiting worker -> ``pg_notify``, else nothing, as in 0003.
* A worker that raises its flag then *tries* the commit lock exclusively
  (``sqla_jobs.sql.locks.no_commit_in_flight``), and again every few milliseconds
  until it gets it: then no commit that looked at the flag before it went up is still
  in flight (transaction-level locks are released after the commit is visible), and
  one more claim sees their jobs. A commit that takes the shared lock after the flag
  went up sees it and notifies. The worker never waits on the lock, so producers'
  commits never queue behind a worker.

An application that runs ``SET CONSTRAINTS ALL IMMEDIATE`` (or prepares the
transaction, two-phase) fires the trigger early, and holds the shared lock to the end
of its transaction: a worker going idle meanwhile keeps looking (every 50 ms at most),
for at most its poll interval.

Safe on a large live table: functions and a trigger only (``CREATE TRIGGER`` takes a
brief SHARE ROW EXCLUSIVE lock on ``jobs``; no scan, no rewrite), in one transaction,
so no commit goes without a trigger. Deploy order: pre-deploy. A worker built before
it works as with 0003 (the flag is all it reads, and its second look 50 ms after
raising the flag covers most commits in flight); a worker built after it, against a
database without it, claims once more after raising its flag but no longer looks again
50 ms later.
Downgrade restores the 0003 statement trigger (its function was left in place).
"""

from __future__ import annotations

from alembic import op

revision = "0007_notify_at_commit"
down_revision: str | None = "0006_queue_control"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: Must equal ``sqla_jobs.sql.locks.IDLE_LOCK_KEY`` (frozen here, as migrations are).
IDLE_LOCK_KEY = 8318549152383328770
#: Must equal ``sqla_jobs.sql.locks.COMMIT_LOCK_KEY`` (``b"sqlajob\x03"`` as a bigint).
COMMIT_LOCK_KEY = 8318549152383328771
#: The transaction-local setting that marks "this transaction's event is queued".
MARK = "sqla_jobs.notify_queued"


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION jobs_notify_first_insert() RETURNS boolean LANGUAGE sql VOLATILE AS $$
          SELECT coalesce(current_setting('{MARK}', true), '') <> 'on'
             AND set_config('{MARK}', 'on', true) = 'on'
        $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION jobs_notify_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          -- Held to the end of the transaction, after the commit is visible: a worker
          -- that raised its idle flag claims again once it is let go
          -- (locks.no_commit_in_flight).
          PERFORM pg_advisory_xact_lock_shared({COMMIT_LOCK_KEY});
          IF pg_try_advisory_lock({IDLE_LOCK_KEY}) THEN
            PERFORM pg_advisory_unlock({IDLE_LOCK_KEY});  -- nobody waits: no NOTIFY
          ELSE
            PERFORM pg_notify('jobs', '');
          END IF;
          RETURN NULL;
        END $$
        """
    )
    op.execute("DROP TRIGGER jobs_notify ON jobs")
    op.execute(
        "CREATE CONSTRAINT TRIGGER jobs_notify AFTER INSERT ON jobs "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
        "WHEN (jobs_notify_first_insert()) EXECUTE FUNCTION jobs_notify_at_commit()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_notify ON jobs")
    op.execute(
        "CREATE TRIGGER jobs_notify AFTER INSERT ON jobs "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify()"
    )
    op.execute("DROP FUNCTION jobs_notify_at_commit()")
    op.execute("DROP FUNCTION jobs_notify_first_insert()")
