"""Seeded randomness, per-scenario run times and a session-end summary.

Every test here is marked ``reliability``. Randomness comes from one seed per session:
``SQLA_JOBS_SEED`` if set, else the clock. The seed is printed in the summary and
attached to every failure report, so a failing run can be replayed with
``SQLA_JOBS_SEED=<seed> pytest tests/reliability``.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Generator, Iterator

import pytest
from _pytest.terminal import TerminalReporter

SEED = int(os.environ.get("SQLA_JOBS_SEED") or time.time_ns() % 2**32)
_timings: list[tuple[str, float, str]] = []


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """A Random seeded from the session seed and the test's name (stable per test)."""
    return random.Random(f"{SEED}:{request.node.nodeid}")


@pytest.fixture(autouse=True)
def _scenario_clock(request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.monotonic()
    yield
    elapsed = time.monotonic() - started
    print(f"\n[reliability] {request.node.nodeid}: {elapsed:.1f}s (seed {SEED})")
    _timings.append((request.node.nodeid, elapsed, ""))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "reliability" in item.keywords:
        report.sections.append(
            ("reliability seed", f"replay with SQLA_JOBS_SEED={SEED} (pytest {item.nodeid})")
        )


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    if not _timings:
        return
    terminalreporter.section("reliability scenarios")
    for nodeid, elapsed, _ in _timings:
        terminalreporter.write_line(f"{elapsed:7.1f}s  {nodeid}")
    total = sum(t for _, t, _ in _timings)
    terminalreporter.write_line(f"{total:7.1f}s  total (seed {SEED}; SQLA_JOBS_SEED to replay)")
