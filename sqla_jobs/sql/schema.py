"""Probes that tell whether the migrations this code needs have run."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc

from sqla_jobs import exceptions, models
from sqla_jobs.exceptions import SchemaNotReadyError
from sqla_jobs.models import JobStatus, jobs


def archive_probe() -> sa.Select[Any]:
    """Reads every column of jobs_archive; fails if revision 0002 is missing."""
    return sa.select(*models.jobs_archive.c).limit(0)


def schema_probe() -> sa.Select[Any]:
    """Reads every column the worker uses; fails if the table is missing or outdated."""
    return sa.select(*jobs.c).limit(0)


def control_probe() -> sa.Select[Any]:
    """Reads every column of the queue-control tables (revision 0006); no row."""
    controls, starts, workers = models.queue_controls, models.rate_starts, models.worker_records
    return (
        sa.select(*controls.c, *starts.c, *workers.c)
        .select_from(controls.join(starts, sa.false()).join(workers, sa.false()))
        .limit(0)
    )


def status_values() -> sa.TextClause:
    return sa.text("SELECT unnest(enum_range(NULL::job_status))::text")


def check_schema(connection: Connection, *, archive: bool = False) -> None:
    """Raise SchemaNotReadyError unless the migrations this code needs have run.

    Reads every column of ``jobs`` (and of ``jobs_archive`` with ``archive``) and the
    ``job_status`` values, inside a savepoint when a transaction is open, so a failed
    probe never breaks the caller's transaction. Runs no DDL.
    """

    probes = [schema_probe(), control_probe()] + ([archive_probe()] if archive else [])
    try:
        with connection.begin_nested() if connection.in_transaction() else connection.begin():
            for probe in probes:
                connection.execute(probe)
            found = set(connection.execute(status_values()).scalars())
    except sa_exc.ProgrammingError as exc:
        raise SchemaNotReadyError(
            "the jobs tables are missing or outdated; run `alembic upgrade head` "
            f"(or `alembic upgrade heads` in your app): {exceptions.db_error_text(exc)}"
        ) from None
    missing = {s.value for s in JobStatus} - found
    if missing:
        raise SchemaNotReadyError(f"job_status lacks {sorted(missing)}; run `alembic upgrade head`")
