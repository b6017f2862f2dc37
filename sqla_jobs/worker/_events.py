"""Typed worker events: what happened to a job, for metrics and other subscribers.

``Worker.subscribe(callback)`` registers a callable that receives a ``WorkerEvent``
for every recorded outcome. Callbacks run on the worker thread that recorded the outcome
(a handler thread or the completer): they must be quick and must not raise (an exception
is logged and dropped, never allowed to disturb the job's bookkeeping).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("sqla_jobs.worker")


class Outcome(str, enum.Enum):
    """What was recorded for one attempt of a job."""

    DONE = "done"  # the handler returned; its writes and the done-mark committed
    RETRY = "retry"  # the attempt failed; the job runs again later
    DEAD = "dead"  # the attempt failed and was the last one
    LOST = "lost"  # the claim was lost (lease expired and taken over): nothing recorded
    RELEASED = "released"  # claimed but never started (shutdown): queued again, unspent
    SNOOZED = "snoozed"  # the handler raised Snooze: queued again later, attempt unspent
    CANCELLED = "cancelled"  # Discard, or an operator cancelled it while running: no retry


@dataclass(frozen=True)
class WorkerEvent:
    """One recorded outcome: the job, what happened, and how long its handler ran."""

    outcome: Outcome
    job_id: int
    kind: str
    queue: str
    attempt: int
    duration: float  # seconds the handler ran (0 for RELEASED)
    error: str | None = None  # ``Type: message`` for RETRY, DEAD, SNOOZED and CANCELLED


Subscriber = Callable[[WorkerEvent], None]


class Events:
    """The subscribers of one worker."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, callback: Subscriber) -> None:
        self._subscribers.append(callback)

    def __bool__(self) -> bool:
        return bool(self._subscribers)

    def emit(self, event: WorkerEvent) -> None:
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:
                log.exception("a worker event subscriber failed on %s", event)
