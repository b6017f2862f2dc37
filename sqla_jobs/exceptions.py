"""The exceptions sqla_jobs raises, in one tree::

    SqlaJobsError
     ├── InvalidJobError          (also ValueError)   bad input refused at enqueue
     ├── ConfigError              (also ValueError)   bad worker/CLI configuration
     ├── RegistryError                                handler registration or app loading failed
     ├── SchemaNotReadyError                          the jobs table is missing or not migrated
     ├── HandlerTransactionError                      a handler tried to end its job's transaction
     └── JobNotFoundError         (also LookupError)  no job has the given id

Every error is raised at the boundary where the bad value enters, before anything is
written, so the caller's transaction stays usable.
"""

from __future__ import annotations


class SqlaJobsError(Exception):
    """Base class of every error raised by sqla_jobs."""


class InvalidJobError(SqlaJobsError, ValueError):
    """A job was refused at enqueue time (bad kind, payload, schedule or limits)."""


class ConfigError(SqlaJobsError, ValueError):
    """A worker or command-line setting is invalid."""


class RegistryError(SqlaJobsError):
    """A handler could not be registered, or an app registry could not be loaded."""


class SchemaNotReadyError(SqlaJobsError):
    """The database has no (or an outdated) sqla_jobs schema; run the migrations."""


class JobNotFoundError(SqlaJobsError, LookupError):
    """No job has the given id."""


class HandlerTransactionError(SqlaJobsError):
    """A handler tried to end the transaction the worker gave it.

    The worker owns the handler's transaction: it commits the handler's writes together
    with the done-mark, so that a job is never marked done without its effects (or the
    other way round). Committing, rolling back the connection, beginning or closing it,
    ``session.begin()`` as a block, ``session.close()``, or SQL text such as ``COMMIT``
    are refused with this error; the attempt is recorded as failed and every write it
    made is rolled back. ``session.rollback()`` (discard the writes so far) and
    ``session.begin_nested()`` (a SAVEPOINT) stay allowed.
    """


def db_error_text(exc: BaseException) -> str:
    """The first line of a database error's own message (no SQL, no caret lines), for
    errors printed as one line."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__
