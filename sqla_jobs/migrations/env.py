"""Packaged Alembic environment (script_location ``sqla_jobs:migrations``); see run_env."""

from sqla_jobs.migrations import run_env

run_env()
