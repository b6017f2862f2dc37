"""Timestamps default to the statement's time; ``max_attempts`` NULL means the handler's.

Revision ID: 0008_handler_defaults
Revises: 0007_notify_at_commit
Create Date: 2026-12-07

Two changes, both to the catalog only:

* Every timestamp column default is ``statement_timestamp()`` instead of ``now()``
  (``jobs.run_at`` and ``created_at``, ``jobs_archive.archived_at``,
  ``jobs_periodic.created_at`` and ``updated_at``, ``jobs_controls.updated_at``).
  ``now()`` is the time the transaction began: a job enqueued at the end of a handler's
  (or a web request's) long transaction was created, and ready, seconds before it was
  enqueued. The statements sqla_jobs builds use the statement's time too
  (``sqla_jobs.sql._common.clock``).
* ``jobs.max_attempts`` and ``jobs_archive.max_attempts`` lose ``NOT NULL``, and
  ``jobs.max_attempts`` its ``DEFAULT 8``: a job enqueued without ``max_attempts``
  (``enqueue(session, kind)``, ``Job(...)``) stores NULL, and the worker that claims it
  writes its handler's ``max_attempts``, else 8. Before, it got 8 at once, and a handler's
  ``max_attempts=1`` was ignored. The CHECK ``max_attempts >= 1`` still holds (NULL
  passes a CHECK). An archived job that no worker ever claimed (cancelled while queued)
  keeps NULL.

Safe on a large live table: ``SET DEFAULT`` and ``DROP NOT NULL`` change the catalog
only (no scan, no rewrite), one ``ALTER TABLE`` per table. Each still needs a moment of
``ACCESS EXCLUSIVE``, and waiting for it behind a long transaction would queue every
claim and enqueue behind the migration: the lock is waited for at most
``LOCK_TIMEOUT`` (the migration then fails with "canceling statement due to lock
timeout"; run it again).

Deploy order: workers first. A worker built with this revision works on a database
with or without it (its claim writes a NULL ``max_attempts`` away; there are none
before). A worker built before it must not run against it: it would claim a job with
a NULL ``max_attempts`` and retry it forever. Code built with this revision enqueues
NULL when no ``max_attempts`` is given (``enqueue_many`` and ``Job(...)``), which a
database without this revision refuses (``NOT NULL``): migrate before deploying the
code that enqueues.

Downgrade: the ``now()`` defaults back; NULL ``max_attempts`` become 8 (the handler's
value is not known to the database) and ``NOT NULL`` comes back, which scans each
table under its lock.
"""

from __future__ import annotations

from alembic import op

revision = "0008_handler_defaults"
down_revision: str | None = "0007_notify_at_commit"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: How long each ALTER waits for its table's lock before the migration fails.
LOCK_TIMEOUT = "5s"
#: Frozen here, as migrations are: ``sqla_jobs.models.DEFAULT_MAX_ATTEMPTS`` at 0007.
OLD_MAX_ATTEMPTS = 8

_TIMESTAMPS = {
    "jobs": ("run_at", "created_at"),
    "jobs_archive": ("archived_at",),
    "jobs_periodic": ("created_at", "updated_at"),
    "jobs_controls": ("updated_at",),
}


def _with_lock_timeout(statements: list[str]) -> None:
    # Only for these statements: the setting is put back, so an application whose
    # own revisions run in the same transaction keeps its own lock_timeout.
    op.execute("SELECT set_config('sqla_jobs.lock_timeout', current_setting('lock_timeout'), true)")
    op.execute(f"SELECT set_config('lock_timeout', '{LOCK_TIMEOUT}', true)")
    for statement in statements:
        op.execute(statement)
    op.execute("SELECT set_config('lock_timeout', current_setting('sqla_jobs.lock_timeout'), true)")


def _defaults(function: str) -> dict[str, list[str]]:
    return {
        table: [f"ALTER COLUMN {column} SET DEFAULT {function}" for column in columns]
        for table, columns in _TIMESTAMPS.items()
    }


def upgrade() -> None:
    actions = _defaults("statement_timestamp()")
    actions["jobs"] += ["ALTER COLUMN max_attempts DROP DEFAULT"]
    for table in ("jobs", "jobs_archive"):
        actions[table] += ["ALTER COLUMN max_attempts DROP NOT NULL"]
    _with_lock_timeout([f"ALTER TABLE {t} {', '.join(a)}" for t, a in actions.items()])


def downgrade() -> None:
    _with_lock_timeout(
        [
            *(f"ALTER TABLE {t} {', '.join(a)}" for t, a in _defaults("now()").items()),
            f"ALTER TABLE jobs ALTER COLUMN max_attempts SET DEFAULT {OLD_MAX_ATTEMPTS}",
            # After the default is back: no new NULL arrives between the fill and the
            # constraint.
            *(
                f"UPDATE {t} SET max_attempts = {OLD_MAX_ATTEMPTS} WHERE max_attempts IS NULL"
                for t in ("jobs", "jobs_archive")
            ),
            *(
                f"ALTER TABLE {t} ALTER COLUMN max_attempts SET NOT NULL"
                for t in ("jobs", "jobs_archive")
            ),
        ]
    )
