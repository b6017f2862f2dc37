"""``--processes N``: one command, N real worker processes under one supervisor."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import TESTS, rows, scalar, setup_app_tables, url_text, wait_for
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import NewJob, enqueue_many


class Supervised:
    """``python -m sqla_jobs.worker jobapp:registry --processes N ...``, output to a file."""

    def __init__(
        self, url: URL, log: Path, *args: str, app: str = "jobapp:registry", **env_vars: str
    ) -> None:
        env = {**os.environ, "DATABASE_URL": url_text(url), "PYTHONUNBUFFERED": "1", **env_vars}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sqla_jobs.worker", app, *args],
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def text(self) -> str:
        return self.log.read_text()

    def children(self) -> dict[int, int]:
        """Worker process index -> pid of its latest start."""
        found = re.findall(r"worker process (\d+) started \(pid (\d+)\)", self.text())
        return {int(i): int(pid) for i, pid in found}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        for pid in self.children().values():  # never leave a worker behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._out.close()


@pytest.fixture
def supervised(db_url: URL, tmp_path: Path) -> Iterator[list[Supervised]]:
    started: list[Supervised] = []
    yield started
    for s in started:
        s.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _counts(engine: sa.Engine) -> dict[str, int]:
    return dict(rows(engine, "SELECT status::text, count(*) FROM jobs GROUP BY 1"))


def test_sigterm_drains_every_worker_process_and_exits_zero(
    engine: sa.Engine, db_url: URL, tmp_path: Path, supervised: list[Supervised]
) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        enqueue_many(s, [NewJob("effect", {"sleep": 1.5, "log": True}) for _ in range(4)])
        enqueue_many(s, [NewJob("effect", {}, priority=5) for _ in range(20)])
        s.commit()
    sup = Supervised(db_url, tmp_path / "sup.log", "--processes", "2", "--concurrency", "2")
    supervised.append(sup)
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM runs") >= 4, message="4 handlers")
    workers = {r[0] for r in rows(engine, "SELECT DISTINCT worker FROM runs")}
    assert len(workers) == 2  # two processes, each its own worker id
    children = sup.children()
    assert len(children) == 2 and sup.proc.pid not in children.values()
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.text()
    out = sup.text()
    assert "received SIGTERM: stopping 2 worker processes" in out
    assert out.count("no more claims, draining") == 2, out  # each child drained
    assert not any(_alive(pid) for pid in children.values())
    assert _counts(engine) == {"done": 4, "queued": 20}, out
    assert scalar(engine, "SELECT max(attempts) FROM jobs WHERE status = 'queued'") == 0


def test_a_killed_worker_process_is_restarted_and_its_jobs_rescued(
    engine: sa.Engine, db_url: URL, tmp_path: Path, supervised: list[Supervised]
) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        enqueue_many(s, [NewJob("effect", {"sleep": 1.0, "log": True}) for _ in range(2)])
        s.commit()
    sup = Supervised(
        db_url,
        tmp_path / "sup.log",
        "--processes",
        "2",
        "--lock-seconds",
        "1",
        "--rescue-interval",
        "0.3",
        "--poll-interval",
        "0.2",
    )
    supervised.append(sup)
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM runs") >= 1, message="a handler")
    victim_worker, victim_job = rows(engine, "SELECT worker, job_id FROM runs LIMIT 1")[0]
    victim = int(victim_worker.rsplit(":", 1)[1])  # default worker id: host:pid
    assert victim in sup.children().values()
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: "exited with status -9; restarting" in sup.text(), message="restart")
    wait_for(
        lambda: victim not in sup.children().values() and len(sup.children()) == 2,
        message="a new process in the victim's place",
    )
    wait_for(lambda: _counts(engine) == {"done": 2}, timeout=60, message="both jobs done")
    # The killed run left no effect; the job ran again after its lease (attempt 2).
    assert (
        rows(engine, "SELECT job_id, attempt FROM effects ORDER BY job_id").count((victim_job, 2))
        == 1
    ), sup.text()
    assert scalar(engine, "SELECT count(*) FROM effects") == 2
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.text()


def test_a_second_signal_stops_the_processes_at_once_and_exits_one(
    engine: sa.Engine, db_url: URL, tmp_path: Path, supervised: list[Supervised]
) -> None:
    setup_app_tables(engine)
    with Session(engine) as s:
        enqueue_many(s, [NewJob("effect", {"sleep": 20, "log": True}) for _ in range(2)])
        s.commit()
    sup = Supervised(db_url, tmp_path / "sup.log", "--processes", "2")
    supervised.append(sup)
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM runs") >= 2, message="2 handlers")
    children = sup.children()
    sup.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: sup.text().count("no more claims, draining") == 2, message="draining")
    sup.proc.send_signal(signal.SIGINT)
    assert sup.proc.wait(30) == 1, sup.text()
    assert "received SIGINT again: worker processes exit now" in sup.text()
    assert not any(_alive(pid) for pid in children.values())
    assert _counts(engine) == {"running": 2}  # left to their leases, never lost


def test_sigterm_before_the_worker_processes_started_exits_zero(
    db_url: URL, tmp_path: Path, supervised: list[Supervised]
) -> None:
    # A child still importing the app has no signal handler yet: SIGTERM kills it
    # (status -15). It had claimed nothing, so the stop is as clean as a drain. (Seen
    # when a crashed child was restarted a moment before a deploy's SIGTERM.)
    gate = tmp_path / "gate"
    gate.touch()
    sup = Supervised(
        db_url,
        tmp_path / "sup.log",
        "--processes",
        "2",
        app="slowstartapp:registry",
        SLOW_START_GATE=str(gate),
        SLOW_START_PARENT=str(os.getpid()),
    )
    supervised.append(sup)
    wait_for(lambda: len(list(tmp_path.glob("gate.*"))) == 2, message="2 children importing")
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.text()
    out = sup.text()
    assert out.count("was stopped by SIGTERM before it started: it held no job") == 2, out
    assert "supervisor stopped: 2 of 2 worker processes drained cleanly" in out
    assert "started: queues=" not in out  # no worker got as far as claiming


def test_the_worker_processes_stop_when_their_supervisor_is_killed(
    engine: sa.Engine, db_url: URL, tmp_path: Path, supervised: list[Supervised]
) -> None:
    sup = Supervised(db_url, tmp_path / "sup.log", "--processes", "2")
    supervised.append(sup)
    wait_for(lambda: sup.text().count(" started: ") == 2, message="2 workers started")
    children = sup.children()
    sup.proc.kill()
    sup.proc.wait(30)
    wait_for(lambda: not any(_alive(pid) for pid in children.values()), message="children gone")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--processes", "0"], "--processes must be at least 1, got 0"),
        (
            ["--processes", "2", "--metrics-port", "9999"],
            "--metrics-port cannot be used with --processes: every process would serve it",
        ),
        (["--processes", "2", "--concurrency", "0"], "concurrency"),
    ],
)
def test_bad_process_options_exit_two_before_any_process_starts(
    db_url: URL, tmp_path: Path, supervised: list[Supervised], args: list[str], message: str
) -> None:
    sup = Supervised(db_url, tmp_path / "sup.log", *args)
    supervised.append(sup)
    assert sup.proc.wait(30) == 2
    out = sup.text()
    assert f"sqla_jobs: error: {message}" in out, out
    assert "started" not in out
