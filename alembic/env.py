"""Alembic environment for this repository: ``DATABASE_URL=... alembic upgrade head``.

The logic lives in the package (``sqla_jobs.migrations.run_env``) so the installed wheel
runs the very same environment; the version table is sqla_jobs' own.
"""

from sqla_jobs.migrations import run_env

run_env()
