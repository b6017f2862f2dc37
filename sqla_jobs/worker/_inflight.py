"""The one ledger of the jobs this worker holds, under the worker's one lock.

A claimed job moves through four states and then leaves the ledger::

    BUFFERED ──> RUNNING ──> SETTLING ──> (gone)          handler wrote, or failed
                                  └─────> COMPLETING ──> (gone)   no-op: batch done-mark

* ``BUFFERED``: claimed, waiting in the buffer for a handler thread;
* ``RUNNING``: a handler runs it;
* ``SETTLING``: its outcome is being written on the handler's thread (done-mark,
  retry, release); the handler slot is still taken;
* ``COMPLETING``: the handler returned without writing; the completer will mark it done
  in a batch. Its handler slot is free.

Slots are counted per pool: pool 0 is the handler threads (plain ``def`` handlers),
pool 1 the event loop's tasks (``async def`` handlers); the dispatcher sizes each
pool's claims from its own free slots.

Every held job's lease is renewed by the lease keeper. A lease that vanishes while the
job is ``BUFFERED`` or ``RUNNING`` was lost (taken over, changed by an operator); while
it is ``SETTLING`` or ``COMPLETING``, the vanishing is this worker's own write.

The ledger also knows, by this process's clock, until when each lease surely holds:
from the moment its claim or its last renewal was sent, plus the lease length. A
buffered job whose lease may have expired (the process was frozen, or the database
was unreachable for a lease) is not started (``start``): another worker may run it
already, and a second run's side effects outside the database are what the fence
cannot undo.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, NamedTuple

from sqla_jobs.control import Control
from sqla_jobs.tasks import JobContext


class Claimed(NamedTuple):
    """A job this worker claimed: ``(id, attempt)`` is its fence.

    A named tuple, built from each claimed row as it comes (``Claimed(*row)``): a frozen
    dataclass spent 5 us per job in ``__init__`` (one ``object.__setattr__`` per
    field), a tenth of the dispatcher's time on no-op jobs (benchmarks/README.md).
    """

    id: int
    kind: str
    queue: str
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    timeout: float | None = None
    snoozes: int = 0
    #: 0 (most urgent) to 9: the buffer hands out the most urgent job first.
    priority: int = 0
    #: The job's metadata (revision 0013); None when it has none.
    meta: dict[str, Any] | None = None
    tags: list[str] | None = None
    #: Seconds from its run_at to its claim, both by the database's clock.
    waited: float | None = None
    #: Its run_at (the database's): the dispatcher's next claim of its priority starts
    #: its walk of the queued jobs near it (sqla_jobs.sql.lease.claim's floors).
    run_at: datetime | None = None

    @property
    def lease(self) -> tuple[int, int]:
        return (self.id, self.attempt)

    def context(self, worker: str, control: Control) -> JobContext:
        """What its handler may know about this run (``job`` / ``current_job()``)."""
        return JobContext(
            self.id,
            self.kind,
            self.queue,
            self.attempt,
            self.max_attempts,
            worker,
            control=control,
            meta=self.meta or {},
            tags=tuple(self.tags or ()),
        )


class Attempt(NamedTuple):
    """What one run of a handler did: returned (and whether it wrote), or raised.

    A named tuple, like ``Claimed``: one is built per job.
    """

    job: Claimed
    duration: float
    error: BaseException | None = None
    wrote: bool = False
    #: The handler's return value as JSON text (None: it returned None).
    result: str | None = None
    #: The run's deadline and cancel flag, when it had a handler run.
    control: Control | None = None
    #: Its recording OpenTelemetry process span (an ``_otel.AttemptSpan``), on which
    #: the completer records the outcome; None when nothing records.
    span: Any = None


class State(enum.Enum):
    BUFFERED = "buffered"
    RUNNING = "running"
    SETTLING = "settling"
    COMPLETING = "completing"


KIND = "kind"
QUEUE = "queue"
_HOLDS_SLOT = (State.BUFFERED, State.RUNNING, State.SETTLING)
_OURS_TO_LOSE = (State.BUFFERED, State.RUNNING)
_RUNS = (State.RUNNING, State.SETTLING)


#: The pools of handler slots: the handler threads, and the event loop's tasks.
SYNC_POOL = 0
ASYNC_POOL = 1


class Inflight:
    """Claims held by this worker, by ``(id, attempt)``, with their state and pool; and
    the room for more.

    Keyed by the claim, not the job: a worker frozen past its lease can claim the job
    again while its stale run is still in a handler. That run's end must neither take
    the new claim out of the heartbeat nor free the new claim's slot, and the new claim
    must not hide the stale one's slot (which frees when the stale run ends).

    ``on_room`` is called (outside the lock) when a handler slot frees up while the
    dispatcher waits for room in that pool (``room``), and whenever the ledger
    empties. ``on_end`` (outside the lock, on the thread that freed it) with every job
    whose handler slot frees up: a limited kind's held-back job may start in its place.
    """

    def __init__(
        self,
        on_room: Callable[[], None],
        lease_seconds: float = float("inf"),
        on_end: Callable[[Claimed, int], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[tuple[int, int], tuple[Claimed, State, int]] = {}
        self._lease_seconds = lease_seconds
        # Per claim: the monotonic time until which its lease surely holds.
        self._held_until: dict[tuple[int, int], float] = {}
        self._slots_taken = [0, 0]  # per pool
        # Jobs holding a slot, per (KIND, kind) and (QUEUE, queue): read per job ended.
        self._held: collections.Counter[tuple[str, str]] = collections.Counter()
        self._on_end = on_end
        # Per pool: wake the dispatcher when that pool's slots taken <= this.
        self._room_at: list[int | None] = [None, None]
        # Limited kinds and queues: (scope, name) -> how many of its jobs must free their
        # slots before the dispatcher is woken to claim it again (see wake_after).
        self._watches: dict[tuple[str, str], int] = {}
        self._on_room = on_room
        self._controls: dict[tuple[int, int], Control] = {}  # RUNNING claims' stop signals
        self._cancels: set[int] = set()  # cancel requests for jobs not started yet

    def add(
        self, jobs: Iterable[Claimed], pool: int = SYNC_POOL, since: float | None = None
    ) -> None:
        """Hold claimed ``jobs``; ``since`` is when their claim was sent (monotonic)."""
        held_until = (time.monotonic() if since is None else since) + self._lease_seconds
        with self._lock:
            for job in jobs:
                self._jobs[job.lease] = (job, State.BUFFERED, pool)
                self._held_until[job.lease] = held_until
                self._slots_taken[pool] += 1
                self._held[(KIND, job.kind)] += 1
                self._held[(QUEUE, job.queue)] += 1

    def renewed(self, leases: Iterable[tuple[int, int]], since: float) -> None:
        """The lease keeper renewed ``leases`` by a statement sent at ``since``."""
        held_until = since + self._lease_seconds
        with self._lock:
            for key in leases:
                if key in self._held_until:
                    self._held_until[key] = max(self._held_until[key], held_until)

    def start(self, job: Claimed) -> bool:
        """BUFFERED -> RUNNING, unless the job's lease may have expired (False: not ours
        to start; the caller gives the claim back, fenced)."""
        with self._lock:
            entry = self._jobs.get(job.lease)
            if entry is None:
                return False
            if self._held_until.get(job.lease, 0.0) <= time.monotonic():
                return False
            self._jobs[job.lease] = (job, State.RUNNING, entry[2])
            return True

    def move(self, job: Claimed, state: State) -> None:
        """BUFFERED -> RUNNING -> SETTLING or COMPLETING (the latter frees the slot)."""
        with self._lock:
            entry = self._jobs.get(job.lease)
            if entry is None:
                return  # a late thread's claim, already given up
            before, pool = entry[1], entry[2]
            self._jobs[job.lease] = (job, state, pool)
            freed = before in _HOLDS_SLOT and state not in _HOLDS_SLOT
            wake = self._free_slot(job, pool) if freed else False
        if freed and self._on_end is not None:
            self._on_end(job, pool)
        if wake:
            self._on_room()

    def remove(self, jobs: Iterable[Claimed]) -> None:
        """The jobs' outcomes are recorded (or left to their leases): no longer held."""
        wake = False
        ended: list[tuple[Claimed, int]] = []
        with self._lock:
            for job in jobs:
                entry = self._jobs.pop(job.lease, None)
                if entry is None:
                    continue  # a late thread's claim, already given up (see overdue)
                self._controls.pop(job.lease, None)
                self._held_until.pop(job.lease, None)
                self._cancels.discard(job.id)
                if entry[1] in _HOLDS_SLOT:
                    wake = self._free_slot(job, entry[2]) or wake
                    ended.append((job, entry[2]))
            wake = wake or not self._jobs
        if self._on_end is not None:
            for job, pool in ended:
                self._on_end(job, pool)
        if wake:
            self._on_room()

    def _free_slot(self, job: Claimed, pool: int) -> bool:
        self._slots_taken[pool] -= 1
        self._held[(KIND, job.kind)] -= 1
        self._held[(QUEUE, job.queue)] -= 1
        if self._watches and self._watched(job):
            return True
        room_at = self._room_at[pool]
        if room_at is not None and self._slots_taken[pool] <= room_at:
            self._room_at[pool] = None
            return True
        return False

    def room(self, capacity: int, min_claim: int, pool: int = SYNC_POOL) -> int:
        """Free slots of ``pool``; if fewer than ``min_claim``, ask to be woken when there are."""
        with self._lock:
            free = capacity - self._slots_taken[pool]
            self._room_at[pool] = capacity - min_claim if free < min_claim else None
            return free

    def _watched(self, job: Claimed) -> bool:
        for key in ((KIND, job.kind), (QUEUE, job.queue)):
            left = self._watches.get(key)
            if left is not None:
                if left <= 1:
                    del self._watches[key]
                    return True
                self._watches[key] = left - 1
        return False

    def wake_after(self, scope: str, name: str, count: int) -> None:
        """Wake the dispatcher once ``count`` more jobs of this kind or queue free their slots.

        A limited kind full of this worker's own jobs is claimed again in batches (half
        its limit), not one claim per finished job.
        """
        with self._lock:
            self._watches[(scope, name)] = max(1, count)

    def holding(self, scope: str, name: str) -> int:
        """Jobs of this kind (``scope="kind"``) or queue held and not yet finished running.

        Buffered, running and settling jobs count; a job whose handler returned without
        writing (waiting for its batch done-mark) does not: it runs no more.
        """
        with self._lock:
            return self._held[(scope, name)]

    def holding_unlocked(self, scope: str, name: str) -> int:
        """``holding`` without taking the lock, for a caller that runs once per job:
        one read of a counter, which counts a job when it is added and stops when it
        frees its slot (so a caller that adds jobs and then reads sees them)."""
        return self._held[(scope, name)]

    def running_ages(self, pool: int = SYNC_POOL) -> list[float]:
        """Seconds each handler of ``pool`` has been running its job, so far."""
        now = time.monotonic()
        with self._lock:
            return [
                now - control.started
                for key, control in self._controls.items()
                if (entry := self._jobs.get(key)) is not None
                and entry[1] is State.RUNNING
                and entry[2] == pool
            ]

    def taken(self, pool: int = SYNC_POOL) -> int:
        """Handler slots of ``pool`` taken (buffered, running or settling jobs)."""
        with self._lock:
            return self._slots_taken[pool]

    def running(self) -> int:
        """Jobs a handler is running now."""
        with self._lock:
            return sum(1 for _, state, _ in self._jobs.values() if state is State.RUNNING)

    def unfinished(self) -> tuple[list[Claimed], list[Claimed]]:
        """The jobs held now, by id: those whose handler still runs (or whose outcome is
        being written on its thread), and the others (a handler that returned, waiting
        for its batch done-mark)."""
        with self._lock:
            held = sorted(self._jobs.values(), key=lambda entry: entry[0].lease)
        return (
            [job for job, state, _ in held if state in _RUNS],
            [job for job, state, _ in held if state not in _RUNS],
        )

    def leases(self) -> list[tuple[int, int]]:
        """The leases to renew: every held job's but those given up (``overdue``)."""
        with self._lock:
            return [
                job.lease
                for job, _, _ in self._jobs.values()
                if not ((c := self._controls.get(job.lease)) is not None and c.abandoned)
            ]

    # --- stopping running jobs (timeouts and cancels) ------------------------------------

    def watch(self, job: Claimed, control: Control) -> None:
        """``job``'s handler starts with ``control``; a cancel that came first applies now."""
        with self._lock:
            self._controls[job.lease] = control
            cancelled = job.id in self._cancels
            self._cancels.discard(job.id)
        if cancelled:
            control.request_cancel()

    def request_cancel(self, job_id: int) -> bool:
        """An operator cancelled ``job_id``: tell its handler. False if we do not hold it,
        or knew already (the heartbeat reports the flag at every round)."""
        with self._lock:
            held = [lease for lease in self._jobs if lease[0] == job_id]
            if not held:
                return False
            control = self._controls.get(max(held))  # the newest claim's run
            if control is None:
                new = job_id not in self._cancels
                self._cancels.add(job_id)
                return new
        return control.request_cancel()

    def overdue(self, grace: float) -> list[tuple[Claimed, Control]]:
        """Running jobs ``grace`` seconds past their deadline or cancel, not yet given up."""
        with self._lock:
            return [
                (job, control)
                for job, state, _ in self._jobs.values()
                if state is State.RUNNING
                and (control := self._controls.get(job.lease)) is not None
                and not control.abandoned
                and control.stop_due(grace)
            ]

    def expiring(self) -> list[Control]:
        """Controls of running jobs whose deadline passed (their statements get cancelled)."""
        with self._lock:
            return [
                c
                for job, state, _ in self._jobs.values()
                if state is State.RUNNING
                and (c := self._controls.get(job.lease)) is not None
                and c.timed_out
                and c.running
                and not c.expiry_signalled
            ]

    def was_lost(self, job_id: int, attempt: int) -> bool:
        """Whether a vanished lease means the claim was lost (not our own outcome write)."""
        with self._lock:
            entry = self._jobs.get((job_id, attempt))
            return entry is not None and entry[1] in _OURS_TO_LOSE

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)
