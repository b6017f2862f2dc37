"""Peer baselines for the sqla_jobs benchmark suite.

Each public function takes the libpq URL of an *empty* scratch database and a
job count, creates its own schema, and returns a rate in jobs/s. Only the
part named in its docstring is inside the ``time.perf_counter()`` window;
schema creation, connecting and pre-loading are not timed.

The ``raw_*`` peers use the design we started from (the "Reliable Background
Jobs with Nothing but PostgreSQL" seed): its table, enum, partial index,
per-row NOTIFY trigger, and its claim/done/retry statements, verbatim.
The ``pgqueuer_*`` peers use the pgqueuer 1.6 library as documented.

Run ``python benchmarks/peers.py`` to print every figure once (5000 jobs).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import backend_cpu
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]

# --------------------------------------------------------------------------
# The seed design, verbatim.
# --------------------------------------------------------------------------

SEED_SCHEMA = """
CREATE TYPE job_status AS ENUM ('queued', 'running', 'done', 'dead');

CREATE TABLE jobs (
  id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  kind            text        NOT NULL,
  payload         jsonb       NOT NULL,
  status          job_status  NOT NULL DEFAULT 'queued',
  run_at          timestamptz NOT NULL DEFAULT now(),
  locked_until    timestamptz,
  attempts        int         NOT NULL DEFAULT 0,
  max_attempts    int         NOT NULL DEFAULT 8,
  idempotency_key text        UNIQUE,
  worker          text,
  last_error      text,
  created_at      timestamptz NOT NULL DEFAULT now(),
  finished_at     timestamptz
);

CREATE INDEX jobs_claim_idx ON jobs (run_at)
  WHERE status IN ('queued', 'running');
"""

SEED_TRIGGER = """
CREATE FUNCTION jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('jobs', NEW.kind);
  RETURN NEW;
END $$;

CREATE TRIGGER jobs_notify AFTER INSERT ON jobs
  FOR EACH ROW EXECUTE FUNCTION jobs_notify();
"""

CLAIM = """
UPDATE jobs
   SET status = 'running',
       locked_until = now() + make_interval(secs => %(lock)s),
       attempts = attempts + 1,
       worker = %(worker)s
 WHERE id = (
       SELECT id
         FROM jobs
        WHERE (status = 'queued'  AND run_at <= now())
           OR (status = 'running' AND locked_until < now())
        ORDER BY run_at
        FOR UPDATE SKIP LOCKED
        LIMIT 1)
RETURNING id, kind, payload, attempts, max_attempts;
"""

DONE = "UPDATE jobs SET status = 'done', finished_at = now(), locked_until = NULL WHERE id = %s"

RETRY = """
UPDATE jobs
   SET status       = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END,
       run_at       = now() + make_interval(secs => %(delay)s),
       locked_until = NULL,
       last_error   = %(error)s
 WHERE id = %(id)s
"""

ENQUEUE = """INSERT INTO jobs (kind, payload, run_at, idempotency_key)
           VALUES (%s, %s, now() + make_interval(secs => %s), %s)
           ON CONFLICT (idempotency_key) DO NOTHING"""

# Batched variant of CLAIM: same predicate, same SET, up to %(batch)s rows.
CLAIM_BATCH = """
UPDATE jobs
   SET status = 'running',
       locked_until = now() + make_interval(secs => %(lock)s),
       attempts = attempts + 1,
       worker = %(worker)s
 WHERE id IN (
       SELECT id
         FROM jobs
        WHERE (status = 'queued'  AND run_at <= now())
           OR (status = 'running' AND locked_until < now())
        ORDER BY run_at
        FOR UPDATE SKIP LOCKED
        LIMIT %(batch)s)
RETURNING id, kind, payload, attempts, max_attempts;
"""

DONE_BATCH = "UPDATE jobs SET status = 'done', finished_at = now() WHERE id = ANY(%s)"

COPY_JOBS = "COPY jobs (kind, payload) FROM STDIN"

LOCK_SECONDS = 30
#: How long the busy-case peer's idle threads wait before claiming anyway (our default).
POLL_SECONDS = 1.0
BASE, CAP = 2.0, 300.0
WORKER = f"{socket.gethostname()}:{os.getpid()}"
KIND = "noop"

Handler = Callable[[psycopg.Connection[Any], Any], None]
HANDLERS: dict[str, Handler] = {KIND: lambda conn, payload: None}


def backoff(attempt: int) -> float:
    """Full jitter: uniform(0, min(cap, base * 2^(attempt-1))), as in the seed."""
    return random.uniform(0, min(CAP, BASE * 2 ** (attempt - 1)))  # jitter, not crypto


# --------------------------------------------------------------------------
# Helpers (never timed).
# --------------------------------------------------------------------------


def _rate(n_jobs: int, seconds: float) -> float:
    return n_jobs / seconds if seconds > 0 else float("inf")


def _install_seed_schema(url: str, trigger: bool = True) -> None:
    """Create the seed's enum, table, partial index and (optionally) trigger."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED_SCHEMA)
        if trigger:
            conn.execute(SEED_TRIGGER)


def _copy_jobs(conn: psycopg.Connection[Any], n_jobs: int) -> None:
    """COPY *n_jobs* no-op jobs into ``jobs`` (the caller commits)."""
    with conn.cursor() as cur, cur.copy(COPY_JOBS) as copy:
        for i in range(n_jobs):
            copy.write_row((KIND, Jsonb({"user_id": i})))


def _seed_with_jobs(url: str, n_jobs: int) -> None:
    """Seed schema with trigger, then *n_jobs* queued jobs, committed."""
    _install_seed_schema(url)
    with psycopg.connect(url) as conn:
        _copy_jobs(conn, n_jobs)
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")


def _count_jobs(url: str, status: str | None = None) -> int:
    """Rows in ``jobs``, all of them or those with *status*."""
    query = "SELECT count(*) FROM jobs WHERE %(status)s::job_status IS NULL OR status = %(status)s"
    with psycopg.connect(url) as conn:
        row = conn.execute(query, {"status": status}).fetchone()
    return int(row[0]) if row else 0


def _check_count(url: str, expected: int, status: str | None = None) -> None:
    got = _count_jobs(url, status)
    if got != expected:
        raise RuntimeError(f"expected {expected} jobs (status={status}), found {got}")


# --------------------------------------------------------------------------
# Raw SQL peers (the seed design).
# --------------------------------------------------------------------------


def _run_one(conn: psycopg.Connection[dict[str, Any]]) -> bool:
    """The seed's ``run_one``: claim txn, handler, done (or retry) txn."""
    with conn.transaction():
        job = conn.execute(CLAIM, {"lock": LOCK_SECONDS, "worker": WORKER}).fetchone()
    if job is None:
        return False
    try:
        HANDLERS[job["kind"]](conn, job["payload"])
        conn.execute(DONE, (job["id"],))
        conn.commit()
    except Exception as exc:  # same shape as the seed
        conn.rollback()
        delay = backoff(job["attempts"])
        conn.execute(RETRY, {"delay": delay, "error": repr(exc)[:2000], "id": job["id"]})
        conn.commit()
    return True


def raw_seed_loop_drain(url: str, n_jobs: int) -> float:
    """Drain rate of the seed's worker loop, one job per claim.

    One connection, one claim transaction plus one done transaction per job,
    no-op handler. Timed: from the first claim until a claim finds nothing.
    Jobs are COPYed in beforehand (untimed).
    """
    _seed_with_jobs(url, n_jobs)
    with psycopg.connect(url, row_factory=dict_row, autocommit=False) as conn:
        processed = 0
        t0 = time.perf_counter()
        while _run_one(conn):
            processed += 1
        elapsed = time.perf_counter() - t0
    if processed != n_jobs:
        raise RuntimeError(f"seed loop processed {processed} of {n_jobs} jobs")
    _check_count(url, n_jobs, "done")
    return _rate(n_jobs, elapsed)


def _drain_batches(conn: psycopg.Connection[dict[str, Any]], batch: int) -> int:
    """Claim up to *batch* per statement, run handlers, mark all done; repeat."""
    processed = 0
    params = {"lock": LOCK_SECONDS, "worker": WORKER, "batch": batch}
    while True:
        jobs = conn.execute(CLAIM_BATCH, params).fetchall()
        conn.commit()
        if not jobs:
            return processed
        for job in jobs:
            HANDLERS[job["kind"]](conn, job["payload"])
        conn.execute(DONE_BATCH, ([job["id"] for job in jobs],))
        conn.commit()
        processed += len(jobs)


def raw_batched_drain(
    url: str, n_jobs: int, batch: int = 100, cpu: list[tuple[float, float]] | None = None
) -> float:
    """Drain rate with the seed schema, claiming *batch* jobs per statement.

    Per batch: one claim transaction (``WHERE id IN (... SKIP LOCKED LIMIT
    batch)``) and one done transaction (``WHERE id = ANY(%s)``); no-op
    handler. Timed: first claim until a claim returns nothing. *cpu*, if given,
    gets ``(client, server)`` CPU microseconds per job (``backend_cpu``).
    """
    _seed_with_jobs(url, n_jobs)
    with psycopg.connect(url, row_factory=dict_row, autocommit=False) as conn:
        spent = backend_cpu.DrainCpu(url, [os.getpid()])
        spent.start()
        t0 = time.perf_counter()
        processed = _drain_batches(conn, batch)
        elapsed = time.perf_counter() - t0
        spent.stop()
        if cpu is not None:
            cpu.append(spent.per_job(n_jobs))
    if processed != n_jobs:
        raise RuntimeError(f"batched drain processed {processed} of {n_jobs} jobs")
    _check_count(url, n_jobs, "done")
    return _rate(n_jobs, elapsed)


def raw_copy_enqueue(url: str, n_jobs: int) -> float:
    """Enqueue rate of one COPY of *n_jobs* rows into the seed schema.

    The per-row NOTIFY trigger is installed. Timed: the COPY and its commit
    (one transaction); connecting is not timed.
    """
    _install_seed_schema(url, trigger=True)
    with psycopg.connect(url) as conn:
        t0 = time.perf_counter()
        _copy_jobs(conn, n_jobs)
        conn.commit()
        elapsed = time.perf_counter() - t0
    _check_count(url, n_jobs)
    return _rate(n_jobs, elapsed)


def _split(n_jobs: int, parts: int) -> list[int]:
    """Split *n_jobs* into *parts* near-equal shares."""
    return [n_jobs // parts + (1 if i < n_jobs % parts else 0) for i in range(parts)]


def _produce(conn: psycopg.Connection[Any], count: int, first: int) -> None:
    """Insert *count* jobs, one autocommit INSERT (= one transaction) each."""
    for i in range(first, first + count):
        conn.execute(ENQUEUE, (KIND, Jsonb({"user_id": i}), 0, None))


def raw_insert_single(url: str, n_jobs: int, producers: int, trigger: bool) -> float:
    """Enqueue rate of *producers* threads doing one INSERT per transaction.

    Each thread has its own autocommit connection and runs the seed's
    ``enqueue`` INSERT (``ON CONFLICT (idempotency_key) DO NOTHING``, no key)
    until the threads together have inserted *n_jobs*. *trigger* selects
    whether the seed's per-row ``jobs_notify`` trigger is installed.
    Timed: from starting the threads until the last one finishes
    (connections are opened before the clock starts).
    """
    if producers < 1:
        raise ValueError("producers must be >= 1")
    _install_seed_schema(url, trigger=trigger)
    shares = _split(n_jobs, producers)
    firsts = [sum(shares[:i]) for i in range(producers)]
    with ExitStack() as stack:
        conns = [
            stack.enter_context(psycopg.connect(url, autocommit=True)) for _ in range(producers)
        ]
        with ThreadPoolExecutor(max_workers=producers) as pool:
            t0 = time.perf_counter()
            futures = [
                pool.submit(_produce, c, s, f)
                for c, s, f in zip(conns, shares, firsts, strict=True)
            ]
            for fut in futures:
                fut.result()
            elapsed = time.perf_counter() - t0
    _check_count(url, n_jobs)
    return _rate(n_jobs, elapsed)


PICKUP_TABLE = "CREATE TABLE bench_pickup (job_id bigint PRIMARY KEY, started float8 NOT NULL)"


def _raw_listen_consumer(url: str, ready: Any, stop: Any) -> None:
    """A child process: LISTEN; on each notification, claim (the seed's CLAIM, one
    autocommit statement) until nothing is ready; the handler's first line stamps
    ``time.time()``. One thread: no hand-off between the notification and the handler."""
    with (
        psycopg.connect(url, autocommit=True) as listen,
        psycopg.connect(url, autocommit=True) as work,
    ):
        listen.execute("LISTEN jobs")
        params = {"lock": LOCK_SECONDS, "worker": WORKER}
        ready.set()
        while not stop.is_set():
            for _ in listen.notifies(timeout=0.2, stop_after=1):
                pass
            while (job := work.execute(CLAIM, params).fetchone()) is not None:
                started = time.time()  # the handler's first line
                work.execute("INSERT INTO bench_pickup VALUES (%s, %s)", (job[0], started))
                work.execute(DONE, (job[0],))


def raw_notify_pickup(
    url: str, n_jobs: int, interval: float, in_transaction: bool = False
) -> list[float]:
    """Pickup latencies (ms) of the seed's design driven by raw psycopg: per-row NOTIFY
    trigger, a consumer process that claims on each notification; one job every
    ``interval`` s, each an autocommit INSERT, or with ``in_transaction`` an INSERT
    between BEGIN and COMMIT (three round trips, as any enqueue that joins a caller's
    transaction). Timed: from just before the producer's INSERT (its BEGIN) to the
    handler's first line (``time.time()`` on both sides)."""
    _install_seed_schema(url, trigger=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PICKUP_TABLE)
    sent: dict[int, float] = {}
    with _consumer(_raw_listen_consumer, url), psycopg.connect(url, autocommit=True) as conn:
        insert = "INSERT INTO jobs (kind, payload) VALUES (%s, %s) RETURNING id"
        tick = time.perf_counter()
        for i in range(n_jobs):
            before = time.time()
            with conn.transaction() if in_transaction else nullcontext():
                row = conn.execute(insert, (KIND, Jsonb({"i": i}))).fetchone()
            assert row is not None
            sent[int(row[0])] = before
            tick += interval
            time.sleep(max(0.0, tick - time.perf_counter()))
        deadline = time.perf_counter() + 60
        while _count_jobs(url, "done") < n_jobs and time.perf_counter() < deadline:
            time.sleep(0.02)
        started: dict[int, float] = dict(
            conn.execute("SELECT job_id, started FROM bench_pickup").fetchall()
        )
    return [(started[j] - t) * 1000 for j, t in sent.items()]


# The busy-case pickup's peer: the seed's design plus what the scenario needs to be fair
# to it, a priority (its stamps are 0 and its bursts 9, as for ours) in the claim's order.
BUSY_SCHEMA = """
ALTER TABLE jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0;
CREATE INDEX jobs_priority_claim_idx ON jobs (priority, run_at)
  WHERE status IN ('queued', 'running');
"""

CLAIM_BY_PRIORITY = CLAIM.replace("ORDER BY run_at", "ORDER BY priority, run_at")
BUSY_INSERT = "INSERT INTO jobs (kind, payload) VALUES ('stamp', '{}') RETURNING id"
BUSY_BURST = "COPY jobs (kind, payload, priority) FROM STDIN"


def install_busy_schema(url: str) -> None:
    """The seed's schema with its per-row NOTIFY trigger, a priority, ``bench_pickup``."""
    _install_seed_schema(url, trigger=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BUSY_SCHEMA)
        conn.execute(PICKUP_TABLE)


def raw_busy_burst(conn: psycopg.Connection[Any], kind: str, count: int) -> None:
    """One transaction of ``count`` priority-9 ``kind`` jobs (COPY)."""
    with conn.transaction(), conn.cursor() as cur, cur.copy(BUSY_BURST) as copy:
        for _ in range(count):
            copy.write_row((kind, Jsonb({}), 9))


class _Wakeups:
    """Notifications counted, so a thread that found nothing waits only for a newer one
    (none is lost between its empty claim and its wait)."""

    def __init__(self) -> None:
        self.seen = 0
        self.cond = threading.Condition()

    def arrived(self) -> None:
        with self.cond:
            self.seen += 1
            self.cond.notify_all()

    def wait_past(self, seen: int, timeout: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.seen != seen, timeout)


def _busy_handler_thread(url: str, wakeups: _Wakeups, stop: Any) -> None:
    """Claim one job at a time (autocommit), run it, mark it done; when nothing is ready,
    wait for a notification (or poll after POLL_SECONDS)."""
    params = {"lock": LOCK_SECONDS, "worker": WORKER}
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            seen = wakeups.seen
            job = conn.execute(CLAIM_BY_PRIORITY, params).fetchone()
            if job is None:
                wakeups.wait_past(seen, POLL_SECONDS)
                continue
            job_id, kind = job[0], job[1]
            if kind == "stamp":
                started = time.time()  # the handler's first line
                with conn.transaction():
                    conn.execute("INSERT INTO bench_pickup VALUES (%s, %s)", (job_id, started))
                    conn.execute(DONE, (job_id,))
                continue
            if kind == "nap":
                time.sleep(0.002)
            conn.execute(DONE, (job_id,))


def _raw_busy_consumer(url: str, handlers: int, ready: Any, stop: Any) -> None:
    """A child process: one LISTEN thread that counts notifications, ``handlers``
    threads that each claim and run one job at a time."""
    wakeups = _Wakeups()
    threads = [
        threading.Thread(target=_busy_handler_thread, args=(url, wakeups, stop))
        for _ in range(handlers)
    ]
    with psycopg.connect(url, autocommit=True) as listen:
        listen.execute("LISTEN jobs")
        for t in threads:
            t.start()
        ready.set()
        while not stop.is_set():
            for _ in listen.notifies(timeout=0.2, stop_after=1):
                wakeups.arrived()
    for t in threads:
        t.join(10)


@contextmanager
def _consumer(target: Callable[..., None], *args: Any) -> Iterator[None]:
    """Run ``target(*args, ready, stop)`` in a child process while the block runs: wait
    for it to set ``ready``, and at the end set ``stop`` (killed if it does not exit)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    consumer = ctx.Process(target=target, args=(*args, ready, stop))
    consumer.start()
    try:
        if not ready.wait(60):
            raise RuntimeError(f"the consumer {target.__name__} did not start")
        yield
    finally:
        stop.set()
        consumer.join(15)
        if consumer.is_alive():
            consumer.kill()


def raw_busy_consumer(url: str, handlers: int = 4) -> contextlib.AbstractContextManager[None]:
    """Run the busy-case peer's consumer (a child process) while the block runs."""
    return _consumer(_raw_busy_consumer, url, handlers)


# --------------------------------------------------------------------------
# pgqueuer peers.
# --------------------------------------------------------------------------


class PeerUnavailable(RuntimeError):
    """A peer library is not importable; the runner should skip that peer."""


def _require_pgqueuer() -> None:
    """Raise :class:`PeerUnavailable` when pgqueuer (or asyncpg) is missing."""
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
    except ImportError as exc:
        raise PeerUnavailable("pgqueuer not installed: pip install .[bench]") from exc


@contextmanager
def _quiet_pgqueuer_logs() -> Iterator[None]:
    """pgqueuer logs at INFO per lifecycle event; keep benchmark output clean."""
    import logging

    logger = logging.getLogger("pgqueuer")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


async def _pgq_install(conn: asyncpg.Connection) -> None:
    """Install pgqueuer's schema with its Python API (``Queries.install``)."""
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    await Queries(AsyncpgDriver(conn)).install()


async def _pgq_enqueue(conn: asyncpg.Connection, n_jobs: int, batch: int) -> None:
    """``Queries.enqueue`` with lists, *batch* jobs per call (one statement each)."""
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    queries = Queries(AsyncpgDriver(conn))
    for start in range(0, n_jobs, batch):
        size = min(batch, n_jobs - start)
        payloads: list[bytes | None] = [b"%d" % i for i in range(start, start + size)]
        await queries.enqueue([KIND] * size, payloads, [0] * size)


async def _pgq_queue_count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM pgqueuer"))


async def _pgq_bulk_enqueue(url: str, n_jobs: int, batch: int) -> float:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await _pgq_install(conn)
        t0 = time.perf_counter()
        await _pgq_enqueue(conn, n_jobs, batch)
        elapsed = time.perf_counter() - t0
        if (got := await _pgq_queue_count(conn)) != n_jobs:
            raise RuntimeError(f"pgqueuer enqueued {got} of {n_jobs} jobs")
    finally:
        await conn.close()
    return _rate(n_jobs, elapsed)


def pgqueuer_bulk_enqueue(url: str, n_jobs: int, batch: int = 1000) -> float:
    """Enqueue rate of pgqueuer's batch ``Queries.enqueue`` (lists of *batch*).

    One asyncpg connection (``AsyncpgDriver``), autocommit, so each call is
    one multi-row INSERT and one transaction; pgqueuer's own NOTIFY trigger
    is installed. Timed: all enqueue calls; install and connect are not.
    """
    _require_pgqueuer()
    with _quiet_pgqueuer_logs():
        return asyncio.run(_pgq_bulk_enqueue(url, n_jobs, batch))


async def _pgq_drain(url: str, n_jobs: int, batch_size: int) -> float:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(url)
    try:
        await _pgq_install(conn)
        await _pgq_enqueue(conn, n_jobs, 1000)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))
        seen = 0

        async def noop(job: Job) -> None:
            nonlocal seen
            seen += 1

        qm.entrypoint(KIND)(noop)  # plain call: the decorator is untyped for mypy
        t0 = time.perf_counter()
        await qm.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
        elapsed = time.perf_counter() - t0
        left = await _pgq_queue_count(conn)
    finally:
        await conn.close()
    if seen != n_jobs or left != 0:
        raise RuntimeError(f"pgqueuer ran {seen} of {n_jobs} jobs, {left} rows left")
    return _rate(n_jobs, elapsed)


def pgqueuer_drain(url: str, n_jobs: int, batch_size: int = 10) -> float:
    """Drain rate of one pgqueuer ``QueueManager`` with a no-op entrypoint.

    *n_jobs* are enqueued first (untimed). Timed: ``qm.run(mode=drain)``
    from start until it returns, i.e. every job ran, its status was written
    (row moved to ``pgqueuer_log``) and the manager shut down cleanly.
    One asyncpg connection (``AsyncpgDriver``, what pgqueuer's docs
    recommend for workers); ``batch_size`` defaults to pgqueuer's default.
    """
    _require_pgqueuer()
    with _quiet_pgqueuer_logs():
        return asyncio.run(_pgq_drain(url, n_jobs, batch_size))


# --------------------------------------------------------------------------
# Manual check: python benchmarks/peers.py
# --------------------------------------------------------------------------

PEERS: dict[str, Callable[[str, int], float]] = {
    "raw_seed_loop_drain": raw_seed_loop_drain,
    "raw_batched_drain": raw_batched_drain,
    "raw_copy_enqueue": raw_copy_enqueue,
    "raw_insert_single[1 producer, trigger]": lambda u, n: raw_insert_single(u, n, 1, True),
    "raw_insert_single[1 producer, no trigger]": lambda u, n: raw_insert_single(u, n, 1, False),
    "raw_insert_single[4 producers, trigger]": lambda u, n: raw_insert_single(u, n, 4, True),
    "raw_insert_single[4 producers, no trigger]": lambda u, n: raw_insert_single(u, n, 4, False),
    "pgqueuer_bulk_enqueue": pgqueuer_bulk_enqueue,
    "pgqueuer_drain": pgqueuer_drain,
}


def main(n_jobs: int = 5000) -> None:
    """Run each peer once in its own scratch database and print its rate."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:  # `python -m benchmarks.peers` or an importer
        sys.path.insert(0, here)
    from _db import scratch_database

    for name, fn in PEERS.items():
        with scratch_database("bench_peer") as url:
            try:
                rate = fn(url, n_jobs)
            except PeerUnavailable as exc:
                print(f"{name}: skipped ({exc})", flush=True)
                continue
        print(f"{name}: {rate:,.0f} jobs/s", flush=True)


if __name__ == "__main__":
    main()
