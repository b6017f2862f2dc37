"""The dashboard at the sizes users reach (``python benchmarks/run.py --only dashboard``).

``load`` fills a migrated scratch database by SQL (``generate_series``): ``jobs`` rows
that are mostly done, with a recent backlog (queued, scheduled, running), retrying,
dead and cancelled jobs, kinds and queues common and rare, payloads with varied keys,
idempotency keys on one job in ten, ``created_at`` spread over seven days; and as many
archived rows, older. Then ``VACUUM ANALYZE``, as after a bulk load.

``page_times`` measures server time in process: the dashboard's ASGI app (the real
``create_app``, its routes, the ops calls on the thread pool and the template render)
driven through ``httpx.ASGITransport``, no socket, no browser. The jobs page offers one
order, newest first; the other order (oldest first, ``sqla-jobs list`` and
``ops.list_jobs``' default) is timed as the ``ops.list_jobs`` call alone.

``open_tab`` is one browser tab on the overview, as the browser's code asks for it
(``static/dashboard.js``): the page once, then its event stream ``/events?counts=1``
held open, from the standalone ``sqla-jobs dashboard`` command in a process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqla_jobs import ops
from sqla_jobs.dashboard import create_app

#: The indexes revisions 0010 and 0016 add for the dashboard (dropped to price their
#: write cost).
INDEXES: tuple[str, ...] = (
    "jobs_status_id_idx",
    "jobs_kind_id_idx",
    "jobs_queue_id_idx",
    "jobs_payload_idx",
    "jobs_created_hour_idx",
)

#: Kinds and their share of the rows, per thousand (``rare.audit``: 1 in 1,000).
KINDS = (("email.send", 500), ("report.build", 250), ("webhook.post", 150), ("crm.sync", 99))
RARE_KIND = "rare.audit"
QUEUES = (("default", 600), ("mail", 250), ("reports", 149))
RARE_QUEUE = "rare"

# Status by position: the newest 5% of the rows are the live backlog (queued, scheduled,
# running, some done); older rows are history (done, dead, cancelled, a few retrying).
_LOAD_JOBS = """
INSERT INTO jobs (kind, queue, priority, payload, status, run_at, locked_until, attempts,
                  max_attempts, idempotency_key, worker, last_error, created_at, finished_at)
SELECT kind, queue, priority, payload, status::job_status,
       CASE WHEN status = 'queued' AND scheduled THEN now() + interval '1 hour' * (1 + g %% 48)
            ELSE created_at END,
       CASE WHEN status = 'running' THEN now() + interval '5 minutes' END,
       CASE WHEN status IN ('queued', 'done') AND NOT retrying THEN
                CASE WHEN status = 'done' THEN 1 ELSE 0 END
            WHEN status = 'dead' THEN 8 ELSE 1 + g %% 3 END,
       CASE WHEN status = 'queued' AND NOT retrying THEN NULL ELSE 8 END,
       CASE WHEN g %% 10 = 0 THEN 'key-' || g END,
       CASE WHEN status = 'running' THEN 'host-' || g %% 4 END,
       CASE WHEN status IN ('dead', 'cancelled') OR retrying THEN 'boom ' || g END,
       created_at,
       CASE WHEN status IN ('done', 'dead', 'cancelled')
            THEN created_at + interval '2 seconds' END
FROM (
  SELECT g,
         CASE WHEN h < 1 THEN %(rare_kind)s WHEN h < 500 THEN 'email.send'
              WHEN h < 750 THEN 'report.build' WHEN h < 900 THEN 'webhook.post'
              ELSE 'crm.sync' END AS kind,
         CASE WHEN q = 0 AND g %% 2 = 0 THEN %(rare_queue)s WHEN q < 600 THEN 'default'
              WHEN q < 850 THEN 'mail' ELSE 'reports' END AS queue,
         (g %% 3)::smallint AS priority,
         jsonb_build_object('user', g %% 50000, 'tenant', 't' || g %% 20)
           || CASE WHEN g %% 4 = 0 THEN jsonb_build_object('order', g, 'items', g %% 7)
                   ELSE '{}' END
           || CASE WHEN g %% 9 = 0 THEN jsonb_build_object('plan', 'pro') ELSE '{}' END AS payload,
         CASE WHEN recent THEN
                CASE WHEN s < 400 THEN 'queued' WHEN s < 600 THEN 'queued'
                     WHEN s < 650 THEN 'running' ELSE 'done' END
              ELSE
                CASE WHEN s < 974 THEN 'done' WHEN s < 994 THEN 'dead'
                     WHEN s < 999 THEN 'cancelled' ELSE 'queued' END
         END AS status,
         recent AND s >= 400 AND s < 600 AS scheduled,
         NOT recent AND s >= 999 AS retrying,
         now() - interval '7 days' * (1 - g::float8 / %(n)s) AS created_at
  FROM (
    SELECT g, (g::bigint * 7919) %% 1000 AS h, (g::bigint * 104729) %% 1000 AS q,
           (g::bigint * 15485863) %% 1000 AS s, g > %(n)s * 0.95 AS recent
    FROM generate_series(1, %(n)s) AS g
  ) AS picks
) AS chosen
"""

# Archived rows: older than every live one, the same kinds and payload shapes, finished.
_LOAD_ARCHIVE = """
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, attempts,
                          max_attempts, idempotency_key, last_error, created_at,
                          finished_at, archived_at)
SELECT g, CASE WHEN g %% 1000 = 0 THEN %(rare_kind)s WHEN g %% 2 = 0 THEN 'email.send'
               ELSE 'report.build' END,
       CASE WHEN g %% 3 = 0 THEN 'mail' ELSE 'default' END, 0,
       jsonb_build_object('user', g %% 50000, 'tenant', 't' || g %% 20),
       CASE WHEN g %% 50 = 0 THEN 'dead' ELSE 'done' END::job_status,
       created_at, 1, 8, CASE WHEN g %% 10 = 0 THEN 'old-key-' || g END,
       CASE WHEN g %% 50 = 0 THEN 'boom' END, created_at, created_at + interval '2 seconds',
       created_at + interval '3 days'
FROM (SELECT g, now() - interval '30 days' + interval '20 days' * g::float8 / %(n)s
             AS created_at
      FROM generate_series(1, %(n)s) AS g) AS a
"""


def load(url: str, jobs: int, archived: int) -> None:
    """Fill ``jobs`` and ``jobs_archive`` (ids of ``jobs`` above the archive's)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_LOAD_ARCHIVE, {"n": archived, "rare_kind": RARE_KIND})
        conn.execute(f"ALTER TABLE jobs ALTER COLUMN id RESTART WITH {archived + 1}")
        conn.execute(_LOAD_JOBS, {"n": jobs, "rare_kind": RARE_KIND, "rare_queue": RARE_QUEUE})
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE jobs_archive")


@dataclass(frozen=True)
class Case:
    """One filter of the jobs page: its query string and the same filter in SQL."""

    name: str
    query: dict[str, str]
    where: str
    target_ms: float = 100.0


def cases(url: str) -> list[Case]:
    """Every single filter the page offers, with values common, rare and absent."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT min(id), max(id), (SELECT idempotency_key FROM jobs"
            " WHERE idempotency_key IS NOT NULL ORDER BY id OFFSET 1000 LIMIT 1) FROM jobs"
        ).fetchone()
    assert row is not None
    low, high, key = row
    mid = (low + high) // 2
    found = [Case("no filter", {}, "true")]
    for status in ("queued", "running", "done", "dead", "cancelled"):
        found.append(Case(f"status={status}", {"status": status}, f"status = '{status}'"))
    for label, kind in (("common", "email.send"), ("rare", RARE_KIND), ("absent", "no.such")):
        found.append(Case(f"kind {label}", {"kind": kind}, f"kind = '{kind}'"))
    for label, queue in (("common", "default"), ("rare", RARE_QUEUE)):
        found.append(Case(f"queue {label}", {"queue": queue}, f"queue = '{queue}'"))
    found.append(Case("key", {"key": key}, f"idempotency_key = '{key}'"))
    found.append(
        Case(
            "id range (10,000 ids)",
            {"min_id": str(mid), "max_id": str(mid + 9_999)},
            f"id BETWEEN {mid} AND {mid + 9_999}",
        )
    )
    found.append(
        Case("older_than 1d", {"older_than": "1d"}, "created_at < now() - interval '1 day'")
    )
    found.append(
        Case("newer_than 1d", {"newer_than": "1d"}, "created_at >= now() - interval '1 day'")
    )
    for label, match in (
        ("common", '{"tenant": "t3"}'),
        ("rare", '{"user": 12345}'),
        ("absent", '{"user": -1}'),
    ):
        found.append(Case(f"payload {label}", {"payload": match}, f"payload @> '{match}'"))
    return found


def cursors(url: str, case: Case, newest_first: bool) -> dict[str, int | None]:
    """The ``after`` cursor of the first page, of one in the middle of the matches and of
    one near their end (the last full page), in the given order."""
    order = "DESC" if newest_first else "ASC"
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM jobs WHERE {case.where}").fetchone()
        total = int(row[0]) if row else 0
        found: dict[str, int | None] = {"first": None}
        for label, offset in (("middle", total // 2), ("end", max(0, total - 51))):
            if total < 102:
                continue
            got = conn.execute(
                f"SELECT id FROM jobs WHERE {case.where} ORDER BY id {order}"
                f" OFFSET {offset} LIMIT 1"
            ).fetchone()
            if got:
                found[label] = int(got[0])
    return found


@dataclass(frozen=True)
class Timing:
    name: str
    times_ms: list[float]
    target_ms: float

    @property
    def median(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def p95(self) -> float:
        ordered = sorted(self.times_ms)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


async def _time_get(
    client: httpx.AsyncClient, path: str, params: dict[str, str], n: int
) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        response = await client.get(path, params=params)
        times.append((time.perf_counter() - t0) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{path} {params}: {response.status_code} {response.text[:300]}")
    return times


def _list_args(query: dict[str, str]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for name, value in query.items():
        if name in ("min_id", "max_id"):
            args[name] = int(value)
        elif name in ("older_than", "newer_than"):
            args[name] = ops.parse_duration(value)
        elif name == "payload":
            import json

            args[name] = json.loads(value)
        else:
            args[name] = value
    return args


def _time_ops(engine: sa.Engine, query: dict[str, str], after: int | None, n: int) -> list[float]:
    args = _list_args(query)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        with Session(engine) as session:
            ops.list_jobs(session, **args, after_id=after, limit=51, newest_first=False)
        times.append((time.perf_counter() - t0) * 1000)
    return times


def page_times(url: str, sa_url: str, repeats: int) -> list[Timing]:
    """Median and p95 of every page, ``repeats`` requests each (after one warm-up)."""
    chosen = cases(url)
    engine = sa.create_engine(sa_url, pool_size=4)
    found: list[Timing] = []
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT id FROM jobs_archive ORDER BY id OFFSET 5000 LIMIT 1").fetchone()
    archived_id = int(row[0]) if row else 1

    async def run() -> None:
        app = create_app(engine, listen=False)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as client:
            await _time_get(client, "/", {}, 2)
            found.append(Timing("overview", await _time_get(client, "/", {}, repeats), 50.0))
            found.append(
                Timing(
                    "archived job's page",
                    await _time_get(client, f"/jobs/{archived_id}", {}, repeats),
                    100.0,
                )
            )
            for case in chosen:
                for label, after in cursors(url, case, newest_first=True).items():
                    params = dict(case.query)
                    if after is not None:
                        params["after"] = str(after)
                    await _time_get(client, "/jobs", params, 1)
                    times = await _time_get(client, "/jobs", params, repeats)
                    found.append(Timing(f"page {case.name}, newest first, {label}", times, 100.0))

    try:
        asyncio.run(run())
        for case in chosen:
            for label, after in cursors(url, case, newest_first=False).items():
                _time_ops(engine, case.query, after, 1)
                times = _time_ops(engine, case.query, after, repeats)
                found.append(Timing(f"list {case.name}, oldest first, {label}", times, 100.0))
    finally:
        engine.dispose()
    return found


def explain(url: str, case: Case, newest_first: bool) -> str:
    """The plan of the first page of ``case`` (for reading, printed with ``--explain``)."""
    order = "DESC" if newest_first else "ASC"
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT * FROM jobs WHERE {case.where}"
            f" ORDER BY id {order} LIMIT 51"
        ).fetchall()
    return "\n".join(r[0] for r in rows)


# --- the indexes' write cost, server side ------------------------------------------------


def server_write_cost(url: str, rows: int, drop: bool) -> tuple[float, float]:
    """Seconds to insert ``rows`` jobs in one statement, then to move them queued ->
    running -> done (two non-HOT updates of every row, as a claim and a done-mark do),
    with the dashboard's indexes (revisions 0010, 0016) or (``drop``) without: the index
    maintenance itself, without the per-transaction costs that hide it in a drain."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs")
        for name in INDEXES if drop else ():
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        t0 = time.perf_counter()
        conn.execute(
            "INSERT INTO jobs (kind, queue, payload, idempotency_key)"
            " SELECT 'k' || g %% 5, 'q' || g %% 3,"
            " jsonb_build_object('user', g, 'tenant', 't' || g %% 20),"
            " CASE WHEN g %% 10 = 0 THEN 'key-' || g END FROM generate_series(1, %(n)s) AS g",
            {"n": rows},
        )
        t1 = time.perf_counter()
        conn.execute(
            "UPDATE jobs SET status = 'running', attempts = 1,"
            " locked_until = now() + interval '1 minute'"
        )
        conn.execute("UPDATE jobs SET status = 'done', finished_at = now(), locked_until = NULL")
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1


# --- one open tab -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def open_tab(sa_url: str, pythonpath: str) -> Iterator[Callable[[], int]]:
    """``sqla-jobs dashboard`` in a process of its own and one tab on its overview: the
    page, then ``/events?counts=1`` read until the block ends. Yields a function giving
    how many events the tab has received (so a caller can check it was live)."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": pythonpath}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sqla_jobs",
            "dashboard",
            "--database-url",
            sa_url,
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    events = [0]
    stop = threading.Event()

    def browse() -> None:
        with httpx.Client(base_url=base, timeout=httpx.Timeout(5.0, read=60.0)) as client:
            client.get("/").raise_for_status()
            with client.stream("GET", "/events", params={"counts": "1"}) as stream:
                for line in stream.iter_lines():
                    if line.startswith("event:"):
                        events[0] += 1
                    if stop.is_set():
                        return

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(base + "/static/favicon.svg", timeout=1.0)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the dashboard did not start") from None
                time.sleep(0.1)
        thread = threading.Thread(target=browse, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while events[0] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the tab received no event")
            time.sleep(0.05)
        yield lambda: events[0]
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
