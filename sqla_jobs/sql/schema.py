"""Probes that tell whether the migrations this code needs have run."""

from __future__ import annotations

from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc

from sqla_jobs import exceptions, models
from sqla_jobs.exceptions import SchemaNotReadyError
from sqla_jobs.models import JobStatus, jobs
from sqla_jobs.sql import periodic as periodic_sql

#: What every "schema not ready" message tells the reader to run. sqla_jobs' revisions
#: are a branch of their own, so an app that has its own Alembic history (and sqla_jobs'
#: versions in ``version_locations``) has two heads: ``head`` alone is ambiguous there.
UPGRADE = (
    "run `alembic upgrade heads` (in an app with its own Alembic history, which is how an "
    "install from pip migrates: its `version_locations` lists sqla_jobs' revisions, see the "
    "Alembic integration guide; `heads`, because sqla_jobs' revisions are a branch of their "
    "own beside the app's)"
)


#: The refusal of code that archives, on a database before revision 0022.
PARTITIONED_MISSING = (
    "the sqla_jobs tables are behind this code: it archives into the partitioned "
    "jobs_archive of revision 0022_partitioned_archive (and its functions), which has not "
    f"run; {UPGRADE}"
)


def missing_jobs_table(exc: sa_exc.DBAPIError) -> bool:
    """Whether ``exc`` says a table is missing: from a statement that reads only ``jobs``,
    the whole schema (revision 0001 creates it)."""
    return isinstance(exc.orig, psycopg.errors.UndefinedTable)


def missing_function(exc: sa_exc.DBAPIError) -> bool:
    """Whether ``exc`` says a function is missing (revision 0022's maintenance ones)."""
    return isinstance(exc.orig, psycopg.errors.UndefinedFunction)


def no_schema_error(exc: sa_exc.DBAPIError, *, doing: str = "") -> SchemaNotReadyError:
    """The error for a database without sqla_jobs' tables (none of its migrations ran)."""
    return SchemaNotReadyError(
        f"{doing}this database has no sqla_jobs schema (the jobs table does not exist): "
        f"none of its migrations ran; {UPGRADE} ({exceptions.db_error_text(exc)})"
    )


def archive_probe() -> sa.Select[Any]:
    """Reads every column of jobs_archive and names its partitions' function; fails if
    revision 0002 (the table) or 0022 (partitioned, ``jobs_archive_partitions()``)
    is missing."""
    parts = sa.func.jobs_archive_partitions().table_valued(sa.column("partition", sa.Text))
    return (
        sa.select(*models.jobs_archive.c)
        .select_from(models.jobs_archive.join(parts, sa.false()))
        .limit(0)
    )


def table_probe() -> sa.Select[Any]:
    """Reads no column of ``jobs``: fails only if the table (revision 0001) is missing."""
    return sa.select(sa.literal(1)).select_from(jobs).limit(0)


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


def check_schema(connection: Connection, *, archive: bool = False, periodic: bool = False) -> None:
    """Raise SchemaNotReadyError unless the migrations this code needs have run.

    Reads every column of ``jobs`` (and of ``jobs_periodic`` with ``periodic``, of
    ``jobs_archive`` with ``archive``) and the ``job_status`` values, inside a savepoint
    when a transaction is open, so a failed probe never breaks the caller's transaction.
    Runs no DDL. The message says which is the case: no schema at all, no
    ``jobs_periodic`` for a registry with schedules, or a schema that is behind.
    """
    # The first probe that fails names what is missing: no ``jobs`` table at all (0001),
    # then ``jobs_periodic`` (0004) before the columns and tables of later revisions.
    probes = [("jobs", table_probe())]
    if periodic:
        probes.append(("periodic", periodic_sql.state_probe()))
    probes += [("current", schema_probe()), ("current", control_probe())]
    if archive:
        probes.append(("current", archive_probe()))
    checking = "current"
    try:
        with connection.begin_nested() if connection.in_transaction() else connection.begin():
            for what, probe in probes:
                checking = what
                connection.execute(probe)
            found = set(connection.execute(status_values()).scalars())
    except sa_exc.ProgrammingError as exc:
        raise _not_ready(checking, exc) from None
    missing = {s.value for s in JobStatus} - found
    if missing:
        raise SchemaNotReadyError(
            f"job_status lacks {sorted(missing)}: the schema is behind; {UPGRADE}"
        )


def _not_ready(failed: str, exc: sa_exc.ProgrammingError) -> SchemaNotReadyError:
    if failed == "jobs" and missing_jobs_table(exc):
        return no_schema_error(exc)
    if failed == "periodic":
        return SchemaNotReadyError(
            "the registry declares periodic schedules but the table jobs_periodic "
            f"(revision 0004) is missing: the schema is behind; {UPGRADE} "
            f"({exceptions.db_error_text(exc)})"
        )
    if missing_function(exc):  # the archive probe: only revision 0022 makes functions
        return SchemaNotReadyError(PARTITIONED_MISSING)
    if isinstance(exc.orig, psycopg.errors.InsufficientPrivilege):
        # Not a schema behind the code: a role without the grants (a monitoring role
        # given none but pg_read_all_stats said "a migration has not run").
        return SchemaNotReadyError(
            f"this role may not read sqla_jobs' tables ({exceptions.db_error_text(exc)}): "
            "grant it what its work needs, as the least privilege page of the "
            "documentation says (a role that only reads: SELECT on the queue's tables)"
        )
    return SchemaNotReadyError(
        "the sqla_jobs tables are behind this code (a migration has not run); "
        f"{UPGRADE} ({exceptions.db_error_text(exc)})"
    )
