"""The prefetch buffer's order: claimed jobs wait for a handler slot, most urgent first.

Each claim returns its jobs in priority order, but a later claim may bring a job of a
higher priority while jobs of a lower one, claimed earlier, still wait in the buffer.
A first-in-first-out buffer made that job wait for all of them (up to the prefetch
buffer's 50 ms of work, more under load). Both pools' buffers hand out the highest
priority first (the smallest ``priority``), and in claim order within one priority.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import queue
import threading

from sqla_jobs.worker._inflight import Claimed


class Waiting:
    """Claimed jobs ordered by ``(priority, claim order)``; any thread may push and pop."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Claimed]] = []
        self._lock = threading.Lock()
        self._order = itertools.count()
        self._by_priority: collections.Counter[int] = collections.Counter()

    def push(self, job: Claimed) -> None:
        with self._lock:
            heapq.heappush(self._heap, (job.priority, next(self._order), job))
            self._by_priority[job.priority] += 1

    def pop(self) -> Claimed:
        """The most urgent job; ``IndexError`` if none waits."""
        with self._lock:
            job = heapq.heappop(self._heap)[2]
            self._by_priority[job.priority] -= 1
            return job

    def least_urgent(self) -> int | None:
        """The largest ``priority`` a waiting job has; None if none waits."""
        with self._lock:
            return max((p for p, n in self._by_priority.items() if n > 0), default=None)

    def __len__(self) -> int:
        return len(self._heap)


class ThreadBuffer:
    """The handler threads' buffer: ``get`` blocks until a job or a stop sentinel.

    A ``queue.SimpleQueue`` carries one token per item, in the order put (so each
    thread's stop sentinel comes after the jobs put before it); the job a token
    stands for is whichever is most urgent when it is taken.
    """

    def __init__(self) -> None:
        self.jobs = Waiting()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def put(self, item: Claimed | None) -> None:
        """Buffer a job, or (``None``) tell one handler thread to stop."""
        if item is not None:
            self.jobs.push(item)  # before its token: a token always finds its job
        self._tokens.put(item is not None)

    def get(self) -> Claimed | None:
        """The next job, waiting for one; ``None``: the thread stops."""
        return self.jobs.pop() if self._tokens.get() else None

    def get_nowait(self) -> Claimed | None:
        """Like ``get`` without waiting: ``queue.Empty`` if nothing is buffered."""
        return self.jobs.pop() if self._tokens.get_nowait() else None
