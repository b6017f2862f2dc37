"""The ORM style of enqueue against ``enqueue`` and a raw INSERT (issue #23, target 2).

Targets: ``session.add(Job(...))`` + ``commit()`` at most 1.1x ``enqueue()`` +
``commit()``; ``add`` + ``flush()`` inside an open transaction at most 1.3x
``enqueue()``; the same with an ``AsyncSession``; ``enqueue()`` + ``commit()`` at most
1.15x a raw ``text()`` INSERT (``RETURNING id``) + ``commit()`` through the same
Session. One job ``{"n": i}`` of one kind per call, one connection, a scratch database.

The variants of a group run in turn, ``block`` calls each, ``rounds`` times; each
figure is the median of the rounds' per-call times (µs, wall), beside the client CPU
per call (``time.process_time``), which the shared machine's load moves less.
``python benchmarks/orm_enqueue.py [--rounds N]`` prints the table alone; ``run.py
--only orm`` puts its rows in the benchmark table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _db import scratch_database  # noqa: E402

from sqla_jobs import Job, enqueue, enqueue_async, testing  # noqa: E402

KIND = "bench.orm"
RAW_INSERT = sa.text(
    "INSERT INTO jobs (kind, payload) VALUES (:kind, CAST(:payload AS jsonb)) RETURNING id"
)


@dataclass(frozen=True)
class Figure:
    """One variant's medians per call: wall and client CPU, in µs."""

    label: str
    wall: float
    cpu: float


@dataclass(frozen=True)
class Comparison:
    """A variant against its baseline, and the most the ratio may be."""

    name: str
    ours: Figure
    baseline: Figure
    at_most: float

    @property
    def ratio(self) -> float:
        return self.ours.wall / self.baseline.wall

    @property
    def met(self) -> bool:
        return self.ratio <= self.at_most


def _in_turn(
    variants: dict[str, Callable[[int], None]], rounds: int, block: int
) -> dict[str, Figure]:
    walls: dict[str, list[float]] = {k: [] for k in variants}
    cpus: dict[str, list[float]] = {k: [] for k in variants}
    n = 0
    for fn in variants.values():  # warm up: statements prepared, caches filled
        for _ in range(20):
            fn(n := n + 1)
    for _ in range(rounds):
        for label, fn in variants.items():
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(block):
                fn(n := n + 1)
            walls[label].append((time.perf_counter() - t0) / block * 1e6)
            cpus[label].append((time.process_time() - c0) / block * 1e6)
    return {k: Figure(k, statistics.median(walls[k]), statistics.median(cpus[k])) for k in variants}


def _sync(url: str, rounds: int, block: int) -> list[Comparison]:
    engine = sa.create_engine(url)
    try:
        with Session(engine) as s:

            def add_commit(i: int) -> None:
                s.add(Job(kind=KIND, payload={"n": i}))
                s.commit()

            def enqueue_commit(i: int) -> None:
                enqueue(s, KIND, {"n": i})
                s.commit()

            def raw_commit(i: int) -> None:
                s.execute(RAW_INSERT, {"kind": KIND, "payload": f'{{"n": {i}}}'}).scalar_one()
                s.commit()

            def add_flush(i: int) -> None:
                s.add(Job(kind=KIND, payload={"n": i}))
                s.flush()

            def enqueue_only(i: int) -> None:
                enqueue(s, KIND, {"n": i})

            committed = _in_turn(
                {"add+commit": add_commit, "enqueue+commit": enqueue_commit, "raw": raw_commit},
                rounds,
                block,
            )
            open_tx = _in_turn({"add+flush": add_flush, "enqueue": enqueue_only}, rounds, block)
            s.rollback()
    finally:
        engine.dispose()
    return [
        Comparison(
            "Session: add(Job) + commit vs enqueue + commit",
            committed["add+commit"],
            committed["enqueue+commit"],
            1.1,
        ),
        Comparison(
            "Session: add(Job) + flush vs enqueue, in an open transaction",
            open_tx["add+flush"],
            open_tx["enqueue"],
            1.3,
        ),
        Comparison(
            "Session: enqueue + commit vs raw text() INSERT + commit",
            committed["enqueue+commit"],
            committed["raw"],
            1.15,
        ),
    ]


def _async(url: str, rounds: int, block: int) -> list[Comparison]:
    """The same groups on an AsyncSession: each call awaited on one event loop."""

    async def main() -> list[Comparison]:
        engine = create_async_engine(url)
        try:
            async with AsyncSession(engine) as s:

                async def add_commit(i: int) -> None:
                    s.add(Job(kind=KIND, payload={"n": i}))
                    await s.commit()

                async def enqueue_commit(i: int) -> None:
                    await enqueue_async(s, KIND, {"n": i})
                    await s.commit()

                async def raw_commit(i: int) -> None:
                    params = {"kind": KIND, "payload": f'{{"n": {i}}}'}
                    (await s.execute(RAW_INSERT, params)).scalar_one()
                    await s.commit()

                async def add_flush(i: int) -> None:
                    s.add(Job(kind=KIND, payload={"n": i}))
                    await s.flush()

                async def enqueue_only(i: int) -> None:
                    await enqueue_async(s, KIND, {"n": i})

                committed = await _in_turn_async(
                    {
                        "add+commit": add_commit,
                        "enqueue+commit": enqueue_commit,
                        "raw": raw_commit,
                    },
                    rounds,
                    block,
                )
                open_tx = await _in_turn_async(
                    {"add+flush": add_flush, "enqueue": enqueue_only}, rounds, block
                )
                await s.rollback()
        finally:
            await engine.dispose()
        return [
            Comparison(
                "AsyncSession: add(Job) + commit vs enqueue_async + commit",
                committed["add+commit"],
                committed["enqueue+commit"],
                1.1,
            ),
            Comparison(
                "AsyncSession: add(Job) + flush vs enqueue_async, in an open transaction",
                open_tx["add+flush"],
                open_tx["enqueue"],
                1.3,
            ),
            Comparison(
                "AsyncSession: enqueue_async + commit vs raw text() INSERT + commit",
                committed["enqueue+commit"],
                committed["raw"],
                1.15,
            ),
        ]

    return asyncio.run(main())


async def _in_turn_async(
    variants: dict[str, Callable[[int], Awaitable[None]]], rounds: int, block: int
) -> dict[str, Figure]:
    walls: dict[str, list[float]] = {k: [] for k in variants}
    cpus: dict[str, list[float]] = {k: [] for k in variants}
    n = 0
    for fn in variants.values():
        for _ in range(20):
            await fn(n := n + 1)
    for _ in range(rounds):
        for label, fn in variants.items():
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(block):
                await fn(n := n + 1)
            walls[label].append((time.perf_counter() - t0) / block * 1e6)
            cpus[label].append((time.process_time() - c0) / block * 1e6)
    return {k: Figure(k, statistics.median(walls[k]), statistics.median(cpus[k])) for k in variants}


def measure(rounds: int = 9, block: int = 200) -> list[Comparison]:
    """Every comparison, sync then async, each in a scratch database of its own."""
    found: list[Comparison] = []
    for run in (_sync, _async):
        with scratch_database("bench_orm") as libpq_url:
            testing.migrate(libpq_url)
            found += run("postgresql+psycopg://" + libpq_url.split("://", 1)[1], rounds, block)
    return found


def _row(c: Comparison) -> str:
    return (
        f"| {c.name} | {c.ours.wall:,.0f} us ({c.ours.cpu:,.0f} CPU) | "
        f"{c.baseline.wall:,.0f} us ({c.baseline.cpu:,.0f} CPU) | {c.ratio:.2f}x "
        f"(CPU {c.ours.cpu / c.baseline.cpu:.2f}x) | <= {c.at_most:g}x | "
        f"{'yes' if c.met else 'NO'} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--block", type=int, default=200, help="calls per variant per round")
    args = parser.parse_args(argv)
    print("| comparison | ours per call | baseline per call | ratio | target | met |")
    print("|---|---|---|---|---|---|")
    for c in measure(args.rounds, args.block):
        print(_row(c), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
