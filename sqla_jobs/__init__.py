"""sqla_jobs: reliable background jobs for SQLAlchemy applications, on PostgreSQL alone.

Jobs are rows of the ``jobs`` table (:class:`Job`), inserted in the caller's own
transaction (:func:`enqueue`, :func:`enqueue_many` or ``session.add(Job(...))``) and run
by ``python -m sqla_jobs.worker app.module:registry``.
"""

import typing as _typing

from sqla_jobs.config import WorkerConfig
from sqla_jobs.exceptions import (
    ConfigError,
    Discard,
    HandlerTransactionError,
    InvalidJobError,
    JobCancelled,
    JobDecision,
    JobInterrupted,
    JobNotDoneError,
    JobNotFoundError,
    JobTimeout,
    RegistryError,
    ResultError,
    RetryIn,
    SchemaNotReadyError,
    Snooze,
    SqlaJobsError,
)
from sqla_jobs.models import Base, Job, JobArchive, JobStatus
from sqla_jobs.ops import Stats, result, result_async, stats, stats_async
from sqla_jobs.producer import NewJob, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from sqla_jobs.retry import Backoff
from sqla_jobs.tasks import Handler, JobContext, Registry, current_job

if _typing.TYPE_CHECKING:
    from sqla_jobs.worker import Worker

__all__ = [
    "Backoff",
    "Base",
    "ConfigError",
    "Discard",
    "Handler",
    "HandlerTransactionError",
    "InvalidJobError",
    "Job",
    "JobArchive",
    "JobCancelled",
    "JobContext",
    "JobDecision",
    "JobInterrupted",
    "JobNotDoneError",
    "JobNotFoundError",
    "JobStatus",
    "JobTimeout",
    "NewJob",
    "Registry",
    "RegistryError",
    "ResultError",
    "RetryIn",
    "SchemaNotReadyError",
    "Snooze",
    "SqlaJobsError",
    "Stats",
    "Worker",
    "WorkerConfig",
    "current_job",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "result",
    "result_async",
    "stats",
    "stats_async",
]


def __getattr__(name: str) -> _typing.Any:
    # The worker is exported lazily: importing it eagerly here would make
    # ``python -m sqla_jobs.worker`` import the module twice (as __main__ and by name).
    if name == "Worker":
        from sqla_jobs.worker import Worker

        return Worker
    raise AttributeError(f"module 'sqla_jobs' has no attribute {name!r}")
