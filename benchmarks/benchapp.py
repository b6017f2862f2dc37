"""Handlers the benchmark workers run: ``python -m sqla_jobs.worker benchapp:registry``.

``noop`` does nothing (the worker's own overhead); ``write`` inserts one row in the
handler's session, so the row and the done-mark commit in one transaction; ``stamp``
records when the handler started (``time.time()``, the producer's clock is the same
machine's) for the pickup-latency scenario; ``sleep`` waits 0.2 s (an I/O-bound job on
a thread); ``nap`` waits 2 ms (a call to a fast service; the busy-case pickup's
I/O-bound bursts). ``SETUP_SQL`` creates their tables.

``async_registry`` (``benchapp:async_registry``) holds their ``async def`` twins:
``noop`` does nothing, ``sleep`` awaits ``asyncio.sleep(0.2)``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pickup_trace
import slots_trace
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Registry

pickup_trace.install()  # only with SQLA_JOBS_BENCH_TRACE set (run.py's traced pickup)
slots_trace.install()  # only with SQLA_JOBS_SLOTS_TRACE set (slots.py --trace)

registry = Registry()

SETUP_SQL = """
CREATE TABLE IF NOT EXISTS bench_effects (job_id bigint PRIMARY KEY, n int NOT NULL);
CREATE TABLE IF NOT EXISTS bench_pickup (job_id bigint PRIMARY KEY, started float8 NOT NULL);
CREATE TABLE IF NOT EXISTS bench_slots (
  job_id bigint PRIMARY KEY, scope text NOT NULL, worker text NOT NULL,
  started float8 NOT NULL, ended float8 NOT NULL
);
"""

_WRITE = sa.text("INSERT INTO bench_effects (job_id, n) VALUES (:j, :n)")
_STAMP = sa.text("INSERT INTO bench_pickup (job_id, started) VALUES (:j, :t)")


@registry.handler("noop")
def noop(session: Session, payload: dict[str, Any]) -> None:
    pass


@registry.handler("write")
def write(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    session.execute(_WRITE, {"j": job.id, "n": payload.get("n", 0)})


@registry.handler("stamp")
def stamp(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    started = time.time()
    session.execute(_STAMP, {"j": job.id, "t": started})


@registry.handler("nap")
def nap(session: Session, payload: dict[str, Any]) -> None:
    time.sleep(0.002)


#: The same no-op handler beside limited kinds (``benchapp:limited``), for the cost of
#: queue control: ``noop`` stays unlimited, ``noop16`` may run 16 at once across the
#: fleet, ``idle3`` (limit 3) never has jobs.
limited = Registry()
limited.register("noop", noop.fn)
limited.register("noop16", noop.fn, limit=16)
limited.register("idle3", noop.fn, limit=3)


#: A 2 ms job (a call to a fast service), unlimited and limited to 16.
limited.register("nap", nap.fn)
limited.register("nap16", nap.fn, limit=16)


#: Seconds a ``sleep`` job waits (sync: time.sleep; async: asyncio.sleep).
SLEEP_SECONDS = 0.2


@registry.handler("sleep")
def sleep(session: Session, payload: dict[str, Any]) -> None:
    time.sleep(SLEEP_SECONDS)


async_registry = Registry()


@async_registry.handler("noop")
async def async_noop(session: AsyncSession, payload: dict[str, Any]) -> None:
    pass


@async_registry.handler("sleep")
async def async_sleep(session: AsyncSession, payload: dict[str, Any]) -> None:
    await asyncio.sleep(SLEEP_SECONDS)


#: Limited kinds and queues with 10 ms jobs that log when they ran (``benchapp:slots``),
#: for how busy a limit's slots are kept: ``one`` and ``four`` are kinds limited to 1
#: and 4 fleet-wide; ``q1work`` and ``q4work`` unlimited kinds in queues limited to 1
#: and 4. ``SLOT_SECONDS`` of work each; the run's marks go in ``bench_slots``.
slots = Registry()
slot_queues = Registry()
slot_queues.limit_queue("q1", limit=1)
slot_queues.limit_queue("q4", limit=4)

#: Seconds of work in each ``slots`` job.
SLOT_SECONDS = 0.010

_SLOT = sa.text(
    "INSERT INTO bench_slots (job_id, scope, worker, started, ended) VALUES (:j, :s, :w, :t0, :t1)"
)


def _slot(session: Session, payload: dict[str, Any], job: JobContext) -> None:
    started = time.time()
    time.sleep(SLOT_SECONDS)
    ended = time.time()
    scope = job.kind if job.kind in ("one", "four") else job.queue
    session.execute(_SLOT, {"j": job.id, "s": scope, "w": job.worker, "t0": started, "t1": ended})


slots.register("one", _slot, limit=1)
slots.register("four", _slot, limit=4)
slot_queues.register("q1work", _slot, queue="q1")
slot_queues.register("q4work", _slot, queue="q4")
