"""How long each command takes to start, beside what it cannot avoid (issue #23, target 6).

Target: ``sqla-jobs --help``, ``stats``, ``list`` and ``show`` (and ``python -m
sqla_jobs.worker --help``) take at most 0.3 s beyond the bare interpreter (``python -c
pass``) plus the command's query. Each command runs as a new process against a scratch
database holding 1,000 jobs, all of them in turn, ``repeats`` times; medians.

``the query`` is timed in this process, its imports already done: a new engine,
connection and Session, the schema check and the command's ``ops`` call, as the command
runs them. ``floor`` is a process that only imports SQLAlchemy's ORM, psycopg and
SQLAlchemy's psycopg dialect: what any command on SQLAlchemy pays before its own code,
so ``own`` (the command less the floor and the query) is what sqla_jobs' code adds.

``python benchmarks/cli_start.py [--repeats N]`` prints the table alone; ``run.py --only
cli`` puts its rows in the benchmark table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _db import scratch_database  # noqa: E402

from sqla_jobs import NewJob, enqueue_many, ops, testing  # noqa: E402

#: The target: start-up beyond ``python -c pass`` plus the query.
TARGET_SECONDS = 0.3

FLOOR_CODE = "import sqlalchemy.orm, psycopg, sqlalchemy.dialects.postgresql.psycopg"


@dataclass(frozen=True)
class Start:
    """One command's medians: wall time and CPU (user + system) of its process."""

    label: str
    wall: float
    cpu: float
    query: float  # seconds of the command's own query (0 for --help)


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv``, which must succeed."""
    before = os.times()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = os.times()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} failed: {proc.stderr.decode()[-500:]}")
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return wall, cpu


def _query_time(url: str, call: Callable[[Session], Any]) -> float:
    """The command's database work, as ``cli._run_ops`` does it, in this process."""
    t0 = time.perf_counter()
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with Session(engine) as session:
            ops.check_schema(session)
            session.rollback()
            call(session)
    finally:
        engine.dispose()
    return time.perf_counter() - t0


def measure(repeats: int) -> tuple[list[Start], Start, Start]:
    """``(commands, python -c pass, floor)``, the runs of all of them taken in turn."""
    python = sys.executable
    with scratch_database("bench_cli") as libpq_url:
        testing.migrate(libpq_url)
        url = "postgresql+psycopg://" + libpq_url.split("://", 1)[1]
        engine = sa.create_engine(url)
        with Session(engine) as session:
            enqueue_many(session, [NewJob("report.build", {"n": i}) for i in range(1_000)])
            session.commit()
            some_id = session.execute(sa.text("SELECT min(id) FROM jobs")).scalar_one()
        engine.dispose()
        env = {**os.environ, "DATABASE_URL": url}
        commands: list[tuple[str, list[str], Callable[[Session], Any] | None]] = [
            ("sqla-jobs --help", [python, "-m", "sqla_jobs", "--help"], None),
            ("sqla-jobs stats", [python, "-m", "sqla_jobs", "stats"], ops.stats),
            ("sqla-jobs list", [python, "-m", "sqla_jobs", "list"], ops.list_jobs),
            (
                "sqla-jobs show ID",
                [python, "-m", "sqla_jobs", "show", str(some_id)],
                lambda s: ops.get_job(s, some_id),
            ),
            (
                "python -m sqla_jobs.worker --help",
                [python, "-m", "sqla_jobs.worker", "--help"],
                None,
            ),
        ]
        runs: dict[str, list[tuple[float, float]]] = {c[0]: [] for c in commands}
        queries: dict[str, list[float]] = {c[0]: [] for c in commands}
        runs["pass"], runs["floor"] = [], []
        for _ in range(repeats):
            runs["pass"].append(_timed([python, "-c", "pass"], env))
            runs["floor"].append(_timed([python, "-c", FLOOR_CODE], env))
            for label, argv, call in commands:
                runs[label].append(_timed(argv, env))
                queries[label].append(0.0 if call is None else _query_time(url, call))

    def start(label: str, name: str | None = None) -> Start:
        walls, cpus = zip(*runs[label], strict=True)
        query = statistics.median(queries[label]) if label in queries else 0.0
        return Start(name or label, statistics.median(walls), statistics.median(cpus), query)

    return [start(c[0]) for c in commands], start("pass", "python -c pass"), start("floor")


def beyond(cmd: Start, bare: Start) -> float:
    """Seconds the command took beyond the bare interpreter and its own query."""
    return cmd.wall - bare.wall - cmd.query


def own(cmd: Start, floor: Start) -> float | None:
    """Seconds a command with a query took beyond the floor's imports and the query."""
    return cmd.wall - floor.wall - cmd.query if cmd.query else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    commands, bare, floor = measure(args.repeats)
    print(f"python -c pass: {bare.wall * 1e3:.0f} ms wall, {bare.cpu * 1e3:.0f} ms CPU")
    print(
        f"floor (python, import sqlalchemy.orm + psycopg): "
        f"{floor.wall * 1e3:.0f} ms wall, {floor.cpu * 1e3:.0f} ms CPU"
    )
    print("| command | wall | CPU | query | pass + query | beyond | target | met | own |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in commands:
        extra = beyond(c, bare)
        print(
            f"| {c.label} | {c.wall * 1e3:.0f} ms | {c.cpu * 1e3:.0f} ms | "
            f"{c.query * 1e3:.0f} ms | {(bare.wall + c.query) * 1e3:.0f} ms | "
            f"{extra * 1e3:.0f} ms | <= {TARGET_SECONDS * 1e3:.0f} ms | "
            f"{'yes' if extra <= TARGET_SECONDS else 'NO'} | "
            f"{'-' if (o := own(c, floor)) is None else f'{o * 1e3:.0f} ms'} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
