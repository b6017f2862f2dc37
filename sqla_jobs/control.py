"""The stop signal of one running job: its deadline, and whether it was cancelled.

Every run of a handler gets a ``Control``, shared by the handler (through
[``JobContext``][sqla_jobs.JobContext]: ``job.deadline``, ``job.cancelled``, ``job.check()``) and
the worker (the executor, the lease keeper and the listener). It holds no database
state and imports nothing of the worker, so any executor can use it: a thread
executor checks it between statements, an asyncio executor can wrap the handler in
``asyncio.timeout_at(control.deadline)`` (``deadline`` is on ``time.monotonic()``, the
clock of asyncio's default loop), a process executor can kill its child at it.

Three things stop a run, in order of strength:

1. cooperation: ``job.check()`` raises [``JobTimeout``][sqla_jobs.JobTimeout] or
   [``JobCancelled``][sqla_jobs.JobCancelled] once the deadline passed or an operator cancelled;
2. the database: the handler's transaction runs with ``statement_timeout`` set to the
   time left, and a cancel or the deadline cancels the statement it is running
   (``Control.on_interrupt`` hooks, e.g. ``psycopg.Connection.cancel``);
3. abandonment: ``grace`` seconds after the deadline (or the cancel) the worker records
   the outcome itself, stops renewing the lease and fences away whatever the handler's
   thread still does (``Control.abandon``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from sqla_jobs.exceptions import JobCancelled, JobDecision, JobInterrupted, JobTimeout


class Control:
    """Deadline and cancellation of one run of a handler; thread-safe."""

    __slots__ = (
        "_expired",
        "_hooks",
        "_lock",
        "abandoned",
        "cancel_requested_at",
        "deadline",
        "running",
        "started",
        "timeout",
    )

    def __init__(self, timeout: float | None, *, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.timeout = timeout
        #: ``time.monotonic()`` at which the run's time is up; None: no limit.
        self.deadline = None if timeout is None else self.started + timeout
        #: ``time.monotonic()`` at which the worker learnt of an operator's cancel.
        self.cancel_requested_at: float | None = None
        #: The handler is still running (interrupt hooks fire only then).
        self.running = True
        #: The worker recorded the outcome without waiting for the handler any more.
        self.abandoned = False
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []
        self._expired = False

    # --- for the handler ----------------------------------------------------------------

    def time_left(self) -> float | None:
        """Seconds until the deadline (0 when passed); None without a timeout."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    @property
    def timed_out(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    @property
    def cancelled(self) -> bool:
        return self.cancel_requested_at is not None

    def interruption(self) -> JobInterrupted | None:
        """The exception that stops this run now (a cancel wins over a timeout), or None."""
        if self.cancel_requested_at is not None:
            return JobCancelled("the job was cancelled by an operator while it was running")
        if self.timed_out:
            return JobTimeout(f"the job ran past its timeout of {self.timeout:g}s")
        return None

    def failure(self, exc: BaseException) -> BaseException:
        """What a raising run is recorded as: the timeout or the cancel when one stopped it
        (e.g. its statement cancelled at the deadline), unless the handler itself raised
        one of those or a decision (Snooze, RetryIn, Discard)."""
        stop = self.interruption()
        if stop is None or isinstance(exc, (JobInterrupted, JobDecision)):
            return exc
        stop.__cause__ = exc
        return stop

    def check(self) -> None:
        """Raise [``JobCancelled``][sqla_jobs.exceptions.JobCancelled] or
        [``JobTimeout``][sqla_jobs.exceptions.JobTimeout] if this run must stop."""
        stop = self.interruption()
        if stop is not None:
            raise stop

    # --- for the worker -----------------------------------------------------------------

    def on_interrupt(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` (from another thread) when the run is cancelled or abandoned
        while the handler still runs; e.g. cancel the statement its connection runs."""
        with self._lock:
            self._hooks.append(hook)

    def finish(self) -> None:
        """The handler returned or raised: interrupt hooks no longer fire."""
        with self._lock:
            self.running = False
            self._hooks.clear()

    def request_cancel(self) -> bool:
        """An operator cancelled the job; False if that was already known."""
        with self._lock:
            if self.cancel_requested_at is not None:
                return False
            self.cancel_requested_at = time.monotonic()
        self._interrupt()
        return True

    @property
    def expiry_signalled(self) -> bool:
        return self._expired

    def expired(self) -> None:
        """The deadline passed: interrupt what the handler runs in the database (once:
        each cancel request opens a connection to the server)."""
        with self._lock:
            if self._expired:
                return
            self._expired = True
        self._interrupt()

    def stop_due(self, grace: float, now: float | None = None) -> bool:
        """Whether the worker stops waiting: ``grace`` seconds past the deadline or cancel."""
        now = time.monotonic() if now is None else now
        limit = self.deadline
        if self.cancel_requested_at is not None:
            at = self.cancel_requested_at
            limit = at if limit is None else min(limit, at)
        return limit is not None and now >= limit + grace

    def abandon(self) -> bool:
        """The worker records the outcome itself; False if the handler already returned."""
        with self._lock:
            if not self.running or self.abandoned:
                return False
            self.abandoned = True
        self._interrupt()
        return True

    def _interrupt(self) -> None:
        with self._lock:
            if not self.running:
                return
            hooks = list(self._hooks)
            # Under the lock, so finish() cannot slip in between and the hook cannot
            # cancel the worker's own done-mark.
            for hook in hooks:
                with contextlib.suppress(Exception):  # best effort; abandonment follows
                    hook()
