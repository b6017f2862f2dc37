"""Autovacuum on ``jobs`` by the thousands of dead rows, not by a fifth of the table (#25).

Revision ID: 0023_jobs_autovacuum
Revises: 0022_partitioned_archive
Create Date: 2026-12-02

PostgreSQL starts an autovacuum of a table once its dead rows pass
``autovacuum_vacuum_threshold`` plus ``autovacuum_vacuum_scale_factor`` times its rows:
by default 50 plus 20%. ``jobs`` holds the live queue and the finished jobs not yet
archived (a day of them, a backlog scheduled ahead), and every claim and done-mark
leaves a dead row version (both change the indexed ``status``: never HOT). At 1,000,000
rows the default waits for 200,050 dead rows.

* ``autovacuum_vacuum_scale_factor = 0.01`` and ``autovacuum_vacuum_threshold = 1000``:
  1,000 dead rows plus 1% (11,000 at 1,000,000 rows). Measured (benchmarks/README.md,
  "Autovacuum on jobs"; 800,000 done + 200,000 scheduled rows, 200 jobs/s run by one
  worker for 6 minutes, no pinned horizon, two runs a side, in turn): with the defaults
  no autovacuum ran and ``n_dead_tup`` rose to 143,884 and 143,048; with these, an
  autovacuum every minute (``autovacuum_naptime``; 6 a run, 0.73-1.12 s and about
  30,000 buffers each, 24,000 dead item identifiers removed) kept it between 2,000
  and 17,000 (4,429 and 2,359 at the end). The table grew 10.5 MiB instead of 11.8-12.1,
  its indexes 17.4-17.7 MiB instead of 19.7-20.1, and 96-97% of its pages were
  all-visible instead of 92%. At 400 jobs/s for 5 minutes: 0 runs and 239,678 /
  239,229 dead rows against 5 runs each (0.71-2.08 s) and 3,256 / 33,932; the table
  grew 17.5-18.0 MiB instead of 21.8-22.7. Unchanged: a full claim (26-44 buffers on
  both sides, but once 85 in a defaults run) and the claim's plan, the throughput.

Not set, as the same measurement did not call for them: ``autovacuum_vacuum_cost_delay``
(a run took about a second with the default 2 ms), ``autovacuum_analyze_scale_factor``
(the claim's plan never changed), the insert-driven thresholds (the dead-row threshold
comes first on this table), ``fillfactor`` (heartbeats were not measured), and the
other tables.

Safe on a large live table: ``ALTER TABLE ... SET (...)`` of autovacuum parameters takes
``SHARE UPDATE EXCLUSIVE`` (claims, enqueues and done-marks go on; only another
``ALTER``, a ``VACUUM`` or an index build waits) and changes the catalog only; it waits
at most ``LOCK_TIMEOUT`` for an autovacuum or vacuum already running on the table.
Deploy order: either. An application may set its own afterwards (``ALTER TABLE jobs SET
(autovacuum_vacuum_scale_factor = ...)``); a later upgrade does not touch them, and
``ALTER TABLE jobs RESET (...)`` gives the server's settings back.

Downgrade: the parameters are RESET (the server's settings apply again).
"""

from __future__ import annotations

from alembic import op

revision = "0023_jobs_autovacuum"
down_revision: str | None = "0022_partitioned_archive"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

#: How long the ALTER waits for the table's lock before the migration fails.
LOCK_TIMEOUT = "5s"

#: The storage parameters this revision sets on ``jobs`` (sqla_jobs.models mirrors them).
SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
}


def _alter(statement: str) -> None:
    op.execute("SELECT set_config('sqla_jobs.lock_timeout', current_setting('lock_timeout'), true)")
    op.execute(f"SELECT set_config('lock_timeout', '{LOCK_TIMEOUT}', true)")
    op.execute(statement)
    op.execute("SELECT set_config('lock_timeout', current_setting('sqla_jobs.lock_timeout'), true)")


def upgrade() -> None:
    pairs = ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
    _alter(f"ALTER TABLE jobs SET ({pairs})")


def downgrade() -> None:
    _alter(f"ALTER TABLE jobs RESET ({', '.join(SETTINGS)})")
