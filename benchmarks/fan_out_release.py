"""A 1 -> N fan-out's release, and its children's done-marks, measured on the server (#26).

The drain's per-step wall time (``workflows.py``) carries the shared host's noise (the
same code measured 0.94x-2.59x at load 7); these are the server's own costs, which do
not move with the load:

* ``release``: the parent's done-mark, whose trigger releases the ``N`` children
  (``jobs_workflow_resolve``), in a scratch database migrated to ``0019`` (the function
  of revision 0014 as 0019 left it, which writes every edge; the fan-out is written at
  head, then the schema downgraded) and in one migrated to head
  (revision 0020: a child whose only dependency ended done is released without writing
  its edge),
  in turn: wall ms, the backend's CPU ms (``/proc/<pid>/stat``: the server runs on this
  host), and the WAL records and bytes of that transaction (``pg_walinspect``, by its
  xid; needs a superuser, as the benchmarks' default server has).
* ``done-marks``: ``N`` running jobs marked done 100 per statement (the completer's
  batched done-mark), independent jobs against the fan-out's released children (they
  are written into the two workflow indexes), at ``0020`` (the row trigger lists each
  ending step) and at head (revision 0021: a leaf, a step no step depends on, is not
  listed): the backend's CPU ms.

    python benchmarks/fan_out_release.py [N] [--rounds 5] [--done-marks-only]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import sqlalchemy as sa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402
from _db import scratch_database  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from sqla_jobs import NewJob, Workflow, config, enqueue_many, migrations, testing  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
#: The revision whose release function writes every edge (0014's), and head.
REVISIONS = {
    "0019 (every edge written)": "0019_released_steps_ready_now",
    "head": "heads",
}
BATCH = 100
END_ROOT = "UPDATE jobs SET status = 'done', finished_at = now() WHERE id = %s"


def _cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICK


@contextmanager
def _database() -> Iterator[str]:
    with scratch_database("bench_fan_out") as url:
        testing.migrate(url, "heads")
        yield url


def _downgrade(url: str, revision: str) -> None:
    # The jobs are written by this code (at head), then the schema goes back to the
    # revision compared: the rows stay, the functions and triggers become that revision's.
    if revision == "heads":
        return
    engine = sa.create_engine(config.database_url(url), poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            migrations.downgrade(conn, revision)
    finally:
        engine.dispose()


def _fan_out(url: str, n: int) -> int:
    with run._engine(url) as engine, Session(engine) as s:
        flow = Workflow()
        root = flow.add("root", "noop")
        for i in range(n):
            flow.add(f"s{i}", "noop", after=root)
        root_id = flow.enqueue(s)[root]
        s.commit()
    return root_id


def release(revision: str, n: int) -> dict[str, float]:
    with _database() as url:
        root = _fan_out(url, n)
        _downgrade(url, revision)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            conn.execute("VACUUM ANALYZE jobs")
            conn.execute("VACUUM ANALYZE jobs_workflow_edges")
            conn.execute("UPDATE jobs SET status = 'running', attempts = 1 WHERE id = %s", (root,))
            conn.execute("CHECKPOINT")
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
            cpu, began = _cpu_ms(backend), time.perf_counter()
            with conn.transaction():
                xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]  # type: ignore[index]
                conn.execute(END_ROOT, (root,))
            wall, cpu = (time.perf_counter() - began) * 1000, _cpu_ms(backend) - cpu
            end = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]  # type: ignore[index]
            records, size = conn.execute(
                "SELECT count(*), sum(record_length + fpi_length) "
                "FROM pg_get_wal_records_info(%s, %s) WHERE xid::text::bigint = %s",
                (start, end, xid),
            ).fetchone()  # type: ignore[misc]
            queued = conn.execute("SELECT count(*) FROM jobs WHERE status = 'queued'").fetchone()
        assert queued is not None and queued[0] == n, queued
    return {"wall": wall, "cpu": cpu, "records": float(records), "bytes": float(size or 0)}


def _release_again_if_recycled(revision: str, n: int, tries: int = 3) -> dict[str, float]:
    # On a host where other databases write much WAL, a checkpoint during the run can
    # recycle the segment the transaction's records start in: that run is measured again.
    for _ in range(tries - 1):
        try:
            return release(revision, n)
        except psycopg.errors.UndefinedFile as exc:
            print(f"  (WAL recycled during the run, measured again: {exc})")
    return release(revision, n)


def done_marks(shape: str, n: int) -> float:
    with _database() as url:
        if shape == "independent":
            with run._engine(url) as engine, Session(engine) as s:
                enqueue_many(s, [NewJob("noop") for _ in range(n)])
                s.commit()
        else:
            root = _fan_out(url, n)
            _downgrade(url, "0020_fan_out_release" if shape.endswith("0020") else "heads")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(END_ROOT, (root,))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "UPDATE jobs SET status = 'running', worker = 'b', attempts = 1 "
                "WHERE status = 'queued'"
            )
            conn.execute("VACUUM ANALYZE jobs")
            ids = [r[0] for r in conn.execute("SELECT id FROM jobs WHERE status = 'running'")]
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            cpu = _cpu_ms(backend)
            for i in range(0, len(ids), BATCH):
                conn.execute(
                    "UPDATE jobs SET status = 'done', finished_at = now(), locked_until = NULL "
                    "WHERE id = ANY(%s) AND status = 'running' AND worker = 'b'",
                    (ids[i : i + BATCH],),
                )
            return _cpu_ms(backend) - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", type=int, nargs="?", default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--done-marks-only", action="store_true", help="skip the release")
    args = parser.parse_args()
    print(f"release of a 1 -> {args.n:,} fan-out, {args.rounds} rounds in turn")
    got: dict[str, list[dict[str, float]]] = {name: [] for name in REVISIONS}
    for _ in range(0 if args.done_marks_only else args.rounds):
        for name, revision in REVISIONS.items():
            got[name].append(_release_again_if_recycled(revision, args.n))
    for name, runs in got.items():
        if not runs:
            continue
        cpus = ", ".join(f"{r['cpu']:.0f}" for r in runs)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"  {name:<26} wall {med['wall']:5.0f} ms, backend CPU {med['cpu']:4.0f} ms "
            f"(runs: {cpus}), WAL {med['records']:,.0f} "
            f"records, {med['bytes'] / 1e6:.1f} MB"
        )
    print(f"done-marks of {args.n:,} jobs, {BATCH} per statement: backend CPU")
    marks: dict[str, list[float]] = {
        "independent": [],
        "fan-out children, at 0020": [],
        "fan-out children (head)": [],
    }
    for _ in range(args.rounds):
        for shape in marks:
            marks[shape].append(done_marks(shape, args.n))
    for shape, cpu_runs in marks.items():
        print(
            f"  {shape:<26} {statistics.median(cpu_runs):4.0f} ms "
            f"(runs: {', '.join(f'{r:.0f}' for r in cpu_runs)})"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
