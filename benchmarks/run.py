"""The sqla_jobs benchmark suite: ``make bench`` (or ``python benchmarks/run.py [--quick]``).

Every scenario runs in its own scratch database (``_db.scratch_database``), migrated with
``sqla_jobs.testing.migrate``; the peers of ``peers.py`` run in the same process, against
the same server, interleaved with ours, so the ratios in the one printed table compare
figures measured side by side. Absolute figures move with the (shared, noisy) machine;
the ratios are what to read. Nothing here is a test: no figure is asserted.

Scenarios:

* enqueue: ``enqueue`` one job per transaction from 1 and 8 producer threads, with the
  notify trigger on and with it disabled (``ALTER TABLE jobs DISABLE TRIGGER``);
  ``enqueue_many`` in batches of 1,000 (one transaction each) vs pgqueuer's bulk
  enqueue and a raw COPY;
* drain: no-op jobs drained by ONE real worker process (``python -m sqla_jobs.worker
  benchapp:registry --concurrency N``), timed from its "started" log line until no job is
  queued or running; and jobs whose handler writes one row (handler transaction) vs the
  seed's loop on 4 threads;
* procs: ``--processes N`` draining write-one-row jobs vs ``pgbench -N -c 4``, and vs
  the same jobs' transactions with no queue around them (``transaction_floor``: a new
  SQLAlchemy Session per job, as our handlers get, and plain psycopg);
* pickup: an idle worker, one job every 20 ms; latency from the producer's commit
  returning to the handler's first line (``benchapp.stamp``);
* async: ``async def`` handlers (``benchapp:async_registry``) in one worker process: a
  no-op drain vs the sync no-op drain (concurrency 16), interleaved; 0.2 s
  ``asyncio.sleep`` jobs at ``--async-concurrency 200`` vs ``time.sleep`` jobs at
  ``--concurrency 16``; the worker's resident memory (peak RSS) with 200 such jobs at
  once, next to its RSS when started;
* slots: 10 ms jobs of kinds and queues limited to 1 and 4, drained by 1, 2 and 4
  worker processes at concurrency 8: the share of the time the limit's slots ran a
  handler (``slots.py``), with the limit checked on the handlers' own log;
* scheduled: jobs enqueued with ``delay=`` 0.05-5 s on an idle worker: how late each
  handler starts after its ``run_at`` (``scheduled.py``);
* claim: one claim statement (LIMIT 1, rolled back) with 1,000,000 done rows and 100,000
  future jobs in the table vs an empty table, for our claim and the seed's
  ``OR (status = 'running' AND locked_until < now())`` form (on its own index, same data),
  with jobs ready and with nothing ready (an idle worker's poll).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.orm import Session

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import backend_cpu  # noqa: E402
import cli_start  # noqa: E402
import dashboard  # noqa: E402
import orm_enqueue  # noqa: E402
import peers  # noqa: E402
import pickup_trace  # noqa: E402
from _db import scratch_database  # noqa: E402

from sqla_jobs import (  # noqa: E402
    NewJob,
    enqueue,
    enqueue_many,
    testing,
)
from sqla_jobs.sql import lease, locks  # noqa: E402

#: Extra options every benchmark worker gets (none: the defaults are what we measure).
WORKER_ARGS: tuple[str, ...] = ()
#: Statements run in every scratch database of ours after its migration (none: the
#: schema as migrated). ``_schema_changed`` sets them for one measurement.
SCHEMA_CHANGES: tuple[str, ...] = ()


@contextmanager
def _schema_changed(*statements: str) -> Iterator[None]:
    """Every database ``_ours`` makes meanwhile gets ``statements`` after its migration
    (the dashboard section drops its indexes to price them)."""
    global SCHEMA_CHANGES
    before, SCHEMA_CHANGES = SCHEMA_CHANGES, statements
    try:
        yield
    finally:
        SCHEMA_CHANGES = before


@dataclass(frozen=True)
class Sizes:
    repeats: int
    enqueue_single: int
    enqueue_many: int
    drain: int
    tx_drain: int
    sleep_jobs: int
    pickup: int
    claim_done: int
    claim_future: int
    claim_iterations: int
    backlogs: tuple[int, ...] = (20_000, 200_000, 1_000_000)
    history: int = 1_000_000
    processes_drain: int = 5_000
    busy_seconds: float = 10.0
    #: Issue #23 target 3: the no-op drains compared with the raw batched loop.
    drain_targets: tuple[int, ...] = (50_000, 200_000)


FULL = Sizes(3, 8_000, 100_000, 20_000, 2_000, 5_000, 500, 1_000_000, 100_000, 400)
QUICK = Sizes(
    1,
    2_000,
    30_000,
    5_000,
    1_000,
    1_000,
    150,
    1_000_000,
    100_000,
    200,
    (20_000, 200_000),
    200_000,
    2_000,
    5.0,
    (50_000,),
)


@dataclass
class Row:
    section: str
    name: str
    value: float
    unit: str
    peer: str = ""
    peer_value: float | None = None
    target: str = ""
    met: bool | None = None

    @classmethod
    def versus(
        cls,
        section: str,
        name: str,
        value: float,
        unit: str,
        peer: str,
        peer_value: float | None,
        at_least: float,
    ) -> Row:
        """A row whose target is ``value >= at_least * peer_value`` (unknown without a peer)."""
        met = None if peer_value is None else value >= at_least * peer_value
        return cls(section, name, value, unit, peer, peer_value, f">= {at_least:g}x", met)

    @classmethod
    def at_most(
        cls,
        section: str,
        name: str,
        value: float,
        unit: str,
        peer: str,
        peer_value: float | None,
        times: float,
    ) -> Row:
        """A row whose target is ``value <= times * peer_value`` (a latency against a peer's
        in the same run; unknown without a peer)."""
        met = None if peer_value is None else value <= times * peer_value
        return cls(section, name, value, unit, peer, peer_value, f"<= {times:g}x", met)

    @property
    def ratio(self) -> float | None:
        if self.peer_value is None or not self.peer_value:
            return None
        # For "ms" and "us" lower is better: there a ratio above 1 means slower than the peer.
        return self.value / self.peer_value


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _sa_url(url: str) -> str:
    return "postgresql+psycopg://" + url.split("://", 1)[1]


@contextmanager
def _engine(url: str, **kw: Any) -> Iterator[sa.Engine]:
    engine = sa.create_engine(_sa_url(url), **kw)
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def _ours(prefix: str) -> Iterator[str]:
    """A scratch database with sqla_jobs' schema and the bench handlers' tables."""
    with scratch_database(prefix) as url:
        testing.migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            from benchapp import SETUP_SQL

            conn.execute(SETUP_SQL)
            for statement in SCHEMA_CHANGES:
                conn.execute(statement)
        yield url


def _peer(fn: Callable[[str], float]) -> float | None:
    with scratch_database("bench_peer") as url:
        try:
            return fn(url)
        except peers.PeerUnavailable as exc:
            print(f"  (peer skipped: {exc})", flush=True)
            return None


# --- enqueue ---------------------------------------------------------------------------


def _producer(url: str, count: int, ready: Any, go: Any, done: Any) -> None:
    """One producer process: ``enqueue`` + ``commit`` per job, in a Session."""
    with _engine(url, pool_size=1) as engine:
        with engine.connect():
            pass  # connect before the clock starts
        ready.put(True)
        go.wait()
        for i in range(count):
            with Session(engine) as s:
                enqueue(s, "noop", {"i": i})
                s.commit()
        done.put(time.perf_counter())  # CLOCK_MONOTONIC: comparable across processes


@contextmanager
def _trigger_mode(url: str, mode: str) -> Iterator[None]:
    """``off``: trigger disabled; ``on``: no worker waits (revision 0003 skips NOTIFY);
    ``waiting``: a connection holds the idle flag as a waiting worker does, so every
    commit notifies (the cost before 0003)."""
    with psycopg.connect(url, autocommit=True) as conn:
        if mode == "off":
            conn.execute("ALTER TABLE jobs DISABLE TRIGGER jobs_notify")
        elif mode == "waiting":
            conn.execute("SELECT pg_advisory_lock_shared(%s)", (locks.IDLE_LOCK_KEY,))
        yield


def ours_enqueue_single(n_jobs: int, producers: int, mode: str) -> float:
    """``producers`` processes (not threads: one GIL would hide the server's limits)."""
    ctx = multiprocessing.get_context("spawn")
    with _ours("bench_enq") as url, _trigger_mode(url, mode):
        ready, done, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = [
            ctx.Process(target=_producer, args=(url, share, ready, go, done))
            for share in peers._split(n_jobs, producers)
        ]
        elapsed = _run_together(procs, ready, go, done)
        peers._check_count(url, n_jobs)
    return n_jobs / elapsed


def _run_together(procs: list[Any], ready: Any, go: Any, done: Any) -> float:
    """Start ``procs``, wait until each is ready, let them go at once; the seconds until
    the last one puts its end (``time.perf_counter()``, one clock for all processes on
    Linux) in ``done``. Raises if one of them failed."""
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    t0 = time.perf_counter()
    go.set()
    t1 = max(float(done.get(timeout=300)) for _ in procs)
    for p in procs:
        p.join(30)
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"a benchmark process failed: {[p.exitcode for p in procs]}")
    return t1 - t0


def raw_single_on_our_schema(n_jobs: int, producers: int, mode: str) -> float:
    """The seed's raw INSERT from ``producers`` threads, on our schema and trigger.

    A light client (psycopg, no ORM) makes the server's commit path the limit, which is
    where NOTIFY's commit-time serialization shows.
    """
    with _ours("bench_enqraw") as url, _trigger_mode(url, mode):
        shares = peers._split(n_jobs, producers)
        conns = [psycopg.connect(url, autocommit=True) for _ in range(producers)]
        try:
            with ThreadPoolExecutor(producers) as pool:
                t0 = time.perf_counter()
                firsts = [sum(shares[:i]) for i in range(producers)]
                for f in [
                    pool.submit(peers._produce, c, s, f)
                    for c, s, f in zip(conns, shares, firsts, strict=True)
                ]:
                    f.result()
                elapsed = time.perf_counter() - t0
        finally:
            for c in conns:
                c.close()
        peers._check_count(url, n_jobs)
    return n_jobs / elapsed


def ours_enqueue_many(n_jobs: int, batch: int = 1_000) -> float:
    """``enqueue_many`` of ``batch`` NewJobs per transaction (building them is timed)."""
    with _ours("bench_enqm") as url, _engine(url) as engine:
        with engine.connect():
            pass
        t0 = time.perf_counter()
        for start in range(0, n_jobs, batch):
            with Session(engine) as s:
                enqueue_many(s, [NewJob("noop", {"i": i}) for i in range(start, start + batch)])
                s.commit()
        elapsed = time.perf_counter() - t0
        peers._check_count(url, n_jobs)
    return n_jobs / elapsed


def raw_copy_our_table(n_jobs: int, batch: int = 1_000) -> float:
    """A raw COPY of the same jobs into our table, ``batch`` rows per transaction.

    The peer of ``enqueue_many`` on equal terms: same table (indexes, trigger), same
    payloads (a dict serialized per row, by psycopg's ``Jsonb``), same transaction size.
    It returns no ids and checks nothing, which ``enqueue_many`` must.
    """
    with _ours("bench_enqcopy") as url, psycopg.connect(url) as conn:
        t0 = time.perf_counter()
        for start in range(0, n_jobs, batch):
            with conn.cursor() as cur, cur.copy("COPY jobs (kind, payload) FROM STDIN") as copy:
                for i in range(start, min(start + batch, n_jobs)):
                    copy.write_row(("noop", Jsonb({"i": i})))
            conn.commit()
        elapsed = time.perf_counter() - t0
        peers._check_count(url, n_jobs)
    return n_jobs / elapsed


def server_only_enqueue(n_jobs: int, batch: int = 1_000) -> float:
    """The server's own share of ``enqueue_many``: rows made by ``generate_series`` in SQL.

    Same table (our schema), same batches and RETURNING, no client work at all: no
    validation, no serialization, nothing sent but the statement. No client can insert
    faster than this, so it bounds what any ``enqueue_many`` could reach here.
    """
    sql = (
        "INSERT INTO jobs (kind, payload) SELECT 'noop', jsonb_build_object('i', g)"
        " FROM generate_series(%s::int, %s::int) AS g RETURNING id"
    )
    with _ours("bench_enqfloor") as url, psycopg.connect(url) as conn:
        t0 = time.perf_counter()
        for start in range(0, n_jobs, batch):
            conn.execute(sql, (start, min(start + batch, n_jobs) - 1)).fetchall()
            conn.commit()
        elapsed = time.perf_counter() - t0
        peers._check_count(url, n_jobs)
    return n_jobs / elapsed


# --- drain -----------------------------------------------------------------------------


def _windows(
    sent: dict[int, float], started: dict[int, float], t0: float, window: float
) -> tuple[list[float], list[tuple[float, float, float, float]]]:
    """A steady flow's claim latencies (ms: handler start minus the moment before its
    enqueue), and per ``window`` seconds from ``t0``: start, p50, p99, jobs started a
    second."""
    latencies: list[float] = []
    by_window: dict[int, list[float]] = {}
    for job_id, before in sent.items():
        latency = (started[job_id] - before) * 1000
        latencies.append(latency)
        by_window.setdefault(int((before - t0) // window), []).append(latency)
    windows = []
    for index in sorted(by_window):
        values = by_window[index]
        done = sum(1 for t in started.values() if index * window <= t - t0 < (index + 1) * window)
        windows.append(
            (index * window, _percentile(values, 0.5), _percentile(values, 0.99), done / window)
        )
    return latencies, windows


def _health_cli(url: str, *flags: str) -> str:
    """``sqla-jobs health`` as an operator runs it: its output, exit status and wall time
    (a new process and connection each time, as a monitoring probe pays)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "sqla_jobs", "health", *flags],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = (time.perf_counter() - started) * 1000
    head = " ".join(["$ sqla-jobs health", *flags])
    head += f"   (exit {done.returncode}, {took:.0f} ms)"
    return "\n".join([head, done.stdout.rstrip(), done.stderr.rstrip()]).rstrip()


class WorkerProcess:
    """``python -m sqla_jobs.worker benchapp:registry`` as a child; ready when it logs."""

    def __init__(
        self, url: str, *args: str, expect: int = 1, app: str = "benchapp:registry"
    ) -> None:
        self.expect = expect  # "started" lines to wait for (one per process)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.getcwd()])}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sqla_jobs.worker",
                app,
                "--database-url",
                url,
                *WORKER_ARGS,
                *args,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.ready_at = 0.0  # time.time() when the "started" line arrived
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if " started: " in line:
                self.expect -= 1
                if self.expect <= 0:
                    self.ready_at = time.time()
                    self.ready.set()

    def wait_ready(self, timeout: float = 30.0) -> float:
        if not self.ready.wait(timeout):
            self.stop()
            raise RuntimeError("worker did not start:\n" + "".join(self.lines[-20:]))
        return self.ready_at

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        problems = [ln for ln in self.lines if " WARNING " in ln or " ERROR " in ln]
        if problems:
            print("  worker warnings:\n  " + "  ".join(problems[:5]), flush=True)


_ALL_DONE = (
    "SELECT NOT EXISTS (SELECT 1 FROM jobs WHERE status = 'queued')"
    " AND NOT EXISTS (SELECT 1 FROM jobs WHERE status = 'running')"
)


def _wait_all_done(url: str, timeout: float = 300.0) -> None:
    """Poll (two partial-index probes, every 20 ms) until nothing is queued or running.

    Every 20 ms, not faster: the poll shares the two cores with the worker and the
    server, and the seed loop it is compared with pays for no such probe. The end of a
    drain is read from the jobs themselves (``_last_done``), not from when the poll saw it.
    """
    deadline = time.perf_counter() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(_ALL_DONE).fetchone()
            if row and row[0]:
                return
            if time.perf_counter() > deadline:
                raise RuntimeError("drain did not finish")
            time.sleep(0.020)


def _last_done(url: str) -> float:
    """``time.time()`` of the last done-mark: the latest ``finished_at`` (the server's
    ``now()``, the start of the completing transaction, on this machine's clock)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(finished_at))::float8 FROM jobs"
        ).fetchone()
    if not row or row[0] is None:
        raise RuntimeError("no job was finished")
    return float(row[0])


def _done_since(url: str, t0: float) -> int:
    """Jobs whose done-mark came at or after ``t0`` (``time.time()``): a drain's rate
    counts only these, so jobs an earlier-started process finished before the clock
    started (``t0`` is the *last* process's start) do not inflate it."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM jobs WHERE finished_at >= to_timestamp(%s)", (t0,)
        ).fetchone()
    return int(row[0]) if row else 0


# CPU accounting for the transactional drain: where a job's CPU time goes decides how
# fast two shared cores can go. Label -> [(process CPU s, machine CPU s, jobs)] per run.
CPU: dict[str, list[tuple[float, float, int]]] = {}


def _machine_cpu() -> float:
    """CPU seconds spent by the whole machine (all processes, all cores) so far."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:8]]
    except OSError:  # not Linux: no figures
        return float("nan")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) used so far by process ``pid``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_per_job(label: str) -> tuple[float, float]:
    """Median (process, machine) CPU microseconds per job recorded under ``label``."""
    runs = CPU.get(label, [])
    if not runs:
        return float("nan"), float("nan")
    return (
        _median([p / n * 1e6 for p, _, n in runs]),
        _median([m / n * 1e6 for _, m, n in runs]),
    )


def _fill(url: str, kind: str, n_jobs: int) -> None:
    with _engine(url) as engine, Session(engine) as s:
        for start in range(0, n_jobs, 5_000):
            count = min(5_000, n_jobs - start)
            enqueue_many(s, [NewJob(kind, {"n": start + i}) for i in range(count)])
        s.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")


def ours_drain(
    n_jobs: int,
    concurrency: int,
    kind: str = "noop",
    processes: int = 1,
    app: str = "benchapp:registry",
    beside: Callable[[str], Any] | None = None,
    cpu: list[tuple[float, float]] | None = None,
) -> float:
    """Drain rate of ``processes`` worker processes (timed from the last one's start, and
    counting only the jobs done from then on). ``beside``: a context manager factory
    given the database URL, entered after the fill and left after the drain (an open
    dashboard tab). ``cpu``, if given, gets the workers' and their server backends' CPU
    microseconds per job (``backend_cpu``)."""
    with _ours("bench_drain") as url, ExitStack() as stack:
        _fill(url, kind, n_jobs)
        if beside is not None:
            stack.enter_context(beside(url))
        workers = [
            WorkerProcess(url, "--concurrency", str(concurrency), app=app) for _ in range(processes)
        ]
        try:
            t0 = max(w.wait_ready() for w in workers)
            spent = backend_cpu.DrainCpu(url, [w.proc.pid for w in workers])
            spent.start()
            cpu0 = (sum(_process_cpu(w.proc.pid) for w in workers), _machine_cpu())
            _wait_all_done(url)
            cpu1 = (sum(_process_cpu(w.proc.pid) for w in workers), _machine_cpu())
            spent.stop()
            if cpu is not None:
                cpu.append(spent.per_job(n_jobs))
            t1 = _last_done(url)
            drained = _done_since(url, t0)
        finally:
            for w in workers:
                w.stop()
        run = (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], n_jobs)
        label = f"ours {kind} c={concurrency}" + (f" p={processes}" if processes > 1 else "")
        label += "" if app == "benchapp:registry" else f" {app}"
        CPU.setdefault(label, []).append(run)
        peers._check_count(url, n_jobs, "done")
        if kind == "write":
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM bench_effects").fetchone()
            if not row or row[0] != n_jobs:
                raise RuntimeError(f"expected {n_jobs} effects, got {row}")
    return drained / (t1 - t0)


def supervised_drain(
    n_jobs: int,
    processes: int,
    concurrency: int,
    kind: str = "write",
    cpu: list[tuple[float, float]] | None = None,
) -> float:
    """Drain by ONE command, ``--processes N`` (timed from the last child's "started"
    line to the last done-mark, counting the jobs done meanwhile, as ``ours_drain``);
    write-one-row jobs unless ``kind`` says otherwise. ``cpu``: as ``ours_drain``'s (the
    supervisor and its worker processes)."""
    with _ours("bench_procs") as url:
        _fill(url, kind, n_jobs)
        worker = WorkerProcess(
            url,
            "--processes",
            str(processes),
            "--concurrency",
            str(concurrency),
            expect=processes,
        )
        try:
            t0 = worker.wait_ready(60.0)
            spent = backend_cpu.DrainCpu(url, backend_cpu.with_children(worker.proc.pid))
            spent.start()
            _wait_all_done(url)
            spent.stop()
            if cpu is not None:
                cpu.append(spent.per_job(n_jobs))
            t1 = _last_done(url)
            drained = _done_since(url, t0)
        finally:
            worker.stop()
        peers._check_count(url, n_jobs, "done")
        if kind == "write":
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM bench_effects").fetchone()
            if not row or row[0] != n_jobs:
                raise RuntimeError(f"expected {n_jobs} effects, got {row}")
    return drained / (t1 - t0)


#: The write-one-row job's transaction with no queue around it (``transaction_floor``):
#: the handler's INSERT and a done-mark by primary key, fenced like ours.
_FLOOR_INSERT = "INSERT INTO bench_effects (job_id, n) VALUES (%(j)s, %(n)s)"
_FLOOR_DONE = (
    "UPDATE jobs SET status = 'done', finished_at = now(), locked_until = NULL"
    " WHERE id = %(j)s AND attempts = 1 AND worker = 'floor' AND status::text = 'running'"
)


def _floor_on_psycopg(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    """One thread of ``transaction_floor`` on plain psycopg: each id in its own transaction."""
    for j in ids:
        conn.execute(_FLOOR_INSERT, {"j": j, "n": j})
        conn.execute(_FLOOR_DONE, {"j": j})
        conn.commit()


def _floor_in_sessions(engine: sa.Engine, ids: list[int]) -> None:
    """One thread of ``transaction_floor``: a new Session per id, as a handler gets."""
    insert = sa.text("INSERT INTO bench_effects (job_id, n) VALUES (:j, :n)")
    for j in ids:
        with Session(engine) as s:
            s.execute(insert, {"j": j, "n": j})
            s.connection().exec_driver_sql(_FLOOR_DONE, {"j": j})
            s.commit()


def _floor_process(
    url: str, slices: list[list[int]], driver: str, ready: Any, go: Any, done: Any
) -> None:
    """Connect every thread first (not timed), then run them on the go signal."""
    with ExitStack() as stack:
        if driver == "psycopg":
            conns = [stack.enter_context(psycopg.connect(url)) for _ in slices]
            work = [
                partial(_floor_on_psycopg, c, ids) for c, ids in zip(conns, slices, strict=True)
            ]
        else:
            engine = stack.enter_context(_engine(url, pool_size=len(slices)))
            warm = [engine.connect() for _ in slices]  # fill the pool
            for c in warm:
                c.close()
            work = [partial(_floor_in_sessions, engine, ids) for ids in slices]
        threads = [threading.Thread(target=fn) for fn in work]
        ready.put(True)
        go.wait()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.put(time.perf_counter())


def transaction_floor(n_jobs: int, processes: int, driver: str, threads: int = 4) -> float:
    """What the write-one-row drain would reach if claiming, scheduling and bookkeeping
    cost nothing: ``processes`` processes x ``threads`` threads run each job's transaction
    (BEGIN, the handler's INSERT, a fenced done-mark by primary key, COMMIT: the four
    round trips of ours) on jobs already marked running, through a new SQLAlchemy
    ``Session`` per job (``driver="session"``, what our handlers get) or on plain
    psycopg connections (``driver="psycopg"``). Connected before the clock starts; timed
    from the go signal to the last thread's end."""
    ctx = multiprocessing.get_context("spawn")
    with _ours("bench_floor") as url:
        _fill(url, "write", n_jobs)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE jobs SET status = 'running', attempts = 1, worker = 'floor'")
            ids = [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY id").fetchall()]
        parts = processes * threads
        slices = [ids[i::parts] for i in range(parts)]
        ready, go, done = ctx.Queue(), ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(
                target=_floor_process,
                args=(url, slices[i * threads : (i + 1) * threads], driver, ready, go, done),
            )
            for i in range(processes)
        ]
        elapsed = _run_together(procs, ready, go, done)
        peers._check_count(url, n_jobs, "done")
    return n_jobs / elapsed


def pgbench_tps(seconds: int, clients: int = 4) -> float | None:
    """``pgbench -N -c CLIENTS -j 2 -T SECONDS`` TPS (scale 10) on a scratch database: the
    server's rate for short write transactions (an UPDATE, a SELECT and an INSERT each)
    on this machine. None, with a note, where pgbench is not installed (Debian:
    ``apt-get install postgresql-client``)."""
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        print("  (pgbench not found: install postgresql-client; row skipped)", flush=True)
        return None
    with scratch_database("bench_pgbench") as url:
        subprocess.run(
            [pgbench, "-i", "-q", "-s", "10", url], check=True, capture_output=True, text=True
        )
        run = subprocess.run(
            [pgbench, "-N", "-c", str(clients), "-j", "2", "-T", str(seconds), url],
            check=True,
            capture_output=True,
            text=True,
        )
    found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", run.stdout)
    if found is None:
        raise RuntimeError("no tps in pgbench output:\n" + run.stdout)
    return float(found.group(1))


def _fill_backlog(url: str, n_jobs: int, history: int) -> None:
    """``history`` done rows (finished a day ago), then ``n_jobs`` queued no-op jobs,
    then ``VACUUM ANALYZE`` as after a bulk load: the statistics say nothing runs."""
    with psycopg.connect(url, autocommit=True) as conn:
        if history:
            conn.execute(
                "INSERT INTO jobs (kind, payload, status, run_at, attempts, worker, finished_at)"
                " SELECT 'noop', jsonb_build_object('n', g), 'done',"
                " now() - interval '2 days', 1, 'old:1', now() - interval '1 day'"
                " FROM generate_series(1, %s) g",
                (history,),
            )
        conn.execute(
            "INSERT INTO jobs (kind, payload)"
            " SELECT 'noop', jsonb_build_object('n', g) FROM generate_series(1, %s) g",
            (n_jobs,),
        )
        conn.execute("VACUUM ANALYZE jobs")


def backlog_drain(n_jobs: int, history: int, concurrency: int = 4) -> float:
    """Drain rate of one worker process facing a backlog of ``n_jobs`` no-op jobs, in a
    table that may already hold ``history`` finished rows (timed as ``ours_drain``)."""
    with _ours("bench_backlog") as url:
        _fill_backlog(url, n_jobs, history)
        worker = WorkerProcess(url, "--concurrency", str(concurrency))
        try:
            t0 = worker.wait_ready()
            _wait_all_done(url, timeout=1800.0)
            t1 = _last_done(url)
        finally:
            worker.stop()
        peers._check_count(url, n_jobs + history, "done")
    return n_jobs / (t1 - t0)


def _rss_kib(pid: int, field: str = "VmRSS") -> float:
    """Resident memory of process ``pid`` (``VmRSS`` now, or ``VmHWM``: the peak), KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


#: Resident memory of the async worker: label -> [(KiB when started, peak KiB)] per run.
RSS: dict[str, list[tuple[float, float]]] = {}


def async_drain(n_jobs: int, kind: str, *args: str, app: str = "benchapp:async_registry") -> float:
    """Drain rate of one worker process running ``app``'s handlers of ``kind``."""
    with _ours("bench_async") as url:
        _fill(url, kind, n_jobs)
        worker = WorkerProcess(url, *args, app=app)
        try:
            t0 = worker.wait_ready()
            started_kib = _rss_kib(worker.proc.pid)
            _wait_all_done(url)
            peak_kib = _rss_kib(worker.proc.pid, "VmHWM")
            t1 = _last_done(url)
        finally:
            worker.stop()
        RSS.setdefault(f"{app} {kind} {' '.join(args)}", []).append((started_kib, peak_kib))
        peers._check_count(url, n_jobs, "done")
    return n_jobs / (t1 - t0)


def _seed_write(conn: psycopg.Connection[Any], payload: Any) -> None:
    conn.execute("INSERT INTO bench_effects (n) VALUES (%s)", (payload["n"],))


def seed_loop_threads(url: str, n_jobs: int, threads: int = 4) -> float:
    """The seed's ``run_one`` loop on ``threads`` connections; handler writes one row."""
    peers._install_seed_schema(url)
    peers.HANDLERS["write"] = _seed_write
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_effects (id bigserial PRIMARY KEY, n int NOT NULL)")
        with conn.cursor() as cur, cur.copy("COPY jobs (kind, payload) FROM STDIN") as copy:
            for i in range(n_jobs):
                copy.write_row(("write", Jsonb({"n": i})))
        conn.execute("VACUUM ANALYZE jobs")
    conns = [psycopg.connect(url, row_factory=dict_row) for _ in range(threads)]
    try:

        def loop(conn: psycopg.Connection[dict[str, Any]]) -> None:
            while peers._run_one(conn):
                pass

        with ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            cpu0 = (time.process_time(), _machine_cpu())
            for f in [pool.submit(loop, c) for c in conns]:
                f.result()
            elapsed = time.perf_counter() - t0
            cpu1 = (time.process_time(), _machine_cpu())
    finally:
        for c in conns:
            c.close()
    peers._check_count(url, n_jobs, "done")
    CPU.setdefault(f"seed write t={threads}", []).append(
        (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], n_jobs)
    )
    return n_jobs / elapsed


# --- pickup latency --------------------------------------------------------------------


def pickup_latency(n_jobs: int, interval: float = 0.020) -> list[float]:
    """Latencies (ms) from just before the producer's ``enqueue`` to the handler's first
    line, one job every ``interval`` s to an idle worker (concurrency 1)."""
    with _ours("bench_pickup") as url:
        sent = _idle_pickup_run(url, n_jobs, interval, {})
        return _latencies(url, {j: stamps["before"] for j, stamps in sent.items()})


def _idle_pickup_run(
    url: str, n_jobs: int, interval: float, env: dict[str, str]
) -> dict[int, dict[str, float]]:
    """Enqueue one ``stamp`` job every ``interval`` s to an idle worker (concurrency 1);
    per job id, ``time.time()`` before ``enqueue``, after its INSERT, after the COMMIT."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        worker = WorkerProcess(url, "--concurrency", "1")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    sent: dict[int, dict[str, float]] = {}
    try:
        worker.wait_ready()
        time.sleep(0.5)  # let the listener connect and the dispatcher go idle
        with _engine(url) as engine:
            with engine.connect():
                pass
            tick = time.perf_counter()
            for _ in range(n_jobs):
                before = time.time()
                with engine.begin() as conn:
                    job_id = enqueue(conn, "stamp", {})
                    inserted = time.time()
                sent[int(job_id or 0)] = {
                    "before": before,
                    "inserted": inserted,
                    "committed": time.time(),
                }
                tick += interval
                time.sleep(max(0.0, tick - time.perf_counter()))
        _wait_all_done(url)
    finally:
        worker.stop()
    return sent


def traced_pickup(n_jobs: int, interval: float = 0.020) -> dict[str, list[float]]:
    """Like :func:`pickup_latency` with the worker's path timestamped (pickup_trace):
    per segment, its durations in ms."""
    with _ours("bench_pickup") as url, tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace")
        sent = _idle_pickup_run(url, n_jobs, interval, {pickup_trace.ENV: trace})
        started = _started(url)
        for job_id, stamps in sent.items():
            stamps["started"] = started[job_id]
        return pickup_trace.segments(trace, sent)


def print_pickup_trace(traced: dict[str, list[float]], raw_total: list[float]) -> None:
    """The traced run's segments (p50 / p99, ms) and the raw peer's total in the same run."""
    print(f"  load average: {os.getloadavg()[0]:.2f}", flush=True)
    print(f"  {'segment':<48} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"  (run: {len(traced['total'])} notified jobs traced)")
    for name, values in traced.items():
        if values:
            p50, p99 = _percentile(values, 0.5), _percentile(values, 0.99)
            print(f"  {name:<48} {p50:8.3f} {p99:8.3f}  n={len(values)}")
    p50, p99 = _percentile(raw_total, 0.5), _percentile(raw_total, 0.99)
    print(f"  {'raw psycopg + notify trigger: total':<48} {p50:8.3f} {p99:8.3f}", flush=True)


def _started(url: str) -> dict[int, float]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT job_id, started FROM bench_pickup").fetchall())


def _latencies(url: str, sent: dict[int, float]) -> list[float]:
    started = _started(url)
    return [(started[j] - t) * 1000 for j, t in sent.items()]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


#: Busy-case pickup: 8 producer processes, one ``stamp`` job per transaction each,
#: together BUSY_RATE jobs/s, while every BURST_EVERY s a burst of lower-priority jobs
#: (priority 9; stamps are 0) fills the worker's claims, so it lowers its idle flag,
#: works through the burst and raises the flag again: the busy -> idle transition, 4
#: times a second, with producers' commits in flight across it. Two kinds of burst:
#:
#: * I/O-bound: BURST_NAPS ``nap`` jobs (2 ms each, like a call to a fast service): the
#:   4 handler slots are busy for about 150 ms of every 250, the CPU is not;
#: * CPU-bound: BURST_NOOPS no-op jobs, drained as fast as the machine allows: for tens
#:   of ms the worker, the producers and the server want more than the machine's cores.
#:
#: A stamp that lands in a burst waits for the worker's next claim (its handlers work
#: through the buffered jobs meanwhile) and for that claim itself; the buffer then hands
#: it out before the buffered burst jobs (it is more urgent).
BUSY_PRODUCERS = 8
BUSY_RATE = 200
BURST_EVERY = 0.25
BURST_NAPS = 300
BURST_NOOPS = 600
#: A pickup slower than this waited for the poll (default 1 s), not for a notification.
POLL_WAIT_MS = 250.0
#: The round-trip probe: a ``SELECT 1`` this often, on its own connection, during the run.
PROBE_EVERY = 0.005


def _busy_producer(
    url: str, count: int, phase: float, raw: bool, ready: Any, go: Any, out: Any
) -> None:
    """One producer process: ``count`` jobs, one per transaction, evenly spaced; with
    ``enqueue`` in a Session (ours) or an INSERT on a psycopg connection (``raw``)."""
    period = BUSY_PRODUCERS / BUSY_RATE
    sent: list[tuple[int, float, float]] = []  # job id, before enqueue, after commit
    with ExitStack() as stack:
        if raw:
            conn = stack.enter_context(psycopg.connect(url))

            def one_job() -> int:
                row = conn.execute(peers.BUSY_INSERT).fetchone()
                conn.commit()
                return int(row[0]) if row else 0
        else:
            engine = stack.enter_context(_engine(url, pool_size=1))
            with engine.connect():
                pass

            def one_job() -> int:
                with Session(engine) as s:
                    job_id = enqueue(s, "stamp", {})
                    s.commit()
                return int(job_id or 0)

        ready.put(True)
        go.wait()
        tick = time.perf_counter() + phase
        for _ in range(count):
            time.sleep(max(0.0, tick - time.perf_counter()))
            tick += period
            before = time.time()
            job_id = one_job()
            sent.append((job_id, before, time.time()))
    out.put(sent)


@dataclass
class BusyPickup:
    """One busy-case run, in ms: pickup latencies, the producers' own enqueue + commit,
    and the server's round trips meanwhile."""

    latencies: list[float]
    commits: list[float]
    round_trips: list[float]
    #: From the producer's commit returning to the handler's first line: the consumer's
    #: own part of each latency.
    after_commit: list[float]


def _round_trips(url: str, until: threading.Event, out: list[float]) -> None:
    """``SELECT 1`` every PROBE_EVERY s until ``until``: how long the machine took to
    answer the smallest request while the scenario ran (a pickup needs several)."""
    with psycopg.connect(url, autocommit=True) as conn:
        while not until.is_set():
            t0 = time.perf_counter()
            conn.execute("SELECT 1").fetchall()
            out.append((time.perf_counter() - t0) * 1000)
            until.wait(PROBE_EVERY)


@contextmanager
def _busy_side(raw: bool) -> Iterator[tuple[str, Callable[[sa.Engine, str, int], None]]]:
    """A scratch database with a consumer running: our worker (concurrency 4, default
    poll interval) or the raw peer's (4 threads, ``peers.raw_busy_consumer``); yields
    its URL and how to enqueue a burst there."""
    if raw:
        with scratch_database("bench_busy_raw") as url:
            peers.install_busy_schema(url)

            def raw_burst(engine: sa.Engine, kind: str, count: int) -> None:
                with psycopg.connect(url) as conn:
                    peers.raw_busy_burst(conn, kind, count)

            with peers.raw_busy_consumer(url):
                yield url, raw_burst
        return

    def burst(engine: sa.Engine, kind: str, count: int) -> None:
        with Session(engine) as s:
            enqueue_many(s, [NewJob(kind, {}, priority=9) for _ in range(count)])
            s.commit()

    with _ours("bench_busy") as url:
        worker = WorkerProcess(url, "--concurrency", "4")
        try:
            worker.wait_ready()
            yield url, burst
        finally:
            worker.stop()


def busy_pickup_latency(
    seconds: float, kind: str, burst_jobs: int, raw: bool = False
) -> BusyPickup:
    """Latencies (ms) of jobs from 8 producers at a steady BUSY_RATE/s while bursts of
    ``burst_jobs`` ``kind`` jobs make the consumer (ours, or the raw peer's) alternate
    busy and idle."""
    ctx = multiprocessing.get_context("spawn")
    per_producer = int(seconds * BUSY_RATE / BUSY_PRODUCERS)
    round_trips: list[float] = []
    with _busy_side(raw) as (url, burst):
        sent: dict[int, float] = {}
        committed_at: dict[int, float] = {}
        commits: list[float] = []
        probing = threading.Event()
        probe = threading.Thread(target=_round_trips, args=(url, probing, round_trips))
        try:
            ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
            period = BUSY_PRODUCERS / BUSY_RATE
            procs = [
                ctx.Process(
                    target=_busy_producer,
                    args=(url, per_producer, i * period / BUSY_PRODUCERS, raw, ready, go, out),
                )
                for i in range(BUSY_PRODUCERS)
            ]
            for p in procs:
                p.start()
            for _ in procs:
                ready.get(timeout=60)
            time.sleep(0.5)  # the consumer is idle (ours: its flag up)
            with _engine(url) as engine:
                go.set()
                probe.start()
                tick = time.perf_counter()
                end = tick + per_producer * period
                while tick < end:
                    burst(engine, kind, burst_jobs)
                    tick += BURST_EVERY
                    time.sleep(max(0.0, tick - time.perf_counter()))
            for _ in procs:
                for job_id, before, committed in out.get(timeout=120):
                    sent[job_id], committed_at[job_id] = before, committed
                    commits.append((committed - before) * 1000)
            probing.set()
            for p in procs:
                p.join(30)
            _wait_all_done(url)
        finally:
            probing.set()
            if probe.is_alive():
                probe.join(10)
        return BusyPickup(
            _latencies(url, sent), commits, round_trips, _latencies(url, committed_at)
        )


#: The busy-case peer, as named in the table.
BUSY_PEER = "raw psycopg: seed claim, NOTIFY, 4 threads"


def _busy_rows(label: str, run: BusyPickup, raw: BusyPickup) -> list[Row]:
    """The p50/p99/max pickup of one busy-case run (max <= 50 ms is the target) beside
    the raw peer's under the same load, the jobs that waited for the poll, and what no
    worker can make shorter: the slowest of the producers' own enqueue + commit (part
    of every pickup), and the slowest server round trip meanwhile."""
    busy = run.latencies
    scenario = f"{BUSY_PRODUCERS} producers at {BUSY_RATE}/s, {label} ({len(busy):,} jobs)"
    rows = [
        Row(
            "pickup",
            f"p50, {scenario}",
            _percentile(busy, 0.5),
            "ms",
            BUSY_PEER,
            _percentile(raw.latencies, 0.5),
        ),
        Row(
            "pickup",
            f"p99, {scenario}",
            _percentile(busy, 0.99),
            "ms",
            BUSY_PEER,
            _percentile(raw.latencies, 0.99),
        ),
        Row(
            "pickup",
            f"max, {scenario}",
            max(busy),
            "ms",
            BUSY_PEER,
            max(raw.latencies),
            target="<= 50 ms",
            met=max(busy) <= 50,
        ),
        Row.at_most(  # issue #23 target 4
            "pickup",
            f"max, {scenario} (#23)",
            max(busy),
            "ms",
            BUSY_PEER,
            max(raw.latencies),
            2.0,
        ),
    ]
    rows.append(
        Row(
            "pickup",
            f"max from the producer's commit, {label}",
            max(run.after_commit),
            "ms",
            BUSY_PEER,
            max(raw.after_commit),
        )
    )
    waited = sum(1 for v in busy if v > POLL_WAIT_MS)
    rows.append(
        Row(
            "pickup",
            f"jobs that waited for the poll (> {POLL_WAIT_MS:g} ms), {label}",
            waited,
            "jobs",
            target="0",
            met=waited == 0,
        )
    )
    rows.append(
        Row(
            "pickup",
            f"producer's enqueue + commit alone, max, {label}",
            max(run.commits),
            "ms",
            "the raw peer's producers",
            max(raw.commits),
        )
    )
    if run.round_trips:
        rows.append(
            Row(
                "pickup",
                f"slowest server round trip (SELECT 1 every 5 ms), {label}",
                max(run.round_trips),
                "ms",
                "during the raw peer's run",
                max(raw.round_trips) if raw.round_trips else None,
            )
        )
    return rows


# --- claim latency ---------------------------------------------------------------------

SEED_CLAIM = peers.CLAIM
SEED_INDEX = "CREATE INDEX seed_claim_idx ON jobs (run_at) WHERE status IN ('queued', 'running')"


def _claim_sql() -> tuple[str, dict[str, Any]]:
    stmt = lease.claim(
        worker="bench:1", lock_seconds=30, queues=["default"], kinds=["noop"], limit=1
    )
    compiled = stmt.compile(dialect=psycopg_dialect())  # type: ignore[no-untyped-call]
    return str(compiled), dict(compiled.params)


def _load(conn: psycopg.Connection[Any], done: int, future: int) -> None:
    conn.execute(
        "INSERT INTO jobs (kind, payload, status, run_at, attempts, worker, finished_at)"
        " SELECT 'noop', '{}', 'done', now() - interval '2 days' + g * interval '100 ms',"
        " 1, 'old:1', now() - interval '1 day' FROM generate_series(1, %s) g",
        (done,),
    )
    conn.execute(
        "INSERT INTO jobs (kind, payload, run_at)"
        " SELECT 'noop', '{}', now() + interval '1 hour' + g * interval '10 ms'"
        " FROM generate_series(1, %s) g",
        (future,),
    )


def _time_claims(url: str, iterations: int) -> tuple[float, float]:
    """Median ms of our claim, then of the seed's claim, each rolled back.

    The seed's index exists only while its form is measured: with it in place the planner
    may pick it for our claim too, and we would measure the wrong plan.
    """
    sql_ours, params_ours = _claim_sql()
    seed_params = {"lock": 30, "worker": "bench:1"}
    ours: list[float] = []
    seed: list[float] = []
    with psycopg.connect(url) as conn:
        for _ in range(iterations):
            t0 = time.perf_counter()
            conn.execute(sql_ours, params_ours).fetchall()
            ours.append(time.perf_counter() - t0)
            conn.rollback()
        conn.execute(SEED_INDEX)
        conn.commit()
        conn.execute("ANALYZE jobs")
        conn.commit()
        for _ in range(iterations):
            t0 = time.perf_counter()
            conn.execute(SEED_CLAIM, seed_params).fetchall()
            seed.append(time.perf_counter() - t0)
            conn.rollback()
        conn.execute("DROP INDEX seed_claim_idx")
        conn.commit()
    return _median(ours) * 1000, _median(seed) * 1000


def claim_latency(sizes: Sizes, explain: bool) -> dict[str, float]:
    """Claim medians: {ours,seed} x {empty,loaded} x {ready,idle}."""
    out: dict[str, float] = {}
    n = sizes.claim_iterations
    ready = 1_000
    add_ready = (
        "INSERT INTO jobs (kind, payload, run_at) SELECT 'noop', '{}',"
        " now() - interval '1 minute' FROM generate_series(1, %s)"
    )
    for label, loaded in (("empty", False), ("loaded", True)):
        with _ours("bench_claim") as url:
            with psycopg.connect(url, autocommit=True) as conn:
                if loaded:
                    _load(conn, sizes.claim_done, sizes.claim_future)
                conn.execute("VACUUM ANALYZE jobs")
            out[f"ours_{label}_idle"], out[f"seed_{label}_idle"] = _time_claims(url, n)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(add_ready, (ready,))
                conn.execute("VACUUM ANALYZE jobs")
            out[f"ours_{label}_ready"], out[f"seed_{label}_ready"] = _time_claims(url, n)
            if explain and loaded:
                _explain_claims(url)
    return out


def _explain_generic(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> str:
    """EXPLAIN ANALYZE of the generic plan a prepared statement gets (as the worker's)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute("PREPARE bench_claim AS " + re.sub(r"%\((\w+)\)s", number, sql))
    placeholders = ", ".join(["%s"] * len(names))
    plan = psycopg.ClientCursor(conn).execute(
        f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE bench_claim({placeholders})",
        [params[n] for n in names],
    )
    text = "\n".join(r[0] for r in plan.fetchall())
    conn.rollback()
    conn.execute("DEALLOCATE bench_claim")
    conn.execute("RESET plan_cache_mode")
    return text


def _explain_claims(url: str) -> None:
    sql_ours, params = _claim_sql()
    with psycopg.connect(url, autocommit=False) as conn:
        print("\n--- EXPLAIN our claim (LIMIT 1), generic plan, loaded table, jobs ready ---")
        print(_explain_generic(conn, sql_ours, params), flush=True)
        conn.execute(SEED_INDEX)  # rolled back below: it exists for the seed's form only
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + SEED_CLAIM,
            {"lock": 30, "worker": "bench:1"},
        ).fetchall()
        conn.rollback()
        print("\n--- EXPLAIN seed claim (its own index), loaded table, jobs ready ---")
        print("\n".join(r[0] for r in plan), flush=True)


# --- the table -------------------------------------------------------------------------


# --- the dashboard (#22) ------------------------------------------------------------------


def dashboard_rows(
    quick: bool,
    sizes: Sizes,
    explain: bool,
    step: Callable[[str], None],
    interleaved: Callable[..., list[float | None]],
) -> list[Row]:
    """Pages at 1,000,000 live + 1,000,000 archived rows (200,000 each with --quick); the
    write cost of the dashboard's indexes; a drain with one tab open beside it."""
    n = 200_000 if quick else 1_000_000
    requests = 7 if quick else 15
    step(f"dashboard: loading {n:,} jobs and {n:,} archived jobs")
    with _ours("bench_dash") as url:
        dashboard.load(url, n, n)
        step("dashboard: timing pages")
        timings = dashboard.page_times(url, _sa_url(url), requests)
        if explain:
            for case in dashboard.cases(url):
                for newest in (True, False):
                    print(f"-- {case.name}, {'newest' if newest else 'oldest'} first")
                    print(dashboard.explain(url, case, newest))
    print(f"\ndashboard pages, {n:,} jobs + {n:,} archived, {requests} requests each:")
    print("| page | median | p95 | target | met |\n|---|---|---|---|---|")
    for t in timings:
        met = "yes" if t.median < t.target_ms and t.p95 < t.target_ms else "NO"
        print(f"| {t.name} | {t.median:.1f} ms | {t.p95:.1f} ms | < {t.target_ms:g} ms | {met} |")
    print()
    size = f"{n // 1000:,}k + {n // 1000:,}k archived"
    rows: list[Row] = []
    overview = next(t for t in timings if t.name == "overview")
    pages = [t for t in timings if t.name != "overview"]
    worst = max(pages, key=lambda t: t.p95)
    for name, t, target in (
        ("overview, p95", overview, 50.0),
        (f"worst page p95 ({worst.name})", worst, 100.0),
    ):
        rows.append(
            Row(
                "dashboard",
                f"{size}: {name}",
                t.p95,
                "ms",
                "",
                None,
                f"< {target:g} ms",
                t.p95 < target,
            )
        )
    missed = sum(1 for t in timings if not (t.p95 < t.target_ms))
    rows.append(
        Row(
            "dashboard",
            f"{size}: pages over target (p95)",
            missed,
            "jobs",
            "",
            None,
            "0",
            missed == 0,
        )
    )

    step("dashboard: write cost of its indexes (with / without, in turn)")
    drop = tuple(f"DROP INDEX {name}" for name in dashboard.INDEXES)

    def without(fn: Callable[[], float]) -> Callable[[], float]:
        def run() -> float:
            with _schema_changed(*drop):
                return fn()

        return run

    single = sizes.enqueue_single
    enq_with, enq_without = interleaved(
        lambda: ours_enqueue_single(single, 1, "on"),
        without(lambda: ours_enqueue_single(single, 1, "on")),
    )
    drain_n = sizes.drain
    drain_with, drain_without = interleaved(
        lambda: ours_drain(drain_n, 4), without(lambda: ours_drain(drain_n, 4))
    )
    step("dashboard: server-side index maintenance (with / without, in turn)")
    server_rows = 20_000 if quick else 100_000
    server: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with _ours("bench_dash_write") as url:
        for _ in range(max(3, sizes.repeats)):
            for dropped in (False, True):
                server[dropped].append(dashboard.server_write_cost(url, server_rows, dropped))
                if dropped:  # put them back for the next "with" run
                    with psycopg.connect(url, autocommit=True) as conn:
                        for statement in _index_definitions():
                            conn.execute(statement)
    peer = "same without the dashboard indexes"
    for i, what in ((0, "INSERT ... SELECT"), (1, "UPDATE queued->running->done")):
        with_s = _median([r[i] for r in server[False]])
        without_s = _median([r[i] for r in server[True]])
        rows.append(
            Row(
                "dashboard",
                f"server only: {what}, {server_rows:,} rows",
                server_rows / with_s,
                "/s",
                peer,
                server_rows / without_s,
            )
        )
    assert enq_with is not None and drain_with is not None
    rows.append(
        Row(
            "dashboard",
            f"enqueue 1 job/txn, 1 producer ({single:,})",
            enq_with,
            "/s",
            peer,
            enq_without,
        )
    )
    rows.append(
        Row(
            "dashboard",
            f"drain {drain_n:,} no-op, concurrency 4",
            drain_with,
            "/s",
            peer,
            drain_without,
        )
    )

    step("dashboard: a drain with one tab open on the overview (without / with, in turn)")
    tab_n = 30_000 if quick else 100_000
    path = os.pathsep.join([str(HERE), os.getcwd()])

    def tab(url: str) -> Any:
        return dashboard.open_tab(_sa_url(url), path)

    no_tab, with_tab = interleaved(
        lambda: ours_drain(tab_n, 4), lambda: ours_drain(tab_n, 4, beside=tab)
    )
    assert with_tab is not None
    rows.append(
        Row(
            "dashboard",
            f"drain {tab_n:,} no-op, c=4, one overview tab open",
            with_tab,
            "/s",
            "no tab open",
            no_tab,
            ">= 0.95x",
            None if no_tab is None else with_tab >= 0.95 * no_tab,
        )
    )
    return rows


def drain_target_rows(
    sizes: Sizes,
    rows: list[Row],
    interleaved: Callable[..., list[float | None]],
    step: Callable[[str], None],
) -> None:
    """Issue #23 target 3: no-op drains of 50,000 and 200,000 jobs by one worker process
    at concurrency 4 and by ONE command ``--processes 2 --concurrency 4``, each at least
    0.8x the raw batched loop (100 per claim, one done statement), taken in turn."""
    for n in sizes.drain_targets:
        step(f"drain target: {n:,} no-op, raw batched / c=4 / --processes 2, in turn")
        cpu: tuple[list[tuple[float, float]], ...] = ([], [], [])
        raw, one, two = interleaved(
            lambda n=n, c=cpu: _peer(lambda u: peers.raw_batched_drain(u, n, cpu=c[0])),
            lambda n=n, c=cpu: ours_drain(n, 4, cpu=c[1]),
            lambda n=n, c=cpu: supervised_drain(n, 2, 4, kind="noop", cpu=c[2]),
        )
        for label, rate in (
            ("1 process, concurrency 4", one),
            ("--processes 2 --concurrency 4", two),
        ):
            assert rate is not None
            rows.append(
                Row.versus(
                    "drain",
                    f"{n:,} no-op, {label}",
                    rate,
                    "/s",
                    "raw batched (100/claim), same run",
                    raw,
                    0.8,
                )
            )
        rows += _drain_cpu_rows(n, cpu)


def _drain_cpu_rows(n: int, cpu: tuple[list[tuple[float, float]], ...]) -> list[Row]:
    """What a job of the target drains cost in CPU, client and server apart, beside the
    raw loop's: on two shared cores the drain cannot go faster than these allow
    (benchmarks/README.md, "what limits it")."""
    rows = []
    raw_client = _median([c for c, _ in cpu[0]]) if cpu[0] else None
    raw_server = _median([s for _, s in cpu[0]]) if cpu[0] else None
    for label, runs in (("1 process, c=4", cpu[1]), ("--processes 2", cpu[2])):
        if not runs:
            continue
        rows.append(
            Row(
                "drain",
                f"{n:,} no-op, {label}: worker CPU per job (context)",
                _median([c for c, _ in runs]),
                "us",
                "raw loop's own process",
                raw_client,
            )
        )
        rows.append(
            Row(
                "drain",
                f"{n:,} no-op, {label}: server CPU per job, its backends (context)",
                _median([s for _, s in runs]),
                "us",
                "raw loop's backend",
                raw_server,
            )
        )
    return rows


def _index_definitions() -> list[str]:
    """Revision 0010's ``CREATE INDEX`` statements, from the revision itself."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / (
        "sqla_jobs/migrations/versions/0010_dashboard_indexes.py"
    )
    spec = importlib.util.spec_from_file_location("revision_0010", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [f"CREATE INDEX {name} ON jobs {d}" for name, d in module.INDEXES.items()]


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "us":
        return f"{value:,.0f} us"
    if unit == "MiB":
        return f"{value:,.1f} MiB"
    if unit == "jobs":
        return f"{value:,.0f}"
    if unit == "%":
        return f"{value:.0%}"
    return f"{value:,.0f}/s"


def print_table(rows: list[Row]) -> None:
    head = ("scenario", "sqla_jobs", "peer", "peer value", "ratio", "target", "met")
    cells = [head]
    for r in rows:
        ratio = r.ratio
        cells.append(
            (
                f"{r.section}: {r.name}",
                _fmt(r.value, r.unit),
                r.peer,
                _fmt(r.peer_value, r.unit) if r.peer else "",
                f"{ratio:.2f}x" if ratio is not None else "",
                r.target,
                "" if r.met is None else ("yes" if r.met else "NO"),
            )
        )
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]

    def line(c: tuple[str, ...]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)) + " |"

    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for c in cells[1:]:
        print(line(c))


def environment() -> str:
    with psycopg.connect(peers_admin()) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()
            for name in ("synchronous_commit", "shared_buffers", "fsync", "max_connections")
        }
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    parts = [
        f"nproc={os.cpu_count()}",
        f"memory={mem}",
        f"python={platform.python_version()}",
        f"psycopg={psycopg.__version__}",
        f"postgresql={version[0] if version else '?'}",
    ]
    parts += [f"{k}={v[0] if v else '?'}" for k, v in settings.items()]
    return " ".join(parts)


def peers_admin() -> str:
    from _db import admin_url

    return admin_url()


def cli_start_rows(repeats: int) -> list[Row]:
    """Each command's start beside ``python -c pass`` + its query (see cli_start.py)."""
    commands, bare, floor = cli_start.measure(repeats)
    target = f"<= +{cli_start.TARGET_SECONDS * 1e3:.0f} ms"
    rows = [
        Row(
            "cli",
            f"{c.label}",
            c.wall * 1e3,
            "ms",
            "python -c pass + the query",
            (bare.wall + c.query) * 1e3,
            target,
            cli_start.beyond(c, bare) <= cli_start.TARGET_SECONDS,
        )
        for c in commands
    ]
    rows.append(
        Row(
            "cli",
            "(context) import sqlalchemy.orm + psycopg",
            floor.wall * 1e3,
            "ms",
            "python -c pass",
            bare.wall * 1e3,
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one repeat")
    parser.add_argument(
        "--only",
        default=(
            "enqueue,orm,drain,backlog,tx,procs,async,pickup,claim,limits,slots,scheduled,"
            "cli,dashboard,horizon,history,partitions,archive-migration,workflows,autovacuum"
        ),
        help=(
            "comma-separated sections to run (default: all); drain-target runs only "
            "the drain's #23 target rows"
        ),
    )
    parser.add_argument(
        "--explain", action="store_true", help="print the claim plans (and the dashboard's)"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    only = set(args.only.split(","))
    started = time.perf_counter()
    print(environment(), flush=True)
    rows: list[Row] = []

    def med(fn: Callable[[], float | None]) -> float | None:
        values = [v for v in (fn() for _ in range(sizes.repeats)) if v is not None]
        return _median(values) if values else None

    def interleaved(*fns: Callable[[], float | None]) -> list[float | None]:
        """Median of each, the runs taken in turn (a, b, c, a, b, c, ...): side by side."""
        got: list[list[float]] = [[] for _ in fns]
        for _ in range(sizes.repeats):
            for values, fn in zip(got, fns, strict=True):
                if (v := fn()) is not None:
                    values.append(v)
        return [_median(v) if v else None for v in got]

    def step(label: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {label}", flush=True)

    if "enqueue" in only:
        n = sizes.enqueue_single
        for producers in (1, 8):
            step(f"enqueue single x{producers}")
            modes = ("on", "waiting", "off") if producers == 8 else ("on", "off")
            got: dict[str, list[float]] = {m: [] for m in modes}
            for _ in range(sizes.repeats):  # interleaved: on, (waiting,) off, on, ...
                for m in modes:
                    got[m].append(ours_enqueue_single(n, producers, m))
            off = _median(got["off"])
            on = _median(got["on"])
            rows.append(
                Row(
                    "enqueue",
                    f"1 job/txn, {producers} producer process(es), trigger on",
                    on,
                    "/s",
                    "same, trigger disabled",
                    off,
                    ">= 0.9x" if producers == 8 else "",
                    on >= 0.9 * off if producers == 8 else None,
                )
            )
            if producers == 8:
                rows.append(
                    Row(
                        "enqueue",
                        "same, trigger on, a worker waiting (every commit notifies)",
                        _median(got["waiting"]),
                        "/s",
                        "same, trigger disabled",
                        off,
                    )
                )
        step("raw single inserts x8 (our schema)")
        raw: dict[str, list[float]] = {"on": [], "waiting": [], "off": []}
        for _ in range(sizes.repeats):
            for m in raw:
                raw[m].append(raw_single_on_our_schema(n, 8, m))
        for m, label in (("on", "no worker waiting"), ("waiting", "a worker waiting")):
            rows.append(
                Row(
                    "enqueue",
                    f"raw psycopg INSERT, 8 threads, our schema, trigger on, {label}",
                    _median(raw[m]),
                    "/s",
                    "same, trigger disabled",
                    _median(raw["off"]),
                )
            )
        step("raw single inserts x8 (seed schema)")
        raw_on = med(lambda: _peer(lambda u: peers.raw_insert_single(u, n, 8, True)))
        raw_off = med(lambda: _peer(lambda u: peers.raw_insert_single(u, n, 8, False)))
        if raw_on and raw_off:
            rows.append(
                Row(
                    "enqueue",
                    "raw psycopg, 8 producers, seed per-row trigger",
                    raw_on,
                    "/s",
                    "raw, no trigger",
                    raw_off,
                )
            )
    if "orm" in only:
        step("orm enqueue (session.add(Job) vs enqueue vs raw INSERT)")
        for cmp in orm_enqueue.measure(rounds=3 * sizes.repeats):
            rows.append(
                Row(
                    "orm",
                    cmp.name.split(" vs ")[0],
                    cmp.ours.wall,
                    "us",
                    cmp.name.split(" vs ")[1],
                    cmp.baseline.wall,
                    f"<= {cmp.at_most:g}x",
                    cmp.met,
                )
            )

    if "enqueue" in only or "many" in only:  # "many": enqueue_many and its peers alone
        step("enqueue_many")
        nm = sizes.enqueue_many
        many, pgq, copy, our_copy, floor = interleaved(
            lambda: ours_enqueue_many(nm),
            lambda: _peer(lambda u: peers.pgqueuer_bulk_enqueue(u, nm, 1_000)),
            lambda: _peer(lambda u: peers.raw_copy_enqueue(u, nm)),
            lambda: raw_copy_our_table(nm),
            lambda: server_only_enqueue(nm),
        )
        assert many is not None and floor is not None and our_copy is not None
        rows.append(
            Row.versus(
                "enqueue",
                "enqueue_many, batches of 1,000",
                many,
                "/s",
                "pgqueuer bulk (1,000)",
                pgq,
                3,
            )
        )
        rows.append(
            Row.versus(
                "enqueue",
                "enqueue_many, batches of 1,000",
                many,
                "/s",
                "raw COPY, our table, 1,000/txn",
                our_copy,
                0.6,
            )
        )
        rows.append(
            Row(
                "enqueue",
                "enqueue_many, batches of 1,000",
                many,
                "/s",
                "raw COPY, seed table, 1 txn",
                copy,
            )
        )
        rows.append(
            Row(
                "enqueue",
                "server only: INSERT ... SELECT generate_series, 1,000/txn, our table",
                floor,
                "/s",
                "pgqueuer bulk (1,000)",
                pgq,
            )
        )

    if "drain" in only:
        n = sizes.drain
        step("drain peers")
        pgq = med(lambda: _peer(lambda u: peers.pgqueuer_drain(u, n)))
        batched = med(lambda: _peer(lambda u: peers.raw_batched_drain(u, n)))
        seed = med(lambda: _peer(lambda u: peers.raw_seed_loop_drain(u, n)))
        for conc in (1, 4, 16):
            step(f"drain concurrency={conc}")
            rate = med(lambda c=conc: ours_drain(n, c))  # type: ignore[misc]
            assert rate is not None
            rows.append(
                Row.versus(
                    "drain",
                    f"{n:,} no-op, 1 process, concurrency {conc}",
                    rate,
                    "/s",
                    "pgqueuer (1 QueueManager)",
                    pgq,
                    4,
                )
            )
            rows.append(
                Row.versus(
                    "drain",
                    f"{n:,} no-op, 1 process, concurrency {conc}",
                    rate,
                    "/s",
                    "raw batched (100/claim)",
                    batched,
                    0.8,
                )
            )
        if seed:
            rows.append(Row("drain", "seed loop, 1 connection (context)", seed, "/s"))

    if "drain" in only or "drain-target" in only:  # "drain-target": #23's target 3 alone
        drain_target_rows(sizes, rows, interleaved, step)

    if "backlog" in only:
        # Every rate is compared with the smallest backlog in an otherwise empty table.
        base = sizes.backlogs[0]
        cases = [(h, n) for h in (0, sizes.history) for n in sizes.backlogs]
        backlog: dict[tuple[int, int], list[float]] = {c: [] for c in cases}
        for rep in range(sizes.repeats):  # in turn: 20k, 200k, (1M once), ...
            for history, n in cases:
                if n >= 1_000_000 and rep:
                    continue  # one run of the largest: a minute or more each
                step(f"backlog {n:,}, {history:,} finished rows")
                backlog[(history, n)].append(backlog_drain(n, history))
        first = _median(backlog[(0, base)])
        for history, n in cases:
            label = f", table holding {history:,} finished rows" if history else ""
            runs = "" if len(backlog[(history, n)]) > 1 or sizes.repeats == 1 else " (1 run)"
            row = Row.versus(
                "backlog",
                f"{n:,} no-op, 1 process, concurrency 4{label}{runs}",
                _median(backlog[(history, n)]),
                "/s",
                f"{base:,} backlog, empty table",
                first,
                0.8,
            )
            if (history, n) == (0, base):
                row.target, row.met = "", None
            rows.append(row)

    if "tx" in only:
        n = sizes.tx_drain
        step("transactional drain")
        seed4, *drains, two = interleaved(
            lambda: _peer(lambda u: seed_loop_threads(u, n, 4)),
            lambda: ours_drain(n, 4, "write"),
            lambda: ours_drain(n, 16, "write"),
            lambda: ours_drain(n, 2, "write", processes=2),
        )
        for conc, rate in zip((4, 16), drains, strict=True):
            assert rate is not None
            rows.append(
                Row.versus(
                    "drain",
                    f"{n:,} write-one-row, concurrency {conc}",
                    rate,
                    "/s",
                    "seed loop, 4 threads",
                    seed4,
                    1.5,
                )
            )
        assert two is not None
        rows.append(
            Row(
                "drain",
                f"{n:,} write-one-row, TWO processes, concurrency 2 each (context)",
                two,
                "/s",
                "seed loop, 4 threads",
                seed4,
            )
        )
        # What limits it: CPU per job of the worker process (the seed: its loop's
        # process) and of the whole machine (server, poll and all); medians of the runs.
        # Two processes are not bound by one GIL: their whole-machine figure times their
        # rate shows how close to two full cores they run.
        seed_proc, seed_machine = _cpu_per_job("seed write t=4")
        _, machine = _cpu_per_job("ours write c=2 p=2")
        rows.append(
            Row(
                "drain",
                "same, TWO processes: CPU per job, whole machine",
                machine,
                "us",
                "seed loop, 4 threads: whole machine",
                seed_machine,
            )
        )
        for conc in (4, 16):
            proc, machine = _cpu_per_job(f"ours write c={conc}")
            for what, value, seed in (
                ("worker process", proc, seed_proc),
                ("whole machine", machine, seed_machine),
            ):
                rows.append(
                    Row(
                        "drain",
                        f"write-one-row, concurrency {conc}: CPU per job, {what}",
                        value,
                        "us",
                        "seed loop, 4 threads: " + ("its process" if seed is seed_proc else what),
                        seed,
                    )
                )

    if "procs" in only:
        # One command, --processes N, each of concurrency 4; the best N against the
        # server's own rate for small write transactions (pgbench -N, 4 clients), and
        # against the same jobs' transactions with no queue around them (what a worker
        # whose handlers get a SQLAlchemy Session, or none at all, could reach at most).
        n = sizes.processes_drain
        counts = (1, 2, 3)
        step("--processes N, write-one-row drain, its transaction alone, and pgbench -N")
        bench, *measured = interleaved(
            lambda: pgbench_tps(5 if args.quick else 15),
            *(lambda p=p: supervised_drain(n, p, 4) for p in counts),
            *(lambda p=p: transaction_floor(n, p, "session") for p in counts),
            *(lambda p=p: transaction_floor(n, p, "psycopg") for p in counts),
        )
        by_n, session_floor, psycopg_floor = measured[:3], measured[3:6], measured[6:]
        for p, rate, alone in zip(counts, by_n, session_floor, strict=True):
            assert rate is not None
            rows.append(
                Row(
                    "procs",
                    f"{n:,} write-one-row, --processes {p}, concurrency 4 each",
                    rate,
                    "/s",
                    f"its transactions alone, Session per job, {p} x 4 threads",
                    alone,
                )
            )

        def best(rates: list[float | None]) -> tuple[int, float]:
            n_procs, top = max(zip(counts, rates, strict=True), key=lambda pr: pr[1] or 0.0)
            assert top is not None
            return n_procs, top

        versus_pgbench: list[tuple[str, list[float | None], float | None]] = [
            ("--processes", by_n, 0.7),
            ("its transactions alone, a Session per job, processes", session_floor, None),
            ("its transactions alone, plain psycopg, processes", psycopg_floor, None),
        ]
        for what, rates, at_least in versus_pgbench:
            n_procs, top = best(rates)
            name, peer = f"best: {what} {n_procs}", "pgbench -N -c 4 (TPS)"
            if at_least is None:
                rows.append(Row("procs", name, top, "/s", peer, bench))
            else:
                rows.append(Row.versus("procs", name, top, "/s", peer, bench, at_least))

    if "limits" in only:
        # Queue control (#16): an unlimited kind beside limited ones, and a kind limited
        # to 16 at concurrency 16, each against the plain no-op drain; interleaved runs.
        n = sizes.drain
        step("limits: unlimited beside limited, limit 16 vs none")
        naps = n // 4
        plain, beside, sixteen, nap, nap16 = interleaved(
            lambda: ours_drain(n, 16),
            lambda: ours_drain(n, 16, app="benchapp:limited"),
            lambda: ours_drain(n, 16, "noop16", app="benchapp:limited"),
            lambda: ours_drain(naps, 16, "nap", app="benchapp:limited"),
            lambda: ours_drain(naps, 16, "nap16", app="benchapp:limited"),
        )
        assert plain is not None and beside is not None and sixteen is not None
        assert nap is not None and nap16 is not None
        rows.append(
            Row.versus(
                "limits",
                f"{n:,} no-op, concurrency 16, two limited kinds in the registry",
                beside,
                "/s",
                "same, no limited kind",
                plain,
                0.9,
            )
        )
        rows.append(
            Row.versus(
                "limits",
                f"{n:,} no-op of a kind limited to 16, concurrency 16",
                sixteen,
                "/s",
                "same, unlimited kind",
                plain,
                0.8,
            )
        )
        rows.append(
            Row.versus(
                "limits",
                f"{naps:,} 2 ms jobs of a kind limited to 16, concurrency 16",
                nap16,
                "/s",
                "same, unlimited kind",
                nap,
                0.8,
            )
        )

    if "slots" in only:
        # How busy limited kinds and queues keep their slots (#23): see slots.py.
        import slots

        rows += slots.section(args.quick, step)

    if "history" in only:
        # Every operation with an empty history beside 10M (--quick: 1M) finished jobs
        # (#25): see history.py.
        import history as history_bench

        rows += history_bench.section(args.quick, step)

    if "partitions" in only:
        # A range-partitioned archive beside the plain one, before any migration (#25):
        # see archive_partitions.py.
        import archive_partitions

        rows += archive_partitions.section(args.quick, step)

    if "archive-migration" in only:
        # Revision 0022 (the partitioned archive) upgraded, downgraded and upgraded again
        # on 1,000,000 archived rows (#25): see archive_migration.py.
        import archive_migration

        rows += archive_migration.section(args.quick, step)

    if "horizon" in only:
        # A steady flow with an app's REPEATABLE READ transaction held open beside the
        # same flow without it (#25): see horizon.py.
        import horizon

        rows += horizon.section(args.quick, step)

    if "autovacuum" in only:
        # Autovacuum on jobs with PostgreSQL's defaults beside per-table settings, a day
        # of finished jobs in the table and a steady flow (#25): see autovacuum.py.
        import autovacuum

        rows += autovacuum.section(args.quick, step)

    if "workflows" in only:
        # Workflow steps beside independent jobs at the sizes (#26): see
        # workflows.py.
        import workflows as workflows_bench

        rows += workflows_bench.section(args.quick, step)

    if "scheduled" in only:
        # How late an idle worker starts jobs scheduled ahead (#23): see scheduled.py.
        import scheduled

        rows += scheduled.section(args.quick, step)

    if "async" in only:
        n = sizes.drain
        step("async no-op drain vs sync")
        async_noop, sync_noop = interleaved(
            lambda: async_drain(n, "noop"),
            lambda: async_drain(n, "noop", "--concurrency", "16", app="benchapp:registry"),
        )
        assert async_noop is not None
        rows.append(
            Row.versus(
                "async",
                f"{n:,} no-op, async def, async concurrency 100",
                async_noop,
                "/s",
                "same, def, concurrency 16",
                sync_noop,
                0.8,
            )
        )
        ns = sizes.sleep_jobs
        step(f"{ns:,} sleep jobs, async 200 vs sync 16 (once each)")
        async_sleep = async_drain(ns, "sleep", "--async-concurrency", "200")
        sync_sleep = async_drain(ns, "sleep", "--concurrency", "16", app="benchapp:registry")
        rows.append(
            Row.versus(
                "async",
                f"{ns:,} jobs awaiting asyncio.sleep(0.2), async concurrency 200",
                async_sleep,
                "/s",
                "time.sleep(0.2), def, concurrency 16",
                sync_sleep,
                5,
            )
        )
        ((started_kib, peak_kib),) = RSS["benchapp:async_registry sleep --async-concurrency 200"]
        rows.append(
            Row(
                "async",
                "worker RSS, peak with 200 async jobs at once",
                peak_kib / 1024,
                "MiB",
                "same worker when started",
                started_kib / 1024,
            )
        )

    if "pickup" in only:
        step("pickup latency, idle: ours and raw psycopg + notify trigger, in turn")
        ours_lat: list[float] = []
        raw_lat: list[float] = []
        raw_tx_lat: list[float] = []
        for _ in range(sizes.repeats):
            ours_lat += pickup_latency(sizes.pickup)
            with scratch_database("bench_peer") as peer_url:
                raw_lat += peers.raw_notify_pickup(peer_url, sizes.pickup, 0.020)
            with scratch_database("bench_peer") as peer_url:
                raw_tx_lat += peers.raw_notify_pickup(peer_url, sizes.pickup, 0.020, True)
        for name, q, target in (("p50", 0.5, 2.0), ("p99", 0.99, 5.0)):
            value = _percentile(ours_lat, q)
            scenario = f"{name}, idle worker, 1 job/20 ms, enqueue -> handler"
            rows.append(
                Row(
                    "pickup",
                    scenario,
                    value,
                    "ms",
                    "raw psycopg + notify trigger",
                    _percentile(raw_lat, q),
                    f"<= {target:g} ms",
                    value <= target,
                )
            )
            rows.append(  # issue #23 target 4: beside the raw peer in the same run
                Row.at_most(
                    "pickup",
                    f"{scenario} (#23)",
                    value,
                    "ms",
                    "raw psycopg + notify trigger",
                    _percentile(raw_lat, q),
                    {"p50": 1.2, "p99": 1.5}[name],
                )
            )
            rows.append(
                Row(
                    "pickup",
                    f"{scenario}, vs an INSERT in a transaction",
                    value,
                    "ms",
                    "the same, BEGIN + INSERT + COMMIT",
                    _percentile(raw_tx_lat, q),
                )
            )
        step("pickup latency, idle, traced: where it goes, beside the raw peer's total")
        traced = traced_pickup(sizes.pickup)
        with scratch_database("bench_peer") as peer_url:
            raw_total = peers.raw_notify_pickup(peer_url, sizes.pickup, 0.020)
        print_pickup_trace(traced, raw_total)
        for label, kind, jobs in (
            (f"bursts of {BURST_NAPS} 2-ms jobs", "nap", BURST_NAPS),
            (f"bursts of {BURST_NOOPS} no-op jobs", "noop", BURST_NOOPS),
        ):
            step(f"pickup latency, busy: 8 producers at {BUSY_RATE}/s, {label}; then the peer")
            ours_busy = busy_pickup_latency(sizes.busy_seconds, kind, jobs)
            raw_busy = busy_pickup_latency(sizes.busy_seconds, kind, jobs, raw=True)
            rows += _busy_rows(label, ours_busy, raw_busy)

    if "cli" in only:
        step("cli start")
        rows.extend(cli_start_rows(sizes.repeats * 3))

    if "claim" in only:
        step("claim latency (loading the table)")
        c = claim_latency(sizes, args.explain)
        big = f"{sizes.claim_done // 1000:,}k done + {sizes.claim_future // 1000:,}k future"
        for state in ("ready", "idle"):
            ours_loaded = c[f"ours_loaded_{state}"]
            rows.append(
                Row(
                    "claim",
                    f"median, {big}, {state}",
                    ours_loaded,
                    "ms",
                    "ours, empty table",
                    c[f"ours_empty_{state}"],
                    "< 1 ms, <= 2x",
                    ours_loaded < 1 and ours_loaded <= 2 * c[f"ours_empty_{state}"],
                )
            )
            rows.append(
                Row(
                    "claim",
                    f"median, {big}, {state}",
                    ours_loaded,
                    "ms",
                    "seed OR-form, same data",
                    c[f"seed_loaded_{state}"],
                )
            )
            rows.append(
                Row(
                    "claim",
                    f"seed OR-form, empty table, {state} (context)",
                    c[f"seed_empty_{state}"],
                    "ms",
                )
            )

    if "dashboard" in only:
        rows.extend(dashboard_rows(args.quick, sizes, args.explain, step, interleaved))

    step("done")
    print()
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
