"""Queue control with real worker processes: pause, limits, rates, the registry of workers.

The oracle is ``control_runs`` (tests/queuecontrolapp.py): each handler logs its start and
end by the database's clock on a connection of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import TESTS, rows, scalar, url_text, wait_for
from queuecontrolapp import MAX_OVERLAP_SQL, SETUP_SQL
from reliability.support import spawn, stop_all
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import NewJob, enqueue, enqueue_many, ops

APP = "queuecontrolapp:registry"


@pytest.fixture
def control_engine(engine: sa.Engine) -> sa.Engine:
    with engine.begin() as conn:
        conn.exec_driver_sql(SETUP_SQL)
    return engine


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    stop_all(started)


def workers(
    url: URL, log: Path, procs: list[subprocess.Popen[bytes]], n: int, *args: str
) -> list[subprocess.Popen[bytes]]:
    new = [spawn(url, log, "--log-level", "WARNING", *args, app=APP) for _ in range(n)]
    procs.extend(new)
    return new


def cli(url: URL, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqla_jobs", *args, "--database-url", url_text(url)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )


def done(engine: sa.Engine, kind: str, n: int) -> bool:
    return bool(
        scalar(engine, "SELECT count(*) FROM jobs WHERE kind = :k AND status = 'done'", k=kind) == n
    )


def max_overlap(engine: sa.Engine, kind: str) -> int:
    return int(scalar(engine, MAX_OVERLAP_SQL, kind=kind))


def runs_per_job(engine: sa.Engine, kind: str) -> set[int]:
    return {
        r[0]
        for r in rows(
            engine, "SELECT count(*) FROM control_runs WHERE kind = :k GROUP BY job_id", k=kind
        )
    }


def test_a_kind_limit_holds_across_four_workers_and_every_job_runs_once(
    control_engine: sa.Engine, db_url: URL, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    engine = control_engine
    with Session(engine) as s:
        # Jobs long enough (0.3 s) that the limit is reached even when a loaded machine
        # is slow to hand a claimed job to a thread.
        nap = {"sleep": 0.3, "in_session": True}
        enqueue_many(s, [NewJob("limited", nap) for _ in range(30)])
        enqueue_many(s, [NewJob("capped_work", nap, queue="capped") for _ in range(16)])
        s.commit()
    workers(db_url, tmp_path / "w.log", procs, 4, "--concurrency", "8")
    wait_for(lambda: done(engine, "limited", 30) and done(engine, "capped_work", 16), timeout=60)
    # limit=3 on the kind, limit_queue("capped", limit=2) on the queue: reached, never passed.
    overlaps = (max_overlap(engine, "limited"), max_overlap(engine, "capped_work"))
    assert overlaps == (3, 2), rows(
        engine, "SELECT kind, worker, started_at, ended_at FROM control_runs ORDER BY started_at"
    )
    assert runs_per_job(engine, "limited") == {1}
    # Spread over the fleet: the limit is the fleet's, not one worker's.
    assert scalar(engine, "SELECT count(DISTINCT worker) FROM control_runs") >= 2
    assert "ERROR" not in (tmp_path / "w.log").read_text()
    assert scalar(engine, "SELECT count(DISTINCT job_id) FROM control_runs") == 46
    assert scalar(engine, "SELECT max(attempts) FROM jobs") == 1


def test_short_limited_jobs_held_back_beyond_the_limit_never_overlap_past_it(
    control_engine: sa.Engine, db_url: URL, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    # Jobs short enough (2 ms) that a worker claims beyond the limit and holds the rest
    # back (a reserve), starting them through its gate as its own jobs end.
    engine = control_engine
    with Session(engine) as s:
        nap = {"sleep": 0.002, "in_session": True}
        enqueue_many(s, [NewJob("limited", nap) for _ in range(300)])
        enqueue_many(s, [NewJob("capped_work", nap, queue="capped") for _ in range(100)])
        s.commit()
    workers(db_url, tmp_path / "w.log", procs, 4, "--concurrency", "8")
    wait_for(lambda: done(engine, "limited", 300) and done(engine, "capped_work", 100), timeout=90)
    overlaps = (max_overlap(engine, "limited"), max_overlap(engine, "capped_work"))
    assert overlaps == (3, 2), rows(
        engine, "SELECT kind, worker, started_at, ended_at FROM control_runs ORDER BY started_at"
    )
    assert runs_per_job(engine, "limited") == {1}
    assert runs_per_job(engine, "capped_work") == {1}
    assert scalar(engine, "SELECT max(attempts) FROM jobs") == 1
    assert "ERROR" not in (tmp_path / "w.log").read_text()


def ready_mail(engine: sa.Engine) -> int:
    return int(
        scalar(engine, "SELECT count(*) FROM jobs WHERE queue = 'mail' AND status = 'queued'")
    )


def test_pause_lets_running_jobs_finish_starts_nothing_survives_a_restart_and_resume_runs_the_rest(
    control_engine: sa.Engine, db_url: URL, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    engine = control_engine
    log = tmp_path / "w.log"
    with Session(engine) as s:
        enqueue_many(s, [NewJob("mail", {"sleep": 1.0}, queue="mail") for _ in range(3)])
        s.commit()
    workers(db_url, log, procs, 1, "--concurrency", "4", "--lock-seconds", "3")
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM control_runs") == 3, message="3 running")

    paused = cli(db_url, "pause", "mail")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout == "paused queue mail: no worker starts its jobs until resumed\n"
    assert paused.stderr == ""  # a live worker serves it: no note
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM jobs_workers") == 1, message="registered")
    typo = cli(db_url, "pause", "mial")
    assert typo.returncode == 0, typo.stderr
    assert typo.stderr == (
        "note: none of the 1 live worker(s) serves queue mial (a typo?); the setting is kept "
        "and applies to its jobs wherever they run\n"
    )
    assert cli(db_url, "resume", "mial").returncode == 0
    paused_at = scalar(engine, "SELECT clock_timestamp()")
    with Session(engine) as s:  # enqueueing into a paused queue works
        assert all(enqueue(s, "mail", {}, queue="mail") for _ in range(5))
        s.commit()

    # The running jobs finish; a worker started now (a restart) obeys the pause too.
    wait_for(
        lambda: scalar(engine, "SELECT count(ended_at) FROM control_runs") == 3,
        message="the running jobs to finish",
    )
    workers(db_url, log, procs, 1, "--concurrency", "4", "--lock-seconds", "3")
    # Both workers have been idle with free slots for over a second: the second one has
    # heartbeated twice since it started, the first one's jobs ended a second ago.
    wait_for(
        lambda: scalar(
            engine,
            "SELECT count(*) = 2 AND bool_and(heartbeat_at >= started_at + interval '2 s') "
            "AND clock_timestamp() > (SELECT max(ended_at) FROM control_runs) + interval '1 s' "
            "FROM jobs_workers",
        ),
        message="two idle workers for over a second",
    )
    started_since_pause = scalar(
        engine, "SELECT count(*) FROM control_runs WHERE started_at > :t", t=paused_at
    )
    assert started_since_pause == 0
    assert ready_mail(engine) == 5

    stats = cli(db_url, "stats")
    assert "paused queues (no worker starts their jobs): mail" in stats.stdout, stats.stdout
    assert "live workers: 2" in stats.stdout

    resumed = cli(db_url, "resume", "mail")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "resumed queue mail\n"
    wait_for(lambda: done(engine, "mail", 8), message="the rest to run after resume")
    assert runs_per_job(engine, "mail") == {1}
    assert "ERROR" not in log.read_text()


def listed_workers(url: URL) -> list[dict[str, Any]]:
    result = cli(url, "workers", "--json")
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout)["workers"])


def test_workers_register_with_their_heartbeat_and_a_killed_one_expires_after_its_lease(
    control_engine: sa.Engine, db_url: URL, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    engine = control_engine
    log = tmp_path / "w.log"
    killed, kept = workers(db_url, log, procs, 2, "--concurrency", "3", "--lock-seconds", "1.5")

    def both() -> list[dict[str, Any]] | None:
        found = listed_workers(db_url)
        return found if len(found) == 2 else None

    found = wait_for(both, message="both workers in the registry")
    assert found is not None
    assert {w["pid"] for w in found} == {killed.pid, kept.pid}
    entry = next(w for w in found if w["pid"] == killed.pid)
    assert entry["concurrency"] == 3
    assert entry["queues"] == ["default", "capped", "mail"]
    assert entry["kinds"] == ["capped_work", "limited", "mail", "plain", "rated"]
    assert entry["id"] == f"{entry['host']}:{killed.pid}"

    with Session(engine) as s:  # `running` follows the heartbeat
        enqueue(s, "plain", {"sleep": 4.0})
        s.commit()

    def running() -> int:  # read in-process: a CLI run per poll can outlast the job when loaded
        with Session(engine) as s:
            return sum(w.running for w in ops.workers(s))

    wait_for(lambda: running() == 1, message="the running job in a heartbeat")

    text = cli(db_url, "workers")
    assert text.stdout.startswith("ID "), text.stdout
    assert str(killed.pid) in text.stdout and str(kept.pid) in text.stdout

    killed.kill()
    killed.wait(10)
    last_beat = scalar(engine, "SELECT heartbeat_at FROM jobs_workers WHERE pid = :p", p=killed.pid)
    wait_for(
        lambda: [w["pid"] for w in listed_workers(db_url)] == [kept.pid],
        message="the killed worker to leave the registry",
    )
    gone_at = scalar(engine, "SELECT clock_timestamp()")
    assert (gone_at - last_beat).total_seconds() >= 1.5  # not before its lease time
    stats = cli(db_url, "stats", "--json")
    assert [w["pid"] for w in json.loads(stats.stdout)["workers"]] == [kept.pid]

    kept.terminate()  # a clean stop removes its own row at once
    assert kept.wait(30) == 0
    assert scalar(engine, "SELECT count(*) FROM jobs_workers") == 0


#: Every claim of a job (queued -> running) with the database's clock at the claim: what a
#: rate limit counts. A handler logs its own start later, by a delay the machine's load
#: decides (a thread to wake, a connection to open), so starts counted by handlers can
#: crowd a window that the claims did not (12 in a second were once seen).
CLAIM_LOG_SQL = """
CREATE TABLE claim_log (job_id bigint, kind text, claimed_at timestamptz);
CREATE FUNCTION log_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO claim_log VALUES (NEW.id, NEW.kind, clock_timestamp());
  RETURN NULL;
END $$;
CREATE TRIGGER log_claim AFTER UPDATE OF status ON jobs FOR EACH ROW
  WHEN (OLD.status = 'queued' AND NEW.status = 'running') EXECUTE FUNCTION log_claim();
"""


def test_a_rate_of_ten_per_second_puts_no_more_than_ten_claims_in_any_second(
    control_engine: sa.Engine, db_url: URL, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    engine = control_engine
    with engine.begin() as conn:
        conn.exec_driver_sql(CLAIM_LOG_SQL)
    with Session(engine) as s:
        enqueue_many(s, [NewJob("rated", {}) for _ in range(60)])
        enqueue_many(s, [NewJob("plain", {}) for _ in range(100)])
        s.commit()
    workers(db_url, tmp_path / "w.log", procs, 2, "--concurrency", "8")
    wait_for(lambda: done(engine, "plain", 100), message="unlimited jobs, not held back")
    wait_for(lambda: done(engine, "rated", 60), timeout=60, message="60 jobs at 10/s")
    busiest = scalar(
        engine,
        "SELECT max((SELECT count(*) FROM claim_log b WHERE b.kind = 'rated' "
        "AND b.claimed_at >= a.claimed_at AND b.claimed_at < a.claimed_at + interval '1 s')) "
        "FROM claim_log a WHERE a.kind = 'rated'",
    )
    claims = rows(engine, "SELECT claimed_at FROM claim_log WHERE kind = 'rated' ORDER BY 1")
    assert busiest == 10, "\n".join(t.isoformat() for (t,) in claims)  # reached, not passed
    span = scalar(
        engine,
        "SELECT extract(epoch FROM max(claimed_at) - min(claimed_at)) FROM claim_log "
        "WHERE kind = 'rated'",
    )
    assert span >= 5.0  # 60 claims at 10 per second need more than 5 windows
    assert len(claims) == 60  # each job claimed once...
    assert runs_per_job(engine, "rated") == {1}  # ... and its handler ran once
    assert scalar(engine, "SELECT max(attempts) FROM jobs WHERE kind = 'rated'") == 1


def plain_overlap_since(engine: sa.Engine, since: int) -> int:
    return int(
        scalar(
            engine,
            "SELECT coalesce(max((SELECT count(*) FROM control_runs b WHERE b.id > :since "
            "AND b.kind = 'plain' AND b.started_at <= a.started_at "
            "AND coalesce(b.ended_at, 'infinity') > a.started_at)), 0) "
            "FROM control_runs a WHERE a.id > :since AND a.kind = 'plain'",
            since=since,
        )
    )


def last_run(engine: sa.Engine) -> int:
    return int(scalar(engine, "SELECT coalesce(max(id), 0) FROM control_runs"))


def enqueue_plain(engine: sa.Engine, n: int, sleep: float) -> None:
    with Session(engine) as s:
        enqueue_many(s, [NewJob("plain", {"sleep": sleep}) for _ in range(n)])
        s.commit()


def test_a_limit_set_at_run_time_binds_running_workers_survives_their_restart_and_clears(
    control_engine: sa.Engine, db_url: URL, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    engine = control_engine
    log = tmp_path / "w.log"
    first = workers(db_url, log, procs, 2, "--concurrency", "4")
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM jobs_workers") == 2)

    limited = cli(db_url, "limit", "--kind", "plain", "--concurrency", "2")
    assert limited.returncode == 0, limited.stderr
    assert limited.stdout == "kind plain: concurrency 2, rate unlimited\n"
    enqueue_plain(engine, 16, 0.1)
    wait_for(lambda: done(engine, "plain", 16), message="16 jobs under the new limit")
    assert plain_overlap_since(engine, 0) == 2

    for proc in first:  # every worker dies; the limit lives in the database
        proc.kill()
        proc.wait(10)
    workers(db_url, log, procs, 2, "--concurrency", "4")
    mark = last_run(engine)
    enqueue_plain(engine, 16, 0.1)
    wait_for(lambda: done(engine, "plain", 32), message="16 more after the restart")
    assert plain_overlap_since(engine, mark) == 2

    listed = cli(db_url, "limits", "--json")
    (control,) = [c for c in json.loads(listed.stdout)["controls"] if c["name"] == "plain"]
    assert (control["concurrency"], control["concurrency_override"]) == (2, 2)

    cleared = cli(db_url, "limit", "--kind", "plain", "--clear")
    assert cleared.stdout == "kind plain: no limits\n", cleared.stdout + cleared.stderr
    mark = last_run(engine)
    enqueue_plain(engine, 8, 0.5)
    wait_for(lambda: done(engine, "plain", 40), message="8 more without a limit")
    assert plain_overlap_since(engine, mark) > 2
    assert runs_per_job(engine, "plain") == {1}


def test_an_operator_lowering_a_declared_limit_at_run_time_binds_every_claim(
    control_engine: sa.Engine, db_url: URL, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    engine = control_engine
    log = tmp_path / "w.log"
    workers(db_url, log, procs, 2, "--concurrency", "4")
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM jobs_workers") == 2, message="started")
    declared = "SELECT declared_concurrency FROM jobs_controls WHERE scope = 'kind' AND name = :k"
    # Registered first, then the code's limit=3 declared at the dispatcher's first look.
    wait_for(lambda: scalar(engine, declared, k="limited") == 3, message="limit=3 declared")

    lowered = cli(db_url, "limit", "--kind", "limited", "--concurrency", "1")
    assert lowered.returncode == 0, lowered.stderr
    assert lowered.stdout == "kind limited: concurrency 1, rate unlimited\n"
    with Session(engine) as s:
        # Long enough (0.3 s) that the declared 3 would be reached, as in the first test.
        nap = {"sleep": 0.3, "in_session": True}
        enqueue_many(s, [NewJob("limited", nap) for _ in range(12)])
        s.commit()
    wait_for(lambda: done(engine, "limited", 12), timeout=60, message="12 jobs one at a time")
    assert max_overlap(engine, "limited") == 1, rows(
        engine, "SELECT worker, started_at, ended_at FROM control_runs ORDER BY started_at"
    )
    assert runs_per_job(engine, "limited") == {1}
    assert "ERROR" not in log.read_text()
