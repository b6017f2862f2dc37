"""The exceptions sqla_jobs raises, in one tree::

    SqlaJobsError
     ├── InvalidJobError          (also ValueError)   bad input refused at enqueue
     │    └── WorkflowError                           a workflow that cannot run (a cycle...)
     ├── ConfigError              (also ValueError)   bad worker/CLI configuration
     ├── RegistryError                                handler registration or app loading failed
     ├── SchemaNotReadyError                          the jobs table is missing or not migrated
     ├── HandlerTransactionError                      a handler tried to end its job's transaction
     ├── JobNotFoundError         (also LookupError)  no job has the given id
     ├── JobNotDoneError          (also LookupError)  result(): the job is not done (yet)
     ├── ResultError              (also ValueError)   a handler returned what cannot be stored
     └── JobInterrupted                               the worker stopped a running handler
          ├── JobTimeout                              ... because its timeout passed
          └── JobCancelled                            ... because an operator cancelled it

    JobDecision                   (not an error)      raised by a handler to steer its job
     ├── Snooze(seconds)                              run again later; the attempt is not spent
     ├── RetryIn(seconds)                             a failed attempt, retried after seconds
     └── Discard(reason)                              end the job ``cancelled`` now, no retry

Every error is raised at the boundary where the bad value enters, before anything is
written, so the caller's transaction stays usable.
"""

from __future__ import annotations

import math
from datetime import timedelta


class SqlaJobsError(Exception):
    """Base class of every error raised by sqla_jobs."""


class InvalidJobError(SqlaJobsError, ValueError):
    """A job was refused at enqueue time (bad kind, payload, schedule or limits)."""


class WorkflowError(InvalidJobError):
    """A workflow was refused before anything was written: an unknown or duplicate step
    name, a cycle, a dependency outside the workflow, a kind with no handler (#26)."""


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


class JobNotDoneError(SqlaJobsError, LookupError):
    """[``sqla_jobs.result``][sqla_jobs.result] was asked for the result of a job that is not
    ``done``."""


class ResultError(SqlaJobsError, ValueError):
    """A handler returned a value that cannot be stored as the job's result.

    Not JSON-serializable, or larger than ``sqla_jobs.validation.MAX_RESULT_BYTES``; the
    attempt counts as failed (retried by the usual rules) and its writes are rolled back.
    """


class JobInterrupted(SqlaJobsError):
    """The worker stopped this run of a handler; its writes are rolled back.

    Raised by [``sqla_jobs.JobContext.check``][sqla_jobs.tasks.JobContext.check] inside a handler
    that cooperates, and recorded (in ``last_error``) for every run the worker stopped.
    """


class JobTimeout(JobInterrupted):
    """The job's timeout passed: the attempt failed (retried or dead by the usual rules)."""


class JobCancelled(JobInterrupted):
    """An operator cancelled the running job: it ends ``cancelled`` and is never retried."""


def _delay(name: str, seconds: float | timedelta) -> float:
    value = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} takes seconds (a finite number) or a timedelta, got {seconds!r}")
    if value < 0:
        raise ValueError(f"{name} takes a delay >= 0 seconds, got {value}")
    return float(value)


class JobDecision(Exception):
    """Base of the exceptions a handler raises to decide what happens to its job.

    Not errors: the worker records each as its own outcome. As for a failure, the
    handler's writes in this run are rolled back.
    """


class Snooze(JobDecision):
    """Run the job again in ``seconds``; the attempt is not spent.

    ``raise Snooze(60)`` from a handler puts the job back in its queue for later with
    its attempt count unchanged and ``snoozes`` one higher. A job may snooze at most
    its handler's ``max_snoozes`` times (default 100); one more snooze is a failed attempt.
    """

    def __init__(self, seconds: float | timedelta, reason: str = "") -> None:
        self.seconds = _delay("Snooze", seconds)
        self.reason = reason
        super().__init__(f"snoozed for {self.seconds:g}s" + (f": {reason}" if reason else ""))


class RetryIn(JobDecision):
    """A failed attempt, retried in ``seconds`` instead of after the handler's backoff.

    The attempt is spent: at the job's last attempt it goes ``dead``, as for any failure.
    """

    def __init__(self, seconds: float | timedelta, reason: str = "") -> None:
        self.seconds = _delay("RetryIn", seconds)
        self.reason = reason
        super().__init__(
            f"retry requested in {self.seconds:g}s" + (f": {reason}" if reason else "")
        )


class Discard(JobDecision):
    """End the job ``cancelled`` at once, not retried; ``reason`` goes to ``last_error``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"discarded by its handler: {reason}")
