"""Worker processes, a supervisor and the exactly-once oracle, shared by the scenarios."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from helpers import TESTS, rows, scalar, url_text, wait_for
from jobapp import SETUP_SQL
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

HERE = Path(__file__).resolve().parent
#: application_name of every backend a worker process opens.
WORKER_APP = "sqla_jobs_worker"


#: Tables of the fencing scenarios (see ``relapp.gated``); no unique key on ``writes``, on purpose.
GATED_SQL = """
CREATE TABLE IF NOT EXISTS gates (
    job_id bigint NOT NULL,
    worker text NOT NULL,
    attempt int NOT NULL,
    PRIMARY KEY (job_id, worker, attempt)
);
CREATE TABLE IF NOT EXISTS writes (
    job_id bigint NOT NULL,
    worker text NOT NULL,
    attempt int NOT NULL
);
"""


def setup_app(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP_SQL)


def spawn(
    url: URL, log: Path, *args: str, app: str = "relapp:registry", env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``python -m sqla_jobs.worker relapp:registry ...``; output appended to ``log``.

    Output goes to a file, not a pipe: a long-running worker must never block on a full
    pipe that nobody reads.
    """
    full_env = {
        **os.environ,
        "DATABASE_URL": url_text(url),
        "PYTHONUNBUFFERED": "1",
        "PGAPPNAME": WORKER_APP,  # libpq: tells the workers' backends from the test's own
        **(env or {}),
    }
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), str(TESTS), full_env.get("PYTHONPATH", "")) if p
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sqla_jobs.worker", app, *args],
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


class Supervisor:
    """Keeps ``size`` worker processes alive, restarting any that died (like systemd)."""

    def __init__(
        self, url: URL, logdir: Path, size: int, *args: str, app: str = "relapp:registry"
    ) -> None:
        self.url, self.logdir, self.args, self.app = url, logdir, args, app
        self.procs: list[subprocess.Popen[bytes]] = []
        self.slots: list[subprocess.Popen[bytes] | None] = [None] * size
        self.kills = 0

    @property
    def log(self) -> Path:
        return self.logdir / "workers.log"

    def ensure(self) -> int:
        """Start a worker in every empty or dead slot; return how many were started."""
        started = 0
        for i, proc in enumerate(self.slots):
            if proc is None or proc.poll() is not None:
                new = spawn(self.url, self.log, *self.args, app=self.app)
                self.slots[i] = new
                self.procs.append(new)
                started += 1
        return started

    def kill_random(self, rng: random.Random) -> int:
        alive = [p for p in self.slots if p is not None and p.poll() is None]
        victim = rng.choice(alive)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        self.kills += 1
        return victim.pid

    def kill_busy(self, engine: sa.Engine, rng: random.Random, wait: float = 5.0) -> int:
        """SIGKILL a worker that holds a running job (jobs.worker is ``host:pid``), waiting
        up to ``wait`` seconds for one; a random one if none does by then. On a loaded
        host a worker can take longer to start than a random storm's pace, and a kill
        that lands before it claims proves nothing."""
        deadline = time.monotonic() + wait
        while True:
            running = rows(engine, "SELECT DISTINCT worker FROM jobs WHERE status = 'running'")
            holders = {str(w).rpartition(":")[2] for (w,) in running}
            busy = [p for p in self.alive() if str(p.pid) in holders]
            if busy or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        victim = rng.choice(busy or self.alive())
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        self.kills += 1
        return victim.pid

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.slots if p is not None and p.poll() is None]

    def stop(self) -> str:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        return self.output()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def stop_all(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def status_counts(engine: sa.Engine) -> dict[str, int]:
    return dict(rows(engine, "SELECT status::text, count(*) FROM jobs GROUP BY 1"))


def all_done(engine: sa.Engine, n: int) -> bool:
    return status_counts(engine) == {"done": n}


def oracle(engine: sa.Engine) -> dict[str, Any]:
    """The figures every crash scenario asserts on, in one round trip."""
    (row,) = rows(
        engine,
        """
        SELECT
          (SELECT count(*) FROM jobs) AS jobs,
          (SELECT count(*) FROM jobs WHERE status = 'done') AS done,
          (SELECT count(*) FROM effects) AS effects,
          (SELECT count(*) FROM jobs j WHERE status = 'done'
             AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.job_id = j.id)) AS done_without_effect,
          (SELECT count(*) FROM effects e WHERE NOT EXISTS
             (SELECT 1 FROM jobs j WHERE j.id = e.job_id AND j.status = 'done'))
             AS effect_without_done,
          (SELECT count(*) FROM jobs WHERE attempts > max_attempts) AS over_max_attempts,
          (SELECT count(*) FROM jobs j JOIN effects e ON e.job_id = j.id
             WHERE e.attempt <> j.attempts OR e.worker <> j.worker) AS effect_not_from_final_run
        """,
    )
    return dict(row._mapping)


def exactly_once(n: int) -> dict[str, int]:
    return {
        "jobs": n,
        "done": n,
        "effects": n,
        "done_without_effect": 0,
        "effect_without_done": 0,
        "over_max_attempts": 0,
        "effect_not_from_final_run": 0,
    }


def worker_backends(engine: sa.Engine, listeners_only: bool = False) -> list[int]:
    """Pids of the worker processes' backends (all, or only their LISTEN connections)."""
    query = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = :app"
    )
    if listeners_only:
        query += " AND query LIKE 'LISTEN%'"
    return sorted(r[0] for r in rows(engine, query, app=WORKER_APP))


def terminate(engine: sa.Engine, pids: Iterable[int]) -> int:
    with engine.connect() as conn:
        return sum(
            bool(conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar())
            for pid in pids
        )


def wait_seconds(started: float) -> float:
    return round(time.monotonic() - started, 2)


def count(engine: sa.Engine, query: str, **params: Any) -> int:
    return int(scalar(engine, query, **params))


def setup_gated(engine: sa.Engine) -> None:
    """The oracle tables plus the fencing scenarios' ``gates`` and ``writes`` (relapp)."""
    setup_app(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(GATED_SQL)


def open_gate(engine: sa.Engine, job_id: int, worker: str, attempt: int) -> None:
    """Let the ``gated`` run of ``job_id`` by ``worker`` at ``attempt`` go on (relapp)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO gates (job_id, worker, attempt) VALUES (:j, :w, :a)"),
            {"j": job_id, "w": worker, "a": attempt},
        )


def run_started(engine: sa.Engine, job_id: int, worker: str, attempt: int) -> bool:
    query = "SELECT count(*) FROM runs WHERE job_id = :j AND worker = :w AND attempt = :a"
    return count(engine, query, j=job_id, w=worker, a=attempt) > 0


def freeze(proc: subprocess.Popen[bytes], engine: sa.Engine, app: str) -> None:
    """SIGSTOP ``proc`` at a moment when none of its backends (application_name ``app``)
    holds a lock on ``jobs``: frozen inside a heartbeat's or a claim's transaction, it
    would keep its row locks, and no other worker could take its jobs over."""
    holding = (
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE a.datname = current_database() AND a.application_name = :app "
        "AND l.relation = 'jobs'::regclass"
    )
    deadline = time.monotonic() + 30
    while True:
        proc.send_signal(signal.SIGSTOP)
        if count(engine, holding, app=app) == 0:
            return
        proc.send_signal(signal.SIGCONT)
        assert time.monotonic() < deadline, "the worker never left its transaction on jobs"
        time.sleep(0.01)


#: A misbehaving-handler case: (kind, payload, how its ``last_error`` begins).
Misbehaving = tuple[str, dict[str, Any], str]


def check_misbehaving(
    engine: sa.Engine,
    db_url: URL,
    tmp_path: Path,
    cases: list[Misbehaving],
    *,
    good_kind: str,
    args: tuple[str, ...],
    app: str = "relapp:registry",
) -> None:
    """Each bad job, followed by a good one (``good_kind``, which writes one effect), run
    one at a time by one worker process: every bad job is a recorded failure (dead, its
    error and traceback in ``last_error``) with no partial write, and the worker lives."""
    from sqla_jobs import NewJob, enqueue_many

    setup_app(engine)
    with Session(engine) as s:
        for i, (kind, payload, _) in enumerate(cases):
            enqueue_many(
                s,
                [
                    NewJob(kind, {**payload, "i": i}, max_attempts=1),
                    NewJob(good_kind, {"after": i}),
                ],
            )
        s.commit()
    proc = spawn(db_url, tmp_path / "worker.log", *args, app=app)
    n = len(cases)
    try:
        wait_for(
            lambda: status_counts(engine) == {"dead": n, "done": n},
            timeout=60,
            message="every job has its outcome",
        )
        assert proc.poll() is None, "a handler took the worker down"
    finally:
        stop_all([proc])
    out = (tmp_path / "worker.log").read_text()
    errors = dict(
        rows(engine, "SELECT (payload->>'i')::int, last_error FROM jobs WHERE status = 'dead'")
    )
    for i, (kind, payload, head) in enumerate(cases):
        assert errors[i].startswith(head), (kind, payload, errors[i][:300])
        assert "Traceback" in errors[i]
    # Zero partial writes: the only effects are the good jobs' (each bad job wrote one
    # row before misbehaving, and all of those were rolled back).
    assert count(engine, "SELECT count(*) FROM effects") == n
    good = "SELECT count(*) FROM effects e JOIN jobs j ON j.id = e.job_id WHERE j.kind = :k"
    assert count(engine, good, k=good_kind) == n
    assert count(engine, "SELECT max(attempts) FROM jobs") == 1, out[-3000:]
