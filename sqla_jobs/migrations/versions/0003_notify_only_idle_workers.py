"""Notify on insert only when a worker is waiting for work.

Revision ID: 0003_notify_only_idle_workers
Revises: 0002_cancelled_and_archive
Create Date: 2026-11-30

``NOTIFY`` serializes commits: a transaction that notified takes a cluster-wide lock at
commit and holds it until its commit record is flushed, so notifying commits cannot be
group-committed. With one job per transaction (the common ``enqueue`` in a request), the
statement-level trigger of 0001 still notified once per commit; measured with 8 raw
producers, single-job inserts ran at 0.63x the rate of the same inserts without the
trigger (benchmarks/README.md).

A notification only matters to a worker that is waiting. Waiting workers now hold a
*shared* advisory lock (key ``IDLE_LOCK_KEY``, on a connection of their own; it goes
away with the worker). The trigger tries the same key *exclusively* and lets it go at
once: if it gets it, no worker is waiting and it skips ``pg_notify``; if it cannot (a
worker waits, or rarely another producer is in the same microseconds), it notifies. A
busy worker does not hold the lock, so under load commits are not serialized; it looks
at the table again after each batch anyway.

Deploy order: either. Workers built before this revision never hold the lock, so with it
applied they are woken by their poll interval only; deploy workers first to keep
low-latency pickup throughout. Downgrade restores the 0001 trigger function.
"""

from __future__ import annotations

from alembic import op

revision = "0003_notify_only_idle_workers"
down_revision: str | None = "0002_cancelled_and_archive"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: Must equal ``sqla_jobs.sql.locks.IDLE_LOCK_KEY`` (frozen here, as migrations are).
IDLE_LOCK_KEY = 8318549152383328770


def upgrade() -> None:
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF pg_try_advisory_lock({IDLE_LOCK_KEY}) THEN
            PERFORM pg_advisory_unlock({IDLE_LOCK_KEY});  -- nobody waits: no NOTIFY
          ELSE
            PERFORM pg_notify('jobs', '');
          END IF;
          RETURN NULL;
        END $$
        """
    )


def downgrade() -> None:
    op.execute(
        """
        CREATE OR REPLACE FUNCTION jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_notify('jobs', '');
          RETURN NULL;
        END $$
        """
    )
