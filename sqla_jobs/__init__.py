"""sqla_jobs: reliable background jobs for SQLAlchemy applications, on PostgreSQL alone.

Jobs are rows of the ``jobs`` table ([``Job``][sqla_jobs.Job]), inserted in the caller's own
transaction ([``enqueue``][sqla_jobs.enqueue], [``enqueue_many``][sqla_jobs.enqueue_many] or
``session.add(Job(...))``) and run by ``python -m sqla_jobs.worker app.module:registry``.

The names below that need SQLAlchemy are loaded on first use (``__getattr__``), so
``sqla-jobs --help`` and ``python -m sqla_jobs.worker --help`` import neither
SQLAlchemy nor psycopg (issue #23); ``from sqla_jobs import Job`` works as before.
"""

import importlib as _importlib
import typing as _typing

#: The release, the one place it is written: the wheel's metadata takes it from here
#: (pyproject.toml, ``[tool.setuptools.dynamic]``) and workers report it.
__version__ = "0.1.0"

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
    WorkflowError,
)

if _typing.TYPE_CHECKING:
    from sqla_jobs.config import WorkerConfig
    from sqla_jobs.models import Base, Job, JobArchive, JobStatus
    from sqla_jobs.ops import Stats, result, result_async, stats, stats_async
    from sqla_jobs.producer import (
        NewJob,
        enqueue,
        enqueue_async,
        enqueue_many,
        enqueue_many_async,
    )
    from sqla_jobs.retry import Backoff
    from sqla_jobs.tasks import Handler, JobContext, Registry, current_job
    from sqla_jobs.worker import Worker
    from sqla_jobs.workflows import (
        Workflow,
        WorkflowIds,
        upstream_results,
        upstream_results_async,
    )

#: The module each lazily loaded name comes from. The worker is lazy for one more
#: reason: importing it here would make ``python -m sqla_jobs.worker`` import it twice
#: (as __main__ and by name).
_LAZY = {
    "Backoff": "sqla_jobs.retry",
    "Base": "sqla_jobs.models",
    "Handler": "sqla_jobs.tasks",
    "Job": "sqla_jobs.models",
    "JobArchive": "sqla_jobs.models",
    "JobContext": "sqla_jobs.tasks",
    "JobStatus": "sqla_jobs.models",
    "NewJob": "sqla_jobs.producer",
    "Registry": "sqla_jobs.tasks",
    "Stats": "sqla_jobs.ops",
    "Worker": "sqla_jobs.worker",
    "WorkerConfig": "sqla_jobs.config",
    "Workflow": "sqla_jobs.workflows",
    "WorkflowIds": "sqla_jobs.workflows",
    "current_job": "sqla_jobs.tasks",
    "enqueue": "sqla_jobs.producer",
    "enqueue_async": "sqla_jobs.producer",
    "enqueue_many": "sqla_jobs.producer",
    "enqueue_many_async": "sqla_jobs.producer",
    "result": "sqla_jobs.ops",
    "result_async": "sqla_jobs.ops",
    "stats": "sqla_jobs.ops",
    "stats_async": "sqla_jobs.ops",
    "upstream_results": "sqla_jobs.workflows",
    "upstream_results_async": "sqla_jobs.workflows",
}

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
    "Workflow",
    "WorkflowError",
    "WorkflowIds",
    "current_job",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "result",
    "result_async",
    "stats",
    "stats_async",
    "upstream_results",
    "upstream_results_async",
]


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sqla_jobs' has no attribute {name!r}")
    if module == "sqla_jobs.models":
        # The flush listener that makes ``session.add(Job(...))`` insert as ``enqueue``
        # does is producer's (it imports the models, so the models cannot import it).
        _importlib.import_module("sqla_jobs.producer")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary one
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
