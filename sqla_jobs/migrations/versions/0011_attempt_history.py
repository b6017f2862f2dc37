"""Attempt history: when the latest attempt was claimed, and every attempt that did not
end done.

Revision ID: 0011_attempt_history
Revises: 0010_dashboard_indexes
Create Date: 2026-12-01

Two nullable columns, on ``jobs`` and ``jobs_archive`` alike (archiving copies every
column of ``jobs``):

* ``attempted_at timestamptz``: when the worker claimed the job for its latest attempt,
  written by the claim, which writes the row anyway (River's ``attempted_at``). A
  claim given back unstarted (a worker's shutdown) clears it: that was no attempt.
* ``errors jsonb``: an array with one object per attempt that ended other than done
  (Oban's and River's ``errors``), appended by the statement that ends it: ``attempt``,
  ``worker``, ``claimed_at`` (the attempt's ``attempted_at``), ``at`` (when it ended),
  ``outcome`` (``failed``, ``snoozed``, ``lease expired``, ``cancelled``), ``then`` (the
  status it left the job in) and ``error`` (its first 2,000 characters: the exception,
  then the start of its traceback; ``last_error`` keeps the latest in full). The latest 50 are kept.

The done-mark writes neither: ``finished_at`` already says when the done attempt ended.

Safe on a large live table: ``ADD COLUMN`` with no default and no constraint changes the
catalog only (no scan, no rewrite); rows written before it read NULL (no history). Each
``ALTER`` still needs a moment of ``ACCESS EXCLUSIVE``, waited for at most
``LOCK_TIMEOUT`` so that a long transaction does not queue every claim behind the
migration (it then fails with "canceling statement due to lock timeout": run it again).

Deploy order: migrate first, then the workers built with it (their claim writes
``attempted_at``; a worker checks at start that every column it uses exists). Workers
built before it keep working on the migrated table (they never name the new columns).

Downgrade: drops the columns (catalog only), and the history with them.
"""

from __future__ import annotations

from alembic import op

revision = "0011_attempt_history"
down_revision: str | None = "0010_dashboard_indexes"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: How long each ALTER waits for its table's lock before the migration fails.
LOCK_TIMEOUT = "5s"

_TABLES = ("jobs", "jobs_archive")


def _with_lock_timeout(statements: list[str]) -> None:
    # Only for these statements: the setting is put back, so an application whose
    # own revisions run in the same transaction keeps its own lock_timeout.
    op.execute("SELECT set_config('sqla_jobs.lock_timeout', current_setting('lock_timeout'), true)")
    op.execute(f"SELECT set_config('lock_timeout', '{LOCK_TIMEOUT}', true)")
    for statement in statements:
        op.execute(statement)
    op.execute("SELECT set_config('lock_timeout', current_setting('sqla_jobs.lock_timeout'), true)")


def upgrade() -> None:
    _with_lock_timeout(
        [
            f"ALTER TABLE {t} ADD COLUMN attempted_at timestamptz, ADD COLUMN errors jsonb"
            for t in _TABLES
        ]
    )


def downgrade() -> None:
    _with_lock_timeout(
        [f"ALTER TABLE {t} DROP COLUMN attempted_at, DROP COLUMN errors" for t in _TABLES]
    )
